"""Unicode and whitespace normalisation, vectorised with Arrow's native string kernels (RE2).

Runs before filtering and deduplication so that trivially different copies (full-width letters,
stray control bytes, trailing spaces) hash the same.
"""
from __future__ import annotations

import unicodedata
from typing import Optional

import numba as nb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from . import quality_loops
from .base import BatchResult, one_array
from .shingles import utf8_buffers
from .sketch import decode_utf8

ANSI_ESCAPE = r"\x1b\[[0-9;?]*[A-Za-z]"
# Control (Cc, except tab and newline) and format (Cf: zero-width space/joiners, BOM, soft hyphen).
CONTROL = r"[\x00-\x08\x0b-\x1f\x7f-\x9f\p{Cf}]"
# Folding turns runs of [\t\p{Zs}] into one space, in two passes measured 3x faster than that regex:
# first every Zs character but the ASCII space (and tab), which are rare, then runs of spaces.
OTHER_HSPACE = "[\\t\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{202f}\\x{205f}\\x{3000}]"
# Full-width punctuation of Chinese text that NFKC would turn into ASCII (，→ , etc.).
CJK_PUNCT = "！（），：；？～"
_PROTECT = [(ch, chr(0xF0000 + i)) for i, ch in enumerate(CJK_PUNCT)]  # private-use stand-ins


HTML_ENTITY = r"&(#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});"
FULLWIDTH = "[\\x{ff01}-\\x{ff5e}\\x{3000}]"


def _fullwidth_table(keep_cjk_punctuation: bool) -> dict[int, int]:
    table = {c: c - 0xFEE0 for c in range(0xFF01, 0xFF5F)}
    table[0x3000] = 0x20  # ideographic space
    if keep_cjk_punctuation:
        for ch in CJK_PUNCT:
            table.pop(ord(ch), None)
    return table


def _map_matching(arr: pa.Array, pattern: str, fn) -> pa.Array:
    """Apply a Python function only to the strings matching `pattern` (usually few)."""
    hit = pc.match_substring_regex(arr, pattern)
    if not pc.any(hit).as_py():
        return arr
    values = arr.to_pylist()
    for i in pc.indices_nonzero(hit).to_pylist():
        values[i] = fn(values[i])
    return pa.array(values, pa.string())


def _nfkc(arr: pa.Array, keep_cjk_punctuation: bool) -> pa.Array:
    """NFKC (CJK punctuation protected when asked) of the texts that may change (`_needs_nfkc`): a
    text of characters that are each their own normal form, combine with nothing and need no
    reordering is already in NFKC, so the 17 passes and the Python round trip shrink to the few
    texts left, with the same result."""
    if len(arr) == 0:
        return arr
    other = pa.array(_needs_nfkc(arr, keep_cjk_punctuation))
    n_other = pc.sum(other).as_py() or 0
    if n_other == 0:
        return arr
    sub = arr.filter(other) if n_other < len(arr) else arr
    if keep_cjk_punctuation:
        for ch, stand_in in _PROTECT:
            sub = pc.replace_substring(sub, ch, stand_in)
    # not pc.utf8_normalize: Arrow 23's form="NFKC" leaves text decomposed (é as e + U+0301, Hangul
    # syllables as jamo), i.e. NFKD; Python's is the real NFKC, and quick for text already in it
    sub = pa.array([t if t is None or unicodedata.is_normalized("NFKC", t) else unicodedata.normalize("NFKC", t)
                    for t in sub.to_pylist()], pa.string())  # the check is quick; most text is already NFKC
    if keep_cjk_punctuation:
        for ch, stand_in in _PROTECT:
            sub = pc.replace_substring(sub, stand_in, ch)
    return pc.replace_with_mask(arr, other, sub.cast(arr.type)) if n_other < len(arr) else sub


