import pytest

from corpusmill.pipeline.config import Config, ConfigError, load_config, parse_config


def test_defaults_validate():
    cfg = Config()
    assert cfg.pack.seq_length == 2048 and cfg.shard.ranks == 1 and cfg.tokenizer.add_eos


def test_unknown_key_names_key_file_and_allowed(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("pack:\n  seq_lenght: 128\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert str(path) in msg and "pack.seq_lenght" in msg and "seq_length" in msg and "remainder" in msg


def test_bad_value_names_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("pack:\n  remainder: keep\nshard:\n  ranks: 0\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert "pack.remainder" in msg and "'drop'" in msg and "shard.ranks" in msg


def test_duplicate_key_names_both_lines(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("pack:\n  seq_length: 128\n  remainder: drop\n  seq_length: 256\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "duplicate key 'seq_length' at line 4 (first at line 2)" in str(err.value)


def test_wrong_version_refused():
    with pytest.raises(ConfigError, match="config_version"):
        parse_config({"config_version": 99})


def test_example_and_quickstart_configs_load():
    from corpusmill.pipeline.cli import CONFIG_DIR
    from corpusmill.pipeline.config import EXAMPLE_PATHS, render_example

    text = (CONFIG_DIR / "example.yaml").read_text(encoding="utf-8")
    assert text == render_example(EXAMPLE_PATHS), "configs/example.yaml is stale: run `corpusmill config example`"
    example = load_config(CONFIG_DIR / "example.yaml")
    assert example.model_dump() == Config(input={"paths": EXAMPLE_PATHS}).model_dump()
    quick = load_config(CONFIG_DIR / "quickstart.yaml")
    assert quick.train.enabled and quick.shard.ranks == 2


def test_section_hash_changes_with_section_only():
    a, b = Config(), Config(pack={"seq_length": 64})
    assert a.section_hash("filter") == b.section_hash("filter")
    assert a.section_hash("pack") != b.section_hash("pack")


def test_every_shipped_config_loads():
    from corpusmill.pipeline.cli import CONFIG_DIR

    for path in sorted(CONFIG_DIR.glob("*.yaml")):
        cfg = load_config(path)
        assert cfg.config_version == 2 and not cfg.migration_notes, path
    big = load_config(CONFIG_DIR / "llama-7b.yaml").train.model
    assert (big.hidden_size, big.num_layers, big.num_heads, big.intermediate_size) == (4096, 32, 32, 11008)


def test_a_keep_policy_without_a_near_duplicate_method_is_refused():
    """exact dedup always keeps the lowest uid: a keep policy there would be silently ignored."""
    off = {"minhash": {"enabled": False}, "simhash": {"enabled": False}}
    with pytest.raises(ConfigError, match="no near-duplicate method"):
        parse_config({"dedup": {"keep": "longest", **off}})
    assert parse_config({"dedup": {"keep": "longest"}}).dedup.keep == "longest"  # minhash is on by default
    with pytest.raises(ConfigError, match="pack.seed"):
        parse_config({"pack": {"seed": -1}})
