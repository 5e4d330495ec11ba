"""Quality scores for Chinese and English documents, computed apart from any keep/drop decision.

`score_texts` returns one row of scores per document; `decide` applies thresholds to them. Keeping
the two apart (as NeMo Curator does) lets a run store the scores once and re-apply changed
thresholds without recomputing them.

Everything is computed per batch by compiled loops over the Arrow UTF-8 buffer (`quality_loops`):
- one pass (`doc_scan`) reads every character once for everything counted per character: classes
  (scripts, punctuation, digits, garbled code points, traditional-only and simplified-only
  characters, from lookup tables indexed by code point), words and stop words as Arrow's kernels
  count them, and Gopher's components (lowercased words, or characters for CJK text) as 64-bit keys;
- line and paragraph statistics come from one pass each (the patterns' character classes taken
  from RE2 itself);
- n-gram repetition (Gopher) counts each document's n-grams of components in a small hash table.

A document is "zh" when CJK characters are at least `cjk_share` of its letters; rules that only
make sense for space-delimited text (mean word length, terminal punctuation per line) skip it, and
its n-gram sizes are scaled (a Chinese word is about two characters).
"""
from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from . import quality_loops, quality_rules
from .base import one_array
from .boilerplate import line_trim_table
from .shingles import PUNCT, _drop_table, utf8_buffers

SCORES_VERSION = 3  # bump when a score's definition changes: stored scores of another version are recomputed

# ---- character classes -------------------------------------------------------------------
# class ids (one per code point); letters are split by script
(C_OTHER, C_SPACE, C_PUNCT, C_DIGIT, C_HAN, C_KANA, C_HANGUL, C_LATIN, C_CYRILLIC, C_GREEK, C_ARABIC,
 C_OTHER_LETTER, C_GARBLED) = range(13)
N_CLASSES = 13
SCRIPTS = {"han": C_HAN, "kana": C_KANA, "hangul": C_HANGUL, "latin": C_LATIN, "cyrillic": C_CYRILLIC,
           "greek": C_GREEK, "arabic": C_ARABIC, "other": C_OTHER_LETTER}

# characters whose traditional and simplified forms differ, among the most frequent ones
TRADITIONAL_ONLY = "們這個說來時國會對發為後學經與門開關見話問還點讓進長氣體書東車實頭樣現動機幾麼從當"
SIMPLIFIED_ONLY = "们这个说来时国会对发为后学经与门开关见话问还点让进长气体书东车实头样现动机几么从当"
# strings that only appear when text was decoded with the wrong encoding
MOJIBAKE = ("锟斤拷", "烫烫烫", "屯屯屯", "Ã©", "Ã¨", "Ã¢", "â€™", "â€œ", "â€", "Â ")

CLASS_TABLES_VERSION = 1  # bump when _build_class_tables changes: the tables cached on disk are rebuilt


def _class_tables() -> tuple[np.ndarray, np.ndarray]:
    """(class of every code point, traditional/simplified marker: 1 traditional-only, 2 simplified-only).
    1.1M unicodedata calls take seconds in every process (each Dask worker): cached on disk, keyed by
    the Unicode version and the definition."""
    import unicodedata

    t = quality_loops.code_point_tables(
        "class-tables", f"{unicodedata.unidata_version}{CLASS_TABLES_VERSION}{TRADITIONAL_ONLY}{SIMPLIFIED_ONLY}",
        _build_class_tables)
    return t["cls"], t["ts"]


