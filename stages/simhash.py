"""64-bit SimHash fingerprints (vectorised, equal to `simhash.Simhash`) and Hamming-distance edges.

A fingerprint's bit i is set when more than half of the document's features (shingles, counted
with repeats) have bit i set in their 64-bit hash: exactly `simhash.Simhash(features,
hashfunc=shingle_hash64).value`. Here it is a compiled bit count per document (`sketch.simhash`).

Near pairs (Hamming distance <= k) are found by cutting the 64 bits into k + 2 blocks: two
fingerprints within distance k agree exactly on at least two blocks, so the tables keyed by every
pair of blocks hold every candidate in some bucket. Inside a bucket identical fingerprints are collapsed first; a bucket with
more distinct fingerprints than `max_bucket` is compared only against a sliding window of its
neighbours in sorted order, so an oversized bucket costs O(n * window), not O(n^2).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from . import sketch
from .shingles import fmix64

BLOCK_META = pd.DataFrame({"block_key": pd.Series(dtype="int64"), "uid": pd.Series(dtype="int64"),
                           "fingerprint": pd.Series(dtype="int64")})
EDGE_META = pd.DataFrame({"a": pd.Series(dtype="int64"), "b": pd.Series(dtype="int64"),
                          "distance": pd.Series(dtype="int64")})


def fingerprints(hashes64: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """uint64 SimHash of each document from its flat feature hashes (0 for a document without features)."""
    return sketch.simhash(np.ascontiguousarray(hashes64, dtype=np.uint64), np.asarray(offsets, dtype=np.int64))


def block_masks(max_distance: int) -> list[tuple[int, int]]:
    """(shift, width) of the k + 2 blocks covering 64 bits."""
    n = max_distance + 2
    widths = [64 // n + (1 if i < 64 % n else 0) for i in range(n)]
    out, shift = [], 0
    for w in widths:
        out.append((shift, w))
        shift += w
    return out


def table_masks(max_distance: int) -> np.ndarray:
    """uint64 masks of the tables: one per pair of the k + 2 blocks. Two fingerprints within k bits
    differ in at most k blocks, so at least two blocks agree and the pair shares a bucket in that
    table (k + 1 single blocks would guarantee it too, but with keys a third as long: buckets
    thousands of times fuller on 100k documents)."""
    blocks = [((1 << w) - 1) << s for s, w in block_masks(max_distance)]
    return np.array([blocks[i] | blocks[j] for i in range(len(blocks)) for j in range(i + 1, len(blocks))], dtype=np.uint64)


def block_rows(uids: np.ndarray, fps: np.ndarray, has_features: np.ndarray, max_distance: int) -> pd.DataFrame:
    """One row per (document, table): a key naming the table and the fingerprint's bits under its
    mask (a 64-bit mix of both: a collision only adds a candidate the distance check drops), plus
    the fingerprint."""
    uids, fps = uids[has_features].astype(np.int64), fps[has_features]
    masks = table_masks(max_distance)
    with np.errstate(over="ignore"):
        salt = (np.arange(1, len(masks) + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))
        keys = fmix64((fps[:, None] & masks[None, :]) ^ salt[None, :])
    return pd.DataFrame({
        "block_key": keys.reshape(-1).view(np.int64),
        "uid": np.repeat(uids, len(masks)),
        "fingerprint": np.repeat(fps.view(np.int64), len(masks)),
    })


def popcount64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.uint64)
    x = x - ((x >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return ((x * np.uint64(0x0101010101010101)) >> np.uint64(56)).astype(np.int64)


def near_edges(rows: pd.DataFrame, max_distance: int, max_bucket: int = 1000, window: int = 64) -> pd.DataFrame:
    """Within a frame holding whole buckets: edges (larger uid -> smaller uid) between fingerprints at
    Hamming distance <= k. Ordinary buckets are compared all-pairs by a vectorised self-merge;
    a bucket with more than `max_bucket` members collapses identical fingerprints and then compares
    each distinct one with its `window` sorted neighbours only."""
    if rows.empty:
        return EDGE_META.copy()
    keys = rows["block_key"].to_numpy()
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])
    sizes = np.diff(np.r_[starts, len(keys)])
    frames = [_small_bucket_pairs(rows["uid"].to_numpy()[order], rows["fingerprint"].to_numpy()[order].view(np.uint64),
                                  starts, sizes, max_bucket, max_distance)]
    size = np.empty(len(keys), dtype=np.int64)
    size[order] = np.repeat(sizes, sizes)
    for _, bucket in rows[size > max_bucket].groupby("block_key", sort=False):
        frames.append(_oversized_bucket(bucket, max_distance, window))
    if not frames:
        return EDGE_META.copy()
    edges = pd.concat(frames, ignore_index=True)
    return edges.drop_duplicates(subset=["a", "b"], ignore_index=True).astype(EDGE_META.dtypes.to_dict())


def _small_bucket_pairs(uid: np.ndarray, fp: np.ndarray, starts: np.ndarray, sizes: np.ndarray, max_bucket: int,
                        max_distance: int) -> pd.DataFrame:
    """Every pair of every bucket of 2..`max_bucket` rows (rows sorted by key: bucket i is
    rows[starts[i]:starts[i] + sizes[i]]) within `max_distance` bits, as (larger uid, smaller uid,
    distance): the all-pairs self-merge of those buckets, made with index arithmetic."""
    sel = (sizes >= 2) & (sizes <= max_bucket)
    st, sz = starts[sel], sizes[sel]
    if not len(st):
        return EDGE_META.copy()
    pos = np.repeat(st - np.cumsum(np.r_[0, sz[:-1]]), sz) + np.arange(int(sz.sum()))  # row of each member
    later = np.repeat(sz, sz) - (pos - np.repeat(st, sz)) - 1  # members after it in its bucket
    first = np.repeat(pos, later)
    second = first + np.arange(len(first)) - np.repeat(np.cumsum(later) - later, later) + 1
    with np.errstate(over="ignore"):
        d = popcount64(fp[first] ^ fp[second])
    near = (d <= max_distance) & (uid[first] != uid[second])
    a, b = uid[first][near], uid[second][near]
    return pd.DataFrame({"a": np.maximum(a, b), "b": np.minimum(a, b), "distance": d[near]})


def _oversized_bucket(bucket: pd.DataFrame, max_distance: int, window: int) -> pd.DataFrame:
    fp = bucket["fingerprint"].to_numpy().view(np.uint64)
    uid = bucket["uid"].to_numpy()
    # identical fingerprints first: every copy links to the smallest uid holding that value
    order = np.lexsort((uid, fp))
    fp, uid = fp[order], uid[order]
    first = np.r_[True, fp[1:] != fp[:-1]]
    rep = np.maximum.accumulate(np.where(first, np.arange(len(fp)), 0))
    dup = ~first
    out = [pd.DataFrame({"a": uid[dup], "b": uid[rep[dup]], "distance": 0})]
    ufp, urep = fp[first], uid[first]
    m = len(ufp)
    i = np.repeat(np.arange(m), window)
    j = i + np.tile(np.arange(1, window + 1), m)
    ok = j < m
    i, j = i[ok], j[ok]
    with np.errstate(over="ignore"):
        d = popcount64(ufp[i] ^ ufp[j])
    near = d <= max_distance
    a, b = urep[i[near]], urep[j[near]]
    out.append(pd.DataFrame({"a": np.maximum(a, b), "b": np.minimum(a, b), "distance": d[near]}))
    return pd.concat(out, ignore_index=True)
