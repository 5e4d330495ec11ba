"""Line-level boilerplate: lines that recur in many documents of the same source (page headers,
licence banners, navigation), found by counting line hashes across the whole corpus.

`count_lines_buckets` emits, per partition, how many documents of each source contain each line (a
line counts once per document) as int64 arrays split by line hash into buckets; one task per bucket
sums them over the corpus (`sum_line_counts`, no string shuffle) and the filter step keeps the lines
seen in at least `min_docs` documents and `min_doc_share` of their source's documents.
`strip_lines` removes them from documents, counting what it removed per source.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import xxhash

_SIGN = 1 << 63
_BLANK_RUNS = re.compile(r"\n{3,}")  # blank lines left where removed lines were
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


@dataclass
class _Lines:
    """Every line of a batch of documents, trimmed, as one Arrow array."""

    doc: np.ndarray  # the document of each line
    per_doc: np.ndarray  # lines per document, empty ones included
    flat: pa.Array  # the trimmed lines
    nonempty: np.ndarray  # whether a trimmed line has any character

    @property
    def nonempty_per_doc(self) -> np.ndarray:
        return np.bincount(self.doc[self.nonempty], minlength=len(self.per_doc))


def _split_lines(texts: pa.Array) -> _Lines:
    lists = pc.split_pattern(texts, "\n")
    offsets = lists.offsets.to_numpy()
    per_doc = np.diff(offsets - offsets[0])
    flat = pc.utf8_trim_whitespace(pc.list_flatten(lists))
    nonempty = pc.utf8_length(flat).to_numpy(zero_copy_only=False) > 0
    return _Lines(np.repeat(np.arange(len(texts), dtype=np.int64), per_doc), per_doc, flat, nonempty)


def _hash_lines(lines: pa.Array) -> np.ndarray:
    """`line_hash` of every line, computed once per distinct line."""
    encoded = pc.dictionary_encode(lines)
    uniques = encoded.dictionary.to_pylist()
    table = np.fromiter((line_hash(u) for u in uniques), dtype=np.int64, count=len(uniques))
    return table[encoded.indices.to_numpy(zero_copy_only=False)] if len(uniques) else np.empty(0, np.int64)


def _count_part(path: str, min_width: int) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(source names, documents per source, and per (source, line) pair: source index, line hash,
    documents holding it) for one partition. Vectorised with Arrow: lines split, trimmed and measured
    as arrays; only distinct lines are hashed in Python."""
    table = pq.read_table(path, columns=["text", "source"])
    sources = pc.fill_null(table.column("source").combine_chunks().cast(pa.string()), "")
    src_codes = pc.dictionary_encode(sources)
    src_names = src_codes.dictionary.to_pylist()
    doc_src = src_codes.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    per_source = np.bincount(doc_src, minlength=len(src_names))
    lines = _split_lines(table.column("text").combine_chunks())
    # a one- or two-line document is content (or a duplicate), not a page with boilerplate
    keep = (lines.nonempty_per_doc[lines.doc] >= MIN_DOC_LINES) & (line_widths(lines.flat) >= min_width)
    hashes = _hash_lines(lines.flat.filter(pa.array(keep)))
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
    """Remove the lines listed for each document's source; returns the texts and the lines removed
    from each document. Lines are split and hashed as Arrow arrays (distinct lines only); Python
    only rejoins the documents that lose a line. A document that would lose every line is left
    whole: all of it recurs elsewhere, which is for dedup to judge, not boilerplate to strip.
    `named` ({hash: None}) gets [text, times removed here] for those lines, so a report can show
    the lines, not only their hashes."""
    removed = np.zeros(len(texts), dtype=np.int64)
    wanted = [i for i, s in enumerate(sources) if drop.get(s)]
    if not wanted:
        return texts, removed
    lines = _split_lines(pa.array([texts[i] for i in wanted], pa.string()))
    hashes = _hash_lines(lines.flat)
    # one membership test per source present
    doc_source = np.array([sources[i] for i in wanted], dtype=object)
    hit = np.zeros(len(hashes), dtype=bool)
    for source in set(doc_source.tolist()):
        lines_of = (doc_source == source)[lines.doc]
        hit[lines_of] = np.isin(hashes[lines_of], np.fromiter(drop[source], dtype=np.int64))
    hit &= lines.nonempty
    lines_per_doc = lines.nonempty_per_doc
    hits_per_doc = np.bincount(lines.doc[hit], minlength=len(wanted))
    strip = (hits_per_doc > 0) & (lines_per_doc >= MIN_DOC_LINES) & (hits_per_doc < lines_per_doc)
    if named and hit.any():
        removed_here = hit & strip[lines.doc]
        idx = np.flatnonzero(removed_here & np.isin(hashes, np.fromiter(named, dtype=np.int64)))
        uniq, first, counts = np.unique(hashes[idx], return_index=True, return_counts=True)
        for h, k, c in zip(uniq.tolist(), idx[first].tolist(), counts.tolist()):
            text, before = named.get(h) or (lines.flat[k].as_py(), 0)
            named[h] = [text, before + c]
    out = list(texts)
    starts = np.concatenate([[0], np.cumsum(lines.per_doc)])
    for j in np.flatnonzero(strip):
        i = wanted[j]
        bad = hit[starts[j]:starts[j + 1]]
        kept = (line for line, b in zip(texts[i].split("\n"), bad) if not b)
        out[i] = _BLANK_RUNS.sub("\n\n", "\n".join(kept)).strip()
        removed[i] = int(bad.sum())
    return out, removed