def _build_class_tables(_points: np.ndarray) -> dict[str, np.ndarray]:
    """Over every code point, surrogates included (they mark a wrong decoding)."""
    import unicodedata

    cls = np.full(0x110000, C_OTHER, dtype=np.uint8)
    for c in range(0x110000):
        cat = unicodedata.category(chr(c))
        if cat[0] == "L":
            cls[c] = C_OTHER_LETTER
        elif cat[0] in "PS":
            cls[c] = C_PUNCT
        elif cat == "Nd":
            cls[c] = C_DIGIT
        elif cat[0] == "Z" or chr(c).isspace():
            cls[c] = C_SPACE
        elif cat in ("Co", "Cs") or 0x80 <= c <= 0x9F:
            cls[c] = C_GARBLED  # private use, surrogates, C1 controls: leftovers of a wrong decoding
    letters = cls == C_OTHER_LETTER
    for lo, hi, k in ((0x4E00, 0x9FFF, C_HAN), (0x3400, 0x4DBF, C_HAN), (0x20000, 0x2FFFF, C_HAN),
                      (0xF900, 0xFAFF, C_HAN), (0x3040, 0x30FF, C_KANA), (0x31F0, 0x31FF, C_KANA),
                      (0xAC00, 0xD7AF, C_HANGUL), (0x1100, 0x11FF, C_HANGUL), (0x3130, 0x318F, C_HANGUL),
                      (0x0041, 0x024F, C_LATIN), (0x1E00, 0x1EFF, C_LATIN), (0xFF21, 0xFF5A, C_LATIN),
                      (0x0370, 0x03FF, C_GREEK), (0x0400, 0x052F, C_CYRILLIC), (0x0600, 0x06FF, C_ARABIC)):
        span = np.arange(lo, hi + 1)
        cls[span[letters[span]]] = k
    cls[0x3007] = C_HAN  # 〇
    cls[0xFFFD] = C_GARBLED
    ts = np.zeros(0x110000, dtype=np.uint8)
    ts[[ord(c) for c in TRADITIONAL_ONLY]] = 1
    ts[[ord(c) for c in SIMPLIFIED_ONLY]] = 2
    return {"cls": cls, "ts": ts}


class DocScan(NamedTuple):
    """`quality_loops.doc_scan` of a batch: what score_texts needs from each character."""
    counts: np.ndarray  # code points per class (n x N_CLASSES)
    trad: np.ndarray
    simp: np.ndarray
    max_run: np.ndarray
    zh: np.ndarray  # scored with the zh rules
    text: np.ndarray  # quality_loops.TEXT_COUNTS columns
    comp: np.ndarray  # Gopher components, flat
    comp_len: np.ndarray
    comp_count: np.ndarray


def _scan(texts: pa.Array, cjk_share: float) -> DocScan:
    cls_table, ts_table = _class_tables()
    flags, low, lower = _text_tables()
    data, offsets = utf8_buffers(texts)
    trim, stop_keys, mojibake, mojibake_len = _scan_constants()
    return DocScan(*quality_loops.doc_scan(
        data, offsets, cls_table, ts_table, N_CLASSES, C_HAN, C_OTHER_LETTER,
        np.array([C_HAN, C_KANA, C_HANGUL], dtype=np.int64), float(cjk_share), flags, low, trim, stop_keys,
        lower, _drop_table(True), mojibake, mojibake_len))


@functools.cache
def _scan_constants() -> tuple[np.ndarray, tuple, np.ndarray, np.ndarray]:
    """doc_scan's forms of STOP_TRIM (a table of ASCII), EN_STOP_WORDS (their `stop_key`s) and MOJIBAKE
    (rows of UTF-8 bytes, padded, and their lengths): built once per process, not per chunk."""
    trim = np.zeros(128, dtype=np.bool_)
    trim[[ord(c) for c in STOP_TRIM]] = True
    stop_keys = tuple(quality_loops.stop_key(w) for w in EN_STOP_WORDS)
    encoded = [m.encode() for m in MOJIBAKE]
    table = np.zeros((len(encoded), max(map(len, encoded))), dtype=np.uint8)
    for k, b in enumerate(encoded):
        table[k, :len(b)] = np.frombuffer(b, np.uint8)
    return trim, stop_keys, table, np.array([len(b) for b in encoded], dtype=np.int64)


def _char_scores(scan: DocScan) -> dict[str, np.ndarray]:
    counts, trad, simp, max_run = scan.counts, scan.trad, scan.simp, scan.max_run
    letters = counts[:, C_HAN:C_OTHER_LETTER + 1].sum(axis=1)
    cjk = counts[:, C_HAN] + counts[:, C_KANA] + counts[:, C_HANGUL]
    chars = counts.sum(axis=1)
    nonspace = chars - counts[:, C_SPACE]
    out = {
        "chars": chars, "nonspace_chars": nonspace, "letters": letters, "cjk_chars": cjk,
        "punct_density": counts[:, C_PUNCT] / np.maximum(nonspace, 1),
        "digit_share": counts[:, C_DIGIT] / np.maximum(nonspace, 1),
        "garbled_chars": counts[:, C_GARBLED],
        "max_char_run": max_run,
        "traditional_share": trad / np.maximum(trad + simp, 1),
        "trad_simp_marked": trad + simp,
    }
    for name, k in SCRIPTS.items():
        out[f"script_{name}"] = counts[:, k] / np.maximum(letters, 1)
    out["cjk_share"] = cjk / np.maximum(letters, 1)
    return out


