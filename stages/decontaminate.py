"""Decontamination: documents sharing a long n-gram with an evaluation item are removed.

N-grams are of words for Latin text and of characters for CJK text (a Chinese benchmark question is
one "word" to a whitespace split): words are the runs of letters and digits between spaces,
punctuation, symbols and CJK characters, lowercased; CJK characters (Han, kana, hangul) form their own
sequence per document with everything else left out, so punctuation and spacing cannot hide a copied
sentence. Each n-gram is one 64-bit hash (a polynomial over the units' hashes); the evaluation set's
hashes are a sorted array a step broadcasts once, and a batch of documents is scanned with numpy:
n shifted multiply-adds over the flat unit hashes, then one `searchsorted`.
"""
from __future__ import annotations

import json
from typing import Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from .base import REMOVED_SCHEMA, BatchResult, removed_frame
from .mixing import mix64

WORD_BREAK = r"[\s\p{P}\p{S}\p{Han}\p{Hiragana}\p{Katakana}\p{Hangul}]+"
_PRIME = np.uint64(0x100000001B3)
_WORD_SALT, _CJK_SALT = np.uint64(0x5BD1E9955BD1E995), np.uint64(0xC2B2AE3D27D4EB4F)
_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2FFFF), (0xF900, 0xFAFF), (0x3040, 0x30FF),
               (0xAC00, 0xD7AF))


def _rolling(units: np.ndarray, doc: np.ndarray, n: int, salt: np.uint64) -> tuple[np.ndarray, np.ndarray]:
    """Hashes of every run of `n` consecutive units within one document, and each one's document."""
    m = len(units) - n + 1
    if m <= 0:
        return np.empty(0, np.uint64), np.empty(0, np.int64)
    acc = np.zeros(m, np.uint64)
    with np.errstate(over="ignore"):
        for k in range(n):
            acc = acc * _PRIME + units[k:k + m]
    whole = doc[:m] == doc[n - 1:n - 1 + m]
    return mix64(acc[whole] ^ salt), doc[:m][whole]


def _word_units(texts: pa.Array, lowercase: bool) -> tuple[np.ndarray, np.ndarray]:
    """One hash per Latin word (letters and digits between breaks), flat, and each word's document."""
    if lowercase:
        texts = pc.utf8_lower(texts)
    lists = pc.split_pattern_regex(texts, WORD_BREAK)
    offsets = lists.offsets.to_numpy()
    flat = pc.list_flatten(lists)
    doc = np.repeat(np.arange(len(texts), dtype=np.int64), np.diff(offsets - offsets[0]))
    keep = pc.greater(pc.utf8_length(flat), 0).to_numpy(zero_copy_only=False)
    encoded = pc.dictionary_encode(flat.filter(pa.array(keep)))
    words = encoded.dictionary.to_pylist()
    table = np.fromiter((xxhash.xxh3_64_intdigest(w.encode("utf-8", "surrogatepass")) for w in words),
                        dtype=np.uint64, count=len(words))
    indices = encoded.indices.to_numpy(zero_copy_only=False)
    return table[indices] if len(indices) else np.empty(0, np.uint64), doc[keep]


