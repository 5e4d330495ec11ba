"""shards merge / reshard / reweight (stages.shard_tools): new verified sets from token shards, never re-tokenized."""
from __future__ import annotations

import collections
import json
import shutil

import numpy as np
import pytest

from corpusmill.pipeline.config import parse_config
from corpusmill.pipeline.runner import Pipeline
from tests.corpora import build_corpus, e2e_config


@pytest.fixture(scope="module")
def sets(tmp_path_factory, dask_client):
    """One run's training and validation shards: two distinct sets of the same tokenizer and seq_length."""
    root = tmp_path_factory.mktemp("tools")
    build_corpus(root / "corpus")
    cfg = parse_config(e2e_config(root / "corpus", split={"validation": 0.2},
                                  shard={"eod_metadata": "actual_seq_len", "eod_pad_length": 16}))
    Pipeline(cfg, root / "out", client=dask_client, log=lambda m: None).run()
    return {"root": root, "train": root / "out" / "shards", "validation": root / "out" / "shards-validation"}


def _samples(folder) -> collections.Counter:
    import mindspore.dataset as ds

    manifest = json.loads((folder / "manifest.json").read_text())
    out: collections.Counter = collections.Counter()
    for e in manifest["files"]:
        data = ds.MindDataset([str(folder / e["path"])], columns_list=["input_ids", "actual_seq_len"], shuffle=False)
        out.update((tuple(i.tolist()), tuple(a.tolist())) for i, a in data.create_tuple_iterator(output_numpy=True,
                                                                                                num_epochs=1))
    return out


def test_merge_then_reshard_keeps_the_multiset_of_samples(sets, tmp_path):
    from corpusmill.stages.shard_tools import OutputSpec, merge, reshard

    logs: list[str] = []
    merged = merge([str(sets["train"]), str(sets["validation"])], str(tmp_path / "merged"), OutputSpec(1, 2),
                   log=logs.append)
    inputs = _samples(sets["train"]) + _samples(sets["validation"])
    assert _samples(tmp_path / "merged") == inputs and merged["total_samples"] == sum(inputs.values())
    again = reshard(str(tmp_path / "merged"), str(tmp_path / "three"), OutputSpec(3, 2, seed=5), log=logs.append)
    out = _samples(tmp_path / "three")
    assert not out - inputs and sum((inputs - out).values()) == again["dropped_samples"] < 3
    assert again["ranks"] == 3 and again["samples_per_rank"] * 3 == sum(out.values())
    assert {e["rank"] for e in again["files"]} == {0, 1, 2} and len(again["files"]) == 6
    assert again["columns"]["actual_seq_len"]["shape"] == [16]  # the compressed EOD metadata carried, recomputed
    comp = {(g["source"], g["language"]): g["samples"] for g in again["composition"]["groups"]}
    assert sum(comp.values()) == again["total_samples"]
    assert any("verified" in m for m in logs)


def test_reweight_meets_the_token_budgets_and_reports_them(sets, tmp_path):
    from corpusmill.stages.shard_tools import reweight

    manifest = json.loads((sets["train"] / "manifest.json").read_text())
    have = {(g["source"], g["language"]): g["samples"] for g in manifest["composition"]["groups"]}
    window = manifest["sample_length"]
    en, zh = have[("orig", "en")], have[("orig", "zh")]
    (tmp_path / "mix.yaml").write_text(f"tokens:\n  orig: {{en: {en * window // 2}, zh: {zh * window * 2}}}\n")
    logs: list[str] = []
    doc = reweight(str(sets["train"]), str(tmp_path / "mix.yaml"), str(tmp_path / "w"), log=logs.append)
    rows = {(r["source"], r["language"]): r for r in doc["reweight"]["mix"]}
    for key, asked in ((("orig", "en"), en * window // 2), (("orig", "zh"), zh * window * 2)):
        assert abs(rows[key]["delivered"] - asked) <= window  # whole samples: within one of the budget
    assert rows[("orig", "zh")]["samples"] == 2 * zh
    got = {(g["source"], g["language"]): g["samples"] for g in doc["composition"]["groups"]}
    assert got[("orig", "en")] == rows[("orig", "en")]["samples"] and got.get(("c", "en"), 0) == 0
    assert any("asked" in m and "delivered" in m for m in logs)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("corpusmill: error: ")
    return err[0]


def test_bad_inputs_are_one_line(sets, tmp_path, capsys):
    from corpusmill.pipeline.shard_tools_cli import main

    (tmp_path / "taken").mkdir()
    assert main(["merge", str(sets["train"]), str(sets["validation"]), "--out", str(tmp_path / "taken")]) == 2
    assert "already exists" in _one_line(capsys)

    damaged = tmp_path / "damaged"
    shutil.copytree(sets["validation"], damaged)
    victim = damaged / json.loads((damaged / "manifest.json").read_text())["files"][0]["path"]
    data = bytearray(victim.read_bytes())
    data[-100] ^= 0xFF
    victim.write_bytes(bytes(data))
    assert main(["reshard", str(damaged), "--ranks", "2", "--out", str(tmp_path / "o1")]) == 2
    assert "do not check out" in _one_line(capsys) and not (tmp_path / "o1").exists()

    (tmp_path / "mix.yaml").write_text("tokens:\n  web: 1000\n")
    assert main(["reweight", str(sets["validation"]), "--mix", str(tmp_path / "mix.yaml"), "--out",
                 str(tmp_path / "o2")]) == 2
    assert "source 'web', which the set does not hold" in _one_line(capsys) and not (tmp_path / "o2").exists()


def test_sets_of_another_tokenizer_or_seq_length_are_refused(sets):
    from corpusmill.stages.shard_tools import ToolError, check_compatible, open_set

    a = open_set(str(sets["validation"]), log=lambda m: None)
    other = json.loads(json.dumps(a.manifest))
    other["tokenizer"]["sha256"] = "0" * 64
    b = type(a)(a.root + "-other", other, a.file_of, a.row, a.group, a.names)
    with pytest.raises(ToolError, match="another tokenizer"):
        check_compatible([a, b])
    longer = json.loads(json.dumps(a.manifest))
    longer["seq_length"] += 1
    with pytest.raises(ToolError, match="seq_length"):
        check_compatible([a, type(a)(a.root, longer, a.file_of, a.row, a.group, a.names)])
    assert np.array_equal(np.bincount(a.file_of), [e["samples"] for e in a.manifest["files"]])
