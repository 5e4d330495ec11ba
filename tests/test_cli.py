"""The command line as a user runs it: a real subprocess, a real LocalCluster, real training."""
import json
import subprocess
import sys

import pytest

from pipeline.cli import _build_parser

CLI = [sys.executable, "-m", "pipeline.cli"]


def _run(args, **kw):
    return subprocess.run(CLI + args, capture_output=True, text=True, timeout=600, **kw)


def _subparsers():
    parser = _build_parser()
    action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return parser, action.choices


def test_help_explains_every_flag():
    parser, subs = _subparsers()
    top = _run(["--help"])
    assert top.returncode == 0 and all(name in top.stdout for name in subs)
    for name, sub in subs.items():
        out = _run([name, "--help"])
        assert out.returncode == 0, out.stderr
        for action in sub._actions:
            for opt in action.option_strings:
                assert opt in out.stdout, f"{name} --help does not mention {opt}"
            if action.option_strings and action.dest != "help":
                assert action.help, f"{name} {action.option_strings} has no help text"


def test_bad_config_is_a_clear_error(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("pack:\n  seq_length: -1\n")
    out = _run(["run", str(cfg), "--out", str(tmp_path / "o")])
    assert out.returncode == 2 and "pack.seq_length" in out.stderr and str(cfg) in out.stderr
    cfg.write_text("input:\n  paths: [nowhere/at/all]\n")
    out = _run(["run", str(cfg), "--out", str(tmp_path / "o")])
    assert out.returncode == 2 and "nowhere/at/all does not exist" in out.stderr


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "run"
    proc = _run(["demo", "--out", str(out), "--steps", "30"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, proc.stdout


def test_demo_runs_everything_and_prints_a_summary(demo_run):
    out, stdout = demo_run
    for rel in ("ledger.json", "report.md", "shards/manifest.json", "train/metrics.jsonl", "train/summary.json", "config.yaml"):
        assert (out / rel).is_file(), rel
    ledger = json.loads((out / "ledger.json").read_text())
    assert ledger["input"] == ledger["kept"] + ledger["filtered"] + ledger["duplicates"] + ledger["quarantined"]
    assert ledger["filtered"] > 0 and ledger["duplicates"] > 0 and ledger["quarantined"] > 0  # every stage removes something
    planted = json.loads((out / "corpus" / "PLANTED.json").read_text())["counts"]
    assert ledger["stages"]["exact_dedup"]["removed"] == {"exact": planted["exact_duplicates"]}
    assert ledger["stages"]["near_dedup"]["removed"].get("minhash", 0) > 0
    assert ledger["quarantined"] == planted["malformed"]
    assert f"resolved by exact dedup {planted['exact_duplicates']} / {planted['exact_duplicates']}" in stdout
    metrics = [json.loads(x) for x in (out / "train" / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 30 and metrics[-1]["loss"] < metrics[0]["loss"]
    assert "== corpusmill summary ==" in stdout and "balanced" in stdout


def test_train_command_on_demo_shards(demo_run, tmp_path):
    out, _ = demo_run
    proc = _run(["train", "--shards", str(out / "shards"), "--steps", "3", "--out", str(tmp_path / "t"), "--rank", "1"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2, 3]
    bad = _run(["train", "--shards", str(out / "shards"), "--steps", "1", "--num-parallel-workers", "999"])
    assert bad.returncode == 2 and "CPUs" in bad.stderr
