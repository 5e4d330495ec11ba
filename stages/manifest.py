"""The shard manifest (`shards/manifest.json`): the one place that builds it, loads it and checks
what it claims.

`build` assembles it from what the shard step planned and wrote.

`load` parses it and refuses anything that is not a well-formed corpusmill manifest (not JSON,
missing keys, wrong types, an unknown `format` tag, a path that is absolute or climbs out with
`..`), with one clear message and never a traceback. `layout_problems` checks what costs no more
than a stat: the manifest agrees with itself (sample length, ranks x files, samples per rank,
special ids in range, each file's name against its rank) and every listed path exists inside the
folder (no symlink out). `content_problems` reads the bytes: size and sha256 of every `.mindrecord`
and `.db` and of the tokenizer, the tokenizer's own vocabulary and special ids, each MindRecord
header and index naming its own file (a `.mindrecord` moved without its `.db` crashes MindSpore's
reader), the row count in each index, and MindRecord files the manifest does not list. Nothing
here imports MindSpore; checksums are checked before any file is opened by a parser.
"""
from __future__ import annotations

import json
import os
import re
import sqlite3
import struct
from typing import Any, Optional

from .base import file_sha256, inside  # noqa: F401 - generic file checks; kept importable from here

FORMAT = "corpusmill-shards/1"
MANIFEST_NAME = "manifest.json"
MINDRECORD_NAME = re.compile(r"\.mindrecord\d*$")  # what mindformers' loader collects under dataset_dir
_PER_RANK_NAME = re.compile(r"^rank-(\d{4})/corpus-r(\d{4})-f(\d{2,})\.mindrecord$")
_GLOBAL_NAME = re.compile(r"^corpus\.mindrecord(\d+)$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_MAX_HEADER = 64 << 20  # a MindRecord header larger than this is damage, not a header


class ShardMismatch(ValueError):
    """The shards are damaged, do not match their manifest, or do not fit the model."""


_INT = "int"
_TOP_KEYS: dict[str, Any] = {
    "format": str, "seq_length": _INT, "sample_length": _INT, "vocab_size": _INT, "tokenizer": dict, "ranks": _INT,
    "files_per_rank": _INT, "samples_per_rank": _INT, "total_samples": _INT, "files": list,
}
_OPTIONAL_TOP: dict[str, Any] = {"layout": str, "columns": dict, "pack_mode": str, "composition": dict}
_TOKENIZER_KEYS: dict[str, Any] = {
    "path": str, "sha256": str, "vocab_size": _INT, "bos_id": _INT, "eos_id": _INT, "unk_id": _INT, "pad_id": _INT,
    "pad_source": str,
}
_FILE_KEYS: dict[str, Any] = {"path": str, "rank": (_INT, None), "samples": _INT, "sha256": str, "db_sha256": str,
                              "bytes": _INT}
_OPTIONAL_FILE: dict[str, Any] = {"tokens": _INT, "pad_tokens": _INT, "rows_xxh3_sum": _INT}
_PAIR_KEYS: dict[str, Any] = {"prefix": str, "rank": (_INT, None), "documents": _INT, "tokens": _INT, "dtype": str,
                              "bin_sha256": str, "idx_sha256": str, "bin_bytes": _INT, "idx_bytes": _INT}
MEGATRON_NAME = re.compile(r"\.(bin|idx)$")


def build(*, version: str, config_hash: str, created_utc: str, seq_length: int, tokenizer: dict[str, Any],
          add_bos: bool, add_eos: bool, labels: bool, pack_mode: str, layout: str, ranks: int, files_per_rank: int,
          samples_per_rank: int, total_samples: int, dropped: int, repeated: int, remainder: str, shuffle_seed: int,
          files: list[dict[str, Any]], tokenizer_file: str = "tokenizer.model", megatron: Optional[dict[str, Any]] = None,
          formats: Optional[list[str]] = None, composition: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The manifest of a finished set of shards, in FORMAT. `tokenizer` holds the checked tokenizer's
    sha256, special ids, pad source and vocabulary size; `files` one entry per MindRecord file;
    `composition` (optional) the tokens and samples per source and language."""
    window = seq_length + 1
    columns = {"input_ids": {"type": "int32", "shape": [window],
                             "note": "seq_length + 1 ids; the model shifts by one for labels; EOS ends every document"}}
    if labels:
        columns["labels"] = {"type": "int32", "shape": [window], "note": "input_ids with -100 on trailing padding"}
    doc = {
        "format": FORMAT,
        "corpusmill_version": version,
        "config_hash": config_hash,
        "created_utc": created_utc,
        "seq_length": seq_length,
        "sample_length": window,
        "vocab_size": tokenizer["vocab_size"],
        "tokenizer": {k: tokenizer[k] for k in ("sha256", "bos_id", "eos_id", "unk_id", "pad_id", "pad_source", "vocab_size")}
        | {"path": tokenizer_file, "add_bos": add_bos, "add_eos": add_eos} | _kind_keys(tokenizer),
        "columns": columns,
        "pack_mode": pack_mode,
        "layout": layout,
        "ranks": ranks,
        "files_per_rank": files_per_rank,
        "samples_per_rank": samples_per_rank,
        "total_samples": total_samples,
        "dropped_samples": dropped,
        "repeated_samples": repeated,
        "remainder": remainder,
        "total_tokens": sum(x["tokens"] for x in files),
        "shuffle_seed": shuffle_seed,
        "files": files,
    } | ({"composition": composition} if composition else {})
    if megatron is not None:  # a MindRecord-only manifest stays exactly as it was
        pairs = megatron["pairs"]
        doc["formats"] = formats or ["megatron"]
        doc["megatron"] = {"dtype": megatron["dtype"], "split": megatron.get("split", "rank"),
                           "documents": sum(p["documents"] for p in pairs),
                           "tokens": sum(p["tokens"] for p in pairs),
                           "note": "Megatron-Core indexed datasets: PREFIX.bin + PREFIX.idx, one sequence per whole "
                                   "document ending with EOS; one pair per rank (split rank) or per source (split "
                                   "source, the pair's `source`); mindformers_megatron_train_dataset.yaml lists them",
                           "pairs": pairs}
    return doc


def _kind_keys(tokenizer: dict[str, Any]) -> dict[str, Any]:
    """What a tokenizer other than SentencePiece adds to the manifest: its kind, the special token
    strings (so a checker finds the ids again) and, for a plain .tiktoken file, how to load it. A
    SentencePiece manifest stays as it was (no `kind`: sentencepiece)."""
    kind = tokenizer.get("kind", "sentencepiece")
    if kind == "sentencepiece":
        return {}
    keys: dict[str, Any] = {"kind": kind, "tokens": dict(tokenizer.get("tokens") or {})}
    if kind == "tiktoken" and not str(tokenizer.get("path", "")).endswith(".json"):
        keys["tiktoken"] = {"pattern": tokenizer.get("pattern"), "special_tokens": list(tokenizer.get("special_tokens") or [])}
    return keys


def tokenizer_spec(tok: dict[str, Any]) -> Any:
    """The load spec of a manifest's tokenizer section."""
    from .tokenizer_kinds import TokenizerSpec

    kind = tok.get("kind", "sentencepiece")
    extra = tok.get("tiktoken") or {}
    if kind != "tiktoken":
        return TokenizerSpec(kind)
    return TokenizerSpec(kind, extra.get("pattern"), tuple(extra.get("special_tokens") or ()))


def _is(value: Any, kind: Any) -> bool:
    if isinstance(kind, tuple):
        return any(_is(value, k) for k in kind)
    if kind is None:
        return value is None
    if kind == _INT:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _kind_name(kind: Any) -> str:
    if isinstance(kind, tuple):
        return " or ".join(_kind_name(k) for k in kind)
    return {None: "null", _INT: "an integer", str: "a string", dict: "an object", list: "a list"}[kind]


def _keys(obj: dict, required: dict, optional: dict, where: str) -> list[str]:
    problems = []
    missing = [k for k in required if k not in obj]
    if missing:
        problems.append(f"{where} misses key(s) {', '.join(missing)}")
    for key, kind in {**required, **optional}.items():
        if key in obj and not _is(obj[key], kind):
            problems.append(f"{where}.{key} is {_show(obj[key])}, expected {_kind_name(kind)}")
    return problems


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= 40 else text[:37] + "..."


def unsafe_path(rel: str) -> Optional[str]:
    """Why a manifest path is not a plain relative path inside the folder (None when it is)."""
    if not rel or "\x00" in rel:
        return "is empty or holds a NUL byte"
    try:
        rel.encode("utf-8")
    except UnicodeError:
        return "is not a valid file name (not UTF-8: a lone surrogate escape)"
    if os.path.isabs(rel) or rel.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", rel):
        return "is an absolute path: every path must stay inside the shard folder"
    if ".." in re.split(r"[\\/]", rel):
        return "climbs out of the folder with '..': every path must stay inside the shard folder"
    return None


def structure_problems(manifest: Any) -> list[str]:
    """Keys, types, the format tag and path syntax: what must hold before any value is used."""
    if not isinstance(manifest, dict):
        return [f"is {type(manifest).__name__}, not a JSON object"]
    fmt = manifest.get("format")
    if "format" not in manifest:
        return ["has no `format` tag: not a corpusmill shard manifest"]
    if fmt != FORMAT:
        hint = ("written by a newer corpusmill" if isinstance(fmt, str) and fmt.startswith("corpusmill-shards/")
                else "not a corpusmill shard manifest")
        return [f"format is {_show(fmt)}, expected {FORMAT!r} ({hint})"]
    problems = _keys(manifest, _TOP_KEYS, _OPTIONAL_TOP, "manifest")
    if isinstance(manifest.get("tokenizer"), dict):
        problems += _keys(manifest["tokenizer"], _TOKENIZER_KEYS, {}, "tokenizer")
    files = manifest.get("files")
    mega = manifest.get("megatron")
    problems += _megatron_structure(mega) if mega is not None else []
    if isinstance(files, list):
        problems += ["lists no files"] if not files and mega is None else []
        for i, entry in enumerate(files):
            if not isinstance(entry, dict):
                problems.append(f"files[{i}] is {_show(entry)}, expected an object")
                continue
            problems += _keys(entry, _FILE_KEYS, _OPTIONAL_FILE, f"files[{i}]")
    columns = manifest.get("columns")
    if isinstance(columns, dict):
        for name, spec in columns.items():
            if not isinstance(spec, dict):
                problems.append(f"columns.{_show(name)} is {_show(spec)}, expected an object")
            elif "shape" in spec and not (isinstance(spec["shape"], list)
                                          and all(isinstance(x, int) and not isinstance(x, bool) for x in spec["shape"])):
                problems.append(f"columns.{_show(name)}.shape is {_show(spec['shape'])}, expected a list of integers")
    if problems:
        return problems
    tok = manifest["tokenizer"]
    for where, rel in [("tokenizer.path", tok["path"])] + [(f"files[{i}].path", e["path"]) for i, e in enumerate(files)]:
        why = unsafe_path(rel)
        if why:
            problems.append(f"{where} {_show(rel)} {why}")
    problems += _megatron_values(mega)
    for where, value in [("tokenizer.sha256", tok["sha256"])] + [
            (f"files[{i}].{k}", e[k]) for i, e in enumerate(files) for k in ("sha256", "db_sha256")]:
        if not _SHA256.match(value):
            problems.append(f"{where} {_show(value)} is not a sha256 (64 lowercase hex digits)")
    for key in ("seq_length", "sample_length", "vocab_size", "ranks", "files_per_rank"):
        if manifest[key] < 1:
            problems.append(f"{key} is {manifest[key]}, expected at least 1")
    for key in ("samples_per_rank", "total_samples"):
        if manifest[key] < 0:
            problems.append(f"{key} is {manifest[key]}, expected at least 0")
    for i, e in enumerate(files):
        if e["samples"] < 0 or e["bytes"] < 0:
            problems.append(f"files[{i}] has a negative sample or byte count")
    if manifest.get("layout", "per_rank") not in ("per_rank", "global"):
        problems.append(f"layout is {_show(manifest['layout'])}, expected 'per_rank' or 'global'")
    paths = [os.path.normpath(e["path"]) for e in files]
    if len(set(paths)) != len(paths):
        problems.append("lists the same file more than once")
    return problems


def _megatron_structure(mega: Any) -> list[str]:
    if not isinstance(mega, dict):
        return [f"megatron is {_show(mega)}, expected an object"]
    pairs = mega.get("pairs")
    if not isinstance(pairs, list) or not pairs:
        return ["megatron.pairs is missing or empty"]
    problems = []
    for i, pair in enumerate(pairs):
        if not isinstance(pair, dict):
            problems.append(f"megatron.pairs[{i}] is {_show(pair)}, expected an object")
            continue
        problems += _keys(pair, _PAIR_KEYS, {"max_id": _INT, "source": str}, f"megatron.pairs[{i}]")
    return problems


def _megatron_values(mega: Optional[dict]) -> list[str]:
    """Each pair's prefix is a plain relative path and its checksums are sha256s."""
    problems = []
    prefixes = [os.path.normpath(p["prefix"]) for p in (mega or {}).get("pairs", [])]
    if len(set(prefixes)) != len(prefixes):
        problems.append("megatron.pairs lists the same prefix more than once")
    for i, pair in enumerate((mega or {}).get("pairs", [])):
        why = unsafe_path(pair["prefix"])
        if why:
            problems.append(f"megatron.pairs[{i}].prefix {_show(pair['prefix'])} {why}")
        for k in ("bin_sha256", "idx_sha256"):
            if not _SHA256.match(pair[k]):
                problems.append(f"megatron.pairs[{i}].{k} {_show(pair[k])} is not a sha256 (64 lowercase hex digits)")
    return problems


def parse(shards_dir: str) -> tuple[Optional[dict[str, Any]], list[str]]:
    """(the manifest, []) or (None, every problem that keeps it from being used), never raising."""
    path = os.path.join(shards_dir, MANIFEST_NAME)
    if not os.path.isfile(path):
        return None, [f"{path} does not exist: not a finished corpusmill shard directory"]
    _, why = inside(shards_dir, MANIFEST_NAME)
    if why:
        return None, [f"{path} {why}"]
    try:
        with open(path, "rb") as f:
            raw = f.read(64 << 20)
        manifest = json.loads(raw.decode("utf-8"))
    except OSError as e:
        return None, [f"{path} cannot be read: {e.strerror or e}"]
    except UnicodeDecodeError:
        return None, [f"{path} is not UTF-8 text: the manifest is damaged"]
    except (ValueError, RecursionError) as e:
        return None, [f"{path} is not valid JSON ({_first_line(e)}): the manifest is damaged"]
    problems = structure_problems(manifest)
    if problems:
        return None, [f"{path}: {p}" for p in problems]
    return manifest, []


def load(shards_dir: str) -> dict[str, Any]:
    """The parsed manifest of a shard folder; ShardMismatch with one clear line if it is missing,
    not JSON, or not a well-formed corpusmill manifest."""
    manifest, problems = parse(shards_dir)
    if manifest is None:
        raise ShardMismatch(_one_line(problems))
    return manifest


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0][:200]


def _one_line(problems: list[str]) -> str:
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return problems[0].replace("\n", " ") + more


def summary_line(shards_dir: str, problems: list[str]) -> str:
    """One line for a refusal: the first problem and how many more."""
    return f"shards in {shards_dir} do not check out: {_one_line(problems)}"


def layout_problems(shards_dir: str, manifest: dict[str, Any]) -> list[str]:
    """Checks that read no file: the manifest agrees with itself, and every listed file and its
    `.db` exist inside the folder."""
    problems = consistency_problems(manifest)
    root = os.path.abspath(shards_dir)
    for entry in manifest["files"]:
        rel = entry["path"]
        path, why = inside(root, rel)
        db, why_db = inside(root, rel + ".db")
        if why or why_db:
            problems.append(f"{rel}: {why or why_db.replace('resolves', 'its .db resolves')}")
            continue
        missing = [p for p in (path, db) if not os.path.isfile(p)]
        if missing:
            problems.append(f"{rel}: missing {', '.join(os.path.basename(m) for m in missing)}")
    return problems


def consistency_problems(m: dict[str, Any]) -> list[str]:
    """The manifest's numbers against each other: nothing here reads a file."""
    problems = []
    ranks, fpr, files = m["ranks"], m["files_per_rank"], m["files"]
    if m["sample_length"] != m["seq_length"] + 1:
        problems.append(f"sample_length {m['sample_length']} is not seq_length {m['seq_length']} + 1")
    shape = (((m.get("columns") or {}).get("input_ids") or {}).get("shape"))
    if shape is not None and shape != [m["sample_length"]]:
        problems.append(f"columns.input_ids.shape {_show(shape)} is not [{m['sample_length']}] (sample_length)")
    tok = m["tokenizer"]
    if tok["vocab_size"] != m["vocab_size"]:
        problems.append(f"vocab_size {m['vocab_size']} differs from tokenizer.vocab_size {tok['vocab_size']}")
    vocab = m["vocab_size"]
    for key in ("eos_id", "pad_id", "unk_id", "bos_id"):
        value = tok[key]
        optional = (key == "bos_id" and not tok.get("add_bos") or key == "eos_id" and not tok.get("add_eos")
                    or key == "unk_id" and tok.get("kind", "sentencepiece") != "sentencepiece")  # byte-level BPE: no unk
        if not (0 <= value < vocab or (optional and value == -1)):
            problems.append(f"tokenizer.{key} {value} is outside the vocabulary (0..{vocab - 1})")
    if not files and m.get("megatron") is not None:
        return problems  # Megatron pairs only: their own checks (stages.megatron.pair_problems)
    if len(files) != ranks * fpr:
        problems.append(f"ranks {ranks} x files_per_rank {fpr} = {ranks * fpr} files, but the manifest lists {len(files)}")
    layout = m.get("layout", "per_rank")
    per_rank: dict[int, list[int]] = {}
    for e in files:
        rel, rank = e["path"].replace("\\", "/"), e["rank"]
        if layout == "global":
            if rank is not None:
                problems.append(f"{e['path']}: rank {rank} in a global layout (MindDataset splits the files; expected null)")
            if not _GLOBAL_NAME.match(rel):
                problems.append(f"{e['path']}: not a global-layout file name (corpus.mindrecordNN)")
            continue
        named = _PER_RANK_NAME.match(rel)
        if rank is None or not 0 <= rank < ranks:
            problems.append(f"{e['path']}: rank {rank} does not exist (ranks {ranks})")
        elif not named:
            problems.append(f"{e['path']}: not a per-rank file name (rank-NNNN/corpus-rNNNN-fNN.mindrecord)")
        elif not int(named.group(1)) == int(named.group(2)) == rank:
            problems.append(f"{e['path']}: listed for rank {rank} but its name says rank {int(named.group(2))} "
                            "(ranks swapped or edited in the manifest)")
        if rank is not None:
            per_rank.setdefault(rank, []).append(e["samples"])
    if layout == "per_rank" and len(files) == ranks * fpr:  # (else said above; and `ranks` may be absurd)
        for rank in range(ranks):
            got = per_rank.get(rank, [])
            if len(got) != fpr:
                problems.append(f"rank {rank}: {len(got)} files listed, expected files_per_rank {fpr}")
            elif sum(got) != m["samples_per_rank"]:
                problems.append(f"rank {rank}: its files list {sum(got)} samples, samples_per_rank says {m['samples_per_rank']}")
    total = sum(e["samples"] for e in files)
    if total != m["total_samples"] or m["total_samples"] != ranks * m["samples_per_rank"]:
        problems.append(f"files list {total} samples; total_samples {m['total_samples']}; ranks {ranks} x "
                        f"samples_per_rank {m['samples_per_rank']} = {ranks * m['samples_per_rank']}: they must agree")
    for e in files:
        if "tokens" in e and "pad_tokens" in e and e["tokens"] + e["pad_tokens"] != e["samples"] * m["sample_length"]:
            problems.append(f"{e['path']}: tokens {e['tokens']} + pad_tokens {e['pad_tokens']} is not samples "
                            f"{e['samples']} x sample_length {m['sample_length']}")
    return problems


def _sha256_bytes(path: str) -> tuple[str, bytes]:
    """sha256 and the bytes of a small file, read once (what is hashed is what is parsed)."""
    import hashlib

    with open(path, "rb") as f:
        data = f.read()
    return hashlib.sha256(data).hexdigest(), data


def tokenizer_problems(shards_dir: str, manifest: dict[str, Any]) -> list[str]:
    """The tokenizer file's sha256, then its own vocabulary and special ids against the manifest."""
    import sentencepiece as spm

    tok = manifest["tokenizer"]
    rel = tok["path"]
    path, why = inside(os.path.abspath(shards_dir), rel)
    if why:
        return [f"tokenizer {rel}: {why}"]
    if not os.path.isfile(path):
        return [f"tokenizer {rel}: missing (the manifest's tokenizer file is gone)"]
    try:
        if file_sha256(path) != tok["sha256"]:  # streamed: a huge file put in its place is not read into memory
            return [f"tokenizer {rel}: sha256 differs from the manifest's tokenizer.sha256 (file replaced or altered, "
                    "or the manifest edited)"]
        digest, data = _sha256_bytes(path)
    except OSError as e:
        return [f"tokenizer {rel}: cannot be read: {e.strerror or e}"]
    if digest != tok["sha256"]:
        return [f"tokenizer {rel}: changed while it was being checked"]
    if tok.get("kind", "sentencepiece") != "sentencepiece":
        return _other_tokenizer_problems(path, rel, manifest)
    sp = spm.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(data)
    except Exception as e:  # noqa: BLE001 - sentencepiece raises bare RuntimeError/OSError
        return [f"tokenizer {rel}: not a SentencePiece model ({_first_line(e)})"]
    vocab = sp.GetPieceSize()
    problems = []
    if vocab != manifest["vocab_size"] or vocab != tok["vocab_size"]:
        problems.append(f"tokenizer {rel} has {vocab} pieces but the manifest says vocab_size {manifest['vocab_size']} "
                        f"(tokenizer.vocab_size {tok['vocab_size']})")
    own = {"bos_id": sp.bos_id(), "eos_id": sp.eos_id(), "unk_id": sp.unk_id()}
    source = tok["pad_source"]
    if source == "tokenizer":
        own["pad_id"] = sp.pad_id()
    elif source.startswith("unk"):
        own["pad_id"] = sp.unk_id()
    for key, value in own.items():
        if tok[key] != value:
            piece = sp.IdToPiece(value) if 0 <= value < vocab else "none"
            problems.append(f"tokenizer.{key} is {tok[key]} but the tokenizer's own {key.split('_')[0]} piece "
                            f"({piece}) is {value}")
    if source == "config" and not 0 <= tok["pad_id"] < vocab:
        problems.append(f"tokenizer.pad_id {tok['pad_id']} is outside the tokenizer's vocabulary (0..{vocab - 1})")
    return problems


def _other_tokenizer_problems(path: str, rel: str, manifest: dict[str, Any]) -> list[str]:
    """A Hugging Face or tiktoken tokenizer: it loads as its kind, its vocabulary (added tokens
    counted) matches, and each special token string the manifest names is still that id."""
    from .tokenizer_kinds import TokenizerFormatError, load

    tok = manifest["tokenizer"]
    if tok["kind"] not in ("hf", "tiktoken"):
        return [f"tokenizer.kind {_show(tok['kind'])} is not sentencepiece, hf or tiktoken"]
    try:
        t = load(path, tokenizer_spec(tok))
    except (TokenizerFormatError, OSError, ValueError) as e:
        return [f"tokenizer {rel}: not a {tok['kind']} tokenizer ({_first_line(e)})"]
    problems = []
    if t.vocab_size != manifest["vocab_size"] or t.vocab_size != tok["vocab_size"]:
        problems.append(f"tokenizer {rel} has {t.vocab_size} ids but the manifest says vocab_size {manifest['vocab_size']} "
                        f"(tokenizer.vocab_size {tok['vocab_size']})")
    names = tok.get("tokens") if isinstance(tok.get("tokens"), dict) else {}
    for key in ("bos", "eos", "unk", "pad"):
        name = names.get(key)
        if not isinstance(name, str) or (key == "pad" and tok["pad_source"] not in ("tokenizer", "config")):
            continue
        own = t.token_id(name)
        if own != tok[f"{key}_id"]:
            problems.append(f"tokenizer.{key}_id is {tok[f'{key}_id']} but the tokenizer's own {name!r} is {own}")
    return problems


def read_header(path: str) -> dict[str, Any]:
    """A MindRecord file's JSON header (8-byte little-endian length, then JSON), read in Python."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError("shorter than a MindRecord header")
        (size,) = struct.unpack("<Q", head)
        if not 0 < size <= min(_MAX_HEADER, os.path.getsize(path) - 8):
            raise ValueError(f"header length {size} does not fit the file")
        header = json.loads(f.read(size).decode("utf-8"))
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    return header


def index_facts(db_path: str) -> tuple[str, int]:
    """(the file name a MindRecord index was written for, its row count), through sqlite read-only:
    the index is never written to, and no journal appears in the shard folder."""
    from urllib.parse import quote

    con = sqlite3.connect(f"file:{quote(os.path.abspath(db_path))}?mode=ro&immutable=1", uri=True)
    try:
        names = con.execute("SELECT NAME FROM SHARD_NAME").fetchall()
        (rows,) = con.execute("SELECT COUNT(*) FROM INDEXES").fetchone()
    finally:
        con.close()
    if len(names) != 1 or not isinstance(names[0][0], str):
        raise ValueError(f"SHARD_NAME holds {len(names)} names")
    return names[0][0], int(rows)


def pairing_problems(path: str, rel: str, samples: Optional[int]) -> list[str]:
    """A `.mindrecord` and its `.db` must name each other's file: MindSpore's reader follows the
    header's own name and crashes (SIGSEGV) on a file moved or swapped without its index."""
    name = os.path.basename(path)
    try:
        header = read_header(path)
        addresses = header.get("shard_addresses")
        pages = header.get("page") or []
        header_rows = sum(int(p["end_row_id"]) - int(p["start_row_id"]) for p in pages
                          if isinstance(p, dict) and p.get("page_type") == "BLOB_DATA")
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError) as e:
        return [f"{rel}: MindRecord header unreadable ({_first_line(e)}): damaged or not a MindRecord file"]
    problems = []
    if not isinstance(addresses, list) or [os.path.basename(str(a)) for a in addresses] != [name]:
        problems.append(f"{rel}: its MindRecord header names {_show(addresses)}, not {name}: a file moved, renamed or "
                        "swapped without its .db (MindSpore's reader would crash on it)")
    try:
        db_name, db_rows = index_facts(path + ".db")
    except (sqlite3.Error, ValueError, OSError) as e:
        return problems + [f"{rel}.db: not a readable MindRecord index ({_first_line(e)})"]
    if os.path.basename(db_name) != name:
        problems.append(f"{rel}.db: the index was written for {db_name}, not {name}: .mindrecord and .db swapped or "
                        "renamed apart")
    if db_rows != header_rows:
        problems.append(f"{rel}: header counts {header_rows} rows, its .db indexes {db_rows}")
    if samples is not None and db_rows != samples:
        problems.append(f"{rel}: {db_rows} samples in its index, manifest says {samples}")
    return problems


