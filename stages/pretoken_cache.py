"""An exact fast path for regex pre-tokenized byte-level BPE (Hugging Face `tokenizer.json` of the
GPT-2, Llama-3 and Qwen2 kinds; tiktoken files with Llama-3's pattern or Mistral's tekken): the text
is cut where the pre-tokenizer cuts it, each distinct piece is encoded once by the tokenizer itself,
and the cached ids are concatenated.

Why it is exact (tokenizers 0.2x `tokenizer/mod.rs`, `pre_tokenizers/byte_level.rs`, `models/bpe`;
tiktoken's `CoreBPE`):

- Encoding is: added tokens split out of the text, the normalizer, the pre-tokenizer's regex cutting
  the text into pieces, the byte-level map of each piece, BPE of each piece alone. BPE never sees
  two pieces together, so the ids of a text are the ids of its pieces end to end.
- The cutting is the one regex of a few known pre-tokenizers (`PATTERNS`, compared character for
  character), reproduced as a compiled scanner that follows the regex's leftmost-first alternation
  branch by branch. Its character classes (`\\p{L}`, `\\p{N}`, `\\s`, tekken's letter case classes)
  are not taken from Python's Unicode tables but asked of the tokenizer's own regex engine
  (Oniguruma through a `Split` pre-tokenizer; tiktoken's through an encoding whose pattern is the
  class) for each code point the first time it is seen, so a Unicode version difference cannot
  change a cut.
- Inside a piece (a whole Chinese clause: Chinese has no spaces) BPE merges only make vocabulary
  tokens, so between two characters no token joins (`joinable_keys`: no token holds the end of one
  and the start of the other) BPE on either side is independent, and the piece is cut there too.
  Only where the model's BPE of a piece is the BPE of its parts (`_subcut_tokens`: not with word
  affixes or gaps in the byte alphabet; with `ignore_merges`, a piece found whole in the vocabulary
  being one token, never into a part that is a token its merges do not reach; tiktoken always
  takes a whole piece found in its ranks, and is guarded the same way, `unreachable_texts`).
- The normalizer, when there is one, is the tokenizer's own (`normalize_str`). A document holding an
  added token's text (where `tokenizers` would split it out) is encoded whole by the plain encoder.

Each new piece is encoded by a copy of the tokenizer that only maps bytes and runs the model (no
normalizer, no regex, no added tokens), or by tiktoken's own single-piece BPE, so the model's merges,
`ignore_merges` and vocabulary decide its ids. Any other pre-tokenizer or pattern, a model with
dropout, or a ByteLevel step with `add_prefix_space` is declined with the reason (the plain encoder
runs). The tokenize step re-encodes a seeded sample of every part with the plain encoder
(`tokenizer.verify_sample`).
"""
from __future__ import annotations

import json
import re
from typing import Any, Optional

import numba as nb
import numpy as np

from .piece_cache import MAX_KEY, MAX_PIECES, CachedEncoder, _hash, text_points

# the pre-tokenizer regexes the scanner reproduces, by the name the stats report
PATTERNS = {
    "gpt2": r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
    "llama3": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    "qwen2": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    "tekken": (r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"""
               r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}|"""
               r""" ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"""),
}
_KIND = {"gpt2": 0, "llama3": 1, "qwen2": 2, "tekken": 3}
# class bits: letter, number, whitespace, CR or LF, and tekken's "upper" and "lower" letter classes
_L, _N, _S, _NL, _U, _W = 1, 2, 4, 8, 16, 32


@nb.njit(inline="always")
def _run(cps, j, end, cls, mask):
    while j < end and cls[cps[j]] & mask:
        j += 1
    return j


@nb.njit(inline="always")
def _run_other(cps, j, end, cls):
    """[^\\s\\p{L}\\p{N}]+ from j."""
    while j < end and not (cls[cps[j]] & (_L | _N | _S)):
        j += 1
    return j


