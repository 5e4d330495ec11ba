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


def test_tokenizer_train_command(tmp_path):
    import sentencepiece as spm

    from tests.conftest import write_jsonl

    rng_words = "data model token corpus shard rank train window quality filter".split()
    docs = [{"text": " ".join(rng_words[(i * 7 + j) % 10] for j in range(40)) + " 数据清洗和去重是预训练的关键环节。"} for i in range(300)]
    write_jsonl(tmp_path / "c" / "a.jsonl", docs)
    proc = _run(["tokenizer", "train", str(tmp_path / "c"), "--out", str(tmp_path / "tok"), "--vocab-size", "400",
                 "--user-symbols", "<|im_start|>,<|im_end|>"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "tok.model"))
    assert (sp.unk_id(), sp.bos_id(), sp.eos_id(), sp.pad_id()) == (0, 1, 2, 3)
    assert "<|im_start|>" in sp.encode("<|im_start|>data", out_type=str)
    assert "round-trip mismatches 0.0%" in proc.stdout
    # 500 distinct Chinese characters cannot fit a 300-piece vocabulary at full coverage: a clear error
    hanzi = "".join(chr(0x4E00 + i) for i in range(500))
    write_jsonl(tmp_path / "zh" / "a.jsonl", [{"text": hanzi[i:] + hanzi[:i]} for i in range(0, 500, 5)])
    bad = _run(["tokenizer", "train", str(tmp_path / "zh"), "--out", str(tmp_path / "t2"), "--vocab-size", "300",
                "--character-coverage", "1.0"])
    assert bad.returncode == 2 and "raise tokenizer.train.vocab_size" in bad.stderr, bad.stderr[-1000:]


def test_demo_resume_reuses_the_corpus_and_skips_finished_stages(demo_run):
    out, _ = demo_run
    before = json.loads((out / "shards" / "manifest.json").read_text())
    proc = _run(["demo", "--out", str(out), "--resume", "--no-train"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "reused the corpus" in proc.stdout
    assert proc.stdout.count("done in an earlier run (config unchanged)") == 8
    after = json.loads((out / "shards" / "manifest.json").read_text())
    assert [f["sha256"] for f in after["files"]] == [f["sha256"] for f in before["files"]]