def content_problems(shards_dir: str, manifest: dict[str, Any]) -> list[str]:
    """Size and sha256 of every listed file and `.db` (checked before any parser opens them), the
    tokenizer, each file's header/index pairing and row count, and unlisted MindRecord files."""
    root = os.path.abspath(shards_dir)
    problems = tokenizer_problems(root, manifest)
    for entry in manifest["files"]:
        rel = entry["path"]
        path, why = inside(root, rel)
        if why or not os.path.isfile(path) or not os.path.isfile(path + ".db"):
            continue  # layout_problems names it
        size = os.path.getsize(path) + os.path.getsize(path + ".db")
        if size != entry["bytes"]:
            problems.append(f"{rel}: sha256 differs from the manifest (file altered or truncated: {size:,} bytes with "
                            f"its .db, manifest says {entry['bytes']:,})")
            continue
        bad = []
        try:
            if file_sha256(path) != entry["sha256"]:
                bad.append(f"{rel}: sha256 differs from the manifest (file altered or truncated)")
            if file_sha256(path + ".db") != entry["db_sha256"]:
                bad.append(f"{rel}.db: sha256 differs from the manifest")
        except OSError as e:
            bad.append(f"{rel}: cannot be read: {e.strerror or e} ({e.filename or path})")
        if bad:
            problems += bad
            continue  # never parse a file whose bytes are not the ones written
        problems += pairing_problems(path, rel, entry["samples"])
    if manifest.get("megatron") is not None:
        from .megatron import pair_problems

        eos = manifest["tokenizer"]["eos_id"] if manifest["tokenizer"].get("add_eos", True) else -1
        for pair in manifest["megatron"]["pairs"]:
            problems += pair_problems(root, pair, manifest["vocab_size"], eos)
    problems += unlisted_problems(root, manifest)
    return problems


