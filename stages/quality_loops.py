"""Compiled per-document loops behind the quality scores (numba, cached on disk).

Why compiled: the numpy formulation (`quality.py` before issue 19) built whole-batch temporaries for
every character (a UTF-32 copy of the batch, its document index, class and run arrays) and, for
Gopher's repetition scores, every n-gram window of every document with a hash-table pass per size.
A loop per document reads the Arrow UTF-8 buffer once and keeps one small hash table per document.
The definitions are unchanged (the tests compare against the straightforward Python reference), and
every count is an integer, so the scores are bit-for-bit those of the numpy code.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Callable

import numba as nb
import numpy as np

from .sketch import decode_utf8
from .xxh3 import xxh3_64

CODE_POINTS = 0x110000


def code_point_tables(name: str, key: str, build: Callable[[np.ndarray], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per-code-point tables a compiled loop reads: `build(points)` (every code point but surrogates)
    returns arrays of CODE_POINTS entries taken from the kernels the loop must agree with. Built once
    per `key` (what they depend on: library versions, patterns) and cached on disk beside the compiled
    loops; a read-only install builds them once per process. Loaded once per process."""
    cache = Path(__file__).resolve().parent / "__pycache__" / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:12]}.npz"
    if str(cache) not in _LOADED:
        _LOADED[str(cache)] = _load_or_build(cache, build)
    return _LOADED[str(cache)]


_LOADED: dict[str, dict[str, np.ndarray]] = {}


