"""Compile every numba loop once, before the processes that use them start.

The loops are cached on disk (`cache=True`, in `stages/__pycache__`): a process that finds them
there loads them in a fraction of a second, one that does not compiles them (seconds per loop). A
fresh install that starts many processes at once (the test suite's workers and their Dask
workers, a docker build) would compile the same loops in each; `precompile()` run first in one
process compiles them once. Every loop is reached through the function the pipeline calls, so the
compiled signatures are the ones real data needs.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

SAMPLE = ["Line one of a page.\nLine two, longer...\n\n- a bullet\n1. item\nWe use cookies.\nThe end.",
          "中文的文本，這是一個句子。\n第二行。。。\n\n第二段。", "mixed 文本 text\n\n\nword word word", ""]


def precompile() -> float:
    """Compile (or load) every compiled loop of `stages`; returns the seconds it took."""
    from . import boilerplate, exact_dedup, near_dedup, normalize, paragraph_dedup, quality
    from .near_dedup import SignatureSpec
    from .shingles import ShingleSpec
    from .xxh3 import hash_ranges

    started = time.perf_counter()
    texts = pa.array(SAMPLE, pa.string())
    normalize.normalize_array(texts)  # the NFKC check and the one escape, control and whitespace pass
    quality.score_texts(texts)  # the one pass per character, segments, boilerplate-phrase lines, n-gram repetition
    lines = boilerplate._split_lines(texts)
    boilerplate.strip_lines_array(texts, np.array(["s"] * len(SAMPLE), dtype=object), {"s": {int(lines.hashes[0])}}, {})
    exact_dedup.hash_texts(exact_dedup.fold_whitespace(texts))
    paragraph_dedup.split(texts, 1)  # the folding and lowercasing pass, then the line scan
    near_dedup.exact_jaccard(texts, texts, ShingleSpec())
    hash_ranges(np.frombuffer(b"abcdef", np.uint8), np.array([0, 2], np.int64), np.array([2, 6], np.int64))
    uids = np.arange(len(SAMPLE), dtype=np.int64)
    near_dedup.verify_pairs_by_uid(uids[:2], uids[1:3], (uids, np.array(SAMPLE, dtype=object)), ShingleSpec(), None)
    word = ShingleSpec()
    char = ShingleSpec(unit="char")
    with tempfile.TemporaryDirectory(prefix="corpusmill-precompile-") as tmp:  # MinHash, SimHash, both at once
        table = pa.table({"uid": pa.array(uids), "id": pa.array([str(u) for u in uids]), "source": pa.array(["s"] * len(SAMPLE)),
                          "text": texts})
        for spec in (SignatureSpec(word, 128, 1, None, exact=True), SignatureSpec(None, 128, 1, char),
                     SignatureSpec(word, 128, 1, word)):
            near_dedup.signature_table(table, str(Path(tmp) / "signatures.parquet"), spec)
    return time.perf_counter() - started
