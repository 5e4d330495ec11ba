"""Tokenization with safety checks before any long work, for every tokenizer kind
(`stages.tokenizer_kinds`: SentencePiece, Hugging Face tokenizer.json, tiktoken/tekken).

Encoding runs in native code over whole batches (one call per `batch_docs` documents) inside Dask
worker processes, one tokenizer thread each. Tokens leave as Arrow `list<int32>`.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import sentencepiece as spm

from . import tokenizer_kinds as kinds
from .base import BatchResult, atomic_file, file_sha256, write_bytes_atomic, write_text_atomic
from .composition import group_counts

TOKEN_SCHEMA = pa.schema([("uid", pa.int64()), ("n_tokens", pa.int32()), ("input_ids", pa.list_(pa.int32()))])


class TokenizerError(ValueError):
    """The tokenizer cannot be used with this model or config."""


def load_tokenizer(path: str) -> spm.SentencePieceProcessor:
    """A SentencePiece .model, loaded once per process (Dask workers keep it between partitions)."""
    return _load(path, kinds.TokenizerSpec("sentencepiece")).sp  # type: ignore[attr-defined]


def _load(path: str, spec: Optional[kinds.TokenizerSpec]) -> kinds.Tokenizer:
    try:
        return kinds.load(path, spec)
    except (kinds.TokenizerFormatError, OSError) as e:
        msg = str(e)
        if "does not exist" in msg and spec is not None and spec.kind == "sentencepiece":
            msg = f"tokenizer model {path} does not exist"
        raise TokenizerError(msg) from None


@dataclass
class TokenizerReport:
    """What the checks found; every figure goes into the report and the manifest."""

    path: str
    sha256: str
    vocab_size: int
    bos_id: int
    eos_id: int
    unk_id: int
    pad_id: int
    pad_source: str
    model_vocab_size: Optional[int] = None
    unused_embedding_rows: int = 0
    sample_docs: int = 0
    sample_tokens: int = 0
    unk_rate: float = 0.0
    top_unk_chars: list = field(default_factory=list)
    roundtrip_mismatch_rate: float = 0.0
    roundtrip_examples: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    kind: str = "sentencepiece"
    tokens: dict = field(default_factory=dict)  # {"bos": "<s>", "eos": ..., "pad": ..., "unk": ...}: the strings
    special_sources: dict = field(default_factory=dict)  # where each special came from (config, tokenizer, ...)
    byte_fallback_rate: float = 0.0  # share of sample tokens that are <0xNN> byte pieces
    pattern: Optional[str] = None  # a plain .tiktoken file's split pattern
    special_tokens: list = field(default_factory=list)  # a plain .tiktoken file's special tokens, ids after the ranks

    def spec(self) -> kinds.TokenizerSpec:
        """How to load the checked tokenizer again (a worker, the shard step, `shards inspect`)."""
        return spec_of(self.kind, self.pattern, self.special_tokens)


def spec_of(kind: str, pattern: Optional[str] = None, special_tokens: Optional[list] = None) -> kinds.TokenizerSpec:
    """A hashable load spec (the pattern and special tokens matter only for a plain .tiktoken file)."""
    if kind != "tiktoken":
        return kinds.TokenizerSpec(kind)
    return kinds.TokenizerSpec(kind, pattern, tuple(special_tokens or ()))


def check_tokenizer(
    path: str,
    *,
    add_bos: bool,
    add_eos: bool,
    pad_id: Optional[int],
    model_vocab_size: Optional[int],
    sample_texts: list[str],
    max_unk_rate: float = 0.01,
    spec: Optional[kinds.TokenizerSpec] = None,
    tokens: Optional[dict] = None,
) -> TokenizerReport:
    """Refuse a tokenizer that would corrupt training, before any long work starts. `spec` None:
    the kind is detected; `tokens` names BOS/EOS/pad by string (else the tokenizer's own config)."""
    if spec is None:
        try:
            spec = kinds.TokenizerSpec(kinds.detect_kind(path)) if os.path.exists(path) else kinds.TokenizerSpec("sentencepiece")
        except (kinds.TokenizerFormatError, OSError) as e:
            raise TokenizerError(str(e)) from None
    tok = _load(path, spec)
    try:
        sp_ = kinds.resolve_specials(tok, tokens or {})
    except kinds.TokenizerFormatError as e:
        raise TokenizerError(str(e)) from None
    vocab = tok.vocab_size
    bos, eos, unk, model_pad = sp_.bos_id, sp_.eos_id, sp_.unk_id, sp_.pad_id
    problems = []
    if add_eos and eos < 0:
        problems.append("add_eos is set but the tokenizer has no EOS piece" + _name_hint(tok, "eos"))
    if add_bos and bos < 0:
        problems.append("add_bos is set but the tokenizer has no BOS piece" + _name_hint(tok, "bos"))
    specials = {name: i for name, i in (("bos", bos), ("eos", eos), ("unk", unk)) if i >= 0}
    if len(set(specials.values())) != len(specials):
        problems.append(f"special ids are not distinct: {specials}")
    if pad_id is not None:
        chosen_pad, pad_source = pad_id, "config"
    elif model_pad >= 0:
        chosen_pad, pad_source = model_pad, "config" if sp_.sources["pad"] == "config" else "tokenizer"
    elif unk >= 0:
        chosen_pad, pad_source = unk, "unk (the tokenizer defines no pad)"
    else:
        chosen_pad, pad_source = eos, "eos (the tokenizer defines neither pad nor unk)"
    if not 0 <= chosen_pad < vocab:
        problems.append(f"pad id {chosen_pad} is outside the vocabulary (0..{vocab - 1})")
    report = TokenizerReport(path, file_sha256(tok.path), vocab, bos, eos, unk, chosen_pad, pad_source, model_vocab_size,
                             kind=tok.kind, tokens=sp_.tokens, special_sources=sp_.sources,
                             pattern=spec.pattern, special_tokens=list(spec.special_tokens))
    if pad_id is not None or model_pad < 0:
        report.tokens = {**report.tokens, "pad": None}  # the pad id is not a named pad token's
    if model_vocab_size is not None:
        if vocab > model_vocab_size:
            problems.append(
                f"tokenizer vocabulary ({vocab}) is larger than the model's vocab_size ({model_vocab_size}): "
                "ids past the embedding would crash or corrupt training"
            )
        elif vocab < model_vocab_size:
            report.unused_embedding_rows = model_vocab_size - vocab
            report.warnings.append(
                f"model vocab_size {model_vocab_size} > tokenizer vocabulary {vocab}: "
                f"{model_vocab_size - vocab} embedding rows can never be trained"
            )
    if problems:
        raise TokenizerError(f"tokenizer {path}: " + "; ".join(problems))

    if sample_texts:
        ids = tok.encode(sample_texts)
        report.sample_docs = len(sample_texts)
        report.sample_tokens = sum(len(x) for x in ids)
        unk_count = sum(int((x == unk).sum()) for x in ids) if unk >= 0 else 0
        report.unk_rate = unk_count / max(1, report.sample_tokens)
        fallback = tok.fallback_ids()
        if fallback.size and report.sample_tokens:
            report.byte_fallback_rate = sum(int(np.isin(x, fallback).sum()) for x in ids) / report.sample_tokens
        if unk_count:
            chars: dict[str, int] = {}
            for text, seq in zip(sample_texts, ids):
                if unk in seq:
                    for ch in set(text):
                        if unk in tok.encode([ch])[0]:
                            chars[ch] = chars.get(ch, 0) + text.count(ch)
            report.top_unk_chars = sorted(chars.items(), key=lambda kv: -kv[1])[:10]
        decoded = [tok.decode(x) for x in ids]
        bad = [(t, d) for t, d in zip(sample_texts, decoded) if t != d]
        report.roundtrip_mismatch_rate = len(bad) / len(sample_texts)
        report.roundtrip_examples = [{"text": t[:120], "decoded": d[:120]} for t, d in bad[:3]]
        if report.unk_rate > max_unk_rate:
            raise TokenizerError(
                f"tokenizer {path}: {report.unk_rate:.2%} of sample tokens are <unk> (limit {max_unk_rate:.2%}); "
                f"most frequent unknown characters: {report.top_unk_chars}"
            )
        if report.roundtrip_mismatch_rate:
            report.warnings.append(
                f"{report.roundtrip_mismatch_rate:.1%} of sample documents do not survive encode->decode unchanged"
            )
    return report


def _name_hint(tok: kinds.Tokenizer, which: str) -> str:
    return "" if tok.kind == "sentencepiece" else f" (name one: tokenizer.{which}_token)"


def write_training_sample(texts: list[str], path: Path) -> int:
    """One sentence per line, as SentencePiece's trainer expects; returns lines written."""
    lines = [line for text in texts for line in text.split("\n") if line.strip()]
    write_text_atomic(Path(path), "".join(line + "\n" for line in lines))
    return len(lines)


TRAINER_LINES = 2_000_000  # SentencePiece's input_sentence_size: the most sample lines its trainer reads
MAX_SENTENCE_BYTES = 16384  # its max_sentence_length: longer lines are skipped
_RESERVED = "\u2585".encode()  # its mark for characters outside the vocabulary: lines holding it are skipped


def train_tokenizer(sample_file: Path, model_prefix: Path, *, vocab_size: int, model_type: str,
                    character_coverage: float, byte_fallback: bool, seed: int, num_threads: int,
                    user_symbols: tuple = ()) -> str:
    """Train a SentencePiece model suited to mixed Chinese/English text; returns the .model path.

    Ids: unk 0, bos 1, eos 2, pad 3. Normalisation is identity (the pipeline already normalised) and
    whitespace is kept, so encode->decode round-trips; newline is its own piece.

    `seed` only matters for a sample longer than TRAINER_LINES lines. SentencePiece's trainer reads
    every line of a shorter one and draws no random numbers; from a longer one it keeps a reservoir
    sample whose generator neither Python's `random` nor `spm.set_random_generator_seed` makes
    repeatable (sentencepiece 0.2.3, measured). So such a sample is first cut here to TRAINER_LINES
    lines chosen with `seed`: the same sample and seed always give the same tokenizer.
    """
    train_file = _seeded_cut(Path(sample_file), TRAINER_LINES, seed)
    try:
        _train(train_file, model_prefix, vocab_size, model_type, character_coverage, byte_fallback, num_threads,
               list(user_symbols))
    except RuntimeError as e:
        msg = str(e)
        if "Vocabulary size is smaller than required_chars" in msg:
            need = msg.rsplit(" vs ", 1)[-1].split(".")[0]
            raise TokenizerError(
                f"tokenizer.train.vocab_size {vocab_size} is smaller than the {need} pieces needed for the characters "
                f"covering {character_coverage:.2%} of the sample (CJK text needs thousands): raise "
                "tokenizer.train.vocab_size or lower tokenizer.train.character_coverage"
            ) from None
        raise TokenizerError(f"SentencePiece training failed: {msg}") from None
    finally:
        if train_file != Path(sample_file):
            train_file.unlink(missing_ok=True)
    _drop_training_paths(f"{model_prefix}.model")
    return f"{model_prefix}.model"


def _seeded_cut(sample_file: Path, limit: int, seed: int) -> Path:
    """`sample_file` itself when the trainer would read at most `limit` of its lines, else a file beside
    it holding `limit` of those lines, chosen with `seed` and kept in their order (streamed: the sample
    may be gigabytes)."""
    with open(sample_file, "rb") as f:
        n = sum(map(_trainer_reads, f))
    if n <= limit:
        return sample_file
    keep = np.zeros(n, dtype=bool)
    keep[np.random.default_rng(seed).choice(n, size=limit, replace=False)] = True
    cut = sample_file.with_name(f"{sample_file.name}.seeded")
    with open(sample_file, "rb") as src, atomic_file(cut) as out:
        out.writelines(line for line, kept in zip(filter(_trainer_reads, src), keep) if kept)
    return cut


def _trainer_reads(line: bytes) -> bool:
    """Whether SentencePiece's trainer takes this line (it skips empty ones, longer ones than
    max_sentence_length bytes and ones holding its reserved U+2585) and so counts it for its sampler."""
    body = line[:-1] if line.endswith(b"\n") else line
    return 0 < len(body) <= MAX_SENTENCE_BYTES and _RESERVED not in body


def _drop_training_paths(model_file: str) -> None:
    """SentencePiece stores the sample file and model prefix paths in the model: keep only their names,
    so the same config on the same data gives a byte-identical tokenizer (and manifest sha256) in any
    run directory."""
    from sentencepiece import sentencepiece_model_pb2 as model_pb2

    proto = model_pb2.ModelProto()
    with open(model_file, "rb") as f:
        proto.ParseFromString(f.read())
    spec = proto.trainer_spec
    names = [os.path.basename(p) for p in spec.input]
    del spec.input[:]
    spec.input.extend(names)
    spec.model_prefix = os.path.basename(spec.model_prefix)
    write_bytes_atomic(Path(model_file), proto.SerializeToString())


def _train(sample_file: Path, model_prefix: Path, vocab_size: int, model_type: str, character_coverage: float,
           byte_fallback: bool, num_threads: int, user_symbols: list) -> None:
    spm.SentencePieceTrainer.train(
        input=str(sample_file),
        model_prefix=str(model_prefix),
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        byte_fallback=byte_fallback,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=3,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        user_defined_symbols=["\n", *user_symbols],
        max_sentence_length=MAX_SENTENCE_BYTES,
        input_sentence_size=TRAINER_LINES,
        shuffle_input_sentence=True,
        hard_vocab_limit=False,
        num_threads=num_threads,
        minloglevel=2,
    )


def tokenize_batch(docs: pa.Table | pd.DataFrame, model_path: str, add_bos: bool, add_eos: bool, batch_docs: int,
                   spec: Optional[kinds.TokenizerSpec] = None, bos_id: Optional[int] = None,
                   eos_id: Optional[int] = None, fast_encode: bool = False, verify_sample: int = 0) -> BatchResult:
    """Encode the `text` column into `input_ids` (list<int32>), BOS/EOS per config. `bos_id`/`eos_id`
    are the checked ids (None: the tokenizer's own); `spec` None: a SentencePiece model. `source` and
    `language`, when given, are carried on (the pack step mixes, splits and counts by them), with
    `doc_hash`, an xxh3 of the text (the validation split's stable key: the same text falls on the
    same side in every run, whatever its file or line).

    `fast_encode`: a SentencePiece BPE model or a byte-level BPE tokenizer.json whose settings allow
    it encodes through an exact piece cache (`stages.piece_cache`, `stages.pretoken_cache`); then `verify_sample` documents of the part, a seeded choice, are
    encoded again by the plain encoder and any difference raises FastEncodeMismatch naming the
    document. The stats say which encoder ran, why a model was declined, and the cache's hits."""
    import xxhash

    tok = _load(model_path, spec or kinds.TokenizerSpec("sentencepiece"))
    if bos_id is None or eos_id is None:
        own = kinds.resolve_specials(tok, {})
        bos_id = own.bos_id if bos_id is None else bos_id
        eos_id = own.eos_id if eos_id is None else eos_id
    bos, eos = (bos_id if add_bos else -1), (eos_id if add_eos else -1)
    if isinstance(docs, pa.Table):
        texts, uids = docs.column("text").to_pylist(), docs.column("uid").to_numpy()
        extra = {c: docs.column(c).to_pylist() for c in ("source", "language") if c in docs.column_names}
    else:
        texts, uids = docs["text"].tolist(), docs["uid"].to_numpy(dtype="int64")
        extra = {c: docs[c].tolist() for c in ("source", "language") if c in docs.columns}
    # ids straight into int32 buffers: no Python int per token kept, which cost 10-12% of the stage
    # in creating them and again in flattening them
    fast, declined = None, ""
    if fast_encode:
        fast, declined = (tok.fast_encoder() if hasattr(tok, "fast_encoder")  # type: ignore[attr-defined]
                          else (None, f"{tok.kind} tokenizers have no exact fast path yet"))
    # both encoders give the same ids: this process takes whichever its parts measured cheaper here
    mode = fast.choice.choose() if fast else "plain"
    encoder = fast if mode == "fast" else tok
    before = dict(fast.stats) if fast else {}
    all_lengths, all_values = [], []
    started = time.process_time()
    for start in range(0, len(texts), batch_docs):
        lengths, values = encoder.encode_flat(texts[start : start + batch_docs], bos, eos)
        all_lengths.append(lengths)
        all_values.append(values)
    encode_s = time.process_time() - started
    lengths = np.concatenate(all_lengths).astype(np.int32, copy=False) if all_lengths else np.empty(0, dtype=np.int32)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = np.concatenate(all_values).astype(np.int32, copy=False) if all_values else np.empty(0, dtype=np.int32)
    lists = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=pa.int32()))
    table = pa.Table.from_arrays(
        [pa.array(np.asarray(uids, dtype=np.int64)), pa.array(lengths), lists],
        schema=TOKEN_SCHEMA,
    )
    stats = {"docs_in": len(texts), "docs_out": len(texts), "tokens": int(values.size), "chars": int(sum(map(len, texts)))}
    stats["encoder"] = "piece_cache" if mode == "fast" else "plain"
    stats["encoder_parts"] = {stats["encoder"]: 1}
    if declined:
        stats["fast_declined"] = declined
    if fast:
        other = "plain" if mode == "fast" else "fast"
        stats["verified_docs"], sample_chars, sample_s = verify_fast(
            tok, texts, uids, offsets, values, add_bos and bos >= 0, add_eos and eos >= 0, verify_sample, fast,
            plain_ids=mode == "plain")
        fast.choice.record(mode, stats["chars"], encode_s)
        fast.choice.record(other, sample_chars, sample_s, whole_part=False)
        stats["fast_cache"] = {k: fast.stats[k] - before.get(k, 0) for k in ("lookups", "hits", "pieces_encoded",
                                                                              "long_pieces", "cache_clears", "plain_docs")}
    if len(extra) == 2:
        table = table.append_column("source", pa.array(extra["source"], pa.string()))
        table = table.append_column("language", pa.array(extra["language"], pa.string()))
        hashes = np.fromiter((xxhash.xxh3_64_intdigest(t.encode("utf-8", "surrogatepass")) for t in texts),
                             dtype=np.uint64, count=len(texts))
        table = table.append_column("doc_hash", pa.array(hashes, pa.uint64()))
        stats["by_group"] = group_counts(extra["source"], extra["language"], chars=map(len, texts), tokens=lengths)
    return BatchResult(kept=table, stats=stats)


