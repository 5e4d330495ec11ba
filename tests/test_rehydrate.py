"""pack.rehydrate: duplicate-aware upsampling. The cluster kernel on chains of removals, the weight
ranges and their validation, then one small run (MindRecord and Megatron from the same selection)
whose packed documents are the kept ones plus exactly the copies their clusters earn, and a rerun
without it that reuses everything up to tokenize."""
from __future__ import annotations

import json

import numpy as np
import pytest

from corpusmill.pipeline.config import parse_config
from corpusmill.pipeline.runner import Pipeline
from corpusmill.stages import manifest as mf
from corpusmill.stages.mixing import cluster_sizes, rehydrate_copies
from tests.corpora import build_corpus, e2e_config

WEIGHTS = [{"min_size": 2, "max_size": 2, "copies": 2}, {"min_size": 3, "max_size": None, "copies": 4}]


def test_a_chain_of_removals_counts_toward_the_document_that_stayed():
    # 7 and 8 are exact copies of 5; near dedup then removed 5 as a near duplicate of 1; 9 copies 2;
    # 30 duplicates 20 and 31 duplicates 30 (given in an order where the chain must be followed)
    removed = np.array([31, 7, 8, 5, 9, 30])
    of = np.array([30, 5, 5, 1, 2, 20])
    roots, sizes = cluster_sizes(removed, of)
    assert dict(zip(roots.tolist(), sizes.tolist())) == {1: 4, 2: 2, 20: 3}
    copies, size = rehydrate_copies(np.array([1, 2, 3, 20]), roots, sizes, WEIGHTS)
    assert size.tolist() == [4, 2, 1, 3] and copies.tolist() == [4, 2, 1, 4]


def test_a_cycle_in_the_removed_rows_is_refused_not_looped_on():
    with pytest.raises(ValueError, match="cycle"):
        cluster_sizes(np.array([1, 2]), np.array([2, 1]))


def test_weight_ranges_must_not_overlap_and_need_the_seeded_order():
    base = {"pack": {"rehydrate": {"enabled": True, "weights": [{"min_size": 2, "max_size": 10, "copies": 2},
                                                                 {"min_size": 5, "copies": 3}]}}}
    with pytest.raises(ValueError, match="overlap"):
        parse_config(base)
    with pytest.raises(ValueError, match="max_size 1 is below min_size 3"):
        parse_config({"pack": {"rehydrate": {"weights": [{"min_size": 3, "max_size": 1, "copies": 2}]}}})
    with pytest.raises(ValueError, match="needs pack.shuffle_documents"):
        parse_config({"pack": {"shuffle_documents": False, "rehydrate": {"enabled": True}}})
    assert parse_config({}).pack.rehydrate.weights[0].copies == 2  # FineWeb-2-like defaults: 2-4 copies count twice


@pytest.fixture(scope="module")
def rehydrated(tmp_path_factory, dask_client):
    root = tmp_path_factory.mktemp("rehydrate")
    truth = build_corpus(root / "corpus")
    cfg = e2e_config(root / "corpus", dedup={"minhash": {"enabled": False}}, shard={"ranks": 1, "files_per_rank": 1,
                     "format": "both"}, pack={"rehydrate": {"enabled": True, "weights": WEIGHTS}})
    lines: list[str] = []
    result = Pipeline(parse_config(cfg), root / "out", client=dask_client, log=lines.append).run()
    return {"root": root, "cfg": cfg, "truth": truth, "result": result, "log": lines}


def test_each_kept_document_is_packed_as_often_as_its_cluster_earns(rehydrated):
    out, stats = rehydrated["root"] / "out", rehydrated["result"].stages
    ledger = json.loads((out / "ledger.json").read_text())
    # o0 has two copies (copy0, copy-of-copy): size 3 -> 4 copies; every other planted original one: 2 copies
    planted = [o for _, o in rehydrated["truth"]["planted"]]
    sizes = {o: planted.count(o) + 1 for o in set(planted)}
    extra = sum(4 - 1 if s >= 3 else 2 - 1 for s in sizes.values())
    h = ledger["rehydrate"]
    assert h["documents_in_clusters"] == len(sizes) and h["largest_cluster"] == 3
    assert h["repeated_copies"] == extra
    assert h["documents"] == stats["tokenize"]["docs_in"]
    assert stats["pack"]["docs_in"] == stats["tokenize"]["docs_in"] + extra
    assert stats["pack"]["tokens_in"] == h["tokens_packed"] > h["tokens_once"] == stats["tokenize"]["tokens"]
    # the Megatron pairs hold the same selection: the same document copies, whole
    assert stats["shard"]["megatron_documents"] == stats["pack"]["docs_in"]
    assert stats["shard"]["megatron_tokens"] == h["tokens_packed"]
    assert mf.check(str(out / "shards"), mf.load(str(out / "shards"))) == []
    report = (out / "report.md").read_text()
    assert "## Rehydration" in report and f"**{extra:,} repeated copies**" in report


def test_with_a_mixture_the_budgets_are_drawn_from_the_upsampled_pool(rehydrated, dask_client):
    cfg = {**rehydrated["cfg"], "mix": {"sources": [{"match": {"language": "zh"}, "weight": 1},
                                                    {"match": {"language": "en"}, "weight": 1}]}}
    result = Pipeline(parse_config(cfg), rehydrated["root"] / "out", resume=True, client=dask_client,
                      log=lambda m: None).run()
    ledger = json.loads((rehydrated["root"] / "out" / "ledger.json").read_text())
    h, mix = ledger["rehydrate"], ledger["mix"]
    assert mix["documents"] == h["documents"] + h["repeated_copies"]  # each rehydrated copy is a document to draw
    assert mix["tokens_available"] == h["tokens_packed"]
    assert mix["copies"] == result.stages["pack"]["docs_in"] == result.stages["shard"]["megatron_documents"]


def test_turning_it_off_reruns_only_pack_and_shard(rehydrated, dask_client):
    cfg = {**rehydrated["cfg"], "pack": {**rehydrated["cfg"]["pack"], "rehydrate": {"enabled": False}}}  # no mix either
    lines: list[str] = []
    result = Pipeline(parse_config(cfg), rehydrated["root"] / "out", resume=True, client=dask_client, log=lines.append).run()
    skipped = {line.split("]")[0][1:] for line in lines if "done in an earlier run" in line}
    assert {"read", "normalize", "filter", "exact_dedup", "tokenize"} <= skipped
    assert "pack" not in skipped and "shard" not in skipped
    assert result.stages["pack"]["docs_in"] == result.stages["tokenize"]["docs_in"]
    assert "rehydrate" not in json.loads((rehydrated["root"] / "out" / "ledger.json").read_text())
