"""Megatron-Core .bin/.idx pairs: read back with a reader written here from the format (not the
writer's own parser), through a mindformers-style data_path list, damage caught; one small run end
to end with a trained tokenizer.json and shard.format both."""
from __future__ import annotations

import json
import random
import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import yaml

from corpusmill.stages import megatron, pack
from corpusmill.stages.base import write_table_atomic
from corpusmill.stages.tokenize import TOKEN_SCHEMA
from tests.conftest import LENGTH_ONLY_FILTER, write_jsonl

CODES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16}


def read_megatron(prefix: str) -> tuple[int, list[np.ndarray]]:
    """Megatron-Core's IndexedDataset, as its indexed_dataset.py lays the files out: (dtype code,
    every document's ids)."""
    raw = Path(prefix + ".idx").read_bytes()
    assert raw[:9] == b"MMIDIDX\x00\x00"
    version, code, n_seq, n_doc = struct.unpack_from("<QBQQ", raw, 9)
    assert version == 1
    off = 9 + 8 + 1 + 8 + 8
    lengths = np.frombuffer(raw, "<i4", n_seq, off)
    pointers = np.frombuffer(raw, "<i8", n_seq, off + 4 * n_seq)
    doc_idx = np.frombuffer(raw, "<i8", n_doc, off + 12 * n_seq)
    assert off + 12 * n_seq + 8 * n_doc == len(raw)
    dtype = np.dtype(CODES[code]).newbyteorder("<")
    data = Path(prefix + ".bin").read_bytes()
    seqs = [np.frombuffer(data, dtype, int(n), int(p)).astype(np.int64) for n, p in zip(lengths, pointers)]
    docs = [np.concatenate(seqs[doc_idx[d]:doc_idx[d + 1]]) for d in range(n_doc - 1)]
    return code, docs


def _parts(tmp_path: Path, vocab: int, eos: int) -> tuple[list[str], list[list[int]]]:
    rng = np.random.default_rng(0)
    docs = [[*rng.integers(3, vocab, size=int(n)).tolist(), eos] for n in rng.integers(0, 50, size=90)]
    parts = []
    for i, chunk in enumerate((docs[:40], docs[40:])):
        uid0 = 0 if i == 0 else 40
        table = pa.table({"uid": np.arange(uid0, uid0 + len(chunk), dtype=np.int64),
                          "n_tokens": np.array([len(d) for d in chunk], np.int32),
                          "input_ids": pa.array(chunk, pa.list_(pa.int32()))}, schema=TOKEN_SCHEMA)
        parts.append(str(tmp_path / f"part-{i}.arrow"))
        write_table_atomic(table, Path(parts[-1]))
    return parts, docs


def _write(tmp_path: Path, vocab: int, ranks: int = 3, eos: int = 2) -> tuple[list[dict], list[list[int]], pack.DocumentOrder]:
    parts, docs = _parts(tmp_path, vocab, eos)
    order = pack.document_order([pack.document_index(p, 5) for p in parts])
    pairs = []
    for r, (a, b) in enumerate(megatron.rank_bounds(order.length, ranks)):
        prefix = f"megatron/corpus-r{r:04d}"
        (tmp_path / "megatron").mkdir(exist_ok=True)
        w = megatron.write_pair(parts, megatron.PairPlan(order.part[a:b], order.row[a:b], order.length[a:b]),
                                str(tmp_path / prefix), vocab, eos)
        pairs.append({"prefix": prefix, "rank": r, **w})
    return pairs, docs, order


def test_pairs_hold_every_document_in_order_in_megatron_layout(tmp_path):
    pairs, docs, order = _write(tmp_path, vocab=1000)
    expected = [docs[(40 if p else 0) + r] for p, r in zip(order.part.tolist(), order.row.tolist())]
    got = []
    for pair in pairs:
        code, pair_docs = read_megatron(str(tmp_path / pair["prefix"]))
        assert code == 8 and pair["dtype"] == "uint16"  # the smallest dtype for a vocabulary under 65500
        assert pair["documents"] == len(pair_docs) and pair["tokens"] == sum(map(len, pair_docs))
        got += [d.tolist() for d in pair_docs]
    assert got == expected and len(got) == 90
    tokens = [p["tokens"] for p in pairs]
    assert max(tokens) - min(tokens) <= 50  # ranks cut at about equal tokens
    assert all(megatron.pair_problems(str(tmp_path), p, 1000, 2) == [] for p in pairs)


