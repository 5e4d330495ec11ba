"""The dedup pass that reads each document once: one read and one normalisation per document give the
exact hash and the near-duplicate signatures; exact dedup's removal is deferred to near dedup's one
removal pass. Kernels directly, then one small dedup job through the runner."""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from corpusmill.pipeline.config import parse_config
from corpusmill.pipeline.runner import Pipeline
from corpusmill.pipeline.steps.dedup.signatures import signature_spec
from corpusmill.stages.base import DOC_SCHEMA
from corpusmill.stages.exact_dedup import drop_uids_batch, drop_uids_table, hash_batch, hash_file, hash_texts
from corpusmill.stages.near_dedup import signature_part, verify_pairs_by_uid, verify_pairs_exact
from corpusmill.stages.normalize import fold_whitespace_array, normalize_array
from corpusmill.stages.shingles import ShingleSpec
from tests.conftest import write_jsonl

TEXTS = [
    "  Tabs\tand\u00a0no-break\u3000spaces  \r\n\r\n\r\n\r\nthree   blank lines \n end ",
    "Ｆｕｌｌ－ｗｉｄｔｈ ＬＥＴＴＥＲＳ，中文标点！（括号） &amp; &#233; entities",
    "control\x07chars\u200b and \x1b[31mANSI\x1b[0m  colours\n \n",
    "数据清洗是大模型预训练中最容易被低估的环节。\n\n\n\n原始语料 里 常常混杂着重复的网页。",
    "",
    "plain ascii text with  double  spaces",
]

OPTS = {"nfkc": True, "keep_cjk_punctuation": True, "strip_control": True, "fold_whitespace": True,
        "fullwidth_ascii": True, "html_entities": True, "chinese_convert": None}


def test_folding_the_unfolded_normalisation_equals_the_full_normalisation():
    arr = pa.array(TEXTS, pa.string())
    full = normalize_array(arr, **OPTS)
    assert fold_whitespace_array(normalize_array(arr, **{**OPTS, "fold_whitespace": False})).equals(full)
    assert full[0].as_py() != TEXTS[0]  # the texts do exercise the folding


def test_hash_texts_reads_sliced_arrow_strings_like_hash_batch():
    arr = pa.array(["x"] + TEXTS, pa.string()).slice(1)
    hi, lo = hash_texts(arr)
    ref = hash_batch(pd.DataFrame({"uid": range(len(TEXTS)), "id": "i", "source": "s", "text": TEXTS}))
    assert (hi == ref["h_hi"].to_numpy()).all() and (lo == ref["h_lo"].to_numpy()).all()


def _part(path: Path, texts: list[str], first_uid: int = 0) -> str:
    n = len(texts)
    table = pa.table({"uid": np.arange(first_uid, first_uid + n, dtype=np.int64), "id": [f"d{i}" for i in range(n)],
                      "text": texts, "source": ["s"] * n, "meta": [None] * n, "language": ["en"] * n,
                      "language_score": [None] * n}, schema=DOC_SCHEMA)
    pq.write_table(table, path)
    return str(path)


def test_one_signature_pass_gives_the_exact_hash_and_the_same_signatures(tmp_path):
    part = _part(tmp_path / "part.parquet", TEXTS * 3)
    cfg = parse_config({"dedup": {"minhash": {"enabled": True}, "simhash": {"enabled": True}}})
    fused, near_only = signature_spec(cfg, OPTS, exact=True), signature_spec(cfg, OPTS)
    signature_part(part, str(tmp_path / "fused.parquet"), fused)
    signature_part(part, str(tmp_path / "near.parquet"), near_only)
    a, b = pq.read_table(tmp_path / "fused.parquet"), pq.read_table(tmp_path / "near.parquet")
    for column in b.column_names:  # the near columns are those of a pass without the hash
        assert a.column(column).equals(b.column(column)), column
    ref = hash_file(part, OPTS)  # exact dedup's own hash of the fully normalised text
    assert a.column("h_hi").to_pylist() == ref["h_hi"].tolist() and a.column("h_lo").to_pylist() == ref["h_lo"].tolist()
    assert a.column("raw_chars").to_pylist() == [len(t) for t in TEXTS * 3]
    # the documents an earlier find phase removed (removal deferred) are left out
    signature_part(part, str(tmp_path / "less.parquet"), near_only, np.array([1, 4, 17], dtype=np.int64))
    less = pq.read_table(tmp_path / "less.parquet")
    assert sorted(set(range(18)) - set(less.column("uid").to_pylist())) == [1, 4, 17]