# ---- lines and paragraphs -------------------------------------------------------------------
BULLET_START = r"^\s*([•●○◦▪▫■□‣⁃∙·・\-\*\+–—]|\d{1,3}[.)、]|[a-zA-Z][.)])\s"
ELLIPSIS_END = r"(\.\.\.|…|。。。)\s*$"
TERMINAL_END = r"[.!?。！？…\"'”’」』)）]\s*$"
BOILERPLATE_LINE = (r"(?i)(javascript|enable cookies|cookie policy|we use cookies|privacy policy|terms of (use|service)|"
                    r"all rights reserved|版权所有|隐私政策|使用条款|使用协议|京ICP备|ICP备案|请启用JavaScript)")


def _segment_tables() -> tuple[np.ndarray, np.ndarray]:
    """(bullet, terminal) per code point for `quality_loops.segment_scan`, taken from the RE2
    patterns: a character followed by a space matches BULLET_START (the bullet marks; digits and
    letters are checked in the loop), a character alone matches TERMINAL_END."""
    t = quality_loops.code_point_tables("segment-tables", f"{pa.__version__}{BULLET_START}{TERMINAL_END}",
                                        _build_segment_tables)
    return t["bullet"], t["terminal"]


def _build_segment_tables(points: np.ndarray) -> dict[str, np.ndarray]:
    chars = pa.array([chr(c) for c in points.tolist()], pa.string())
    tables = {}
    for name, probe, pattern in (("bullet", pc.binary_join_element_wise(chars, " ", ""), BULLET_START),
                                 ("terminal", chars, TERMINAL_END)):
        table = np.zeros(quality_loops.CODE_POINTS, dtype=np.bool_)
        table[points[pc.match_substring_regex(probe, pattern).to_numpy(zero_copy_only=False)]] = True
        tables[name] = table
    return tables


def _segment_stats(texts: pa.Array, paragraphs: bool, cjk_doc: np.ndarray, short_chars: Optional[int],
                   short_chars_cjk: Optional[int]) -> dict[str, np.ndarray]:
    """Per document: segment count (lines, or with `paragraphs` the pieces between blank lines),
    duplicate segments (after the first) by count and characters, and bullet / ellipsis / terminal /
    short / boilerplate line counts; one compiled pass (`quality_loops.segment_scan`) but for the
    boilerplate phrases, searched only in the lines of documents that hold one."""
    n = len(texts)
    data, offsets = utf8_buffers(texts)
    bullet, terminal = _segment_tables()
    if short_chars is None:
        limit = np.full(n, -1, dtype=np.int64)
    else:
        limit = np.where(np.asarray(cjk_doc, dtype=bool), short_chars_cjk, short_chars).astype(np.int64)
    c = quality_loops.segment_scan(data, offsets, paragraphs, line_trim_table(), bullet, terminal, limit)
    out = {"segments": c[:, 0], "dup_segments": c[:, 1], "dup_segment_chars": c[:, 2].astype(np.float64),
           "segment_chars": c[:, 3].astype(np.float64)}
    if paragraphs:
        out["terminal_paras"] = c[:, 6]
        return out
    out.update(bullet_lines=c[:, 4], ellipsis_lines=c[:, 5], terminal_lines=c[:, 6], short_lines=c[:, 7])
    # unanchored, never spanning a newline, starting and ending with no whitespace: a line can only
    # match in a document that matches, and matches with or without the whitespace (and "\n") at its
    # ends. So only the (few) matching documents are searched, line by line, as a string array of
    # lines over their own bytes.
    boilerplate = np.zeros(n, dtype=np.int64)
    doc_hit = np.flatnonzero(pc.fill_null(pc.match_substring_regex(texts, BOILERPLATE_LINE), False)
                             .to_numpy(zero_copy_only=False))
    if len(doc_hit):
        sub = texts.take(pa.array(doc_hit))
        bounds, per_doc = quality_loops.line_bounds(*utf8_buffers(sub))
        lines = pa.StringArray.from_buffers(len(bounds) - 1, pa.py_buffer(bounds), sub.buffers()[2])
        hit = pc.match_substring_regex(lines, BOILERPLATE_LINE).to_numpy(zero_copy_only=False)
        boilerplate[doc_hit] = np.bincount(np.repeat(np.arange(len(doc_hit)), per_doc)[hit], minlength=len(doc_hit))
    out["boilerplate_lines"] = boilerplate
    return out


