"""Line-level boilerplate: lines that recur in many documents of the same source (page headers,
licence banners, navigation), found by counting line hashes across the whole corpus.

`count_lines_to_file` writes, per partition, how many documents of each source contain each line (a
line counts once per document) as int64 rows grouped by line hash into buckets; one task per bucket
sums its slice of every partition's file over the corpus (`sum_line_count_files`, no string shuffle)
and the filter step keeps the lines seen in at least `min_docs` documents and `min_doc_share` of
their source's documents. `strip_lines_array` removes them from documents, counting what it removed
per source.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from . import quality_loops
from .base import one_array, read_table
from .shingles import utf8_buffers

_SIGN = 1 << 63
MIN_DOC_LINES = 3  # only documents with at least this many non-empty lines count, or lose lines


def line_hash(line: str) -> int:
    """A signed 64-bit hash of a stripped line (Arrow and pandas store int64)."""
    return xxhash.xxh3_64_intdigest(line.strip().encode("utf-8")) - _SIGN


WIDE = r"[\p{Han}\p{Hiragana}\p{Katakana}\p{Hangul}\x{3000}-\x{303f}\x{ff01}-\x{ff60}\x{ffe0}-\x{ffe6}]"


def line_widths(lines: pa.Array) -> np.ndarray:
    """Display width of each (trimmed) line: CJK and full-width characters count 2."""
    length = pc.utf8_length(lines).to_numpy(zero_copy_only=False).astype(np.int64)
    return length + pc.count_substring_regex(lines, WIDE).to_numpy(zero_copy_only=False).astype(np.int64)


def line_width(line: str) -> int:
    """`line_widths` of one line."""
    return int(line_widths(pa.array([line.strip()], pa.string()))[0])


def _line_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per code point: trimmed by Arrow's utf8_trim_whitespace, stripped by Python's str.strip, and
    counted wide by `WIDE` (RE2): taken from those kernels once, so the compiled `line_scan` splits,
    trims, measures and hashes lines exactly as `line_widths` and `line_hash` do."""
    t = quality_loops.code_point_tables("line-tables", f"{pa.__version__}{WIDE}", _build_line_tables)
    return t["trim"], t["strip"], t["wide"]


def _build_line_tables(points: np.ndarray) -> dict[str, np.ndarray]:
    chars = [chr(c) for c in points.tolist()]
    arr = pa.array(chars, pa.string())
    trim = np.zeros(quality_loops.CODE_POINTS, dtype=np.bool_)
    trim[points[pc.utf8_length(pc.utf8_trim_whitespace(arr)).to_numpy() == 0]] = True
    strip = np.zeros(quality_loops.CODE_POINTS, dtype=np.bool_)
    strip[points[np.fromiter((ch.isspace() for ch in chars), dtype=bool, count=len(chars))]] = True
    wide = np.zeros(quality_loops.CODE_POINTS, dtype=np.int64)
    wide[points[pc.count_substring_regex(arr, WIDE).to_numpy() > 0]] = 1
    return {"trim": trim, "strip": strip, "wide": wide}


def line_trim_table() -> np.ndarray:
    """Per code point: whether Arrow's utf8_trim_whitespace trims it."""
    return _line_tables()[0]


@dataclass
class _Lines:
    """Every line of a batch of documents (`quality_loops.line_scan`): trimmed byte ranges into the
    batch's UTF-8 buffer, widths and hashes; no line is made a string."""

    doc: np.ndarray  # the document of each line
    per_doc: np.ndarray  # lines per document, empty ones included
    nonempty: np.ndarray  # whether a trimmed line has any character
    width: np.ndarray  # display width of the trimmed line (`line_widths`)
    hashes: np.ndarray  # `line_hash` of each line
    data: np.ndarray  # the UTF-8 buffer the ranges point into
    lo: np.ndarray
    hi: np.ndarray

    @property
    def nonempty_per_doc(self) -> np.ndarray:
        return np.bincount(self.doc[self.nonempty], minlength=len(self.per_doc))

    def text(self, k: int) -> str:
        """Line k, trimmed, as a string (the report names a few lines)."""
        return bytes(self.data[self.lo[k]:self.hi[k]]).decode("utf-8")


def _split_lines(texts: pa.Array) -> _Lines:
    texts = one_array(texts)
    data, offsets = utf8_buffers(texts)
    trim, strip, wide = _line_tables()
    per_doc, lo, hi, width, hashes = quality_loops.line_scan(data, offsets, trim, strip, wide)
    doc = np.repeat(np.arange(len(texts), dtype=np.int64), per_doc)
    return _Lines(doc, per_doc, hi > lo, width, hashes, data, lo, hi)