def test_large_vocabulary_uses_int32(tmp_path):
    pairs, docs, _ = _write(tmp_path, vocab=70000, ranks=1)
    code, got = read_megatron(str(tmp_path / pairs[0]["prefix"]))
    assert code == 4 and sorted(map(len, got)) == sorted(map(len, docs))


def test_data_path_list_reads_like_mindformers(tmp_path):
    pairs, docs, _ = _write(tmp_path, vocab=1000)
    section = yaml.safe_load(megatron.mindformers_snippet(str(tmp_path), pairs, 16, 2, 0, seed=3))
    loader = section["train_dataset"]["data_loader"]
    cfg = loader["config"]
    assert loader["type"] == "BlendedMegatronDatasetDataLoader" and loader["datasets_type"] == "GPTDataset"
    assert (cfg["seq_length"], cfg["eod"], cfg["pad"]) == (16, 2, 0)
    assert {"eod_mask_loss", "reset_position_ids", "reset_attention_mask"} <= set(cfg)
    # a pad that is the EOS would be zeroed and masked by GPTDataset (every document boundary lost): -1
    same = yaml.safe_load(megatron.mindformers_snippet(str(tmp_path), pairs, 16, 2, 2, seed=3))
    assert same["train_dataset"]["data_loader"]["config"]["pad"] == -1
    blend = cfg["data_path"]  # weight, prefix, weight, prefix ... as Megatron's get_blend_from_list splits it
    weights, prefixes = [float(w) for w in blend[0::2]], blend[1::2]
    assert abs(sum(weights) - 1) < 1e-5 and len(prefixes) == 3
    read = [d for p in prefixes for d in read_megatron(p)[1]]
    assert sum(map(len, read)) == sum(map(len, docs)) and loader["sizes"][0] == (sum(map(len, docs)) - 1) // 16


def test_damage_to_bin_and_idx_is_caught(tmp_path):
    pairs, _, _ = _write(tmp_path, vocab=1000, ranks=2)
    root = str(tmp_path)
    bin_path = tmp_path / (pairs[0]["prefix"] + ".bin")
    data = bytearray(bin_path.read_bytes())
    data[10] ^= 0xFF
    bin_path.write_bytes(bytes(data))
    assert any("sha256 differs" in p for p in megatron.pair_problems(root, pairs[0], 1000, 2))
    # an index rewritten with a wrong length and its checksum updated: the structure checks catch it
    idx_path = tmp_path / (pairs[1]["prefix"] + ".idx")
    raw = bytearray(idx_path.read_bytes())
    struct.pack_into("<i", raw, 34, struct.unpack_from("<i", raw, 34)[0] + 1)
    idx_path.write_bytes(bytes(raw))
    import hashlib

    forged = {**pairs[1], "idx_sha256": hashlib.sha256(bytes(raw)).hexdigest()}
    problems = megatron.pair_problems(root, forged, 1000, 2)
    assert any("pointers do not follow the lengths" in p for p in problems), problems
    idx_path.write_bytes(bytes(raw[:-8]))  # truncated
    assert any("bytes, the manifest says" in p for p in megatron.pair_problems(root, pairs[1], 1000, 2))