# ---- n-gram repetition (Gopher) ----------------------------------------------------------------
TOP_NGRAMS = (2, 3, 4)
DUP_NGRAMS = (5, 6, 7, 8, 9, 10)


def _ngram_scores(scan: DocScan, cjk_scale: int) -> dict[str, np.ndarray]:
    """Gopher's repetition scores over components (lowercased words without punctuation, or the
    characters of a zh document): top_N = share of component characters in the most frequent N-gram
    (times its count), dup_N = share of component characters covered by N-grams that occur more
    than once."""
    starts = np.zeros(len(scan.comp_count) + 1, dtype=np.int64)
    np.cumsum(scan.comp_count, out=starts[1:])
    all_sizes = TOP_NGRAMS + DUP_NGRAMS
    sizes = np.array(all_sizes, dtype=np.int64)
    window = np.where(scan.zh[:, None], sizes * cjk_scale, sizes).astype(np.int64)
    scores = quality_loops.ngram_repetition(scan.comp, starts, scan.comp_len, np.ascontiguousarray(window),
                                            len(TOP_NGRAMS))
    return {f"{'top' if size in TOP_NGRAMS else 'dup'}_{size}gram_share": scores[:, k] for k, size in enumerate(all_sizes)}


# ---- stop words ----------------------------------------------------------------------------
EN_STOP_WORDS = ("the", "be", "to", "of", "and", "that", "have", "with")  # lowercase ASCII letters, at most 8 (doc_scan keys)
ZH_STOP_CHARS = "的了是在不有和人这這之也而其以于於为為一无無与與中上大"


WORD_CHARS = r"[^\s\p{Z}\p{P}\p{S}\p{Han}\p{Hiragana}\p{Katakana}\p{Hangul}]+"  # a run of them is a word
STOP_TRIM = ".,;:!?\"'()[]{}"