@nb.njit(inline="always")
def _contraction(cps, i, end, fold):
    """Length of 's 't 're 've 'm 'll 'd at i (cps[i] is the apostrophe), 0 if none; `fold` maps a
    code point to the ASCII letter it matches (both cases and U+017F with (?i), else lower case)."""
    if i + 1 >= end:
        return 0
    a = fold[cps[i + 1]]
    if a == 115 or a == 116 or a == 109 or a == 100:  # s t m d
        return 2
    if i + 2 < end:
        b = fold[cps[i + 2]]
        if (a == 114 and b == 101) or (a == 118 and b == 101) or (a == 108 and b == 108):  # re ve ll
            return 3
    return 0


@nb.njit(inline="always")
def _whitespace(cps, i, end, cls):
    """\\s+(?!\\S)|\\s+ at i (cps[i] is whitespace): the run, less its last character when a
    non-space follows and the run is longer than one."""
    j = _run(cps, i + 1, end, cls, _S)
    if j == end or j - i == 1:
        return j
    return j - 1


@nb.njit(inline="always")
def _next_gpt2(cps, i, end, cls, fold):
    c = cps[i]
    if c == 39:
        n = _contraction(cps, i, end, fold)
        if n:
            return i + n
    if c == 32 and i + 1 < end:  # ' ?' takes the space when its class follows
        k = cls[cps[i + 1]]
        if k & _L:
            return _run(cps, i + 2, end, cls, _L)
        if k & _N:
            return _run(cps, i + 2, end, cls, _N)
        if not (k & _S):
            return _run_other(cps, i + 2, end, cls)
    k = cls[c]
    if k & _L:
        return _run(cps, i + 1, end, cls, _L)
    if k & _N:
        return _run(cps, i + 1, end, cls, _N)
    if not (k & _S):
        return _run_other(cps, i + 1, end, cls)
    return _whitespace(cps, i, end, cls)


@nb.njit(inline="always")
def _next_llama(cps, i, end, cls, fold, max_digits):
    c = cps[i]
    if c == 39:
        n = _contraction(cps, i, end, fold)
        if n:
            return i + n
    k = cls[c]
    # [^\r\n\p{L}\p{N}]?\p{L}+
    if not (k & (_NL | _L | _N)) and i + 1 < end and cls[cps[i + 1]] & _L:
        return _run(cps, i + 2, end, cls, _L)
    if k & _L:
        return _run(cps, i + 1, end, cls, _L)
    if k & _N:  # \p{N}{1,max_digits}
        j = i + 1
        stop = min(end, i + max_digits)
        while j < stop and cls[cps[j]] & _N:
            j += 1
        return j
    # ' ?[^\s\p{L}\p{N}]+[\r\n]*'
    if c == 32 and i + 1 < end and not (cls[cps[i + 1]] & (_S | _L | _N)):
        return _run(cps, _run_other(cps, i + 2, end, cls), end, cls, _NL)
    if not (k & _S):
        return _run(cps, _run_other(cps, i + 1, end, cls), end, cls, _NL)
    # \s*[\r\n]+: the whitespace run up to its last CR or LF, when it holds one
    j = _run(cps, i + 1, end, cls, _S)
    m = j - 1
    while m >= i and not (cls[cps[m]] & _NL):
        m -= 1
    if m >= i:
        return m + 1
    return _whitespace(cps, i, end, cls)


@nb.njit(inline="always")
def _upper_lower(cps, j, end, cls):
    """[U]*[W]+ from j (U: Lu Lt Lm Lo M, W: Ll Lm Lo M): the greedy U run gives back characters until
    one of W is next, from which W+ runs; the match's end, or -1."""
    r = _run(cps, j, end, cls, _U)
    e = r
    while e >= j:
        if e < end and cls[cps[e]] & _W:
            return _run(cps, e + 1, end, cls, _W)
        e -= 1
    return -1


