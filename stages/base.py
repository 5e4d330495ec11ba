"""What every kernel shares: the document schema, the removed-row schema, stats that add up, and
atomic Parquet/Arrow I/O.

A kernel (everything in `stages/`) never knows about Dask or about other steps: it works on one
partition (a pandas or Arrow batch, one file) and returns stats; the steps in `pipeline/steps/`
map it over partitions and merge the stats (see docs/architecture.md).
"""
from __future__ import annotations

import hashlib
import json
import os
import secrets
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq


class ConfigError(ValueError):
    """A config problem, with the file and key it concerns (`keys`: the dotted keys at fault, when known).
    Raised by pipeline/ and trainer/ alike, so it lives below both."""

    def __init__(self, message: str, keys: Optional[list[str]] = None):
        super().__init__(message)
        self.keys = list(keys or [])


# The document contract between steps: uid is int64 and unique across a run.
DOC_SCHEMA = pa.schema(
    [
        ("uid", pa.int64()),
        ("id", pa.string()),
        ("text", pa.string()),
        ("source", pa.string()),
        ("meta", pa.string()),  # remaining input fields as JSON, or null
        ("language", pa.string()),  # set by the reader: zh / en / other by script (stages.quality.script_language),
        # or with filter.language.enabled the fastText model's ISO 639-1 code (stages.langid) ...
        ("language_score", pa.float64()),  # ... and its probability (null without the model)
    ]
)

# Columns a document part may carry beyond DOC_SCHEMA: written by the step that makes them, passed on by every
# later document step. quality_bucket: the filter.classifiers bucket of a kept document's score (null: no bucket
# holds it), present only when buckets are configured, so the parts of one run all have it or none has.
OPTIONAL_DOC_FIELDS = (pa.field("quality_bucket", pa.string()),)


def doc_schema(columns: Any) -> pa.Schema:
    """DOC_SCHEMA with the OPTIONAL_DOC_FIELDS among `columns` (a frame's columns), in that order."""
    have = set(columns)
    return pa.schema(list(DOC_SCHEMA) + [f for f in OPTIONAL_DOC_FIELDS if f.name in have])

REMOVED_SCHEMA = pa.schema(
    [
        ("uid", pa.int64()),
        ("id", pa.string()),
        ("source", pa.string()),
        ("reason", pa.string()),
        ("score", pa.float64()),
        ("threshold", pa.float64()),
        ("duplicate_of", pa.int64()),
        ("duplicate_of_id", pa.string()),
        ("cluster_size", pa.int64()),
        ("cluster_id", pa.int64()),
        ("text", pa.string()),  # the removed document's text, or its first N characters (audit_text_chars)
    ]
)

_PANDAS_DTYPE = {pa.int64(): "int64", pa.float64(): "float64", pa.string(): "string[pyarrow]"}
# the same removed rows as an empty pandas frame, for kernels that build them per partition (the
# text column is added afterwards, by the step that reads the texts)
REMOVED_META = pd.DataFrame({f.name: pd.Series(dtype=_PANDAS_DTYPE[f.type]) for f in REMOVED_SCHEMA if f.name != "text"})