def _count_part(path: str, min_width: int) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(source names, documents per source, and per (source, line) pair: source index, line hash,
    documents holding it) for one partition. Lines are split, trimmed, measured and hashed by one
    compiled pass over the part's UTF-8 buffer (`quality_loops.line_scan`)."""
    table = read_table(path, columns=["text", "source"])
    sources = pc.fill_null(one_array(table.column("source")).cast(pa.string()), "")
    src_codes = pc.dictionary_encode(sources)
    src_names = src_codes.dictionary.to_pylist()
    doc_src = src_codes.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    per_source = np.bincount(doc_src, minlength=len(src_names))
    lines = _split_lines(table.column("text"))  # one array there
    # a one- or two-line document is content (or a duplicate), not a page with boilerplate
    keep = (lines.nonempty_per_doc[lines.doc] >= MIN_DOC_LINES) & (lines.width >= min_width)
    hashes = lines.hashes[keep]
    # once per document: distinct (document, line) pairs, then count documents per (source, line)
    pairs = pd.DataFrame({"doc": lines.doc[keep], "hash": hashes}).drop_duplicates()  # hash-based, not a sort
    keyed = pd.DataFrame({"src": doc_src[pairs["doc"].to_numpy()], "hash": pairs["hash"].to_numpy()})
    counted = keyed.groupby(["src", "hash"], sort=False).size().reset_index(name="docs")
    return (src_names, per_source, counted["src"].to_numpy(np.int64), counted["hash"].to_numpy(np.int64),
            counted["docs"].to_numpy(np.int64))


def count_lines_part(path: str, min_width: int) -> pd.DataFrame:
    """(source, hash, docs) for one partition: in how many documents of each source each line
    appears; plus, per source, its document count as a row with hash 0 and docs = -count."""
    src_names, per_source, src, hashes, docs = _count_part(path, min_width)
    names = np.array(src_names, dtype=object)
    return pd.DataFrame({
        "source": pd.Series(np.concatenate([names[src], names[np.flatnonzero(per_source)]]), dtype="string"),
        "hash": np.concatenate([hashes, np.zeros(int((per_source > 0).sum()), np.int64)]),
        "docs": np.concatenate([docs, -per_source[per_source > 0]]),
    })


def source_key(name: str) -> int:
    """A signed 64-bit key for a source name: the line counts travel between tasks as int64 arrays."""
    return xxhash.xxh3_64_intdigest(name.encode("utf-8")) - _SIGN


def count_lines_buckets(path: str, min_width: int, buckets: int) -> tuple:
    """`count_lines_part` as int64 arrays split by line hash into `buckets` groups (a hashed
    partitioning, so each group can be summed over the corpus by its own task without a string
    shuffle): ({source key: [name, documents]}, then one (k, 3) array [source key, hash, docs] per
    bucket)."""
    src_names, per_source, src, hashes, docs = _count_part(path, min_width)
    keys = np.array([source_key(s) for s in src_names], dtype=np.int64)
    sources = {int(k): [s, int(c)] for k, s, c in zip(keys, src_names, per_source.tolist()) if c > 0}
    rows = np.column_stack([keys[src] if len(src) else np.zeros(0, np.int64), hashes, docs]).astype(np.int64)
    bucket = (hashes.view(np.uint64) % np.uint64(buckets)).astype(np.int64)
    order = np.argsort(bucket, kind="stable")
    cuts = np.searchsorted(bucket[order], np.arange(buckets + 1))
    return (sources, *(rows[order[cuts[b]:cuts[b + 1]]] for b in range(buckets)))


def count_lines_to_file(path: str, min_width: int, buckets: int, out_path: str) -> tuple[dict, list[int]]:
    """`count_lines_buckets` of one part written to `out_path` (one .npy of (source key, hash,
    docs) rows, grouped by bucket) instead of kept in the worker's memory until every part is
    counted: the counts of the whole corpus would otherwise sit on the workers at once. Returns the
    sources and where each bucket's rows start and end."""
    sources, *chunks = count_lines_buckets(path, min_width, buckets)
    cuts = np.zeros(buckets + 1, dtype=np.int64)
    np.cumsum([len(c) for c in chunks], out=cuts[1:])
    rows = np.concatenate(chunks) if cuts[-1] else np.zeros((0, 3), np.int64)
    tmp = f"{out_path}.{os.getpid()}.tmp.npy"
    np.save(tmp, np.ascontiguousarray(rows, dtype=np.int64))
    os.replace(tmp, out_path)
    return sources, cuts.tolist()


