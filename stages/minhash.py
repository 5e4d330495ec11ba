"""MinHash signatures (vectorised, equal to datasketch's) and LSH band buckets.

Signatures follow `datasketch.MinHash`'s default scheme ("affine32"): each 32-bit shingle hash is
pre-mixed with the MurmurHash3 32-bit finaliser, then permutation k maps it to a_k * h + b_k mod 2^32
with the (a, b) that `datasketch.MinHash(num_perm, seed)` draws; a signature is the minimum per
permutation. Here that runs as one compiled loop per document (`sketch.minhash`).

LSH: the signature is cut into `bands` bands of `rows` values; each band is folded into a 64-bit
key. Documents sharing a (band, key) bucket are candidates: a small bucket yields all its pairs, a
large one an edge from each member to its smallest uid. Candidates are then verified by the true
Jaccard of their shingle sets (near_dedup.exact_jaccard), so the bands are tuned for recall; without
verification the bands weigh false positives against false negatives as datasketch.MinHashLSH does
(`lsh_optimum`, our own closed form of its choice, pinned to datasketch by tests/test_minhash_params.py).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pandas as pd

from . import sketch
from .shingles import FOLD_PRIME, fmix64

@lru_cache(maxsize=8)
def permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """datasketch's permutation parameters for (num_perm, seed), drawn as `datasketch.MinHash` draws
    them for its default scheme (affine32: odd a, any b, from numpy's RandomState(seed)) without
    importing it (the import cost every worker 1-2 s; tests/test_minhash_params.py pins the equality)."""
    gen = np.random.RandomState(seed)
    a = gen.randint(0, 1 << 31, num_perm, dtype=np.uint32) * np.uint32(2) + np.uint32(1)
    b = gen.randint(0, 1 << 32, num_perm, dtype=np.uint32)
    return a, b


def signatures(hashes64: np.ndarray, offsets: np.ndarray, num_perm: int, seed: int) -> np.ndarray:
    """(n_docs, num_perm) uint32 MinHash signatures from flat shingle hashes and offsets (a compiled
    loop per document, `sketch.minhash`).

    A document without shingles gets the all-max signature (datasketch's empty MinHash)."""
    a, b = permutations(num_perm, seed)
    return sketch.minhash(np.ascontiguousarray(hashes64, dtype=np.uint64), np.asarray(offsets, dtype=np.int64), a, b)


def char_signatures(texts, spec, num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(signatures, shingle counts) of documents shingled by character (`spec.unit == "char"`): the
    same values as `signatures(*shingles.shingle_hashes(texts, spec), ...)`, from one compiled loop
    per document over the UTF-8 buffer (`sketch.char_minhash`), without the batch's shingle array."""
    from .shingles import char_tables, utf8_buffers

    a, b = permutations(num_perm, seed)
    data, offsets = utf8_buffers(texts)
    return sketch.char_minhash(data, offsets, *char_tables(spec), spec.char_ngram, a, b)


def signature_jaccard(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Estimated Jaccard of row-aligned signature matrices: the share of equal values."""
    if x.size == 0:
        return np.zeros(len(x))
    return (x == y).mean(axis=1)


RECALL_AT_THRESHOLD = 0.998


def optimal_bands(threshold: float, num_perm: int, verify: bool = True) -> tuple[int, int]:
    """(bands, rows) for the threshold.

    With verification on, every candidate's true Jaccard is computed anyway, so a false candidate
    costs only time: the bands are the fewest-candidate choice that still makes a pair *at* the
    threshold a candidate with probability >= RECALL_AT_THRESHOLD (the most rows r, with
    bands = num_perm // r, such that 1 - (1 - t^r)^bands reaches it). Without verification,
    datasketch's optimum weighing false positives and negatives equally (`lsh_optimum`)."""
    if not verify:
        return lsh_optimum(threshold, num_perm, 0.5, 0.5)
    best = (num_perm, 1)
    for r in range(1, num_perm + 1):
        b = num_perm // r
        if 1.0 - (1.0 - threshold ** r) ** b >= RECALL_AT_THRESHOLD:
            best = (b, r)
    return best


TIE_TOLERANCE = 1e-12  # the areas agree with datasketch's numerical integrals to ~1e-14


def lsh_error_areas(threshold: float, num_perm: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every (bands b, rows r) with b * r <= num_perm, ordered by b then r, with its false-positive area
    FP = integral over [0, t] of P(s) and false-negative area FN = integral over [t, 1] of 1 - P(s), where
    P(s) = 1 - (1 - s^r)^b is the chance that a pair of Jaccard s becomes a candidate.

    Closed forms instead of numerical integration, all pairs at once: with u = s^r, a = 1/r, x = t^r,
      integral_0^1 (1 - s^r)^b ds = B(a, b + 1) / r                              (the whole area under 1 - P)
      FP = t (1 - (1 - x)^b) - b B(a + 1, b) I_x(a + 1, b)                      (integrated by parts once)
      FN = B(a, b + 1) / r - (t - FP)
    (B the beta function, I_x the regularised incomplete beta). The by-parts form keeps FP accurate
    when t^r is tiny or underflows, where t - integral_0^t (1 - s^r)^b ds would cancel to nothing; every
    area is within ~1e-14 of datasketch's scipy.integrate.quad values."""
    from scipy.special import beta, betainc  # here: only the driver plans the bands (workers skip the import)

    per_band = num_perm // np.arange(1, num_perm + 1)
    b = np.repeat(np.arange(1, num_perm + 1), per_band).astype(np.float64)
    r = np.concatenate([np.arange(1, k + 1) for k in per_band]).astype(np.float64)
    a, x = 1.0 / r, threshold ** r
    with np.errstate(divide="ignore"):  # log1p(-1) at t = 1: (1 - x)^b = 0, as it should
        fp = threshold * -np.expm1(b * np.log1p(-x)) - b * beta(a + 1.0, b) * betainc(a + 1.0, b, x)
    fn = beta(a, b + 1.0) / r - (threshold - fp)
    return b.astype(np.int64), r.astype(np.int64), np.maximum(fp, 0.0), np.maximum(fn, 0.0)


def lsh_optimum(threshold: float, num_perm: int, false_positive_weight: float = 0.5,
                false_negative_weight: float = 0.5) -> tuple[int, int]:
    """(bands, rows) minimising the weighted sum of the false-positive and false-negative areas: the
    choice datasketch.MinHashLSH makes for `weights`.

    Ties go to fewer bands, then fewer rows, as datasketch's scan does. Some are exact (at t = 0.5 with
    equal weights, 1x1, 1x2 and 2x1 all weigh 1/8), so sums within TIE_TOLERANCE of the least count as
    equal: below that the two computations differ only by rounding (over thresholds 0.001..1 and up to
    4096 permutations the closest real difference measured was 2.2e-10)."""
    b, r, fp, fn = lsh_error_areas(threshold, num_perm)
    error = fp * false_positive_weight + fn * false_negative_weight
    best = int(np.argmax(error <= error.min() + TIE_TOLERANCE))  # the first of the (near-)equal least
    return int(b[best]), int(r[best])


def estimate_floor(threshold: float, num_perm: int, sigmas: float = 5.0) -> float:
    """Below this estimated Jaccard a candidate cannot plausibly reach `threshold`: the estimate of a pair
    at the threshold has standard deviation sqrt(t(1-t)/num_perm) (0.035 at 0.8 with 128
    permutations), and this floor is `sigmas` of them lower (a true pair falls below it with
    probability < 1e-6 at 5)."""
    return max(0.0, threshold - sigmas * (threshold * (1.0 - threshold) / num_perm) ** 0.5)


def candidate_probability(similarity: float, bands: int, rows: int) -> float:
    """Chance that two documents of this Jaccard share at least one LSH bucket."""
    return 1.0 - (1.0 - similarity ** rows) ** bands


def band_keys(sig: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(n_docs, bands) 64-bit keys, each folding one band of `rows` signature values."""
    keys = np.zeros((sig.shape[0], bands), dtype=np.uint64)
    if sig.shape[0] == 0:  # an empty partition (its signature matrix may have lost its width)
        return keys
    with np.errstate(over="ignore"):
        for j in range(rows):
            keys = keys * FOLD_PRIME + sig[:, j : bands * rows : rows].astype(np.uint64)
        keys = fmix64(keys + np.arange(bands, dtype=np.uint64))  # distinct bands never share a key
    return keys


BAND_META = pd.DataFrame({"band_key": pd.Series(dtype="int64"), "uid": pd.Series(dtype="int64")})
EDGE_META = pd.DataFrame({"a": pd.Series(dtype="int64"), "b": pd.Series(dtype="int64")})


def band_rows(uids: np.ndarray, sig: np.ndarray, bands: int, rows: int) -> pd.DataFrame:
    """One row per (document, band): its bucket key. Documents without shingles are left out."""
    keep = ~(sig == np.uint32(0xFFFFFFFF)).all(axis=1)
    keys = band_keys(sig[keep], bands, rows)
    return pd.DataFrame({
        "band_key": keys.reshape(-1).view(np.int64),
        "uid": np.repeat(uids[keep].astype(np.int64), bands),
    })


def bucket_edges(rows: pd.DataFrame, all_pairs_upto: int = 8) -> pd.DataFrame:
    """Within a frame holding whole buckets: every pair of a bucket of at most `all_pairs_upto`
    members (so one chance member cannot hide a true pair behind it), and in a larger bucket an
    edge from every member to the bucket's smallest uid."""
    if rows.empty:
        return EDGE_META.copy()
    g = rows.groupby("band_key", sort=False)["uid"]
    size = g.transform("size").to_numpy()
    smallest = g.transform("min").to_numpy()
    uid = rows["uid"].to_numpy()
    big = (size > all_pairs_upto) & (uid != smallest)
    frames = [pd.DataFrame({"a": uid[big], "b": smallest[big]})]
    small = rows[(size >= 2) & (size <= all_pairs_upto)]
    if len(small):
        pairs = small.merge(small, on="band_key", suffixes=("_a", "_b"))
        pairs = pairs[pairs["uid_a"] > pairs["uid_b"]]
        frames.append(pd.DataFrame({"a": pairs["uid_a"].to_numpy(), "b": pairs["uid_b"].to_numpy()}))
    edges = pd.concat(frames, ignore_index=True).astype(EDGE_META.dtypes.to_dict())
    return edges.drop_duplicates(ignore_index=True)
