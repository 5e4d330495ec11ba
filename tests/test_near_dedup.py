"""Near-duplicate detection: equality with datasketch and simhash, components, keep policies, and the
dedup job end to end (real Dask, planted near duplicates in English and Chinese)."""
from __future__ import annotations

import json
import random
from pathlib import Path

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasketch import MinHash
from simhash import Simhash

from corpusmill.pipeline.config import parse_config
from corpusmill.pipeline.runner import Pipeline
from corpusmill.pipeline.steps.dedup.clustering import cluster_distributed
from corpusmill.stages.components import components_in_memory
from corpusmill.stages.minhash import candidate_probability, optimal_bands, signatures
from corpusmill.stages.near_dedup import choose_keepers, exact_jaccard
from corpusmill.stages.shingles import ShingleSpec, shingle_hash32, shingle_hash64, shingle_hashes, shingle_strings
from corpusmill.stages.simhash import block_rows, fingerprints, near_edges, popcount64
from tests.conftest import write_jsonl

SAMPLES = [
    "The quick brown fox jumps over the lazy dog, again and again!",
    "数据清洗是大模型预训练中最容易被低估的环节。原始语料里常常混杂着重复的网页。",
    "中文 mixed with English words, 你好世界, and numbers 123.",
    "short one",
    "",
    "   ",
    "Ｆｕｌｌ－ｗｉｄｔｈ ＬＥＴＴＥＲＳ and tabs\tand\nnewlines",
    "こんにちは世界、これは日本語の文です。",
]


@pytest.mark.parametrize("spec", [ShingleSpec(), ShingleSpec(word_ngram=2, char_ngram=3, lowercase=False, strip_punctuation=False),
                                  ShingleSpec(unit="char"), ShingleSpec(unit="char", char_ngram=3, strip_punctuation=False)])
def test_vectorised_shingles_equal_the_reference(spec):
    hashes, offsets = shingle_hashes(pa.array(SAMPLES), spec)
    for i, text in enumerate(SAMPLES):
        ref = [shingle_hash64(s.encode()) for s in shingle_strings(text, spec)]
        assert hashes[offsets[i]:offsets[i + 1]].tolist() == ref, text


def test_cjk_detected_per_document_and_shingled_by_character():
    assert shingle_strings("今天天气很好", ShingleSpec(char_ngram=2))[:2] == ["今 天", "天 天"]
    assert shingle_strings("one two three", ShingleSpec(word_ngram=2)) == ["one two", "two three"]


def test_char_unit_shingles_every_script_by_character_within_one_document():
    """unit="char": English, Chinese and the two mixed are all character n-grams, whitespace and punctuation dropped."""
    spec = ShingleSpec(char_ngram=3, unit="char")
    assert shingle_strings("Hi, you!", spec) == ["h i y", "i y o", "y o u"]
    assert shingle_strings("数据 ls -la 清洗", spec)[:3] == ["数 据 l", "据 l s", "l s l"]


@pytest.mark.parametrize("num_perm,seed,unit", [(128, 1, "word"), (64, 42, "word"), (128, 1, "char")])
def test_minhash_signatures_equal_datasketch(num_perm, seed, unit):
    spec = ShingleSpec(unit=unit)
    hashes, offsets = shingle_hashes(pa.array(SAMPLES), spec)
    sig = signatures(hashes, offsets, num_perm, seed)
    for i, text in enumerate(SAMPLES):
        m = MinHash(num_perm=num_perm, seed=seed, hashfunc=shingle_hash32)
        for s in shingle_strings(text, spec):
            m.update(s.encode())
        assert np.array_equal(sig[i], m.hashvalues), text


