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
    cnt = np.zeros(cap, dtype=np.int32)  # 16 bytes a slot with the key: a long document's table stays in cache longer
    stamp = np.full(cap, -1, dtype=np.int32)
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
            if generation == 2**31 - 2:  # int32 stamps run out: every slot free again
                stamp[:] = -1
                generation = 0
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


# flags of the per-code-point table `doc_scan` reads (quality._text_tables derives them from Arrow/RE2)
WS, WORD_SEP, LETTER, ZH_STOP, MOJIBAKE_START, PUNCT = 1, 2, 4, 8, 16, 32
TEXT_COUNTS = 9  # columns of doc_scan's text counts


_P = np.uint64(0x100000001B3)
_SEED = np.uint64(0xCBF29CE484222325)


@nb.njit(inline="always")
def _component_hash(h):
    """The key of a component whose code points were folded into h (`_fold`)."""
    return _fmix64(h ^ np.uint64(0x2545F4914F6CDD1D))


@nb.njit(inline="always")
def _fold(h, c):
    return (h ^ np.uint64(c)) * _P


@nb.njit(inline="always")
def _letter_run(c, k, first_letter, last_letter, prev, run, best):
    """The run of one repeated letter after character c of class k: (run, longest so far)."""
    if first_letter <= k <= last_letter:
        run = run + 1 if c == prev else 1
        return run, max(run, best)
    return 0, best


@nb.njit(inline="always")
def _ellipsis(c, dots):
    """('.' in a row after character c, 1 if c completes an ellipsis: '...' or '…', non-overlapping)."""
    if c == 0x2E:
        if dots == 2:
            return 0, 1
        return dots + 1, 0
    return 0, 1 if c == 0x2026 else 0


@nb.njit(inline="always")
def _core_char(b, is_trim, key, n, bad, trailing):
    """A token's stop-word core after a character that lowercases to the ASCII b (0: to anything
    else; `is_trim`: b is trimmed off a token's ends): (key of the core's ASCII from its first to its
    last character not trimmed, its length, whether no stop word can match (a character not ASCII, or
    a trimmed one inside), whether a trimmed character followed the core)."""
    if b == 0:
        return key, n, True, trailing
    if is_trim:
        return key, n, bad, trailing or n > 0
    return (key << 8) | np.int64(b), n + 1, bad or trailing, trailing


@nb.njit(inline="always")
def _is_stop(key, n, bad, stop_keys):
    """The core (`_core_char`) is one of `stop_keys` (a tuple of `stop_key`s)."""
    if bad or n == 0 or n > 8:
        return 0
    for k in stop_keys:
        if k == key:
            return 1
    return 0


@nb.njit(inline="always")
def _mojibake_at(data, i, end, strings, lengths, next_free):
    """How many of the mojibake `strings` start at byte i and may count there (Arrow's count_substring
    counts an occurrence only after the previous one of the same string ended: `next_free`)."""
    found = 0
    for s in range(len(lengths)):
        m = lengths[s]
        if i < next_free[s] or i + m > end:
            continue
        same = True
        for q in range(m):
            if data[i + q] != strings[s, q]:
                same = False
                break
        if same:
            found += 1
            next_free[s] = i + m
    return found


@nb.njit(inline="always")
def _is_zh(cls_n, first_letter, last_letter, cjk_classes, cjk_share):
    letters = 0
    for k in range(first_letter, last_letter + 1):
        letters += cls_n[k]
    cjk = 0
    for k in cjk_classes:
        cjk += cls_n[k]
    return cjk / max(letters, 1) >= cjk_share


