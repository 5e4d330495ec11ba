"""shard.eod_metadata: actual_seq_len (mindformers' compressed EOD mask) in MindRecord and the Megatron YAML,
read by stock mindformers 1.9.0 (its MindDataset path and its BlendedMegatronDatasetDataLoader), and the coupled
trainer attending within each packed document."""
from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from corpusmill.pipeline.config import parse_config
from corpusmill.pipeline.runner import Pipeline
from tests.corpora import build_corpus, e2e_config

PAD_LENGTH = 16

# Builds the dataset as a mindformers run does (the YAML as written, MindFormerConfig, build_dataset) and also
# computes mindformers' own compressed mask (_get_eod_attention_mask) of each sample's first seq_length ids.
READER = """
import json, sys
import numpy as np
from mindformers import MindFormerConfig
from mindformers.dataset import build_dataset
from mindformers.dataset.blended_datasets.gpt_dataset import _get_eod_attention_mask
cfg = MindFormerConfig(sys.argv[1])
eos, pad_length, seq = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
if cfg.train_dataset_task.dataset_config.batch_size is None:
    cfg.train_dataset_task.dataset_config.batch_size = 1  # a training run sets it from runner_config
dataset = build_dataset(cfg.train_dataset_task)
rows = []
for row in dataset.create_dict_iterator(output_numpy=True, num_epochs=1):
    ids = row["input_ids"][0]
    rows.append({"input_ids": ids.tolist(), "actual_seq_len": row["actual_seq_len"][0].tolist(),
                 "dtype": str(row["actual_seq_len"].dtype),
                 "theirs": _get_eod_attention_mask(ids[:seq], eos, pad_length).tolist(),
                 "position_ids": row["position_ids"][0].tolist() if "position_ids" in row else None})
print("ROWS" + json.dumps({"columns": dataset.get_col_names(), "rows": rows}))
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory, dask_client):
    root = tmp_path_factory.mktemp("eod")
    build_corpus(root / "corpus")
    cfg = parse_config(e2e_config(root / "corpus", shard={"format": "both", "eod_metadata": "actual_seq_len",
                                                          "eod_pad_length": PAD_LENGTH, "ranks": 1}))
    Pipeline(cfg, root / "out", client=dask_client, log=lambda m: None).run()
    shards = root / "out" / "shards"
    return {"shards": shards, "manifest": json.loads((shards / "manifest.json").read_text()), "cfg": cfg}


@pytest.fixture(scope="session")
def pybind11_site(request) -> Path:
    """pybind11 beside stock mindformers: its Megatron loader compiles a C++ helper at first use."""
    cache = getattr(request.config, "cache", None)
    site = cache.mkdir("pybind11-3.1.0") if cache is not None else Path("/tmp/corpusmill-test-pybind11")
    if not (site / "pybind11").is_dir():
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                               "pybind11==3.1.0"], capture_output=True, text=True, timeout=600)
        if proc.returncode:
            pytest.skip("pybind11 could not be installed: " + (proc.stderr.strip().splitlines() or ["pip failed"])[-1])
    return site


def _stock(sites: list[Path], yaml_file: Path, manifest: dict, cwd: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(s) for s in sites)}
    args = [str(yaml_file), str(manifest["tokenizer"]["eos_id"]), str(PAD_LENGTH), str(manifest["seq_length"])]
    proc = subprocess.run([sys.executable, "-c", READER, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=900)
    out = [line for line in proc.stdout.splitlines() if line.startswith("ROWS")]
    assert proc.returncode == 0 and out, proc.stderr[-3000:]
    return json.loads(out[-1][4:])


def _ends(ids: list[int], eos: int, seq: int) -> list[int]:
    """The document ends of a sample's first seq ids, read off its EOS ids (padded with seq)."""
    ends = [i + 1 for i in range(seq - 1) if ids[i] == eos]
    return ends + [seq] * (PAD_LENGTH - len(ends))


def _stored(shards: Path, manifest: dict) -> list[tuple[tuple, tuple]]:
    import mindspore.dataset as ds

    rows = []
    for entry in manifest["files"]:
        data = ds.MindDataset([str(shards / entry["path"])], columns_list=["input_ids", "actual_seq_len"], shuffle=False)
        for ids, asl in data.create_tuple_iterator(output_numpy=True, num_epochs=1):
            assert ids.dtype == asl.dtype == np.int32 and asl.shape == (PAD_LENGTH,)
            rows.append((tuple(ids.tolist()), tuple(asl.tolist())))
    return rows


