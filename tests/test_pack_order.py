"""The seeded document order before packing, end to end: real Dask, real MindRecord, windows decoded
with the tokenizer stored beside the shards. A corpus of three sources, each in its own file (so in
uid order every source is one run), must give windows that mix sources; in corpus order
(`pack.shuffle_documents: false`) windows hold runs of one source."""
from __future__ import annotations

import hashlib
import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from corpusmill.pipeline.config import parse_config
from corpusmill.pipeline.runner import Pipeline
from corpusmill.stages.base import read_table
from tests.conftest import LENGTH_ONLY_FILTER, write_jsonl

HAN = [chr(0x4E00 + 7 * i) for i in range(150)]
LETTERS = {"kernel": "abcdefghi", "law": "nopqrstuv"}


def _word(rng: random.Random, letters: str) -> str:
    return "".join(rng.choice(letters) for _ in range(rng.randint(2, 6)))


def build_sources(root: Path) -> None:
    """Three sources with disjoint alphabets: poems (Han characters), kernel (letters a-i), law (n-v)."""
    rng = random.Random(11)
    write_jsonl(root / "poems.jsonl", [{"text": "".join(rng.choice(HAN) for _ in range(rng.randint(20, 50))) + "。"}
                                       for _ in range(120)])
    for name, letters in LETTERS.items():
        write_jsonl(root / f"{name}.jsonl", [{"text": " ".join(_word(rng, letters) for _ in range(rng.randint(8, 20)))}
                                             for _ in range(120)])


def source_of(text: str) -> str | None:
    """The source a decoded piece of a document comes from, by the alphabet most of its characters use."""
    counts = {"poems": sum(c in HAN for c in text),
              **{name: sum(c in letters for c in text) for name, letters in LETTERS.items()}}
    best = max(counts, key=counts.get)
    return best if counts[best] else None


def window_sources(shards: Path, n: int = 10_000) -> list[list[str]]:
    """The sources of the documents in each of the first `n` samples of the shards, in window order:
    each sample read with MindDataset, cut at the EOS id and every piece decoded with the manifest's
    tokenizer."""
    import mindspore.dataset as ds

    from corpusmill.stages.tokenize import load_tokenizer

    manifest = json.loads((shards / "manifest.json").read_text())
    sp = load_tokenizer(str(shards / manifest["tokenizer"]["path"]))
    eos = manifest["tokenizer"]["eos_id"]
    out = []
    for entry in manifest["files"]:
        data = ds.MindDataset([str(shards / entry["path"])], columns_list=["input_ids"], shuffle=False)
        for (ids,) in data.create_tuple_iterator(output_numpy=True, num_epochs=1):
            cuts = np.flatnonzero(ids == eos) + 1
            pieces = [sp.decode(p.tolist()) for p in np.split(ids, cuts) if len(p)]
            out.append([s for s in map(source_of, pieces) if s])
            if len(out) >= n:
                return out
    return out


def _config(corpus: Path, **over) -> dict:
    cfg = {
        "input": {"paths": [str(corpus)], "part_size_mb": 0.004, "block_size_mb": 0.008},  # many parts
        "filter": {"length": {"min_chars": 5}, **LENGTH_ONLY_FILTER},
        "dedup": {"minhash": {"enabled": False}},
        "tokenizer": {"train": {"vocab_size": 600}},
        "pack": {"seq_length": 96},
        "shard": {"ranks": 1, "files_per_rank": 1},
        "train": {"enabled": False},
    }
    for key, value in over.items():
        cfg[key] = {**cfg.get(key, {}), **value}
    return parse_config(cfg)


def _windows(out: Path) -> list[tuple]:
    return [tuple(w) for p in sorted((out / "06-pack").glob("part-*.arrow"))
            for w in read_table(p).column("input_ids").to_pylist()]


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("part-*.arrow"))}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, dask_client):
    root = tmp_path_factory.mktemp("order")
    build_sources(root / "corpus")
    shuffled = Pipeline(_config(root / "corpus"), root / "shuffled", client=dask_client, log=lambda m: None).run()
    model = root / "tokenizer.model"  # the same tokenizer for every other run, so only packing differs
    shutil.copyfile(root / "shuffled" / "05-tokenize" / "tokenizer.model", model)
    corpus_order = Pipeline(_config(root / "corpus", tokenizer={"model": str(model)}, pack={"shuffle_documents": False}),
                            root / "corpus_order", client=dask_client, log=lambda m: None).run()
    return {"root": root, "model": model, "shuffled": shuffled, "corpus_order": corpus_order}


