"""Vectorised shingling for near-duplicate detection, CJK-aware.

A document is split into *components*: with unit "char", its characters (whitespace dropped, and
punctuation and symbols when asked), whatever the script; with unit "word", words for space-delimited
text and characters for CJK text (chosen per document by its share of CJK characters). Lowercasing
first, when asked. A component's hash is xxh3-64 of its UTF-8 bytes (computed once per distinct component in a
batch); an n-gram's hash folds its components' hashes polynomially and finishes with the
MurmurHash3 64-bit finaliser. Words are split and hashed as Arrow/numpy operations over a whole
batch; characters are decoded from the UTF-8 buffer and the n-grams rolled along each document by
the compiled loops in `sketch`: Python-side shingle strings (about 15 MB/s per core) are never built.

`shingle_strings` and `shingle_hash64` are the slow, obviously-correct reference of the same
definition: the shingle string joins its components with a space, and `shingle_hash64(bytes)`
returns exactly the value the vectorised path computes. Tests feed them to `datasketch.MinHash`
and `simhash.Simhash` to prove the fast signatures equal theirs.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from . import sketch
from .base import one_array

CJK = r"\p{Han}\p{Hiragana}\p{Katakana}\p{Hangul}"
PUNCT = r"[\p{P}\p{S}]+"
FOLD_PRIME = np.uint64(0x100000001B3)
_M64 = (1 << 64) - 1


@dataclass(frozen=True)
class ShingleSpec:
    word_ngram: int = 5
    char_ngram: int = 5
    lowercase: bool = True
    strip_punctuation: bool = True
    cjk_share: float = 0.3  # a document whose non-space characters are at least this CJK is shingled by character
    unit: str = "word"  # "word": words, or characters for a CJK document (per document); "char": characters always


def fmix64(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser (an avalanching bijection), element-wise on uint64."""
    x = x ^ (x >> np.uint64(33))
    x = x * np.uint64(0xFF51AFD7ED558CCD)
    x = x ^ (x >> np.uint64(33))
    x = x * np.uint64(0xC4CEB9FE1A85EC53)
    return x ^ (x >> np.uint64(33))


def _fmix64_int(x: int) -> int:
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & _M64
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & _M64
    return x ^ (x >> 33)


def shingle_hash64(shingle: bytes) -> int:
    """Reference hash of one shingle string (components joined by a space)."""
    s = 0
    for comp in shingle.decode("utf-8").split(" "):
        s = (s * 0x100000001B3 + xxhash.xxh3_64_intdigest(comp.encode("utf-8"))) & _M64
    return _fmix64_int(s)


def shingle_hash32(shingle: bytes) -> int:
    """The 32-bit variant MinHash uses (datasketch's default scheme takes 32-bit input hashes)."""
    return shingle_hash64(shingle) & 0xFFFFFFFF


def _prepare(texts: pa.Array, spec: ShingleSpec) -> pa.Array:
    """Lowercasing (every document); punctuation is handled per script in `_component_hashes`."""
    return pc.utf8_lower(texts) if spec.lowercase else texts


def _strip_punct(texts: pa.Array, spec: ShingleSpec) -> pa.Array:
    return pc.replace_substring_regex(texts, PUNCT, " ") if spec.strip_punctuation else texts


_PUNCT_TABLE = None


def _is_punct_table() -> np.ndarray:
    """is_punct[c]: code point c is punctuation or a symbol (Unicode categories P* and S*).

    1.1M `unicodedata.category` calls take 1-5 s, paid by every process (each Dask worker), so the
    table is kept on disk beside the compiled loops' cache, keyed by the Unicode version."""
    global _PUNCT_TABLE
    if _PUNCT_TABLE is None:
        import os
        import unicodedata
        from pathlib import Path

        cache = Path(__file__).resolve().parent / "__pycache__" / f"punct-table-{unicodedata.unidata_version}.npy"
        try:
            _PUNCT_TABLE = np.unpackbits(np.load(cache))[:0x110000].astype(bool)
        except (OSError, ValueError):
            table = np.zeros(0x110000, dtype=bool)
            for c in range(0x110000):
                if unicodedata.category(chr(c))[0] in "PS":
                    table[c] = True
            _PUNCT_TABLE = table
            try:  # a read-only install simply recomputes it per process
                cache.parent.mkdir(exist_ok=True)
                tmp = cache.with_name(f"{cache.stem}.{os.getpid()}.tmp.npy")
                np.save(tmp, np.packbits(table))
                os.replace(tmp, cache)
            except OSError:
                pass
    return _PUNCT_TABLE