@nb.njit(cache=True, nogil=True)
def doc_scan(data: np.ndarray, offsets: np.ndarray, cls_table: np.ndarray, ts_table: np.ndarray,
             n_classes: int, first_letter: int, last_letter: int, cjk_classes: np.ndarray, cjk_share: float,
             flags: np.ndarray, lowmap: np.ndarray, trim: np.ndarray, stop_keys: tuple,
             lower: np.ndarray, cjk_drop: np.ndarray, mojibake: np.ndarray, mojibake_len: np.ndarray) -> tuple:
    """Every per-character score input of a batch in one pass over the Arrow UTF-8 buffer (why one:
    decoding and the table lookups were most of the scoring time when each score read the text itself).

    Per document:
    - `counts` (n x n_classes, the classes of `cls_table`): code points per class; `trad` / `simp`:
      code points `ts_table` marks 1 / 2; `max_run`: the longest run of one repeated letter (classes
      first_letter..last_letter);
    - `zh`: the `cjk_classes` are at least `cjk_share` of the letters (as score_texts decides it);
    - `text` (n x TEXT_COUNTS), the counts score_texts once took from Arrow kernels: 0 runs of word
      characters (not WORD_SEP), 1 ZH_STOP characters, 2 '#', 3 ellipses ('...' or '…',
      non-overlapping), 4 occurrences of the `mojibake` strings (rows of UTF-8, `mojibake_len` bytes
      each; each counted as Arrow's count_substring counts it, non-overlapping, and summed; one can
      only start at a MOJIBAKE_START character), and over the tokens of Arrow's
      utf8_split_whitespace (a run of WS characters separates; a run of two or more at the very end
      also leaves one more empty token): 5 tokens, 6 their characters, 7 tokens holding a LETTER,
      8 tokens that are a stop word once lowercased (`lowmap`: the ASCII a character lowercases to,
      0 for anything else) and trimmed of `trim` characters at both ends (`stop_keys`: a tuple of
      the stop words' `stop_key`s; a token's key is built as it is read, no token is copied);
    - Gopher's components of the text lowercased (`lower`: the code point Arrow's utf8_lower gives):
      for a zh document its characters that `cjk_drop` does not drop, otherwise its words (maximal
      runs of characters that are neither WS nor PUNCT). `comp` holds each component's 64-bit key
      (equal keys: equal components), `comp_len` its characters, `comp_count` the components per
      document, flat in document order. Both kinds are gathered while reading (the document's kind
      is known only at its end); a zh document's characters then replace its words."""
    n = len(offsets) - 1
    counts = np.zeros((n, n_classes), dtype=np.int64)
    trad = np.zeros(n, dtype=np.int64)
    simp = np.zeros(n, dtype=np.int64)
    max_run = np.zeros(n, dtype=np.int64)
    zh = np.zeros(n, dtype=np.bool_)
    out = np.zeros((n, TEXT_COUNTS), dtype=np.int64)
    longest = 0
    for d in range(n):
        longest = max(longest, offsets[d + 1] - offsets[d])
    cap = max(offsets[n] - offsets[0], 1)  # a component holds at least one byte
    comp = np.empty(cap, dtype=np.uint64)
    comp_len = np.empty(cap, dtype=np.float64)
    comp_count = np.zeros(n, dtype=np.int64)
    chars = np.empty(longest + 1, dtype=np.uint64)  # the document's lowercased characters but cjk_drop's
    cls_n = np.zeros(n_classes, dtype=np.int64)
    next_free = np.zeros(len(mojibake_len), dtype=np.int64)  # where each string may next match
    gsep = np.uint8(WS | PUNCT)
    w = 0
    # Per character only scalars are updated and the helpers take no arrays (but `_mojibake_at`, at
    # rare characters): the same loop with its pieces in helpers that took arrays and updated them
    # ran three times slower (measured, not explained).
    for d in range(n):
        i, end = offsets[d], offsets[d + 1]
        base = w
        cls_n[:] = 0
        n_chars = 0
        n_trad, n_simp = 0, 0
        prev, run, best = -1, 0, 0
        in_word, word_runs, zh_stop, sharps, dots, ellipses, garbled = False, 0, 0, 0, 0, 0, 0
        next_free[:] = 0
        ws_run, tokens, tok_chars, alpha_tokens, stop_tokens = 0, 1, 0, 0, 0
        tok_len, tok_alpha = 0, False  # the current token's characters, and whether one is a LETTER
        key, key_n, key_bad, trailing = 0, 0, False, False  # its stop-word core (`_core_char`)
        g_hash, g_len = _SEED, 0  # the current Gopher word
        while i < end:
            here = i
            c, i = decode_utf8(data, i)
            f = flags[c]
            k = np.int64(cls_table[c])
            cls_n[k] += 1
            t = ts_table[c]
            n_trad += t == 1
            n_simp += t == 2
            run, best = _letter_run(c, k, first_letter, last_letter, prev, run, best)
            prev = c
            if f & WORD_SEP:
                in_word = False
            elif not in_word:
                in_word = True
                word_runs += 1
            zh_stop += (f & ZH_STOP) != 0
            if f & MOJIBAKE_START:
                garbled += _mojibake_at(data, here, end, mojibake, mojibake_len, next_free)
            sharps += c == 0x23
            dots, ellipsis = _ellipsis(c, dots)
            ellipses += ellipsis
            # Gopher: a word of lowercased characters, and the characters a zh document keeps
            lc = lower[c]
            if flags[lc] & gsep:
                if g_len > 0:
                    comp[w] = _component_hash(g_hash)
                    comp_len[w] = g_len
                    w += 1
                    g_hash, g_len = _SEED, 0
            else:
                g_hash = _fold(g_hash, lc)
                g_len += 1
            if not cjk_drop[lc]:
                chars[n_chars] = lc
                n_chars += 1
            # Arrow's whitespace tokens and their stop-word cores
            if not f & WS:
                ws_run = 0
                tok_len += 1
                tok_alpha |= (f & LETTER) != 0
                b = lowmap[c]
                key, key_n, key_bad, trailing = _core_char(b, trim[b], key, key_n, key_bad, trailing)
                continue
            if tok_len > 0:  # a token ends
                tok_chars += tok_len
                alpha_tokens += tok_alpha
                stop_tokens += _is_stop(key, key_n, key_bad, stop_keys)
                tok_len, tok_alpha = 0, False
                key, key_n, key_bad, trailing = 0, 0, False, False
            tokens += ws_run == 0
            ws_run += 1
        if g_len > 0:  # the end closes the last word
            comp[w] = _component_hash(g_hash)
            comp_len[w] = g_len
            w += 1
        if tok_len > 0:  # and the last token
            tok_chars += tok_len
            alpha_tokens += tok_alpha
            stop_tokens += _is_stop(key, key_n, key_bad, stop_keys)
        # a whitespace run reaching the end of two or more leaves one more empty token
        tokens += ws_run >= 2
        row = out[d]
        row[0], row[1], row[2], row[3], row[4] = word_runs, zh_stop, sharps, ellipses, garbled
        row[5], row[6], row[7], row[8] = tokens, tok_chars, alpha_tokens, stop_tokens
        counts[d] = cls_n
        trad[d], simp[d], max_run[d] = n_trad, n_simp, best
        zh[d] = _is_zh(cls_n, first_letter, last_letter, cjk_classes, cjk_share)
        if zh[d]:  # its characters replace its words
            for q in range(n_chars):
                comp[base + q] = _component_hash(_fold(_SEED, chars[q]))
                comp_len[base + q] = 1.0
            w = base + n_chars
        comp_count[d] = w - base
    return counts, trad, simp, max_run, zh, out, comp[:w].copy(), comp_len[:w].copy(), comp_count


def stop_key(word: str) -> int:
    """A stop word (at most 8 ASCII letters) as the key `doc_scan` compares tokens with."""
    key = 0
    for b in word.encode("ascii"):
        key = (key << 8) | b
    return key


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
def line_bounds(data: np.ndarray, offsets: np.ndarray) -> tuple:
    """The lines of every document as offsets into the same UTF-8 buffer (int32, for a zero-copy
    Arrow string array of lines: each line keeps its "\\n"; a document of k newlines has k + 1 lines,
    as Arrow's split_pattern gives), and the lines per document."""
    n = len(offsets) - 1
    per_doc = np.ones(n, dtype=np.int64)
    for d in range(n):
        for i in range(offsets[d], offsets[d + 1]):
            per_doc[d] += data[i] == 10
    bounds = np.empty(per_doc.sum() + 1, dtype=np.int32)
    k = 0
    for d in range(n):
        bounds[k] = offsets[d]
        k += 1
        for i in range(offsets[d], offsets[d + 1]):
            if data[i] == 10:
                bounds[k] = i + 1
                k += 1
    bounds[k] = offsets[n]
    return bounds, per_doc


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
