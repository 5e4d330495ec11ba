"""Audit rows carry the removed text; `dedup --format jsonl` writes removed/ as JSONL; the report names
the most frequent removed boilerplate lines (real Dask, real stages)."""
import json
import random
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from corpusmill.pipeline.config import parse_config
from corpusmill.pipeline.runner import Pipeline
from tests.conftest import LENGTH_ONLY_FILTER, write_jsonl

BANNER = "This page is part of the Example Wiki | licensed CC BY-SA"
NAV = "Home > Articles > Archive > Printable version"


def _corpus(root: Path) -> dict[str, str]:
    """Wiki pages with two recurring lines, short junk, exact and near duplicates."""
    rng = random.Random(3)
    words = "river stone bread garden winter music paper signal memory letter number light".split()
    docs = []
    for i in range(60):
        body = "\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(4))
        docs.append({"id": f"w{i}", "text": f"{BANNER}\n{body}\n{NAV}", "source": "wiki"})
    # every line recurs: left whole (stripping would leave nothing), so counted as containing, not removed
    docs.append({"id": "w-all-boilerplate", "text": f"{BANNER}\n{NAV}\n{BANNER}", "source": "wiki"})
    docs += [{"id": f"short{i}", "text": f"tiny {i}", "source": "junk"} for i in range(3)]
    long_doc = " ".join(rng.choice(words) for _ in range(400))
    docs.append({"id": "long", "text": long_doc, "source": "books"})
    docs.append({"id": "long-copy", "text": long_doc, "source": "books"})  # exact duplicate
    near = long_doc.split()
    near[200] = "zebra"
    docs.append({"id": "long-near", "text": " ".join(near), "source": "books"})  # near duplicate
    write_jsonl(root / "in.jsonl", docs)
    return {d["id"]: d["text"] for d in docs}


def _rows(folder: Path) -> pd.DataFrame:
    files = sorted(folder.glob("*.parquet"))
    return pd.concat([pq.read_table(f).to_pandas() for f in files], ignore_index=True) if files else pd.DataFrame()


@pytest.fixture(scope="module")
def audited(tmp_path_factory, dask_client):
    root = tmp_path_factory.mktemp("audit")
    texts = _corpus(root / "corpus")
    cfg = parse_config({
        "input": {"paths": [str(root / "corpus")]},
        "filter": {"length": {"min_chars": 20}, **LENGTH_ONLY_FILTER, "audit_text_chars": 40,
                   "boilerplate_lines": {"min_docs": 5, "min_doc_share": 0.5}},
        "dedup": {"audit_text_chars": 100, "minhash": {"threshold": 0.7}},
        "tokenizer": {"train": {"vocab_size": 300}}, "pack": {"seq_length": 32}, "shard": {"ranks": 1},
    })
    Pipeline(cfg, root / "out", client=dask_client, log=lambda m: None).run()
    return root / "out", texts


def test_filter_audit_rows_hold_the_removed_text_cut_to_audit_text_chars(audited):
    out, texts = audited
    removed = _rows(out / "02-filter" / "removed")
    assert set(removed["id"]) == {"short0", "short1", "short2"}
    assert all(row.text == texts[row.id][:40] for row in removed.itertuples())


def test_dedup_audit_rows_hold_the_duplicates_text(audited):
    """Exact and near duplicates' rows carry their own text (first 100 characters), read from the
    stage's input, so what was removed can be read without joining stage folders."""
    out, texts = audited
    exact = _rows(out / "03-exact_dedup" / "removed")
    near = _rows(out / "04-near_dedup" / "removed")
    assert list(exact["id"]) == ["long-copy"] and list(near["id"]) == ["long-near"]
    for rows in (exact, near):
        assert all(row.text == texts[row.id][:100] and len(row.text) == 100 for row in rows.itertuples())