def test_exact_jaccard_equals_the_jaccard_of_the_reference_shingle_sets():
    rng = random.Random(7)
    pool = SAMPLES + ["".join(rng.choice("abcde 数据清洗") for _ in range(rng.randrange(0, 60))) for _ in range(40)]
    a = [rng.choice(pool) for _ in range(60)]
    b = [x[: len(x) // 2] + rng.choice(pool) if rng.random() < 0.5 else rng.choice(pool) for x in a]
    spec = ShingleSpec(unit="char")
    got = exact_jaccard(pa.array(a), pa.array(b), spec)
    for x, y, j in zip(a, b, got):
        sx, sy = set(shingle_strings(x, spec)), set(shingle_strings(y, spec))
        assert j == pytest.approx(len(sx & sy) / len(sx | sy) if sx | sy else 1.0), (x, y)


def test_recall_tuned_bands_make_a_pair_at_the_threshold_a_candidate_almost_surely():
    for t in (0.7, 0.8, 0.9):
        b, r = optimal_bands(t, 128, verify=True)
        assert b * r <= 128 and candidate_probability(t, b, r) >= 0.998
        assert candidate_probability(t, 128 // (r + 1), r + 1) < 0.998  # one more row would miss pairs: fewest candidates


def test_simhash_fingerprints_equal_the_simhash_package():
    spec = ShingleSpec(word_ngram=3, char_ngram=3)
    hashes, offsets = shingle_hashes(pa.array(SAMPLES), spec)
    fps = fingerprints(hashes, offsets)
    for i, text in enumerate(SAMPLES):
        features = shingle_strings(text, spec)
        if features:
            assert int(fps[i]) == Simhash(features, hashfunc=shingle_hash64).value, text


def test_simhash_character_features_keep_one_word_changes_close():
    rng = random.Random(1)
    base = "".join(rng.choice([chr(0x4E00 + i) for i in range(2000)]) for _ in range(600))
    edited = base[:300] + "改动" + base[302:]
    spec = ShingleSpec(word_ngram=3, char_ngram=3)
    hashes, offsets = shingle_hashes(pa.array([base, edited, base[::-1]]), spec)
    fps = fingerprints(hashes, offsets)
    assert int(popcount64(np.array([fps[0] ^ fps[1]]))[0]) <= 3
    assert int(popcount64(np.array([fps[0] ^ fps[2]]))[0]) > 10


def test_simhash_tables_find_every_pair_within_k_and_handle_oversized_buckets():
    rng = np.random.default_rng(0)
    base = rng.integers(0, 2**63, 200, dtype=np.int64).view(np.uint64)
    flips = np.zeros(200, dtype=np.uint64)
    for i in range(200):  # each base has a twin exactly k = 3 bits away, the bits anywhere
        for bit in rng.choice(64, 3, replace=False):
            flips[i] |= np.uint64(1) << np.uint64(bit)
    fps = np.concatenate([base, base ^ flips])
    uids = np.arange(400)
    rows = block_rows(uids, fps, np.ones(400, bool), max_distance=3)
    assert len(rows) == 400 * 10  # k + 2 = 5 blocks, one table per pair of them
    edges = near_edges(rows, 3)
    assert {(int(a), int(b)) for a, b in zip(edges["a"], edges["b"])} == {(i + 200, i) for i in range(200)}
    assert not len(near_edges(block_rows(uids, fps, np.ones(400, bool), max_distance=2), 2))  # 3 bits apart: none within 2
    # the low 32 bits (blocks 0 and 1) shared by 3000 fingerprints: windowed, not quadratic, and still finds twins
    many = np.uint64(0xABCDABCD) | (rng.integers(0, 2**31, 3000, dtype=np.int64).astype(np.uint64) << np.uint64(32))
    fps2 = np.concatenate([many, many ^ np.uint64(1 << 40)])
    rows2 = block_rows(np.arange(6000), fps2, np.ones(6000, bool), max_distance=3)
    edges2 = near_edges(rows2, 3, max_bucket=100, window=8)
    assert {(i + 3000, i) for i in range(3000)} <= {(int(a), int(b)) for a, b in zip(edges2["a"], edges2["b"])}


def test_components_in_memory_and_distributed_agree(step_context):
    rng = np.random.default_rng(3)
    a = rng.integers(0, 400, 300) * 11 + 5
    b = rng.integers(0, 400, 300) * 11 + 5
    chain = np.arange(10_000, 10_060)  # a long path needs several rounds
    a, b = np.concatenate([a, chain[1:]]), np.concatenate([b, chain[:-1]])
    keep = a != b
    a, b = a[keep], b[keep]
    ref = components_in_memory(a, b).sort_values("uid").reset_index(drop=True)
    got = cluster_distributed(step_context, dd.from_pandas(pd.DataFrame({"a": a, "b": b}), npartitions=3)).compute()
    got = got.sort_values("uid").reset_index(drop=True)[["uid", "root"]].astype("int64")
    assert ref.equals(got)
    assert (ref.groupby("root")["uid"].min() == ref.groupby("root")["uid"].min().index).all()


def test_keep_policies():
    nodes = pd.DataFrame({
        "uid": [1, 2, 3, 7, 8], "root": [1, 1, 1, 7, 7], "id": ["a", "b", "c", "d", "e"], "source": "s",
        "n_chars": [10, 30, 30, 5, 9], "keep_key": ["2020-01-01", "2024-05-01", None, "2021-03-01", "2019-12-31"],
    })
    low = choose_keepers(nodes, "lowest_uid")
    assert dict(zip(low["uid"], low["duplicate_of"])) == {2: 1, 3: 1, 8: 7}
    assert set(low["cluster_size"]) == {3, 2} and set(low["cluster_id"]) == {1, 7}
    longest = choose_keepers(nodes, "longest")
    assert dict(zip(longest["uid"], longest["duplicate_of"])) == {1: 2, 3: 2, 7: 8}  # tie 2 vs 3 -> lower uid
    newest = choose_keepers(nodes, "field", "max")
    assert dict(zip(newest["uid"], newest["duplicate_of_id"])) == {1: "b", 3: "b", 8: "d"}  # no value never wins
    oldest = choose_keepers(nodes, "field", "min")
    assert dict(zip(oldest["uid"], oldest["duplicate_of_id"])) == {2: "a", 3: "a", 7: "e"}
    numbers = nodes.assign(keep_key=["3", "12", "7", "1", "2"])
    assert dict(zip(*[choose_keepers(numbers, "field", "max")[c] for c in ("uid", "duplicate_of")])) == {1: 2, 3: 2, 7: 8}


# ---- the dedup job end to end ---------------------------------------------------------------

def _edit(text: str, rng: random.Random, words: bool, n_edits: int) -> str:
    toks = text.split(" ") if words else list(text)
    for _ in range(n_edits):
        i = rng.randrange(len(toks))
        toks[i] = rng.choice(["alpha", "beta", "gamma"]) if words else rng.choice("甲乙丙丁")
    return (" " if words else "").join(toks)


def build_near_corpus(root: Path) -> dict:
    rng = random.Random(5)
    vocab = [f"w{i}" for i in range(3000)]
    hanzi = [chr(0x4E00 + i) for i in range(3000)]
    docs, planted = [], set()
    for i in range(120):
        en = " ".join(rng.choice(vocab) for _ in range(400))
        zh = "".join(rng.choice(hanzi) for _ in range(400))
        docs.append({"id": f"en{i}", "text": en, "date": f"2020-01-{i % 28 + 1:02d}"})
        docs.append({"id": f"zh{i}", "text": zh, "date": f"2020-02-{i % 28 + 1:02d}"})
        if i % 4 == 0:  # a near copy with a few edits (Jaccard around 0.9), newer
            docs.append({"id": f"en{i}-near", "text": _edit(en, rng, True, 4), "date": "2024-01-01"})
            docs.append({"id": f"zh{i}-near", "text": _edit(zh, rng, False, 4), "date": "2024-01-01"})
            planted |= {(f"en{i}-near", f"en{i}"), (f"zh{i}-near", f"zh{i}")}
    rng.shuffle(docs)
    write_jsonl(root / "a.jsonl", docs[: len(docs) // 2])
    write_jsonl(root / "b.jsonl", docs[len(docs) // 2:], {3: b"not json\n"})
    return {"planted": planted, "n": len(docs) + 1}


def _dedup(root: Path, out: Path, client, **dedup) -> tuple:
    cfg = parse_config({"input": {"paths": [str(root)], **dedup.pop("input", {})},
                        "dedup": {"minhash": {"enabled": True}, **dedup}})
    result = Pipeline(cfg, out, client=client, log=lambda m: None, job="dedup").run()
    removed = pq.read_table(str(out / "removed")).to_pandas()
    return result, removed


@pytest.fixture(scope="module")
def near_corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("near")
    return root / "corpus", build_near_corpus(root / "corpus")


def test_dedup_job_removes_exactly_the_planted_near_duplicates(near_corpus, dask_client, tmp_path):
    corpus, truth = near_corpus
    result, removed = _dedup(corpus, tmp_path / "out", dask_client)
    led = result.ledger
    assert led["input"] == truth["n"] == led["kept"] + led["duplicates"] + led["quarantined"] and led["filtered"] == 0
    pairs = {tuple(sorted((r.id, r.duplicate_of))) for r in removed.itertuples()}
    assert pairs == {tuple(sorted(p)) for p in truth["planted"]}
    assert set(removed["reason"]) == {"minhash"} and (removed["similarity"] >= removed["threshold"]).all()
    assert set(removed["threshold"]) == {0.8}  # the bar each removal passed, beside how near it is
    assert set(removed.columns) >= {"uid", "id", "reason", "duplicate_of", "cluster_id", "cluster_size", "similarity",
                                    "threshold"}
    kept = pq.read_table(str(tmp_path / "out" / "kept")).to_pandas()
    assert len(kept) == led["kept"] and set(kept.columns) == {"id", "text", "source", "date"}


def test_keep_newest_by_field_and_jsonl_export(near_corpus, dask_client, tmp_path):
    corpus, truth = near_corpus
    cfg = parse_config({"input": {"paths": [str(corpus)]},
                        "dedup": {"keep": "field", "keep_field": "date", "keep_order": "max"}})
    Pipeline(cfg, tmp_path / "out", client=dask_client, log=lambda m: None, job="dedup", export_format="jsonl").run()
    removed = pd.DataFrame([json.loads(line) for f in sorted((tmp_path / "out" / "removed").glob("*.jsonl"))
                            for line in f.open(encoding="utf-8")])  # --format jsonl writes removed/ as JSONL too
    assert set(removed["id"]) == {orig for _, orig in truth["planted"]}  # the newer copies are kept
    kept_ids = {json.loads(line)["id"] for f in (tmp_path / "out" / "kept").glob("*.jsonl") for line in f.open()}
    assert {near for near, _ in truth["planted"]} <= kept_ids


def test_same_kept_set_whatever_the_partitioning_or_components_mode(near_corpus, dask_client, tmp_path):
    corpus, _ = near_corpus
    _, one = _dedup(corpus, tmp_path / "one", dask_client, input={"part_size_mb": 64})
    _, many = _dedup(corpus, tmp_path / "many", dask_client, input={"part_size_mb": 0.06, "block_size_mb": 0.12},
                     components_memory_mb=0)  # forces the distributed components
    key = ["uid", "duplicate_of_uid", "cluster_id", "cluster_size"]
    a = one.sort_values("uid")[key].reset_index(drop=True)
    b = many.sort_values("uid")[key].reset_index(drop=True)
    assert len(a) > 0 and a.equals(b)


def test_simhash_method_in_the_dedup_job(near_corpus, dask_client, tmp_path):
    corpus, truth = near_corpus
    _, removed = _dedup(corpus, tmp_path / "out", dask_client, minhash={"enabled": False}, simhash={"enabled": True})
    pairs = {tuple(sorted((r.id, r.duplicate_of))) for r in removed.itertuples()}
    assert set(removed["reason"]) == {"simhash"} and pairs <= {tuple(sorted(p)) for p in truth["planted"]}
    assert len(pairs) >= 0.7 * len(truth["planted"])  # default features (character 3-grams), k = 5: 45 of 60 here
    # verified: each similarity is the pair's true Jaccard, at or above the threshold, not 1 - Hamming/64
    assert (removed["similarity"] >= 0.8).all()
    assert not np.isin(removed["similarity"].round(9), [round(1 - d / 64, 9) for d in range(7)]).any()


def _boundary_corpus(root: Path) -> tuple[set, set]:
    """English, Chinese and mixed documents, each with one edited copy whose true character 5-gram
    Jaccard is 0.70-0.90: (pairs at or above 0.8, pairs below)."""
    rng = random.Random(11)
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = ["".join(rng.choice(letters) for _ in range(rng.randrange(3, 9))) for _ in range(3000)]
    hanzi = [chr(0x4E00 + i) for i in range(3000)]
    spec = ShingleSpec(unit="char")
    docs, above, below = [], set(), set()
    for lang in ("en", "zh", "mixed"):
        for i in range(40):
            if lang == "en":
                toks, sep = [rng.choice(vocab) for _ in range(250)], " "
            elif lang == "zh":
                toks, sep = [rng.choice(hanzi) for _ in range(900)], ""
            else:  # Chinese prose with English terms and commands
                toks, sep = [rng.choice(hanzi) if rng.random() < 0.7 else f" {rng.choice(vocab)} " for _ in range(700)], ""
            base = sep.join(toks)
            lo, hi = (0.8, 0.9) if i % 2 else (0.7, 0.8)  # half the copies just above the threshold, half just below
            for _ in range(200):  # edits until the copy lands in the band
                edited = list(toks)
                for _ in range(rng.randrange(1, 40)):
                    edited[rng.randrange(len(edited))] = rng.choice(hanzi if lang == "zh" else vocab) if lang != "mixed" else rng.choice(hanzi)
                copy = sep.join(edited)
                j = float(exact_jaccard(pa.array([base]), pa.array([copy]), spec)[0])
                if lo <= j < hi:
                    break
            else:
                continue
            a, b = f"{lang}{i}", f"{lang}{i}-copy"
            docs += [{"id": a, "text": base}, {"id": b, "text": copy}]
            (above if j >= 0.8 else below).add((b, a))
    rng.shuffle(docs)
    write_jsonl(root / "docs.jsonl", docs)
    return above, below


def test_threshold_boundary_is_sharp_in_english_chinese_and_mixed_text(dask_client, tmp_path):
    """Exact verification: every pair at or above 0.8 true character 5-gram Jaccard is removed, none below
    (an estimate from 128 permutations is about +-0.04 off at 0.8, and would err on both sides)."""
    above, below = _boundary_corpus(tmp_path / "corpus")
    for lang in ("en", "zh", "mixed"):  # the corpus really straddles the threshold in every language
        assert sum(a.startswith(lang) for a, _ in above) >= 5 and sum(a.startswith(lang) for a, _ in below) >= 5
    _, removed = _dedup(tmp_path / "corpus", tmp_path / "out", dask_client, exact=False)
    pairs = {tuple(sorted((r.id, r.duplicate_of))) for r in removed.itertuples()}
    assert pairs == {tuple(sorted(p)) for p in above}
    assert (removed["similarity"] >= 0.8).all()


def test_duplicate_of_always_names_a_kept_document(dask_client, tmp_path):
    """An exact copy of a document that near dedup then removes must point at the near-duplicate
    keeper, not at the removed document (issue 20 item 8)."""
    rng = random.Random(2)
    words = ["".join(rng.choice("abcdefghij") for _ in range(6)) for _ in range(2000)]
    base = " ".join(rng.choice(words) for _ in range(300))
    near = base.replace(base.split(" ")[10], "changed", 1)  # one word edited: Jaccard about 0.98
    other = " ".join(rng.choice(words) for _ in range(300))
    # read order gives uids: the near copy first, so it is the near cluster's keeper (lowest uid)
    write_jsonl(tmp_path / "c" / "docs.jsonl", [{"id": "near", "text": near}, {"id": "base", "text": base},
                                                {"id": "base-copy", "text": base}, {"id": "other", "text": other}])
    _, removed = _dedup(tmp_path / "c", tmp_path / "out", dask_client)
    kept = set(pq.read_table(str(tmp_path / "out" / "kept")).column("id").to_pylist())
    assert kept == {"near", "other"}
    assert dict(zip(removed["id"], removed["duplicate_of"])) == {"base": "near", "base-copy": "near"}
    assert dict(zip(removed["id"], removed["reason"])) == {"base": "minhash", "base-copy": "exact"}
    assert set(removed["duplicate_of"]) <= kept


def test_keep_field_that_no_document_has_stops_with_one_line_naming_it(near_corpus, dask_client, tmp_path):
    """`--keep field:NAME` on input without NAME must not fall back to the lowest uid in silence (issue 20 item 10)."""
    from corpusmill.pipeline.step import PipelineError

    corpus, _ = near_corpus
    with pytest.raises(PipelineError) as err:
        _dedup(corpus, tmp_path / "out", dask_client, keep="field", keep_field="published")
    message = str(err.value)
    assert "'published'" in message and "none of the" in message and "\n" not in message
    assert not (tmp_path / "out" / "kept").exists()


def _half_dated_pairs(root: Path) -> int:
    """Near-duplicate pairs: an undated original first (lowest uid), then a dated near copy."""
    rng = random.Random(8)
    vocab = [f"v{i}" for i in range(3000)]
    docs = []
    for i in range(12):
        text = " ".join(rng.choice(vocab) for _ in range(300))
        docs += [{"id": f"orig{i}", "text": text}, {"id": f"copy{i}", "text": _edit(text, rng, True, 3), "date": "2001-01-01"}]
    write_jsonl(root / "docs.jsonl", docs)
    return 12


def test_documents_without_the_keep_field_lose_and_are_counted(dask_client, tmp_path):
    undated = _half_dated_pairs(tmp_path / "corpus")
    logs: list[str] = []
    cfg = parse_config({"input": {"paths": [str(tmp_path / "corpus")]},
                        "dedup": {"keep": "field", "keep_field": "date", "keep_order": "min"}})
    result = Pipeline(cfg, tmp_path / "out", client=dask_client, log=logs.append, job="dedup").run()
    removed = pq.read_table(str(tmp_path / "out" / "removed")).to_pandas()
    # the dated copy wins even under "min" and against the lower uid: a document without the field loses
    assert dict(zip(removed["id"], removed["duplicate_of"])) == {f"orig{i}": f"copy{i}" for i in range(undated)}
    assert result.stages["near_dedup"]["keep_field_missing"] == undated
    assert any(f"{undated} of {2 * undated} documents have no 'date' field" in line for line in logs)