def test_end_to_end_hf_tokenizer_and_both_formats(tmp_path, dask_client):
    """format both with a validation split: the training pairs and the validation set's pair hold
    every tokenized document once between them, the validation set has both formats too."""
    from corpusmill.pipeline.config import parse_config
    from corpusmill.pipeline.runner import Pipeline
    from corpusmill.stages import manifest as mf
    from corpusmill.stages.base import read_table
    from corpusmill.stages.shard import verify_shard_dir

    rng = random.Random(1)
    words = "data model token corpus shard rank train window 数据 清洗 模型 训练".split()
    write_jsonl(tmp_path / "in" / "a.jsonl", [{"id": i, "text": " ".join(rng.choice(words) for _ in range(rng.randint(5, 40)))}
                                              for i in range(80)])
    cfg = parse_config({"input": {"paths": [str(tmp_path / "in")], "part_size_mb": 0.002},
                        "filter": {"length": {"min_chars": 5}, **LENGTH_ONLY_FILTER},
                        "dedup": {"exact": False, "minhash": {"enabled": False}},
                        "tokenizer": {"kind": "hf", "train": {"vocab_size": 400}}, "pack": {"seq_length": 16},
                        "split": {"validation": 0.25}, "shard": {"ranks": 2, "format": "both"}})
    Pipeline(cfg, tmp_path / "out", client=dask_client, log=lambda m: None).run()
    shards = tmp_path / "out" / "shards"
    manifest = json.loads((shards / "manifest.json").read_text())
    # every check but reading the MindRecord rows back through MindSpore (a child process; tests/test_shard* do it)
    assert mf.check(str(shards), manifest) == [] and manifest["total_samples"] > 0
    assert manifest["formats"] == ["mindrecord", "megatron"] and len(manifest["megatron"]["pairs"]) == 2
    assert manifest["tokenizer"]["kind"] == "hf" and (shards / "tokenizer.json").is_file()
    tokenized = {}
    for part in sorted((tmp_path / "out").glob("*-tokenize/part-*.arrow")):
        t = read_table(str(part))
        tokenized.update(zip(t.column("uid").to_pylist(), t.column("input_ids").to_pylist()))
    section = yaml.safe_load((shards / "mindformers_megatron_train_dataset.yaml").read_text())
    read = [d.tolist() for p in section["train_dataset"]["data_loader"]["config"]["data_path"][1::2]
            for d in read_megatron(p)[1]]
    held_out = tmp_path / "out" / "shards-validation"
    val = json.loads((held_out / "manifest.json").read_text())
    assert mf.check(str(held_out), val) == [] and val["formats"] == ["mindrecord", "megatron"]
    assert [p["prefix"] for p in val["megatron"]["pairs"]] == ["megatron/corpus-r0000"]
    held = [d.tolist() for d in read_megatron(str(held_out / "megatron" / "corpus-r0000"))[1]]
    assert 0 < len(held) < 40 and not {tuple(d) for d in held} & {tuple(d) for d in read}
    assert sorted(read + held) == sorted(tokenized.values()) and len(read + held) == 80
    eos = manifest["tokenizer"]["eos_id"]
    assert all(d[-1] == eos for d in read)
    bin_path = shards / "megatron" / "corpus-r0001.bin"
    bin_path.write_bytes(bin_path.read_bytes()[:-2])
    problems, _ = verify_shard_dir(str(shards))  # stops before MindSpore: the damage is found first
    assert any("megatron/corpus-r0001.bin" in p for p in problems), problems


def test_run_summary_of_megatron_only_shards(capsys, tmp_path):
    from types import SimpleNamespace

    from corpusmill.pipeline.cli import _print_run_summary

    ledger = {"input": 3, "kept": 3, "filtered": 0, "duplicates": 0, "quarantined": 0, "stages": {}, "tokens": 30,
              "samples": 0, "samples_per_rank": 0, "samples_dropped_for_equal_ranks": 0,
              "megatron": {"pairs": 2, "documents": 3, "tokens": 30}}
    _print_run_summary(SimpleNamespace(ledger=ledger, train=None), tmp_path)
    out = capsys.readouterr()
    assert "tokens: 30 (whole documents, not packed)" in out.out + out.err
    assert "megatron: 3 documents, 30 tokens in 2 .bin/.idx pair(s)" in out.out + out.err


def test_source_prefixes_are_file_safe_distinct_and_stable():
    names = ["web/en", "Web_en", "web_en", "../../etc", "", "数据", ".hidden", "x" * 300, "(none)"]
    prefixes = [megatron.source_prefix(n) for n in names]
    assert len(set(prefixes)) == len(names) and len({p.lower() for p in prefixes}) == len(names)
    import re

    assert all(re.fullmatch(r"source-[a-z0-9_-][a-z0-9._-]{0,39}-[0-9a-f]{10}", p) for p in prefixes), prefixes
    assert megatron.source_prefix("web/en") == prefixes[0]  # the same name, the same files, run after run
    # documents keep their order inside each source; an unknown group (-1) becomes its own source
    groups = megatron.source_groups(["b", "a", "b"], np.array([0, 1, -1, 2, 1, 0], np.int32))
    assert [(s, pos.tolist()) for s, pos in groups] == [("(none)", [2]), ("a", [1, 4]), ("b", [0, 3, 5])]