def _build_nfkc_tables(points: np.ndarray) -> dict[str, np.ndarray]:
    """`safe`: code points that are NFKC alone (Python's unicodedata, which normalises), of combining
    class 0, and never the second of a canonical pair (nor a Hangul vowel or trailing consonant,
    composed algorithmically): a text of them only is NFKC (the quick check's YES, conservatively).
    `protected`: the CJK punctuation keep_cjk_punctuation keeps (1) and its stand-ins (2)."""
    safe = np.zeros(quality_loops.CODE_POINTS, dtype=np.bool_)
    second = set(range(0x1161, 0x1176)) | set(range(0x11A8, 0x11C3))
    for c in points.tolist():
        d = unicodedata.decomposition(chr(c))
        if d and not d.startswith("<") and len(d.split()) == 2:
            second.add(int(d.split()[1], 16))
    for c in points.tolist():
        ch = chr(c)
        safe[c] = c not in second and unicodedata.combining(ch) == 0 and unicodedata.is_normalized("NFKC", ch)
    # protected: 1 for the kept CJK punctuation (safe then), 2 for its private-use stand-ins (never safe
    # then: the round trip turns a stand-in already in the text into the punctuation)
    protected = np.zeros(quality_loops.CODE_POINTS, dtype=np.int8)
    protected[[ord(ch) for ch, _ in _PROTECT]] = 1
    protected[[ord(stand_in) for _, stand_in in _PROTECT]] = 2
    return {"safe": safe, "protected": protected}


@nb.njit(cache=True, nogil=True)
def _unsafe_docs(data: np.ndarray, offsets: np.ndarray, safe: np.ndarray, protected: np.ndarray, keep: bool) -> np.ndarray:
    """Per document: does it hold a character NFKC may change (not `safe`, nor `protected` when kept)?"""
    n = len(offsets) - 1
    out = np.zeros(n, dtype=np.bool_)
    for d in range(n):
        i, end = offsets[d], offsets[d + 1]
        while i < end:
            if data[i] < 0x80:
                i += 1
                continue
            c, i = decode_utf8(data, i)
            if keep and protected[c]:
                if protected[c] == 2:
                    out[d] = True
                    break
                continue
            if not safe[c]:
                out[d] = True
                break
    return out


def _needs_nfkc(arr: pa.Array, keep_cjk_punctuation: bool) -> np.ndarray:
    """Which texts of `arr` (no nulls counted: a null needs nothing) NFKC may change."""
    t = quality_loops.code_point_tables("nfkc-tables", f"nfkc-safe-{unicodedata.unidata_version}|{CJK_PUNCT}|stand-ins",
                                        _build_nfkc_tables)
    arr = one_array(arr).cast(pa.string())
    data, offsets = utf8_buffers(arr)
    out = _unsafe_docs(data, offsets, t["safe"], t["protected"], keep_cjk_punctuation)
    if arr.null_count:
        out &= arr.is_valid().to_numpy(zero_copy_only=False)
    return out


def normalize_array(
    arr: pa.Array,
    nfkc: bool = True,
    strip_control: bool = True,
    fold_whitespace: bool = True,
    keep_cjk_punctuation: bool = True,
    fullwidth_ascii: bool = True,
    html_entities: bool = True,
    chinese_convert: Optional[str] = None,
) -> pa.Array:
    """Normalise a string array; each step can be switched off. `chinese_convert` (an OpenCC
    conversion such as t2s) comes last (the dedup job hashes traditional and simplified copies alike)."""
    import html

    if pc.any(pc.match_substring(arr, "\r")).as_py():  # rare: the two copying passes only when needed
        arr = pc.replace_substring(arr, "\r\n", "\n")
        arr = pc.replace_substring(arr, "\r", "\n")
    if html_entities:
        arr = _map_matching(arr, HTML_ENTITY, html.unescape)
    if fullwidth_ascii and not nfkc:
        table = _fullwidth_table(keep_cjk_punctuation)
        arr = _map_matching(arr, FULLWIDTH, lambda t: t.translate(table))
    if nfkc:
        arr = _nfkc(arr, keep_cjk_punctuation)
    if strip_control or fold_whitespace:
        arr = clean_and_fold(arr, strip_control, fold_whitespace)
    if chinese_convert:
        arr, _ = convert_chinese(arr, chinese_convert)
    return arr


def fold_whitespace_array(arr: pa.Array) -> pa.Array:
    """The whitespace folding of `normalize_array` on its own: `normalize_array(x, **opts)` equals
    `fold_whitespace_array(normalize_array(x, **opts, fold_whitespace=False))` when no Chinese
    conversion follows, so dedup normalises once for shingling (which splits on any whitespace)
    and folds that for the exact hash."""
    return clean_and_fold(arr, strip_control=False, fold_whitespace=True)