class FastEncodeMismatch(TokenizerError):
    """The fast encoder's ids of a document differ from the plain encoder's: the run must stop."""


VERIFY_SHARE = 0.02  # the re-encoded documents hold at most this share of a part's characters ...
VERIFY_MIN_CHARS = 1 << 16  # ... or this many, whichever is more: the check stays cheap on parts of books


def verify_fast(tok: kinds.Tokenizer, texts: list[str], uids: np.ndarray, offsets: np.ndarray, values: np.ndarray,
                has_bos: bool, has_eos: bool, sample: int, fast: Any = None,
                plain_ids: bool = False) -> tuple[int, int, float]:
    """Encode a seeded choice of up to `sample` documents again with the other encoder (the plain one;
    the fast one when `plain_ids`: the part was encoded plain) and compare with the part's ids
    (`values`, cut at `offsets`); returns (documents checked, their characters, the other encoder's
    CPU seconds on them). The seed is the part's first uid, so a rerun checks the same documents. Plain
    SentencePiece is ~5x slower than the fast path, so the chosen documents hold at most VERIFY_SHARE of
    the part's characters (at least VERIFY_MIN_CHARS): a document longer than what is left is passed
    over, and when that leaves none (a part of books) the first chosen document's first budget
    characters are encoded by both encoders (`fast`) and compared. Raises FastEncodeMismatch on any
    difference."""
    n = len(texts)
    if not n or sample <= 0:
        return 0, 0, 0.0
    rng = np.random.default_rng(int(uids[0]) & 0xFFFFFFFFFFFFFFFF)
    order = rng.permutation(n)
    budget = max(VERIFY_MIN_CHARS, int(VERIFY_SHARE * sum(map(len, texts))))
    chosen: list[int] = []
    for i in order.tolist():
        if len(chosen) == sample:
            break
        if len(texts[i]) <= budget:
            chosen.append(i)
            budget -= len(texts[i])
    chosen.sort()
    other = fast.encode if plain_ids and fast is not None else tok.encode
    started = time.process_time()
    again = other([texts[i] for i in chosen])
    seconds = time.process_time() - started
    for i, want in zip(chosen, again):
        got = values[offsets[i] + int(has_bos):offsets[i + 1] - int(has_eos)]
        _compare(want, got, int(uids[i])) if plain_ids else _compare(got, want, int(uids[i]))
    if not chosen and fast is not None:
        i = int(order[0])
        head = texts[i][:budget]
        _compare(fast.encode([head])[0], tok.encode([head])[0], int(uids[i]), f" (its first {len(head):,} characters)")
        return 1, 0, 0.0
    return len(chosen), sum(len(texts[i]) for i in chosen), seconds


