import pandas as pd

from stages.filters import length_filter_batch, length_scores
from stages.normalize import normalize_batch


def _docs(texts):
    return pd.DataFrame({"uid": range(len(texts)), "id": [f"d{i}" for i in range(len(texts))], "text": texts,
                         "source": "s", "meta": None})


def test_normalize_nfkc_controls_whitespace():
    df = _docs(["Ｈｅｌｌｏ\u200b  wor\x00ld\r\n\n\n\nnext \x1b[33mline\x1b[m  \t", "你好，世界！（测试）"])
    r = normalize_batch(df)
    assert r.kept["text"].tolist() == ["Hello world\n\nnext line", "你好，世界！（测试）"]
    assert r.stats["docs_changed"] == 1 and r.stats["docs_in"] == r.stats["docs_out"] == 2
    # each step can be switched off
    plain = normalize_batch(df, nfkc=False, strip_control=False, fold_whitespace=False, keep_cjk_punctuation=False)
    assert plain.kept["text"][0].startswith("Ｈｅｌｌｏ\u200b  wor\x00ld")
    ascii_punct = normalize_batch(df, keep_cjk_punctuation=False)
    assert ascii_punct.kept["text"][1] == "你好,世界!(测试)"


def test_cjk_characters_count_as_words():
    s = length_scores(pd.array(["hello big world", "今天天气很好", "mixed 中文 text!"], dtype="string[pyarrow]").__arrow_array__())
    assert s["words"].tolist() == [3, 6, 4]
    assert s["cjk_chars"].tolist() == [0, 6, 2]
    assert s["nonspace_chars"].tolist() == [13, 6, 12]


def test_length_filter_reasons_scores_thresholds():
    df = _docs(["short", "今天天气很好，我们去公园散步吧。", "x" * 50, "a b c d e f g h i j k l"])
    r = length_filter_batch(df, min_chars=8, min_words=10, max_chars=40)
    removed = r.removed.set_index("id")
    assert removed.loc["d0", "reason"] == "too_few_chars" and removed.loc["d0", "score"] == 5 and removed.loc["d0", "threshold"] == 8
    assert removed.loc["d2", "reason"] == "too_few_words"
    assert r.kept["id"].tolist() == ["d1", "d3"]  # 15 CJK words >= 10; 12 latin words
    assert r.stats["removed"] == {"too_few_chars": 1, "too_few_words": 1}
    assert r.stats["docs_in"] == r.stats["docs_out"] + sum(r.stats["removed"].values())
