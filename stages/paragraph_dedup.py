"""Paragraph-level dedup across the corpus: a paragraph (a line) that recurs in at least `min_docs`
documents stays in the lowest-uid one and is removed from the others (disclaimers, copyright and
ICP lines, navigation that extraction kept), as CCNet and dolma do.

The unit is the line: the text between two line breaks, blank lines being separators (web and forum
extractions put one paragraph on a line; a blank-line block of several lines would make one changed
line, a date, hide the rest). A line is hashed (XXH3-64, `quality_loops.line_scan`) after it is
normalised: every whitespace but the line break folded to one space, stripped, lowercased. A line
with fewer than `min_chars` non-space characters (characters, not words: CJK-aware) is never removed.
The original text loses the line (`quality_loops.drop_lines`), never the normalised one.

Three passes, each over one part or one hash range, so no process holds the corpus's pairs:
`pairs_to_file` (a part's (hash, uid) pairs, sorted by hash, cut into hash-range buckets by the
top bits), `repeated_in_buckets` (one range of buckets over every part's file: the hashes in
`min_docs` documents or more, their keeper and the (part, uid, hash) rows to remove, written sorted
by part), `remove_paragraphs` (one part with its own rows). `dedup_table` runs all three on one
table in memory (tests, measurements).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

import numba as nb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from . import quality_loops
from .base import BatchResult, REMOVED_META, excerpt, one_array, read_table
from .shingles import utf8_buffers
from .sketch import decode_utf8

REASON = "paragraph_dedup_empty"
FINE_BITS_MAX = 12  # at most 4096 hash-range buckets in a part's file
EXAMPLE_CHARS = 200
CHARS_COLUMN, PARAGRAPHS_COLUMN = "paragraph_chars_removed", "paragraphs_removed"


def _build_tables(points: np.ndarray) -> dict[str, np.ndarray]:
    chars = [chr(c) for c in points.tolist()]
    space = np.zeros(quality_loops.CODE_POINTS, dtype=np.bool_)
    space[points[np.fromiter((ch.isspace() for ch in chars), dtype=bool, count=len(points))]] = True
    weight = np.zeros(quality_loops.CODE_POINTS, dtype=np.int64)
    weight[space] = -1  # line_scan's width counts 1 + weight: whitespace counts 0, so width = non-space characters
    lower = np.arange(quality_loops.CODE_POINTS, dtype=np.int32)
    lower[points] = [ord(ch.lower()[0]) for ch in chars]  # İ lowers to i + a combining dot: i, as Arrow's utf8_lower
    return {"space": space, "weight": weight, "lower": lower}


def _tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    import unicodedata

    t = quality_loops.code_point_tables("paragraph-tables", f"isspace-lower-first-{unicodedata.unidata_version}", _build_tables)
    return t["space"], t["weight"], t["lower"]


@nb.njit(cache=True, nogil=True)
def _fold_lower(data: np.ndarray, offsets: np.ndarray, space: np.ndarray, lower: np.ndarray) -> tuple:
    """`normalise` in one pass over a UTF-8 buffer: every run of whitespace but the line break made
    one space, every character lowercased (the first character of Python's str.lower, as Arrow's
    utf8_lower gives); the line breaks stay, so line k of the output is line k of the input (an
    Arrow regex and utf8_lower took 60% of the kernel's time). Lowercasing lengthens a character by a byte at most
    (2 -> 3 bytes), so 1.5x the input bounds the output."""
    n = len(offsets) - 1
    out = np.empty((offsets[n] - offsets[0]) * 3 // 2 + 8, dtype=np.uint8)
    out_off = np.zeros(n + 1, dtype=np.int64)
    k = 0
    for d in range(n):
        i, end = offsets[d], offsets[d + 1]
        in_space = False
        while i < end:
            c, j = decode_utf8(data, i)
            if c != 10 and space[c]:
                if not in_space:
                    out[k] = 32
                    k += 1
                    in_space = True
                i = j
                continue
            in_space = False
            if c < 0x80:
                out[k] = lower[c]
                k += 1
            else:
                k = _encode_utf8(out, k, lower[c])
            i = j
        out_off[d + 1] = k
    return out[:max(k, 1)], out_off


@nb.njit(inline="always")
def _encode_utf8(out, k, c):
    if c < 0x80:  # the Kelvin sign lowers to k
        out[k] = c
        return k + 1
    if c < 0x800:
        out[k] = 0xC0 | (c >> 6)
        out[k + 1] = 0x80 | (c & 0x3F)
        return k + 2
    if c < 0x10000:
        out[k] = 0xE0 | (c >> 12)
        out[k + 1] = 0x80 | ((c >> 6) & 0x3F)
        out[k + 2] = 0x80 | (c & 0x3F)
        return k + 3
    out[k] = 0xF0 | (c >> 18)
    out[k + 1] = 0x80 | ((c >> 12) & 0x3F)
    out[k + 2] = 0x80 | ((c >> 6) & 0x3F)
    out[k + 3] = 0x80 | (c & 0x3F)
    return k + 4


def normalise_buffer(texts: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """What a paragraph is hashed as (UTF-8 bytes and int64 offsets): whitespace runs but line breaks
    made one space, lowercased (the line is stripped by the scan), by `_fold_lower`."""
    space, _, lower = _tables()
    data, offsets = utf8_buffers(pc.fill_null(one_array(texts).cast(pa.string()), ""))
    return _fold_lower(data, offsets, space, lower)


def normalise(texts: pa.Array) -> pa.Array:
    """`normalise_buffer` as a string array (tests, and a reader who wants to see it)."""
    out, off = normalise_buffer(texts)
    return pa.LargeStringArray.from_buffers(len(off) - 1, pa.py_buffer(off), pa.py_buffer(out)).cast(pa.string())


@dataclass
class Paragraphs:
    """Every line of a batch of documents: its document, normalised hash and non-space characters."""

    doc: np.ndarray  # the document (row) of each line
    per_doc: np.ndarray  # lines per document, empty ones included
    hashes: np.ndarray  # XXH3-64 of the normalised, stripped line (signed int64)
    chars: np.ndarray  # non-space characters of the line
    eligible: np.ndarray  # chars >= min_chars: a line that may be removed

    @property
    def line_start(self) -> np.ndarray:
        start = np.zeros(len(self.per_doc), dtype=np.int64)
        np.cumsum(self.per_doc[:-1], out=start[1:])
        return start


def split(texts: pa.Array, min_chars: int) -> Paragraphs:
    """The paragraphs (lines) of each text, hashed as `normalise` makes them: one compiled pass."""
    space, weight, _ = _tables()
    data, offsets = normalise_buffer(texts)
    per_doc, _, _, chars, hashes = quality_loops.line_scan(data, offsets, space, space, weight)
    doc = np.repeat(np.arange(len(per_doc), dtype=np.int64), per_doc)
    return Paragraphs(doc, per_doc, hashes, chars, chars >= max(1, min_chars))


def paragraph_hash(line: str) -> int:
    """The hash `split` gives this line (the report and tests name paragraphs by it)."""
    return int(split(pa.array([line], pa.string()), 1).hashes[0])


# ---- pass 1: a part's (hash, uid) pairs, by hash range --------------------------------------

def doc_pairs(par: Paragraphs, uids: np.ndarray) -> np.ndarray:
    """(k, 2) int64 [hash, uid] of the eligible paragraphs, once per document, sorted by the hash as
    unsigned (so by bucket: the top bits) and then by uid."""
    keep = par.eligible
    h, u = par.hashes[keep], uids[par.doc[keep]].astype(np.int64)
    order = np.lexsort((u, h.view(np.uint64)))
    h, u = h[order], u[order]
    first = np.ones(len(h), dtype=bool)
    first[1:] = (h[1:] != h[:-1]) | (u[1:] != u[:-1])
    return np.column_stack([h[first], u[first]]).astype(np.int64)


def bucket_of(hashes: np.ndarray, bits: int) -> np.ndarray:
    """The hash-range bucket (the top `bits` bits of the unsigned hash) of each hash."""
    return (hashes.view(np.uint64) >> np.uint64(64 - bits)).astype(np.int64) if bits else np.zeros(len(hashes), np.int64)


def _save(rows: np.ndarray, out_path: str) -> None:
    tmp = f"{out_path}.{os.getpid()}.tmp.npy"
    np.save(tmp, np.ascontiguousarray(rows, dtype=np.int64))
    os.replace(tmp, out_path)


def pairs_to_file(path: str, min_chars: int, bits: int, out_path: str) -> dict[str, Any]:
    """Pass 1 of one part: its pairs (`doc_pairs`) written to `out_path` (.npy), with where each of
    the 2^bits buckets starts and ends in it; kept on disk, not in the worker, until every part is done."""
    table = read_table(path, columns=["uid", "text"])
    par = split(table.column("text"), min_chars)
    rows = doc_pairs(par, table.column("uid").to_numpy())
    cuts = np.searchsorted(bucket_of(rows[:, 0], bits), np.arange((1 << bits) + 1))
    _save(rows, out_path)
    return {"cuts": cuts.tolist(), "docs": int(table.num_rows), "paragraphs": int((par.chars > 0).sum()),
            "eligible": int(par.eligible.sum()), "pairs": int(len(rows))}


# ---- pass 1.5: repeated hashes of a hash range, over the corpus ------------------------------

def repeated(rows: np.ndarray, min_docs: int, top: int = 0) -> tuple[np.ndarray, np.ndarray, int]:
    """From (k, 3) [hash, uid, part] rows holding every pair of the hashes they contain (a (hash,
    uid) pair once): for each hash in `min_docs` documents or more, one row per document, (m, 5)
    [part, uid, hash, keeper uid, documents] sorted by part and uid: the paragraph goes from every
    document but its keeper (the lowest uid), whose own row (uid == keeper) tells pass 2 that this
    document holds a paragraph for the corpus and so is never removed whole; and the `top`
    most widespread of them as (t, 3) [hash, keeper, documents] (the report's examples); and how
    many hashes are repeated."""
    if not len(rows):
        return np.zeros((0, 5), np.int64), np.zeros((0, 3), np.int64), 0
    rows = rows[np.lexsort((rows[:, 1], rows[:, 0].view(np.uint64)))]
    h = rows[:, 0]
    start = np.ones(len(h), dtype=bool)
    start[1:] = h[1:] != h[:-1]
    at = np.flatnonzero(start)
    size = np.diff(np.append(at, len(h)))
    group = np.repeat(np.arange(len(at)), size)
    docs = size[group]
    keeper = rows[at, 1][group]
    gone = docs >= min_docs
    out = np.column_stack([rows[gone, 2], rows[gone, 1], h[gone], keeper[gone], docs[gone]]).astype(np.int64)
    out = out[np.lexsort((out[:, 1], out[:, 0]))]
    rep = size >= min_docs
    best = np.zeros((0, 3), np.int64)
    if top and rep.any():
        idx = at[rep]
        order = np.lexsort((h[idx].view(np.uint64), -size[rep]))[:top]
        best = np.column_stack([h[idx[order]], rows[idx[order], 1], size[rep][order]]).astype(np.int64)
    return out, best, int(rep.sum())


def repeated_in_buckets(files: list[str], cuts: np.ndarray, min_docs: int, out_path: str, top: int) -> dict[str, Any]:
    """Pass 1.5 of one hash range: `cuts` (parts x 2) is where the range starts and ends in each
    part's file (memory-mapped: the task holds this range's rows only). The rows to remove go to
    `out_path`, sorted by part; returns where each part's rows start and end, the count of repeated
    hashes and the `top` most widespread ones."""
    chunks = []
    for i, f in enumerate(files):
        a, b = int(cuts[i, 0]), int(cuts[i, 1])
        if b > a:
            piece = np.asarray(np.load(f, mmap_mode="r")[a:b])
            chunks.append(np.column_stack([piece, np.full(len(piece), i, np.int64)]))
    rows = np.concatenate(chunks) if chunks else np.zeros((0, 3), np.int64)
    out, best, n_rep = repeated(rows, min_docs, top)
    _save(out, out_path)
    part_cuts = np.searchsorted(out[:, 0], np.arange(len(files) + 1))
    return {"part_cuts": part_cuts.tolist(), "repeated": n_rep, "rows": int(len(out)), "pairs": int(len(rows)),
            "top": best.tolist()}


def load_removals(files: list[str], cuts: np.ndarray) -> np.ndarray:
    """One part's rows, (m, 4) [uid, hash, keeper, documents], from every hash range's file
    (`cuts` (ranges x 2): where the part's rows start and end in each)."""
    chunks = []
    for j, f in enumerate(files):
        a, b = int(cuts[j, 0]), int(cuts[j, 1])
        if b > a:
            chunks.append(np.asarray(np.load(f, mmap_mode="r")[a:b, 1:]))
    return np.concatenate(chunks) if chunks else np.zeros((0, 4), np.int64)


def remove_part(table: pa.Table, files: list[str], cuts: np.ndarray, min_chars: int, min_doc_chars_left: int,
                audit_chars: Optional[int], example_hashes: Optional[np.ndarray]) -> tuple:
    """Pass 2 of one part: `remove_paragraphs` with the part's rows read from the ranges' files."""
    return remove_paragraphs(table, load_removals(files, cuts), min_chars, min_doc_chars_left, audit_chars, example_hashes)


# ---- pass 2: remove a part's repeated paragraphs ---------------------------------------------

def remove_paragraphs(table: pa.Table, removals: np.ndarray, min_chars: int, min_doc_chars_left: int,
                      audit_chars: Optional[int] = 2000, example_hashes: Optional[np.ndarray] = None) -> tuple:
    """Remove from each document of `table` the paragraphs `removals` names for it ((m, 4) [uid,
    hash, keeper, documents]; a row with uid == keeper marks the keeper, which loses nothing by it).
    A document left with fewer than `min_doc_chars_left` non-space characters (or none) is removed
    whole with reason `paragraph_dedup_empty` unless it keeps a repeated paragraph for the corpus
    (then the paragraph would be lost everywhere), its audit row naming
    the keeper of its first removed paragraph (duplicate_of; duplicate_of_id is filled by the caller,
    which can look the keeper's id up); the others stay with the counts in `paragraphs_removed` and
    `paragraph_chars_removed` (characters of the text before less after). Returns (BatchResult with
    the kept Arrow table, {example hash: [first line's text, times removed]})."""
    from .composition import group_counts

    n = table.num_rows
    texts = pc.fill_null(one_array(table.column("text")).cast(pa.string()), "")
    uids = table.column("uid").to_numpy()
    sources = pc.fill_null(one_array(table.column("source")).cast(pa.string()), "").to_numpy(zero_copy_only=False)
    par = split(texts, min_chars)
    hit = np.zeros(len(par.hashes), dtype=bool)
    keeper_of_line = np.full(len(par.hashes), -1, np.int64)
    docs_of_line = np.zeros(len(par.hashes), np.int64)
    own = removals[:, 0] == removals[:, 2]
    protected = np.isin(uids, removals[own, 0]) if own.any() else np.zeros(n, dtype=bool)
    removals = removals[~own]
    if len(removals) and n:
        cand = np.flatnonzero(par.eligible & np.isin(par.hashes, removals[:, 1]))
        lines = pd.DataFrame({"line": cand, "uid": uids[par.doc[cand]], "hash": par.hashes[cand]})
        want = pd.DataFrame({"uid": removals[:, 0], "hash": removals[:, 1], "keeper": removals[:, 2], "docs": removals[:, 3]})
        found = lines.merge(want, on=["uid", "hash"], how="inner")
        at = found["line"].to_numpy()
        hit[at] = True
        keeper_of_line[at] = found["keeper"].to_numpy()
        docs_of_line[at] = found["docs"].to_numpy()
    hits = np.bincount(par.doc[hit], minlength=n)
    total = np.bincount(par.doc, weights=par.chars, minlength=n).astype(np.int64)
    left = total - np.bincount(par.doc[hit], weights=par.chars[hit], minlength=n).astype(np.int64)
    emptied = (hits > 0) & ~protected & ((left <= 0) | (left < min_doc_chars_left))
    touched = (hits > 0) & ~emptied
    data, offsets = utf8_buffers(texts)
    space, _, _ = _tables()
    buf, new_off = quality_loops.drop_lines(data, offsets, hit, par.line_start, touched, space)
    new_texts = pa.LargeStringArray.from_buffers(n, pa.py_buffer(new_off), pa.py_buffer(buf)).cast(pa.string())
    old_len = pc.utf8_length(texts).to_numpy(zero_copy_only=False).astype(np.int64)
    new_len = pc.utf8_length(new_texts).to_numpy(zero_copy_only=False).astype(np.int64)
    chars_removed = np.where(touched, old_len - new_len, 0)
    paragraphs_removed = np.where(touched, hits, 0)
    if table.column("text").null_count:  # a null text stays null (it has no paragraph to lose)
        new_texts = pc.if_else(pc.is_null(one_array(table.column("text"))), pa.scalar(None, pa.string()), new_texts)
    out = table.set_column(table.column_names.index("text"), "text", new_texts)
    for name, values in ((PARAGRAPHS_COLUMN, paragraphs_removed), (CHARS_COLUMN, chars_removed)):
        if name in out.column_names:
            out = out.drop_columns([name])
        out = out.append_column(name, pa.array(values, pa.int64()))
    kept_mask = ~emptied
    kept = out.filter(pa.array(kept_mask)) if emptied.any() else out
    stats: dict[str, Any] = {"docs_in": n, "docs_out": int(kept_mask.sum()),
                             "removed": {REASON: int(emptied.sum())} if emptied.any() else {},
                             "paragraphs_removed": int(paragraphs_removed.sum()), "chars_removed": int(chars_removed.sum()),
                             "docs_touched": int(touched.sum()), "docs_emptied": int(emptied.sum()),
                             "chars_emptied": int(old_len[emptied].sum()), "chars_in": int(old_len.sum()),
                             "by_source": _by_source(sources, touched, emptied, paragraphs_removed, chars_removed, old_len)}
    if {"source", "language"} <= set(kept.column_names):
        stats["by_group"] = group_counts(kept.column("source").to_pylist(), kept.column("language").to_pylist(),
                                         chars=new_len[kept_mask])
    removed = _removed_rows(table, emptied, hit, par, keeper_of_line, docs_of_line, left, min_doc_chars_left, audit_chars)
    named: dict = {}
    if example_hashes is not None and len(example_hashes) and hit.any():
        idx = np.flatnonzero(hit & np.isin(par.hashes, example_hashes))
        uniq, first, counts = np.unique(par.hashes[idx], return_index=True, return_counts=True)
        for h, k, c in zip(uniq.tolist(), idx[first].tolist(), counts.tolist()):
            named[str(h)] = [_line_text(texts, par, k), int(c)]
    return BatchResult(kept=kept, removed=removed, stats=stats), named


def _by_source(sources: np.ndarray, touched: np.ndarray, emptied: np.ndarray, paragraphs: np.ndarray,
               chars: np.ndarray, old_len: np.ndarray) -> dict[str, dict[str, int]]:
    """Per source: documents in, touched (kept, lost paragraphs), emptied, paragraphs and characters
    removed from the kept ones, characters in."""
    out: dict[str, dict[str, int]] = {}
    frame = pd.DataFrame({"s": sources, "t": touched.astype(np.int64), "e": emptied.astype(np.int64),
                          "p": paragraphs, "c": chars, "n": old_len, "e_c": np.where(emptied, old_len, 0)})
    for s, g in frame.groupby("s", sort=True):
        out[str(s)] = {"docs": int(len(g)), "docs_touched": int(g["t"].sum()), "docs_emptied": int(g["e"].sum()),
                       "paragraphs_removed": int(g["p"].sum()), "chars_removed": int(g["c"].sum()),
                       "chars_emptied": int(g["e_c"].sum()), "chars_in": int(g["n"].sum())}
    return out


def _line_text(texts: pa.Array, par: Paragraphs, k: int) -> str:
    """Line k of the original texts, stripped and cut to EXAMPLE_CHARS."""
    d = int(par.doc[k])
    lines = (texts[d].as_py() or "").split("\n")
    return lines[k - int(par.line_start[d])].strip()[:EXAMPLE_CHARS]


def _removed_rows(table: pa.Table, emptied: np.ndarray, hit: np.ndarray, par: Paragraphs, keeper_of_line: np.ndarray,
                  docs_of_line: np.ndarray, left: np.ndarray, min_doc_chars_left: int,
                  audit_chars: Optional[int]) -> pd.DataFrame:
    """Audit rows (REMOVED_SCHEMA) of the emptied documents: duplicate_of is the keeper of the first
    removed paragraph, cluster_size the documents holding it, score the non-space characters left,
    threshold min_doc_chars_left."""
    rows = np.flatnonzero(emptied)
    if not len(rows):
        return REMOVED_META.assign(text=pd.Series(dtype=object))
    lines = np.flatnonzero(hit & emptied[par.doc])
    first = lines[np.r_[True, par.doc[lines][1:] != par.doc[lines][:-1]]]  # first removed line of each emptied doc
    sub = table.take(pa.array(rows))
    out = pd.DataFrame({
        "uid": sub.column("uid").to_numpy(), "id": sub.column("id").to_pylist(), "source": sub.column("source").to_pylist(),
        "reason": REASON, "score": np.maximum(left[rows], 0).astype(float), "threshold": float(min_doc_chars_left),
        "duplicate_of": keeper_of_line[first], "duplicate_of_id": None, "cluster_size": docs_of_line[first],
        "cluster_id": keeper_of_line[first],
    })
    out["text"] = excerpt(sub.column("text").to_pylist(), audit_chars)
    return out


# ---- all passes on one table (tests, measurements) -------------------------------------------

def dedup_table(table: pa.Table, min_chars: int = 20, min_docs: int = 2, min_doc_chars_left: int = 20,
                audit_chars: Optional[int] = 2000, examples: int = 0) -> tuple[BatchResult, list[dict]]:
    """The three passes over one in-memory table: (BatchResult, examples: the `examples` most
    widespread repeated paragraphs with their text and documents). duplicate_of_id is filled."""
    par = split(table.column("text"), min_chars)
    pairs = doc_pairs(par, table.column("uid").to_numpy())
    rows, best, n_rep = repeated(np.column_stack([pairs, np.zeros(len(pairs), np.int64)]), min_docs, examples)
    result, named = remove_paragraphs(table, rows[:, 1:], min_chars, min_doc_chars_left, audit_chars,
                                      best[:, 0] if len(best) else None)
    if len(result.removed):
        ids = dict(zip(table.column("uid").to_pylist(), table.column("id").to_pylist()))
        result.removed["duplicate_of_id"] = [ids.get(int(u)) for u in result.removed["duplicate_of"]]
    out = [{"text": named.get(str(h), ["", 0])[0], "documents": int(d), "keeper_uid": int(k),
            "removed": int(named.get(str(h), ["", 0])[1])} for h, k, d in best.tolist()]
    result.stats["repeated_paragraphs"] = n_rep
    return result, out