def clean_and_fold_regex(arr: pa.Array, strip_control: bool, fold_whitespace: bool) -> pa.Array:
    """The definition `clean_and_fold` computes in one pass: terminal escapes and control characters
    removed, then whitespace folded, each an Arrow (RE2) pass. Kept for arrays with nulls and as the
    reference the compiled pass is tested against."""
    if strip_control:
        arr = pc.replace_substring_regex(arr, ANSI_ESCAPE, "")
        arr = pc.replace_substring_regex(arr, CONTROL, "")
    if not fold_whitespace:
        return arr
    arr = pc.replace_substring_regex(arr, OTHER_HSPACE, " ")
    arr = pc.replace_substring_regex(arr, "  +", " ")
    arr = pc.replace_substring_regex(arr, r" ?\n ?", "\n")
    arr = pc.replace_substring_regex(arr, r"\n{3,}", "\n\n")
    return pc.utf8_trim_whitespace(arr)


def _build_tables(points: np.ndarray) -> dict[str, np.ndarray]:
    """Which code points the RE2 classes CONTROL and OTHER_HSPACE match, and which Arrow's
    utf8_trim_whitespace trims, asked of those kernels themselves (so the compiled pass agrees with
    them whatever Unicode version each was built with)."""
    chars = pa.array([chr(c) for c in points.tolist()], pa.string())
    out = {}
    for name, hit in (("control", pc.match_substring_regex(chars, CONTROL)),
                      ("hspace", pc.match_substring_regex(chars, OTHER_HSPACE)),
                      ("trim", pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(chars)), 0))):
        table = np.zeros(quality_loops.CODE_POINTS, dtype=np.bool_)
        table[points[hit.to_numpy(zero_copy_only=False)]] = True
        out[name] = table
    return out


def _tables() -> dict[str, np.ndarray]:
    return quality_loops.code_point_tables("normalize-tables", f"{pa.__version__}|{CONTROL}|{OTHER_HSPACE}|trim",
                                           _build_tables)


@nb.njit(inline="always")
def _put_run(out, k, spaces, breaks):
    """A folded run of spaces and line breaks: one or two line breaks when it held any, else one
    space when it held one, else nothing; returns the next output index."""
    if breaks:
        out[k] = 0x0A
        k += 1
        if breaks > 1:
            out[k] = 0x0A
            k += 1
    elif spaces:
        out[k] = 0x20
        k += 1
    return k


@nb.njit(cache=True, nogil=True)
def _clean_fold(data: np.ndarray, offsets: np.ndarray, control: np.ndarray, hspace: np.ndarray, trim: np.ndarray,
                strip: bool, fold: bool) -> tuple:
    """`clean_and_fold_regex` in one pass per document: an ANSI escape (ESC [ [0-9;?]* letter) at an
    ESC is skipped, then control characters; with `fold`, a run of spaces and line breaks (horizontal
    spaces counted as spaces) becomes one space when it holds no line break, else one or two line
    breaks (RE2's `  +`, ` ?\n ?` and `\n{3,}` in turn give exactly that), and the ends are trimmed
    of what utf8_trim_whitespace trims. The output never outgrows the input."""
    n = len(offsets) - 1
    out = np.empty(max(1, offsets[n] - offsets[0]), dtype=np.uint8)
    out_off = np.zeros(n + 1, dtype=np.int64)
    k = 0
    for d in range(n):
        i, end = offsets[d], offsets[d + 1]
        start = k
        spaces = False
        breaks = 0
        while i < end:
            b = data[i]
            if strip and b == 0x1B and i + 1 < end and data[i + 1] == 0x5B:  # ESC [
                j = i + 2
                while j < end and ((0x30 <= data[j] <= 0x39) or data[j] == 0x3B or data[j] == 0x3F):
                    j += 1
                if j < end and ((0x41 <= data[j] <= 0x5A) or (0x61 <= data[j] <= 0x7A)):
                    i = j + 1
                    continue
            c, j = decode_utf8(data, i)
            if strip and control[c]:
                i = j
                continue
            if fold and (c == 0x20 or hspace[c]):
                spaces = True
                i = j
                continue
            if fold and c == 0x0A:
                breaks += 1
                i = j
                continue
            k = _put_run(out, k, spaces, breaks)
            spaces = False
            breaks = 0
            while i < j:
                out[k] = data[i]
                k += 1
                i += 1
        k = _put_run(out, k, spaces, breaks)
        if fold:  # the ends trimmed, the text moved back to where the document starts
            s, e = quality_loops._trim(out, start, k, trim)
            if s > start:
                out[start:start + e - s] = out[s:e].copy()
            k = start + e - s
        out_off[d + 1] = k
    return out, out_off


