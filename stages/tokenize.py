"""SentencePiece tokenization with safety checks before any long work.

Encoding runs in native code over whole batches (one call per `batch_docs` documents) inside Dask
worker processes; sentencepiece's own threads barely help. Tokens leave as Arrow `list<int32>`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import sentencepiece as spm

from .base import BatchResult, atomic_file, file_sha256, write_bytes_atomic, write_text_atomic
from .composition import group_counts

TOKEN_SCHEMA = pa.schema([("uid", pa.int64()), ("n_tokens", pa.int32()), ("input_ids", pa.list_(pa.int32()))])

_CACHE: dict[str, spm.SentencePieceProcessor] = {}


class TokenizerError(ValueError):
    """The tokenizer cannot be used with this model or config."""


def load_tokenizer(path: str) -> spm.SentencePieceProcessor:
    """Load a .model once per process (Dask workers keep it between partitions)."""
    key = os.path.abspath(path)
    sp = _CACHE.get(key)
    if sp is None:
        if not os.path.isfile(path):
            raise TokenizerError(f"tokenizer model {path} does not exist")
        sp = spm.SentencePieceProcessor()
        try:
            sp.Load(path)
        except Exception as e:  # noqa: BLE001 - sentencepiece raises bare OSError/RuntimeError
            raise TokenizerError(f"{path} is not a SentencePiece model: {e}") from None
        _CACHE[key] = sp
    return sp


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


def check_tokenizer(
    path: str,
    *,
    add_bos: bool,
    add_eos: bool,
    pad_id: Optional[int],
    model_vocab_size: Optional[int],
    sample_texts: list[str],
    max_unk_rate: float = 0.01,
) -> TokenizerReport:
    """Refuse a tokenizer that would corrupt training, before any long work starts."""
    sp = load_tokenizer(path)
    vocab = sp.GetPieceSize()
    bos, eos, unk, model_pad = sp.bos_id(), sp.eos_id(), sp.unk_id(), sp.pad_id()
    problems = []
    if add_eos and eos < 0:
        problems.append("add_eos is set but the tokenizer has no EOS piece")
    if add_bos and bos < 0:
        problems.append("add_bos is set but the tokenizer has no BOS piece")
    specials = {name: i for name, i in (("bos", bos), ("eos", eos), ("unk", unk)) if i >= 0}
    if len(set(specials.values())) != len(specials):
        problems.append(f"special ids are not distinct: {specials}")
    if pad_id is not None:
        chosen_pad, pad_source = pad_id, "config"
    elif model_pad >= 0:
        chosen_pad, pad_source = model_pad, "tokenizer"
    else:
        chosen_pad, pad_source = unk, "unk (the tokenizer defines no pad)"
    if not 0 <= chosen_pad < vocab:
        problems.append(f"pad id {chosen_pad} is outside the vocabulary (0..{vocab - 1})")
    report = TokenizerReport(path, file_sha256(path), vocab, bos, eos, unk, chosen_pad, pad_source, model_vocab_size)
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
        ids = sp.encode(sample_texts, out_type=int)
        report.sample_docs = len(sample_texts)
        report.sample_tokens = sum(len(x) for x in ids)
        unk_count = sum(x.count(unk) for x in ids) if unk >= 0 else 0
        report.unk_rate = unk_count / max(1, report.sample_tokens)
        if unk_count:
            chars: dict[str, int] = {}
            for text, seq in zip(sample_texts, ids):
                if unk in seq:
                    for ch in set(text):
                        if unk in sp.encode(ch, out_type=int):
                            chars[ch] = chars.get(ch, 0) + text.count(ch)
            report.top_unk_chars = sorted(chars.items(), key=lambda kv: -kv[1])[:10]
        decoded = sp.decode(ids)
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


def tokenize_batch(docs: pa.Table | pd.DataFrame, model_path: str, add_bos: bool, add_eos: bool, batch_docs: int) -> BatchResult:
    """Encode the `text` column into `input_ids` (list<int32>), BOS/EOS per config. `source` and
    `language`, when given, are carried on (the pack step mixes, splits and counts by them), with
    `doc_hash`, an xxh3 of the text (the validation split's stable key: the same text falls on the
    same side in every run, whatever its file or line)."""
    import xxhash

    sp = load_tokenizer(model_path)
    if isinstance(docs, pa.Table):
        texts, uids = docs.column("text").to_pylist(), docs.column("uid").to_numpy()
        extra = {c: docs.column(c).to_pylist() for c in ("source", "language") if c in docs.column_names}
    else:
        texts, uids = docs["text"].tolist(), docs["uid"].to_numpy(dtype="int64")
        extra = {c: docs[c].tolist() for c in ("source", "language") if c in docs.columns}
    # ids straight into int32 buffers (return_type="numpy"): no Python int per token, which cost 10-12%
    # of the stage in creating them and again in flattening them
    encoded: list[np.ndarray] = []
    for start in range(0, len(texts), batch_docs):
        encoded.extend(sp.encode(texts[start : start + batch_docs], return_type="numpy", add_bos=add_bos, add_eos=add_eos))
    lengths = np.fromiter(map(len, encoded), dtype=np.int32, count=len(encoded))
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = np.concatenate(encoded).astype(np.int32, copy=False) if encoded else np.empty(0, dtype=np.int32)
    lists = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=pa.int32()))
    table = pa.Table.from_arrays(
        [pa.array(np.asarray(uids, dtype=np.int64)), pa.array(lengths), lists],
        schema=TOKEN_SCHEMA,
    )
    stats = {"docs_in": len(texts), "docs_out": len(texts), "tokens": int(values.size), "chars": int(sum(map(len, texts)))}
    if len(extra) == 2:
        table = table.append_column("source", pa.array(extra["source"], pa.string()))
        table = table.append_column("language", pa.array(extra["language"], pa.string()))
        hashes = np.fromiter((xxhash.xxh3_64_intdigest(t.encode("utf-8", "surrogatepass")) for t in texts),
                             dtype=np.uint64, count=len(texts))
        table = table.append_column("doc_hash", pa.array(hashes, pa.uint64()))
        stats["by_group"] = group_counts(extra["source"], extra["language"], chars=map(len, texts), tokens=lengths)
    return BatchResult(kept=table, stats=stats)