def cjk_mask(texts: pa.Array, spec: ShingleSpec) -> np.ndarray:
    """Documents at least `cjk_share` CJK (of all their characters) are shingled by character (every
    document with unit "char")."""
    if spec.unit == "char":
        return np.ones(len(texts), dtype=bool)
    cjk = pc.count_substring_regex(texts, f"[{CJK}]").to_numpy(zero_copy_only=False)
    chars = pc.utf8_length(texts).to_numpy(zero_copy_only=False)
    return cjk >= spec.cjk_share * np.maximum(chars, 1)


# Code points Python's str.split() treats as whitespace: removed between CJK characters.
_SPACE_POINTS = np.array([c for c in range(0x3100) if chr(c).isspace()], dtype=np.uint32)


def _words(texts: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Whitespace-separated words of each document (flat) and their count per document."""
    lists = pc.utf8_split_whitespace(texts)
    flat = pc.list_flatten(lists)
    keep = pc.greater(pc.utf8_length(flat), 0).to_numpy(zero_copy_only=False)  # runs of spaces split into ""
    offsets = lists.offsets.to_numpy()
    bounds = offsets - offsets[0]
    counts = np.add.reduceat(np.r_[keep, False].astype(np.int64), bounds[:-1]) if len(keep) else np.zeros(len(texts), np.int64)
    counts[bounds[:-1] == bounds[1:]] = 0  # reduceat's empty segments
    return flat.filter(pa.array(keep)), counts.astype(np.int64)


def _components(texts: list[str], cjk: np.ndarray, spec: ShingleSpec) -> list[list[str]]:
    """Reference: words (after punctuation became spaces) or CJK characters (spaces and, if asked,
    punctuation dropped)."""
    out = []
    for t, c in zip(texts, cjk):
        if c:
            punct = _is_punct_table() if spec.strip_punctuation else None
            out.append([ch for ch in t if ord(ch) not in _SPACE_SET and (punct is None or not punct[ord(ch)])])
        else:
            flat, _ = _words(_strip_punct(pa.array([t], pa.string()), spec))
            out.append(flat.to_pylist())
    return out


_SPACE_SET = set(_SPACE_POINTS.tolist())
_IS_SPACE = np.zeros(0x110000, dtype=bool)
_IS_SPACE[_SPACE_POINTS] = True


def shingle_strings(text: str, spec: ShingleSpec = ShingleSpec()) -> list[str]:
    """Reference: the shingle strings of one document (a document shorter than n is one shingle)."""
    prepared = _prepare(pa.array([text], pa.string()), spec)
    is_cjk = bool(cjk_mask(prepared, spec)[0])
    comps = _components(prepared.to_pylist(), np.array([is_cjk]), spec)[0]
    n = spec.char_ngram if is_cjk else spec.word_ngram
    if not comps:
        return []
    if len(comps) < n:
        return [" ".join(comps)]
    return [" ".join(comps[i : i + n]) for i in range(len(comps) - n + 1)]


_LUT = np.zeros(0x110000, dtype=np.uint64)  # xxh3-64 of each code point's UTF-8, filled as code points are met
_KNOWN = np.zeros(0x110000, dtype=np.uint8)  # 1: hashed into _LUT
_DROP: dict[bool, np.ndarray] = {}  # uint8 tables (the compiled loop reads them per character)
_TABLE_LOCK = threading.Lock()


def _drop_table(strip_punctuation: bool) -> np.ndarray:
    """drop[c]: code point c is not a character component (whitespace, and punctuation when asked)."""
    if strip_punctuation not in _DROP:
        _DROP[strip_punctuation] = (_IS_SPACE | _is_punct_table() if strip_punctuation else _IS_SPACE).astype(np.uint8)
    return _DROP[strip_punctuation]


def utf8_buffers(texts: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(UTF-8 bytes, int64 offsets) of a string array, without copying the text."""
    texts = texts.cast(pa.string())
    bufs = texts.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int32, count=len(texts) + 1, offset=4 * texts.offset).astype(np.int64)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(1, np.uint8)
    return data, offsets


