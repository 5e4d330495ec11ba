"""Seeded global shuffle of packed windows into per-rank MindRecord files with equal sample counts.

Every window gets its position in a seeded permutation of all windows; positions past
`ranks * (windows // ranks)` are dropped (counted) so every rank holds exactly the same number of
samples. Dask sorts the windows by position into one partition per output file (`set_index` with
the file boundaries as divisions), and each partition is written by one `FileWriter` and then read
back with `MindDataset`: FileWriter silently drops rows whose dtype or shape does not match, and
MindRecord has no checksums, so rows are counted and hashed on the way in and on the way back.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from .base import file_sha256

SCHEMA_NAME = "corpusmill_pretrain"


class ShardError(RuntimeError):
    """Shards could not be written or did not read back as written."""


@dataclass
class ShardPlan:
    total_windows: int
    ranks: int
    files_per_rank: int
    per_rank: int
    dropped: int
    file_bounds: list[int]  # positions where each file starts, plus the end

    @property
    def used(self) -> int:
        return self.per_rank * self.ranks

    def file_of(self, index: int) -> tuple[int, int]:
        return divmod(index, self.files_per_rank)


def plan_shards(total_windows: int, ranks: int, files_per_rank: int) -> ShardPlan:
    """Equal samples per rank; files of a rank differ by at most one sample."""
    per_rank = total_windows // ranks
    if per_rank < files_per_rank:
        raise ShardError(
            f"only {total_windows} samples for {ranks} ranks x {files_per_rank} files: every file needs at least "
            "one sample (lower shard.ranks / shard.files_per_rank or pack.seq_length, or add data)"
        )
    bounds = []
    for r in range(ranks):
        for f in range(files_per_rank):
            bounds.append(r * per_rank + (f * per_rank) // files_per_rank)
    bounds.append(ranks * per_rank)
    return ShardPlan(total_windows, ranks, files_per_rank, per_rank, total_windows - ranks * per_rank, bounds)


def positions(total_windows: int, seed: int) -> np.ndarray:
    """inv[g] = position of window g in a seeded random permutation of all windows."""
    perm = np.random.default_rng(seed).permutation(total_windows)
    inv = np.empty(total_windows, dtype=np.int64)
    inv[perm] = np.arange(total_windows, dtype=np.int64)
    return inv


def load_windows(path: str, pos: np.ndarray, used: int) -> pd.DataFrame:
    """One packed part with each window's shuffle position; windows past `used` are left out.

    A window travels through Dask's shuffle as one Arrow binary value (its int32 ids, little
    endian): Arrow-native, so no per-row pickling, and a type Dask's P2P shuffle can carry.
    """
    table = pq.read_table(path, columns=["input_ids", "n_pad"])
    keep = pos < used
    table = table.filter(pa.array(keep))
    ids = table.column("input_ids").combine_chunks()
    window = ids.type.list_size
    flat = np.ascontiguousarray(ids.flatten().to_numpy(zero_copy_only=False), dtype="<i4")
    n = len(ids)
    offsets = (np.arange(n + 1, dtype=np.int64) * window * 4).astype(np.int32)
    binary = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(flat)])
    return pd.DataFrame(
        {
            "pos": pos[keep],
            "n_pad": table.column("n_pad").to_numpy(),
            "input_ids": pd.array(binary, dtype=pd.ArrowDtype(pa.binary())),
        }
    )


def windows_of(part: pd.DataFrame, window: int) -> np.ndarray:
    """The (rows, window) int32 matrix of a frame made by `load_windows`."""
    blobs = part["input_ids"].tolist()
    if not blobs:
        return np.empty((0, window), np.int32)
    return np.frombuffer(b"".join(blobs), dtype="<i4").astype(np.int32).reshape(len(blobs), -1)


def file_name(rank: int, file_index: int) -> str:
    """A folder and a distinct file prefix per rank. Names end in `.mindrecord`: stock mindformers
    collects exactly those when `dataset_dir` names a folder (the whole set, or one rank's folder)."""
    return f"rank-{rank:04d}/corpus-r{rank:04d}-f{file_index:02d}.mindrecord"


def _row_digest(row: np.ndarray) -> int:
    return xxhash.xxh3_64_intdigest(np.ascontiguousarray(row, dtype=np.int32).tobytes())


IGNORE_INDEX = -100  # mindformers' label for positions that carry no loss


def write_mindrecord(part: pd.DataFrame, path: str, window: int, write_batch: int, labels: bool = False) -> dict[str, Any]:
    """Write one file's samples (sorted by position) and verify them by reading back. With `labels`,
    a `labels` column repeats the ids with IGNORE_INDEX on each sample's trailing padding."""
    from mindspore.mindrecord import FileWriter  # heavy import, only where files are written

    part = part.sort_index()
    matrix = windows_of(part, window)
    if matrix.shape[1:] != (window,) and len(matrix):
        raise ShardError(f"{path}: samples hold {matrix.shape[1]} ids, expected {window}")
    rows = list(matrix)
    if labels:
        n_pad = part["n_pad"].to_numpy()
        masked = matrix.copy()
        masked[np.arange(window)[None, :] >= (window - n_pad)[:, None]] = IGNORE_INDEX
        label_rows = list(masked)
    digest_in = sum(_row_digest(r) for r in rows) % (1 << 64)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    writer = FileWriter(path, shard_num=1, overwrite=True)
    # The default 32 MiB page and 16 MiB header would make small shards mostly padding. A page must
    # hold whole rows; the header holds one entry per page, so it only shrinks when pages are few.
    page = min(1 << 25, max(1 << 20, 4 * window * write_batch))
    writer.set_page_size(page)
    if len(rows) * window * 4 // page < 1000:
        writer.set_header_size(1 << 20)
    schema = {"input_ids": {"type": "int32", "shape": [-1]}}
    if labels:
        schema["labels"] = {"type": "int32", "shape": [-1]}
    writer.add_schema(schema, SCHEMA_NAME)
    for start in range(0, len(rows), write_batch):
        end = start + write_batch
        if labels:
            batch = [{"input_ids": r, "labels": lab} for r, lab in zip(rows[start:end], label_rows[start:end])]
        else:
            batch = [{"input_ids": r} for r in rows[start:end]]
        writer.write_raw_data(batch)
    writer.commit()
    for f in (path, path + ".db"):
        os.chmod(f, 0o644)  # FileWriter creates 0600 files; training jobs often run as another user
    count, digest_out = read_back(path, window)
    if count != len(rows) or digest_out != digest_in:
        raise ShardError(
            f"{path}: wrote {len(rows)} samples but read back {count}"
            + ("" if count != len(rows) else " with different contents")
        )
    return {
        "samples": len(rows),
        "rows_xxh3_sum": digest_in,
        "tokens": int(len(rows) * window - part["n_pad"].sum()),
        "pad_tokens": int(part["n_pad"].sum()),
        "sha256": file_sha256(path),
        "db_sha256": file_sha256(path + ".db"),
        "bytes": os.path.getsize(path) + os.path.getsize(path + ".db"),
    }


def read_back(path: str, window: int) -> tuple[int, int]:
    """Count and hash every sample of one MindRecord file through `MindDataset`."""
    count, digest, _ = _read_all(path, window)
    return count, digest


def mindformers_snippet(shards_dir: str, sample_length: int, columns: list[str], eod_token_id: Optional[int]) -> str:
    """A `train_dataset` section stock mindformers reads as it is (its MindDataset loader collects
    every `*.mindrecord` under `dataset_dir` and splits them with num_shards = data parallel)."""
    import json

    eod = "" if eod_token_id is None else (
        f"  eod_reset: True  # documents are packed together: reset attention and positions at EOS\n"
        f"  eod_token_id: {eod_token_id}\n")
    return f"""# Paste into a mindformers pretraining YAML. Samples are `input_ids` of {sample_length} int32
# (seq_length + 1). For one rank's files only, point dataset_dir at {shards_dir}/rank-NNNN.
train_dataset: &train_dataset
  data_loader:
    type: MindDataset
    dataset_dir: "{shards_dir}"
    shuffle: True
  input_columns: {json.dumps(columns)}
{eod}  num_parallel_workers: 8
  python_multiprocessing: False
  drop_remainder: True
  batch_size: 1
  repeat: 1
  numa_enable: False
  prefetch_size: 1
train_dataset_task:
  type: CausalLanguageModelDataset
  dataset_config: *train_dataset
"""


def verify_shard_dir(shards_dir: str) -> tuple[list[str], dict]:
    """Check a shard directory against its manifest: files present, sha256 of every `.mindrecord`
    and `.db`, every sample read back through MindDataset (count, length, dtype, content hash),
    ids below the vocabulary size, equal samples per rank. Returns (problems, totals)."""
    import json

    root = os.path.abspath(shards_dir)
    manifest_path = os.path.join(root, "manifest.json")
    if not os.path.isfile(manifest_path):
        return [f"{manifest_path} does not exist: not a finished corpusmill shard directory"], {}
    manifest = json.load(open(manifest_path, encoding="utf-8"))
    window, vocab = manifest["sample_length"], manifest["vocab_size"]
    problems: list[str] = []
    per_rank: dict[int, int] = {}
    max_id = -1
    for entry in manifest["files"]:
        path = os.path.join(root, entry["path"])
        missing = [p for p in (path, path + ".db") if not os.path.isfile(p)]
        if missing:
            problems.append(f"{entry['path']}: missing {', '.join(os.path.basename(m) for m in missing)}")
            continue
        if file_sha256(path) != entry["sha256"]:
            problems.append(f"{entry['path']}: sha256 differs from the manifest (file altered or truncated)")
        if file_sha256(path + ".db") != entry["db_sha256"]:
            problems.append(f"{entry['path']}.db: sha256 differs from the manifest")
        try:
            count, digest, top = _read_all(path, window)
        except Exception as e:  # noqa: BLE001 - a damaged file raises from MindSpore's C++ reader
            problems.append(f"{entry['path']}: cannot be read back: {str(e).splitlines()[0][:200]}")
            continue
        if count != entry["samples"]:
            problems.append(f"{entry['path']}: {count} samples read back, manifest says {entry['samples']}")
        elif "rows_xxh3_sum" in entry and digest != entry["rows_xxh3_sum"]:
            problems.append(f"{entry['path']}: sample contents differ from what was written")
        if top >= vocab:
            problems.append(f"{entry['path']}: token id {top} is not below the vocabulary size {vocab}")
        max_id = max(max_id, top)
        per_rank[entry["rank"]] = per_rank.get(entry["rank"], 0) + count
    expected = manifest["samples_per_rank"]
    for rank in range(manifest["ranks"]):
        if per_rank.get(rank, 0) != expected and not any(p for p in problems if f"rank-{rank:04d}/" in p):
            problems.append(f"rank {rank}: {per_rank.get(rank, 0)} samples, expected {expected}")
    totals = {"files": len(manifest["files"]), "samples": sum(per_rank.values()), "ranks": manifest["ranks"],
              "samples_per_rank": per_rank, "max_token_id": max_id, "vocab_size": vocab}
    return problems, totals


def _read_all(path: str, window: int) -> tuple[int, int, int]:
    import mindspore.dataset as ds

    data = ds.MindDataset([path], columns_list=["input_ids"], shuffle=False, num_parallel_workers=1)
    count, digest, top = 0, 0, -1
    for (batch,) in data.batch(1024).create_tuple_iterator(output_numpy=True, num_epochs=1):
        if batch.ndim != 2 or batch.shape[1] != window or batch.dtype != np.int32:
            raise ShardError(f"samples of shape {batch.shape[1:]} {batch.dtype}, expected ({window},) int32")
        count += len(batch)
        digest = (digest + sum(_row_digest(r) for r in batch)) % (1 << 64)
        top = max(top, int(batch.max()))
    return count, digest, top