def test_pairs_per_source_hold_each_sources_documents_split_and_mixed(tmp_path, dask_client):
    """megatron_split source with a validation split and a mixture (books twice): each source's pair
    holds exactly that source's training documents (books' twice), the validation set's pairs the
    held-out ones; the data_path blend, read as mindformers' get_blend_from_list reads it, weighs
    each source by its delivered tokens; both sets pass the manifest checks."""
    from corpusmill.pipeline.config import parse_config
    from corpusmill.pipeline.runner import Pipeline
    from corpusmill.stages import manifest as mf
    from corpusmill.stages.base import read_table
    from corpusmill.stages.mixing import validation_mask

    rng = random.Random(2)
    words = "data model token corpus shard rank train window 数据 清洗 模型 训练".split()
    sources = ["web/en", "Web_en", "books"]  # the first two slug alike: their hashes keep the files apart
    write_jsonl(tmp_path / "in" / "a.jsonl", [{"id": i, "source": sources[i % 3],
                                               "text": " ".join(rng.choice(words) for _ in range(rng.randint(5, 40)))}
                                              for i in range(90)])
    cfg = parse_config({"input": {"paths": [str(tmp_path / "in")], "part_size_mb": 0.002},
                        "filter": {"length": {"min_chars": 5}, **LENGTH_ONLY_FILTER},
                        "dedup": {"exact": False, "minhash": {"enabled": False}},
                        "tokenizer": {"kind": "hf", "train": {"vocab_size": 400}}, "pack": {"seq_length": 16},
                        "split": {"validation": 0.2, "seed": 4},
                        "mix": {"sources": [{"match": {"source": "books"}, "epochs": 2}]},
                        "shard": {"format": "megatron", "megatron_split": "source"}})
    Pipeline(cfg, tmp_path / "out", client=dask_client, log=lambda m: None).run()
    train: dict = {s: [] for s in sources}
    held: dict = {s: [] for s in sources}
    for part in sorted((tmp_path / "out").glob("*-tokenize/part-*.arrow")):
        t = read_table(str(part))
        out = validation_mask(t.column("doc_hash").to_numpy().astype(np.uint64), 0.2, 4)
        for src, ids, h in zip(t.column("source").to_pylist(), t.column("input_ids").to_pylist(), out.tolist()):
            (held if h else train)[src] += [ids] * (1 if h else 2 if src == "books" else 1)
    assert all(train.values()) and sum(map(len, held.values())) > 0
    for folder, want in (("shards", train), ("shards-validation", held)):
        shards = tmp_path / "out" / folder
        manifest = json.loads((shards / "manifest.json").read_text())
        assert mf.check(str(shards), manifest) == [] and manifest["megatron"]["split"] == "source"
        pairs = manifest["megatron"]["pairs"]
        assert {p["source"] for p in pairs} == {s for s in sources if want[s]} and all(p["rank"] is None for p in pairs)
        for p in pairs:
            assert p["prefix"] == "megatron/" + megatron.source_prefix(p["source"])
            got = [d.tolist() for d in read_megatron(str(shards / p["prefix"]))[1]]
            assert sorted(got) == sorted(want[p["source"]]), p["source"]
            assert p["documents"] == len(got) and p["tokens"] == sum(map(len, got))
    section = yaml.safe_load((tmp_path / "out" / "shards" / "mindformers_megatron_train_dataset.yaml").read_text())
    blend = section["train_dataset"]["data_loader"]["config"]["data_path"]
    weights, prefixes = [float(w) for w in blend[0::2]], blend[1::2]  # get_blend_from_list: weight, prefix, ...
    total = sum(len(d) for docs in train.values() for d in docs)
    by_prefix = {str(tmp_path / "out" / "shards" / "megatron" / megatron.source_prefix(s)): s for s in sources}
    for w, prefix in zip(weights, prefixes):
        share = sum(map(len, train[by_prefix[prefix]])) / total  # books' share counts both of its copies
        assert abs(w - share) < 1e-5, (by_prefix[prefix], w, share)
    assert len(prefixes) == 3
    ledger = json.loads((tmp_path / "out" / "ledger.json").read_text())  # no pack step: the shard step's split and mix
    n_held = sum(map(len, held.values()))
    assert ledger["validation"]["documents"] == ledger["validation"]["megatron_documents"] == n_held
    line = next(x for x in (tmp_path / "out" / "report.md").read_text().splitlines() if "held out for validation" in x)
    assert f"{n_held:,} whole documents in {ledger['validation']['megatron_pairs']} Megatron pair(s)" in line
    assert "0 samples" not in line  # no windows are packed for Megatron-only shards
    assert ledger["mix"]["copies"] == ledger["megatron"]["documents"] == sum(map(len, train.values()))
