"""One small interface over the three tokenizer formats models ship today, so the tokenize step,
its checks, pack, shard, the report and `shards inspect` never ask which one they hold.

- `sentencepiece`: a `.model` (Llama-2, InternLM, Mistral v1-v7, what `tokenizer train` writes);
- `hf`: a Hugging Face `tokenizer.json` or a folder holding one (and `tokenizer_config.json`, whose
  `bos_token` / `eos_token` / `pad_token` name the special tokens): Qwen2.5/3, DeepSeek-V3;
- `tiktoken`: Mistral's tekken `.json` (base64 token bytes with ranks, the regex pattern and the
  special tokens, which take the first ids) or a plain `.tiktoken` BPE-ranks file (`base64 rank` per
  line, as Llama-3 and GLM-4 ship it) with the pattern and special tokens from the config (special
  tokens take the ids after the ranks, as Llama-3 numbers them).

Every kind encodes a batch of texts into int32 ids without special tokens (BOS/EOS are placed by
`encode_flat` from resolved ids), decodes, and says its vocabulary size (added and special tokens
counted: the model's embedding must hold every id), the id of a token string, and which ids are
byte-fallback pieces. One tokenizer thread per process: Dask runs one worker process per core, so
the library's own thread pool (Rayon for `tokenizers`) is switched off.
"""
from __future__ import annotations

import base64
import json
import os
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Optional

import numpy as np

KINDS = ("sentencepiece", "hf", "tiktoken")
# Llama-3's (and cl100k_base's) split pattern: the default for a plain .tiktoken file with no pattern given
DEFAULT_TIKTOKEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+"
)
# names special tokens commonly have, tried in order when neither the config nor tokenizer_config.json names one
_CANDIDATES = {
    "bos": ("<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>", "[gMASK]", "<｜begin▁of▁sentence｜>"),
    "eos": ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "<|eos|>", "<｜end▁of▁sentence｜>"),
    "pad": ("<pad>", "<|pad|>", "[PAD]", "<|finetune_right_pad_id|>"),
    "unk": ("<unk>", "[UNK]", "<|unk|>"),
}
# the special tokens of tekken files that list none (ids 0..19; the rest are <SPECIAL_N> fillers)
_TEKKEN_FIRST_SPECIALS = ("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                          "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]",
                          "[IMG_END]", "[PREFIX]", "[MIDDLE]", "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
                          "[TOOL_CONTENT]")
_BYTE_PIECE = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")

os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one tokenizer thread per Dask worker process (see the module)


class TokenizerFormatError(ValueError):
    """The file is not a tokenizer of the kind given or detected."""


@dataclass(frozen=True)
class TokenizerSpec:
    """How to load a tokenizer file: its kind and, for a plain `.tiktoken` file, the split pattern and
    the special tokens that follow the ranks."""

    kind: str
    pattern: Optional[str] = None
    special_tokens: tuple = ()


def resolve_file(path: str) -> str:
    """The tokenizer file itself: a Hugging Face folder gives its `tokenizer.json` (or a `tokenizer.model`)."""
    p = Path(path)
    if p.is_dir():
        for name in ("tokenizer.json", "tokenizer.model"):
            if (p / name).is_file():
                return str(p / name)
        raise TokenizerFormatError(f"{path} is a folder without tokenizer.json or tokenizer.model")
    return path


def detect_kind(path: str) -> str:
    """The kind of a tokenizer file or folder, from its name and first bytes."""
    f = resolve_file(path)
    name = os.path.basename(f).lower()
    if name.endswith(".tiktoken"):
        return "tiktoken"
    with open(f, "rb") as fh:
        head = fh.read(4096)
    if name.endswith(".json") or head.lstrip()[:1] == b"{":
        text = head.decode("utf-8", "ignore")
        if re.search(r'"(config|vocab)"\s*:', text) and not re.search(r'"(model|normalizer|added_tokens)"\s*:', text):
            return "tiktoken"  # tekken: {"config": ..., "vocab": [...], "special_tokens": ...}
        return "hf"
    first = head.split(b"\n", 1)[0]
    if re.fullmatch(rb"[A-Za-z0-9+/=]+ \d+\r?", first):
        return "tiktoken"
    return "sentencepiece"


