"""Document length filter, CJK-aware: a CJK character counts as a word, since Chinese has no spaces.

Each rule's score is computed apart from its keep/drop decision (as in NeMo Curator), so removed
documents carry the score and the threshold that removed them.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from .base import BatchResult, removed_frame

CJK = r"\p{Han}\p{Hiragana}\p{Katakana}\p{Hangul}"
SPACE = r"[\s\p{Z}]"
LATIN_WORD = rf"[^\s\p{{Z}}\p{{P}}\p{{S}}{CJK}]+"


def length_scores(texts: pa.Array) -> pd.DataFrame:
    """Per-document counts: characters, non-space characters, CJK characters and words."""
    chars = pc.utf8_length(texts).to_numpy(zero_copy_only=False).astype(np.int64)
    spaces = pc.count_substring_regex(texts, SPACE).to_numpy(zero_copy_only=False).astype(np.int64)
    cjk = pc.count_substring_regex(texts, f"[{CJK}]").to_numpy(zero_copy_only=False).astype(np.int64)
    words = pc.count_substring_regex(texts, LATIN_WORD).to_numpy(zero_copy_only=False).astype(np.int64)
    return pd.DataFrame({"chars": chars, "nonspace_chars": chars - spaces, "cjk_chars": cjk, "words": words + cjk})


def length_filter_batch(df: pd.DataFrame, min_chars: int = 0, min_words: int = 0, max_chars: Optional[int] = None) -> BatchResult:
    """Keep documents within the length bounds; the first failing rule is the reason."""
    scores = length_scores(pa.array(df["text"], type=pa.string()))
    rules = [
        ("too_few_chars", scores["nonspace_chars"], scores["nonspace_chars"] < min_chars, min_chars),
        ("too_few_words", scores["words"], scores["words"] < min_words, min_words),
    ]
    if max_chars is not None:
        rules.append(("too_many_chars", scores["chars"], scores["chars"] > max_chars, max_chars))
    n = len(df)
    reason = np.full(n, None, dtype=object)
    score = np.full(n, np.nan)
    threshold = np.full(n, np.nan)
    for name, value, failed, limit in rules:
        hit = failed.to_numpy() & pd.isna(reason)
        reason[hit] = name
        score[hit] = value.to_numpy()[hit]
        threshold[hit] = limit
    drop = pd.notna(reason)
    removed = df[drop]
    removed_out = removed_frame(removed, pd.Series(reason[drop]), pd.Series(score[drop]), pd.Series(threshold[drop]))
    counts = pd.Series(reason[drop]).value_counts().to_dict() if drop.any() else {}
    stats = {
        "docs_in": n,
        "docs_out": int(n - drop.sum()),
        "removed": {str(k): int(v) for k, v in counts.items()},
        "chars_out": int(scores["chars"][~drop].sum()),
        "cjk_chars_out": int(scores["cjk_chars"][~drop].sum()),
    }
    return BatchResult(kept=df[~drop].reset_index(drop=True), removed=removed_out, stats=stats)