def test_windows_mix_sources_when_shuffled_and_hold_runs_of_one_in_corpus_order(runs):
    mixed = window_sources(runs["root"] / "shuffled" / "shards")
    runs_of_one = window_sources(runs["root"] / "corpus_order" / "shards")
    assert len(mixed) > 40 and len(runs_of_one) > 40
    per_window_mixed = [len(set(s)) for s in mixed]
    per_window_corpus = [len(set(s)) for s in runs_of_one]
    # about 4 documents a window: in corpus order only the few windows at a source's (or a part's) end mix
    assert np.mean([k >= 2 for k in per_window_mixed]) > 0.8, per_window_mixed
    assert np.mean([k >= 2 for k in per_window_corpus]) < 0.2, per_window_corpus
    assert np.mean(per_window_mixed) > 2.0 > 1.2 > np.mean(per_window_corpus)


def test_shuffled_ledger_counts_every_token(runs):
    led, stages = runs["shuffled"].ledger, runs["shuffled"].stages
    p = led["packing"]
    window = 97
    assert p["mode"] == "concat" and p["tokens_in"] == led["tokens"] == p["tokens_kept"] + p["tokens_dropped"]
    assert p["windows"] == p["tokens_in"] // window and p["tokens_dropped"] == p["tokens_in"] % window
    assert stages["pack"]["order_seed"] == 0 and stages["pack"]["docs_in"] == led["kept"]
    assert len(_windows(runs["root"] / "shuffled")) == p["windows"]


def test_same_windows_and_shards_whatever_the_partitioning(runs, dask_client):
    root = runs["root"]
    outs = []
    for name, part_mb in (("small_parts", 0.004), ("one_part", 64)):
        cfg = _config(root / "corpus", tokenizer={"model": str(runs["model"])},
                      input={"part_size_mb": part_mb, "block_size_mb": part_mb * 2})
        Pipeline(cfg, root / name, client=dask_client, log=lambda m: None).run()
        outs.append(root / name)
    n_parts = [len(list((o / "05-tokenize").glob("part-*.arrow"))) for o in outs]
    assert n_parts[0] > 4 and n_parts[1] == 1
    assert _windows(outs[0]) == _windows(outs[1]) and _digests(outs[0] / "06-pack") == _digests(outs[1] / "06-pack")
    assert _windows(outs[0]) == _windows(root / "shuffled")  # the given copy of the trained model: same ids
    shards = [json.loads((o / "shards" / "manifest.json").read_text())["files"] for o in outs]
    assert [f["sha256"] for f in shards[0]] == [f["sha256"] for f in shards[1]]


def test_another_seed_another_order_and_corpus_order_ignores_the_seed(runs, dask_client):
    root = runs["root"]
    cfg = _config(root / "corpus", tokenizer={"model": str(runs["model"])}, pack={"seed": 1})
    Pipeline(cfg, root / "seed1", client=dask_client, log=lambda m: None).run()
    other, reference = _windows(root / "seed1"), _windows(root / "shuffled")
    assert len(other) == len(reference) and other != reference
    # the same documents: every id count differs at most by what the two dropped remainders hold
    count = lambda ws: np.bincount(np.asarray(ws).reshape(-1), minlength=600)  # noqa: E731
    assert np.abs(count(other) - count(reference)).sum() <= 2 * 96
    cfg = _config(root / "corpus", tokenizer={"model": str(runs["model"])}, pack={"shuffle_documents": False, "seed": 9})
    Pipeline(cfg, root / "corpus_seed9", client=dask_client, log=lambda m: None).run()
    assert _digests(root / "corpus_seed9" / "06-pack") == _digests(root / "corpus_order" / "06-pack")


