"""Pack tokenized documents (each EOS-terminated) into samples of exactly seq_length + 1 ids.

Modes (`pack.mode`):
- concat: documents joined in uid order and cut into windows; the few tokens left at the end of each
  partition (the tails) are joined in partition order into further windows by `pack_tails`, so only
  the very last incomplete window is dropped or padded, and counted.
- pad: one document per sample, truncated or padded with the pad id (mindformers' SFT convention;
  the shards then carry `labels` with -100 on padding).
- best_fit: documents longer than a window are cut into window-sized pieces first, then the pieces
  are placed by best-fit decreasing bin packing, so far fewer documents are cut than by concat;
  the space left in a window is padded (and masked in `labels`).
Every window records its padding (`n_pad`, always at the end of the window).
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


def pack_batch(tokens: pa.Table, window: int, mode: str = "concat", pad_id: int = 0) -> tuple[BatchResult, np.ndarray]:
    """The windows of this partition, and (concat only) its tail of fewer than `window` ids for `pack_tails`."""
    tokens = tokens.sort_by("uid")
    if mode == "pad":
        return _pad_one_per_sample(tokens, window, pad_id), np.empty(0, np.int32)
    if mode == "best_fit":
        return _best_fit(tokens, window, pad_id), np.empty(0, np.int32)
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


def _docs(tokens: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    flat = tokens.column("input_ids").combine_chunks().flatten().to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
    lengths = tokens.column("n_tokens").to_numpy().astype(np.int64)
    return flat, lengths


def _pad_one_per_sample(tokens: pa.Table, window: int, pad_id: int) -> BatchResult:
    flat, lengths = _docs(tokens)
    n = len(lengths)
    out = np.full((n, window), pad_id, dtype=np.int32)
    starts = np.cumsum(lengths) - lengths
    kept = np.minimum(lengths, window)
    rows = np.repeat(np.arange(n), kept)
    cols = np.arange(int(kept.sum())) - np.repeat(np.cumsum(kept) - kept, kept)
    out[rows, cols] = flat[np.repeat(starts, kept) + cols]
    n_pad = (window - kept).astype(np.int32)
    stats = {
        "docs_in": n, "tokens_in": int(lengths.sum()), "windows": n, "docs_split": 0,
        "docs_truncated": int((lengths > window).sum()), "tokens_dropped": int((lengths - kept).sum()),
        "pad_tokens": int(n_pad.sum()),
    }
    return BatchResult(kept=windows_table(out.reshape(-1), window, n_pad), stats=stats)


def best_fit_bins(sizes: np.ndarray, capacity: int) -> list[list[int]]:
    """Best-fit decreasing: items (largest first) go to the open bin with the least room that fits.
    Returns the item indices per bin. O(n log n) with a sorted list of remaining capacities."""
    import bisect

    order = np.argsort(-sizes, kind="stable")
    rooms: list[tuple[int, int]] = []  # (remaining room, bin index), sorted
    bins: list[list[int]] = []
    for item in order.tolist():
        size = int(sizes[item])
        k = bisect.bisect_left(rooms, (size, -1))
        if k < len(rooms):
            room, b = rooms.pop(k)
            bins[b].append(item)
            if room - size > 0:
                bisect.insort(rooms, (room - size, b))
        else:
            bins.append([item])
            if capacity - size > 0:
                bisect.insort(rooms, (capacity - size, len(bins) - 1))
    return bins


def _best_fit(tokens: pa.Table, window: int, pad_id: int) -> BatchResult:
    flat, lengths = _docs(tokens)
    starts = np.cumsum(lengths) - lengths
    # pieces: every document cut into window-sized pieces (most documents are one piece)
    n_pieces = np.maximum(1, -(-lengths // window))
    doc_of = np.repeat(np.arange(len(lengths)), n_pieces)
    k = np.arange(len(doc_of)) - np.repeat(np.cumsum(n_pieces) - n_pieces, n_pieces)
    p_start = starts[doc_of] + k * window
    p_len = np.minimum(window, lengths[doc_of] - k * window)
    bins = best_fit_bins(p_len, window)
    out = np.full((len(bins), window), pad_id, dtype=np.int32)
    n_pad = np.empty(len(bins), dtype=np.int32)
    for b, items in enumerate(bins):
        pos = 0
        for i in sorted(items, key=lambda i: (doc_of[i], k[i])):  # keep a document's own order
            out[b, pos:pos + p_len[i]] = flat[p_start[i]:p_start[i] + p_len[i]]
            pos += p_len[i]
        n_pad[b] = window - pos
    stats = {
        "docs_in": len(lengths), "tokens_in": int(lengths.sum()), "windows": len(bins),
        "docs_split": int((n_pieces > 1).sum()), "docs_truncated": 0, "tokens_dropped": 0,
        "pad_tokens": int(n_pad.sum()),
    }
    return BatchResult(kept=windows_table(out.reshape(-1), window, n_pad), stats=stats)
