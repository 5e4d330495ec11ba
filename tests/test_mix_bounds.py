"""A mixture that repeats documents is bounded before it is built: `epochs: 1000` on a small corpus runs
(the preflight's bound on its copies and shards holds what the run really made), a path rule whose
copies cannot fit in memory is refused in the preflight in one line naming the rule before the read
step starts, and the plan is checked again on the tokenize step's real counts before the pack step."""
from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from corpusmill.pipeline.config import parse_config
from corpusmill.pipeline.doctor import PLAN_BYTES_PER_COPY, mix_plan_problem
from corpusmill.pipeline.runner import Pipeline
from corpusmill.pipeline.step import PipelineError
from tests.conftest import write_jsonl
from tests.conftest import LENGTH_ONLY_FILTER
from tests.corpora import en_doc, zh_doc

EPOCHS = 1000


def _cfg(paths: list[Path], mix: dict) -> dict:
    return {"input": {"paths": [str(p) for p in paths]}, "filter": {"length": {"min_chars": 10}, **LENGTH_ONLY_FILTER},
            "tokenizer": {"train": {"vocab_size": 1500}}, "pack": {"seq_length": 32}, "mix": mix}


@pytest.fixture(scope="module")
def small(tmp_path_factory, dask_client) -> dict:
    d = tmp_path_factory.mktemp("mix")
    rng = random.Random(3)
    corpus = write_jsonl(d / "corpus" / "a.jsonl", [{"id": f"d{i}", "text": (en_doc if i % 2 else zh_doc)(rng)}
                                                    for i in range(40)])
    cfg = parse_config(_cfg([corpus], {"sources": [{"name": "zh", "match": {"language": "zh"}, "epochs": EPOCHS}]}))
    logs: list[str] = []
    Pipeline(cfg, d / "out", client=dask_client, log=logs.append).run()
    return {"dir": d, "out": d / "out", "cfg": cfg, "logs": logs, "corpus": corpus}


def test_epochs_1000_on_a_small_corpus_runs_within_the_preflight_bound(small):
    mix = json.loads((small["out"] / "ledger.json").read_text())["mix"]
    rule = mix["rules"][0]
    assert rule["documents"] > 0 and rule["copies"] == EPOCHS * rule["documents"]
    bound = [line for line in small["logs"] if "mix.sources[0] (zh)" in line]
    assert len(bound) == 1 and "preflight warning" not in bound[0], small["logs"]
    copies_bound = int(bound[0].split("up to ")[2].split(" copies")[0].replace(",", ""))
    size, unit = re.search(r"([\d,.]+) (MiB|GiB) of shards", bound[0]).groups()
    shards_bound = float(size.replace(",", "")) * (2**20 if unit == "MiB" else 2**30)
    shard_bytes = sum(p.stat().st_size for p in (small["out"] / "shards").rglob("*") if p.is_file())
    assert mix["copies"] <= copies_bound and shard_bytes <= shards_bound, (mix["copies"], copies_bound, shard_bytes)


def test_the_plan_is_checked_on_the_real_counts_before_pack(small):
    tokenized = json.loads((small["out"] / "05-tokenize" / "_DONE.json").read_text())["stats"]
    docs = json.loads((small["out"] / "ledger.json").read_text())["mix"]["rules"][0]["documents"]
    need = EPOCHS * docs * PLAN_BYTES_PER_COPY
    assert mix_plan_problem(small["cfg"], tokenized, available=100 * need, free=None) is None
    problem = mix_plan_problem(small["cfg"], tokenized, available=need // 2, free=None)
    assert problem is not None and "\n" not in problem
    assert problem.startswith(f"mix.sources[0] (zh): epochs {EPOCHS} makes up to {EPOCHS * docs:,} copies"), problem


def test_a_path_rule_whose_copies_cannot_fit_is_refused_before_any_work(tmp_path):
    from corpusmill.trainer.memory import available_memory

    lines = 1_200_000  # 1.2e9 copies: about 180 GiB for the plan
    big = tmp_path / "corpus" / "tiny-records.jsonl"
    big.parent.mkdir()
    big.write_bytes(b'{"text": "x"}\n' * lines)
    if (available_memory() or 0) * 0.8 > EPOCHS * lines * PLAN_BYTES_PER_COPY:
        pytest.skip("this machine could hold the plan")
    cfg = parse_config(_cfg([big], {"sources": [{"match": {"path": "*tiny-records*"}, "epochs": EPOCHS}]}))
    out = tmp_path / "out"
    with pytest.raises(PipelineError) as e:
        Pipeline(cfg, out, log=lambda m: None).run()  # no cluster: the preflight stops it first
    rule = [line for line in str(e.value).splitlines() if "mix.sources[0]" in line]
    assert len(rule) == 1 and f"over up to {lines:,} input records" in rule[0] and "pack plan" in rule[0], str(e.value)
    assert not (out / "00-read").exists()