def test_every_sample_carries_its_document_ends_and_the_set_verifies(run):
    from corpusmill.stages.shard import verify_shard_dir

    shards, manifest = run["shards"], run["manifest"]
    assert manifest["columns"]["actual_seq_len"]["shape"] == [PAD_LENGTH]
    assert manifest["eod_metadata"] == {"column": "actual_seq_len", "eod_pad_length": PAD_LENGTH,
                                        "eos_id": manifest["tokenizer"]["eos_id"]}
    rows = _stored(shards, manifest)
    assert len(rows) == manifest["total_samples"]  # FileWriter dropped no row
    eos, seq = manifest["tokenizer"]["eos_id"], manifest["seq_length"]
    assert all(list(asl) == _ends(list(ids), eos, seq) for ids, asl in rows)
    assert any(asl[0] < seq for _, asl in rows)  # samples do hold several documents
    problems, _ = verify_shard_dir(str(shards))
    assert problems == []


def test_stock_mindformers_reads_the_mindrecord_column_as_its_own_compressed_mask(run, mindformers_site, tmp_path):  # noqa: F811
    import yaml

    shards, manifest = run["shards"], run["manifest"]
    generated = shards / "mindformers_train_dataset.yaml"
    section = yaml.safe_load(generated.read_text())["train_dataset"]
    assert section["input_columns"][-1] == "actual_seq_len" and section["eod_reset"] is False
    got = _stock([mindformers_site], generated, manifest, tmp_path)
    assert got["columns"] == ["input_ids", "actual_seq_len"]
    assert all(r["actual_seq_len"] == r["theirs"] and r["dtype"] == "int32" for r in got["rows"])
    seen = collections.Counter((tuple(r["input_ids"]), tuple(r["actual_seq_len"])) for r in got["rows"])
    assert seen == collections.Counter(_stored(shards, manifest))


def test_stock_megatron_loader_turns_the_compressed_mask_on_at_the_pairs_document_ends(run, mindformers_site,  # noqa: F811
                                                                                    pybind11_site, tmp_path):
    import yaml

    from corpusmill.stages.megatron import read_documents

    shards, manifest = run["shards"], run["manifest"]
    generated = shards / "mindformers_megatron_train_dataset.yaml"
    config = yaml.safe_load(generated.read_text())["train_dataset"]["data_loader"]["config"]
    assert config["create_compressed_eod_mask"] and config["eod_pad_length"] == PAD_LENGTH
    assert config["reset_position_ids"] and config["reset_attention_mask"]
    got = _stock([mindformers_site, pybind11_site], generated, manifest, tmp_path)
    assert got["columns"][-1] == "actual_seq_len" and got["rows"]
    eos, seq = manifest["tokenizer"]["eos_id"], manifest["seq_length"]
    docs = [d.tolist() for p in manifest["megatron"]["pairs"] for d in read_documents(str(shards / p["prefix"]))]
    starts = {tuple(d[:k]) for d in docs for k in range(1, min(len(d), seq) + 1)}
    starts_seen = 0
    for r in got["rows"]:
        ids, ends = r["input_ids"], r["actual_seq_len"]
        assert ends == _ends(ids, eos, seq) == r["theirs"]
        cuts = [0] + [e for e in ends if e < seq]
        assert all(r["position_ids"][c] == 0 for c in cuts)  # positions restart with each document
        for a, b in zip(cuts[1:], cuts[2:] + [seq]):  # from each end on: the start of a document of the pairs
            assert tuple(ids[a:b]) in starts
            starts_seen += 1
    assert starts_seen > 0