def test_arrow_removal_keeps_what_the_pandas_removal_keeps_and_returns_the_removed_texts():
    table = pa.table({"uid": np.arange(6, dtype=np.int64), "id": list("abcdef"), "text": TEXTS, "source": ["s"] * 6,
                      "meta": [None] * 6, "language": ["en", "zh"] * 3,
                      "language_score": [None] * 6}, schema=DOC_SCHEMA)
    drop = np.array([1, 3, 99], dtype=np.int64)
    result, texts = drop_uids_table(table, drop, None, excerpt_chars=5)
    ref = drop_uids_batch(table.to_pandas(), drop, None)
    assert result.kept.column("uid").to_pylist() == ref.kept["uid"].tolist() == [0, 2, 4, 5]
    assert result.stats["docs_out"] == 4 and "removed" not in result.stats
    assert result.stats["by_group"] == {"s": {"en": {"docs": 3, "chars": len(TEXTS[0]) + len(TEXTS[2]) + len(TEXTS[4])},
                                              "zh": {"docs": 1, "chars": len(TEXTS[5])}}}
    assert texts == {1: TEXTS[1][:5], 3: TEXTS[3][:5]}


def test_dedup_job_with_deferred_exact_removal_balances_and_writes_the_kept_parts_once(dask_client, tmp_path):
    rng = random.Random(3)
    vocab = [f"w{i}" for i in range(2000)]
    docs = [{"id": f"d{i}", "text": " ".join(rng.choice(vocab) for _ in range(200))} for i in range(40)]
    exact = [{"id": f"x{i}", "text": docs[i]["text"] + "  "} for i in range(0, 10, 2)]  # equal after folding
    words = docs[20]["text"].split(" ")
    near = [{"id": "n20", "text": " ".join(words[:100] + ["edit"] + words[101:])}]
    write_jsonl(tmp_path / "in" / "a.jsonl", docs + exact + near)
    cfg = parse_config({"input": {"paths": [str(tmp_path / "in")]}, "dedup": {"minhash": {"enabled": True}}})
    out = tmp_path / "out"
    result = Pipeline(cfg, out, client=dask_client, log=lambda m: None, job="dedup").run()
    led = result.ledger
    assert led["input"] == 46 == led["kept"] + led["duplicates"] and led["duplicates"] == 6
    assert not list((out / "03-exact_dedup").glob("part-*"))  # found only: near dedup's pass removed them
    removed = pq.read_table(str(out / "removed")).to_pandas()
    assert dict(zip(removed["id"], removed["duplicate_of"])) == {**{f"x{i}": f"d{i}" for i in range(0, 10, 2)},
                                                                 "n20": "d20"}
    assert removed["text"].notna().all()  # the exact step's audit rows got their texts in that pass too
    kept = pq.read_table(str(out / "kept")).column("id").to_pylist()
    assert len(kept) == 40 and set(kept) == {d["id"] for d in docs}


def test_pairs_verified_by_uid_equal_the_pairwise_check():
    rng = random.Random(1)
    words = [f"w{i}" for i in range(300)]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 80))) for _ in range(50)] + ["", "中文测试文本" * 5]
    uids = np.arange(100, 100 + len(texts), dtype=np.int64)
    a = np.array([rng.choice(uids) for _ in range(300)])
    b = np.array([rng.choice(uids) for _ in range(300)])
    spec = ShingleSpec(unit="char")
    ref = verify_pairs_exact(a, b, [texts[i - 100] for i in a], [texts[i - 100] for i in b], spec, 0.02)
    got = verify_pairs_by_uid(a, b, (uids, np.asarray(texts, dtype=object)), spec, 0.02)
    assert 0 < len(got) < 300 and got.equals(ref)
