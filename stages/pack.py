"""Pack tokenized documents (each EOS-terminated) into samples of exactly seq_length + 1 ids.

Document order (`pack.shuffle_documents`): by default the documents of the whole corpus are packed in
a seeded random order (`order_keys`: a seeded hash of each uid), so a window mixes sources, as
Megatron and datatrove do; the shard step's shuffle moves only whole windows. The order depends on
the uids and the seed alone, never on partitioning: `document_index` reads every tokenized part's
uids and lengths, `plan_groups` cuts the ordered stream into groups of about a fixed number of
tokens, and `pack_group` gathers one group's documents out of the memory-mapped parts and packs it.
With `shuffle_documents: false` each partition is packed in uid order by `pack_batch` (corpus order:
runs of one source).

Modes (`pack.mode`):
- concat: documents joined and cut into windows. Shuffled: one stream over the corpus, cut at
  multiples of the window (only its last incomplete window is dropped or padded). In corpus order:
  per partition, and the few tokens left at the end of each partition (the tails) are joined in
  partition order into further windows by `pack_tails`, so only the very last incomplete window is
  dropped or padded, and counted.
- pad: one document per sample, truncated or padded with the pad id (mindformers' SFT convention;
  the shards then carry `labels` with -100 on padding).
- best_fit: documents longer than a window are cut into window-sized pieces first, then the pieces
  are placed by best-fit decreasing bin packing, so far fewer documents are cut than by concat;
  the space left in a window is padded (and masked in `labels`).
Every window records its padding (`n_pad`, always at the end of the window).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pyarrow as pa

from .base import BatchResult, one_array, read_table, write_table_atomic
from .composition import UNKNOWN, window_groups


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
    lists = one_array(tokens.column("input_ids"))
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
    flat = one_array(tokens.column("input_ids")).flatten().to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
    lengths = tokens.column("n_tokens").to_numpy().astype(np.int64)
    return flat, lengths


def _pad_one_per_sample(tokens: pa.Table, window: int, pad_id: int) -> BatchResult:
    return _pad_windows(*_docs(tokens), window, pad_id)


def _pad_windows(flat: np.ndarray, lengths: np.ndarray, window: int, pad_id: int) -> BatchResult:
    """One document per window (documents given as their ids one after another and their lengths)."""
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
    result = _best_fit_windows(*_docs(tokens), window, pad_id)
    result.stats.pop("pieces")
    return result


def _best_fit_windows(flat: np.ndarray, lengths: np.ndarray, window: int, pad_id: int) -> BatchResult:
    """Best-fit-decreasing windows of these documents (ids one after another, and their lengths)."""
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
    bin_of = np.empty(len(p_len), dtype=np.int64)
    for b, items in enumerate(bins):
        pos = 0
        for i in sorted(items, key=lambda i: (doc_of[i], k[i])):  # keep a document's own order
            out[b, pos:pos + p_len[i]] = flat[p_start[i]:p_start[i] + p_len[i]]
            pos += p_len[i]
            bin_of[i] = b
        n_pad[b] = window - pos
    stats = {
        "docs_in": len(lengths), "tokens_in": int(lengths.sum()), "windows": len(bins),
        "docs_split": int((n_pieces > 1).sum()), "docs_truncated": 0, "tokens_dropped": 0,
        "pad_tokens": int(n_pad.sum()),
        "pieces": (bin_of, doc_of, p_len),  # which window holds each piece of which document (composition)
    }
    return BatchResult(kept=windows_table(out.reshape(-1), window, n_pad), stats=stats)


# ---- the seeded document order across the corpus ----------------------------------------------

ORDER_SALT = b"corpusmill.pack.order:"  # the order is not the input sample's (a hash of the bare uid)
GATHER_IDS = 1 << 22  # ids placed per vectorised copy in `gather_ids` (bounds its index arrays to ~100 MB)


def order_keys(uids: np.ndarray, seed: int) -> np.ndarray:
    """A seeded 64-bit hash (xxh3) of each uid: documents are packed in increasing key order, which
    depends on the uid and the seed alone, so neither partitioning nor workers change it."""
    import xxhash

    seed &= (1 << 64) - 1
    return np.fromiter((xxhash.xxh3_64_intdigest(ORDER_SALT + u.to_bytes(8, "little", signed=True), seed)
                        for u in np.asarray(uids, np.int64).tolist()), dtype=np.uint64, count=len(uids))


def document_index(path: str, seed: int) -> dict[str, Any]:
    """uid, n_tokens and order key of every document of one tokenized part (its ids are not read);
    with the part's `source` and `language`, also `groups` (its distinct (source, language) pairs)
    and `gcode` (each document's index into them), and `doc_hash` (the text's hash) when present."""
    names = read_table(path).column_names
    wanted = ["uid", "n_tokens"] + [c for c in ("source", "language", "doc_hash") if c in names]
    table = read_table(path, columns=wanted)
    uids = table.column("uid").to_numpy().astype(np.int64, copy=False)
    out: dict[str, Any] = {"uid": uids, "n_tokens": table.column("n_tokens").to_numpy().astype(np.int64),
                           "key": order_keys(uids, seed)}
    if "source" in names and "language" in names:
        src = table.column("source").to_pylist()
        lang = table.column("language").to_pylist()
        pairs = [(s if s is not None else UNKNOWN, g if g is not None else UNKNOWN) for s, g in zip(src, lang)]
        distinct = sorted(set(pairs))
        where = {p: i for i, p in enumerate(distinct)}
        out["groups"] = distinct
        out["gcode"] = np.fromiter((where[p] for p in pairs), dtype=np.int32, count=len(pairs))
    if "doc_hash" in names:
        out["doc_hash"] = table.column("doc_hash").to_numpy().astype(np.uint64, copy=False)
    return out


def global_codes(index: list[dict[str, Any]]) -> tuple[list[tuple[str, str]], list[np.ndarray]]:
    """One code per (source, language) over all parts: the sorted pairs, and each part's documents' codes
    (all -1 for a part without the columns)."""
    pairs = sorted({p for x in index for p in x.get("groups", [])})
    where = {p: i for i, p in enumerate(pairs)}
    codes = []
    for x in index:
        if "groups" in x:
            remap = np.asarray([where[p] for p in x["groups"]], dtype=np.int32)
            codes.append(remap[x["gcode"]] if len(x["gcode"]) else np.empty(0, np.int32))
        else:
            codes.append(np.full(len(x["uid"]), -1, np.int32))
    return pairs, codes


@dataclass
class DocumentOrder:
    """Every document of the corpus in pack order: its part, its row in that part, its length."""

    part: np.ndarray
    row: np.ndarray
    length: np.ndarray
    code: Optional[np.ndarray] = None  # each document's (source, language) group (`global_codes`), -1: unknown


def subset(entry: dict[str, Any], mask: np.ndarray) -> dict[str, Any]:
    """A part's `document_index` for the documents where `mask` holds, remembering their rows in the part."""
    rows = entry.get("row", np.arange(len(entry["uid"]), dtype=np.int64))
    out = {k: (v[mask] if isinstance(v, np.ndarray) else v) for k, v in entry.items()}
    out["row"] = rows[mask]
    return out


