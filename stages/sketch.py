"""Compiled per-document loops behind shingling, MinHash and SimHash (numba, cached on disk).

Why compiled: the numpy formulation of the same arithmetic spent most of near dedup's time making
and gathering whole-batch temporaries (every window of every document, then the documents' valid
windows, then a (permutations x shingles) matrix per chunk). A loop per document does each shingle
once: the n-gram hash rolls along the document, MinHash keeps one running minimum per permutation,
SimHash one bit count per bit. The definitions are unchanged: `shingles.shingle_hash64`,
`datasketch.MinHash` and `simhash.Simhash` remain the references the tests compare against.

Every function takes and returns plain numpy arrays; arithmetic is uint64 with wrap-around, the
same as the numpy code it replaces.
"""
from __future__ import annotations

import numba as nb
import numpy as np

_U = nb.uint64
_M32 = 0xFFFFFFFF


@nb.njit(inline="always")
def decode_utf8(data, i):
    """(code point, index of the next one) of the UTF-8 sequence at `data[i]` (Arrow string bytes,
    valid UTF-8): the one decoder of every compiled loop over text here and in `quality_loops`."""
    c = np.int64(data[i])
    if c < 0x80:
        return c, i + 1
    if c < 0xE0:
        return ((c & 0x1F) << 6) | (np.int64(data[i + 1]) & 0x3F), i + 2
    if c < 0xF0:
        return ((c & 0x0F) << 12) | ((np.int64(data[i + 1]) & 0x3F) << 6) | (np.int64(data[i + 2]) & 0x3F), i + 3
    return ((((c & 0x07) << 18) | ((np.int64(data[i + 1]) & 0x3F) << 12) | ((np.int64(data[i + 2]) & 0x3F) << 6)
             | (np.int64(data[i + 3]) & 0x3F)), i + 4)


@nb.njit(cache=True, nogil=True)
def utf8_points(data: np.ndarray, offsets: np.ndarray, drop: np.ndarray, known: np.ndarray) -> tuple:
    """Decode UTF-8 strings (Arrow value buffer and int64 offsets) into the code points a document
    keeps (`drop[c]` zero), with per-document start offsets, and the count of code points not yet
    `known` (marked 2 here, so the caller hashes each code point, xxh3 of its UTF-8, once per process)."""
    n = len(offsets) - 1
    points = np.empty(offsets[n] - offsets[0], dtype=np.uint32)
    starts = np.zeros(n + 1, dtype=np.int64)
    n_new = 0
    k = 0
    for d in range(n):
        i, end = offsets[d], offsets[d + 1]
        while i < end:
            c, i = decode_utf8(data, i)
            if drop[c]:
                continue
            if known[c] == 0:
                known[c] = 2
                n_new += 1
            points[k] = c
            k += 1
        starts[d + 1] = k
    return points[:k], starts, n_new


@nb.njit(cache=True, nogil=True)
def lookup(points: np.ndarray, lut: np.ndarray) -> np.ndarray:
    """lut[points] as uint64 component hashes."""
    out = np.empty(len(points), dtype=np.uint64)
    for i in range(len(points)):
        out[i] = lut[points[i]]
    return out


@nb.njit(inline="always")
def _fmix64(x):
    x ^= x >> _U(33)
    x *= _U(0xFF51AFD7ED558CCD)
    x ^= x >> _U(33)
    x *= _U(0xC4CEB9FE1A85EC53)
    return x ^ (x >> _U(33))


@nb.njit(cache=True, nogil=True)
def fold_ngrams(comp: np.ndarray, starts: np.ndarray, ngram: np.ndarray) -> tuple:
    """(hashes, offsets): each document's n-gram hashes in text order (n = ngram[d]), the fold
    sum_j comp[i + j] * P^(n-1-j) mod 2^64 finished with fmix64; a document with fewer than n
    components but at least one is one shingle folding all of them."""
    n_docs = len(starts) - 1
    offsets = np.zeros(n_docs + 1, dtype=np.int64)
    for d in range(n_docs):
        m = starts[d + 1] - starts[d]
        offsets[d + 1] = offsets[d] + (m - ngram[d] + 1 if m >= ngram[d] else (1 if m > 0 else 0))
    out = np.empty(offsets[n_docs], dtype=np.uint64)
    prime = _U(0x100000001B3)
    for d in range(n_docs):
        s, e = starts[d], starts[d + 1]
        if e == s:
            continue
        n = ngram[d]
        w = n if e - s >= n else e - s
        f = _U(0)
        top = _U(1)  # P^(w-1): the weight of the component leaving the window
        for j in range(w):
            f = f * prime + comp[s + j]
            if j > 0:
                top *= prime
        o = offsets[d]
        out[o] = _fmix64(f)
        for i in range(s + w, e):
            f = (f - comp[i - n] * top) * prime + comp[i]
            o += 1
            out[o] = _fmix64(f)
    return out, offsets


