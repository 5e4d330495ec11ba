"""The filter stage's batch step: boilerplate lines removed, quality scores computed (or loaded),
thresholds applied. Scores are kept apart from the decision (as in NeMo Curator): a part's scores
are written once and a changed threshold is re-applied to them without recomputing.
"""
from __future__ import annotations

import fnmatch
import os
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from .base import BatchResult, REMOVED_SCHEMA, one_array, read_table, removed_frame, write_table_atomic
from . import quality_rules
from .boilerplate import strip_lines_array
from .quality import decide, detected_language, dominant_script, score_texts


def filter_batch(df: pd.DataFrame, rules: list, drop_lines: Optional[dict] = None, scores_path: Optional[str] = None,
                 reuse_scores: bool = False, keep_scripts: Optional[list[str]] = None, min_script_share: float = 0.0,
                 score_options: Optional[dict] = None, audit_text_chars: Optional[int] = 2000,
                 name_lines: Optional[list[int]] = None, overrides: Optional[list[dict]] = None,
                 blocked: Optional[dict] = None, language: Optional[dict] = None,
                 classifiers: Optional[dict] = None, rule_scores: Optional[list[str]] = None) -> BatchResult:
    """Clean, score (or load the scores of) and decide one partition; the first failing rule is
    each removed document's reason, with its score, threshold and text (its first
    `audit_text_chars` characters, as it came in).

    `overrides` (see `override_plan`): each document is decided with the rules of the first override
    it matches, or with `rules` / `keep_scripts` / `min_script_share`; documents of an override with
    its own score options are scored with them. With overrides, removed rows carry an `override`
    column (null: the base rules) and the stats count documents per override.

    `blocked` ({terms, sha256}): scores blocked_words / blocked_words_per_1k (stages.blocklist).
    `language` ({max_chars, keep, min_score}): scores language / language_score with the shipped
    fastText model (stages.langid); the language then stands for the script heuristic's `lang`.
    `rule_scores`: the registered rule families (stages.quality_rules) whose columns are scored too.
    `classifiers` ({scores_path, rules, combine, mean_of}, see steps/filter.classify): the documents the
    rules keep are then decided by the stored classifier scores (stages.classifier.decide); kept ones
    carry their quality_bucket, and the stats count buckets per source and hold examples either side
    of each threshold."""
    texts = _text_array(df["text"])  # Arrow throughout: no Python string per document
    src = np.asarray(pc.fill_null(_text_array(df["source"]), "").to_numpy(zero_copy_only=False), dtype=object)
    overrides = overrides or []
    options = score_options or {}
    lines_removed = np.zeros(len(df), dtype=np.int64)
    named: dict[int, Optional[list]] = dict.fromkeys(name_lines or [])
    if drop_lines:
        texts, lines_removed = strip_lines_array(texts, src, drop_lines, named)
    if reuse_scores and scores_path and os.path.isfile(scores_path):
        scores = read_table(scores_path).to_pandas()
        if len(scores) != len(df) or not np.array_equal(scores["uid"].to_numpy(), df["uid"].to_numpy(dtype="int64")):
            raise RuntimeError(f"{scores_path}: stored scores do not match the partition's documents")
        scores = scores.drop(columns=["uid", "lines_removed"])
    else:
        scores = score_in_chunks(texts, options)
        for column, values in quality_rules.scores(texts, rule_scores or []).items():
            scores[column] = values
        scores = _model_scores(scores, texts, blocked, language, _read_languages(df) if language else None)
        scores = _rescore_overrides(scores, texts, src, overrides, options)
        if "language" in scores:  # an override's rescoring put the heuristic back
            scores["lang"] = scores["language"]
        if scores_path:
            stored = pa.Table.from_pandas(scores, preserve_index=False)
            stored = stored.add_column(0, "uid", pa.array(df["uid"].to_numpy(dtype="int64")))
            write_table_atomic(stored.append_column("lines_removed", pa.array(lines_removed)), Path(scores_path))
    group = match_overrides(src, scores, overrides, options.get("cjk_share", 0.3))
    lang_rule = {"keep_languages": language.get("keep"), "min_language_score": language.get("min_score", 0.0)} \
        if language else {}
    reason, score, threshold = np.full(len(df), None, dtype=object), np.full(len(df), np.nan), np.full(len(df), np.nan)
    for k in np.unique(group):  # one vectorised decision per rule table: the base one (-1), each override's
        rows = group == k
        table = (rules, keep_scripts, min_script_share) if k < 0 else \
            (overrides[k]["rules"], overrides[k].get("keep_scripts"), overrides[k].get("min_script_share", 0.0))
        reason[rows], score[rows], threshold[rows] = decide(scores if rows.all() else scores[rows].reset_index(drop=True),
                                                            *table, **lang_rule)
    learned = None
    if classifiers:
        from .classifier import decide as decide_classifiers
        from .classifier import decision_columns, read_scores

        learned = decision_columns(read_scores(classifiers["scores_path"], df["uid"].to_numpy(dtype="int64")),
                                   classifiers.get("mean_of"))
        verdict = decide_classifiers(learned, classifiers["rules"], classifiers["combine"], pd.notna(reason))
        hit = pd.notna(verdict.reason)
        reason[hit], score[hit], threshold[hit] = verdict.reason[hit], verdict.score[hit], verdict.threshold[hit]
    drop = pd.notna(reason)
    out = df.copy()
    if lines_removed.any():
        out["text"] = pd.arrays.ArrowExtensionArray(texts)
    if classifiers and classifiers.get("buckets"):
        out["quality_bucket"] = pd.array(verdict.bucket, dtype="string")  # base.OPTIONAL_DOC_FIELDS: passed on to the shards
    removed_out = removed_frame(df[drop], pd.Series(reason[drop]), pd.Series(score[drop]), pd.Series(threshold[drop]),
                                text_chars=audit_text_chars)
    counts = pd.Series(reason[drop]).value_counts().to_dict() if drop.any() else {}
    lang = scores["lang"].to_numpy()
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
    if blocked:
        stats["blocked_docs_matched"] = int((scores["blocked_words"].to_numpy() > 0).sum())
    if classifiers:
        stats["classifier_docs"] = _classifier_counts(learned, reason, drop, src)
        stats["classifier_examples"] = _classifier_examples(df, learned, classifiers, reason, drop)
        if classifiers.get("buckets"):
            kept_bucket = np.asarray(["(none)" if b is None else b for b in verdict.bucket], dtype=object)
            chars = scores["chars"].to_numpy()
            stats["quality_buckets"] = {
                b: {s: {"docs": int(((kept_bucket == b) & (src == s) & ~drop).sum()),
                        "chars": int(chars[(kept_bucket == b) & (src == s) & ~drop].sum())}
                    for s in np.unique(src[(kept_bucket == b) & ~drop])}
                for b in np.unique(kept_bucket[~drop])} if (~drop).any() else {}
    if overrides:
        names = np.asarray([o["name"] for o in overrides] + [None], dtype=object)[group]  # group -1: the last, None
        present = [o["name"] for k, o in enumerate(overrides) if (group == k).any()]
        stats["by_override"] = {n: {"in": int((names == n).sum()), "out": int(((names == n) & ~drop).sum())} for n in present}
        stats["removed_by_override"] = {n: _counts(reason[drop & (names == n)]) for n in present}
        table = pa.Table.from_pandas(removed_out, schema=REMOVED_SCHEMA, preserve_index=False)
        removed_out = table.append_column("override", pa.array(names[drop].tolist(), pa.string()))
    return BatchResult(kept=out[~drop].reset_index(drop=True), removed=removed_out, stats=stats)