def clean_and_fold(arr: pa.Array, strip_control: bool = True, fold_whitespace: bool = True) -> pa.Array:
    """Terminal escapes and control characters removed (`strip_control`), whitespace folded
    (`fold_whitespace`), in one compiled pass with exactly the result of `clean_and_fold_regex`
    (six RE2 passes; 45% of the normalize step)."""
    if not (strip_control or fold_whitespace) or len(arr) == 0:
        return arr
    arr = one_array(arr).cast(pa.string())
    if arr.null_count:
        return clean_and_fold_regex(arr, strip_control, fold_whitespace)
    t = _tables()
    data, offsets = utf8_buffers(arr)
    out, off = _clean_fold(data, offsets, t["control"], t["hspace"], t["trim"], strip_control, fold_whitespace)
    off = off[: len(arr) + 1]
    if off[-1] < (1 << 31) - 1:
        return pa.StringArray.from_buffers(len(arr), pa.py_buffer(off.astype(np.int32)), pa.py_buffer(out))
    return pa.LargeStringArray.from_buffers(len(arr), pa.py_buffer(off), pa.py_buffer(out)).cast(pa.string())


_CONVERTERS: dict = {}


def convert_chinese(arr: pa.Array, conversion: str) -> tuple[pa.Array, int]:
    """Chinese script converted with OpenCC's dictionaries (`t2s`, `s2t`, ...: the opencc wheel's
    configurations, read from the installed package, no network), only in texts holding Han
    characters; also how many texts the conversion changed."""
    if not len(arr):
        return arr, 0
    if conversion not in _CONVERTERS:
        import opencc

        _CONVERTERS[conversion] = opencc.OpenCC(conversion if conversion.endswith(".json") else conversion + ".json")
    converter = _CONVERTERS[conversion]
    hit = pc.fill_null(pc.match_substring_regex(arr, r"\p{Han}"), False)
    if not pc.any(hit).as_py():
        return arr, 0
    values = arr.to_pylist()
    changed = 0
    for i in pc.indices_nonzero(hit).to_pylist():
        converted = converter.convert(values[i])
        if converted != values[i]:
            values[i] = converted
            changed += 1
    return pa.array(values, pa.string()), changed


def normalize_batch(df: pd.DataFrame, chinese_convert: Optional[str] = None, **options: bool) -> BatchResult:
    """Normalise the `text` column (options as in `normalize_array`), then convert Chinese script
    when `chinese_convert` names an OpenCC conversion; nothing is removed here."""
    before = pa.array(df["text"], type=pa.string())
    before = one_array(before)  # a part of several row groups: the masks below need one array
    after = normalize_array(before, **options)
    converted = 0
    if chinese_convert:
        after, converted = convert_chinese(after, chinese_convert)
    out = df.copy()
    out["text"] = pd.array(after, dtype=pd.ArrowDtype(pa.string())) if len(after) else df["text"]
    changed = int(pc.sum(pc.not_equal(before, after)).as_py() or 0) if len(before) else 0
    stats = {
        "docs_in": len(df),
        "docs_out": len(df),
        "docs_changed": changed,
        "chars_in": int(pc.sum(pc.utf8_length(before)).as_py() or 0),
        "chars_out": int(pc.sum(pc.utf8_length(after)).as_py() or 0),
    }
    if chinese_convert:
        stats["chinese_convert"] = chinese_convert
        stats["docs_converted"] = converted
    return BatchResult(kept=out, stats=stats)