def merge_stats(total: dict, part: dict) -> dict:
    """Add `part` into `total`: numbers add, nested dicts merge, anything else keeps the last value."""
    for key, value in part.items():
        if isinstance(value, dict):
            merge_stats(total.setdefault(key, {}), value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            total[key] = total.get(key, 0) + value
        else:
            total[key] = value
    return total


@dataclass
class BatchResult:
    """What a batch stage returns for one partition."""

    kept: pd.DataFrame
    removed: Optional[pd.DataFrame] = None
    stats: dict[str, Any] = field(default_factory=dict)


def one_array(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A column as one Array. A single chunk is returned as it is: `combine_chunks` copies even then,
    which cost the shard step a 64 MB copy of every packed part for every chunk of every file."""
    if not isinstance(values, pa.ChunkedArray):
        return values
    return values.chunk(0) if values.num_chunks == 1 else values.combine_chunks()


def in_sorted(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """Whether each of `values` is in `sorted_set` (sorted, e.g. uids to drop): one binary search per
    value instead of a hash set of every uid."""
    if not len(sorted_set) or not len(values):
        return np.zeros(len(values), dtype=bool)
    return sorted_set[np.searchsorted(sorted_set, values).clip(max=len(sorted_set) - 1)] == values


def excerpt(texts: Any, chars: Optional[int]) -> list:
    """Texts cut to their first `chars` characters (None: whole; 0: none), for audit rows."""
    if chars == 0:
        return [None] * len(texts)
    return [None if t is None or t is pd.NA else (t if chars is None else t[:chars]) for t in list(texts)]


def removed_frame(rows: pd.DataFrame, reason: Any, score: Any = None, threshold: Any = None,
                  text_chars: Optional[int] = None, **extra: Any) -> pd.DataFrame:
    """Build a removed-documents frame in REMOVED_SCHEMA from the rows of a document frame, with
    the removed text (its first `text_chars` characters) so an audit needs no join by id."""
    out = pd.DataFrame(
        {
            "uid": rows["uid"].to_numpy(dtype="int64"),
            "id": rows["id"].to_numpy(dtype=object),
            "source": rows["source"].to_numpy(dtype=object) if "source" in rows else None,
        }
    )
    out["reason"] = reason if not isinstance(reason, pd.Series) else reason.to_numpy()
    for name, value in (("score", score), ("threshold", threshold)):
        out[name] = value.to_numpy() if isinstance(value, pd.Series) else value
    for name in ("duplicate_of", "duplicate_of_id", "cluster_size", "cluster_id"):
        out[name] = extra.get(name)
    out["text"] = excerpt(rows["text"].tolist(), text_chars) if "text" in rows else None
    return out


@contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """A binary file at a fresh temporary name beside `path`, renamed over it when the block succeeds
    and removed when it fails (a full disk leaves no half-written or zero-byte file behind). The
    temporary file is created exclusively with O_NOFOLLOW and written through that descriptor only,
    and the rename replaces a symlink at `path` instead of writing through it: a link planted in a
    run directory can never redirect a write."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        with suppress(OSError):
            os.unlink(tmp)
        raise


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data` all at once (see `atomic_file`)."""
    with atomic_file(path) as f:
        f.write(data)


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: Path, payload: Any, indent: Optional[int] = 2) -> None:
    write_text_atomic(path, json.dumps(payload, indent=indent, ensure_ascii=False, default=str))


def write_table_atomic(table: pa.Table, path: Path) -> None:
    """Write to a temporary name then rename (see `atomic_file`), so a killed run never leaves half a
    part. `.arrow` names get an uncompressed Arrow IPC file (memory-mapped by readers that pick rows
    out of it), anything else Parquet with zstd."""
    path = Path(path)
    with atomic_file(path) as f:
        if path.suffix == ".arrow":
            with pa.ipc.new_file(f, table.schema) as writer:
                writer.write_table(table)
        else:
            # row groups of about 4 MB, so a task that needs a slice of a part reads only its groups
            rows = max(1024, int(table.num_rows * ROW_GROUP_BYTES / max(1, table.nbytes)))
            pq.write_table(table, f, compression="zstd", row_group_size=rows)


ROW_GROUP_BYTES = 4 << 20


def read_rows(path: str | Path, start: int, stop: int, columns: Optional[list[str]] = None) -> pa.Table:
    """Rows [start, stop) of a Parquet part, reading only the row groups that hold them."""
    pf = pq.ParquetFile(path)
    meta = pf.metadata
    bounds = [0]
    for g in range(meta.num_row_groups):
        bounds.append(bounds[-1] + meta.row_group(g).num_rows)
    groups = [g for g in range(meta.num_row_groups) if bounds[g] < stop and bounds[g + 1] > start]
    if not groups:
        return pf.schema_arrow.empty_table().select(columns) if columns else pf.schema_arrow.empty_table()
    table = pf.read_row_groups(groups, columns=columns)
    return table.slice(start - bounds[groups[0]], stop - start)


def read_table(path: Any, columns: Optional[list[str]] = None, **kwargs: Any) -> pa.Table:
    """A part (or a list of parts, or a folder of them) written by `write_table_atomic`; Arrow IPC files
    are memory-mapped, not copied. Never with partition discovery: a run directory under `year=2024/`
    is a folder name, not a Parquet partition key (pyarrow's default would add a `year` column)."""
    if isinstance(path, (str, Path)) and str(path).endswith(".arrow"):
        table = pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()
        return table.select(columns) if columns else table
    return pq.read_table(path, columns=columns, partitioning=None, **kwargs)


# ---- files: one sha256 for parts, shards, tokenizers and models; paths that must stay inside a folder

def file_sha256(path: str) -> str:
    """sha256 of a file, read in 4 MiB blocks into one reused buffer."""
    h = hashlib.sha256()
    buf = bytearray(4 << 20)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(view[:n])
    return h.hexdigest()


def inside(root: str, rel: str) -> tuple[str, Optional[str]]:
    """(absolute path, why it is not usable) for a manifest path: it must resolve, through any
    symlinks, to a place inside `root`."""
    path = os.path.join(root, rel)
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if os.path.commonpath([real_root, real]) != real_root:
        return path, f"resolves to {real}, outside the shard folder (a symlink out?)"
    return path, None