def unlisted_problems(root: str, manifest: dict[str, Any]) -> list[str]:
    """MindRecord files in the folder that the manifest does not list: mindformers' dataset_dir
    collects every one, so a stray file would be trained on."""
    listed = {os.path.normpath(e["path"]) for e in manifest["files"]}
    pairs = {os.path.normpath(p["prefix"] + ext) for p in (manifest.get("megatron") or {}).get("pairs", [])
             for ext in (".bin", ".idx")}
    problems = []
    for folder, _, names in os.walk(root):
        for name in sorted(names):
            rel = os.path.normpath(os.path.relpath(os.path.join(folder, name), root))
            shown = rel.encode("utf-8", "backslashreplace").decode("utf-8")  # a name that is not UTF-8, shown escaped
            if MINDRECORD_NAME.search(name) and rel not in listed:
                problems.append(f"{shown}: a MindRecord file the manifest does not list (mindformers' dataset_dir "
                                "would read it)")
            elif MEGATRON_NAME.search(name) and rel.startswith("megatron") and rel not in pairs:
                problems.append(f"{shown}: a Megatron .bin/.idx file the manifest does not list")
    return problems


def check(shards_dir: str, manifest: dict[str, Any]) -> list[str]:
    """Every check that needs no MindSpore: layout, then contents of the files that are present."""
    return layout_problems(shards_dir, manifest) + content_problems(shards_dir, manifest)