CLASSIFIER_EXAMPLES = 2  # documents each side of a classifier's threshold a part offers the report
EXAMPLE_TEXT_CHARS = 300


def _classifier_counts(learned: dict, reason: np.ndarray, drop: np.ndarray, src: np.ndarray) -> dict:
    """Per score column: documents scored and kept, per source (what the report's table shows)."""
    out: dict = {}
    for column, values in learned.items():
        scored = ~np.isnan(values)
        out[column] = {str(s): {"scored": int((scored & (src == s)).sum()), "kept": int((scored & (src == s) & ~drop).sum())}
                       for s in np.unique(src[scored])} if scored.any() else {}
    return out


def _classifier_examples(df: pd.DataFrame, learned: dict, classifiers: dict, reason: np.ndarray,
                         drop: np.ndarray) -> dict:
    """{column: {kept: {uid: [score, id, text]}, removed: {...}}}: the kept documents scoring closest above
    each threshold and the removed ones closest below it (their first 300 characters), for the report."""
    out: dict = {}
    rules = classifiers["rules"]
    if classifiers["combine"].get("mode") == "mean":
        rules = [{"name": "mean", "column": "classifier_mean", "threshold": classifiers["combine"].get("threshold")}]
    ids, uids = df["id"].astype(object).to_numpy(), df["uid"].to_numpy(dtype="int64")
    for r in rules:
        if r.get("threshold") is None:
            continue
        values = learned[r["column"]]
        ok = ~np.isnan(values)
        kept = np.flatnonzero(ok & ~drop & (values >= r["threshold"]))
        gone = np.flatnonzero(ok & (reason == f"classifier:{r['name']}"))
        pick = {"kept": kept[np.argsort(values[kept], kind="stable")[:CLASSIFIER_EXAMPLES]],
                "removed": gone[np.argsort(-values[gone], kind="stable")[:CLASSIFIER_EXAMPLES]]}
        out[r["column"]] = {side: {str(int(uids[i])): [float(values[i]), str(ids[i]),
                                                       str(df["text"].iloc[i] or "")[:EXAMPLE_TEXT_CHARS]]
                                   for i in rows} for side, rows in pick.items()}
    return out


def _read_languages(df: pd.DataFrame) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """The model's language and probability the read step gave every document (filter.language.enabled
    makes them its `language` / `language_score` columns), or None when a document lacks them."""
    if "language_score" not in df or df["language_score"].isna().any():
        return None
    return df["language"].to_numpy(dtype=object), df["language_score"].to_numpy(dtype=np.float64)