@nb.njit(inline="always")
def _upper_then_lower(cps, j, end, cls):
    """[U]+[W]* from j: the match's end, or -1."""
    if j >= end or not (cls[cps[j]] & _U):
        return -1
    return _run(cps, _run(cps, j + 1, end, cls, _U), end, cls, _W)


@nb.njit(inline="always")
def _breaks_or_slashes(cps, j, end):
    """[\r\n/]* from j."""
    while j < end and (cps[j] == 10 or cps[j] == 13 or cps[j] == 47):
        j += 1
    return j


@nb.njit(inline="always")
def _next_tekken(cps, i, end, cls):
    c = cps[i]
    k = cls[c]
    prefix = not (k & (_NL | _L | _N))  # [^\r\n\p{L}\p{N}]? is tried with the character, then without
    if prefix:
        m = _upper_lower(cps, i + 1, end, cls)
        if m >= 0:
            return m
    m = _upper_lower(cps, i, end, cls)
    if m >= 0:
        return m
    if prefix:
        m = _upper_then_lower(cps, i + 1, end, cls)
        if m >= 0:
            return m
    m = _upper_then_lower(cps, i, end, cls)
    if m >= 0:
        return m
    if k & _N:
        return i + 1
    # ' ?[^\s\p{L}\p{N}]+[\r\n/]*'
    if c == 32 and i + 1 < end and not (cls[cps[i + 1]] & (_S | _L | _N)):
        return _breaks_or_slashes(cps, _run_other(cps, i + 2, end, cls), end)
    if not (k & _S):
        return _breaks_or_slashes(cps, _run_other(cps, i + 1, end, cls), end)
    j = _run(cps, i + 1, end, cls, _S)
    m = j - 1
    while m >= i and not (cls[cps[m]] & _NL):
        m -= 1
    if m >= i:
        return m + 1
    return _whitespace(cps, i, end, cls)


@nb.njit(inline="always")
def _utf8(c, out):
    """The UTF-8 bytes of code point c into out[0:n]; returns n."""
    if c < 0x80:
        out[0] = c
        return 1
    if c < 0x800:
        out[0], out[1] = 0xC0 | (c >> 6), 0x80 | (c & 0x3F)
        return 2
    if c < 0x10000:
        out[0], out[1], out[2] = 0xE0 | (c >> 12), 0x80 | ((c >> 6) & 0x3F), 0x80 | (c & 0x3F)
        return 3
    out[0], out[1], out[2], out[3] = 0xF0 | (c >> 18), 0x80 | ((c >> 12) & 0x3F), 0x80 | ((c >> 6) & 0x3F), 0x80 | (c & 0x3F)
    return 4


@nb.njit(inline="always")
def _bytes_key(left, nl, right, nr):
    """The key of a byte string pair (see `joinable_keys`): each side with a leading 1 bit, packed."""
    lv = np.uint64(1)
    for t in range(nl):
        lv = (lv << np.uint64(8)) | np.uint64(left[t])
    rv = np.uint64(1)
    for t in range(nr):
        rv = (rv << np.uint64(8)) | np.uint64(right[t])
    return ((lv << np.uint64(31)) ^ rv) & np.uint64(0x7FFFFFFFFFFFFFFF)


