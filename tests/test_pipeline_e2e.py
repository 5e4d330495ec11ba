"""End to end on a corpus with known duplicates, junk and malformed lines: real Dask, real MindRecord."""
from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from corpusmill.pipeline.config import parse_config
from corpusmill.pipeline.runner import Pipeline
from corpusmill.stages.base import read_table
from tests.corpora import build_corpus, e2e_config

@pytest.fixture(scope="module")
def run(tmp_path_factory, dask_client):
    root = tmp_path_factory.mktemp("e2e")
    truth = build_corpus(root / "corpus")
    cfg = parse_config(e2e_config(root / "corpus"))
    logs: list[str] = []
    result = Pipeline(cfg, root / "out", client=dask_client, log=logs.append).run()
    return {"root": root, "out": root / "out", "truth": truth, "result": result, "cfg": cfg, "logs": logs}


def _read_shards(shards: Path) -> tuple[dict, dict[int, list[np.ndarray]]]:
    import mindspore.dataset as ds

    manifest = json.loads((shards / "manifest.json").read_text())
    per_rank: dict[int, list[np.ndarray]] = collections.defaultdict(list)
    for entry in manifest["files"]:
        data = ds.MindDataset([str(shards / entry["path"])], columns_list=["input_ids"], shuffle=False)
        rows = [r[0] for r in data.create_tuple_iterator(output_numpy=True, num_epochs=1)]
        assert len(rows) == entry["samples"]
        per_rank[entry["rank"]].extend(rows)
    return manifest, per_rank


def test_ledger_adds_up_and_is_written(run):
    ledger = json.loads((run["out"] / "ledger.json").read_text())
    truth = run["truth"]
    assert ledger["input"] == ledger["kept"] + ledger["filtered"] + ledger["duplicates"] + ledger["quarantined"]
    assert ledger["quarantined"] == truth["malformed"]
    assert ledger["duplicates"] == len(truth["planted"])
    assert ledger["input"] == truth["originals"] + 2 + len(truth["planted"]) + len(truth["junk"]) + 1 + 1
    report = (run["out"] / "report.md").read_text()
    assert "balanced" in report and "too_few_chars" in report and "invalid_json" in report
    quarantine = [json.loads(x) for x in (run["out"] / "00-read" / "quarantine.jsonl").read_text().splitlines()]
    assert {(Path(q["file"]).name, q["line"]) for q in quarantine} == {("a.jsonl", 11), ("a.jsonl", 22), ("b.jsonl.gz", 26)}


def test_removed_exact_duplicates_are_exactly_the_planted_ones(run):
    removed = pq.read_table(str(run["out"] / "03-exact_dedup" / "removed")).to_pylist()
    assert {(r["id"], r["duplicate_of_id"]) for r in removed} == run["truth"]["planted"]
    assert all(r["reason"] == "exact" and r["duplicate_of"] < r["uid"] for r in removed)
    assert next(r for r in removed if r["id"] == "copy-of-copy")["cluster_size"] == 3
    filtered = pq.read_table(str(run["out"] / "02-filter" / "removed")).to_pylist()
    assert {r["id"] for r in filtered} == run["truth"]["junk"]


