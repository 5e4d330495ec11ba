"""Concatenate tokenized documents (each EOS-terminated) into windows of exactly seq_length + 1 ids.

Each partition packs its own documents in uid order; the few tokens left at the end of each
partition (the tails) are joined in partition order into further windows by `pack_tails`, so only
the very last incomplete window is dropped or padded, and counted.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from .base import BatchResult

def window_schema(window: int) -> pa.Schema:
    return pa.schema([("input_ids", pa.list_(pa.int32(), window)), ("n_pad", pa.int32())])


def windows_table(flat: np.ndarray, window: int, n_pad: np.ndarray | None = None) -> pa.Table:
    """A table of fixed-size windows from a flat int32 array whose length is a multiple of `window`."""
    n = len(flat) // window
    ids = pa.FixedSizeListArray.from_arrays(pa.array(flat, type=pa.int32()), window)
    pads = pa.array(np.zeros(n, np.int32) if n_pad is None else n_pad.astype(np.int32))
    return pa.Table.from_arrays([ids, pads], schema=window_schema(window))


def pack_batch(tokens: pa.Table, window: int) -> tuple[BatchResult, np.ndarray]:
    """Full windows of this partition, and its tail (fewer than `window` ids) for `pack_tails`."""
    tokens = tokens.sort_by("uid")
    lists = tokens.column("input_ids").combine_chunks()
    flat = lists.flatten().to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
    n_full = len(flat) // window
    cut = n_full * window
    lengths = tokens.column("n_tokens").to_numpy().astype(np.int64)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    # a document is split when a window boundary (or this partition's cut) falls strictly inside it
    inside = (starts < cut) & ((ends > cut) | (starts // window != (ends - 1) // window))
    stats = {
        "docs_in": tokens.num_rows,
        "tokens_in": int(len(flat)),
        "windows": n_full,
        "docs_split": int(inside.sum()),
    }
    return BatchResult(kept=windows_table(flat[:cut], window), stats=stats), flat[cut:].copy()


def pack_tails(tails: list[np.ndarray], window: int, remainder: str, pad_id: int) -> tuple[pa.Table, dict]:
    """Join partition tails (in partition order) into windows; drop or pad the last incomplete one."""
    flat = np.concatenate(tails).astype(np.int32) if tails else np.empty(0, np.int32)
    n_full = len(flat) // window
    rest = flat[n_full * window :]
    stats = {"tail_tokens": int(len(flat)), "windows": n_full, "tokens_dropped": 0, "pad_tokens": 0}
    n_pad = np.zeros(n_full, np.int32)
    body = flat[: n_full * window]
    if len(rest) and remainder == "pad":
        pad = window - len(rest)
        body = np.concatenate([body, rest, np.full(pad, pad_id, np.int32)])
        n_pad = np.append(n_pad, pad).astype(np.int32)
        stats["windows"] += 1
        stats["pad_tokens"] = int(pad)
    else:
        stats["tokens_dropped"] = int(len(rest))
    return windows_table(body, window, n_pad), stats
