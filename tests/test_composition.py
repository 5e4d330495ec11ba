"""Kernels of the corpus by source and language: the reader's language, group counts, which groups
fill each packed window."""
from __future__ import annotations

import numpy as np

from corpusmill.stages.composition import group_counts, window_groups
from corpusmill.stages.quality import score_texts, script_language


def test_script_language_agrees_with_the_filters_detected_language():
    import pyarrow as pa

    texts = ["The river runs by the old mill.", "今天天气很好，我们去公园散步。", "Привет, как дела?",
             "混合 text with 一些 中文", "", "12345 !!!"]
    assert script_language(texts).tolist() == score_texts(pa.array(texts))["lang"].tolist()
    assert script_language(texts, cjk_share=0.9)[3] == "en"


def test_group_counts_sum_per_source_and_language():
    out = group_counts(["a", "a", "b", None], ["zh", "en", "zh", "zh"], chars=[3, 4, 5, 6], tokens=[1, 2, 3, 4])
    assert out == {"a": {"en": {"docs": 1, "chars": 4, "tokens": 2}, "zh": {"docs": 1, "chars": 3, "tokens": 1}},
                   "b": {"zh": {"docs": 1, "chars": 5, "tokens": 3}}, "(none)": {"zh": {"docs": 1, "chars": 6, "tokens": 4}}}


def test_window_groups_split_documents_at_window_boundaries_and_leave_out_the_cut():
    # documents of 5, 3, 6 ids in groups 0, 1, 0, windows of 4: ids 0-3 | 4-7 | 8-11, ids 12-13 cut
    win, grp, tok, dominant = window_groups(np.array([0, 1, 0]), np.array([5, 3, 6]), 4, 3, "concat")
    assert list(zip(win.tolist(), grp.tolist(), tok.tolist())) == [(0, 0, 4), (1, 0, 1), (1, 1, 3), (2, 0, 4)]
    assert dominant.tolist() == [0, 1, 0]
    win, grp, tok, dominant = window_groups(np.array([2, 0]), np.array([9, 2]), 4, 2, "pad")
    assert tok.tolist() == [4, 2] and dominant.tolist() == [2, 0]
