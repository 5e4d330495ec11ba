"""Counts per source and language: the kernels' side of "the corpus by source and language".

Every document carries `source` (from the input) and `language` (zh / en / other by script, set by
the reader) from the first step on; kernels count what they pass on per (source, language) with
`group_counts`, a nested dict `{source: {language: {counter: n}}}` that `merge_stats` adds up over
parts. Token windows are attributed to groups by `window_groups`: the tokens of each group in each
window, and the group holding most of a window's tokens (its `group`, for per-sample counts).
"""
from __future__ import annotations

from typing import Iterable, Optional, Sequence

import numpy as np

UNKNOWN = "(none)"  # a document without a source or language (older parts, null input values)


def group_counts(sources: Sequence, languages: Sequence, chars: Optional[Iterable[int]] = None,
                 **counters: Iterable[int]) -> dict:
    """{source: {language: {"docs": n, "chars": c, <counter>: sum}}} of these documents (one value
    per document in `chars` and each counter)."""
    import pandas as pd

    frame = pd.DataFrame({"s": [UNKNOWN if s is None else str(s) for s in sources],
                          "l": [UNKNOWN if s is None else str(s) for s in languages]})
    names = (["chars"] if chars is not None else []) + list(counters)
    if chars is not None:
        frame["chars"] = np.asarray(list(chars), dtype=np.int64)
    for name, v in counters.items():
        frame[name] = np.asarray(list(v), dtype=np.int64)
    out: dict = {}
    if not len(frame):
        return out
    frame["docs"] = 1
    summed = frame.groupby(["s", "l"], sort=True)[["docs", *names]].sum()
    for (s, lg), row in zip(summed.index, summed.itertuples(index=False)):
        out.setdefault(str(s), {})[str(lg)] = {k: int(v) for k, v in zip(["docs", *names], row)}
    return out


def flatten(groups: dict) -> dict[tuple[str, str], dict]:
    """`group_counts`' nested dict as {(source, language): counters}."""
    return {(s, lg): dict(v) for s, by_lang in (groups or {}).items() for lg, v in by_lang.items()}


def window_groups(codes: np.ndarray, lengths: np.ndarray, window: int, n_windows: int,
                  mode: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Which groups' tokens fill each window of a stream of segments (concat: the segments one after
    another cut every `window` ids, the ids past `n_windows * window` left out; pad: segment i is
    window i, cut to the window). `codes[i]` is segment i's group, `lengths[i]` its ids.

    Returns (window, group, tokens) of every (window, group) pair with tokens, sorted by window, and
    each window's dominant group (most tokens; the lowest code on a tie)."""
    codes = np.asarray(codes, np.int64)
    lengths = np.asarray(lengths, np.int64)
    if mode == "pad":
        kept = np.minimum(lengths, window)
        win = np.arange(len(lengths), dtype=np.int64)
        return win, codes, kept, codes.copy()
    ends = np.cumsum(lengths)
    starts = ends - lengths
    cut = n_windows * window
    # pieces: each segment split at every window boundary inside it
    bounds = np.union1d(np.concatenate([starts, ends]), np.arange(0, cut + 1, window, dtype=np.int64))
    bounds = bounds[bounds <= cut]
    if len(bounds) < 2:
        empty = np.empty(0, np.int64)
        return empty, empty, empty, np.full(n_windows, -1, np.int64)
    p_start, p_len = bounds[:-1], np.diff(bounds)
    seg = np.searchsorted(ends, p_start, side="right")
    keep = (p_len > 0) & (seg < len(lengths))
    p_start, p_len, seg = p_start[keep], p_len[keep], seg[keep]
    key = (p_start // window) * (int(codes.max(initial=0)) + 1) + codes[seg]
    uniq, inverse = np.unique(key, return_inverse=True)
    tokens = np.bincount(inverse, weights=p_len).astype(np.int64)
    n_codes = int(codes.max(initial=0)) + 1
    win, grp = uniq // n_codes, uniq % n_codes
    dominant = np.full(n_windows, -1, np.int64)
    order = np.lexsort((grp, -tokens, win))  # per window: most tokens first, then the lowest code
    first = order[np.r_[True, win[order][1:] != win[order][:-1]]]
    dominant[win[first]] = grp[first]
    return win, grp, tokens, dominant