class Tokenizer(ABC):
    """What the pipeline needs of a tokenizer, whatever its format."""

    kind: str
    path: str
    vocab_size: int  # every id the tokenizer can produce (base + added/special tokens) is below it

    @abstractmethod
    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """Ids of each text (int32), no BOS/EOS."""

    @abstractmethod
    def decode(self, ids: list[int]) -> str:
        """The text of `ids` (special tokens written as their strings)."""

    @abstractmethod
    def token_id(self, token: str) -> Optional[int]:
        """The id of a whole token string (a special token), None when it is not one token."""

    def own_specials(self) -> dict[str, Optional[str]]:
        """The special token strings the tokenizer's own files name (bos, eos, pad, unk), None where they do not."""
        return {}

    def fallback_ids(self) -> np.ndarray:
        """Ids of byte-fallback pieces (`<0xNN>`): text the vocabulary did not cover."""
        return np.empty(0, dtype=np.int32)

    def unk_id(self) -> int:
        """The unknown-token id, -1 when the tokenizer has none (byte-level BPE cannot produce one)."""
        return -1

    def encode_flat(self, texts: list[str], bos_id: int, eos_id: int) -> tuple[np.ndarray, np.ndarray]:
        """(lengths int32, all ids int32 end to end) with `bos_id` before and `eos_id` after each text
        when they are >= 0: one buffer per batch, no Python int per token kept."""
        return _with_specials(self.encode(texts), bos_id, eos_id)


def _with_specials(encoded: list[np.ndarray], bos_id: int, eos_id: int) -> tuple[np.ndarray, np.ndarray]:
    raw = np.fromiter(map(len, encoded), dtype=np.int32, count=len(encoded))
    body = np.concatenate(encoded).astype(np.int32, copy=False) if encoded else np.empty(0, dtype=np.int32)
    return _place(raw, body, bos_id, eos_id)


def _place(raw: np.ndarray, body: np.ndarray, bos_id: int, eos_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, ids) with `bos_id` before and `eos_id` after each document (when >= 0) of `body`,
    the documents' ids end to end with lengths `raw`."""
    k = int(bos_id >= 0) + int(eos_id >= 0)
    if k == 0:
        return raw, body
    lengths = (raw + k).astype(np.int32)
    values = np.empty(body.size + len(raw) * k, dtype=np.int32)
    starts = np.zeros(len(raw), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    if bos_id >= 0:
        values[starts] = bos_id
    if eos_id >= 0:
        values[starts + lengths - 1] = eos_id
    raw_starts = np.zeros(len(raw), dtype=np.int64)
    np.cumsum(raw[:-1], out=raw_starts[1:])
    values[np.arange(body.size, dtype=np.int64) + np.repeat(starts + int(bos_id >= 0) - raw_starts, raw)] = body
    return lengths, values


class SentencePieceTokenizer(Tokenizer):
    kind = "sentencepiece"

    def __init__(self, path: str) -> None:
        import sentencepiece as spm

        self.path = path
        self.sp = spm.SentencePieceProcessor()
        try:
            self.sp.Load(path)
        except Exception as e:  # noqa: BLE001 - sentencepiece raises bare OSError/RuntimeError
            raise TokenizerFormatError(f"{path} is not a SentencePiece model: {e}") from None
        self.vocab_size = self.sp.GetPieceSize()
        self._fast: Optional[tuple] = None

    def fast_encoder(self) -> tuple:
        """(the exact piece-cache encoder, "") or (None, why the model is declined), built once per
        process (`stages.piece_cache`)."""
        if self._fast is None:
            from . import piece_cache

            self._fast = piece_cache.build(self.sp, self.path)
        return self._fast

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(x, dtype=np.int32) for x in self.sp.encode(texts, return_type="numpy", num_threads=1)]

    def encode_flat(self, texts: list[str], bos_id: int, eos_id: int) -> tuple[np.ndarray, np.ndarray]:
        if bos_id in (-1, self.sp.bos_id()) and eos_id in (-1, self.sp.eos_id()):  # the model's own: native
            encoded = self.sp.encode(texts, return_type="numpy", add_bos=bos_id >= 0, add_eos=eos_id >= 0,
                                     num_threads=1)
            lengths = np.fromiter(map(len, encoded), dtype=np.int32, count=len(encoded))
            values = np.concatenate(encoded).astype(np.int32, copy=False) if encoded else np.empty(0, dtype=np.int32)
            return lengths, values
        return super().encode_flat(texts, bos_id, eos_id)

    def decode(self, ids: list[int]) -> str:
        return self.sp.decode([int(i) for i in ids])

    def token_id(self, token: str) -> Optional[int]:
        i = self.sp.PieceToId(token)
        return i if self.sp.IdToPiece(i) == token else None

    def own_specials(self) -> dict[str, Optional[str]]:
        return {k: self.sp.IdToPiece(i) if i >= 0 else None
                for k, i in (("bos", self.sp.bos_id()), ("eos", self.sp.eos_id()), ("pad", self.sp.pad_id()),
                             ("unk", self.sp.unk_id()))}

    def fallback_ids(self) -> np.ndarray:
        return np.array([i for i in range(self.vocab_size) if self.sp.IsByte(i)], dtype=np.int32)

    def unk_id(self) -> int:
        return self.sp.unk_id()