def test_verify_reads_every_actual_seq_len_against_its_ids(run, tmp_path):
    """A shard whose bytes match its manifest but whose compressed mask is wrong (a hand-written set,
    a buggy writer) would train with attention across documents: verify recomputes every sample's."""
    import shutil

    import mindspore.dataset as ds
    from mindspore.mindrecord import FileWriter

    from corpusmill.stages.base import file_sha256
    from corpusmill.stages.shard import verify_shard_dir

    shards = tmp_path / "shards"
    shutil.copytree(run["shards"], shards)
    manifest = json.loads((shards / "manifest.json").read_text())
    entry = manifest["files"][0]
    path = str(shards / entry["path"])
    rows = [(ids, asl) for ids, asl in ds.MindDataset([path], columns_list=["input_ids", "actual_seq_len"],
                                                        shuffle=False).create_tuple_iterator(output_numpy=True, num_epochs=1)]
    seq = manifest["seq_length"]
    wrong = next(i for i, (_, asl) in enumerate(rows) if asl[0] < seq)  # a sample holding several documents
    writer = FileWriter(path, shard_num=1, overwrite=True)
    writer.add_schema({"input_ids": {"type": "int32", "shape": [-1]}, "actual_seq_len": {"type": "int32", "shape": [-1]}},
                      "corpusmill")
    writer.write_raw_data([{"input_ids": ids, "actual_seq_len": np.full_like(asl, seq) if i == wrong else asl}
                           for i, (ids, asl) in enumerate(rows)])  # one document ever: the mask of plain causal LM
    writer.commit()
    entry.update(bytes=os.path.getsize(path) + os.path.getsize(path + ".db"), sha256=file_sha256(path),
                 db_sha256=file_sha256(path + ".db"))
    (shards / "manifest.json").write_text(json.dumps(manifest))
    problems, _ = verify_shard_dir(str(shards))
    assert problems == [f"{entry['path']}: actual_seq_len of 1 samples is not their ids' document ends (first: sample "
                        f"{wrong}): attention would cross documents"]
    manifest["eod_metadata"]["eod_pad_length"] = "16"
    (shards / "manifest.json").write_text(json.dumps(manifest))
    problems, _ = verify_shard_dir(str(shards))
    assert len(problems) == 1 and problems[0].startswith("manifest.json: eod_metadata must be")


def test_too_many_document_ends_for_the_pad_length_are_refused():
    from corpusmill.stages.shard import ShardError, actual_seq_len

    ids = np.array([[5, 2, 5, 2, 5, 2, 7, 2]], np.int32)  # EOS 2 after positions 1, 3, 5; the last one not counted
    assert actual_seq_len(ids, 2, 4).tolist() == [[2, 4, 6, 7]]
    with pytest.raises(ShardError, match="3 document ends, more than shard.eod_pad_length 2"):
        actual_seq_len(ids, 2, 2)


def test_the_trainer_attends_within_each_document():
    """The logits of a document do not change when the document before it in the window does (they do
    without actual_seq_len: the whole window is one causal span)."""
    import mindspore as ms
    from mindspore import Tensor

    from corpusmill.trainer.model import DecoderLM, ModelShape

    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    ms.set_seed(1)
    net = DecoderLM(ModelShape(vocab_size=50, seq_length=24, hidden_size=32, num_layers=2, num_heads=4))
    rng = np.random.default_rng(0)
    first, other, second = rng.integers(3, 50, 9), rng.integers(3, 50, 9), rng.integers(3, 50, 14)
    window = [np.concatenate([f, [2], second, [2]]).astype(np.int32)[None, :] for f in (first, other)]
    asl = Tensor(np.array([[10] + [24] * 7], np.int32))
    with_docs = [net.logits(Tensor(w), asl).asnumpy()[0] for w in window]
    plain = [net.logits(Tensor(w)).asnumpy()[0] for w in window]
    np.testing.assert_allclose(with_docs[0][10:], with_docs[1][10:], atol=1e-5)
    assert not np.allclose(plain[0][10:], plain[1][10:], atol=1e-5)
    np.testing.assert_allclose(with_docs[0][:10], plain[0][:10], atol=1e-5)  # the first document: plain causal


def test_training_on_the_shards_uses_the_column(run, tmp_path):
    from corpusmill.trainer.train import train

    logs: list[str] = []
    tcfg = run["cfg"].train.model_copy(update={"num_parallel_workers": 1, "steps": 3, "batch_size": 4})
    summary = train(str(run["shards"]), str(tmp_path / "train"), tcfg, log=logs.append)
    assert any("attention stays within each packed document" in m for m in logs)
    losses = [json.loads(x)["loss"] for x in (tmp_path / "train" / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 3 and all(np.isfinite(losses)) and summary is not None