def _model_scores(scores: pd.DataFrame, texts: pa.Array, blocked: Optional[dict],
                  language: Optional[dict], identified: Optional[tuple] = None) -> pd.DataFrame:
    """The scores of a user's blocked-words list and of the language model, beside the others; the
    language is the read step's (`identified`) when it has one, else identified here."""
    if blocked or (language and identified is None):
        texts = texts.to_pylist()  # these kernels take Python strings
    if blocked:
        from .blocklist import score_blocked

        for key, value in score_blocked(texts, blocked["terms"], blocked["sha256"]).items():
            scores[key] = value
    if language:
        from .langid import identify

        codes, probs = identified if identified is not None else identify(texts, language.get("max_chars", 2000))
        scores["language"], scores["language_score"] = codes, probs
        scores["lang"] = codes
    return scores


def match_overrides(sources: np.ndarray, scores: pd.DataFrame, overrides: list[dict], cjk_share: float) -> np.ndarray:
    """Per document, the index of the first override it matches (-1: none). Sources are matched once
    per distinct value; languages are the ones detected with the base `cjk_share` (so rescoring an
    override's documents with its own cjk_share does not move them to another override)."""
    n = len(sources)
    group = np.full(n, -1, dtype=np.int64)
    if not overrides or not n:
        return group
    distinct, inverse = np.unique(sources.astype(str), return_inverse=True)
    lang = script = None
    for k, o in enumerate(overrides):
        fits = group < 0
        if o.get("source"):
            hit = np.fromiter((any(fnmatch.fnmatchcase(s, p) for p in o["source"]) for s in distinct), bool, len(distinct))
            fits &= hit[inverse]
        if o.get("language"):
            lang = detected_language(scores, cjk_share) if lang is None else lang
            fits &= np.isin(lang, o["language"])
        if o.get("script"):
            script = dominant_script(scores) if script is None else script
            fits &= np.isin(script, o["script"])
        group[fits] = k
    return group


def _rescore_overrides(scores: pd.DataFrame, texts: pa.Array, sources: np.ndarray, overrides: list[dict],
                       options: dict) -> pd.DataFrame:
    """Documents governed by an override with its own score options, scored again with them."""
    if not any(o.get("score_options") for o in overrides):
        return scores
    group = match_overrides(sources, scores, overrides, options.get("cjk_share", 0.3))
    columns = {c: scores[c].to_numpy().copy() for c in scores.columns}
    for k in np.unique(group[group >= 0]):
        if not overrides[k].get("score_options"):
            continue
        rows = np.flatnonzero(group == k)
        again = score_in_chunks(texts.take(pa.array(rows)), overrides[k]["score_options"])
        for c in columns:
            if c in again:  # the language model's and blocked words' scores do not depend on score options
                columns[c][rows] = again[c].to_numpy()
    return pd.DataFrame(columns)


SCORE_CHUNK_CHARS = 4_000_000  # scoring holds about 60 bytes per character: chunks bound the memory


def score_in_chunks(texts: pa.Array | list[str], options: dict) -> pd.DataFrame:
    """`score_texts` over runs of documents of about SCORE_CHUNK_CHARS characters each (zero-copy
    slices of one Arrow array; the scores of a document do not depend on its neighbours)."""
    if not isinstance(texts, (pa.Array, pa.ChunkedArray)):
        texts = pa.array(texts, pa.string())
    texts = one_array(texts)
    if not len(texts):
        return score_texts(texts, **options)
    ends = np.cumsum(pc.fill_null(pc.utf8_length(texts), 0).to_numpy(zero_copy_only=False))
    frames, start = [], 0
    while start < len(texts):  # a chunk ends at the first document reaching SCORE_CHUNK_CHARS (at least one)
        before = ends[start - 1] if start else 0
        stop = min(int(np.searchsorted(ends, before + SCORE_CHUNK_CHARS, side="left")) + 1, len(texts))
        frames.append(score_texts(texts.slice(start, stop - start), **options))
        start = stop
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]


def _text_array(column: pd.Series) -> pa.Array:
    """A frame's string column as one Arrow array (no copy when it is Arrow-backed already)."""
    values = column.array
    arr = values._pa_array if hasattr(values, "_pa_array") else pa.array(column.tolist(), pa.string())
    arr = one_array(arr)
    return arr.cast(pa.string()) if arr.type != pa.string() else arr


def _counts(values: np.ndarray) -> dict[str, int]:
    keys, n = np.unique(values.astype(str), return_counts=True) if len(values) else ([], [])
    return {str(k): int(v) for k, v in zip(keys, n)}


def _sum_by(keys: np.ndarray, values: np.ndarray) -> dict[str, int]:
    out: dict[str, int] = {}
    for k in np.unique(keys[values > 0]) if (values > 0).any() else []:
        out[str(k)] = int(values[keys == k].sum())
    return out