def _token_text(value: object) -> Optional[str]:
    """A tokenizer_config.json token entry: a string, or an AddedToken dict's `content`."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


class HFTokenizer(Tokenizer):
    kind = "hf"

    def __init__(self, path: str) -> None:
        from tokenizers import Tokenizer as _HF

        self.path = path
        try:
            self.tok = _HF.from_file(path)
        except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception on a bad file
            raise TokenizerFormatError(f"{path} is not a Hugging Face tokenizer.json: {str(e)[:200]}") from None
        # a tokenizer.json saved with truncation or padding on would cut every document to its
        # max_length or pad it: whole documents are encoded here, so both are off
        self.tok.no_truncation()
        self.tok.no_padding()
        vocab = self.tok.get_vocab(with_added_tokens=True)
        self._vocab = vocab
        self.vocab_size = max(vocab.values()) + 1 if vocab else 0  # ids may leave gaps: the largest counts
        self._config: dict = {}
        cfg = Path(path).with_name("tokenizer_config.json")
        if cfg.is_file():
            try:
                self._config = json.loads(cfg.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise TokenizerFormatError(f"{cfg} is not valid JSON: {e}") from None
        self._encode = getattr(self.tok, "encode_batch_fast", self.tok.encode_batch)  # no offsets when available
        self._fast: Optional[tuple] = None

    def fast_encoder(self) -> tuple:
        """(the exact regex-piece cache encoder, "") or (None, why the tokenizer is declined), built
        once per process (`stages.pretoken_cache`)."""
        if self._fast is None:
            from . import pretoken_cache

            self._fast = pretoken_cache.build(self.tok)
        return self._fast

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        return [np.array(e.ids, dtype=np.int32) for e in self._encode(texts, add_special_tokens=False)]

    def encode_flat(self, texts: list[str], bos_id: int, eos_id: int) -> tuple[np.ndarray, np.ndarray]:
        ids = [e.ids for e in self._encode(texts, add_special_tokens=False)]
        raw = np.fromiter(map(len, ids), dtype=np.int32, count=len(ids))
        body = np.fromiter(chain.from_iterable(ids), dtype=np.int32, count=int(raw.sum()))
        return _place(raw, body, bos_id, eos_id)

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def token_id(self, token: str) -> Optional[int]:
        return self._vocab.get(token)

    def own_specials(self) -> dict[str, Optional[str]]:
        own = {k: _token_text(self._config.get(f"{k}_token")) for k in ("bos", "eos", "pad", "unk")}
        model = json.loads(self.tok.to_str()).get("model", {}) if own["unk"] is None else {}
        own["unk"] = own["unk"] or _token_text(model.get("unk_token"))
        return own

    def fallback_ids(self) -> np.ndarray:
        return np.array(sorted(i for t, i in self._vocab.items() if _BYTE_PIECE.match(t)), dtype=np.int32)

    def unk_id(self) -> int:
        unk = self.own_specials().get("unk")
        i = self._vocab.get(unk) if unk else None
        return -1 if i is None else i


class TiktokenTokenizer(Tokenizer):
    """tiktoken's `Encoding` over ordinary ranks; special tokens are kept apart (they never come out of
    encoding text) and ids are shifted when the specials come first (tekken)."""

    kind = "tiktoken"

    def __init__(self, path: str, pattern: Optional[str] = None, special_tokens: tuple = ()) -> None:
        import tiktoken

        self.path = path
        try:
            if _is_json(path):
                ranks, pat, specials, offset, total = _load_tekken(path)
            else:
                ranks, pat, specials, offset, total = _load_plain(path, pattern, special_tokens)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise TokenizerFormatError(f"{path} is not a tiktoken/tekken BPE file: {str(e)[:200]}") from None
        self.offset = offset
        self.specials = specials  # token string -> id
        self._special_by_id = {i: t for t, i in specials.items()}
        self.vocab_size = total
        self.enc = tiktoken.Encoding(name=f"corpusmill:{os.path.basename(path)}", pat_str=pat,
                                     mergeable_ranks=ranks, special_tokens={})
        self._ranks = len(ranks)
        self._fast: Optional[tuple] = None

    def fast_encoder(self) -> tuple:
        """(the exact regex-piece cache encoder, "") or (None, why the split pattern is declined), built
        once per process (`stages.pretoken_cache`)."""
        if self._fast is None:
            from . import pretoken_cache

            self._fast = pretoken_cache.build_tiktoken(self.enc, self.offset)
        return self._fast

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        out = []
        for t in texts:
            a = self.enc.encode_to_numpy(t, disallowed_special=()).astype(np.int32)
            if self.offset:
                a += self.offset
            out.append(a)
        return out

    def decode(self, ids: list[int]) -> str:
        out: list[bytes] = []
        run: list[int] = []
        for i in (int(x) for x in ids):
            if i in self._special_by_id:
                if run:
                    out.append(self.enc.decode_bytes(run))
                    run = []
                out.append(self._special_by_id[i].encode())
            else:
                run.append(i - self.offset)
        if run:
            out.append(self.enc.decode_bytes(run))
        return b"".join(out).decode("utf-8", errors="replace")

    def token_id(self, token: str) -> Optional[int]:
        return self.specials.get(token)

    def own_specials(self) -> dict[str, Optional[str]]:
        return {k: next((c for c in _CANDIDATES[k] if c in self.specials), None) for k in ("bos", "eos", "pad", "unk")}

    def unk_id(self) -> int:
        return self.specials.get(self.own_specials()["unk"] or "", -1)


def _is_json(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(64).lstrip()[:1] == b"{"


def _load_tekken(path: str) -> tuple[dict, str, dict, int, int]:
    """Mistral's tekken JSON: `config` (pattern, default_vocab_size, default_num_special_tokens), `vocab`
    (rank, base64 token_bytes) and `special_tokens` (rank, token_str). Special tokens take ids
    0..num_special-1 (files without the list use Mistral's fixed first three, <unk> <s> </s>, and
    numbered fillers); token of rank r has id num_special + r; only ranks below vocab_size - num_special
    are used."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    cfg = doc["config"]
    n_special = int(cfg.get("default_num_special_tokens", 0))
    total = int(cfg.get("default_vocab_size", len(doc["vocab"]) + n_special))
    inner = total - n_special
    ranks = {}
    for entry in doc["vocab"]:
        if entry["rank"] < inner:
            ranks[base64.b64decode(entry["token_bytes"])] = int(entry["rank"])
    if len(ranks) != inner or set(ranks.values()) != set(range(inner)):
        raise ValueError(f"vocab holds {len(ranks)} distinct ranks below {inner}, expected every one")
    listed = doc.get("special_tokens")
    if listed:
        specials = {s["token_str"]: int(s["rank"]) for s in listed}
    else:
        specials = {t: i for i, t in enumerate(_TEKKEN_FIRST_SPECIALS)}
    for i in range(n_special):
        if i not in specials.values():
            specials[f"<SPECIAL_{i}>"] = i
    return ranks, cfg["pattern"], specials, n_special, total


