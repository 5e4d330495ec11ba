"""Unicode and whitespace normalisation, vectorised with Arrow's native string kernels (RE2).

Runs before filtering and deduplication so that trivially different copies (full-width letters,
stray control bytes, trailing spaces) hash the same.
"""
from __future__ import annotations

import unicodedata
from typing import Optional

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from .base import BatchResult, one_array

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
    """NFKC (CJK punctuation protected when asked) of the texts that are not pure ASCII: ASCII text
    holds neither protected punctuation nor stand-ins and is its own normal form, so the 17 passes
    over the whole array shrink to passes over the rest, with the same result."""
    if len(arr) == 0:
        return arr
    other = pc.invert(pc.fill_null(pc.string_is_ascii(arr), True))
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

    arr = pc.replace_substring(arr, "\r\n", "\n")
    arr = pc.replace_substring(arr, "\r", "\n")
    if html_entities:
        arr = _map_matching(arr, HTML_ENTITY, html.unescape)
    if fullwidth_ascii and not nfkc:
        table = _fullwidth_table(keep_cjk_punctuation)
        arr = _map_matching(arr, FULLWIDTH, lambda t: t.translate(table))
    if nfkc:
        arr = _nfkc(arr, keep_cjk_punctuation)
    if strip_control:
        arr = pc.replace_substring_regex(arr, ANSI_ESCAPE, "")
        arr = pc.replace_substring_regex(arr, CONTROL, "")
    if fold_whitespace:
        arr = fold_whitespace_array(arr)
    if chinese_convert:
        arr, _ = convert_chinese(arr, chinese_convert)
    return arr


def fold_whitespace_array(arr: pa.Array) -> pa.Array:
    """The whitespace folding of `normalize_array` on its own: `normalize_array(x, **opts)` equals
    `fold_whitespace_array(normalize_array(x, **opts, fold_whitespace=False))` when no Chinese
    conversion follows, so dedup normalises once for shingling (which splits on any whitespace)
    and folds that for the exact hash."""
    arr = pc.replace_substring_regex(arr, OTHER_HSPACE, " ")
    arr = pc.replace_substring_regex(arr, "  +", " ")
    arr = pc.replace_substring_regex(arr, r" ?\n ?", "\n")
    arr = pc.replace_substring_regex(arr, r"\n{3,}", "\n\n")
    return pc.utf8_trim_whitespace(arr)


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