def with_copies(entry: dict[str, Any], copies: np.ndarray) -> dict[str, Any]:
    """A part's `document_index` with each document `copies[i]` times (0: left out). A repeated copy
    gets its own order key (a hash of the key and the copy's number), so its copies land apart."""
    rows = entry.get("row", np.arange(len(entry["uid"]), dtype=np.int64))
    copies = np.asarray(copies, np.int64)
    out = {k: (np.repeat(v, copies) if isinstance(v, np.ndarray) else v) for k, v in entry.items()}
    out["row"] = np.repeat(rows, copies)
    nth = np.arange(int(copies.sum()), dtype=np.int64) - np.repeat(np.cumsum(copies) - copies, copies)
    key = out["key"].copy()
    again = nth > 0
    if again.any():
        from .mixing import mix64

        with np.errstate(over="ignore"):
            key[again] = mix64(key[again] ^ (nth[again].astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)))
    out["key"] = key
    return out


def document_order(index: list[dict[str, Any]], codes: Optional[list[np.ndarray]] = None) -> DocumentOrder:
    """The documents of all parts (`document_index` per part, in part order, or a `subset` of it)
    sorted by (key, uid)."""
    sizes = [len(x["uid"]) for x in index]
    part = np.repeat(np.arange(len(index), dtype=np.int32), sizes)
    row = (np.concatenate([x.get("row", np.arange(n, dtype=np.int64)) for x, n in zip(index, sizes)]) if index
           else np.empty(0, np.int64))
    cat = lambda k, dt: np.concatenate([x[k] for x in index]) if index else np.empty(0, dt)  # noqa: E731
    order = np.lexsort((cat("uid", np.int64), cat("key", np.uint64)))
    code = np.concatenate(codes)[order] if codes is not None and index else None
    return DocumentOrder(part[order], row[order], cat("n_tokens", np.int64)[order], code)


