"""The resource plan: worked out from file sizes before any work, refused when a worker cannot hold it."""
from __future__ import annotations

import os
import subprocess
import sys

import yaml

from corpusmill.pipeline.config import parse_config
from corpusmill.pipeline.doctor import ERROR, OK, check_memory
from corpusmill.pipeline.resources import FIT_SHARE, GiB, plan_resources


def test_partitions_and_the_document_steps_peak_follow_part_size():
    small = plan_resources(parse_config({"input": {"part_size_mb": 16}}), 10 * GiB, workers=4, worker_limit=4 * GiB)
    large = plan_resources(parse_config({"input": {"part_size_mb": 256}}), 10 * GiB, workers=4, worker_limit=4 * GiB)
    assert small.partitions == 640 and large.partitions == 40
    peak = {p.step: p.bytes for p in small.peaks}, {p.step: p.bytes for p in large.peaks}
    assert peak[1]["read/normalize/filter"] > peak[0]["read/normalize/filter"] + 1 * GiB
    assert peak[0]["tokenize"] == peak[1]["tokenize"]  # tokenizing works in slices, whatever the partition size
    assert small.fits() and small.refusal() is None


def test_a_plan_that_does_not_fit_a_worker_is_refused_naming_the_setting():
    cfg = parse_config({"input": {"part_size_mb": 1024}, "cluster": {"address": "tcp://127.0.0.1:8786"}})
    plan = plan_resources(cfg, 50 * GiB, workers=8, worker_limit=3 * GiB)  # what a scheduler would report
    assert not plan.fits() and plan.worst().bytes > FIT_SHARE * 3 * GiB
    assert "input.part_size_mb" in plan.refusal() and "3.00 GiB" in plan.refusal()
    refit = plan_resources(parse_config({"input": {"part_size_mb": 128}, "cluster": {"address": "tcp://127.0.0.1:8786"}}),
                           50 * GiB, workers=8, worker_limit=3 * GiB)
    assert refit.fits()


def test_memory_auto_splits_the_machine_between_local_workers():
    cfg = parse_config({"cluster": {"n_workers": 4}})
    plan = plan_resources(cfg, 1 * GiB, total_memory=8 * GiB)
    assert plan.workers == 4 and plan.worker_limit == 2 * GiB
    assert plan_resources(parse_config({"cluster": {"memory_limit": "3GiB"}}), GiB).worker_limit == 3 * GiB


def _sparse_input(tmp_path, size: int):
    """A JSONL file of `size` bytes that takes no disk: the plan reads sizes only."""
    path = tmp_path / "big.jsonl"
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def test_doctor_and_run_refuse_before_any_work(tmp_path):
    big = _sparse_input(tmp_path, 6 * GiB)
    cfg = {"input": {"paths": [str(big)], "part_size_mb": 2048}, "cluster": {"memory_limit": "2GiB", "n_workers": 1}}
    checks = check_memory(parse_config(cfg), available=64 * GiB)
    assert checks[0].status == ERROR and "input.part_size_mb" in checks[0].fix
    assert "partitions of 2,048 MiB" in checks[0].detail
    ok = check_memory(parse_config({**cfg, "input": {"paths": [str(big)], "part_size_mb": 16}}), available=64 * GiB)
    assert ok[0].status == OK and "about 384 partitions of 16 MiB" in ok[0].detail
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([sys.executable, "-m", "corpusmill.pipeline.cli", "run", str(tmp_path / "c.yaml"),
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "input.part_size_mb" in proc.stderr and "2.00 GiB memory limit" in proc.stderr
    assert not (tmp_path / "out" / "00-read").exists()


def test_no_worker_peak_grows_with_the_corpus_past_one_partition():
    """What a worker holds is a partition, a slice, a pack group or a chunk of a shard file: ten times
    the corpus plans peaks within the issue's 20% (only the shard task's position table, 16 bytes per
    window of the whole corpus, grows: 17 MiB at 5 GiB of text)."""
    cfg = parse_config({"shard": {"ranks": 1, "files_per_rank": 1}, "cluster": {"address": "tcp://x:1"}})
    one, ten = (plan_resources(cfg, n * 5 * GiB, workers=2, worker_limit=4 * GiB) for n in (1, 10))
    for a, b in zip(one.peaks, ten.peaks):
        assert a.step == b.step and b.bytes <= 1.2 * a.bytes, (a, b)
    assert ten.fits()



def test_the_shard_step_is_the_workers_floor_plus_a_writer_helper_per_thread_and_names_their_settings():
    """The files are written in helper processes beside what the worker kept after the earlier steps
    gave memory back (a share of the largest of them): larger partitions raise the shard step through
    that floor, every worker thread adds a helper, and a refusal there names the settings behind both."""
    def plan(part_mb: int, threads: int = 1, limit: float = 3):
        cfg = parse_config({"input": {"part_size_mb": part_mb},
                            "cluster": {"address": "tcp://x:1", "threads_per_worker": threads}})
        return plan_resources(cfg, 5 * GiB, workers=2, worker_limit=int(limit * GiB))

    small, large, two = plan(32), plan(128), plan(32, threads=2)
    peak = [{p.step: p.bytes for p in x.peaks} for x in (small, large, two)]
    floor_rise = peak[1]["shard"] - peak[0]["shard"]
    assert 0 < floor_rise < peak[1]["read/normalize/filter"] - peak[0]["read/normalize/filter"]
    assert peak[2]["shard"] - peak[0]["shard"] > 500 * 2**20  # a second helper, and the floor of two tasks
    tight = plan(32, limit=1.6)
    assert tight.worst().step == "shard" and not tight.fits()
    assert "the shard step" in tight.refusal() and "MindRecord writer helpers" in tight.refusal()
    assert "input.part_size_mb" in tight.refusal() and "shard.max_samples_per_file" in tight.refusal()


def test_the_sample_cap_per_file_keeps_the_writers_commit_flat():
    """Without shard.max_samples_per_file a rank's files grow with the corpus, and so does the index
    FileWriter.commit builds in memory; with it the files multiply instead."""
    def shard_peak(gib: int, cap: int) -> int:
        cfg = parse_config({"shard": {"ranks": 2, "files_per_rank": 4, "max_samples_per_file": cap},
                            "cluster": {"address": "tcp://x:1"}})
        return next(p.bytes for p in plan_resources(cfg, gib * GiB, workers=2, worker_limit=4 * GiB).peaks
                    if p.step == "shard")

    assert shard_peak(50, 0) > 2 * shard_peak(5, 0)  # ten times the samples in each of 8 files
    assert shard_peak(50, 32768) <= 1.2 * shard_peak(5, 32768)


def test_the_driver_plans_no_corpus_sized_pack_order_for_concat():
    """concat packs in a range-partitioned order (the driver keeps per-bucket totals only): its
    driver peak is the same at 5 and 50 GiB; a mixture still orders the corpus in the driver."""
    cfg = parse_config({"cluster": {"address": "tcp://x:1"}})
    one, ten = (plan_resources(cfg, n * 5 * GiB, workers=2, worker_limit=4 * GiB) for n in (1, 10))
    order = [next(p for p in plan.driver if p.step == "pack order") for plan in (one, ten)]
    assert order[0].bytes == order[1].bytes
    padded = parse_config({"cluster": {"address": "tcp://x:1"}, "pack": {"mode": "pad"}})
    one, ten = (plan_resources(padded, n * 5 * GiB, workers=2, worker_limit=4 * GiB) for n in (1, 10))
    assert [p.bytes for p in ten.driver if p.step == "pack order"][0] > [p.bytes for p in one.driver
                                                                            if p.step == "pack order"][0]