def char_points(texts: pa.Array, strip_punctuation: bool) -> tuple[np.ndarray, np.ndarray]:
    """(code points, per-document starts) of the character components (whitespace and, when asked,
    punctuation dropped); every code point met is hashed into the process's table once."""
    data, offsets = utf8_buffers(texts)
    drop = _drop_table(strip_punctuation)
    with _TABLE_LOCK:  # threads of one worker share the table: a code point is marked and hashed under one lock
        points, starts, n_new = sketch.utf8_points(data, offsets, drop, _KNOWN)
        if n_new:
            new = np.flatnonzero(_KNOWN == 2)
            _LUT[new] = np.fromiter((xxhash.xxh3_64_intdigest(chr(c).encode("utf-8")) for c in new.tolist()), np.uint64, len(new))
            _KNOWN[new] = 1
    return points, starts


_CHAR_TABLES: dict = {}


def _cached_table(name: str, build, dtype) -> np.ndarray:
    """A per-code-point table kept on disk beside the compiled loops' cache (keyed by the Unicode and
    Arrow versions that define it), so a worker process loads it instead of building it."""
    import os
    import unicodedata
    from pathlib import Path

    cache = Path(__file__).resolve().parent / "__pycache__" / f"{name}-{unicodedata.unidata_version}-{pa.__version__}.npy"
    try:
        table = np.load(cache)
        if table.dtype == dtype and len(table) == 0x110000:
            return table
    except (OSError, ValueError):
        pass
    table = build().astype(dtype)
    try:  # a read-only install simply rebuilds it per process
        cache.parent.mkdir(exist_ok=True)
        tmp = cache.with_name(f"{cache.stem}.{os.getpid()}.tmp.npy")
        np.save(tmp, table)
        os.replace(tmp, cache)
    except OSError:
        pass
    return table


_SURROGATES = (0xD800, 0xE000)  # not encodable as UTF-8: never met in valid text, mapped to themselves


def _build_lower() -> np.ndarray:
    """lower[c]: Arrow's utf8_lower of the one-character string chr(c) (it maps code point by code point)."""
    points = np.r_[np.arange(_SURROGATES[0]), np.arange(_SURROGATES[1], 0x110000)]
    lowered = pc.utf8_lower(pa.array([chr(c) for c in points.tolist()], pa.string()))
    data, offsets = utf8_buffers(lowered)
    out, starts, _ = sketch.utf8_points(data, offsets, np.zeros(0x110000, np.uint8), np.ones(0x110000, np.uint8))
    if not (np.diff(starts) == 1).all():  # a mapping to several code points would break the table
        raise RuntimeError("utf8_lower maps a code point to several")
    table = np.arange(0x110000, dtype=np.uint32)
    table[points] = out
    return table


def _build_component_lut() -> np.ndarray:
    """lut[c]: xxh3-64 of chr(c)'s UTF-8, every code point (the character components' hashes)."""
    table = np.zeros(0x110000, dtype=np.uint64)
    points = np.r_[np.arange(_SURROGATES[0]), np.arange(_SURROGATES[1], 0x110000)]
    table[points] = np.fromiter((xxhash.xxh3_64_intdigest(chr(c).encode("utf-8")) for c in points.tolist()), np.uint64,
                                len(points))
    return table


def char_tables(spec: ShingleSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lower, drop, lut) for the fused character loops (`sketch.char_components`, `sketch.char_minhash`):
    lowercasing (the identity without `spec.lowercase`), the dropped code points, and every code
    point's component hash, each a table over all code points."""
    key = (spec.lowercase, spec.strip_punctuation)
    if key not in _CHAR_TABLES:
        with _TABLE_LOCK:
            if "lut" not in _CHAR_TABLES:
                _CHAR_TABLES["lut"] = _cached_table("char-lut", _build_component_lut, np.uint64)
            if spec.lowercase and "lower" not in _CHAR_TABLES:
                _CHAR_TABLES["lower"] = _cached_table("utf8-lower", _build_lower, np.uint32)
            lower = _CHAR_TABLES["lower"] if spec.lowercase else np.arange(0x110000, dtype=np.uint32)
            _CHAR_TABLES[key] = (lower, _drop_table(spec.strip_punctuation), _CHAR_TABLES["lut"])
    return _CHAR_TABLES[key]


def char_components(texts: pa.Array, spec: ShingleSpec) -> tuple[np.ndarray, np.ndarray]:
    """(component hashes, per-document starts) with unit "char": what lowercasing, `char_points` and
    the table lookup give, in one compiled pass over the UTF-8 buffer."""
    data, offsets = utf8_buffers(texts)
    return sketch.char_components(data, offsets, *char_tables(spec))