def test_pack_rerun_after_a_crash_is_byte_identical(runs, dask_client):
    root = runs["root"]
    out = root / "resume"
    cfg = _config(root / "corpus", tokenizer={"model": str(runs["model"])})
    Pipeline(cfg, out, client=dask_client, log=lambda m: None).run()
    before, shards_before = _digests(out / "06-pack"), (out / "shards" / "manifest.json").read_text()
    # a crash inside pack: its marker never written, a part half there; the shards never made
    (out / "06-pack" / "_DONE.json").unlink()
    first = sorted((out / "06-pack").glob("part-*.arrow"))[0]
    first.write_bytes(first.read_bytes()[:100])
    shutil.rmtree(out / "shards")
    again = Pipeline(cfg, out, client=dask_client, log=lambda m: None, resume=True).run()
    assert "pack" not in again.skipped and "tokenize" in again.skipped
    assert _digests(out / "06-pack") == before
    strip = lambda m: {k: v for k, v in json.loads(m).items() if k != "created_utc"}  # noqa: E731
    assert strip((out / "shards" / "manifest.json").read_text()) == strip(shards_before)


def _inspect(shards: Path, n: int) -> str:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "corpusmill.pipeline.cli", "shards", "inspect", str(shards), "--decode", str(n)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return proc.stdout


def _samples(shards: Path, columns: list[str], n: int) -> list:
    import mindspore.dataset as ds

    manifest = json.loads((shards / "manifest.json").read_text())
    data = ds.MindDataset([str(shards / manifest["files"][0]["path"])], columns_list=columns, shuffle=False)
    return [row for _, row in zip(range(n), data.create_tuple_iterator(output_numpy=True, num_epochs=1))]


def test_inspect_decode_marks_every_document_end_of_a_window(runs):
    shards = runs["root"] / "shuffled" / "shards"
    text = _inspect(shards, 3)
    blocks = text.split("--- sample ")[1:]
    eos = json.loads((shards / "manifest.json").read_text())["tokenizer"]["eos_id"]
    assert len(blocks) == 3
    for block, (ids,) in zip(blocks, _samples(shards, ["input_ids"], 3)):
        ends = int((ids == eos).sum())
        assert ends >= 2 and block.count("⟨/s⟩") == ends and f"{ends} document ends, 0 padding" in block
        # the text between the markers is each document's decoded text: several sources in one window
        assert len({source_of(piece) for piece in block.split("\n", 1)[1].split("⟨/s⟩") if source_of(piece)}) >= 2


def test_inspect_decode_shows_padding_runs_of_padded_modes(runs, dask_client):
    root = runs["root"]
    cfg = _config(root / "corpus", tokenizer={"model": str(runs["model"])}, pack={"mode": "pad", "seq_length": 40})
    Pipeline(cfg, root / "padded", client=dask_client, log=lambda m: None).run()
    shards = root / "padded" / "shards"
    text = _inspect(shards, 12)
    rows = _samples(shards, ["input_ids", "labels"], 12)
    padded = [int((labels == -100).sum()) for _, labels in rows]
    assert any(padded) and not all(padded)  # short documents padded, long ones cut
    for block, n in zip(text.split("--- sample ")[1:], padded):
        assert (f"⟨pad×{n}⟩" in block) == (n > 0) and f"{n} padding" in block
        assert block.count("⟨/s⟩") == (1 if n else 0)  # one document a sample; a cut one loses its EOS


def test_trailing_padding_and_decode_window_with_a_real_tokenizer(runs):
    from corpusmill.pipeline.cli import decode_window, trailing_padding
    from corpusmill.stages.tokenize import load_tokenizer

    sp = load_tokenizer(str(runs["model"]))
    bos, eos, pad = sp.bos_id(), sp.eos_id(), sp.pad_id()
    ids = np.array([bos, *sp.encode("abc def"), eos, bos, *sp.encode("nop"), eos, pad, pad, pad], np.int32)
    assert trailing_padding(ids, None, pad, eos, bos) == 3
    labels = np.where(np.arange(len(ids)) >= len(ids) - 3, -100, ids)
    assert trailing_padding(ids, labels, pad, eos, bos) == 3
    assert decode_window(sp, ids, bos, eos, 3) == "⟨s⟩abc def⟨/s⟩\n⟨s⟩nop⟨/s⟩\n⟨pad×3⟩"
    # a pad id that is not after a document's end is text (an unknown piece), not padding
    assert trailing_padding(np.array([*sp.encode("abc"), pad], np.int32), None, pad, eos, bos) == 0
    assert trailing_padding(ids, None, eos, eos, bos) == 0
