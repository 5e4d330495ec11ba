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


def _text_loops() -> None:
    """Normalize, the quality scores, boilerplate lines, paragraph hashes, the reader's script column."""
    from . import boilerplate, normalize, paragraph_dedup, quality

    texts = pa.array(SAMPLE, pa.string())
    normalize.normalize_array(texts)  # the NFKC check and the one escape, control and whitespace pass
    quality.score_texts(texts)  # the one pass per character, segments, boilerplate-phrase lines, n-gram repetition
    quality.script_language(texts)  # the character-class counts of the read step's language column
    lines = boilerplate._split_lines(texts)
    boilerplate.strip_lines_array(texts, np.array(["s"] * len(SAMPLE), dtype=object), {"s": {int(lines.hashes[0])}}, {})
    paragraph_dedup.split(texts, 1)  # the folding and lowercasing pass, then the line scan


def _dedup_loops() -> None:
    """Exact hashes, exact Jaccard, and every signature kind (MinHash by word and by character, SimHash)."""
    from . import exact_dedup, near_dedup
    from .near_dedup import SignatureSpec
    from .shingles import ShingleSpec
    from .xxh3 import hash_ranges

    texts = pa.array(SAMPLE, pa.string())
    exact_dedup.hash_texts(exact_dedup.fold_whitespace(texts))
    near_dedup.exact_jaccard(texts, texts, ShingleSpec())
    hash_ranges(np.frombuffer(b"abcdef", np.uint8), np.array([0, 2], np.int64), np.array([2, 6], np.int64))
    uids = np.arange(len(SAMPLE), dtype=np.int64)
    near_dedup.verify_pairs_by_uid(uids[:2], uids[1:3], (uids, np.array(SAMPLE, dtype=object)), ShingleSpec(), None)
    word = ShingleSpec()
    char = ShingleSpec(unit="char")
    with tempfile.TemporaryDirectory(prefix="corpusmill-precompile-") as tmp:  # MinHash, SimHash, both at once
        table = pa.table({"uid": pa.array(uids), "id": pa.array([str(u) for u in uids]), "source": pa.array(["s"] * len(SAMPLE)),
                          "text": texts})
        for spec in (SignatureSpec(word, 128, 1, None, exact=True), SignatureSpec(char, 128, 1, None),
                     SignatureSpec(None, 128, 1, char), SignatureSpec(word, 128, 1, word)):
            near_dedup.signature_table(table, str(Path(tmp) / "signatures.parquet"), spec)


def _tokenizer_loops() -> None:
    """The piece-cache encoders: SentencePiece BPE and byte-level BPE tokenizer.json, on models trained
    here on the sample (a second)."""
    import io

    import sentencepiece as spm

    from . import piece_cache

    # a model normalising with NFKC (SentencePiece's own normalize()) and one with the identity rule
    # (the code-point pass of the fast path)
    for extra in ({}, {"normalization_rule_name": "identity", "remove_extra_whitespaces": False}):
        model = io.BytesIO()
        spm.SentencePieceTrainer.train(sentence_iterator=iter(SAMPLE[:3] * 20), model_writer=model, vocab_size=400,
                                       model_type="bpe", byte_fallback=True, character_coverage=1.0,
                                       hard_vocab_limit=False, minloglevel=2, **extra)
        with tempfile.TemporaryDirectory(prefix="corpusmill-precompile-") as tmp:
            path = Path(tmp) / "m.model"
            path.write_bytes(model.getvalue())
            sp = spm.SentencePieceProcessor(model_file=str(path))
            fast, why = piece_cache.build(sp, str(path))
            if fast is None:
                raise RuntimeError(f"precompile: the sample model has no fast path ({why})")
            fast.encode_flat(SAMPLE, 1, 2)
    _hf_loops()


def _hf_loops() -> None:
    """The regex-piece cache of byte-level BPE tokenizer.json, on one trained here on the sample."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from . import pretoken_cache

    for ignore_merges in (False, True):  # True: the guard against unreachable tokens is hashed too
        tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.train_from_iterator(SAMPLE * 5, trainer=trainers.BpeTrainer(
            vocab_size=300, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        fast, why = pretoken_cache.build(tok)
        if fast is None:
            raise RuntimeError(f"precompile: the sample tokenizer.json has no fast path ({why})")
        pretoken_cache._text_keys(SAMPLE[:2])
        fast.encode_flat(SAMPLE, 1, 2)


GROUPS = (_text_loops, _dedup_loops, _tokenizer_loops)
_HELPER_GROUPS = (0,)  # compiled by a second process beside this one (about half the compile time)


def run_groups(indexes: tuple[int, ...]) -> None:
    for i in indexes:
        GROUPS[i]()


def precompile(side_by_side: bool = True) -> float:
    """Compile (or load) every compiled loop of `stages`, in two processes side by side (numba
    compiles on one core); returns the seconds it took. A helper that fails leaves its loops to this
    process, so a compile error is raised here, with its traceback."""
    import subprocess
    import sys

    started = time.perf_counter()
    helper = None
    if side_by_side:
        code = f"from corpusmill.stages.precompile import run_groups; run_groups({_HELPER_GROUPS!r})"
        try:
            helper = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except OSError:
            helper = None
    mine = tuple(i for i in range(len(GROUPS)) if helper is None or i not in _HELPER_GROUPS)
    run_groups(mine)
    if helper is not None and helper.wait() != 0:
        run_groups(_HELPER_GROUPS)
    return time.perf_counter() - started