def test_report_lists_the_most_frequent_removed_boilerplate_lines_with_counts(audited):
    out, _ = audited
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "Most frequent removed boilerplate lines" in report
    banner = BANNER.replace("|", "\\|")
    assert f"| 60 | 61 | wiki | {banner} |" in report and f"| 60 | 61 | wiki | {NAV} |" in report  # removed, containing
    kept = _rows(out / "02-filter")
    stripped = kept[kept["source"].eq("wiki") & kept["id"].ne("w-all-boilerplate")]
    assert len(stripped) == 60 and not stripped["text"].str.contains("Example Wiki").any()  # the lines were removed


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_dedup_export_writes_removed_in_the_requested_format_with_text(tmp_path, dask_client, fmt):
    texts = _corpus(tmp_path / "corpus")
    cfg = parse_config({"input": {"paths": [str(tmp_path / "corpus")]}, "dedup": {"minhash": {"threshold": 0.7}}})
    Pipeline(cfg, tmp_path / "out", client=dask_client, log=lambda m: None, job="dedup", export_format=fmt).run()
    files = sorted((tmp_path / "out" / "removed").iterdir())
    assert files and all(f.suffix == "." + fmt for f in files)
    if fmt == "jsonl":
        rows = [json.loads(line) for f in files for line in f.read_text(encoding="utf-8").splitlines()]
    else:
        rows = [r for f in files for r in pq.read_table(f).to_pylist()]
    assert {r["id"] for r in rows} == {"long-copy", "long-near"}
    for r in rows:
        assert r["text"] == texts[r["id"]][:2000] and r["duplicate_of"] == "long"


def test_report_examples_are_read_one_part_at_a_time(tmp_path):
    """The filter's examples per reason and a dedup step's first rows, read part by part, are the
    ones a read of every removed row at once gives: the first rows of each reason in part order."""
    import pyarrow as pa

    from corpusmill.pipeline.steps.dedup.removal import examples
    from corpusmill.pipeline.steps.filter import removed_examples

    rng = random.Random(5)
    removed, texts = tmp_path / "removed", tmp_path / "texts"
    removed.mkdir()
    texts.mkdir()
    uid = 0
    for part in range(4):
        rows = []
        for _ in range(rng.randint(0, 9)):  # an empty part, reasons met in different orders
            rows.append({"uid": uid, "id": f"d{uid}", "reason": rng.choice(["short", "gopher", "garbled"]),
                         "score": float(uid), "duplicate_of_id": f"k{uid}", "cluster_size": 2,
                         "text": f"text of {uid} " + "x" * 400})
            uid += 1
        frame = pd.DataFrame(rows, columns=["uid", "id", "reason", "score", "duplicate_of_id", "cluster_size", "text"])
        pq.write_table(pa.Table.from_pandas(frame.astype({"uid": "int64", "score": "float64", "cluster_size": "int64"}),
                                            preserve_index=False), removed / f"part.{part}.parquet")
    for k in range(2):  # the step's input parts: the texts the audit rows were cut from
        pq.write_table(pa.table({"uid": pa.array(range(k, uid, 2), pa.int64()),
                                 "text": [f"text of {u} " + "x" * 400 for u in range(k, uid, 2)]}), texts / f"part-{k}.parquet")
    every = pd.concat([pq.read_table(f).to_pandas() for f in sorted(removed.glob("*.parquet"))], ignore_index=True)
    for per_reason in (1, 2, 50):
        want: dict = {}
        for row in every.groupby("reason").head(per_reason).itertuples():
            want.setdefault(row.reason, []).append({"id": row.id, "score": row.score, "text": row.text[:300]})
        # texts from the audit rows (they keep 2000 characters), or looked up in the parts (they keep 100)
        assert removed_examples(removed, texts, per_reason, audit_chars=2000) == want
        assert removed_examples(removed, texts, per_reason, audit_chars=100) == want
    files = [str(f) for f in sorted(removed.glob("*.parquet"))]
    for n in (1, 5, 100):
        assert examples(files, ("id", "duplicate_of_id"), n) == every[["id", "duplicate_of_id"]].head(n).to_dict("records")
    assert uid > 10 and every["reason"].nunique() == 3
