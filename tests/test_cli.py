"""The command line as a user runs it: a real subprocess, a real LocalCluster, real training."""
import json
import re
import subprocess
import sys

import numpy as np
import pytest

from corpusmill.pipeline.cli import _build_parser

CLI = [sys.executable, "-m", "corpusmill.pipeline.cli"]


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


@pytest.mark.slow
def test_demo_runs_everything_and_prints_a_summary(demo_run):
    out, stdout = demo_run
    for rel in ("ledger.json", "report.md", "shards/manifest.json", "train/metrics.jsonl", "train/summary.json", "config.yaml"):
        assert (out / rel).is_file(), rel
    ledger = json.loads((out / "ledger.json").read_text())
    assert ledger["input"] == ledger["kept"] + ledger["filtered"] + ledger["duplicates"] + ledger["quarantined"]
    assert ledger["filtered"] > 0 and ledger["duplicates"] > 0 and ledger["quarantined"] > 0  # every stage removes something
    planted = json.loads((out / "corpus" / "PLANTED.json").read_text())["counts"]
    assert ledger["stages"]["exact_dedup"]["removed"]["exact"] >= planted["exact_duplicates"] // 2
    assert ledger["stages"]["near_dedup"]["removed"].get("minhash", 0) > 0
    assert ledger["quarantined"] == planted["malformed"]
    # every planted exact pair ends resolved: by exact dedup, or both copies filtered before dedup
    n = planted["exact_duplicates"]
    assert re.search(rf"planted exact-duplicate pairs: \d+ resolved by exact dedup \+ \d+ with both copies filtered first = {n} / {n}", stdout)
    # near copies are planted in character space above the threshold (their true Jaccard recorded): near dedup resolves them
    near = json.loads((out / "corpus" / "PLANTED.json").read_text())["near_duplicates"]
    assert min(p["jaccard"] for p in near) >= 0.85
    m = re.search(r"planted near-duplicate pairs: (\d+) resolved by dedup \+ (\d+) with one copy filtered \+ (\d+) both "
                  r"filtered = (\d+) / (\d+) \(true Jaccard 0\.\d+-0\.\d+, threshold 0\.8\)", stdout)
    assert m and int(m.group(4)) == int(m.group(5)) == len(near), stdout[-2000:]
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") >= 10 and "Score distributions" in page and "<table>" in page
    assert "Filter by language" in page and "Filter by source" in page and "gopher_few_words" in page
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