def _cjk_units(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Every CJK character of each document as a hashed unit (other characters left out), and its document."""
    points = np.frombuffer("".join(texts).encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    doc = np.repeat(np.arange(len(texts), dtype=np.int64), [len(t) for t in texts])
    cjk = np.zeros(len(points), bool)
    for lo, hi in _CJK_RANGES:
        cjk |= (points >= lo) & (points <= hi)
    return mix64(points[cjk].astype(np.uint64)), doc[cjk]


def ngram_hashes(texts: list[str], word_n: int, cjk_n: int, lowercase: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Every word n-gram and CJK character n-gram hash of these texts, and each one's text index."""
    arr = pa.array(texts, pa.string())
    words, wdoc = _word_units(arr, lowercase)
    chars, cdoc = _cjk_units(texts)
    wh, wd = _rolling(words, wdoc, word_n, _WORD_SALT)
    ch, cd = _rolling(chars, cdoc, cjk_n, _CJK_SALT)
    return np.concatenate([wh, ch]), np.concatenate([wd, cd])


def eval_index(paths: list[tuple[str, str]], fields: list[str], id_field: Optional[str], word_n: int, cjk_n: int,
               lowercase: bool = True) -> tuple[np.ndarray, np.ndarray, list[str], dict]:
    """The evaluation sets' n-grams: (sorted hashes, the item each came from, item labels `set:id`,
    stats). An item is its `fields` joined; one too short for any n-gram cannot be matched (counted)."""
    texts, labels = [], []
    for name, path in paths:
        with open(path, encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                item = json.loads(line)
                parts = [item[k] if isinstance(item.get(k), str) else json.dumps(item[k], ensure_ascii=False)
                         for k in fields if item.get(k) is not None]
                texts.append("\n".join(parts))
                key = item.get(id_field) if id_field else None
                labels.append(f"{name}:{key if key is not None else line_no}")
    hashes, item = ngram_hashes(texts, word_n, cjk_n, lowercase) if texts else (np.empty(0, np.uint64),
                                                                                  np.empty(0, np.int64))
    order = np.argsort(hashes, kind="stable")
    hashes, item = hashes[order], item[order]
    first = np.r_[True, hashes[1:] != hashes[:-1]] if len(hashes) else np.empty(0, bool)
    covered = np.unique(item) if len(item) else np.empty(0, np.int64)
    stats = {"items": len(texts), "ngrams": int(first.sum()), "items_too_short": len(texts) - len(covered)}
    return hashes[first], item[first], labels, stats


def decontaminate_batch(df: pd.DataFrame, eval_hashes: np.ndarray, eval_item: np.ndarray, labels: list[str],
                        word_n: int, cjk_n: int, lowercase: bool = True,
                        audit_text_chars: Optional[int] = 2000) -> BatchResult:
    """Remove the documents holding any n-gram of an evaluation item (reason `decontaminated`); the
    removed rows name the evaluation set and item (`eval_item`, `set:id`) and how many n-grams matched."""
    texts = df["text"].tolist()
    hashes, doc = ngram_hashes(texts, word_n, cjk_n, lowercase)
    hit = np.zeros(len(hashes), bool)
    pos = np.zeros(len(hashes), np.int64)
    if len(eval_hashes) and len(hashes):
        pos = np.searchsorted(eval_hashes, hashes).clip(max=len(eval_hashes) - 1)
        hit = eval_hashes[pos] == hashes
    drop = np.zeros(len(df), bool)
    drop[doc[hit]] = True
    matches = np.bincount(doc[hit], minlength=len(df))
    first_item = np.full(len(df), -1, np.int64)
    if hit.any():
        hd, hi = doc[hit][::-1], eval_item[pos[hit]][::-1]
        first_item[hd] = hi  # the first matching n-gram's item (reversed: the first write wins last)
    names = np.asarray(labels, dtype=object)
    removed = removed_frame(df[drop], "decontaminated", pd.Series(matches[drop].astype(float)), None,
                            text_chars=audit_text_chars)
    table = pa.Table.from_pandas(removed, schema=REMOVED_SCHEMA, preserve_index=False)
    table = table.append_column("eval_item", pa.array(names[first_item[drop]].tolist() if drop.any() else [],
                                                      pa.string()))
    per_set: dict[str, int] = {}
    for label in names[first_item[drop]].tolist() if drop.any() else []:
        per_set[label.split(":", 1)[0]] = per_set.get(label.split(":", 1)[0], 0) + 1
    stats = {"docs_in": len(df), "docs_out": int((~drop).sum()),
             "removed": {"decontaminated": int(drop.sum())} if drop.any() else {},
             "by_eval_set": per_set, "ngrams_scanned": int(len(hashes))}
    return BatchResult(kept=df[~drop].reset_index(drop=True), removed=table, stats=stats)
