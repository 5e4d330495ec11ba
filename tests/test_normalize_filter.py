import unicodedata

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from corpusmill.pipeline.config import FilterConfig
from corpusmill.stages.boilerplate import line_width, strip_lines, line_hash
from corpusmill.stages.filters import filter_batch
from corpusmill.stages.normalize import normalize_batch
from corpusmill.stages.quality import decide, rule_table, score_texts

EN_PROSE = ("The river ran past the old mill and the children of the village would sit on the stone wall to watch "
            "the water turn the great wheel. In the evening their parents came to take them home, and the miller, "
            "who had known every one of them since they were born, waved to them from his door. ") * 2
ZH_PROSE = ("第一条 为了规范城市道路的管理，保障城市道路完好，充分发挥城市道路功能，促进城市经济和社会发展，制定本条例。"
            "第二条 本条例所称城市道路，是指城市供车辆、行人通行的，具备一定技术条件的道路、桥梁及其附属设施。")
POEM = "建鄴懷古\n楊乘\n故城故壘滿江濆，盡是干戈舊苦辛。\n見此即須知帝力，生來便作太平人。"


def _docs(texts, source="s"):
    return pd.DataFrame({"uid": range(len(texts)), "id": [f"d{i}" for i in range(len(texts))], "text": texts,
                         "source": source, "meta": None})


def test_normalize_nfkc_controls_whitespace_entities():
    df = _docs(["Ｈｅｌｌｏ\u200b  wor\x00ld\r\n\n\n\nnext \x1b[33mline\x1b[m  \t", "你好，世界！（测试）", "a &amp; b &#20013;"])
    r = normalize_batch(df)
    assert r.kept["text"].tolist() == ["Hello world\n\nnext line", "你好，世界！（测试）", "a & b 中"]
    assert r.stats["docs_changed"] == 2 and r.stats["docs_in"] == r.stats["docs_out"] == 3
    # each step can be switched off
    plain = normalize_batch(df, nfkc=False, strip_control=False, fold_whitespace=False, keep_cjk_punctuation=False,
                            fullwidth_ascii=False, html_entities=False)
    assert plain.kept["text"][0].startswith("Ｈｅｌｌｏ\u200b  wor\x00ld") and plain.kept["text"][2] == "a &amp; b &#20013;"
    assert normalize_batch(df, keep_cjk_punctuation=False).kept["text"][1] == "你好,世界!(测试)"
    # full-width ASCII to half-width without the rest of NFKC, keeping Chinese punctuation
    assert normalize_batch(_docs(["Ｈｉ，ＡＢＣ１２３！"]), nfkc=False).kept["text"][0] == "Hi，ABC123！"


@pytest.mark.parametrize("protect", [True, False])
def test_nfkc_leaves_stable_texts_out_with_the_same_result_as_normalising_all(protect):
    """NFKC runs only on the texts holding a character it may change: the result must equal the passes
    over every text, for characters that compose with the one before (combining marks, the second
    halves of canonical pairs of class 0 such as Oriya's and Tamil's vowel signs, Hangul jamo),
    compatibility forms and the protected punctuation."""
    import random

    import pyarrow.compute as pc

    from corpusmill.stages.normalize import _PROTECT, _nfkc

    rng = random.Random(3)
    alphabet = ("aZ 1!~，！（）：；？～\uff21\uff41\u3000\U000F0000\U000F0003\u00e9e\u0301\ufb01中文。\n"
                "\u0b47\u0b3e\u0b57\u0bc6\u0bbe\u1100\u1161\u11a8\uac00\u0915\u093c\u212b\u0345\uff76\uff9e\u337f"
                "\u0f71\u0f72\u0fb5\u0308\u0327\u2460\U0001d400\u1b05\u1b35")
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 10))) for _ in range(20000)] + [None, "plain ascii"]
    arr = pa.array(texts, pa.string())
    ref = arr
    for ch, stand_in in _PROTECT if protect else []:
        ref = pc.replace_substring(ref, ch, stand_in)
    ref = pa.array([None if t is None else unicodedata.normalize("NFKC", t) for t in ref.to_pylist()], pa.string())
    for ch, stand_in in _PROTECT if protect else []:
        ref = pc.replace_substring(ref, stand_in, ch)
    assert _nfkc(arr, protect).to_pylist() == ref.to_pylist()