@nb.njit(cache=True, nogil=True)
def minhash(hashes: np.ndarray, offsets: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(n_docs, num_perm) uint32: datasketch's affine32 scheme on the low 32 bits of each shingle
    hash (MurmurHash3's fmix32, then a_k * h + b_k mod 2^32, minimum per permutation); a document
    without shingles keeps the all-max signature.

    Loop order: each document's shingles are pre-mixed once into a contiguous uint32 buffer, then
    every permutation is one branch-free `min` reduction over that buffer, which LLVM vectorises
    (8 lanes with AVX2); the shingle-outer loop with a per-permutation compare-and-store did not
    vectorise and was 10-20x slower on long documents (the same minima either way)."""
    n_docs = len(offsets) - 1
    num_perm = len(a)
    sig = np.full((n_docs, num_perm), np.uint32(_M32), dtype=np.uint32)
    longest = 0
    for d in range(n_docs):
        longest = max(longest, offsets[d + 1] - offsets[d])
    h32 = np.empty(longest, dtype=np.uint32)
    for d in range(n_docs):
        s, e = offsets[d], offsets[d + 1]
        if e == s:
            continue
        n = e - s
        for i in range(n):
            h = hashes[s + i] & _U(_M32)
            h ^= h >> _U(16)
            h = (h * _U(0x85EBCA6B)) & _U(_M32)
            h ^= h >> _U(13)
            h = (h * _U(0xC2B2AE35)) & _U(_M32)
            h32[i] = np.uint32(h ^ (h >> _U(16)))
        for k in range(num_perm):
            ak = a[k]
            bk = b[k]
            best = np.uint32(_M32)
            for i in range(n):
                best = min(best, np.uint32(ak * h32[i] + bk))
            sig[d, k] = best
    return sig


@nb.njit(cache=True, nogil=True)
def char_components(data: np.ndarray, offsets: np.ndarray, lower: np.ndarray, drop: np.ndarray,
                    lut: np.ndarray) -> tuple:
    """(component hashes, per-document starts) of character shingling in one pass over the UTF-8
    buffer: each code point is mapped by `lower` (Arrow's utf8_lower, code point by code point, or
    the identity), dropped when `drop` says so, and replaced by its hash `lut[c]`. The same values as
    utf8_lower, then `utf8_points`, then `lookup`, without their two intermediate arrays."""
    n = len(offsets) - 1
    comp = np.empty(offsets[n] - offsets[0], dtype=np.uint64)
    starts = np.zeros(n + 1, dtype=np.int64)
    k = 0
    for d in range(n):
        i, end = offsets[d], offsets[d + 1]
        while i < end:
            c, i = decode_utf8(data, i)
            c = lower[c]
            if drop[c]:
                continue
            comp[k] = lut[c]
            k += 1
        starts[d + 1] = k
    return comp[:k], starts


@nb.njit(cache=True, nogil=True)
def char_minhash(data: np.ndarray, offsets: np.ndarray, lower: np.ndarray, drop: np.ndarray, lut: np.ndarray,
                 ngram: int, a: np.ndarray, b: np.ndarray) -> tuple:
    """(signatures, shingle counts): `minhash(*fold_ngrams(*char_components(...)))` fused per document.
    A document's components and its shingles' pre-mixed 32-bit hashes live in two buffers reused by
    every document, so no array of the whole batch's shingles is written and read back (for long
    documents most of the time went to those arrays' memory traffic and first-touch page faults)."""
    n_docs = len(offsets) - 1
    num_perm = len(a)
    sig = np.full((n_docs, num_perm), np.uint32(_M32), dtype=np.uint32)
    counts = np.zeros(n_docs, dtype=np.int64)
    longest = 0
    for d in range(n_docs):
        longest = max(longest, offsets[d + 1] - offsets[d])
    comp = np.empty(longest, dtype=np.uint64)
    h32 = np.empty(longest, dtype=np.uint32)
    prime = _U(0x100000001B3)
    for d in range(n_docs):
        i, end = offsets[d], offsets[d + 1]
        m = 0
        while i < end:
            c, i = decode_utf8(data, i)
            c = lower[c]
            if drop[c]:
                continue
            comp[m] = lut[c]
            m += 1
        if m == 0:
            continue
        w = ngram if m >= ngram else m
        f = _U(0)
        top = _U(1)  # P^(w-1): the weight of the component leaving the window
        for j in range(w):
            f = f * prime + comp[j]
            if j > 0:
                top *= prime
        n = 0
        for j in range(w - 1, m):
            if j >= w:
                f = (f - comp[j - ngram] * top) * prime + comp[j]
            h = _fmix64(f) & _U(_M32)
            h ^= h >> _U(16)
            h = (h * _U(0x85EBCA6B)) & _U(_M32)
            h ^= h >> _U(13)
            h = (h * _U(0xC2B2AE35)) & _U(_M32)
            h32[n] = np.uint32(h ^ (h >> _U(16)))
            n += 1
        counts[d] = n
        for k in range(num_perm):
            ak = a[k]
            bk = b[k]
            best = np.uint32(_M32)
            for t in range(n):
                best = min(best, np.uint32(ak * h32[t] + bk))
            sig[d, k] = best
    return sig, counts


@nb.njit(cache=True, nogil=True)
def simhash(hashes: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """uint64 SimHash per document: bit j set when more than half of its shingles (with repeats)
    have bit j set; 0 for a document without shingles."""
    n_docs = len(offsets) - 1
    out = np.zeros(n_docs, dtype=np.uint64)
    counts = np.zeros(64, dtype=np.int64)
    for d in range(n_docs):
        n = offsets[d + 1] - offsets[d]
        if n == 0:
            continue
        counts[:] = 0
        for i in range(offsets[d], offsets[d + 1]):
            h = hashes[i]
            for j in range(64):
                counts[j] += np.int64((h >> _U(j)) & _U(1))
        fp = _U(0)
        for j in range(64):
            if 2 * counts[j] > n:
                fp |= _U(1) << _U(j)
        out[d] = fp
    return out


@nb.njit(inline="always")
def _sorted_jaccard(x, y):
    """Jaccard of the distinct values of two sorted arrays, by one merge; 1.0 when both are empty."""
    i = j = inter = union = 0
    while i < len(x) or j < len(y):
        if j == len(y) or (i < len(x) and x[i] < y[j]):
            v = x[i]
        else:
            v = y[j]
        in_x = i < len(x) and x[i] == v
        in_y = j < len(y) and y[j] == v
        union += 1
        if in_x and in_y:
            inter += 1
        while i < len(x) and x[i] == v:
            i += 1
        while j < len(y) and y[j] == v:
            j += 1
    return inter / union if union > 0 else 1.0


@nb.njit(inline="always")
def _table_size(n):
    size = 16
    while size < 2 * n:
        size *= 2
    return size


@nb.njit(inline="always")
def _set_jaccard(x, y, keys, state, stamp, gen):
    """Jaccard of the distinct values of x and y through one open-addressing table (linear probing on
    the low bits of the already-mixed 64-bit hashes): x's values are inserted, then y's counted as
    new, shared or repeated. O(len(x) + len(y)), where sorting both was O((n) log n) and most of the
    exact check's time. The same integer counts as `_sorted_jaccard`, so the same float; 1.0 when
    both are empty. `stamp[slot] == gen` marks a slot used by this pair, so the table is never cleared."""
    mask = np.uint64(_table_size(len(x) + len(y)) - 1)  # the pair's own share of the table: it stays in cache
    union = 0
    inter = 0
    for i in range(len(x)):
        v = x[i]
        j = v & mask
        while True:
            if stamp[j] != gen:
                stamp[j] = gen
                keys[j] = v
                state[j] = 1
                union += 1
                break
            if keys[j] == v:
                break
            j = (j + np.uint64(1)) & mask
    for i in range(len(y)):
        v = y[i]
        j = v & mask
        while True:
            if stamp[j] != gen:
                stamp[j] = gen
                keys[j] = v
                state[j] = 2
                union += 1
                break
            if keys[j] == v:
                if state[j] == 1:
                    state[j] = 3
                    inter += 1
                break
            j = (j + np.uint64(1)) & mask
    return inter / union if union > 0 else 1.0


@nb.njit(cache=True, nogil=True)
def pair_jaccard(hashes_a: np.ndarray, offsets_a: np.ndarray, hashes_b: np.ndarray, offsets_b: np.ndarray) -> np.ndarray:
    """Jaccard of the hash sets of row-aligned documents (pair i: a's document i and b's document i),
    distinct values counted through one hash table per pair (`_set_jaccard`); 1.0 when both are empty."""
    n = len(offsets_a) - 1
    out = np.empty(n, dtype=np.float64)
    longest = 0
    for p in range(n):
        longest = max(longest, offsets_a[p + 1] - offsets_a[p] + offsets_b[p + 1] - offsets_b[p])
    size = _table_size(longest)
    keys = np.empty(size, dtype=np.uint64)
    state = np.zeros(size, dtype=np.uint8)
    stamp = np.zeros(size, dtype=np.int32)
    for p in range(n):
        out[p] = _set_jaccard(hashes_a[offsets_a[p]:offsets_a[p + 1]], hashes_b[offsets_b[p]:offsets_b[p + 1]],
                              keys, state, stamp, np.int32(p + 1))
    return out


@nb.njit(cache=True, nogil=True)
def pair_jaccard_indexed(hashes: np.ndarray, offsets: np.ndarray, ia: np.ndarray, ib: np.ndarray) -> np.ndarray:
    """`pair_jaccard` of documents given once (pair p: documents ia[p] and ib[p] of one flat set)."""
    out = np.empty(len(ia), dtype=np.float64)
    longest = 0
    for p in range(len(ia)):
        longest = max(longest, offsets[ia[p] + 1] - offsets[ia[p]] + offsets[ib[p] + 1] - offsets[ib[p]])
    size = _table_size(longest)
    keys = np.empty(size, dtype=np.uint64)
    state = np.zeros(size, dtype=np.uint8)
    stamp = np.zeros(size, dtype=np.int32)
    for p in range(len(ia)):
        out[p] = _set_jaccard(hashes[offsets[ia[p]]:offsets[ia[p] + 1]], hashes[offsets[ib[p]]:offsets[ib[p] + 1]],
                              keys, state, stamp, np.int32(p + 1))
    return out


@nb.njit(inline="always")
def _is_hspace(c):
    """normalize.OTHER_HSPACE or the ASCII space: what the folding turns into one space."""
    return (c == 0x20 or c == 0x09 or c == 0xA0 or c == 0x1680 or (0x2000 <= c <= 0x200A) or c == 0x202F
            or c == 0x205F or c == 0x3000)


@nb.njit(cache=True, nogil=True)
def fold_whitespace(data: np.ndarray, offsets: np.ndarray) -> tuple:
    """(bytes, int64 offsets): the four regex passes of `normalize.fold_whitespace_array` before its
    trim, in one loop per document (each pass was a full RE2 pass over the part): horizontal spaces
    become one space, a space next to a newline goes, runs of three or more newlines become two. The
    exact hash folds the already-normalised text with it; a test compares it with the regex passes."""
    n = len(offsets) - 1
    out = np.empty(offsets[n] - offsets[0], dtype=np.uint8)
    out_offsets = np.zeros(n + 1, dtype=np.int64)
    k = 0
    for d in range(n):
        i, end = offsets[d], offsets[d + 1]
        prev = 0  # the previous token after collapsing spaces: 0 start / other, 1 space, 2 newline
        pending = False  # a space to write before the next other character
        nl_run = 0
        while i < end:
            b0 = data[i]
            if b0 < 0x80 and b0 != 0x20 and b0 != 0x09 and b0 != 0x0A:  # the common case: an ASCII "other"
                if pending:
                    out[k] = 0x20
                    k += 1
                    pending = False
                out[k] = b0
                k += 1
                nl_run = 0
                prev = 0
                i += 1
                continue
            c, j = decode_utf8(data, i)
            if _is_hspace(c):
                if prev != 1:
                    pending = prev != 2  # a space right after a newline goes
                    prev = 1
            elif c == 0x0A:
                pending = False  # a space right before a newline goes
                nl_run += 1
                if nl_run <= 2:
                    out[k] = 0x0A
                    k += 1
                prev = 2
            else:
                if pending:
                    out[k] = 0x20
                    k += 1
                    pending = False
                for b in range(i, j):
                    out[k] = data[b]
                    k += 1
                nl_run = 0
                prev = 0
            i = j
        if pending:  # trailing: the trim after these passes removes it
            out[k] = 0x20
            k += 1
        out_offsets[d + 1] = k
    return out[:k], out_offsets
