"""Exact deduplication kernels: a 128-bit hash of the normalised text per document, the duplicates
within a frame holding every copy of its hashes, and the removal of given uids from a partition.

Finding duplicates is kept apart from removing them; the step (pipeline/steps/dedup/exact.py) brings
every copy of a hash into one partition with a Dask shuffle and calls `duplicates_in_group` there.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from .base import BatchResult, REMOVED_META, in_sorted, one_array, read_table

HASH_META = pd.DataFrame(
    {
        "uid": pd.Series(dtype="int64"),
        "id": pd.Series(dtype="string[pyarrow]"),
        "source": pd.Series(dtype="string[pyarrow]"),
        "h_hi": pd.Series(dtype="int64"),
        "h_lo": pd.Series(dtype="int64"),
    }
)


def hash_batch(df: pd.DataFrame) -> pd.DataFrame:
    """uid, id, source and the xxh3-128 hash of the text as two int64 columns."""
    digests = [xxhash.xxh3_128_digest(t.encode("utf-8")) for t in df["text"]]
    pairs = np.frombuffer(b"".join(digests), dtype=np.int64).reshape(-1, 2) if digests else np.empty((0, 2), np.int64)
    return pd.DataFrame(
        {
            "uid": df["uid"].to_numpy(dtype="int64"),
            "id": df["id"].astype("string[pyarrow]").to_numpy(),
            "source": df["source"].astype("string[pyarrow]").to_numpy(),
            "h_hi": pairs[:, 0].copy(),
            "h_lo": pairs[:, 1].copy(),
        }
    )


def hash_texts(texts: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(h_hi, h_lo): `hash_batch`'s xxh3-128 of each string of an Arrow array, read straight from
    its UTF-8 buffer (no Python string per document)."""
    texts = pc.fill_null(texts.cast(pa.large_string()), "")
    texts = one_array(texts)
    if len(texts) == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    offsets = np.frombuffer(texts.buffers()[1], dtype=np.int64)[texts.offset:texts.offset + len(texts) + 1]
    data = memoryview(texts.buffers()[2] or b"")
    digest = xxhash.xxh3_128_digest
    pairs = np.frombuffer(b"".join([digest(data[a:b]) for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]),
                          dtype=np.int64).reshape(-1, 2)
    return pairs[:, 0].copy(), pairs[:, 1].copy()


def fold_whitespace(texts: pa.Array) -> pa.Array:
    """`normalize.fold_whitespace_array(texts)`, the same bytes, with its four regex passes done in one
    compiled loop (`sketch.fold_whitespace`; they were a third of the exact hash's normalisation) and
    only Arrow's trim after it."""
    from .shingles import utf8_buffers
    from .sketch import fold_whitespace as fold

    texts = one_array(texts)
    if len(texts) == 0:
        return texts
    data, offsets = utf8_buffers(pc.fill_null(texts, ""))
    out, out_offsets = fold(data, offsets)
    folded = pa.Array.from_buffers(pa.large_string(), len(texts), [None, pa.py_buffer(out_offsets), pa.py_buffer(out)])
    folded = pc.utf8_trim_whitespace(folded)
    if texts.null_count:
        folded = pc.if_else(pc.is_null(texts), pa.scalar(None, pa.large_string()), folded)
    return folded


def hash_file(path: str, normalize: Optional[dict] = None) -> pd.DataFrame:
    """`hash_batch` of one Parquet part of documents, normalising the text first when asked
    (when the stored text is the original, as in a dedup-only job)."""

    table = read_table(path, columns=["uid", "id", "source", "text"])
    if normalize is not None:
        from .normalize import normalize_array

        texts = normalize_array(one_array(table.column("text")), **normalize)
        table = table.set_column(3, "text", texts)
    return hash_batch(table.to_pandas())


def duplicates_in_group(df: pd.DataFrame) -> pd.DataFrame:
    """Within a frame holding *every* document of each hash it contains: the non-lowest uids."""
    if df.empty:
        return REMOVED_META.copy()
    by_hash = df.groupby(["h_hi", "h_lo"], sort=False)["uid"]
    keeper = by_hash.transform("min").to_numpy()
    size = by_hash.transform("count").to_numpy()
    dup = df["uid"].to_numpy() != keeper
    id_of = pd.Series(df["id"].to_numpy(), index=df["uid"].to_numpy())
    out = pd.DataFrame(
        {
            "uid": df["uid"].to_numpy()[dup],
            "id": df["id"].to_numpy()[dup],
            "source": df["source"].to_numpy()[dup],
            "reason": "exact",
            "score": 1.0,
            "threshold": 1.0,
            "duplicate_of": keeper[dup],
            "duplicate_of_id": id_of.loc[keeper[dup]].to_numpy(),
            "cluster_size": size[dup].astype("int64"),
            "cluster_id": keeper[dup],
        }
    )
    return out.astype(REMOVED_META.dtypes.to_dict())


def drop_uids_batch(df: pd.DataFrame, drop_sorted: np.ndarray, reason: Optional[str] = "exact") -> BatchResult:
    """Remove the documents whose uid is in `drop_sorted` (a sorted int64 array); counted under
    `reason` (None: counted by the caller, which knows each document's reason)."""
    drop = in_sorted(df["uid"].to_numpy(dtype="int64"), drop_sorted)
    kept = df[~drop].reset_index(drop=True)
    stats = {"docs_in": len(df), "docs_out": len(kept)}
    if reason is not None:
        stats["removed"] = {reason: int(drop.sum())}
    return BatchResult(kept=kept, stats=stats)


def drop_uids_table(table: pa.Table, drop_sorted: np.ndarray, reason: Optional[str] = "exact",
                    excerpt_chars: Optional[int] = 0) -> Any:
    """`drop_uids_batch` on an Arrow table (the removal pass reads and writes Arrow: no pandas round
    trip of every kept text), with `by_group` of what it keeps counted here. With `excerpt_chars`
    not 0, also {uid: text cut to that many characters (None: whole)} of the removed documents, for
    their audit rows: (BatchResult, texts)."""
    from .base import excerpt
    from .composition import group_counts

    drop = in_sorted(table.column("uid").to_numpy(), drop_sorted)
    kept = table.filter(pa.array(~drop)) if drop.any() else table
    stats: dict = {"docs_in": table.num_rows, "docs_out": kept.num_rows}
    if reason is not None:
        stats["removed"] = {reason: int(drop.sum())}
    if {"source", "language", "text"} <= set(kept.column_names):
        chars = pc.fill_null(pc.utf8_length(kept.column("text")), 0).to_numpy() if kept.num_rows else np.empty(0, np.int64)
        stats["by_group"] = group_counts(kept.column("source").to_pylist(), kept.column("language").to_pylist(), chars=chars)
    result = BatchResult(kept=kept, stats=stats)
    if excerpt_chars == 0:
        return result
    gone = table.filter(pa.array(drop))
    return result, dict(zip(gone.column("uid").to_pylist(), excerpt(gone.column("text").to_pylist(), excerpt_chars)))