@nb.njit(inline="always")
def _in_table(table, bits, key):
    mask = np.uint64((1 << bits) - 1)
    s = (key * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(64 - bits)
    while table[s] != np.uint64(1 << 63):
        if table[s] == key:
            return True
        s = (s + np.uint64(1)) & mask
    return False


@nb.njit(inline="always")
def _joinable(c1, c2, table, bits, b1, b2):
    """Whether some vocabulary token could hold the end of c1 and the start of c2: a token holding a
    suffix of c1's bytes (all of them, or the token starts inside c1) followed by a prefix of c2's."""
    n1 = _utf8(c1, b1)
    n2 = _utf8(c2, b2)
    for ls in range(1, n1 + 1):
        for lp in range(1, n2 + 1):
            if _in_table(table, bits, _bytes_key(b1[n1 - ls:], ls, b2, lp)):
                return True
    return False


@nb.njit(inline="always")
def _guarded(cps, starts, first, k, j, guard_table, guard_bits):
    """Whether a sub-piece among starts[first:k] (the last ending at j) is in `guard_table`."""
    for g in range(first, k):
        b = starts[g + 1] if g + 1 < k else j
        key = _hash(cps, starts[g], b) & np.uint64(0x7FFFFFFFFFFFFFFF)
        if _in_table(guard_table, guard_bits, key):
            return True
    return False


@nb.njit(cache=True, nogil=True)
def regex_cuts(cps, doc_starts, cls, fold, kind, join_table, join_bits, subcut, guard_table, guard_bits):
    """Cut the documents (code points `cps`, starts `doc_starts`) where the pre-tokenizer's regex
    (`kind`: 0 GPT-2, 1 Llama-3, 2 Qwen2, 3 tekken) ends a match and, with `subcut`, inside a piece
    between two characters (one of them not ASCII) no token can join (`join_table`), unless one of
    the parts is in `guard_table` (then the piece stays whole). Returns (piece starts with the end
    appended, first piece of each document with the count appended)."""
    n_docs = doc_starts.size - 1
    starts = np.empty(cps.size + 1, dtype=np.int64)
    doc_seg = np.empty(n_docs + 1, dtype=np.int64)
    b1 = np.empty(4, dtype=np.uint8)
    b2 = np.empty(4, dtype=np.uint8)
    k = 0
    for d in range(n_docs):
        i, end = doc_starts[d], doc_starts[d + 1]
        doc_seg[d] = k
        while i < end:
            starts[k] = i
            k += 1
            if kind == 0:
                j = _next_gpt2(cps, i, end, cls, fold)
            elif kind == 3:
                j = _next_tekken(cps, i, end, cls)
            else:
                j = _next_llama(cps, i, end, cls, fold, 3 if kind == 1 else 1)
            if subcut:
                first = k - 1
                for m in range(i + 1, j):
                    x, y = cps[m - 1], cps[m]
                    if (x >= 0x80 or y >= 0x80) and not _joinable(x, y, join_table, join_bits, b1, b2):
                        starts[k] = m
                        k += 1
                if k - first > 1 and _guarded(cps, starts, first, k, j, guard_table, guard_bits):
                    k = first + 1
            i = j
    doc_seg[n_docs] = k
    starts[k] = cps.size
    return starts[: k + 1], doc_seg


def byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet (the characters a ByteLevel vocabulary is written in) -> bytes."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def _pack(left: bytes, right: bytes) -> int:
    """`_bytes_key` in Python."""
    lv = int.from_bytes(b"\x01" + left, "big")
    rv = int.from_bytes(b"\x01" + right, "big")
    return ((lv << 31) ^ rv) & 0x7FFFFFFFFFFFFFFF


def _char_len(lead: int) -> int:
    return 1 if lead < 0x80 else 2 if lead >> 5 == 6 else 3 if lead >> 4 == 14 else 4 if lead >> 3 == 30 else 0


def joinable_keys(tokens: list[bytes]) -> np.ndarray:
    """Keys of the (end of one character, start of the next) byte pairs some token holds across a
    character boundary: at each position of a token where a character starts (a lead byte), the
    character before it (whole, or the token's start when the token starts inside it) and the one
    from it (whole, or the token's end when it ends inside it). Two characters whose every such pair
    is absent are never joined by a merge (a merge only makes a token of the vocabulary), so BPE on
    either side of them is independent."""
    keys = set()
    for t in tokens:
        n = len(t)
        for k in range(1, n):
            if t[k] & 0xC0 == 0x80:  # a continuation byte: not a character boundary
                continue
            j = k - 1
            while j > 0 and t[j] & 0xC0 == 0x80 and k - j < 4:
                j -= 1
            left = t[j:k] if _char_len(t[j]) == k - j else t[:k][-3:]  # whole, or the token starts inside it
            right = t[k:k + max(1, _char_len(t[k]))]  # whole, or as much as the token holds
            keys.add(_pack(left, right))
    return np.fromiter(keys, dtype=np.uint64, count=len(keys))


def _key_table(keys: np.ndarray) -> tuple[np.ndarray, int]:
    """An open-addressing set of 63-bit keys and its size in bits."""
    from .piece_cache import _fill_table

    bits = max(4, int(np.ceil(np.log2(max(1, 2 * len(keys))))) + 1)
    return _fill_table(keys, bits), bits


@nb.njit(cache=True, nogil=True)
def _hash_texts(cps, starts):
    out = np.empty(starts.size - 1, dtype=np.uint64)
    for g in range(starts.size - 1):
        out[g] = _hash(cps, starts[g], starts[g + 1]) & np.uint64(0x7FFFFFFFFFFFFFFF)
    return out


def _text_keys(texts: list[str]) -> np.ndarray:
    """The keys `_guarded` looks texts up by (their code points' hash)."""
    if not texts:
        return np.zeros(0, dtype=np.uint64)
    cps, starts = text_points(texts)
    return _hash_texts(cps, starts)


def _fold_table(case_insensitive: bool) -> np.ndarray:
    """Code point -> the lower-case ASCII letter a contraction's letter matches (0: none)."""
    fold = np.zeros(0x110000, dtype=np.uint8)
    for x in "strevmld":
        fold[ord(x)] = ord(x)
        if case_insensitive:
            fold[ord(x.upper())] = ord(x)
    if case_insensitive:
        fold[0x17F] = ord("s")  # LATIN SMALL LETTER LONG S folds to s
    return fold


class _Classes:
    """`\\p{L}`, `\\p{N}` and `\\s` of each code point as the tokenizer's own regex engine decides
    them, asked the first time a code point is seen (`_matched`: which characters of a text of
    distinct code points one class matches)."""

    PATTERNS = ((_L, r"\p{L}"), (_N, r"\p{N}"), (_S, r"\s"), (_U, r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"),
                (_W, r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"))

    def __init__(self) -> None:
        self.cls = np.zeros(0x110000, dtype=np.uint8)
        self.seen = np.zeros(0x110000, dtype=np.bool_)

    def _matched(self, index: int, text: str) -> np.ndarray:
        raise NotImplementedError

    def ensure(self, cps: np.ndarray) -> None:
        new = np.unique(cps[~self.seen[cps]])
        if not new.size:
            return
        text = new.astype("<u4").tobytes().decode("utf-32-le")
        for index, (bit, _) in enumerate(self.PATTERNS):
            self.cls[new[self._matched(index, text)]] |= bit
        self.cls[new[(new == 10) | (new == 13)]] |= _NL
        self.seen[new] = True


class OnigClasses(_Classes):
    """The classes as Oniguruma (Hugging Face tokenizers) decides them: a `Split` that removes the class
    leaves the other characters, with their offsets."""

    def __init__(self) -> None:
        from tokenizers import Regex, pre_tokenizers

        super().__init__()
        self._splits = [pre_tokenizers.Split(Regex(pat + "+"), behavior="removed") for _, pat in self.PATTERNS]

    def _matched(self, index: int, text: str) -> np.ndarray:
        matched = np.ones(len(text), dtype=np.bool_)
        for _, (a, b) in self._splits[index].pre_tokenize_str(text):
            matched[a:b] = False
        return matched


class TiktokenClasses(_Classes):
    """The classes as tiktoken's regex engine decides them: an encoding over the 256 single bytes whose
    pattern is the class encodes only the characters it matches (tiktoken skips unmatched text)."""

    def __init__(self) -> None:
        import tiktoken

        super().__init__()
        ranks = {bytes([b]): b for b in range(256)}
        self._encs = [tiktoken.Encoding(name=f"corpusmill-class-{i}", pat_str=pat, mergeable_ranks=ranks, special_tokens={})
                      for i, (_, pat) in enumerate(self.PATTERNS)]

    def _matched(self, index: int, text: str) -> np.ndarray:
        enc = self._encs[index]
        kept = set(enc.decode_bytes(enc.encode_ordinary(text)).decode("utf-8"))
        return np.fromiter((c in kept for c in text), dtype=np.bool_, count=len(text))


class _RegexPieceCache(CachedEncoder):
    """Texts cut by the compiled scanner of `pattern` over classes its engine decided (`classes`)."""

    def __init__(self, pattern: str, classes: _Classes, max_key: int, max_pieces: int,
                 join_tokens: Optional[list[bytes]] = None, guard: tuple = ()) -> None:
        self.pattern = pattern
        self.kind = _KIND[pattern]
        self.fold = _fold_table(pattern != "gpt2")
        self.classes = classes
        # cuts inside a piece where no token joins the characters (`joinable_keys`), when the model's
        # BPE of a piece is the BPE of its parts there, except into a part in `guard` (see _subcut_tokens)
        self.subcut = join_tokens is not None
        keys = joinable_keys(join_tokens) if join_tokens is not None else np.zeros(0, dtype=np.uint64)
        self.join_table, self.join_bits = _key_table(keys)
        self.guard = guard
        self.guard_table, self.guard_bits = _key_table(_text_keys(list(guard)))
        super().__init__(max_key, max_pieces)

    def _segments(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        cps, doc_starts = text_points(texts)
        self.classes.ensure(cps)
        starts, doc_seg = regex_cuts(cps, doc_starts, self.classes.cls, self.fold, self.kind, self.join_table,
                                     self.join_bits, self.subcut, self.guard_table, self.guard_bits)
        return cps, starts, doc_seg


class HFPieceCache(_RegexPieceCache):
    """The fast encoder of one byte-level BPE tokenizer.json (build it with `build`, which may decline)."""

    def __init__(self, tok: Any, spec: dict, pattern: str, max_key: int = MAX_KEY, max_pieces: int = MAX_PIECES) -> None:
        from tokenizers import Tokenizer

        self.tok = tok
        self.normalizer = tok.normalizer
        tokens = [t for t in spec.get("added_tokens") or [] if t.get("content")]
        added = [t["content"] for t in tokens]
        # `tokenizers` finds an added token by its content in the raw text, and a `normalized` one also
        # by its normalized content in the normalized text: a document holding either goes plain
        normalized = [self.normalizer.normalize_str(t["content"]) for t in tokens
                      if t.get("normalized") and self.normalizer is not None]
        self._added = _any_of(added)
        self._added_normalized = _any_of([n for n in normalized if n])
        oracle = dict(spec)
        oracle.update(normalizer=None, post_processor=None, added_tokens=[], decoder=None, truncation=None,
                      padding=None, pre_tokenizer={"type": "ByteLevel", "add_prefix_space": False,
                                                   "trim_offsets": False, "use_regex": False})
        self.oracle = Tokenizer.from_str(json.dumps(oracle))
        self._plain_encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
        self._oracle_encode = getattr(self.oracle, "encode_batch_fast", self.oracle.encode_batch)
        self.settings = {"pre_tokenizer": pattern, "normalizer": (spec.get("normalizer") or {}).get("type"),
                         "added_tokens": len(added)}
        join, guard = _subcut_tokens(spec)
        super().__init__(pattern, OnigClasses(), max_key, max_pieces, join, guard)

    def encode_flat(self, texts: list[str], bos_id: int = -1, eos_id: int = -1) -> tuple[np.ndarray, np.ndarray]:
        normalized = [self.normalizer.normalize_str(t) for t in texts] if self.normalizer is not None else texts
        raw, norm = self._added, self._added_normalized
        bypass = [i for i, (t, n) in enumerate(zip(texts, normalized))
                  if (raw is not None and (raw.search(t) or (n is not t and raw.search(n))))
                  or (norm is not None and norm.search(n))]
        return self._encode_flat(normalized, texts, bypass, bos_id, eos_id)

    def _encode_pieces(self, pieces: list[str]) -> list:
        return [e.ids for e in self._oracle_encode(pieces, add_special_tokens=False)]

    def _plain(self, texts: list[str]) -> list:
        return [e.ids for e in self._plain_encode(texts, add_special_tokens=False)]


def _subcut_tokens(spec: dict) -> tuple[Optional[list[bytes]], tuple]:
    """(the vocabulary as bytes, the texts no cut may leave alone) when BPE of a piece equals BPE of
    its parts at every cut no token crosses, else (None, ()): not with word prefixes or suffixes
    (they mark a piece's ends) or a byte alphabet with gaps (unknown bytes fuse across a cut). With
    `ignore_merges` a piece found whole in the vocabulary is one token: a part that is a token is
    then the token, which is what BPE of the whole piece makes of it only when the merges reach
    that token from its own bytes. The tokens they do not reach (BPE of their text, merges only, is
    not that one token) are returned as the guard: a piece whose cuts would leave one alone stays
    whole."""
    model = spec.get("model") or {}
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        return None, ()
    dec = byte_decoder()
    vocab = model.get("vocab") or {}
    if any(ch not in vocab for ch in dec):
        return None, ()
    tokens = [bytes(dec[c] for c in tok) for tok in vocab if all(c in dec for c in tok)]
    if not model.get("ignore_merges"):
        return tokens, ()
    from tokenizers import Tokenizer

    merges_only = dict(spec)
    merges_only.update(normalizer=None, post_processor=None, added_tokens=[], decoder=None, truncation=None,
                       padding=None, model={**model, "ignore_merges": False},
                       pre_tokenizer={"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                                      "use_regex": False})
    try:
        oracle = Tokenizer.from_str(json.dumps(merges_only))
    except Exception:  # noqa: BLE001 - tokenizers raises bare Exception
        return None, ()
    texts, ids = [], []
    for tok, i in vocab.items():
        if all(c in dec for c in tok):
            try:
                texts.append(bytes(dec[c] for c in tok).decode("utf-8"))
            except UnicodeDecodeError:  # not text: no part of a text can be it
                continue
            ids.append(i)
    encoded = oracle.encode_batch_fast(texts, add_special_tokens=False) if hasattr(oracle, "encode_batch_fast") \
        else oracle.encode_batch(texts, add_special_tokens=False)
    guard = tuple(t for t, i, e in zip(texts, ids, encoded) if e.ids != [i])
    return tokens, guard


class TiktokenPieceCache(_RegexPieceCache):
    """The fast encoder of one tiktoken encoding whose split pattern the scanner reproduces. Special
    tokens never come out of text here (the tokenizer encodes with none), so every text is cut."""

    def __init__(self, enc: Any, offset: int, pattern: str, max_key: int = MAX_KEY, max_pieces: int = MAX_PIECES) -> None:
        self.enc, self.offset = enc, offset
        self._single = getattr(enc, "_encode_single_piece", None)  # BPE of one piece, no regex
        self.settings = {"pre_tokenizer": pattern, "normalizer": None, "added_tokens": 0}
        ranks = getattr(enc, "_mergeable_ranks", None)
        join, guard = (list(ranks), unreachable_texts(ranks)) if ranks else (None, ())
        super().__init__(pattern, TiktokenClasses(), max_key, max_pieces, join, guard)

    def _encode_pieces(self, pieces: list[str]) -> list:
        one = self._single or self.enc.encode_ordinary
        off = self.offset
        return [[i + off for i in one(p)] for p in pieces] if off else [one(p) for p in pieces]


def _any_of(strings: list[str]) -> Optional[re.Pattern]:
    """A regex finding any of `strings` (None for none)."""
    return re.compile("|".join(map(re.escape, sorted(set(strings), key=len, reverse=True)))) if strings else None


def pattern_of(pre: Optional[dict]) -> tuple[Optional[str], str]:
    """(the PATTERNS name, "") of a tokenizer.json pre-tokenizer the scanner reproduces, else (None, why)."""
    if not pre:
        return None, "the tokenizer has no pre-tokenizer (no cut points)"
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else [pre]
    if not steps or steps[-1].get("type") != "ByteLevel":
        return None, f"the pre-tokenizer is {_show(pre)}, not byte-level"
    last = steps[-1]
    if last.get("add_prefix_space"):
        return None, "the ByteLevel pre-tokenizer adds a prefix space"
    if len(steps) == 1:
        return ("gpt2", "") if last.get("use_regex", True) else (None, "the ByteLevel pre-tokenizer does not split")
    if len(steps) != 2 or last.get("use_regex", True):
        return None, f"the pre-tokenizer is {_show(pre)}"
    split = steps[0]
    regex = (split.get("pattern") or {}).get("Regex")
    if split.get("type") != "Split" or split.get("behavior") != "Isolated" or split.get("invert") or regex is None:
        return None, f"the pre-tokenizer is {_show(pre)}"
    name = next((k for k, v in PATTERNS.items() if v == regex), None)
    if name is None:
        return None, f"the Split regex {regex[:120]!r} has no compiled scanner"
    return name, ""


def _show(obj: Any) -> str:
    return json.dumps(obj)[:160]


def build(tok: Any, max_key: int = MAX_KEY, max_pieces: int = MAX_PIECES) -> tuple[Optional[HFPieceCache], str]:
    """(the fast encoder, "") for a Hugging Face tokenizer the fast path reproduces exactly, else (None, why not)."""
    try:
        spec = json.loads(tok.to_str())
    except Exception as e:  # noqa: BLE001 - tokenizers raises bare Exception
        return None, f"the tokenizer cannot be serialised ({str(e)[:100]})"
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        return None, f"a {model.get('type')} model: only BPE over regex pieces is cached"
    if model.get("dropout") not in (None, 0, 0.0):
        return None, "BPE dropout is on (the ids are random)"
    if spec.get("truncation") or spec.get("padding"):
        return None, "the tokenizer truncates or pads what it encodes (tokenizer.json truncation / padding)"
    pattern, why = pattern_of(spec.get("pre_tokenizer"))
    if pattern is None:
        return None, why
    return HFPieceCache(tok, spec, pattern, max_key, max_pieces), ""


def unreachable_texts(ranks: dict[bytes, int]) -> tuple:
    """The texts of tokens tiktoken's merges do not make from their own bytes (lowest-ranked adjacent
    pair first, leftmost on a tie, as `CoreBPE` merges): tiktoken takes a piece found whole in its
    ranks as one token, so a cut inside a piece must never leave one of these alone (`_guarded`)."""
    out = []
    for tok in ranks:
        if len(tok) < 2:
            continue
        try:
            text = tok.decode("utf-8")
        except UnicodeDecodeError:  # not text: no part of a text can be it
            continue
        parts = [tok[i:i + 1] for i in range(len(tok))]
        while len(parts) > 1:
            best, at = None, -1
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1])
                if r is not None and (best is None or r < best):
                    best, at = r, i
            if best is None:
                break
            parts[at:at + 2] = [parts[at] + parts[at + 1]]
        if len(parts) > 1:
            out.append(text)
    return tuple(out)


def build_tiktoken(enc: Any, offset: int = 0, max_key: int = MAX_KEY,
                   max_pieces: int = MAX_PIECES) -> tuple[Optional[TiktokenPieceCache], str]:
    """(the fast encoder, "") for a tiktoken encoding (ids shifted by `offset`) whose split pattern the
    scanner reproduces, else (None, why not)."""
    pat = getattr(enc, "_pat_str", None)
    name = next((k for k, v in PATTERNS.items() if v == pat), None)
    if name is None:
        return None, f"the split pattern {str(pat)[:120]!r} has no compiled scanner"
    return TiktokenPieceCache(enc, offset, name, max_key, max_pieces), ""
