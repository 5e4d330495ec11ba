"""The keeper guard (dedup.minhash.verify_keeper): a chain of near pairs, each document a small edit
of the one before, must not remove its far end as a duplicate of its first document (templated pages,
amendment notices). Real dedup jobs on the session's LocalCluster."""
from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from corpusmill.pipeline.config import parse_config
from corpusmill.pipeline.runner import Pipeline
from corpusmill.stages.near_dedup import exact_jaccard
from corpusmill.stages.shingles import ShingleSpec
from tests.conftest import write_jsonl

STEPS = 20
THRESHOLD = 0.8
SPEC = ShingleSpec(unit="char")  # the dedup default: character 5-grams of every script


def _chain(root: Path) -> dict[str, str]:
    """chain0 .. chain20, each 8 words of 300 replaced by new ones (adjacent Jaccard about 0.9, the
    ends near 0), then unrelated documents; written in that order, so chain0 has the lowest uid."""
    rng = random.Random(38)
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randrange(4, 8))) for _ in range(5000)]
    words = [rng.choice(vocab) for _ in range(300)]
    docs = {}
    for step in range(STEPS + 1):
        docs[f"chain{step}"] = " ".join(words)
        for i in rng.sample(range(len(words)), 8):
            words[i] = f"{rng.choice(vocab)}{step}x{i}"
    for k in range(6):
        docs[f"other{k}"] = " ".join(rng.choice(vocab) for _ in range(300))
    write_jsonl(root / "docs.jsonl", [{"id": k, "text": v, "source": "templates" if k.startswith("chain") else "web"}
                                      for k, v in docs.items()])
    return docs


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    root = tmp_path_factory.mktemp("chain")
    return root / "corpus", _chain(root / "corpus")


def _run(corpus: Path, out: Path, client, **dedup) -> tuple:
    cfg = parse_config({"input": {"paths": [str(corpus)], **dedup.pop("input", {})},
                        "dedup": {"minhash": {"threshold": THRESHOLD, **dedup.pop("minhash", {})}, **dedup}})
    result = Pipeline(cfg, out, client=client, log=lambda m: None, job="dedup").run()
    removed = pq.read_table(str(out / "removed")).to_pandas()
    kept = set(pq.read_table(str(out / "kept")).column("id").to_pylist())
    return result, removed, kept


def _jaccard(docs: dict[str, str], a: list[str], b: list[str]) -> list[float]:
    return exact_jaccard(pa.array([docs[x] for x in a]), pa.array([docs[x] for x in b]), SPEC).tolist()


def test_the_planted_chain_is_a_chain(chain):
    _, docs = chain
    ids = [f"chain{i}" for i in range(STEPS + 1)]
    adjacent = _jaccard(docs, ids[:-1], ids[1:])
    assert min(adjacent) >= THRESHOLD and _jaccard(docs, ["chain0"], [ids[-1]])[0] < 0.5


def test_guard_removes_only_documents_near_their_keeper_whatever_the_partitioning(chain, dask_client, tmp_path):
    corpus, docs = chain
    one = _run(corpus, tmp_path / "one", dask_client, input={"part_size_mb": 64})
    # 3 parts, and the distributed components / keeper / guard path
    many = _run(corpus, tmp_path / "many", dask_client, input={"part_size_mb": 0.02, "block_size_mb": 0.02},
                components_memory_mb=0)
    assert len(list((tmp_path / "many" / "00-read").glob("part*.parquet"))) >= 3
    for result, removed, kept in (one, many):
        assert result.ledger["input"] == len(docs) == result.ledger["kept"] + result.ledger["duplicates"]
        truth = _jaccard(docs, removed["id"].tolist(), removed["duplicate_of"].tolist())
        assert min(truth) >= THRESHOLD  # every removed document is itself near the document it duplicates
        assert removed["similarity"].round(9).tolist() == [round(x, 9) for x in truth]  # and says how near
        stage = pq.read_table(str(next(result_dir for result_dir in (tmp_path / "one", tmp_path / "many")
                                       if result is (one if result_dir.name == "one" else many)[0]) / "04-near_dedup" / "removed")).to_pandas()
        assert (stage["threshold"] == THRESHOLD).all()  # the stage's audit rows carry the threshold beside the score
        assert set(removed["duplicate_of"]) <= kept and "chain0" in kept
        end = f"chain{STEPS}"
        assert end in kept or _jaccard(docs, [end], [removed.set_index("id").loc[end, "duplicate_of"]])[0] >= THRESHOLD
        assert not any(i.startswith("other") for i in removed["id"])
        guard = result.stages["near_dedup"]["keeper_guard"]
        assert guard["below_threshold"] > 0 and guard["regrouped"] + guard["released"] == guard["below_threshold"]
    key = ["id", "duplicate_of", "cluster_id", "cluster_size"]
    a, b = (r[1].sort_values("id")[key].reset_index(drop=True) for r in (one, many))
    assert a.equals(b) and len(one[2]) == len(many[2])
    report = (tmp_path / "one" / "report.md").read_text(encoding="utf-8")
    table = report[report.index("Largest near-duplicate clusters"):]
    assert f"| {STEPS + 1} |" in table and "templates" in table and "chain0" in table
    assert "released by the keeper guard" in report


def test_without_the_guard_the_whole_component_goes_to_its_first_document(chain, dask_client, tmp_path):
    corpus, docs = chain
    _, removed, kept = _run(corpus, tmp_path / "off", dask_client, minhash={"verify_keeper": False})
    assert set(removed["id"]) == {f"chain{i}" for i in range(1, STEPS + 1)} and set(removed["duplicate_of"]) == {"chain0"}
    truth = _jaccard(docs, removed["id"].tolist(), removed["duplicate_of"].tolist())
    assert min(truth) < 0.5  # the far end is removed as a copy of a document it shares almost nothing with
    assert removed["similarity"].round(9).tolist() == [round(x, 9) for x in truth]  # the score says so
