"""The held-out validation split and the mixture: kernels directly, then one small run through the
runner that holds out a split, mixes sources and trains a few steps with the validation loss."""
from __future__ import annotations

import json

import numpy as np
import pytest

from corpusmill.pipeline.config import parse_config
from corpusmill.pipeline.runner import Pipeline
from corpusmill.stages import manifest as mf
from corpusmill.stages.mixing import match_rules, plan_mix, validation_mask
from tests.corpora import build_corpus, e2e_config


def test_validation_split_is_stable_under_added_documents_and_near_its_share():
    rng = np.random.default_rng(0)
    hashes = rng.integers(0, 2**63, 20_000, dtype=np.int64).astype(np.uint64)
    held = validation_mask(hashes, 0.05, seed=11)
    assert abs(held.mean() - 0.05) < 0.006
    more = np.concatenate([rng.integers(0, 2**63, 5_000, dtype=np.int64).astype(np.uint64), hashes])
    assert (validation_mask(more, 0.05, seed=11)[5_000:] == held).all()  # adding documents moves none
    assert (validation_mask(hashes[::-1], 0.05, seed=11) == held[::-1]).all()  # nor does their order
    assert (validation_mask(hashes, 0.05, seed=12) != held).any()


def _corpus(n: int = 4000):
    rng = np.random.default_rng(1)
    pairs = [("web", "zh"), ("web", "en"), ("books", "en"), ("forum", "other")]
    codes = rng.choice(4, n, p=[0.6, 0.3, 0.02, 0.08])
    tokens = rng.integers(50, 400, n)
    hashes = rng.integers(0, 2**63, n, dtype=np.int64).astype(np.uint64)
    return pairs, codes, tokens, hashes


def test_mix_weights_meet_their_shares_and_epochs_repeat_exactly():
    pairs, codes, tokens, hashes = _corpus()
    rules = [{"name": "books", "source": ["books"], "epochs": 2.0},
             {"name": "zh", "language": ["zh"], "weight": 1.0}, {"name": "en", "language": ["en"], "weight": 1.0}]
    owner, home = match_rules(pairs, codes, np.zeros(len(codes), np.int64), ["a.jsonl"], rules)
    copies, summary = plan_mix(tokens, hashes, owner, home, rules, "drop", None, seed=0)
    books = codes == 2
    assert (copies[books] == 2).all()  # upsampled twice, every document, counted as repeated copies
    zh = float((copies * tokens)[codes == 0].sum())
    en = float((copies * tokens)[(codes == 1) | books].sum())  # the books count toward en
    assert abs(zh / (zh + en) - 0.5) < 0.01 and (copies[codes == 3] == 0).all()
    assert (copies[codes == 1] <= 1).all() and (copies[codes == 0] <= 1).all()  # max_epochs 1: no repeats
    assert summary["repeated_copies"] == int(books.sum())
    assert summary["documents"] == summary["documents_drawn"] + summary["documents_left_out"]
    again, _ = plan_mix(tokens, hashes, owner, home, rules, "drop", None, seed=0)
    assert (again == copies).all()  # deterministic


def test_mix_budget_beyond_its_cap_is_a_reported_shortfall_not_a_silent_repeat():
    pairs, codes, tokens, hashes = _corpus()
    rules = [{"name": "books", "source": ["books"], "tokens": 10**9, "max_epochs": 3.0}]
    owner, home = match_rules(pairs, codes, np.zeros(len(codes), np.int64), ["a.jsonl"], rules)
    copies, summary = plan_mix(tokens, hashes, owner, home, rules, "keep", None, seed=0)
    books = summary["rules"][0]
    assert (copies[codes == 2] == 3).all() and books["tokens_delivered"] < books["tokens_asked"] == 10**9
    assert (copies[codes != 2] == 1).all()  # the rest kept once


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory, dask_client):
    root = tmp_path_factory.mktemp("mix")
    build_corpus(root / "corpus")
    originals = [json.loads(x) for x in (root / "corpus" / "a.jsonl").read_text().splitlines()
                 if x.startswith('{"id": "o')]
    planted = {o["id"]: o["text"] for o in originals if o["id"] in ("o3", "o8")}  # an English and a Chinese one
    (root / "eval.jsonl").write_text("".join(json.dumps({"qid": f"q-{k}", "question": t[:200], "answer": "A"},
                                                        ensure_ascii=False) + "\n" for k, t in planted.items()))
    cfg = e2e_config(root / "corpus", split={"validation": 0.1, "seed": 5}, shard={"ranks": 1, "files_per_rank": 1},
                     dedup={"minhash": {"enabled": False}},
                     decontaminate={"sets": [{"name": "planted", "path": str(root / "eval.jsonl"), "id_field": "qid"}]},
                     mix={"sources": [{"match": {"path": "*/c.txt"}, "epochs": 2},
                                      {"match": {"language": "zh"}, "weight": 1}, {"match": {"language": "en"}, "weight": 1}]},
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
    # the training documents are the mixture's (drawn or left out), the held-out ones are not mixed
    assert ledger["mix"]["documents"] + held["documents"] == stats["tokenize"]["docs_in"]
    assert ledger["mix"]["tokens_available"] + held["tokens"] == stats["tokenize"]["tokens"]
    manifest = mf.load(str(out / "shards-validation"))
    assert mf.check(str(out / "shards-validation"), manifest) == []
    assert manifest["total_samples"] == held["samples"]
    summary = json.loads((out / "train" / "summary.json").read_text())
    assert [step for step, _ in summary["validation"]["losses"]] == [3, 6]
    metrics = [json.loads(x) for x in (out / "train" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "val_loss" in m] == [3, 6]
    assert "held out for validation" in (out / "report.md").read_text()


def test_mix_draws_the_asked_shares_and_counts_every_repeat(mixed_run):
    ledger = json.loads((mixed_run["out"] / "ledger.json").read_text())
    mix = ledger["mix"]
    rules = {r["rule"]: r for r in mix["rules"]}
    assert rules["path=*/c.txt"]["repeated_copies"] == 1 and rules["path=*/c.txt"]["epochs_delivered"] == 2.0
    assert abs(rules["language=zh"]["share_delivered"] - 0.5) < 0.02  # a tiny corpus: a few documents' granularity
    assert mix["copies"] == mix["documents_drawn"] + mix["repeated_copies"] == mixed_run["result"].stages["pack"]["docs_in"]
    groups = {(g["source"], g["language"]): g for g in ledger["composition"]["groups"]}
    assert groups[("c", "en")]["packed"]["tokens"] == 2 * groups[("c", "en")]["tokenized"]["tokens"]
    assert "**1 repeated copies**" in (mixed_run["out"] / "report.md").read_text()


def test_decontamination_removes_the_planted_items_documents_and_names_them(mixed_run):
    import pyarrow.parquet as pq

    out = mixed_run["out"]
    ledger = json.loads((out / "ledger.json").read_text())
    assert ledger["stages"]["decontaminate"]["removed"] == {"decontaminated": 2}
    rows = pq.read_table(sorted((out / "04c-decontaminate" / "removed").glob("*.parquet"))).to_pylist()
    assert {(r["id"], r["eval_item"]) for r in rows} == {("o3", "planted:q-o3"), ("o8", "planted:q-o8")}
    assert "## Decontamination" in (out / "report.md").read_text()