def test_one_pass_clean_and_fold_equals_the_regex_passes():
    """The compiled escape, control and whitespace pass against its definition (six RE2 passes), on
    texts made of what each pass treats specially: escapes whole and broken, C0/C1 controls, format
    characters, every horizontal space, runs of spaces and line breaks, what trimming takes."""
    import random

    from corpusmill.stages.normalize import clean_and_fold, clean_and_fold_regex

    rng = random.Random(5)
    alphabet = [" ", "  ", "\n", "\n\n\n", "\t", "\xa0", "\u1680", "\u2003", "\u3000", "\u2028", "\u2029", "\x1b[0m",
                "\x1b[", "\x1b", "[1;31m", "\x1b[?25h", "\x1b[12", "\x07", "\x0b", "\x0c", "\r", "\x85", "\x9f", "\x7f",
                "\x00", "\u200b", "\ufeff", "\u00ad", "\u180e", "\u2060", "a", "中", "é", "\U0001d538", "x"]
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 30))) for _ in range(30000)]
    arr = pa.array(texts, pa.string())
    for strip, fold in ((True, True), (True, False), (False, True)):
        assert clean_and_fold(arr, strip, fold).to_pylist() == clean_and_fold_regex(arr, strip, fold).to_pylist()
    sliced = arr.slice(7, 500)  # an array that does not start at its buffer's start
    assert clean_and_fold(sliced).to_pylist() == clean_and_fold_regex(sliced, True, True).to_pylist()
    with_null = pa.array(["a  b", None, "\x1b[0mc"], pa.string())
    assert clean_and_fold(with_null).to_pylist() == ["a b", None, "c"]


def test_nfkc_composes_what_it_normalises():
    """NFKC means composed: a decomposed é becomes one code point and a Hangul syllable stays one
    (pyarrow 23's utf8_normalize(form="NFKC") returns them decomposed, as NFKD would)."""
    from corpusmill.stages.normalize import _nfkc

    out = _nfkc(pa.array(["cafe\u0301 caf\u00e9", "\ud55c\uad6d\uc5b4", "\ufb01ne \uff21", "中文，标点"]), True).to_pylist()
    assert out == ["caf\u00e9 caf\u00e9", "\ud55c\uad6d\uc5b4", "fine A", "中文，标点"]
    assert all(unicodedata.is_normalized("NFKC", t) for t in out[:3])


def test_scores_are_cjk_aware():
    s = score_texts(pa.array(["hello big world", "今天天气很好", "mixed 中文 text!", POEM]))
    assert s["words"].tolist() == [3, 6, 4, 34]
    assert s["cjk_chars"].tolist() == [0, 6, 2, 34]
    assert s["lang"].tolist() == ["en", "zh", "en", "zh"]
    assert s["nonspace_chars"].tolist()[:3] == [13, 6, 12]
    assert s.loc[3, "traditional_share"] == 1.0 and np.isnan(s.loc[0, "traditional_share"])


def test_repetition_and_line_scores():
    spam = "buy now " * 40
    lines = "\n".join(["same line here"] * 6 + ["another line."])
    s = score_texts(pa.array([EN_PROSE, spam, lines, "aaaaaaaaaaaaaaaaaaaaaaaaa is here", "Ã©tÃ© â€œquoteâ€ \ufffd"]))
    assert s.loc[1, "top_2gram_share"] > 0.9 and s.loc[1, "dup_5gram_share"] > 0.9
    assert s.loc[0, "dup_line_share"] == 0 and s.loc[2, "dup_line_share"] == pytest.approx(5 / 7)
    assert s.loc[3, "max_char_run"] == 25
    assert s.loc[4, "garbled_share"] > 0.1
    # the prose repeats itself exactly twice: the second copy, half of it, is covered by repeated 10-grams
    assert 0.45 < s.loc[0, "dup_10gram_share"] <= 0.5