@pytest.mark.slow
def test_demo_resume_reuses_the_corpus_and_skips_finished_stages(demo_run):
    out, _ = demo_run
    before = json.loads((out / "shards" / "manifest.json").read_text())
    proc = _run(["demo", "--out", str(out), "--resume", "--no-train"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "reused the corpus" in proc.stdout
    assert proc.stdout.count("done in an earlier run (config unchanged)") == 8
    after = json.loads((out / "shards" / "manifest.json").read_text())
    assert [f["sha256"] for f in after["files"]] == [f["sha256"] for f in before["files"]]


def _uids(run_dir):
    import pyarrow.parquet as pq

    return sorted(u for p in sorted((run_dir / "00-read").glob("part-*.parquet"))
                  for u in pq.read_table(p, columns=["uid"]).column("uid").to_pylist())


@pytest.mark.slow
def test_sampled_run_projects_the_full_run(demo_run, tmp_path):
    out, _ = demo_run
    full = json.loads((out / "ledger.json").read_text())
    # one sampled run: that the sample is the same documents every time is the read kernel's test
    # (test_read.test_sample_is_the_same_documents_however_the_input_is_split)
    proc = _run(["run", str(out / "config.yaml"), "--sample", "0.5", "--no-train", "--out", str(tmp_path / "s1")])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "SAMPLE RUN of 50.00% of the documents" in proc.stdout
    runs = [tmp_path / "s1"]
    sampled = json.loads((runs[0] / "ledger.json").read_text())
    assert 0.4 * full["input"] < sampled["input"] < 0.6 * full["input"]
    sample = sampled["sample"]
    assert sample["fraction"] == 0.5 and sample["documents_not_sampled"] == full["input"] - sampled["input"]
    projected = sample["projected_full_run"]
    assert projected["input"] == full["input"]  # exact: the reader counts what it skips
    assert abs(projected["kept"] - full["kept"]) <= 0.2 * full["kept"], (projected["kept"], full["kept"])
    assert abs(projected["duplicates"] - full["duplicates"]) <= 0.3 * full["duplicates"], (projected, full["duplicates"])
    # token totals of a document sample vary with the documents' lengths (a few long pages): the
    # projection must be within three standard errors of a sum estimated from a 50% Bernoulli sample,
    # sqrt((1 - f) / f * sum(tokens_i^2)) over the full run's documents
    import pyarrow as pa
    import pyarrow.ipc as ipc

    lengths = np.concatenate([ipc.open_file(pa.memory_map(str(f))).read_all().column("n_tokens").to_numpy()
                              for f in sorted((out / "05-tokenize").glob("part-*.arrow"))]).astype(float)
    relative_se = np.sqrt(lengths @ lengths) / lengths.sum()  # (1 - f) / f = 1 at f = 0.5
    for key in ("tokens", "samples_per_rank", "shard_bytes"):
        assert abs(projected[key] - full[key]) <= 3 * relative_se * full[key], (key, projected[key], full[key], relative_se)
    # wall time: the sampled run's own stage seconds, the scaling part at most doubled (1 / 0.5); its
    # seconds, not the full run's (two runs' times on a busy host are not comparable)
    own = sum(sampled["run"]["seconds_per_stage"].values())
    assert own - 0.1 <= projected["wall_s"] <= 2 * own + 0.1, (projected["wall_s"], own)
    report = (runs[0] / "report.md").read_text()
    assert "sample" in report.lower() and "projected" in report.lower()
    # every stage saw only the sampled documents
    assert set(_uids(runs[0])) <= set(_uids(out))


def test_config_diff_of_files_and_run_directories(demo_run, tmp_path):
    out, _ = demo_run
    other = tmp_path / "other.yaml"
    other.write_text((out / "config.yaml").read_text().replace("seq_length: 128", "seq_length: 256"))
    diff = _run(["config", "diff", str(out), str(other)])
    assert diff.returncode == 1 and diff.stdout.strip() == "pack.seq_length: 128 -> 256", diff.stdout + diff.stderr
    same = _run(["config", "diff", str(out), str(out / "config.yaml")])
    assert same.returncode == 0 and "no differences" in same.stdout


def test_doctor_reports_ok_and_fails_on_a_missing_tokenizer(tmp_path):
    ok = _run(["doctor"])
    assert ok.returncode == 0 and "[     ok] mindspore: run_check() passed" in ok.stdout, ok.stdout + ok.stderr
    cfg = tmp_path / "c.yaml"
    (tmp_path / "data.jsonl").write_text('{"text": "hello world"}\n')
    cfg.write_text(f"input: {{paths: [{tmp_path / 'data.jsonl'}]}}\ntokenizer: {{model: {tmp_path / 'missing.model'}}}\n")
    bad = _run(["doctor", "--config", str(cfg), "--skip-mindspore"])
    assert bad.returncode == 1 and "[  error] tokenizer:" in bad.stdout and "missing.model does not exist" in bad.stdout
    refused = _run(["run", str(cfg), "--out", str(tmp_path / "o")])  # the pipeline runs the same checks first
    assert refused.returncode == 2 and "preflight checks failed" in refused.stderr and "missing.model" in refused.stderr
    assert not (tmp_path / "o" / "00-read").exists()


def test_dedup_keep_field_absent_from_every_document_exits_2_naming_it(tmp_path):
    from tests.conftest import write_jsonl

    write_jsonl(tmp_path / "c" / "a.jsonl", [{"text": f"document number {i} " * 30, "author": "x"} for i in range(20)])
    out = _run(["dedup", str(tmp_path / "c"), "--keep", "field:date", "--out", str(tmp_path / "o")])
    err = out.stderr.strip().splitlines()
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert err[-1].startswith("corpusmill: error:") and "'date'" in err[-1] and "none of the 20 documents" in err[-1]
    exact = _run(["dedup", str(tmp_path / "c"), "--methods", "exact", "--keep", "longest", "--out", str(tmp_path / "o2")])
    assert exact.returncode == 2 and "--keep longest: applies to near duplicates" in exact.stderr