def _load_or_build(cache: Path, build: Callable[[np.ndarray], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    try:
        with np.load(cache) as z:
            tables = {k: z[k] for k in z.files}
        if tables and all(len(t) == CODE_POINTS for t in tables.values()):
            return tables
    except (OSError, ValueError, KeyError):
        pass
    tables = build(np.concatenate([np.arange(0xD800), np.arange(0xE000, CODE_POINTS)]))
    try:
        cache.parent.mkdir(exist_ok=True)
        tmp = cache.with_name(f"{cache.stem}.{os.getpid()}.tmp.npz")
        np.savez(tmp, **tables)
        os.replace(tmp, cache)
    except OSError:
        pass
    return tables


_GOLDEN = 0x9E3779B97F4A7C15


@nb.njit(cache=True, nogil=True)
def char_classes(data: np.ndarray, offsets: np.ndarray, cls_table: np.ndarray, ts_table: np.ndarray,
                 n_classes: int, first_letter: int, last_letter: int) -> tuple:
    """Per document: code points per class (n x n_classes), traditional-only and simplified-only
    characters, and the longest run of one repeated letter (classes first_letter..last_letter),
    decoded from an Arrow string array's value buffer and int64 offsets."""
    n = len(offsets) - 1
    counts = np.zeros((n, n_classes), dtype=np.int64)
    trad = np.zeros(n, dtype=np.int64)
    simp = np.zeros(n, dtype=np.int64)
    max_run = np.zeros(n, dtype=np.int64)
    for d in range(n):
        i, end = offsets[d], offsets[d + 1]
        prev = -1
        run = 0
        best = 0
        while i < end:
            c, i = decode_utf8(data, i)
            k = np.int64(cls_table[c])
            counts[d, k] += 1
            t = ts_table[c]
            if t == 1:
                trad[d] += 1
            elif t == 2:
                simp[d] += 1
            if first_letter <= k <= last_letter:
                if c == prev:
                    run += 1
                else:
                    run = 1
                if run > best:
                    best = run
            else:
                run = 0
            prev = c
        max_run[d] = best
    return counts, trad, simp, max_run


@nb.njit(inline="always")
def _fmix64(x):
    x ^= x >> np.uint64(33)
    x *= np.uint64(0xFF51AFD7ED558CCD)
    x ^= x >> np.uint64(33)
    x *= np.uint64(0xC4CEB9FE1A85EC53)
    return x ^ (x >> np.uint64(33))


@nb.njit(inline="always")
def _count_windows(comp, lo, cand, n_cand, prev_w, w, hv, keys, cnt, stamp, generation, slot_of, later, mask):
    """Occurrences of every candidate window's n-gram in one document (an open-addressing table of
    `mask` + 1 slots, sized to the document so a short one stays in cache; slots of an older
    `generation` are free), and whether an earlier window had the same n-gram. `hv[j]` holds the
    fold of candidate j's first `prev_w` components (the previous size's key) and is extended to `w`
    components here: the same key, without refolding the whole window per size."""
    P = np.uint64(0x100000001B3)
    for j in range(n_cand):
        s = lo + cand[j]
        h = hv[j]
        for q in range(prev_w, w):
            h = h * P + comp[s + q]
        hv[j] = h
        slot = _fmix64(h) & mask
        while stamp[slot] == generation and keys[slot] != h:
            slot = (slot + np.uint64(1)) & mask
        if stamp[slot] != generation:
            stamp[slot] = generation
            keys[slot] = h
            cnt[slot] = 0
        later[j] = cnt[slot] > 0
        cnt[slot] += 1
        slot_of[j] = np.int64(slot)


@nb.njit(inline="always")
def _top_share(comp_len, lo, cand, n_cand, w, cnt, slot_of):
    """Characters of the most frequent repeated n-gram times its count (0: none repeats)."""
    best = 0.0
    for j in range(n_cand):
        c = cnt[slot_of[j]]
        if c > 1:
            chars = 0.0
            s = lo + cand[j]
            for q in range(w):
                chars += comp_len[s + q]
            v = c * chars
            if v > best:
                best = v
    return best


@nb.njit(inline="always")
def _covered(comp_len, lo, m, cand, n_cand, w, later, diff):
    """Characters of the components covered by a later occurrence of a repeated n-gram."""
    for j in range(m + 1):
        diff[j] = 0
    any_later = False
    for j in range(n_cand):
        if later[j]:
            diff[cand[j]] += 1
            diff[cand[j] + w] -= 1
            any_later = True
    covered = 0.0
    if any_later:
        run = 0
        for j in range(m):
            run += diff[j]
            if run > 0:
                covered += comp_len[lo + j]
    return covered


@nb.njit(cache=True, nogil=True)
def ngram_repetition(comp: np.ndarray, starts: np.ndarray, comp_len: np.ndarray, sizes: np.ndarray,
                     n_top: int) -> np.ndarray:
    """Gopher's repetition scores, one column per n-gram size (sizes: n_docs x n_sizes, the window
    length of each size for each document, in increasing order): for the first `n_top` sizes the
    share of component characters in the most frequent repeated n-gram times its count, for the
    others the share of component characters covered by later occurrences of repeated n-grams.

    An n-gram is the polynomial fold of its components' hashes (sum c[s+j] P^(n-1-j), mod 2^64): the
    key the numpy code compared. Each size only looks at the window starts whose previous-size window
    repeated (an n-gram occurring twice starts with an (n-1)-gram occurring twice)."""
    n = len(starts) - 1
    n_sizes = sizes.shape[1]
    out = np.zeros((n, n_sizes), dtype=np.float64)
    longest = 0
    for d in range(n):
        longest = max(longest, starts[d + 1] - starts[d])
    cap = 16
    while cap < 2 * longest:
        cap *= 2
    keys = np.zeros(cap, dtype=np.uint64)
    cnt = np.zeros(cap, dtype=np.int64)
    stamp = np.full(cap, -1, dtype=np.int64)
    cand = np.empty(longest, dtype=np.int64)
    hv = np.empty(longest, dtype=np.uint64)
    slot_of = np.empty(longest, dtype=np.int64)
    later = np.empty(longest, dtype=np.bool_)
    diff = np.zeros(longest + 1, dtype=np.int64)
    generation = 0
    for d in range(n):
        lo, hi = starts[d], starts[d + 1]
        m = hi - lo
        if m == 0:
            continue
        total = 0.0
        for j in range(lo, hi):
            total += comp_len[j]
        denom = max(total, 1.0)
        n_cand = m
        for j in range(m):
            cand[j] = j
            hv[j] = 0
        dcap = 16
        while dcap < 2 * m:
            dcap *= 2
        mask = np.uint64(dcap - 1)
        prev_w = 0
        for z in range(n_sizes):
            w = sizes[d, z]
            # drop the starts whose window runs past the end
            k = 0
            for j in range(n_cand):
                if cand[j] + w <= m:
                    cand[k] = cand[j]
                    hv[k] = hv[j]
                    k += 1
            n_cand = k
            if n_cand == 0:
                break
            generation += 1
            _count_windows(comp, lo, cand, n_cand, prev_w, w, hv, keys, cnt, stamp, generation, slot_of, later, mask)
            prev_w = w
            if z < n_top:
                out[d, z] = _top_share(comp_len, lo, cand, n_cand, w, cnt, slot_of) / denom
            else:
                out[d, z] = _covered(comp_len, lo, m, cand, n_cand, w, later, diff) / denom
            out[d, z] = min(out[d, z], 1.0)
            k = 0
            for j in range(n_cand):
                if cnt[slot_of[j]] > 1:
                    cand[k] = cand[j]
                    hv[k] = hv[j]
                    k += 1
            n_cand = k
    return out


# flags of the per-code-point table `text_counts` reads (quality._text_tables derives them from Arrow/RE2)
WS, WORD_SEP, LETTER, ZH_STOP, MOJIBAKE_START, PUNCT = 1, 2, 4, 8, 16, 32


@nb.njit(cache=True, nogil=True)
def text_counts(data: np.ndarray, offsets: np.ndarray, flags: np.ndarray, lowmap: np.ndarray, trim: np.ndarray,
                stop_words: np.ndarray, stop_len: np.ndarray) -> np.ndarray:
    """Per document (rows) the counts score_texts took from Arrow kernels, in one pass over the UTF-8:
    0 runs of word characters (not WORD_SEP), 1 ZH_STOP characters, 2 '#', 3 ellipses ('...' or '…',
    non-overlapping), 4 whether a MOJIBAKE_START character occurs, and over the tokens of Arrow's
    utf8_split_whitespace (a run of WS characters separates; a run of two or more at the very end
    also leaves one more empty token): 5 tokens, 6 their characters, 7 tokens holding a LETTER,
    8 tokens that are a stop word once lowercased (`lowmap`: the ASCII a character lowercases to, 0
    for anything else) and trimmed of `trim` characters at both ends."""
    n = len(offsets) - 1
    out = np.zeros((n, 9), dtype=np.int64)
    longest = 0
    for d in range(n):
        longest = max(longest, offsets[d + 1] - offsets[d])
    buf = np.empty(longest + 1, dtype=np.uint8)
    for d in range(n):
        i, end = offsets[d], offsets[d + 1]
        in_word = False
        dots = 0
        ws_run = 0
        tokens = 1
        tok_len = 0  # characters of the current token; buf holds its lowercased ASCII (0: not ASCII)
        tok_alpha = False
        while True:
            if i < end:
                c, i = decode_utf8(data, i)
                f = flags[c]
            else:
                c = -1
                f = WS  # the end closes the last token
            if c >= 0:
                if f & WORD_SEP:
                    in_word = False
                elif not in_word:
                    in_word = True
                    out[d, 0] += 1
                if f & ZH_STOP:
                    out[d, 1] += 1
                if f & MOJIBAKE_START:
                    out[d, 4] = 1
                if c == 0x23:
                    out[d, 2] += 1
                if c == 0x2E:
                    dots += 1
                    if dots == 3:
                        out[d, 3] += 1
                        dots = 0
                else:
                    dots = 0
                    if c == 0x2026:
                        out[d, 3] += 1
            if f & WS:
                if tok_len > 0:  # a token ends
                    out[d, 6] += tok_len
                    if tok_alpha:
                        out[d, 7] += 1
                    if _is_stop(buf, tok_len, trim, stop_words, stop_len):
                        out[d, 8] += 1
                    tok_len = 0
                    tok_alpha = False
                if c < 0:
                    break
                if ws_run == 0:
                    tokens += 1
                ws_run += 1
            else:
                if ws_run > 0:
                    ws_run = 0
                buf[tok_len] = lowmap[c]
                tok_len += 1
                if f & LETTER:
                    tok_alpha = True
        # a whitespace run reaching the end (ws_run counts it) of two or more leaves one more empty token
        if ws_run >= 2:
            tokens += 1
        out[d, 5] = tokens
    return out


@nb.njit(inline="always")
def _is_stop(buf, length, trim, stop_words, stop_len):
    lo, hi = 0, length
    while lo < hi and buf[lo] != 0 and trim[buf[lo]]:
        lo += 1
    while hi > lo and buf[hi - 1] != 0 and trim[buf[hi - 1]]:
        hi -= 1
    size = hi - lo
    for k in range(len(stop_len)):
        if stop_len[k] != size:
            continue
        same = True
        for q in range(size):
            if buf[lo + q] != stop_words[k, q]:
                same = False
                break
        if same:
            return True
    return False


@nb.njit(inline="always")
def _char_start_before(data, j):
    """Index of the first byte of the UTF-8 character that ends just before `j`."""
    j -= 1
    while (data[j] & 0xC0) == 0x80:
        j -= 1
    return j


@nb.njit(inline="always")
def _trim(data, a, b, ws):
    """[a, b) without the characters `ws` marks at either end."""
    while a < b:
        c, nxt = decode_utf8(data, a)
        if not ws[c]:
            break
        a = nxt
    while b > a:
        j = _char_start_before(data, b)
        c, _ = decode_utf8(data, j)
        if not ws[c]:
            break
        b = j
    return a, b


@nb.njit(cache=True, nogil=True)
def line_scan(data: np.ndarray, offsets: np.ndarray, trim_ws: np.ndarray, strip_ws: np.ndarray,
              wide: np.ndarray) -> tuple:
    """Every line of every document (split on "\\n", as Arrow's split_pattern: a document of k
    newlines has k + 1 lines), in one pass over an Arrow UTF-8 buffer: lines per document, and per
    line its byte range trimmed of `trim_ws` characters (Arrow's utf8_trim_whitespace), its display
    width there (characters, `wide` ones counting 2), and the xxh3-64 of that range further stripped
    of `strip_ws` characters (Python's str.strip), as a signed int64 (`boilerplate.line_hash`)."""
    n = len(offsets) - 1
    per_doc = np.zeros(n, dtype=np.int64)
    total = 0
    for d in range(n):
        k = 1
        for i in range(offsets[d], offsets[d + 1]):
            if data[i] == 10:
                k += 1
        per_doc[d] = k
        total += k
    lo = np.empty(total, dtype=np.int64)
    hi = np.empty(total, dtype=np.int64)
    width = np.empty(total, dtype=np.int64)
    hashes = np.empty(total, dtype=np.int64)
    sign = np.uint64(1) << np.uint64(63)
    k = 0
    for d in range(n):
        start, end = offsets[d], offsets[d + 1]
        s = start
        while True:
            e = s
            while e < end and data[e] != 10:
                e += 1
            a, b = _trim(data, s, e, trim_ws)
            lo[k] = a
            hi[k] = b
            w = 0
            i = a
            while i < b:
                c, i = decode_utf8(data, i)
                w += 1 + wide[c]
            width[k] = w
            a2, b2 = _trim(data, a, b, strip_ws)
            hashes[k] = np.int64(xxh3_64(data, a2, b2) ^ sign)
            k += 1
            if e >= end:
                break
            s = e + 1
    return per_doc, lo, hi, width, hashes


@nb.njit(cache=True, nogil=True)
def word_hashes(data: np.ndarray, offsets: np.ndarray, docs: np.ndarray, sep: np.ndarray) -> tuple:
    """The words of documents `docs` (maximal runs of characters that are not `sep`: whitespace,
    punctuation and symbols) as the xxh3-64 of their UTF-8 bytes, each word's length in characters,
    and the word count per document: no word is made a string."""
    total = 0
    for d in docs:
        total += offsets[d + 1] - offsets[d]
    hashes = np.empty(total, dtype=np.uint64)
    word_len = np.zeros(total, dtype=np.int64)
    counts = np.zeros(len(docs), dtype=np.int64)
    w = 0
    for j in range(len(docs)):
        d = docs[j]
        i, end = offsets[d], offsets[d + 1]
        start = -1
        length = 0
        while i < end:
            here = i
            c, i = decode_utf8(data, i)
            if sep[c]:
                if start >= 0:
                    hashes[w] = xxh3_64(data, start, here)
                    word_len[w] = length
                    w += 1
                    start = -1
                continue
            if start < 0:
                start = here
                length = 0
                counts[j] += 1
            length += 1
        if start >= 0:
            hashes[w] = xxh3_64(data, start, end)
            word_len[w] = length
            w += 1
    return hashes[:w], word_len[:w], counts


@nb.njit(cache=True, nogil=True)
def drop_lines(data: np.ndarray, offsets: np.ndarray, line_hit: np.ndarray, line_start: np.ndarray,
               strip: np.ndarray, strip_ws: np.ndarray) -> tuple:
    """Documents with the lines `line_hit` marks removed where `strip` says so (the others copied as
    they are): the kept lines joined with "\\n", runs of three or more newlines made two, then stripped
    of `strip_ws` characters at both ends (what `boilerplate.strip_lines` did in Python with split,
    join, a regex and str.strip). `line_start[d]`: the index of document d's first line."""
    n = len(offsets) - 1
    out = np.empty(max(offsets[n] - offsets[0], 1), dtype=np.uint8)
    new_off = np.zeros(n + 1, dtype=np.int64)
    k = 0
    for d in range(n):
        s, end = offsets[d], offsets[d + 1]
        if not strip[d]:
            for i in range(s, end):
                out[k] = data[i]
                k += 1
            new_off[d + 1] = k
            continue
        k0 = k
        line = line_start[d]
        first = True
        newlines = 0  # newlines at the end of what is written
        while True:
            e = s
            while e < end and data[e] != 10:
                e += 1
            if not line_hit[line]:
                if not first:
                    if newlines < 2:
                        out[k] = 10
                        k += 1
                        newlines += 1
                first = False
                for i in range(s, e):
                    out[k] = data[i]
                    k += 1
                    newlines = newlines + 1 if data[i] == 10 else 0
            line += 1
            if e >= end:
                break
            s = e + 1
        a, b = _trim(out, k0, k, strip_ws)
        for i in range(a, b):
            out[k0 + i - a] = out[i]
        k = k0 + (b - a)
        new_off[d + 1] = k
    return out[:max(k, 1)], new_off


@nb.njit(inline="always")
def _perl_space(b):
    """RE2's \\s: [\\t\\n\\f\\r ] (ASCII only, no vertical tab)."""
    return b == 32 or b == 9 or b == 10 or b == 12 or b == 13


@nb.njit(inline="always")
def _bullet_start(data, a, b, bullet):
    """quality.BULLET_START on a trimmed segment [a, b): a bullet mark, 1-3 digits then . ) or 、,
    or a Latin letter then . or ), followed by an RE2 \\s."""
    if a >= b:
        return False
    c, i = decode_utf8(data, a)
    if bullet[c]:
        return i < b and _perl_space(data[i])
    if 97 <= (c | 32) <= 122:  # [a-zA-Z][.)]
        return i + 1 < b and (data[i] == 46 or data[i] == 41) and _perl_space(data[i + 1])
    digits = 0
    i = a
    while i < b and 48 <= data[i] <= 57:
        digits += 1
        i += 1
    if digits == 0 or digits > 3 or i >= b:
        return False
    if data[i] == 46 or data[i] == 41:  # . )
        i += 1
    elif i + 2 < b and data[i] == 0xE3 and data[i + 1] == 0x80 and data[i + 2] == 0x81:  # 、
        i += 3
    else:
        return False
    return i < b and _perl_space(data[i])


@nb.njit(inline="always")
def _ends_with(data, a, b, pattern):
    n = len(pattern)
    if b - a < n:
        return False
    for q in range(n):
        if data[b - n + q] != pattern[q]:
            return False
    return True


@nb.njit(cache=True, nogil=True)
def segment_scan(data: np.ndarray, offsets: np.ndarray, paragraphs: bool, trim_ws: np.ndarray, bullet: np.ndarray,
                 terminal: np.ndarray, short_limit: np.ndarray) -> np.ndarray:
    """Per document, in one pass over an Arrow UTF-8 buffer, the segment statistics of
    `quality._segment_stats`: segments are lines (split on "\\n") or, with `paragraphs`, the pieces
    between matches of RE2's `\\n\\s*\\n` (leftmost, greedy: a match runs from a newline to the last
    newline of the \\s run after it), each trimmed of `trim_ws` characters (Arrow's
    utf8_trim_whitespace); only non-empty ones count. Columns: segments, duplicate segments (equal to
    an earlier one of the document, by xxh3-64 of the trimmed bytes), their characters, all segment
    characters, then bullet / ellipsis / terminal / short (characters <= short_limit[d]) segments."""
    n = len(offsets) - 1
    out = np.zeros((n, 8), dtype=np.int64)
    longest = 1
    for d in range(n):
        longest = max(longest, offsets[d + 1] - offsets[d] + 1)
    hashes = np.empty(longest, dtype=np.uint64)
    lengths = np.empty(longest, dtype=np.int64)
    dots = np.array([46, 46, 46], dtype=np.uint8)  # ...
    ellipsis = np.array([0xE2, 0x80, 0xA6], dtype=np.uint8)  # …
    maru = np.array([0xE3, 0x80, 0x82, 0xE3, 0x80, 0x82, 0xE3, 0x80, 0x82], dtype=np.uint8)  # 。。。
    for d in range(n):
        start, end = offsets[d], offsets[d + 1]
        m = 0
        s = start
        while True:
            # the segment [s, e) and where the next one starts
            e = s
            nxt = end
            while e < end:
                if data[e] == 10:
                    if not paragraphs:
                        nxt = e + 1
                        break
                    j = e + 1
                    last = -1
                    while j < end and _perl_space(data[j]):
                        if data[j] == 10:
                            last = j
                        j += 1
                    if last >= 0:
                        nxt = last + 1
                        break
                    e = j  # no second newline in this run: no match can start inside it
                    continue
                e += 1
            a, b = _trim(data, s, e, trim_ws)
            length = 0
            for i in range(a, b):
                if (data[i] & 0xC0) != 0x80:
                    length += 1
            if length > 0:
                out[d, 0] += 1
                out[d, 3] += length
                hashes[m] = xxh3_64(data, a, b)
                lengths[m] = length
                m += 1
                if _bullet_start(data, a, b, bullet):
                    out[d, 4] += 1
                if _ends_with(data, a, b, dots) or _ends_with(data, a, b, ellipsis) or _ends_with(data, a, b, maru):
                    out[d, 5] += 1
                c, _ = decode_utf8(data, _char_start_before(data, b))
                if terminal[c]:
                    out[d, 6] += 1
                if length <= short_limit[d]:
                    out[d, 7] += 1
            if e >= end:
                break
            s = nxt
        if m > 1:
            order = np.argsort(hashes[:m])
            for q in range(1, m):
                if hashes[order[q]] == hashes[order[q - 1]]:
                    out[d, 1] += 1
                    out[d, 2] += lengths[order[q]]
    return out