def _compare(got: np.ndarray, want: np.ndarray, uid: int, what: str = "") -> None:
    if got.size != want.size or not np.array_equal(got, want):
        k = next((j for j, (a, b) in enumerate(zip(got.tolist(), want.tolist())) if a != b), min(got.size, want.size))
        raise FastEncodeMismatch(
            f"tokenize: the fast encoder's ids for document uid {uid}{what} differ from the plain encoder's from token "
            f"{k} on ({got.size} ids against {want.size}); set tokenizer.fast_encode: false and report this document")


HF_SPECIALS = ("<s>", "</s>", "<pad>")  # ids 0, 1, 2 of a trained tokenizer.json; user symbols follow


def train_hf_tokenizer(sample_file: Path, out_file: Path, *, vocab_size: int, seed: int,
                       user_symbols: tuple = ()) -> str:
    """Train a byte-level BPE Hugging Face `tokenizer.json` (as Qwen/DeepSeek/GPT-2 use) on the same
    seeded sample the SentencePiece trainer reads; returns its path and writes `tokenizer_config.json`
    beside it naming bos/eos/pad.

    Ids: <s> 0, </s> 1, <pad> 2, then `user_symbols`, the 256 bytes and the merges (fewer than asked when
    the sample holds fewer pairs seen twice). Byte-level BPE
    covers every byte, so there is no <unk> and encode->decode round-trips. No normaliser (the
    pipeline already normalised). The sample is cut to TRAINER_LINES lines with `seed` as for
    SentencePiece; the trainer itself is deterministic (one thread: TOKENIZERS_PARALLELISM=false), so
    the same sample and seed give a byte-identical file.
    """
    from tokenizers import Tokenizer as HF, decoders, models, pre_tokenizers, trainers

    train_file = _seeded_cut(Path(sample_file), TRAINER_LINES, seed)
    try:
        tok = HF(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        specials = list(dict.fromkeys([*HF_SPECIALS, *user_symbols]))
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                      special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        with open(train_file, encoding="utf-8") as f:
            tok.train_from_iterator((line.rstrip("\n") + "\n" for line in f), trainer=trainer)
    except Exception as e:  # noqa: BLE001 - tokenizers raises bare Exception
        raise TokenizerError(f"tokenizer.json training failed: {str(e)[:300]}") from None
    finally:
        if train_file != Path(sample_file):
            train_file.unlink(missing_ok=True)
    out_file = Path(out_file)
    write_text_atomic(out_file, tok.to_str(pretty=False))
    write_text_atomic(out_file.with_name("tokenizer_config.json"), json_dumps(
        {"bos_token": HF_SPECIALS[0], "eos_token": HF_SPECIALS[1], "pad_token": HF_SPECIALS[2],
         "added_tokens": list(user_symbols), "model_max_length": 1 << 20, "tokenizer_class": "PreTrainedTokenizerFast"}))
    return str(out_file)


def json_dumps(obj: object) -> str:
    """Stable JSON text for the files written beside a tokenizer."""
    import json

    return json.dumps(obj, ensure_ascii=False, indent=1, sort_keys=True) + "\n"