def _text_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(flags, lowmap, lower) per code point for `quality_loops.doc_scan`, taken from the Arrow kernels
    (RE2 classes, utf8_split_whitespace, utf8_lower) the scores were defined with, applied to every
    code point once: the compiled loop then counts exactly what those kernels count."""
    t = quality_loops.code_point_tables("text-tables", f"2{pa.__version__}{WORD_CHARS}{ZH_STOP_CHARS}{MOJIBAKE}{PUNCT}",
                                        _build_text_tables)
    return t["flags"], t["lowmap"], t["lower"]


def _build_text_tables(points: np.ndarray) -> dict[str, np.ndarray]:
    L = quality_loops
    chars = pa.array([chr(c) for c in points.tolist()], pa.string())
    flags = np.zeros(L.CODE_POINTS, dtype=np.uint8)

    def mark(hit: pa.Array, flag: int) -> None:
        flags[points[np.asarray(hit.to_numpy(zero_copy_only=False), dtype=bool)]] |= flag

    wrapped = pc.binary_join_element_wise("a", chars, "b", "")  # a<c>b splits in two where c is a space
    mark(pc.equal(pc.list_value_length(pc.utf8_split_whitespace(wrapped)), 2), L.WS)
    mark(pc.equal(pc.count_substring_regex(chars, WORD_CHARS), 0), L.WORD_SEP)
    mark(pc.match_substring_regex(chars, r"[\p{L}]"), L.LETTER)
    mark(pc.is_in(chars, value_set=pa.array(list(ZH_STOP_CHARS))), L.ZH_STOP)
    mark(pc.is_in(chars, value_set=pa.array(sorted({m[0] for m in MOJIBAKE}))), L.MOJIBAKE_START)
    mark(pc.match_substring_regex(chars, PUNCT), L.PUNCT)
    lowered = pc.utf8_lower(chars)
    single_ascii = pc.and_(pc.equal(pc.binary_length(lowered), 1), pc.equal(pc.utf8_length(lowered), 1))
    low = np.zeros(L.CODE_POINTS, dtype=np.uint8)
    one = np.asarray(single_ascii.to_numpy(zero_copy_only=False), dtype=bool)
    low[points[one]] = np.frombuffer(b"".join(v.encode() for v in lowered.filter(single_ascii).to_pylist()), np.uint8)
    # utf8_lower maps every code point to exactly one code point
    lower = np.arange(L.CODE_POINTS, dtype=np.uint32)
    mapped = np.frombuffer("".join(lowered.to_pylist()).encode("utf-32-le"), np.uint32)
    if len(mapped) != len(points):
        raise RuntimeError("this pyarrow's utf8_lower maps a code point to several: the lowercase table cannot be built")
    lower[points] = mapped
    return {"flags": flags, "lowmap": low, "lower": lower}


def score_texts(texts: pa.Array, cjk_share: float = 0.3, cjk_ngram_scale: int = 2,
                short_line_chars: int = 30, short_line_chars_cjk: int = 5) -> pd.DataFrame:
    """Every score of every document (one row per document, in order)."""
    texts = one_array(texts)
    texts = texts.cast(pa.string())
    scan = _scan(texts, cjk_share)  # classes, words, stop words, symbols, Gopher components: one compiled pass
    s = _char_scores(scan)
    zh = scan.zh
    lines = _segment_stats(texts, False, zh, short_line_chars, short_line_chars_cjk)
    paras = _segment_stats(texts, True, zh, None, None)
    tc = scan.text
    latin_words, zh_stop, symbols = tc[:, 0], tc[:, 1], tc[:, 2] + tc[:, 3]
    ws_words, ws_word_chars, alpha_words, en_stop = tc[:, 5], tc[:, 6], tc[:, 7], tc[:, 8]
    lorem = pc.match_substring(texts, "lorem ipsum", ignore_case=True).to_numpy(zero_copy_only=False)
    mojibake = tc[:, 4]
    words = latin_words + s["cjk_chars"]
    line_n = np.maximum(lines["segments"], 1)
    df = pd.DataFrame({
        "lang": np.where(zh, "zh", np.where(s["script_latin"] >= 0.5, "en", "other")),
        "chars": s["chars"], "nonspace_chars": s["nonspace_chars"], "cjk_chars": s["cjk_chars"],
        "words": words,
        "mean_word_length": ws_word_chars.astype(np.float64) / np.maximum(ws_words, 1),
        "symbol_word_ratio": symbols / np.maximum(words, 1),
        "alpha_word_share": np.where(zh, s["letters"] / np.maximum(s["nonspace_chars"], 1),
                                     alpha_words / np.maximum(ws_words, 1)),
        "stop_words": np.where(zh, zh_stop, en_stop),
        "lines": lines["segments"],
        "bullet_line_share": lines["bullet_lines"] / line_n,
        "ellipsis_line_share": lines["ellipsis_lines"] / line_n,
        # hard-wrapped prose (Gutenberg) ends its paragraphs, not its lines, with punctuation
        "terminal_line_share": np.maximum(lines["terminal_lines"] / line_n,
                                          paras["terminal_paras"] / np.maximum(paras["segments"], 1)),
        "short_line_share": lines["short_lines"] / line_n,
        "boilerplate_line_share": lines["boilerplate_lines"] / line_n,
        "dup_line_share": lines["dup_segments"] / line_n,
        "dup_line_char_share": lines["dup_segment_chars"] / np.maximum(lines["segment_chars"], 1),
        "dup_para_share": paras["dup_segments"] / np.maximum(paras["segments"], 1),
        "dup_para_char_share": paras["dup_segment_chars"] / np.maximum(paras["segment_chars"], 1),
        "lorem_ipsum": lorem.astype(np.int64),
        "garbled_share": (s["garbled_chars"] + 3 * mojibake) / np.maximum(s["nonspace_chars"], 1),
        "garbled_chars": s["garbled_chars"] + 3 * mojibake,
        "max_char_run": s["max_char_run"],
        "punct_density": s["punct_density"],
        "cjk_share": s["cjk_share"],
        "traditional_share": np.where(s["trad_simp_marked"] > 0, s["traditional_share"], np.nan),
        **{f"script_{name}": s[f"script_{name}"] for name in SCRIPTS},
    })
    for key, value in _ngram_scores(scan, cjk_ngram_scale).items():
        df[key] = value
    return df


def rule_table(fc) -> list[tuple]:
    """(reason, score column, 'min' | 'max', threshold, applies_to 'all' | 'zh' | 'non_zh', guard)
    for every enabled rule of a FilterConfig, in the order they are tried (the first failing one is
    the reason). A guard (column, minimum) limits a rule to documents at least that long."""
    rules: list[tuple] = []
    if getattr(fc, "blocked_words", None) is not None and fc.blocked_words.file:  # a user's list: its reason first
        rules.append(("blocked_words", "blocked_words_per_1k", "max", fc.blocked_words.max_per_1000_chars, "all"))
    L = fc.length
    rules += [("too_few_chars", "nonspace_chars", "min", L.min_chars, "all"),
              ("too_few_words", "words", "min", L.min_words, "all"),
              ("too_many_chars", "chars", "max", L.max_chars, "all")]
    Z = fc.chinese  # degenerate text first: its reason says more than a repetition score
    if Z.enabled:
        # a share for long texts, a count for short ones: both must be exceeded (one rare character in the
        # private-use area is 2% of a 44-character poem)
        garbled_guard = None if Z.max_garbled_chars is None else ("garbled_chars", Z.max_garbled_chars + 1)
        rules += [("garbled", "garbled_share", "max", Z.max_garbled_share, "all", garbled_guard),
                  ("char_run", "max_char_run", "max", Z.max_char_run, "all"),
                  ("punctuation_density", "punct_density", "max", Z.max_punct_density, "all"),
                  ("low_cjk_share", "cjk_share", "min", Z.min_cjk_share, "zh"),
                  ("traditional_mix", "traditional_share", "max", Z.max_traditional_share, "zh")]
    G = fc.gopher_quality
    if G.enabled:
        rules += [("gopher_few_words", "words", "min", G.min_words, "non_zh"),
                  ("gopher_few_words", "cjk_chars", "min", G.min_cjk_chars, "zh"),
                  ("gopher_many_words", "words", "max", G.max_words, "all"),
                  ("gopher_short_words", "mean_word_length", "min", G.min_mean_word_length, "non_zh"),
                  ("gopher_long_words", "mean_word_length", "max", G.max_mean_word_length, "non_zh"),
                  ("gopher_symbols", "symbol_word_ratio", "max", G.max_symbol_word_ratio, "all"),
                  ("gopher_bullet_lines", "bullet_line_share", "max", G.max_bullet_line_share, "all"),
                  ("gopher_ellipsis_lines", "ellipsis_line_share", "max", G.max_ellipsis_line_share, "all"),
                  ("gopher_non_alpha", "alpha_word_share", "min", G.min_alpha_word_share, "non_zh"),
                  ("gopher_non_alpha", "alpha_word_share", "min", G.min_alpha_share_zh, "zh"),
                  ("gopher_stop_words", "stop_words", "min", G.min_stop_words, "non_zh"),
                  ("gopher_stop_words", "stop_words", "min", G.min_stop_words_zh, "zh",
                   ("cjk_chars", G.stop_words_zh_min_chars))]
    R = fc.gopher_repetition
    if R.enabled:
        rules += [("dup_lines", "dup_line_share", "max", R.max_dup_line_share, "all"),
                  ("dup_paragraphs", "dup_para_share", "max", R.max_dup_para_share, "all"),
                  ("dup_line_chars", "dup_line_char_share", "max", R.max_dup_line_char_share, "all"),
                  ("dup_paragraph_chars", "dup_para_char_share", "max", R.max_dup_para_char_share, "all")]
        for kind, sizes in (("top", TOP_NGRAMS), ("dup", DUP_NGRAMS)):
            for n in sizes:
                limit = getattr(R, f"max_{kind}_{n}gram_share")
                zh_limit = None if limit is None else min(1.0, limit * R.cjk_threshold_scale)
                rules += [(f"{kind}_{n}gram", f"{kind}_{n}gram_share", "max", limit, "non_zh"),
                          (f"{kind}_{n}gram", f"{kind}_{n}gram_share", "max", zh_limit, "zh")]
    C = fc.c4
    if C.enabled:
        rules += [("lorem_ipsum", "lorem_ipsum", "max", 0 if C.lorem_ipsum else None, "all"),
                  ("boilerplate", "boilerplate_line_share", "max", C.max_boilerplate_line_share, "all"),
                  ("few_terminal_lines", "terminal_line_share", "min", C.min_terminal_line_share,
                   "all" if C.terminal_punctuation_for_zh else "non_zh"),
                  ("short_lines", "short_line_share", "max", C.max_short_line_share, "all")]
    rules += quality_rules.rule_tuples(getattr(fc, "rules", None) or {})  # the registered families filter.rules names
    return [(*r, None) if len(r) == 5 else r for r in rules if r[3] is not None]


def dominant_script(scores: pd.DataFrame) -> np.ndarray:
    """The script holding most of each document's letters (a SCRIPTS name; None without letters), from
    the script_* shares, which no scoring option changes."""
    names = list(SCRIPTS)
    shares = np.column_stack([scores[f"script_{k}"].to_numpy(dtype=float) for k in names])
    out = np.asarray(names, dtype=object)[np.argmax(shares, axis=1)] if len(shares) else np.zeros(0, dtype=object)
    out[shares.max(axis=1, initial=0.0) <= 0] = None  # no letters: no script
    return out


def script_language(texts: "pa.Array | list[str]", cjk_share: float = 0.3) -> np.ndarray:
    """The language the filter detects (`lang` of score_texts: zh when CJK letters are at least
    `cjk_share` of the letters, en when Latin letters are at least half, otherwise other), from the
    character classes alone, so the reader can give every document its `language` column cheaply:
    counted by the compiled character-class loop straight from the Arrow UTF-8 buffer."""
    if not isinstance(texts, pa.Array):
        texts = pa.array(texts, pa.string())
    if len(texts) == 0:
        return np.empty(0, dtype=object)
    cls_table, ts_table = _class_tables()
    data, offsets = utf8_buffers(texts)
    counts = quality_loops.char_classes(data, offsets, cls_table, ts_table, N_CLASSES, C_HAN, C_OTHER_LETTER)[0]
    letters = np.maximum(counts[:, C_HAN:C_OTHER_LETTER + 1].sum(axis=1), 1)
    cjk = counts[:, C_HAN] + counts[:, C_KANA] + counts[:, C_HANGUL]
    return np.where(cjk / letters >= cjk_share, "zh",
                    np.where(counts[:, C_LATIN] / letters >= 0.5, "en", "other")).astype(object)


def detected_language(scores: pd.DataFrame, cjk_share: float) -> np.ndarray:
    """The `lang` column score_texts gives with this cjk_share, from the shares alone (no rescoring);
    with a language model's `language` column, that one as zh / en / other."""
    if "language" in scores:
        model = scores["language"].to_numpy(dtype=object)
        return np.where(np.isin(model, ["zh", "en"]), model, "other").astype(object)
    zh = scores["cjk_share"].to_numpy(dtype=float) >= cjk_share
    return np.where(zh, "zh", np.where(scores["script_latin"].to_numpy(dtype=float) >= 0.5, "en", "other")).astype(object)