def sum_line_count_files(files: list[str], cuts: np.ndarray, bucket: int, min_docs: int) -> np.ndarray:
    """`sum_line_counts` of one bucket, read from every part's file (`count_lines_to_file`; memory-
    mapped, so a task holds this bucket's rows only). `cuts[i]` is where each bucket's rows start
    and end in `files[i]` (one matrix shared by all the bucket tasks: a list per task grew with
    parts x buckets)."""
    chunks = [np.load(f, mmap_mode="r")[cuts[i, bucket]:cuts[i, bucket + 1]] for i, f in enumerate(files)]
    return sum_line_counts([np.asarray(c) for c in chunks], min_docs)


def sum_line_counts(chunks: list[np.ndarray], min_docs: int) -> np.ndarray:
    """One bucket's (source key, hash, docs) rows of every part summed per (source, line); only the
    lines in at least `min_docs` documents are returned (the driver sees the frequent ones alone)."""
    rows = np.concatenate([c for c in chunks if len(c)]) if any(len(c) for c in chunks) else np.zeros((0, 3), np.int64)
    if not len(rows):
        return rows
    order = np.lexsort((rows[:, 1], rows[:, 0]))
    rows = rows[order]
    start = np.ones(len(rows), dtype=bool)
    start[1:] = (rows[1:, 0] != rows[:-1, 0]) | (rows[1:, 1] != rows[:-1, 1])
    at = np.flatnonzero(start)
    total = np.add.reduceat(rows[:, 2], at)
    out = rows[at]
    out[:, 2] = total
    return out[total >= min_docs]


def strip_lines(texts: list[str], sources: list[str], drop: dict[str, set[int]],
                named: Optional[dict[int, Optional[list]]] = None) -> tuple[list[str], np.ndarray]:
    """`strip_lines_array` of a list of strings (the texts come back as they were when no line goes)."""
    if not any(drop.get(s) for s in sources):
        return texts, np.zeros(len(texts), dtype=np.int64)
    out, removed = strip_lines_array(pa.array(texts, pa.string()), np.asarray(sources, dtype=object), drop, named)
    return (out.to_pylist() if removed.any() else texts), removed


def strip_lines_array(texts: pa.Array, sources: np.ndarray, drop: dict[str, set[int]],
                      named: Optional[dict[int, Optional[list]]] = None) -> tuple[pa.Array, np.ndarray]:
    """Remove the lines listed for each document's source; returns the texts and the lines removed
    from each document. Lines are split, hashed and the documents that lose a line rebuilt by
    compiled passes over the Arrow UTF-8 buffer (`quality_loops.line_scan`, `drop_lines`). A
    document that would lose every line is left whole: all of it recurs elsewhere, which is for
    dedup to judge, not boilerplate to strip. `named` ({hash: None}) gets [text, times removed here]
    for those lines, so a report can show the lines, not only their hashes."""
    n = len(texts)
    removed = np.zeros(n, dtype=np.int64)
    texts = one_array(texts)
    present = [s for s in dict.fromkeys(sources.tolist()) if drop.get(s)]
    if not present or not n:
        return texts, removed
    lines = _split_lines(texts)
    hashes = lines.hashes
    hit = np.zeros(len(hashes), dtype=bool)
    for source in present:  # one membership test per source present
        lines_of = (sources == source)[lines.doc]
        hit[lines_of] = np.isin(hashes[lines_of], np.fromiter(drop[source], dtype=np.int64))
    hit &= lines.nonempty
    lines_per_doc = lines.nonempty_per_doc
    hits_per_doc = np.bincount(lines.doc[hit], minlength=n)
    strip = (hits_per_doc > 0) & (lines_per_doc >= MIN_DOC_LINES) & (hits_per_doc < lines_per_doc)
    if not strip.any():
        return texts, removed
    if named and hit.any():
        removed_here = hit & strip[lines.doc]
        idx = np.flatnonzero(removed_here & np.isin(hashes, np.fromiter(named, dtype=np.int64)))
        uniq, first, counts = np.unique(hashes[idx], return_index=True, return_counts=True)
        for h, k, c in zip(uniq.tolist(), idx[first].tolist(), counts.tolist()):
            text, before = named.get(h) or (lines.text(k), 0)
            named[h] = [text, before + c]
    data, offsets = utf8_buffers(texts)
    line_start = np.zeros(n, dtype=np.int64)
    np.cumsum(lines.per_doc[:-1], out=line_start[1:])
    _, strip_ws, _ = _line_tables()
    buf, new_off = quality_loops.drop_lines(data, offsets, hit, line_start, strip, strip_ws)
    removed[strip] = hits_per_doc[strip]
    if texts.null_count and texts.offset:  # a validity bitmap that does not start at bit 0
        texts = texts.take(pa.array(np.arange(n, dtype=np.int64)))
    validity = texts.buffers()[0] if texts.null_count else None
    out = pa.LargeStringArray.from_buffers(n, pa.py_buffer(new_off), pa.py_buffer(buf), validity, texts.null_count, 0)
    return out.cast(pa.string()), removed