def _component_hashes(texts: pa.Array, cjk: np.ndarray, spec: ShingleSpec, with_lengths: bool = False):
    """Flat uint64 component hashes of all documents and the per-document component counts (and,
    `with_lengths`, each component's length in characters)."""
    n = len(texts)
    counts = np.zeros(n, dtype=np.int64)
    parts: list[tuple[np.ndarray, np.ndarray]] = []  # (doc indices, flat hashes in doc order)
    lengths_of: list[np.ndarray] = []
    word_idx = np.flatnonzero(~cjk)
    if len(word_idx):
        flat, lengths = _words(_strip_punct(texts.take(pa.array(word_idx)), spec))
        encoded = pc.dictionary_encode(flat)
        uniques = encoded.dictionary.to_pylist()
        table = np.fromiter((xxhash.xxh3_64_intdigest(w.encode("utf-8")) for w in uniques), dtype=np.uint64, count=len(uniques))
        hashes = table[encoded.indices.to_numpy(zero_copy_only=False)] if len(uniques) else np.empty(0, np.uint64)
        counts[word_idx] = lengths
        parts.append((word_idx, hashes))
        if with_lengths:
            lengths_of.append(pc.utf8_length(flat).to_numpy(zero_copy_only=False).astype(np.float64))
    cjk_idx = np.flatnonzero(cjk)
    if len(cjk_idx):
        sub = texts if len(cjk_idx) == n else texts.take(pa.array(cjk_idx))
        points, doc_starts = char_points(sub, spec.strip_punctuation)
        counts[cjk_idx] = np.diff(doc_starts)
        parts.append((cjk_idx, sketch.lookup(points, _LUT)))
        if with_lengths:
            lengths_of.append(np.ones(len(points), dtype=np.float64))
    if len(parts) == 1 and len(parts[0][0]) == n and not with_lengths:  # one group holding every document, in order
        return parts[0][1], counts
    # interleave the two groups back into document order
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    flat = np.empty(starts[-1], dtype=np.uint64)
    comp_len = np.empty(starts[-1], dtype=np.float64) if with_lengths else None
    for k, (idx, hashes) in enumerate(parts):
        sub_counts = counts[idx]
        sub_starts = np.zeros(len(idx) + 1, dtype=np.int64)
        np.cumsum(sub_counts, out=sub_starts[1:])
        # positions in `flat` of every component of these documents
        dest = np.repeat(starts[idx] - sub_starts[:-1], sub_counts) + np.arange(sub_starts[-1])
        flat[dest] = hashes
        if with_lengths:
            comp_len[dest] = lengths_of[k]
    return (flat, counts, comp_len) if with_lengths else (flat, counts)


def shingle_hashes(texts: pa.Array, spec: ShingleSpec = ShingleSpec()) -> tuple[np.ndarray, np.ndarray]:
    """(hashes, offsets): uint64 n-gram hashes of every document, flat, and offsets (n_docs + 1).

    Document i's shingles are hashes[offsets[i]:offsets[i+1]] (with repeats, in text order)."""
    return shingle_hashes_multi(texts, [spec])[0]


def same_components(a: ShingleSpec, b: ShingleSpec) -> bool:
    """The two specs split documents into the same components (they may differ in n only)."""
    return (a.lowercase, a.strip_punctuation, a.cjk_share, a.unit) == (b.lowercase, b.strip_punctuation, b.cjk_share, b.unit)


def shingle_hashes_multi(texts: pa.Array, specs: list[ShingleSpec]) -> list[tuple[np.ndarray, np.ndarray]]:
    """`shingle_hashes` for several specs that differ only in their n-gram sizes: the text is decoded
    and its components hashed once (MinHash's 5-grams and SimHash's 3-grams in one pass)."""
    assert all(same_components(specs[0], s) for s in specs[1:])
    spec = specs[0]
    texts = one_array(texts)
    if spec.unit == "char":  # every document by character: one fused pass, lowercasing included
        comp, starts = char_components(texts.cast(pa.string()), spec)
        return [sketch.fold_ngrams(comp, starts, np.full(len(texts), s.char_ngram, np.int64)) for s in specs]
    texts = _prepare(texts.cast(pa.string()), spec)
    cjk = cjk_mask(texts, spec)
    comp, counts = _component_hashes(texts, cjk, spec)
    starts = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    return [sketch.fold_ngrams(comp, starts, np.where(cjk, s.char_ngram, s.word_ngram).astype(np.int64)) for s in specs]
