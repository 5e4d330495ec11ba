"""The filter stage's batch step: boilerplate lines removed, quality scores computed (or loaded),
thresholds applied. Scores are kept apart from the decision (as in NeMo Curator): a part's scores
are written once and a changed threshold is re-applied to them without recomputing.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from .base import BatchResult, removed_frame, write_table_atomic
from .boilerplate import strip_lines
from .quality import decide, score_texts


def filter_batch(df: pd.DataFrame, rules: list, drop_lines: Optional[dict] = None, scores_path: Optional[str] = None,
                 reuse_scores: bool = False, keep_scripts: Optional[list[str]] = None, min_script_share: float = 0.0,
                 score_options: Optional[dict] = None, audit_text_chars: Optional[int] = 2000,
                 name_lines: Optional[list[int]] = None) -> BatchResult:
    """Clean, score (or load the scores of) and decide one partition; the first failing rule is
    each removed document's reason, with its score, threshold and text (its first
    `audit_text_chars` characters, as it came in)."""
    texts, sources = df["text"].tolist(), df["source"].fillna("").tolist()
    lines_removed = np.zeros(len(df), dtype=np.int64)
    named: dict[int, Optional[list]] = dict.fromkeys(name_lines or [])
    if drop_lines:
        texts, lines_removed = strip_lines(texts, sources, drop_lines, named)
    if reuse_scores and scores_path and os.path.isfile(scores_path):
        scores = pq.read_table(scores_path).to_pandas()
        if len(scores) != len(df) or not np.array_equal(scores["uid"].to_numpy(), df["uid"].to_numpy(dtype="int64")):
            raise RuntimeError(f"{scores_path}: stored scores do not match the partition's documents")
        scores = scores.drop(columns=["uid", "lines_removed"])
    else:
        scores = score_in_chunks(texts, score_options or {})
        if scores_path:
            stored = pa.Table.from_pandas(scores, preserve_index=False)
            stored = stored.add_column(0, "uid", pa.array(df["uid"].to_numpy(dtype="int64")))
            write_table_atomic(stored.append_column("lines_removed", pa.array(lines_removed)), Path(scores_path))
    reason, score, threshold = decide(scores, rules, keep_scripts, min_script_share)
    drop = pd.notna(reason)
    out = df.copy()
    if lines_removed.any():
        out["text"] = pd.arrays.ArrowExtensionArray(pa.array(texts, pa.string()))
    removed_out = removed_frame(df[drop], pd.Series(reason[drop]), pd.Series(score[drop]), pd.Series(threshold[drop]),
                                text_chars=audit_text_chars)
    counts = pd.Series(reason[drop]).value_counts().to_dict() if drop.any() else {}
    lang = scores["lang"].to_numpy()
    src = np.asarray(sources, dtype=object)
    stats = {
        "docs_in": len(df),
        "docs_out": int(len(df) - drop.sum()),
        "removed": {str(k): int(v) for k, v in counts.items()},
        "chars_out": int(scores["chars"].to_numpy()[~drop].sum()),
        "cjk_chars_out": int(scores["cjk_chars"].to_numpy()[~drop].sum()),
        "lines_removed": int(lines_removed.sum()),
        "lines_removed_by_source": _sum_by(src, lines_removed),
        "by_source": {s: {"in": int((src == s).sum()), "out": int(((src == s) & ~drop).sum())} for s in np.unique(src)},
        "by_lang": {lg: {"in": int((lang == lg).sum()), "out": int(((lang == lg) & ~drop).sum())} for lg in np.unique(lang)},
        "removed_by_lang": {lg: _counts(reason[drop & (lang == lg)]) for lg in np.unique(lang)},
        "removed_by_source": {s: _counts(reason[drop & (src == s)]) for s in np.unique(src[drop])} if drop.any() else {},
        # the most frequent boilerplate lines removed in this part: text (any part's copy) and times removed (summed)
        "boilerplate_line_texts": {str(h): v[0] for h, v in named.items() if v is not None},
        "boilerplate_line_removed": {str(h): v[1] for h, v in named.items() if v is not None},
    }
    return BatchResult(kept=out[~drop].reset_index(drop=True), removed=removed_out, stats=stats)


SCORE_CHUNK_CHARS = 4_000_000  # scoring holds about 60 bytes per character: chunks bound the memory


def score_in_chunks(texts: list[str], options: dict) -> pd.DataFrame:
    """`score_texts` over runs of documents of about SCORE_CHUNK_CHARS characters each."""
    frames, start, size = [], 0, 0
    for i, t in enumerate(texts):
        size += len(t)
        if size >= SCORE_CHUNK_CHARS or i == len(texts) - 1:
            frames.append(score_texts(pa.array(texts[start:i + 1], pa.string()), **options))
            start, size = i + 1, 0
    return pd.concat(frames, ignore_index=True) if frames else score_texts(pa.array([], pa.string()), **options)


def _counts(values: np.ndarray) -> dict[str, int]:
    keys, n = np.unique(values.astype(str), return_counts=True) if len(values) else ([], [])
    return {str(k): int(v) for k, v in zip(keys, n)}


def _sum_by(keys: np.ndarray, values: np.ndarray) -> dict[str, int]:
    out: dict[str, int] = {}
    for k in np.unique(keys[values > 0]) if (values > 0).any() else []:
        out[str(k)] = int(values[keys == k].sum())
    return out
