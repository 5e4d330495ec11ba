"""Megatron-Core indexed datasets (`PREFIX.bin` + `PREFIX.idx`), the format mindformers'
`BlendedMegatronDatasetDataLoader` and Megatron's `GPTDataset` read, written from the layout of
Megatron-Core's `megatron/core/datasets/indexed_dataset.py`:

- `.bin`: every document's ids end to end, in the index's dtype, nothing else;
- `.idx`: the header `b"MMIDIDX\\x00\\x00"`, version 1 (`<Q`), the dtype code (`<B`: 1 uint8, 2 int8,
  3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16), the sequence count (`<Q`) and the
  document count (`<Q`, the length of the document index: documents + 1), then the sequence lengths
  (int32), the byte offset of each sequence in `.bin` (int64) and the document index (int64,
  0 then the end of each document in sequences).

corpusmill writes one sequence per document (a whole tokenized document, EOS last), so the
document index is 0..n. The dtype is the smallest Megatron picks for the vocabulary: uint16 below
65500 ids, else int32. The loader packs and blends at train time, so the documents are written
whole (no windows, no padding). Documents are in the pack step's seeded order (the same selection:
validation documents held out, the mixture's copies) and go either into one pair per rank with
about equal tokens (`shard.megatron_split: rank`) or into one pair per source
(`shard.megatron_split: source`, named by `source_prefix`), so a training config can weight them.
"""
from __future__ import annotations

import hashlib
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np

from . import pack
from .composition import UNKNOWN

INDEX_HEADER = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
DTYPE_CODES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16}
_CODE_OF = {np.dtype(v).name: k for k, v in DTYPE_CODES.items()}
_FIXED = len(INDEX_HEADER) + 8 + 1 + 8 + 8  # header, version, dtype code, sequence count, document count
WRITE_CHUNK_TOKENS = 1 << 24  # ids gathered per write (64 MiB of int32): a rank's pair is written in pieces