@dataclass
class Group:
    """One pack task: segments of documents in pack order. Segment i is `count[i]` ids of row `row[i]`
    of part `part[i]`, from its `offset[i]`-th id; `length[i]` is that document's whole length."""

    part: np.ndarray
    row: np.ndarray
    offset: np.ndarray
    count: np.ndarray
    length: np.ndarray
    code: Optional[np.ndarray] = None  # each segment's (source, language) group, when known

    @property
    def ids(self) -> int:
        return int(self.count.sum())


def plan_groups(order: DocumentOrder, window: int, mode: str, group_tokens: int) -> list[Group]:
    """Cut the ordered documents into pack tasks of about `group_tokens` ids, from their lengths alone
    (so the groups, and the windows, are the same however the corpus was partitioned).

    concat: the stream of all ids cut at multiples of the window, `group_tokens // window` windows a
    group (a document crossing a group boundary is split there; only the last group can end with an
    incomplete window). pad: `group_tokens // window` documents a group, each cut to the window.
    best_fit: a document belongs to the group in which its first id falls."""
    lengths = order.length
    ends = np.cumsum(lengths)
    starts = ends - lengths
    total = int(ends[-1]) if len(ends) else 0
    groups = []
    if mode == "concat":
        per_group = max(1, group_tokens // window) * window
        for t0 in range(0, total, per_group):
            t1 = min(total, t0 + per_group)
            d0, d1 = int(np.searchsorted(ends, t0, "right")), int(np.searchsorted(starts, t1, "left"))
            s, e = starts[d0:d1], ends[d0:d1]
            first, last = np.maximum(s, t0), np.minimum(e, t1)
            groups.append(Group(order.part[d0:d1], order.row[d0:d1], first - s, last - first, lengths[d0:d1],
                                _slice(order.code, d0, d1)))
        return groups
    if mode == "pad":
        bounds = list(range(0, len(lengths), max(1, group_tokens // window))) + [len(lengths)]
    else:
        first_of = np.flatnonzero(np.diff(starts // max(1, group_tokens), prepend=-1))
        bounds = first_of.tolist() + [len(lengths)]
    for d0, d1 in zip(bounds[:-1], bounds[1:]):
        length = lengths[d0:d1]
        count = np.minimum(length, window) if mode == "pad" else length
        groups.append(Group(order.part[d0:d1], order.row[d0:d1], np.zeros(d1 - d0, np.int64), count, length,
                            _slice(order.code, d0, d1)))
    return groups


def _slice(values: Optional[np.ndarray], lo: int, hi: int) -> Optional[np.ndarray]:
    return None if values is None else values[lo:hi]


def concat_stats(lengths: np.ndarray, window: int) -> dict[str, int]:
    """docs_in, tokens_in and docs_split of one concat stream of documents of these lengths (in order):
    a document is split when a window boundary, or the stream's cut before its incomplete last
    window, falls strictly inside it (as `pack_batch` counts per partition)."""
    lengths = np.asarray(lengths, np.int64)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    total = int(ends[-1]) if len(ends) else 0
    cut = total // window * window
    inside = (starts < cut) & ((ends > cut) | (starts // window != (ends - 1) // window))
    return {"docs_in": len(lengths), "tokens_in": total, "docs_split": int(inside.sum())}


def _list_view(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(values, offsets) of a list column: row r holds values[offsets[r]:offsets[r + 1]]. One chunk
    (how parts are written) stays a view of the memory-mapped file."""
    array = one_array(column)
    return (array.values.to_numpy(zero_copy_only=False).astype(np.int32, copy=False),
            array.offsets.to_numpy().astype(np.int64))


def gather_ids(parts: list[str], group: Group) -> np.ndarray:
    """The ids of a group's segments one after another, picked out of the memory-mapped tokenized
    parts (Arrow IPC): a part is opened once and only the rows asked for are read."""
    out = np.empty(group.ids, np.int32)
    dst = np.cumsum(group.count) - group.count
    for p in np.unique(group.part).tolist():
        sel = np.flatnonzero(group.part == p)
        values, offsets = _list_view(read_table(parts[p], columns=["input_ids"]).column("input_ids"))
        src, to, count = offsets[group.row[sel]] + group.offset[sel], dst[sel], group.count[sel]
        if len(count) and (src + count > offsets[group.row[sel] + 1]).any():
            raise ValueError(f"{parts[p]}: a segment reaches past its document")
        batch = (np.cumsum(count) - count) // GATHER_IDS
        cuts = [0, *(np.flatnonzero(np.diff(batch)) + 1).tolist(), len(count)]
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            c = count[lo:hi]
            within = np.arange(int(c.sum())) - np.repeat(np.cumsum(c) - c, c)
            out[np.repeat(to[lo:hi], c) + within] = values[np.repeat(src[lo:hi], c) + within]
    return out


def pack_group(parts: list[str], group: Group, window: int, mode: str, remainder: str, pad_id: int,
               out_path: str) -> dict[str, Any]:
    """Gather one group (`plan_groups`) and pack it into `out_path` (Arrow IPC, not written when it
    holds no window). Returns its counts; concat's docs_in, tokens_in and docs_split come from
    `concat_stats` over the whole stream, since a group may hold part of a document."""
    flat = gather_ids(parts, group)
    pieces = None
    if mode == "concat":
        table, stats = pack_tails([flat], window, remainder, pad_id)
        stats = {"windows": stats["windows"], "tokens_dropped": stats["tokens_dropped"], "pad_tokens": stats["pad_tokens"],
                 "ids": int(len(flat))}
    elif mode == "pad":
        result = _pad_windows(flat, group.count, window, pad_id)
        table, stats = result.kept, dict(result.stats)
        # the ids past the window were never gathered: count them from the whole lengths
        stats.update(tokens_in=int(group.length.sum()), docs_truncated=int((group.length > window).sum()),
                     tokens_dropped=int((group.length - group.count).sum()))
    else:
        result = _best_fit_windows(flat, group.count, window, pad_id)
        table, stats = result.kept, dict(result.stats)
        pieces = stats.pop("pieces")
    if group.code is not None and (group.code >= 0).all():
        table, by_code = _with_groups(table, group, window, mode, pieces)
        stats["group_tokens"], stats["group_samples"] = by_code
    else:
        stats.pop("pieces", None)
    if table.num_rows:
        write_table_atomic(table, Path(out_path))
    return stats


# ---- which sources and languages fill each window ------------------------------------------------

def _with_groups(table: pa.Table, group: Group, window: int, mode: str,
                 pieces: Optional[tuple] = None) -> tuple[pa.Table, tuple[dict, dict]]:
    """The packed windows with three more columns: `groups` and `group_tokens` (which (source,
    language) codes fill the window with how many ids) and `group` (the one with most ids). The shard
    step reads only `input_ids` and `n_pad` for the MindRecord files, so their bytes do not change.
    Returns the table and ({code: ids}, {code: windows it dominates}) as strings for merge_stats."""
    n = table.num_rows
    if mode == "best_fit":
        bin_of, doc_of, p_len = pieces
        codes = group.code[doc_of].astype(np.int64)
        n_codes = int(codes.max(initial=0)) + 1
        uniq, inverse = np.unique(bin_of * n_codes + codes, return_inverse=True)
        tokens = np.bincount(inverse, weights=p_len).astype(np.int64)
        win, grp = uniq // n_codes, uniq % n_codes
        dominant = np.full(n, -1, np.int64)
        order = np.lexsort((grp, -tokens, win))
        first = order[np.r_[True, win[order][1:] != win[order][:-1]]] if len(order) else order
        dominant[win[first]] = grp[first]
    else:
        win, grp, tokens, dominant = window_groups(group.code, group.count, window, n, mode)
    offsets = np.concatenate([[0], np.cumsum(np.bincount(win, minlength=n))]).astype(np.int32)
    table = table.append_column("groups", pa.ListArray.from_arrays(pa.array(offsets), pa.array(grp.astype(np.int32))))
    table = table.append_column("group_tokens", pa.ListArray.from_arrays(pa.array(offsets),
                                                                         pa.array(tokens.astype(np.int32))))
    table = table.append_column("group", pa.array(dominant.astype(np.int32)))
    tok = np.bincount(grp, weights=tokens) if len(grp) else np.zeros(0)
    dom = np.bincount(dominant[dominant >= 0]) if (dominant >= 0).any() else np.zeros(0, np.int64)
    return table, ({str(c): int(v) for c, v in enumerate(tok) if v}, {str(c): int(v) for c, v in enumerate(dom) if v})


# ---- the seeded order, range-partitioned (no process holds the whole corpus's order) -------------
#
# `order_keys` are a hash of the uid, so their top ORDER_BITS bits cut the key space into buckets of
# about equal size, and the global order by (key, uid) is the buckets one after another, each sorted
# by (key, uid). The index pass writes each part's documents sorted by key (one small Arrow file per
# part and set) and returns only per-bucket totals; a pack task finds the buckets its range of the
# stream falls in from those totals, reads just their rows (a binary search in each part's sorted
# key column, which is memory-mapped) and sorts them: the same groups as `plan_groups` over the
# whole order, so the same windows and bytes.

ORDER_BITS = 10
ORDER_BUCKETS = 1 << ORDER_BITS
ORDER_SETS = ("train", "validation")


def order_index_part(path: str, seed: int, out_prefix: str, share: float, split_seed: int) -> dict[str, Any]:
    """One tokenized part's documents, per set (training, and the validation split when `share` > 0),
    sorted by (key, uid) into `out_prefix.SET.arrow` (key, uid, row, n_tokens, gcode); returns the
    part's (source, language) pairs and, per set, documents and tokens per key bucket."""
    from .mixing import validation_mask

    x = document_index(path, seed)
    n = len(x["uid"])
    if share > 0 and "doc_hash" not in x:
        raise ValueError(f"{path}: split.validation needs the tokenized parts' doc_hash column (rerun tokenize)")
    held = validation_mask(x["doc_hash"], share, split_seed) if share > 0 else np.zeros(n, bool)
    out: dict[str, Any] = {"groups": x.get("groups"), "sets": {}}
    for name, mask in zip(ORDER_SETS, (~held, held)):
        if name == "validation" and share <= 0:
            continue
        rows = np.flatnonzero(mask)
        key, uid = x["key"][rows], x["uid"][rows]
        o = np.lexsort((uid, key))
        rows, key = rows[o], key[o]
        n_tokens = x["n_tokens"][rows]
        gcode = x["gcode"][rows] if "gcode" in x else np.full(len(rows), -1, np.int32)
        table = pa.table({"key": pa.array(key, pa.uint64()), "uid": pa.array(uid[o], pa.int64()),
                          "row": pa.array(rows.astype(np.int64)), "n_tokens": pa.array(n_tokens, pa.int64()),
                          "gcode": pa.array(gcode.astype(np.int32))})
        target = f"{out_prefix}.{name}.arrow"
        write_table_atomic(table, Path(target))
        bucket = (key >> np.uint64(64 - ORDER_BITS)).astype(np.int64)
        bounds = np.searchsorted(bucket, np.arange(ORDER_BUCKETS + 1), "left")
        cum = np.concatenate([[0], np.cumsum(n_tokens)]).astype(np.int64)
        out["sets"][name] = {"path": target, "docs": np.diff(bounds).astype(np.int64),
                             "tokens": np.diff(cum[bounds]).astype(np.int64)}
    return out


@dataclass
class RangePlan:
    """One pack task of the range-partitioned order: the ids [t0, t1) of the concat stream of a set,
    found in buckets b0..b1, whose stream starts at `base` (the ids of all buckets before b0)."""

    t0: int
    t1: int
    b0: int
    b1: int
    base: int
    total: int  # the set's ids in all: where the last incomplete window is cut


def plan_ranges(tokens_per_bucket: np.ndarray, window: int, group_tokens: int) -> list[RangePlan]:
    """concat's groups of `plan_groups` (the stream cut at multiples of the window,
    `group_tokens // window` windows a group), from the per-bucket totals alone."""
    tb = np.concatenate([[0], np.cumsum(tokens_per_bucket)]).astype(np.int64)  # bucket b holds ids [tb[b], tb[b+1])
    total = int(tb[-1])
    per_group = max(1, group_tokens // window) * window
    plans = []
    for t0 in range(0, total, per_group):
        t1 = min(total, t0 + per_group)
        # every bucket that may hold a document overlapping [t0, t1) (or starting at t0, for empty ones)
        b0 = int(np.searchsorted(tb[1:], t0, "left"))
        b1 = int(np.searchsorted(tb[:-1], t1, "right")) - 1
        plans.append(RangePlan(t0, t1, b0, max(b0, b1), int(tb[b0]), total))
    return plans


def _bucket_rows(path: str, b0: int, b1: int) -> pa.Table:
    """The rows of one part's sorted order file whose key falls in buckets b0..b1 (binary search in
    the memory-mapped key column: only the rows asked for are read)."""
    table = read_table(path)
    keys = table.column("key")
    keys = one_array(keys).to_numpy()
    shift = 64 - ORDER_BITS
    lo = int(np.searchsorted(keys, np.uint64(b0 << shift), "left"))
    hi = len(keys) if b1 + 1 >= ORDER_BUCKETS else int(np.searchsorted(keys, np.uint64((b1 + 1) << shift), "left"))
    return table.slice(lo, hi - lo)


def range_group(order_files: list[str], remaps: list[Optional[np.ndarray]], plan: RangePlan, window: int) -> tuple[Group, int]:
    """The `Group` of `plan_groups` for one range of the stream, and how many documents starting in
    it a window boundary (or the final cut) splits (what `concat_stats` counts over the whole stream)."""
    part, cols = [], []
    for i, path in enumerate(order_files):
        t = _bucket_rows(path, plan.b0, plan.b1)
        if not t.num_rows:
            continue
        part.append(np.full(t.num_rows, i, np.int32))
        gcode = t.column("gcode").to_numpy().astype(np.int32)
        remap = remaps[i]
        code = remap[gcode] if remap is not None and len(remap) else np.full(t.num_rows, -1, np.int32)
        cols.append((t.column("key").to_numpy(), t.column("uid").to_numpy(), t.column("row").to_numpy(),
                     t.column("n_tokens").to_numpy(), code))
    if cols:
        key, uid, row, lengths, code = (np.concatenate([c[k] for c in cols]) for k in range(5))
        p = np.concatenate(part)
    else:
        key, uid, row, lengths, code, p = (np.empty(0, dt) for dt in (np.uint64, np.int64, np.int64, np.int64,
                                                                      np.int32, np.int32))
    o = np.lexsort((uid, key))
    p, row, lengths, code = p[o], row[o].astype(np.int64), lengths[o].astype(np.int64), code[o].astype(np.int32)
    ends = plan.base + np.cumsum(lengths)
    starts = ends - lengths
    d0, d1 = int(np.searchsorted(ends, plan.t0, "right")), int(np.searchsorted(starts, plan.t1, "left"))
    s, e = starts[d0:d1], ends[d0:d1]
    first, last = np.maximum(s, plan.t0), np.minimum(e, plan.t1)
    group = Group(p[d0:d1], row[d0:d1], first - s, last - first, lengths[d0:d1], code[d0:d1])
    cut = plan.total // window * window
    mine = (starts >= plan.t0) & (starts < plan.t1)
    inside = mine & (starts < cut) & ((ends > cut) | (starts // window != (ends - 1) // window))
    return group, int(inside.sum())


def pack_range(parts: list[str], order_files: list[str], remaps: list[Optional[np.ndarray]], plan: RangePlan,
               window: int, remainder: str, pad_id: int, out_path: str) -> dict[str, Any]:
    """A concat pack task of the range-partitioned order: its group, then `pack_group`; its stats
    also count the documents it splits (`docs_split`)."""
    group, split = range_group(order_files, remaps, plan, window)
    stats = pack_group(parts, group, window, "concat", remainder, pad_id, out_path)
    stats["docs_split"] = split
    return stats