def test_default_rules_keep_prose_laws_poems_and_drop_junk():
    cfg = FilterConfig()
    texts = [EN_PROSE[: len(EN_PROSE) // 2], ZH_PROSE, POEM,
             "Beechy \\Beech\"y\\, a.\n   Of or relating to beeches.\n   [1913 Webster]",  # dictionary fragment
             "Home\nNews\nSports\nWeather\nContact us\nAbout\nLogin\nSearch",  # navigation
             "哈" * 40 + "，" + ZH_PROSE,  # a degenerate run
             "Ã©tÃ© â€œquoteâ€ " * 20 + EN_PROSE[:300]]  # mojibake
    # what makes the two fragments fail Gopher's word count and nothing earlier, from the rules set up here
    for fragment in texts[3:5]:
        assert sum(not c.isspace() for c in fragment) >= cfg.length.min_chars  # not too_few_chars
        assert len(fragment.split()) < cfg.gopher_quality.min_words
    r = filter_batch(_docs(texts), rule_table(cfg))
    assert r.kept["id"].tolist() == ["d0", "d1", "d2"], r.removed[["id", "reason", "score", "threshold"]]
    reasons = r.removed.set_index("id")["reason"].to_dict()
    assert reasons == {"d3": "gopher_few_words", "d4": "gopher_few_words", "d5": "char_run", "d6": "garbled"}
    assert r.stats["by_lang"]["zh"] == {"in": 3, "out": 2} and r.stats["removed_by_lang"]["zh"] == {"char_run": 1}
    removed = r.removed.set_index("id")
    assert removed.loc["d5", "score"] == 40 and removed.loc["d5", "threshold"] == cfg.chinese.max_char_run < 40
    # the same navigation list under a length rule it fails: too_few_chars, the first rule tried
    nav_chars = sum(not c.isspace() for c in texts[4])
    strict = FilterConfig(length={"min_chars": nav_chars + 1})
    r = filter_batch(_docs(texts[4:5]), rule_table(strict))
    assert r.removed[["reason", "score", "threshold"]].values.tolist() == [["too_few_chars", nav_chars, nav_chars + 1]]


def test_score_kept_apart_from_decision(tmp_path):
    cfg = FilterConfig()
    df = _docs([EN_PROSE[: len(EN_PROSE) // 2], ZH_PROSE, POEM])
    first = filter_batch(df, rule_table(cfg), scores_path=str(tmp_path / "s.parquet"))
    assert (tmp_path / "s.parquet").is_file() and len(first.kept) == 3
    strict = FilterConfig(gopher_quality={"min_cjk_chars": 40})
    again = filter_batch(df, rule_table(strict), scores_path=str(tmp_path / "s.parquet"), reuse_scores=True)
    assert again.removed["id"].tolist() == ["d2"] and again.removed["reason"].tolist() == ["gopher_few_words"]
    scores = score_texts(pa.array(df["text"]))
    reason, _, _ = decide(scores, rule_table(strict), keep_scripts=["latin"], min_script_share=0.5)
    assert reason.tolist() == [None, "script_mix", "gopher_few_words"]


def test_boilerplate_lines_are_stripped_and_counted():
    banner = "*** START OF THE PROJECT GUTENBERG EBOOK ***"
    texts = [f"{banner}\nChapter {i}\nIt was a dark night." for i in range(3)]
    out, removed = strip_lines(texts, ["g"] * 3, {"g": {line_hash(banner)}})
    assert out[0] == "Chapter 0\nIt was a dark night." and removed.tolist() == [1, 1, 1]
    assert line_width("上一页") == 6 and line_width("abc") == 3


def _reference_ngram_scores(words: list[str], n: int) -> tuple[float, float]:
    """Plain-Python top_n share and dup_n coverage of one word list."""
    import collections

    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    total = sum(len(w) for w in words)
    counts = collections.Counter(grams)
    top = max((c * sum(len(w) for w in g) for g, c in counts.items() if c > 1), default=0) / total
    covered, seen = [False] * len(words), set()
    for i, g in enumerate(grams):
        if g in seen:  # a later occurrence: the first one is the original
            covered[i:i + n] = [True] * n
        seen.add(g)
    return min(top, 1.0), sum(len(w) for w, c in zip(words, covered) if c) / total


def test_pruned_ngram_scores_equal_a_plain_count():
    import random


    rng = random.Random(5)
    vocab = ["alpha", "be", "cat", "dog", "eel", "fig", "go", "hat"]
    docs = []
    for _ in range(30):
        words = [rng.choice(vocab) for _ in range(rng.randint(3, 120))]
        if rng.random() < 0.5:  # plant a repeated passage
            i = rng.randint(0, max(0, len(words) - 12))
            words += words[i:i + 12]
        docs.append(words)
    texts = pa.array([" ".join(d) for d in docs])
    s = score_texts(texts)
    for i, words in enumerate(docs):
        for n in (2, 3, 4, 5, 7, 10):
            top, dup = _reference_ngram_scores(words, n)
            col = f"top_{n}gram_share" if n <= 4 else f"dup_{n}gram_share"
            assert s.loc[i, col] == pytest.approx(top if n <= 4 else dup), (i, n)


def test_line_counts_per_source(tmp_path):
    import pyarrow.parquet as pq

    from corpusmill.stages.boilerplate import count_lines_part

    banner = "Download the ebook"
    docs = [f"{banner}\n第 {i} 章\n上一页\nSome text {i} here." for i in range(4)] + ["one line doc", f"{banner}\nshort"]
    pq.write_table(pa.table({"text": docs, "source": ["a"] * 4 + ["b"] * 2}), tmp_path / "p.parquet")
    got = count_lines_part(str(tmp_path / "p.parquet"), min_width=6)
    counts = {(r.source, r.hash): r.docs for r in got.itertuples()}
    assert counts[("a", line_hash(banner))] == 4 and counts[("a", line_hash("上一页"))] == 4  # 上一页 is 6 wide
    assert ("b", line_hash(banner)) not in counts  # the two-line document does not count
    assert counts[("a", 0)] == -4 and counts[("b", 0)] == -2  # documents per source
    assert ("a", line_hash("第 1 章")) in counts and counts[("a", line_hash("第 1 章"))] == 1


def test_compiled_text_counts_equal_the_arrow_kernels():
    """The one-pass loop counts what the Arrow/RE2 kernels the scores were defined with count: words
    of utf8_split_whitespace (its empty tokens at a leading or trailing run included), letters, stop
    words after utf8_lower and trimming, word runs, function characters, '#', ellipses and mojibake
    strings."""
    import random

    from corpusmill.stages import quality

    rng = random.Random(7)
    alphabet = list("ab THE.,()#…\t\n\u3000\u00a0\u200b的了國KÂ烫") + ["\u212a", "\u0130", "...", "the", "(With)", "Ã©", "é",
                                                                         "烫烫", "â€", "™", "Ã"]
    texts = pa.array(["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14))) for _ in range(5000)]
                     + ["", "   ", "a  ", "  a", "THE", "\"the\"", "....... …"])
    got = quality._scan(texts, 0.3).text
    words = pc.utf8_split_whitespace(texts)
    w_flat = pc.list_flatten(words)
    w_doc = np.repeat(np.arange(len(texts)), pc.list_value_length(words).to_numpy(zero_copy_only=False))
    has_alpha = pc.match_substring_regex(w_flat, r"[\p{L}]").to_numpy(zero_copy_only=False)
    stop = pc.is_in(pc.utf8_trim(pc.utf8_lower(w_flat), characters=quality.STOP_TRIM),
                    value_set=pa.array(quality.EN_STOP_WORDS)).to_numpy(zero_copy_only=False)
    n = len(texts)
    want = {
        0: pc.count_substring_regex(texts, quality.WORD_CHARS),
        1: pc.count_substring_regex(texts, f"[{quality.ZH_STOP_CHARS}]"),
        2: pc.count_substring(texts, "#"),
        3: pc.count_substring_regex(texts, r"\.\.\.|…"),
        4: sum(pc.count_substring(texts, m).to_numpy(zero_copy_only=False) for m in quality.MOJIBAKE),
        5: np.bincount(w_doc, minlength=n),
        6: np.bincount(w_doc, weights=pc.utf8_length(w_flat).to_numpy(zero_copy_only=False), minlength=n),
        7: np.bincount(w_doc[has_alpha], minlength=n),
        8: np.bincount(w_doc[stop], minlength=n),
    }
    for col, ref in want.items():
        ref = np.asarray(ref.to_numpy(zero_copy_only=False) if hasattr(ref, "to_numpy") else ref, dtype=np.int64)
        bad = np.flatnonzero(got[:, col] != ref)
        assert not len(bad), (col, [texts[int(i)].as_py() for i in bad[:3]], got[bad[:3], col], ref[bad[:3]])
    # the sample exercises stop words, empty tokens and mojibake strings overlapping one another
    assert got[:, 8].sum() > 100 and got[:, 5].max() > 3 and got[:, 4].max() > 2


def test_gopher_components_of_the_one_pass_scan_are_the_lowercased_words_or_cjk_characters():
    """Gopher's components from the fused scan, against Arrow's utf8_lower and a split of each document
    on Python's view of whitespace, punctuation and symbols: per document the same count, the same
    lengths in characters, and equal keys exactly where the components are equal strings (across
    documents too). A zh document (CJK at least cjk_share of its letters) is cut into its characters
    but whitespace, punctuation and symbols."""
    import random
    import unicodedata

    from corpusmill.stages import quality

    rng = random.Random(11)
    alphabet = list("ab AB the.,()#…\t\n\u3000的了國K、。！ÉéİΣσς") + ["\u212a", "Ǆ", "ǅ", "ß", "ﬁ", "-", "'s"]
    texts = [("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))) for _ in range(2000)]
    texts += ["", "  ", "今天天气很好，the", "THE The the", "Straße STRASSE", "中文 中文 english"]
    scan = quality._scan(pa.array(texts), 0.3)
    lowered = pc.utf8_lower(pa.array(texts)).to_pylist()

    def separator(ch: str) -> bool:
        return ch.isspace() or unicodedata.category(ch)[0] in "PSZ"

    want: list[str] = []
    counts = []
    for d, text in enumerate(lowered):
        if scan.zh[d]:
            comps = [ch for ch in text if not separator(ch)]
        else:
            comps, word = [], ""
            for ch in text + " ":
                if separator(ch):
                    if word:
                        comps.append(word)
                    word = ""
                else:
                    word += ch
        want += comps
        counts.append(len(comps))
    assert scan.comp_count.tolist() == counts
    assert scan.comp_len.tolist() == [float(len(w)) for w in want]
    first: dict[str, int] = {}
    same_word = np.array([first.setdefault(w, i) for i, w in enumerate(want)])
    _, same_key = np.unique(scan.comp, return_index=True)
    key_first = same_key[np.unique(scan.comp, return_inverse=True)[1]]
    assert (key_first == same_word).all()
    assert scan.zh.sum() > 100 and (~scan.zh).sum() > 100 and len(set(want)) > 500


def test_normalize_takes_a_part_of_several_row_groups():
    """A part read back from Parquet with several row groups gives a chunked text column; the NFKC
    masks need one array (the real corpus stopped here at the default part size)."""
    chunked = pa.chunked_array([pa.array(["ｆｕｌｌ width", "plain"]), pa.array(["ﬁne", "ascii"])])
    df = pd.DataFrame({"text": pd.arrays.ArrowExtensionArray(chunked)})
    out = normalize_batch(df)
    assert out.kept["text"].tolist() == ["full width", "plain", "fine", "ascii"]
    assert out.stats["docs_changed"] == 2


def test_compiled_xxh3_equals_xxhash_for_every_length_class():
    import xxhash

    from corpusmill.stages.xxh3 import hash_ranges

    rng = np.random.default_rng(3)
    buf = rng.integers(0, 256, 4000, dtype=np.uint8)
    # 0, 1-3, 4-8, 9-16, 17-128, 129-240, long (one block, several blocks, a partial last stripe)
    lengths = [0, 1, 2, 3, 4, 7, 8, 9, 16, 17, 64, 100, 128, 129, 200, 240, 241, 1023, 1024, 1025, 2100, 3999]
    starts = np.array([int(rng.integers(0, 4000 - n + 1)) for n in lengths], dtype=np.int64)
    ends = starts + np.array(lengths, dtype=np.int64)
    want = [xxhash.xxh3_64_intdigest(buf[s:e].tobytes()) for s, e in zip(starts, ends)]
    assert hash_ranges(buf, starts, ends).tolist() == want


def _reference_strip(text: str, bad: set) -> tuple[str, int]:
    """The Python definition the compiled line passes replace: lines trimmed by Arrow, hashed after
    str.strip, removed when listed, the rest joined with blank-line runs cut to one, stripped."""
    import re

    lines = text.split("\n")
    trimmed = pc.utf8_trim_whitespace(pa.array(lines, pa.string())).to_pylist()
    hit = [bool(t) and line_hash(t) in bad for t in trimmed]
    nonempty = sum(1 for t in trimmed if t)
    if not any(hit) or nonempty < 3 or sum(hit) >= nonempty:
        return text, 0
    kept = "\n".join(line for line, h in zip(lines, hit) if not h)
    return re.sub(r"\n{3,}", "\n\n", kept).strip(), sum(hit)


def test_compiled_line_pass_equals_the_python_definition():
    from corpusmill.stages.boilerplate import _split_lines

    banner = "Menu \u00a0| Home"
    texts = [f" {banner}\u3000\nChapter 1\n\n\n{banner}\nIt was a dark night.\x1c\n  \n",
             f"\u2003{banner}\n第 1 章\n上一页 \nfin\n\n\n\n{banner}",
             f"{banner}\n{banner}\n{banner}",  # every line listed: left whole
             "", "\n", f"{banner}\nshort",  # fewer than three lines: left whole
             f"a\n{banner}\nb\n\n\n\nc\t\n"]
    bad = {line_hash(banner)}
    out, removed = strip_lines(texts, ["s"] * len(texts), {"s": bad})
    want = [_reference_strip(t, bad) for t in texts]
    assert out == [w[0] for w in want] and removed.tolist() == [w[1] for w in want]
    lines = _split_lines(pa.array(texts, pa.string()))
    flat = [line for t in texts for line in t.split("\n")]
    trimmed = pc.utf8_trim_whitespace(pa.array(flat, pa.string())).to_pylist()
    assert lines.hashes.tolist() == [line_hash(t) for t in trimmed]
    assert lines.width.tolist() == [line_width(t) if t else 0 for t in trimmed]
    assert [lines.text(k) for k in range(len(flat))] == trimmed


def _reference_segments(texts: pa.Array, pattern: str, cjk_doc: np.ndarray, short: tuple | None) -> dict:
    """The line and paragraph statistics as the Arrow/RE2 kernels define them (the code the compiled
    `segment_scan` replaced): split, utf8_trim_whitespace, dictionary-encoded duplicates, regexes."""
    from corpusmill.stages import quality

    n = len(texts)
    lists = pc.split_pattern(texts, "\n") if pattern == r"\n" else pc.split_pattern_regex(texts, pattern)
    bounds = lists.offsets.to_numpy() - lists.offsets.to_numpy()[0]
    flat = pc.utf8_trim_whitespace(pc.list_flatten(lists))
    seg_doc = np.repeat(np.arange(n), np.diff(bounds))
    lengths = pc.utf8_length(flat).to_numpy(zero_copy_only=False).astype(np.int64)
    real = lengths > 0
    ids = pc.dictionary_encode(flat).indices.to_numpy(zero_copy_only=False).astype(np.int64)
    seen, dup = set(), np.zeros(len(ids), dtype=bool)
    for k in np.flatnonzero(real):
        dup[k] = (seg_doc[k], ids[k]) in seen
        seen.add((seg_doc[k], ids[k]))
    out = {"segments": np.bincount(seg_doc[real], minlength=n), "dup_segments": np.bincount(seg_doc[dup], minlength=n),
           "dup_segment_chars": np.bincount(seg_doc[dup], weights=lengths[dup], minlength=n),
           "segment_chars": np.bincount(seg_doc[real], weights=lengths[real], minlength=n)}

    def count(pat: str) -> np.ndarray:
        hit = pc.match_substring_regex(flat, pat).to_numpy(zero_copy_only=False) & real
        return np.bincount(seg_doc[hit], minlength=n)

    if short is None:
        out["terminal_paras"] = count(quality.TERMINAL_END)
        return out
    out.update(bullet_lines=count(quality.BULLET_START), ellipsis_lines=count(quality.ELLIPSIS_END),
               terminal_lines=count(quality.TERMINAL_END), boilerplate_lines=count(quality.BOILERPLATE_LINE),
               short_lines=np.bincount(seg_doc[real & (lengths <= np.where(cjk_doc[seg_doc], short[1], short[0]))],
                                       minlength=n))
    return out


def test_compiled_segment_pass_equals_the_arrow_kernels():
    """Lines and paragraphs (RE2's \\n\\s*\\n: \\s is [\\t\\n\\f\\r ], no vertical tab, and the match
    runs to the last newline of the run), trimming (Unicode spaces), duplicates, bullets (1-3 digits
    only), ellipses, terminal punctuation, short and boilerplate lines: what the regexes count."""
    import random

    from corpusmill.stages import quality

    rng = random.Random(11)
    alphabet = (list("ab \t\n\n\n\r\f\v.…。-*+•1234、)Z(") +
                ["\u3000", "\u00a0", "\x85", "\u2028", "。。。", "...", "」", "中", "ｘ", "  \n \t\n", "\n\v\n", "- ",
                 "12. ", "a) ", "1234. ", "B.\t", "Privacy Policy", "版权所有", "ok\n", "ok\n"])
    texts = pa.array(["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(4000)]
                     + ["", "\n", "\n\n", "a\n\nb\n\n", "x \n \n y", "1) one\n2) two\n2) two"], pa.string())
    cjk = np.arange(len(texts)) % 3 == 0
    got_lines = quality._segment_stats(texts, False, cjk, 30, 5)
    got_paras = quality._segment_stats(texts, True, cjk, None, None)
    for got, want in ((got_lines, _reference_segments(texts, r"\n", cjk, (30, 5))),
                      (got_paras, _reference_segments(texts, r"\n\s*\n", cjk, None))):
        assert set(got) == set(want)
        for key, ref in want.items():
            bad = np.flatnonzero(np.asarray(got[key], np.float64) != np.asarray(ref, np.float64))
            assert not len(bad), (key, [texts[int(i)].as_py() for i in bad[:3]], got[key][bad[:3]], ref[bad[:3]])
    for key in ("dup_segments", "bullet_lines", "ellipsis_lines", "terminal_lines", "boilerplate_lines", "short_lines"):
        assert got_lines[key].sum() > 50, key  # the sample exercises every count
    assert got_paras["segments"].sum() > got_paras["terminal_paras"].sum() > 50