# Languages written in CJK characters without spaces between words: the "zh" rules (characters, not
# words) apply to them. The script heuristic gives only zh/en/other; with a language model the code
# decides, and the model labels some classical Chinese (Tang/Song poems) ja or a Chinese variety
# wuu/yue, which word rules (mean word length over space-separated "words") would remove. ko keeps the
# character rules the heuristic gave Hangul text (it counts Hangul as CJK).
CJK_SCOPE_LANGUAGES = ("zh", "ja", "ko", "wuu", "yue")


def decide(scores: pd.DataFrame, rules: list, keep_scripts: Optional[list[str]] = None,
           min_script_share: float = 0.0, keep_languages: Optional[list[str]] = None,
           min_language_score: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(reason, score, threshold) per document; reason None means kept. The first failing rule wins;
    with `keep_languages` (the `language` score column of a language model), a document in another
    language, or identified with less than `min_language_score`, fails first (reason language)."""
    n = len(scores)
    reason = np.full(n, None, dtype=object)
    score = np.full(n, np.nan)
    threshold = np.full(n, np.nan)
    if keep_languages and "language" in scores:
        prob = scores["language_score"].to_numpy(dtype=float)
        hit = ~np.isin(scores["language"].to_numpy(dtype=object), keep_languages) | (prob < min_language_score)
        reason[hit], score[hit], threshold[hit] = "language", prob[hit], min_language_score
    zh = np.isin(scores["lang"].to_numpy(dtype=object), CJK_SCOPE_LANGUAGES)
    for name, column, kind, limit, applies, guard in rules:
        value = scores[column].to_numpy(dtype=float)
        failed = value < limit if kind == "min" else value > limit
        failed &= ~np.isnan(value)
        if guard:
            failed &= scores[guard[0]].to_numpy(dtype=float) >= guard[1]
        if applies == "zh":
            failed &= zh
        elif applies == "non_zh":
            failed &= ~zh
        hit = failed & pd.isna(reason)
        reason[hit], score[hit], threshold[hit] = name, value[hit], limit
    if keep_scripts:
        share = sum(scores[f"script_{s}"].to_numpy() for s in keep_scripts)
        hit = (share < min_script_share) & (scores["nonspace_chars"].to_numpy() > 0) & pd.isna(reason)
        reason[hit], score[hit], threshold[hit] = "script_mix", share[hit], min_script_share
    return reason, score, threshold


def describe_rules() -> dict[str, str]:
    """Reason code -> what it means, for the report (the registered rule families' too)."""
    added = {k: v for rule in quality_rules.registered().values() for k, v in rule.reasons.items()}
    return {**added,
        "too_few_chars": "fewer non-space characters than filter.length.min_chars",
        "too_few_words": "fewer words (a CJK character counts as one) than filter.length.min_words",
        "too_many_chars": "more characters than filter.length.max_chars",
        "gopher_few_words": "fewer words (non-Chinese) or CJK characters (Chinese) than Gopher's minimum",
        "gopher_many_words": "more words than Gopher's maximum",
        "gopher_short_words": "mean word length below the minimum (non-Chinese)",
        "gopher_long_words": "mean word length above the maximum (non-Chinese)",
        "gopher_symbols": "too many '#' and ellipses per word",
        "gopher_bullet_lines": "too many lines start with a bullet",
        "gopher_ellipsis_lines": "too many lines end with an ellipsis",
        "gopher_non_alpha": "too few words with a letter (Chinese: too few letters among non-space characters)",
        "gopher_stop_words": "too few stop words (English) or function characters (Chinese)",
        "dup_lines": "too many lines repeat an earlier line",
        "dup_paragraphs": "too many paragraphs repeat an earlier paragraph",
        "dup_line_chars": "too many characters in repeated lines",
        "dup_paragraph_chars": "too many characters in repeated paragraphs",
        **{f"top_{n}gram": f"the most frequent {n}-gram covers too much of the text" for n in TOP_NGRAMS},
        **{f"dup_{n}gram": f"repeated {n}-grams cover too much of the text" for n in DUP_NGRAMS},
        "lorem_ipsum": "contains 'lorem ipsum'",
        "boilerplate": "too many lines of JavaScript / cookie / policy / copyright boilerplate",
        "few_terminal_lines": "too few lines end in terminal punctuation (lists, tables, fragments)",
        "short_lines": "too many very short lines (navigation, menus)",
        "garbled": "replacement characters, private-use or C1 control characters, or mojibake: more than "
                   "filter.chinese.max_garbled_share of the text and more than max_garbled_chars of them",
        "char_run": "a letter repeated too many times in a row",
        "punctuation_density": "mostly punctuation and symbols",
        "low_cjk_share": "a Chinese document with too few CJK characters among its letters",
        "traditional_mix": "a Chinese document with too many traditional-only characters",
        "script_mix": "too few letters in the scripts filter.scripts.keep",
        "language": "identified language not in filter.language.keep, or identified with less than "
                    "filter.language.min_score",
        "blocked_words": "more matches of the blocked-words list (filter.blocked_words.file) per 1,000 characters "
                         "than filter.blocked_words.max_per_1000_chars",
    }
