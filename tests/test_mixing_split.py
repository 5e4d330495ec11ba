"""The held-out validation split and the mixture: kernels directly, then one small run through the
runner that holds out a split, mixes sources and trains a few steps with the validation loss."""
from __future__ import annotations

import json

import numpy as np
import pytest

from corpusmill.pipeline.config import parse_config
from corpusmill.pipeline.runner import Pipeline
from corpusmill.stages import manifest as mf
from corpusmill.stages.mixing import validation_mask
from tests.test_pipeline_e2e import build_corpus, e2e_config


def test_validation_split_is_stable_under_added_documents_and_near_its_share():
    rng = np.random.default_rng(0)
    hashes = rng.integers(0, 2**63, 20_000, dtype=np.int64).astype(np.uint64)
    held = validation_mask(hashes, 0.05, seed=11)
    assert abs(held.mean() - 0.05) < 0.006
    more = np.concatenate([rng.integers(0, 2**63, 5_000, dtype=np.int64).astype(np.uint64), hashes])
    assert (validation_mask(more, 0.05, seed=11)[5_000:] == held).all()  # adding documents moves none
    assert (validation_mask(hashes[::-1], 0.05, seed=11) == held[::-1]).all()  # nor does their order
    assert (validation_mask(hashes, 0.05, seed=12) != held).any()


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory, dask_client):
    root = tmp_path_factory.mktemp("mix")
    build_corpus(root / "corpus")
    cfg = e2e_config(root / "corpus", split={"validation": 0.1, "seed": 5}, shard={"ranks": 1, "files_per_rank": 1},
                     dedup={"minhash": {"enabled": False}},
                     train={"enabled": True, "steps": 6, "eval_every": 3, "eval_batches": 1, "batch_size": 4,
                            "num_parallel_workers": 1})
    result = Pipeline(parse_config(cfg), root / "out", client=dask_client, log=lambda m: None).run()
    return {"out": root / "out", "result": result}


def test_validation_split_has_its_own_shards_and_the_trainer_reports_its_loss(mixed_run):
    out = mixed_run["out"]
    ledger = json.loads((out / "ledger.json").read_text())
    stats = mixed_run["result"].stages
    held = ledger["validation"]
    assert held["documents"] > 0 and held["samples"] == held["windows"] > 0
    assert stats["pack"]["docs_in"] + held["documents"] == stats["tokenize"]["docs_in"]
    assert stats["pack"]["tokens_in"] + held["tokens"] == stats["tokenize"]["tokens"]
    manifest = mf.load(str(out / "shards-validation"))
    assert mf.check(str(out / "shards-validation"), manifest) == []
    assert manifest["total_samples"] == held["samples"]
    summary = json.loads((out / "train" / "summary.json").read_text())
    assert [step for step, _ in summary["validation"]["losses"]] == [3, 6]
    metrics = [json.loads(x) for x in (out / "train" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "val_loss" in m] == [3, 6]
    assert "held out for validation" in (out / "report.md").read_text()
