"""The guide's habits as features: environment checks, config versions."""
import os
import time
from collections import namedtuple

import pytest

from corpusmill.pipeline.config import CONFIG_VERSION, ConfigError, load_config, parse_config
from corpusmill.pipeline.doctor import ERROR, OK, check_cpus, check_disk, check_memory, check_scheduler, errors

Usage = namedtuple("Usage", "total used free")


def _cfg(tmp_path, **sections):
    (tmp_path / "in.jsonl").write_text('{"text": "x"}\n' * 1000)
    return parse_config({"input": {"paths": [str(tmp_path / "in.jsonl")]}, **sections})


def test_too_many_reader_workers_is_an_error(tmp_path):
    cfg = _cfg(tmp_path, train={"num_parallel_workers": (os.cpu_count() or 1) + 1})
    found = {c.name: c for c in check_cpus(cfg)}
    assert found["num_parallel_workers"].status == ERROR and "MindSpore refuses" in found["num_parallel_workers"].detail
    assert check_cpus(_cfg(tmp_path))[1].status == OK


def test_too_little_disk_from_a_fake_free_space_reading(tmp_path):
    cfg = _cfg(tmp_path)
    tight = check_disk(cfg, str(tmp_path / "run"), disk_usage=lambda p: Usage(10**9, 10**9 - 1000, 1000))
    assert tight[0].status == ERROR and "GiB free" in tight[0].detail and "--sample" in tight[0].fix
    roomy = check_disk(cfg, str(tmp_path / "run"), disk_usage=lambda p: Usage(10**12, 0, 10**12))
    assert roomy[0].status == OK


def test_too_little_memory(tmp_path):
    cfg = _cfg(tmp_path)
    assert check_memory(cfg, available=10**6)[0].status == ERROR
    assert check_memory(cfg, available=64 * 2**30)[0].status == OK


def test_unreachable_scheduler_is_an_error_within_seconds(tmp_path):
    cfg = _cfg(tmp_path, cluster={"address": "tcp://127.0.0.1:9"})
    started = time.perf_counter()
    result = check_scheduler(cfg, timeout=2)
    assert result[0].status == ERROR and "does not answer" in result[0].detail and errors(result)
    assert time.perf_counter() - started < 30


def test_old_config_version_is_migrated_with_a_note_per_key(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text("config_version: 1\nfilter:\n  min_chars: 50\n  max_chars: 9000\n")
    cfg = load_config(path)
    assert cfg.config_version == CONFIG_VERSION == 2
    assert cfg.filter.length.min_chars == 50 and cfg.filter.length.max_chars == 9000
    assert cfg.migration_notes == ["config_version 1 -> 2: filter.min_chars -> filter.length.min_chars",
                                   "config_version 1 -> 2: filter.max_chars -> filter.length.max_chars"]
    assert "migration_notes" not in cfg.to_yaml()


def test_unmigratable_and_newer_configs_are_refused_with_the_keys():
    with pytest.raises(ConfigError, match="both filter.min_chars and filter.length.min_chars"):
        parse_config({"config_version": 1, "filter": {"min_chars": 1, "length": {"min_chars": 2}}})
    with pytest.raises(ConfigError, match="reads up to 2: upgrade corpusmill"):
        parse_config({"config_version": 3})
    with pytest.raises(ConfigError, match="older than any"):
        parse_config({"config_version": 0})
    with pytest.raises(ConfigError, match="unknown key 'filter.min_chars'"):
        parse_config({"config_version": 2, "filter": {"min_chars": 1}})  # a v1 key in a v2 file is not guessed