def test_shards_equal_per_rank_and_hold_every_kept_token(run):
    out = run["out"]
    manifest, per_rank = _read_shards(out / "shards")
    window = manifest["sample_length"]
    assert window == 33 and manifest["seq_length"] == 32
    counts = {r: len(rows) for r, rows in per_rank.items()}
    assert set(counts) == {0, 1} and len(set(counts.values())) == 1 and counts[0] == manifest["samples_per_rank"]
    assert all(r.dtype == np.int32 and r.shape == (window,) for rows in per_rank.values() for r in rows)

    # packing is lossless: the documents of every part in the seeded order (pack.shuffle_documents),
    # one stream cut every `window` ids; only the last incomplete window's ids are dropped
    from corpusmill.stages.pack import order_keys

    eos = manifest["tokenizer"]["eos_id"]
    docs = [t for tp in sorted((out / "05-tokenize").glob("part-*.arrow")) for t in read_table(tp).to_pylist()]
    assert all(d["input_ids"][-1] == eos for d in docs)  # EOS ends every document
    uids = np.array([d["uid"] for d in docs], np.int64)
    order = np.lexsort((uids, order_keys(uids, run["cfg"].pack.seed)))
    stream = np.concatenate([np.asarray(docs[i]["input_ids"], np.int32) for i in order])
    packed = [tuple(w) for p in sorted((out / "06-pack").glob("part-*.arrow")) for w in read_table(p).column("input_ids").to_pylist()]
    body = np.asarray(packed, np.int32).reshape(-1)
    assert np.array_equal(body, stream[: len(body)]) and len(stream) - len(body) < window
    ledger = json.loads((out / "ledger.json").read_text())
    assert ledger["packing"]["tokens_dropped"] == len(stream) - len(body)

    # shuffling and sharding lose nothing but the counted remainder for equal ranks
    sharded = collections.Counter(tuple(int(x) for x in r) for rows in per_rank.values() for r in rows)
    missing = collections.Counter(packed) - sharded
    assert sum(missing.values()) == manifest["dropped_samples"] and not (sharded - collections.Counter(packed))
    assert manifest["total_tokens"] == sum(sharded.values()) * window


def test_manifest_describes_files(run):
    import hashlib

    shards = run["out"] / "shards"
    manifest = json.loads((shards / "manifest.json").read_text())
    assert manifest["ranks"] == 2 and manifest["files_per_rank"] == 2 and len(manifest["files"]) == 4
    prefixes = {e["rank"]: e["path"].split(".mindrecord")[0] for e in manifest["files"]}
    assert len(set(prefixes.values())) == 2
    for e in manifest["files"]:
        assert hashlib.sha256((shards / e["path"]).read_bytes()).hexdigest() == e["sha256"]
        assert hashlib.sha256((shards / (e["path"] + ".db")).read_bytes()).hexdigest() == e["db_sha256"]
        assert e["tokens"] == e["samples"] * manifest["sample_length"]
    tok = manifest["tokenizer"]
    assert hashlib.sha256((shards / "tokenizer.model").read_bytes()).hexdigest() == tok["sha256"]
    assert manifest["vocab_size"] == tok["vocab_size"] <= 1500 and tok["pad_id"] == 3


# Builds the dataset the way a mindformers run does: the YAML file as written, MindFormerConfig,
# build_dataset(train_dataset_task) -> CausalLanguageModelDataset; prints what it yields (stock mindformers
# from the session's mindformers_site, conftest.py).
MINDFORMERS_READER = """
import json, sys
import numpy as np
from mindformers import MindFormerConfig
from mindformers.dataset import build_dataset
dataset = build_dataset(MindFormerConfig(sys.argv[1]).train_dataset_task)
rows = []
for row in dataset.create_dict_iterator(output_numpy=True, num_epochs=1):
    rows.append({k: {"shape": list(v.shape), "dtype": str(v.dtype),
                     "value": v.tolist() if k != "attention_mask" else np.asarray(v[0]).sum(axis=1).tolist()}
                 for k, v in row.items()})
print("ROWS" + json.dumps({"columns": dataset.get_col_names(), "rows": rows}))
"""