def _load_plain(path: str, pattern: Optional[str], special_tokens: tuple) -> tuple[dict, str, dict, int, int]:
    """A `.tiktoken` file: one `base64-token rank` per line; special tokens (from the config) take the
    ids after the largest rank, in order."""
    ranks = {}
    with open(path, "rb") as f:
        for line in f:
            if not line.strip():
                continue
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    if not ranks:
        raise ValueError("no ranks")
    base = max(ranks.values()) + 1
    specials = {t: base + i for i, t in enumerate(special_tokens)}
    return ranks, pattern or DEFAULT_TIKTOKEN_PATTERN, specials, 0, base + len(specials)


_CACHE: dict[tuple, Tokenizer] = {}


def load(path: str, spec: Optional[TokenizerSpec] = None) -> Tokenizer:
    """The tokenizer at `path` (a file, or a Hugging Face folder), loaded once per process (Dask
    workers keep it between partitions). `spec.kind` None or absent: detected."""
    if not os.path.exists(path):
        raise TokenizerFormatError(f"tokenizer {path} does not exist")
    f = resolve_file(path)
    spec = spec or TokenizerSpec(detect_kind(f))
    if spec.kind not in KINDS:
        raise TokenizerFormatError(f"tokenizer kind {spec.kind!r} is not one of {', '.join(KINDS)}")
    key = (os.path.abspath(f), spec)
    tok = _CACHE.get(key)
    if tok is None:
        if spec.kind == "sentencepiece":
            tok = SentencePieceTokenizer(f)
        elif spec.kind == "hf":
            tok = HFTokenizer(f)
        else:
            tok = TiktokenTokenizer(f, spec.pattern, tuple(spec.special_tokens))
        _CACHE[key] = tok
    return tok


