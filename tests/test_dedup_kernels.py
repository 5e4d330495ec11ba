"""The fused dedup kernels give the values of the step-by-step definitions: character components
(Arrow's utf8_lower code point by code point), MinHash signatures (datasketch's, permutations drawn
without importing it), and the hash-table Jaccard (the sorted-merge one)."""
from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasketch import MinHash

from corpusmill.stages import minhash, sketch
from corpusmill.stages.shingles import (ShingleSpec, char_components, char_points, shingle_hash32, shingle_strings,
                                        _LUT)

TEXTS = ["", " ", "Hi, you!", "ΣΑΣ İstanbul STRASSE ẞ ǅ Ⅻ Ａｂｃ", "数据 ls -la 清洗，今天天气很好。", "ab", "a\u3000b\tc\nd",
         "Émile Zola — « J'accuse » 1898", "😀 emoji 🎉 mixed 数据"]


def test_char_components_equal_lower_then_points_then_lookup():
    rng = random.Random(3)
    texts = TEXTS + ["".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(rng.randrange(0, 80))) for _ in range(50)]
    for spec in (ShingleSpec(unit="char"), ShingleSpec(unit="char", lowercase=False, strip_punctuation=False)):
        arr = pa.array(texts)
        comp, starts = char_components(arr, spec)
        prepared = pc.utf8_lower(arr) if spec.lowercase else arr
        points, ref_starts = char_points(prepared, spec.strip_punctuation)
        assert np.array_equal(starts, ref_starts)
        assert np.array_equal(comp, sketch.lookup(points, _LUT))


def test_permutations_are_datasketchs():
    for num_perm, seed in ((128, 1), (256, 42), (7, 0)):
        a, b = MinHash(num_perm=num_perm, seed=seed).permutations
        got_a, got_b = minhash.permutations(num_perm, seed)
        assert np.array_equal(got_a, np.asarray(a, np.uint32)) and np.array_equal(got_b, np.asarray(b, np.uint32))


def test_fused_char_signatures_equal_datasketch():
    spec = ShingleSpec(unit="char")
    sig, counts = minhash.char_signatures(pa.array(TEXTS), spec, 128, 1)
    for i, text in enumerate(TEXTS):
        shingles = shingle_strings(text, spec)
        m = MinHash(num_perm=128, seed=1, hashfunc=shingle_hash32)
        for s in shingles:
            m.update(s.encode())
        assert counts[i] == len(shingles), text
        assert np.array_equal(sig[i], m.hashvalues), text


def test_hash_table_jaccard_equals_the_sorted_merge():
    rng = np.random.default_rng(5)
    docs = [rng.integers(0, n // 2 + 2, n).astype(np.uint64) for n in [0, 0, 1, 3, 50, 400, 1000] * 3]
    offsets = np.r_[0, np.cumsum([len(d) for d in docs])]
    flat = np.concatenate(docs)
    ia = rng.integers(0, len(docs), 300)
    ib = rng.integers(0, len(docs), 300)
    got = sketch.pair_jaccard_indexed(flat, offsets, ia, ib)
    for p in range(len(ia)):
        x, y = set(docs[ia[p]].tolist()), set(docs[ib[p]].tolist())
        assert got[p] == (len(x & y) / len(x | y) if x | y else 1.0)
    hb = np.concatenate([docs[i] for i in ib]) if len(ib) else flat[:0]
    ha = np.concatenate([docs[i] for i in ia])
    oa = np.r_[0, np.cumsum([len(docs[i]) for i in ia])]
    ob = np.r_[0, np.cumsum([len(docs[i]) for i in ib])]
    assert np.array_equal(sketch.pair_jaccard(ha, oa, hb, ob), got)