def best_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits below 65500 (Megatron's own cut), else int32."""
    return np.dtype(np.uint16 if vocab_size < 65500 else np.int32)


def rank_bounds(lengths: np.ndarray, ranks: int) -> list[tuple[int, int]]:
    """[start, end) of each rank's documents in order, cut after the document whose end first reaches
    k/ranks of the total tokens, so every rank's pair holds about the same number of tokens."""
    ends = np.cumsum(lengths, dtype=np.int64)
    total = int(ends[-1]) if len(ends) else 0
    cuts = [0]
    for k in range(1, ranks):
        cut = int(np.searchsorted(ends, -(-total * k // ranks), side="left")) + 1 if total else 0
        cuts.append(min(max(cut, cuts[-1]), len(lengths)))
    cuts.append(len(lengths))
    return list(zip(cuts[:-1], cuts[1:]))


def source_prefix(source: str) -> str:
    """A file-name-safe, collision-proof prefix for one source's pair: `source-SLUG-HASH`, SLUG the
    name lowercased with everything but a-z, 0-9, '.', '_' and '-' made '_' (at most 40 characters,
    no leading dot), HASH the first 10 hex digits of the sha256 of the exact name. Two names that
    slug alike ("web/en", "Web_en") still differ by their hash, also on a case-insensitive file
    system; the same name always gives the same prefix."""
    slug = re.sub(r"[^a-z0-9._-]", "_", source.lower())[:40].lstrip(".") or "_"
    return f"source-{slug}-{hashlib.sha256(source.encode('utf-8', 'surrogatepass')).hexdigest()[:10]}"


def source_groups(sources: list[str], code: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """(source, positions in order) for each source present, sorted by name: `code` holds each
    ordered document's index into `sources` (-1: unknown), so a pair keeps the seeded order."""
    names = sorted(set(sources) | ({UNKNOWN} if (code < 0).any() else set()))
    where = np.array([names.index(s) for s in sources] + [names.index(UNKNOWN) if UNKNOWN in names else 0], np.int64)
    of = where[np.where(code < 0, len(sources), code)] if len(code) else np.empty(0, np.int64)
    return [(name, np.flatnonzero(of == i)) for i, name in enumerate(names) if (of == i).any()]


def index_bytes(lengths: np.ndarray, dtype: np.dtype) -> bytes:
    """The `.idx` content for one sequence per document of these lengths."""
    n = len(lengths)
    lengths32 = np.asarray(lengths, dtype=np.int32)
    pointers = np.zeros(n, dtype=np.int64)
    if n:
        np.cumsum(lengths32[:-1].astype(np.int64) * dtype.itemsize, out=pointers[1:])
    head = INDEX_HEADER + struct.pack("<Q", INDEX_VERSION) + struct.pack("<B", _CODE_OF[dtype.name])
    head += struct.pack("<Q", n) + struct.pack("<Q", n + 1)
    return (head + lengths32.astype("<i4").tobytes() + pointers.astype("<i8").tobytes()
            + np.arange(n + 1, dtype="<i8").tobytes())


@dataclass
class PairPlan:
    """One pair's documents: rows `row` of tokenized parts `part`, with their lengths, in order."""

    part: np.ndarray
    row: np.ndarray
    length: np.ndarray


def write_pair(parts: list[str], plan: PairPlan, prefix: str, vocab_size: int, eos_id: int) -> dict[str, Any]:
    """Write `prefix.bin` and `prefix.idx` (streamed: WRITE_CHUNK_TOKENS ids at a time, gathered out
    of the memory-mapped tokenized parts). Returns what the manifest lists for the pair. Refuses an
    id outside the vocabulary or a document that does not end with `eos_id` (when >= 0)."""
    from .base import atomic_file

    dtype = best_dtype(vocab_size)
    h = hashlib.sha256()
    low, top, tokens, not_eos = 0, -1, 0, 0
    lengths = np.asarray(plan.length, dtype=np.int64)
    with atomic_file(Path(prefix + ".bin")) as out:
        start = 0
        ends = np.cumsum(lengths)
        while start < len(lengths):
            stop = int(np.searchsorted(ends, (ends[start - 1] if start else 0) + WRITE_CHUNK_TOKENS, side="right"))
            stop = max(stop, start + 1)
            group = pack.Group(plan.part[start:stop], plan.row[start:stop], np.zeros(stop - start, np.int64),
                               lengths[start:stop], lengths[start:stop])
            flat = pack.gather_ids(parts, group)
            if flat.size:
                low, top = min(low, int(flat.min())), max(top, int(flat.max()))
                if eos_id >= 0:
                    last = np.cumsum(lengths[start:stop])[lengths[start:stop] > 0] - 1
                    not_eos += int((flat[last] != eos_id).sum())
            data = flat.astype(dtype.newbyteorder("<"), copy=False).tobytes()
            h.update(data)
            out.write(data)
            tokens += int(flat.size)
            start = stop
    if low < 0 or top >= vocab_size:
        raise ValueError(f"{prefix}.bin: ids {low}..{top} are not all within the vocabulary (0..{vocab_size - 1})")
    if not_eos:
        raise ValueError(f"{prefix}.bin: {not_eos} documents do not end with EOS (id {eos_id})")
    idx = index_bytes(lengths, dtype)
    with atomic_file(Path(prefix + ".idx")) as out:
        out.write(idx)
    return {"documents": int(len(lengths)), "tokens": tokens, "dtype": dtype.name, "max_id": top,
            "bin_sha256": h.hexdigest(), "idx_sha256": hashlib.sha256(idx).hexdigest(),
            "bin_bytes": tokens * dtype.itemsize, "idx_bytes": len(idx)}


@dataclass
class Index:
    """A parsed `.idx`."""

    dtype: np.dtype
    lengths: np.ndarray  # int32 per sequence
    pointers: np.ndarray  # int64 byte offset per sequence
    documents: np.ndarray  # int64, documents + 1 entries


def read_index(path: str) -> Index:
    """Parse an `.idx` file as Megatron-Core's reader does; ValueError naming what is wrong."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(_FIXED)
        if len(head) < _FIXED or head[: len(INDEX_HEADER)] != INDEX_HEADER:
            raise ValueError("not a Megatron index: the header is not MMIDIDX")
        pos = len(INDEX_HEADER)
        (version,) = struct.unpack_from("<Q", head, pos)
        (code,) = struct.unpack_from("<B", head, pos + 8)
        n_seq, n_doc = struct.unpack_from("<QQ", head, pos + 9)
        if version != INDEX_VERSION:
            raise ValueError(f"index version {version}, expected {INDEX_VERSION}")
        if code not in DTYPE_CODES:
            raise ValueError(f"dtype code {code} is not one of Megatron's")
        want = _FIXED + n_seq * 4 + n_seq * 8 + n_doc * 8
        if want != size:
            raise ValueError(f"{n_seq} sequences and {n_doc} document entries need {want:,} bytes, the file has {size:,}")
        lengths = np.frombuffer(f.read(n_seq * 4), dtype="<i4")
        pointers = np.frombuffer(f.read(n_seq * 8), dtype="<i8")
        documents = np.frombuffer(f.read(n_doc * 8), dtype="<i8")
    return Index(np.dtype(DTYPE_CODES[code]), lengths, pointers, documents)


def read_documents(prefix: str) -> Iterator[np.ndarray]:
    """Every document's ids (int32) of a pair, read through its index from the memory-mapped `.bin`:
    document d is sequences documents[d]..documents[d + 1] (Megatron's own reading of the format)."""
    idx = read_index(prefix + ".idx")
    data = np.memmap(prefix + ".bin", dtype=idx.dtype.newbyteorder("<"), mode="r") if os.path.getsize(prefix + ".bin") else np.empty(0, idx.dtype)
    for d in range(len(idx.documents) - 1):
        pieces = [data[idx.pointers[s] // idx.dtype.itemsize: idx.pointers[s] // idx.dtype.itemsize + idx.lengths[s]]
                  for s in range(int(idx.documents[d]), int(idx.documents[d + 1]))]
        yield (np.concatenate(pieces) if pieces else np.empty(0, idx.dtype)).astype(np.int32)


def pair_problems(root: str, entry: dict[str, Any], vocab_size: int, eos_id: int) -> list[str]:
    """One manifest pair against its files: sizes and sha256 first (nothing is parsed otherwise),
    then the index (header, version, dtype, counts against the file size), the pointers against the
    lengths and the `.bin` size, the document index, and every id below the vocabulary, every
    document ending with EOS."""
    from .base import file_sha256, inside

    rel = entry["prefix"]
    problems = []
    paths = {}
    for ext in (".bin", ".idx"):
        path, why = inside(root, rel + ext)
        if why:
            return [f"{rel}{ext}: {why}"]
        if not os.path.isfile(path):
            problems.append(f"{rel}{ext}: missing")
        paths[ext] = path
    if problems:
        return problems
    for ext, key in ((".bin", "bin"), (".idx", "idx")):
        size = os.path.getsize(paths[ext])
        if size != entry[f"{key}_bytes"]:
            problems.append(f"{rel}{ext}: {size:,} bytes, the manifest says {entry[f'{key}_bytes']:,} (file altered or "
                            "truncated)")
        elif file_sha256(paths[ext]) != entry[f"{key}_sha256"]:
            problems.append(f"{rel}{ext}: sha256 differs from the manifest (file altered)")
    if problems:
        return problems
    try:
        idx = read_index(paths[".idx"])
    except (OSError, ValueError, struct.error) as e:
        return [f"{rel}.idx: {e}"]
    n = len(idx.lengths)
    if idx.dtype.name != entry["dtype"]:
        problems.append(f"{rel}.idx: dtype {idx.dtype.name}, the manifest says {entry['dtype']}")
    if n != entry["documents"] or len(idx.documents) != n + 1:
        problems.append(f"{rel}.idx: {n} sequences and {len(idx.documents) - 1} documents, the manifest says "
                        f"{entry['documents']} documents")
    if (idx.lengths < 0).any():
        problems.append(f"{rel}.idx: negative sequence lengths")
        return problems
    expect = np.zeros(n, dtype=np.int64)
    if n:
        np.cumsum(idx.lengths[:-1].astype(np.int64) * idx.dtype.itemsize, out=expect[1:])
    if not np.array_equal(expect, idx.pointers):
        problems.append(f"{rel}.idx: sequence pointers do not follow the lengths")
    total = int(idx.lengths.astype(np.int64).sum())
    if total != entry["tokens"] or total * idx.dtype.itemsize != os.path.getsize(paths[".bin"]):
        problems.append(f"{rel}: the index counts {total:,} ids ({total * idx.dtype.itemsize:,} bytes); the .bin has "
                        f"{os.path.getsize(paths['.bin']):,} bytes, the manifest says {entry['tokens']:,} tokens")
    if len(idx.documents) and (idx.documents[0] != 0 or idx.documents[-1] != n or (np.diff(idx.documents) < 0).any()):
        problems.append(f"{rel}.idx: the document index does not run from 0 to {n} in order")
    if problems:
        return problems
    data = np.memmap(paths[".bin"], dtype=idx.dtype.newbyteorder("<"), mode="r") if total else np.empty(0, idx.dtype)
    top, low = -1, 0
    for start in range(0, total, WRITE_CHUNK_TOKENS):
        chunk = np.asarray(data[start: start + WRITE_CHUNK_TOKENS])
        top, low = max(top, int(chunk.max())), min(low, int(chunk.min()))
    if top >= vocab_size or low < 0:
        problems.append(f"{rel}.bin: token ids {low}..{top} are not all within the vocabulary (0..{vocab_size - 1})")
    if eos_id >= 0 and n:
        ends = (idx.pointers // idx.dtype.itemsize + idx.lengths - 1)[idx.lengths > 0]
        bad = int((np.asarray(data[ends]) != eos_id).sum()) if total else 0
        if bad:
            problems.append(f"{rel}.bin: {bad} documents do not end with EOS (id {eos_id})")
    return problems


def most_document_ends(lengths: np.ndarray, seq_length: int) -> int:
    """An upper bound on the EOS ids a GPTDataset sample of seq_length ids can hold, whatever order it
    draws the documents in: the end of one document cut at its start, then the shortest documents
    one after another (what mindformers' eod_pad_length must cover, or its loader stops)."""
    ends = np.cumsum(np.sort(np.asarray(lengths, np.int64)))
    return 1 + int(np.searchsorted(ends, seq_length, side="right"))


def data_path(shards_dir: str, pairs: list[dict[str, Any]]) -> list[str]:
    """mindformers' / Megatron's `data_path` blend: weight, absolute prefix, weight, prefix, ... The
    weight is each pair's share of the tokens. The pairs hold the documents the pack step would pack
    (the mixture's copies included, its left-out documents not), so per source these shares are the
    delivered mixture (`mix.sources`), and without a mixture the corpus's own proportions."""
    total = sum(p["tokens"] for p in pairs) or 1
    out: list[str] = []
    for p in pairs:
        out += [f"{p['tokens'] / total:.6g}", os.path.join(shards_dir, p["prefix"])]
    return out


def mindformers_snippet(shards_dir: str, pairs: list[dict[str, Any]], seq_length: int, eod_id: int, pad_id: int,
                        seed: int, workers: Optional[int] = None, mixed: bool = False,
                        eod_pad_length: Optional[int] = None) -> str:
    """A `train_dataset` section for mindformers' BlendedMegatronDatasetDataLoader (GPTDataset): the
    data_path blend, seq_length, EOD handling and the tokenizer's eod/pad ids. `sizes` is one epoch
    of seq_length samples; raise it for more. With `eod_pad_length` (shard.eod_metadata), the loader
    returns mindformers' compressed EOD mask (create_compressed_eod_mask: actual_seq_len, computed by
    GPTDataset from the EOS ids in the pairs) instead of a seq_length x seq_length attention mask."""
    import json

    workers = workers or max(1, min(8, os.cpu_count() or 1))
    # GPTDataset sets every id equal to `pad` to 0 and out of the loss (its padding of a short last
    # sample): a pad that is also the EOS (byte-level BPE without a pad token, Qwen's <|endoftext|>)
    # would erase every document boundary, so it is -1 then (no id), as mindformers' own default
    loader_pad = pad_id if pad_id != eod_id else -1
    tokens = sum(p["tokens"] for p in pairs)
    samples = max(1, (tokens - 1) // seq_length)
    weighted = data_path(shards_dir, pairs)
    blend = "\n".join(f"        - {json.dumps(w)}\n        - {json.dumps(p)}" + (f"  # source {json.dumps(x['source'])}"
                                                                            if x.get("source") is not None else "")
                      for w, p, x in zip(weighted[0::2], weighted[1::2], pairs))
    why = ("the mixture mix.sources delivered, as the pairs hold its copies and the weights are their token shares" if mixed
           else "each pair's share of the tokens")
    compressed = eod_pad_length is not None
    columns = json.dumps(["input_ids", "labels", "loss_mask", "position_ids",
                          "actual_seq_len" if compressed else "attention_mask"])
    mask = (f"create_attention_mask: False\n      create_compressed_eod_mask: True  # actual_seq_len per sample; set "
            f"model_config.use_eod_attn_mask_compression: True\n      eod_pad_length: {eod_pad_length}" if compressed
            else "create_attention_mask: True")
    return f"""# Paste into a mindformers (mcore) pretraining YAML. GPTDataset packs the documents of the
# Megatron .bin/.idx pairs below into samples of seq_length at train time and blends the pairs by
# weight: {why}. Documents end with EOS (id {eod_id}); reset_position_ids and
# reset_attention_mask keep packed documents apart; set eod_mask_loss: True to leave EOS out of the loss.
train_dataset: &train_dataset
  data_loader:
    type: BlendedMegatronDatasetDataLoader
    datasets_type: "GPTDataset"
    sizes:
      - {samples}  # training samples: about one epoch of {tokens:,} tokens
      - 0
      - 0
    config:
      seed: {seed % (1 << 32)}
      seq_length: {seq_length}
      split: "1, 0, 0"
      num_dataset_builder_threads: 1
      eod_mask_loss: False
      reset_position_ids: True
      reset_attention_mask: True
      {mask}
      eod: {eod_id}
      pad: {loader_pad}{"  # the tokenizer's pad is its EOS: -1 keeps the EOS tokens" if loader_pad != pad_id else ""}
      data_path:
{blend}
  input_columns: {columns}
  construct_args_key: {columns}
  num_parallel_workers: {workers}
  python_multiprocessing: False
  drop_remainder: True
  numa_enable: False
  prefetch_size: 1
  seed: {seed % (1 << 32)}
train_dataset_task:
  type: CausalLanguageModelDataset
  dataset_config: *train_dataset
"""