@dataclass
class Specials:
    """The resolved special ids (-1: none) and where each came from."""

    bos_id: int
    eos_id: int
    unk_id: int
    pad_id: int
    tokens: dict  # {"bos": "<s>", ...}: the strings, so a checker can find the ids again
    sources: dict  # {"bos": "config" | "tokenizer" | "guessed by name" | "none", ...}


def resolve_specials(tok: Tokenizer, given: dict[str, Optional[str]]) -> Specials:
    """BOS/EOS/pad(/unk) ids: a string given in the config, else the tokenizer's own files, else a token
    of a common name. A string that is not one token is an error (TokenizerFormatError)."""
    own = tok.own_specials()
    ids, tokens, sources = {}, {}, {}
    for k in ("bos", "eos", "pad", "unk"):
        if k == "unk" and tok.kind == "sentencepiece":
            i = tok.unk_id()
            ids[k], tokens[k], sources[k] = i, own.get("unk"), "tokenizer"
            continue
        for source, name in (("config", given.get(k)), ("tokenizer", own.get(k)),
                             ("guessed by name", next((c for c in _CANDIDATES[k] if tok.token_id(c) is not None), None))):
            if name is None:
                continue
            i = tok.token_id(name)
            if i is None:
                if source == "config":
                    raise TokenizerFormatError(f"tokenizer.{k}_token {name!r} is not a single token of {tok.path}")
                continue
            ids[k], tokens[k], sources[k] = i, name, source
            break
        else:
            ids[k], tokens[k], sources[k] = -1, None, "none"
    if tok.kind == "sentencepiece":  # the model's own ids, exactly as before (a piece may lack a name)
        sp = tok.sp  # type: ignore[attr-defined]
        for k, i in (("bos", sp.bos_id()), ("eos", sp.eos_id()), ("pad", sp.pad_id())):
            if given.get(k) is None:
                ids[k], tokens[k], sources[k] = i, own.get(k), "tokenizer" if i >= 0 else "none"
    return Specials(ids["bos"], ids["eos"], ids["unk"], ids["pad"], tokens, sources)
