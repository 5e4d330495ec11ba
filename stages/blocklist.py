"""Blocked words: a user's list of terms matched with one Aho-Corasick automaton (pyahocorasick),
scored as matches per 1,000 characters (the filter decides on the score, rule blocked_words).

Matching is case-insensitive (the text and the terms are lower-cased). A term that starts or ends
with a Latin letter or digit matches only on a word boundary there ("ass" is not found in "class"
nor "assess"); Chinese terms, which have no word boundaries, match as substrings.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Optional

import numpy as np

_WORD = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_")


def _is_word(ch: str) -> bool:
    """A character that continues a Latin word: ASCII letters, digits, _ and accented Latin letters."""
    return ch in _WORD or ("\u00c0" <= ch <= "\u024f" and ch.isalpha())


def load_terms(path: str | Path) -> tuple[list[str], str]:
    """(terms, sha256 of the file): one term a line, stripped and lower-cased; blank lines and lines
    starting with # are skipped, repeats kept once."""
    raw = Path(path).read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte {e.start})") from None
    terms = [t.strip().lower() for t in text.splitlines()]
    terms = list(dict.fromkeys(t for t in terms if t and not t.startswith("#")))
    return terms, hashlib.sha256(raw).hexdigest()


_AUTOMATA: dict[str, Any] = {}


def automaton(terms: list[str], key: Optional[str] = None) -> Any:
    """An Aho-Corasick automaton of the terms, each stored with whether its ends need a word boundary;
    cached per worker process under `key` (the list's sha256)."""
    import ahocorasick

    if key is not None and key in _AUTOMATA:
        return _AUTOMATA[key]
    auto = ahocorasick.Automaton()
    for t in terms:
        auto.add_word(t, (len(t), _is_word(t[0]), _is_word(t[-1])))
    if terms:
        auto.make_automaton()
    if key is not None:
        _AUTOMATA.clear()
        _AUTOMATA[key] = auto
    return auto


def count_matches(texts: list[str], auto: Any) -> np.ndarray:
    """Matches of the automaton's terms in each text (word boundaries checked for Latin terms)."""
    out = np.zeros(len(texts), dtype=np.int64)
    if not len(auto):
        return out
    for i, text in enumerate(texts):
        low = text.lower()
        n, size = 0, len(low)
        for end, (length, left, right) in auto.iter(low):
            start = end - length + 1
            if left and start > 0 and _is_word(low[start - 1]):
                continue
            if right and end + 1 < size and _is_word(low[end + 1]):
                continue
            n += 1
        out[i] = n
    return out


def score_blocked(texts: list[str], terms: list[str], key: Optional[str] = None) -> dict[str, np.ndarray]:
    """{blocked_words: matches, blocked_words_per_1k: matches per 1,000 characters} per text."""
    matches = count_matches(texts, automaton(terms, key))
    chars = np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts))
    return {"blocked_words": matches, "blocked_words_per_1k": matches * 1000.0 / np.maximum(chars, 1)}