def build_with_stock_mindformers(site: Path, yaml_file: Path, cwd: Path) -> dict:
    """Run mindformers' own CausalLanguageModelDataset on `yaml_file` in a child process."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(site)}
    proc = subprocess.run([sys.executable, "-c", MINDFORMERS_READER, str(yaml_file)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)
    out = [line for line in proc.stdout.splitlines() if line.startswith("ROWS")]
    assert proc.returncode == 0 and out, proc.stderr[-3000:]
    return json.loads(out[-1][4:])


@pytest.mark.slow
def test_generated_mindformers_yaml_builds_in_stock_mindformers_with_eod_reset(run, mindformers_site, tmp_path):
    """The file as written, pasted into mindformers 1.9.0: CausalLanguageModelDataset builds from it
    (no `output_columns` TypeError), yields every sample once with positions reset after each EOS."""
    import yaml

    shards = run["out"] / "shards"
    manifest = json.loads((shards / "manifest.json").read_text())
    generated = shards / "mindformers_train_dataset.yaml"
    section = yaml.safe_load(generated.read_text())["train_dataset"]
    assert section["eod_reset"] is True and section["output_columns"] == ["input_ids", "position_ids", "attention_mask"]
    got = build_with_stock_mindformers(mindformers_site, generated, tmp_path)

    assert got["columns"] == ["input_ids", "position_ids", "attention_mask"]
    window, eos = manifest["sample_length"], manifest["tokenizer"]["eos_id"]
    assert len(got["rows"]) == manifest["total_samples"]  # one rank, batch_size 1
    _, per_rank = _read_shards(shards)
    stored = collections.Counter(tuple(r.tolist()) for rows in per_rank.values() for r in rows)
    seen = collections.Counter(tuple(r["input_ids"]["value"][0]) for r in got["rows"])
    assert seen == stored
    resets = 0
    for r in got["rows"]:
        ids, pos, visible = r["input_ids"]["value"][0], r["position_ids"]["value"][0], r["attention_mask"]["value"]
        assert r["input_ids"]["shape"] == [1, window] and r["input_ids"]["dtype"] == "int32"
        assert r["position_ids"]["shape"] == [1, window - 1] and r["attention_mask"]["shape"] == [1, window - 1, window - 1]
        for i in range(1, window - 1):
            if ids[i - 1] == eos:
                assert pos[i] == 0 and visible[i] == 1  # a new document sees only itself
                resets += 1
            else:
                assert pos[i] == pos[i - 1] + 1 and visible[i] == visible[i - 1] + 1
    assert resets > 0


def test_snippets_dataset_dir_split_by_minddataset_gives_each_rank_its_share(run):
    """mindformers' file collection under dataset_dir (every *.mindrecord, sorted) split by
    num_shards = ranks gives each rank the manifest's count; a rank folder holds that rank's files."""
    import os

    import mindspore.dataset as ds
    import yaml

    shards = run["out"] / "shards"
    manifest = json.loads((shards / "manifest.json").read_text())
    snippet = yaml.safe_load((shards / "mindformers_train_dataset.yaml").read_text())
    dataset_dir = snippet["train_dataset"]["data_loader"]["dataset_dir"]
    assert snippet["train_dataset"]["input_columns"] == ["input_ids"] and Path(dataset_dir) == shards.resolve()

    def collect(folder):
        return sorted(os.path.join(r, f) for r, _, fs in os.walk(folder) for f in fs if f.endswith(".mindrecord"))

    files = collect(dataset_dir)
    assert len(files) == len(manifest["files"])
    counts = []
    for rank in range(manifest["ranks"]):
        data = ds.MindDataset(files, columns_list=["input_ids"], num_shards=manifest["ranks"], shard_id=rank, shuffle=False)
        rows = [r[0] for r in data.create_tuple_iterator(output_numpy=True, num_epochs=1)]
        assert all(r.shape == (manifest["sample_length"],) and r.dtype == np.int32 for r in rows)
        counts.append(len(rows))
    assert counts == [manifest["samples_per_rank"]] * manifest["ranks"]
    one_rank = collect(shards / "rank-0001")
    assert one_rank == sorted(str(shards / e["path"]) for e in manifest["files"] if e["rank"] == 1)


def test_shards_verify_passes_and_catches_truncated_altered_and_missing_files(run, tmp_path):
    import shutil
    import subprocess
    import sys

    def verify(folder):
        return subprocess.run([sys.executable, "-m", "corpusmill.pipeline.cli", "shards", "verify", str(folder)],
                              capture_output=True, text=True, timeout=300)

    ok = verify(run["out"] / "shards")
    assert ok.returncode == 0 and "shards ok" in ok.stdout, ok.stderr
    manifest = json.loads((run["out"] / "shards" / "manifest.json").read_text())
    files = [e["path"] for e in manifest["files"]]

    truncated = tmp_path / "truncated"
    shutil.copytree(run["out"] / "shards", truncated)
    f = truncated / files[0]
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    out = verify(truncated)
    assert out.returncode == 1 and f"{files[0]}: sha256 differs" in out.stderr

    altered = tmp_path / "altered"
    shutil.copytree(run["out"] / "shards", altered)
    f = altered / files[1]
    data = bytearray(f.read_bytes())
    data[-100] ^= 0xFF
    f.write_bytes(bytes(data))
    out = verify(altered)
    assert out.returncode == 1 and f"{files[1]}: sha256 differs" in out.stderr

    missing = tmp_path / "missing"
    shutil.copytree(run["out"] / "shards", missing)
    (missing / (files[2] + ".db")).unlink()
    out = verify(missing)
    assert out.returncode == 1 and f"{files[2]}: missing" in out.stderr and "problem(s)" in out.stderr

    inspect = subprocess.run([sys.executable, "-m", "corpusmill.pipeline.cli", "shards", "inspect", str(run["out"] / "shards"),
                              "--decode", "1"], capture_output=True, text=True, timeout=300)
    assert inspect.returncode == 0 and "--- sample 0" in inspect.stdout


def test_resume_skips_finished_stages_and_reruns_changed_ones(run, dask_client):
    root = run["root"]
    before = json.loads((run["out"] / "shards" / "manifest.json").read_text())
    logs: list[str] = []
    again = Pipeline(run["cfg"], run["out"], resume=True, client=dask_client, log=logs.append).run()
    assert again.skipped == ["read", "normalize", "filter", "exact_dedup", "near_dedup", "tokenize", "pack", "shard"]
    after = json.loads((run["out"] / "shards" / "manifest.json").read_text())
    assert [f["sha256"] for f in after["files"]] == [f["sha256"] for f in before["files"]]
    assert again.ledger["input"] == run["result"].ledger["input"]
    changed = parse_config(e2e_config(root / "corpus", pack={"seq_length": 16}))
    third = Pipeline(changed, run["out"], resume=True, client=dask_client, log=logs.append).run()
    assert third.skipped == ["read", "normalize", "filter", "exact_dedup", "near_dedup", "tokenize"]
    assert json.loads((run["out"] / "shards" / "manifest.json").read_text())["sample_length"] == 17


@pytest.mark.slow
def test_training_on_shards_lowers_the_loss(tmp_path, dask_client):
    from corpusmill.trainer.train import train

    root = tmp_path
    build_corpus(root / "corpus")
    cfg = parse_config(e2e_config(root / "corpus"))
    Pipeline(cfg, root / "out", client=dask_client, log=lambda m: None).run()
    summary = train(str(root / "out" / "shards"), str(root / "train"), cfg.train, log=lambda m: None)
    metrics = [json.loads(x) for x in (root / "train" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, 31))
    assert {"loss", "lr", "grad_norm", "tokens_per_s", "data_wait_s", "compute_s"} <= set(metrics[0])
    first, last = np.mean([m["loss"] for m in metrics[:5]]), np.mean([m["loss"] for m in metrics[-5:]])
    assert last < first - 0.5, (first, last)
    assert summary["steps"] == 30 and 0 <= summary["data_wait_share"] < 1


def test_trainer_refuses_mismatched_shards(run):
    from corpusmill.pipeline.config import TrainConfig
    from corpusmill.trainer.data import ShardMismatch
    from corpusmill.trainer.train import train

    shards = str(run["out"] / "shards")
    manifest = json.loads((run["out"] / "shards" / "manifest.json").read_text())
    bad_seq = TrainConfig(steps=1, model={"seq_length": manifest["seq_length"] * 2})
    with pytest.raises(ShardMismatch, match="seq_length"):
        train(shards, str(run["root"] / "t1"), bad_seq, log=lambda m: None)
    bad_vocab = TrainConfig(steps=1, model={"vocab_size": manifest["vocab_size"] - 1})
    with pytest.raises(ShardMismatch, match="embedding rows"):
        train(shards, str(run["root"] / "t2"), bad_vocab, log=lambda m: None)
    with pytest.raises(ShardMismatch, match="rank 5"):
        train(shards, str(run["root"] / "t3"), TrainConfig(steps=1, rank=5), log=lambda m: None)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["best_fit", "pad"])
def test_padded_pack_modes_write_masked_labels_and_their_snippet_builds_in_stock_mindformers(
        run, dask_client, tmp_path, mindformers_site, mode):
    """Padding is masked in `labels`; the generated YAML builds in mindformers 1.9.0 as written: pad
    mode reads input_ids and labels, best_fit (EOD reset) maps input_ids to the three EOD columns."""
    import mindspore.dataset as ds
    import yaml

    cfg = parse_config(e2e_config(run["root"] / "corpus", pack={"mode": mode}, shard={"ranks": 1, "files_per_rank": 1}))
    result = Pipeline(cfg, tmp_path / "out", client=dask_client, log=lambda m: None).run()
    packing = result.ledger["packing"]
    assert packing["mode"] == mode and packing["pad_tokens"] > 0 and 0 < packing["padding_share"] < 1
    shards = tmp_path / "out" / "shards"
    manifest = json.loads((shards / "manifest.json").read_text())
    assert set(manifest["columns"]) == {"input_ids", "labels"} and manifest["pack_mode"] == mode
    pad = manifest["tokenizer"]["pad_id"]
    data = ds.MindDataset([str(shards / manifest["files"][0]["path"])], columns_list=["input_ids", "labels"], shuffle=False)
    padded = 0
    for ids, labels in data.create_tuple_iterator(output_numpy=True, num_epochs=1):
        masked = labels == -100
        assert np.array_equal(labels[~masked], ids[~masked]) and (ids[masked] == pad).all()
        assert not masked.any() or masked[np.argmax(masked):].all()  # padding only at the end
        padded += int(masked.sum())
    assert padded == packing["pad_tokens"] - 0  # every pad token is masked (no samples dropped at 1 rank)
    generated = shards / "mindformers_train_dataset.yaml"
    snippet = yaml.safe_load(generated.read_text())["train_dataset"]
    assert ("eod_reset" in snippet) == (mode == "best_fit")
    got = build_with_stock_mindformers(mindformers_site, generated, tmp_path)
    assert len(got["rows"]) == manifest["total_samples"]
    if mode == "best_fit":  # mindformers' EOD-reset map takes input_ids alone; the note names the pad id
        assert got["columns"] == ["input_ids", "position_ids", "attention_mask"]
        assert "pad_token_id" in generated.read_text()
    else:
        assert got["columns"] == ["input_ids", "labels"]
        assert sum(row["labels"]["value"][0].count(-100) for row in got["rows"]) == packing["pad_tokens"]


def test_global_layout_with_pad_remainder_is_split_equally_by_minddataset(run, dask_client, tmp_path):
    """Only the shard stage reruns (resume on a copy); stock mindformers' file collection and
    MindDataset(num_shards, shard_id) give every rank the same count, and the trainer reads its share."""
    import os
    import re
    import shutil
    import subprocess
    import sys

    import mindspore.dataset as ds
    import yaml

    from corpusmill.trainer.train import train

    out = tmp_path / "out"
    shutil.copytree(run["out"], out)
    windows = sum(read_table(p).num_rows for p in (out / "06-pack").glob("part-*.arrow"))
    ranks = next(r for r in (3, 5, 7, 11, 13) if windows % r)  # so the remainder policy is exercised
    as_run = yaml.safe_load((out / "config.yaml").read_text())  # the copy's own config: only shard changes
    as_run["shard"].update({"layout": "global", "ranks": ranks, "files_per_rank": 2, "remainder": "pad"})
    cfg = parse_config(as_run)
    result = Pipeline(cfg, out, resume=True, client=dask_client, log=lambda m: None).run()
    assert result.skipped[-1] == "pack"
    shards = out / "shards"
    manifest = json.loads((shards / "manifest.json").read_text())
    assert windows == manifest["total_samples"] - manifest["repeated_samples"]
    assert manifest["repeated_samples"] == ranks - windows % ranks and manifest["dropped_samples"] == 0
    assert manifest["layout"] == "global" and all(e["rank"] is None for e in manifest["files"])

    # mindformers: every file under dataset_dir matching mindrecord\d*$, sorted, as one list
    pattern = re.compile(r"mindrecord\d*$")
    files = sorted(os.path.join(r, f) for r, _, fs in os.walk(shards) for f in fs if pattern.findall(f))
    width = len(str(ranks * 2 - 1))
    assert [os.path.basename(f) for f in files] == [f"corpus.mindrecord{i:0{width}d}" for i in range(ranks * 2)]
    seen = []
    for rank in range(ranks):
        data = ds.MindDataset(files, columns_list=["input_ids"], num_shards=ranks, shard_id=rank, shuffle=True)
        rows = [tuple(r[0].tolist()) for r in data.create_tuple_iterator(output_numpy=True, num_epochs=1)]
        assert len(rows) == manifest["samples_per_rank"]
        seen.extend(rows)
    packed = [tuple(r) for p in sorted((out / "06-pack").glob("part-*.arrow"))
              for r in read_table(p).column("input_ids").to_pylist()]
    assert sum((collections.Counter(seen) - collections.Counter(packed)).values()) == manifest["repeated_samples"]
    assert set(seen) == set(packed)  # every packed window is on some rank; the repeats are copies of real ones

    ok = subprocess.run([sys.executable, "-m", "corpusmill.pipeline.cli", "shards", "verify", str(shards)],
                        capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    stray = tmp_path / "stray"
    shutil.copytree(shards, stray)
    shutil.copyfile(stray / "corpus.mindrecord0", stray / "old.mindrecord7")
    bad = subprocess.run([sys.executable, "-m", "corpusmill.pipeline.cli", "shards", "verify", str(stray)],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and "old.mindrecord7: a MindRecord file the manifest does not list" in bad.stderr

    tcfg = cfg.train.model_copy(update={"steps": 2, "batch_size": 2, "rank": 2})
    summary = train(str(shards), str(tmp_path / "train"), tcfg, log=lambda m: None)
    assert summary["steps"] == 2


def test_a_sample_cap_per_file_splits_each_rank_into_more_files_holding_the_same_rows_in_order(run, dask_client,
                                                                                                tmp_path):
    """shard.max_samples_per_file (what bounds FileWriter.commit's memory) only moves where a rank's
    files split: the rank's rows, read file after file in name order, are the uncapped run's."""
    import shutil
    import subprocess
    import sys

    import mindspore.dataset as ds
    import yaml

    def rank_rows(shards: Path, rank: int) -> list[tuple]:
        files = sorted(str(p) for p in (shards / f"rank-{rank:04d}").glob("*.mindrecord"))
        return [tuple(r[0].tolist()) for r in ds.MindDataset(files, columns_list=["input_ids"], shuffle=False)
                .create_tuple_iterator(output_numpy=True, num_epochs=1)]

    before = json.loads((run["out"] / "shards" / "manifest.json").read_text())
    cap = max(1, before["samples_per_rank"] // 11)  # 11 or 12 files per rank, two-digit names
    out = tmp_path / "out"
    shutil.copytree(run["out"], out)
    as_run = yaml.safe_load((out / "config.yaml").read_text())
    as_run["shard"]["max_samples_per_file"] = cap
    result = Pipeline(parse_config(as_run), out, resume=True, client=dask_client, log=lambda m: None).run()
    assert result.skipped[-1] == "pack"
    manifest = json.loads((out / "shards" / "manifest.json").read_text())
    per_rank = -(-before["samples_per_rank"] // cap)
    assert manifest["files_per_rank"] == per_rank and len(manifest["files"]) == 2 * per_rank
    assert max(f["samples"] for f in manifest["files"]) <= cap
    assert manifest["samples_per_rank"] == before["samples_per_rank"]
    for rank in range(2):
        assert rank_rows(out / "shards", rank) == rank_rows(run["out"] / "shards", rank)
    ok = subprocess.run([sys.executable, "-m", "corpusmill.pipeline.cli", "shards", "verify", str(out / "shards")],
                        capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr


def test_changed_threshold_reuses_scores_and_reruns_only_the_decision(run, dask_client, tmp_path):
    import shutil

    import yaml

    out = tmp_path / "out"
    shutil.copytree(run["out"], out)
    as_run = yaml.safe_load((out / "config.yaml").read_text())
    as_run["filter"]["length"]["min_chars"] = 120
    logs: list[str] = []
    result = Pipeline(parse_config(as_run), out, resume=True, client=dask_client, log=logs.append).run()
    assert result.skipped == ["read", "normalize"]
    assert result.stages["filter"]["scores_reused"] is True
    removed = pq.read_table(str(out / "02-filter" / "removed")).to_pandas()
    scores = pd.concat([pq.read_table(p).to_pandas() for p in sorted((out / "02-filter.scores").glob("part-*.parquet"))])
    scores = scores.set_index("uid")
    short = removed[removed["reason"] == "too_few_chars"]
    assert len(short) > len(run["truth"]["junk"]) and (short["threshold"] == 120).all()
    assert (scores.loc[short["uid"], "nonspace_chars"].to_numpy() < 120).all()
    kept = [u for p in sorted((out / "02-filter").glob("part-*.parquet"))
            for u in pq.read_table(p, columns=["uid"]).column("uid").to_pylist()]
    assert (scores.loc[kept, "nonspace_chars"] >= 120).all()
    assert (out / "report.html").is_file()


def _killed_copy(out: Path, dst: Path, stage: str, lose: int) -> tuple[list[str], int]:
    """A copy of the finished run `out` as a run killed during `stage` would leave it: the later steps
    absent, `stage` without its marker, `lose` of its tasks not finished (one of them with its part
    written but its task marker not yet), and a temporary file half written. Returns the lost parts
    and the tasks kept."""
    import shutil

    from corpusmill.pipeline.rundir import STAGE_DIRS, TASKS

    shutil.copytree(out, dst)
    names = list(STAGE_DIRS)
    for later in names[names.index(stage) + 1:]:
        shutil.rmtree(dst / STAGE_DIRS[later], ignore_errors=True)
    folder = dst / STAGE_DIRS[stage]
    (folder / "_DONE.json").unlink()
    markers = sorted((folder / TASKS).glob("*.json"))
    assert len(markers) > lose + 2, "every finished task left a marker"
    lost = []
    for k, marker in enumerate(markers[1:1 + lose]):
        task = json.loads(marker.read_text())
        marker.unlink()
        if k:  # the first one had written its part but was killed before its marker: the part must be redone
            for f in task["files"]:
                (folder / f).unlink()
        lost += task["files"]
    (folder / ".part-99999.parquet.tmp-1-abcd").write_bytes(b"half a part")
    return lost, len(markers) - lose


@pytest.mark.parametrize("stage", ["filter", "tokenize"])
def test_a_run_killed_inside_a_step_resumes_only_its_unfinished_tasks(run, dask_client, tmp_path, stage):
    from corpusmill.pipeline.rundir import STAGE_DIRS

    if stage == "filter":  # a killed filter step leaves its scores cache marked unfinished
        cache = run["out"] / (STAGE_DIRS["filter"] + ".scores") / "_DONE.json"
        assert json.loads(cache.read_text())["complete"] is True
    import shutil

    # the module's other tests rerun later steps of run["out"] under other configs: its uninterrupted
    # result for this config is a resume of an untouched copy
    shutil.copytree(run["out"], tmp_path / "whole")
    Pipeline(run["cfg"], tmp_path / "whole", resume=True, client=dask_client, log=lambda m: None).run()
    lost, kept = _killed_copy(run["out"], tmp_path / "out", stage, lose=3)
    if stage == "filter":
        marker = tmp_path / "out" / (STAGE_DIRS["filter"] + ".scores") / "_DONE.json"
        marker.write_text(json.dumps({**json.loads(marker.read_text()), "complete": False}))
    logs: list[str] = []
    again = Pipeline(run["cfg"], tmp_path / "out", resume=True, client=dask_client, log=logs.append).run()
    assert any(f"{kept} task(s) finished in an earlier try are kept" in m for m in logs), logs
    assert any(f"{kept} of {kept + 3} tasks finished in an earlier try; running 3" in m for m in logs), logs
    folder = STAGE_DIRS[stage]
    for f in lost:  # the redone parts are the bytes of the uninterrupted run
        assert (tmp_path / "out" / folder / f).read_bytes() == (run["out"] / folder / f).read_bytes(), f
    assert not list((tmp_path / "out" / folder).glob(".*tmp*"))
    before = json.loads((tmp_path / "whole" / "shards" / "manifest.json").read_text())
    after = json.loads((tmp_path / "out" / "shards" / "manifest.json").read_text())
    # MindRecord files hold their own path, so a copy elsewhere compares by the rows written and the tokenizer
    assert [f["rows_xxh3_sum"] for f in after["files"]] == [f["rows_xxh3_sum"] for f in before["files"]]
    assert after["tokenizer"]["sha256"] == before["tokenizer"]["sha256"]
    assert again.ledger["kept"] == run["result"].ledger["kept"]
    assert again.ledger["filtered"] == run["result"].ledger["filtered"]


def test_composition_by_source_and_language_balances_and_reaches_the_shards(run):
    """Every (source, language) group balances at every step; the copies' kept group is named; the
    groups' shard tokens and samples add up to the manifest's, one group per sample in the side file."""
    ledger = json.loads((run["out"] / "ledger.json").read_text())
    comp = ledger["composition"]
    groups = {(g["source"], g["language"]): g for g in comp["groups"]}
    assert {("orig", "zh"), ("orig", "en"), ("copies", "zh")} <= set(groups)
    for g in comp["groups"]:
        kept = g["documents"]
        for step in comp["steps"]:
            removed = sum(g["removed"].get(step, {}).values())
            out = g["steps"].get(step, {}).get("docs", 0)
            assert kept == out + removed, (g["source"], g["language"], step)
            kept = out
    assert sum(g["documents"] for g in comp["groups"]) == ledger["input"] - ledger["quarantined"]
    copies_kept_in = {(c["kept_source"], c["kept_language"]): c["documents"] for c in comp["cross_source_duplicates"]
                      if c["removed_source"] == "copies"}
    assert copies_kept_in == {("orig", "zh"): groups[("copies", "zh")]["removed"]["exact_dedup"]["exact"]}
    manifest = json.loads((run["out"] / "shards" / "manifest.json").read_text())
    mix = manifest["composition"]["groups"]
    assert sum(g["tokens"] for g in mix) == manifest["total_tokens"]
    assert sum(g["samples"] for g in mix) == manifest["total_samples"]
    sides = pq.read_table(run["out"] / "shards" / "sample_groups.parquet").to_pandas()
    assert len(sides) == manifest["total_samples"]
    assert sides.groupby("file").size().tolist() == [f["samples"] for f in manifest["files"]]
    assert sides["group"].value_counts().to_dict() == {g["group"]: g["samples"] for g in mix if g["samples"]}
    assert groups[("orig", "zh")]["shards"]["tokens"] == next(g["tokens"] for g in mix if g["source"] == "orig"
                                                                and g["language"] == "zh")
    read_langs = {x for p in sorted((run["out"] / "00-read").glob("part-*.parquet"))
                  for x in pq.read_table(p, columns=["language"]).column("language").to_pylist()}
    assert {"zh", "en"} <= read_langs
    report = (run["out"] / "report.md").read_text()
    assert "## By source and language" in report and "| exact_dedup | copies / zh | orig / zh |" in report
    assert 'alt="tokens per source and language, step by step"' in (run["out"] / "report.html").read_text()
