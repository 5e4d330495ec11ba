"""Which documents go where before packing: the held-out validation split, and the mixture.

The split is decided per document by a seeded hash of its text (`doc_hash`, written by the tokenize
step), never by its position: the same text falls on the same side in every run, whatever file or
line it came from, and adding documents moves none of the others.
"""
from __future__ import annotations

import numpy as np

_GOLDEN = 0x9E3779B97F4A7C15


def _mix64(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser (an avalanching bijection), element-wise on uint64."""
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(33))
        x = x * np.uint64(0xFF51AFD7ED558CCD)
        x = x ^ (x >> np.uint64(33))
        x = x * np.uint64(0xC4CEB9FE1A85EC53)
        return x ^ (x >> np.uint64(33))


def seeded_unit(doc_hash: np.ndarray, seed: int, salt: int = 0) -> np.ndarray:
    """A uniform number in [0, 1) per document from its text hash and a seed (and a salt, so the
    split and the mixture's draws are independent)."""
    key = np.uint64((seed * _GOLDEN + salt * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1))
    mixed = _mix64(np.asarray(doc_hash, np.uint64) ^ _mix64(np.full(1, key, np.uint64))[0])
    return (mixed >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def validation_mask(doc_hash: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """True for the documents held out for validation: a seeded hash of the text below `fraction`."""
    if fraction <= 0:
        return np.zeros(len(doc_hash), bool)
    return seeded_unit(doc_hash, seed, salt=1) < fraction
