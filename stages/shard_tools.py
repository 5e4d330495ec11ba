"""Token-level tools over finished shard sets: merge, reshard, reweight (never re-tokenizing).

Every input set is verified first (`stages.shard.verify_shard_dir`: manifest, checksums, every sample).
A tool then works on sample references only: per sample, the input file and row it comes from and
its (source, language) group (from the set's `sample_groups.parquet`), about 12 bytes a sample. The
output is planned like the shard step plans it (`plan_shards`: a seeded shuffle, equal samples per
rank, the remainder dropped or padded with repeats) and each output file is written
`CHUNK_SAMPLES` samples at a time, read out of the input files by row (MindDataset with a
SubsetSampler), so memory per file stays bounded however large the sets are. `labels` and
`actual_seq_len` are recomputed from the ids by the shard step's own writer (`write_mindrecord`), so
they are the same bytes as the input's. The new set gets its own manifest, tokenizer copy, sample
groups and mindformers snippet, is written into `OUT.tmp` and renamed, then verified.
Megatron .bin/.idx pairs of an input are not carried over (said in the result).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from . import manifest as mf
from .shard import (ACTUAL_SEQ_LEN, IGNORE_INDEX, LAYOUTS, ShardError, Windows, file_name, mindformers_snippet,
                    plan_shards, verify_shard_dir, write_mindrecord)
from .base import read_table

CHUNK_SAMPLES = 4096  # samples of one output file held at a time
SAMPLE_GROUPS = "sample_groups.parquet"  # pipeline.steps.shard.SAMPLE_GROUPS


class ToolError(mf.ShardMismatch):
    """An input the tools refuse: one line, no traceback (the CLI prints it as an error)."""


@dataclass
class ShardSet:
    """A verified input set: its folder, manifest, and per sample its file, row and group code."""

    root: str
    manifest: dict[str, Any]
    file_of: np.ndarray  # int32 index into manifest["files"]
    row: np.ndarray  # int64 row in that file
    group: np.ndarray  # int32 index into `names` (-1: unknown)
    names: list[tuple[str, str]] = field(default_factory=list)  # (source, language) per group code


def open_set(path: str, log: Callable[[str], None] = print) -> ShardSet:
    """Verify one input set in full and index its samples; ToolError when it does not check out."""
    root = os.path.abspath(path)
    if not os.path.isdir(root):
        raise ToolError(f"{path}: not a shard folder")
    problems, _ = verify_shard_dir(root)
    if problems:
        raise ToolError(mf.summary_line(path, problems))
    m = mf.load(root)
    if not m["files"]:
        raise ToolError(f"{path}: holds Megatron .bin/.idx pairs only: the tools work on MindRecord samples")
    counts = np.array([e["samples"] for e in m["files"]], np.int64)
    file_of = np.repeat(np.arange(len(counts), dtype=np.int32), counts)
    row = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    group = np.full(len(row), -1, np.int32)
    comp = m.get("composition") or {}
    names = [(g["source"], g["language"]) for g in comp.get("groups", [])]
    groups_file = os.path.join(root, SAMPLE_GROUPS)
    if names and os.path.isfile(groups_file):

        table = read_table(groups_file, columns=["file", "row", "group"])
        f, r, g = (table.column(c).to_numpy() for c in ("file", "row", "group"))
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        if len(f) != len(row) or (f >= len(counts)).any() or (r >= counts[f]).any():
            raise ToolError(f"{path}: {SAMPLE_GROUPS} does not match the manifest's files")
        group[starts[f] + r] = g.astype(np.int32)
    log(f"shards: {path}: verified, {len(row):,} samples in {len(counts)} files")
    return ShardSet(root, m, file_of, row, group, names)


def _columns(m: dict[str, Any]) -> tuple[bool, Optional[tuple[int, int]]]:
    """(labels, (eos id, eod_pad_length) or None) of a set's MindRecord columns."""
    cols = m.get("columns") or {}
    eod = None
    if ACTUAL_SEQ_LEN in cols:
        eod = (m["tokenizer"]["eos_id"], int(cols[ACTUAL_SEQ_LEN]["shape"][0]))
    return "labels" in cols, eod


def check_compatible(sets: list[ShardSet]) -> None:
    """Same tokenizer (sha256), seq_length and columns in every set, or one ToolError line."""
    first = sets[0].manifest
    for s in sets[1:]:
        m = s.manifest
        if m["tokenizer"]["sha256"] != first["tokenizer"]["sha256"]:
            raise ToolError(f"{s.root} was tokenized with another tokenizer (sha256 {m['tokenizer']['sha256'][:12]}...) "
                            f"than {sets[0].root} ({first['tokenizer']['sha256'][:12]}...): sets of different "
                            "tokenizers cannot be merged")
        if m["seq_length"] != first["seq_length"]:
            raise ToolError(f"{s.root} holds samples of seq_length {m['seq_length']}, {sets[0].root} of "
                            f"{first['seq_length']}: repack one of them")
        if _columns(m) != _columns(first):
            raise ToolError(f"{s.root} has columns {sorted(m.get('columns') or {})}, {sets[0].root} "
                            f"{sorted(first.get('columns') or {})} (labels / actual_seq_len): they must match")


def _global_groups(sets: list[ShardSet]) -> tuple[list[tuple[str, str]], list[np.ndarray]]:
    """One group code per (source, language) over all sets, and each set's samples' codes."""
    names = sorted({n for s in sets for n in s.names})
    where = {n: i for i, n in enumerate(names)}
    codes = []
    for s in sets:
        remap = np.array([where[n] for n in s.names] + [-1], np.int32)
        codes.append(remap[np.where(s.group < 0, len(s.names), s.group)])
    return names, codes


@dataclass
class Selection:
    """The samples of the output (references into the inputs, with repeats), before the shuffle."""

    set_of: np.ndarray
    index: np.ndarray  # the sample's index within its set
    group: np.ndarray
    names: list[tuple[str, str]]


def select_all(sets: list[ShardSet]) -> Selection:
    """Every sample of every set once (merge, reshard)."""
    names, codes = _global_groups(sets)
    set_of = np.concatenate([np.full(len(s.row), i, np.int32) for i, s in enumerate(sets)])
    index = np.concatenate([np.arange(len(s.row), dtype=np.int64) for s in sets])
    return Selection(set_of, index, np.concatenate(codes), names)


def _ensure_absent(out: str) -> None:
    if os.path.lexists(out):
        raise ToolError(f"{out} already exists: give a new folder for the output set")
    if os.path.lexists(out + ".tmp"):
        raise ToolError(f"{out}.tmp exists (an interrupted earlier write?): remove it first")


def _sample_tokens(s: ShardSet) -> np.ndarray:
    """Tokens (ids minus trailing padding) per sample, from its file's totals (exact without padding)."""
    files = s.manifest["files"]
    per = np.array([(e.get("tokens", e["samples"] * s.manifest["sample_length"]) / max(1, e["samples"]))
                    for e in files], np.float64)
    return per[s.file_of]


def _read_rows(path: str, rows: np.ndarray, labels: bool, window: int) -> Windows:
    """The samples at `rows` (in that order, repeats allowed) of one MindRecord file: ids, and the
    trailing padding read back from `labels` (IGNORE_INDEX) when the set has them."""
    import mindspore.dataset as ds

    columns = ["input_ids"] + (["labels"] if labels else [])
    data = ds.MindDataset([path], columns_list=columns, sampler=ds.SubsetSampler(rows.tolist()), num_parallel_workers=1)
    ids = np.empty((len(rows), window), np.int32)
    n_pad = np.zeros(len(rows), np.int32)
    k = 0
    for batch in data.batch(1024).create_tuple_iterator(output_numpy=True, num_epochs=1):
        n = len(batch[0])
        ids[k:k + n] = batch[0]
        if labels:
            masked = batch[1] == IGNORE_INDEX
            n_pad[k:k + n] = np.cumprod(masked[:, ::-1], axis=1).sum(axis=1)
        k += n
    if k != len(rows):
        raise ShardError(f"{path}: {k} samples read back, {len(rows)} asked for")
    return Windows(np.zeros(len(rows), np.int64), ids, n_pad)


def _chunks(sets: list[ShardSet], sel: Selection, order: np.ndarray, window: int, labels: bool):
    """The output file's samples (`order`: indices into the selection), CHUNK_SAMPLES at a time."""
    for a in range(0, len(order), CHUNK_SAMPLES):
        part = order[a:a + CHUNK_SAMPLES]
        out = Windows(np.zeros(len(part), np.int64), np.empty((len(part), window), np.int32), np.zeros(len(part), np.int32))
        set_of, index = sel.set_of[part], sel.index[part]
        for si in np.unique(set_of).tolist():
            s = sets[si]
            mine = np.flatnonzero(set_of == si)
            files = s.file_of[index[mine]]
            for fi in np.unique(files).tolist():
                at = mine[files == fi]
                got = _read_rows(os.path.join(s.root, s.manifest["files"][fi]["path"]), s.row[index[at]], labels, window)
                out.ids[at], out.n_pad[at] = got.ids, got.n_pad
        yield out


@dataclass
class OutputSpec:
    ranks: int
    files_per_rank: int
    layout: str = "per_rank"
    remainder: str = "drop"
    seed: int = 0
    max_samples_per_file: int = 32768
    write_batch: int = 1000


def _shuffled(n: int, used: int, seed: int) -> np.ndarray:
    """The selection's order: a seeded permutation, cut to `used` or topped up with its first samples
    (remainder pad), as the shard step orders windows."""
    perm = np.random.default_rng(seed).permutation(n)
    return perm[:used] if used <= n else np.concatenate([perm, perm[:used - n]])


def write_set(sets: list[ShardSet], sel: Selection, out: str, spec: OutputSpec, tool: str, version: str,
              log: Callable[[str], None] = print, extra: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Shuffle the selection (seeded), plan equal ranks, write every file, the manifest beside them,
    rename `out.tmp` to `out` and verify the result. Returns the new manifest."""
    from datetime import datetime, timezone

    if spec.layout not in LAYOUTS:
        raise ToolError(f"unknown layout {spec.layout!r}: use one of {', '.join(LAYOUTS)}")
    first = sets[0].manifest
    window, labels, eod = first["sample_length"], *_columns(first)
    try:
        plan = plan_shards(len(sel.index), spec.ranks, spec.files_per_rank, spec.remainder, spec.max_samples_per_file)
    except ShardError as e:
        raise ToolError(str(e)) from None
    order = _shuffled(len(sel.index), plan.used, spec.seed)
    out = os.path.abspath(out)
    staging = out + ".tmp"
    os.makedirs(staging)
    try:
        files = []
        for i in range(plan.files):
            rank, f = plan.file_of(i)
            name = file_name(spec.layout, rank, f, plan.files_per_rank, spec.ranks)
            mine = order[plan.file_bounds[i]:plan.file_bounds[i + 1]]
            written = write_mindrecord(_chunks(sets, sel, mine, window, labels), os.path.join(staging, name), window,
                                       spec.write_batch, labels, "count", rows_total=len(mine), eod=eod)
            files.append({"path": name, "rank": rank if spec.layout == "per_rank" else None, **written})
        groups = sel.group[order]
        composition = _composition(sets, sel, order, groups, plan, staging) if sel.names else None
        doc = _manifest(sets, files, plan, spec, tool, version, composition, datetime.now(timezone.utc))
        if extra:
            doc[tool] = extra
        tok = sets[0].manifest["tokenizer"]
        shutil.copyfile(os.path.join(sets[0].root, tok["path"]), os.path.join(staging, tok["path"]))
        beside = os.path.join(sets[0].root, "tokenizer_config.json")
        if tok.get("kind") == "hf" and os.path.isfile(beside):
            shutil.copyfile(beside, os.path.join(staging, "tokenizer_config.json"))
        eos = tok["eos_id"] if first.get("pack_mode", "concat") != "pad" and tok.get("add_eos", True) else None
        columns = ["input_ids"] + (["labels"] if labels else [])
        with open(os.path.join(staging, "mindformers_train_dataset.yaml"), "w", encoding="utf-8") as fh:
            fh.write(mindformers_snippet(out, spec.layout, window, columns, eos,
                                         eod_pad_length=eod[1] if eod else None))
        with open(os.path.join(staging, mf.MANIFEST_NAME), "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    os.replace(staging, out)
    problems, _ = verify_shard_dir(out)
    if problems:
        raise ToolError(mf.summary_line(out, problems))
    log(f"shards {tool}: {plan.used:,} samples -> {out}: {spec.ranks} ranks x {plan.per_rank:,} samples in "
        f"{plan.files} files ({plan.dropped} dropped, {plan.repeated} repeated for equal ranks); verified")
    return doc


def _composition(sets: list[ShardSet], sel: Selection, order: np.ndarray, groups: np.ndarray, plan: Any,
                 staging: str) -> dict[str, Any]:
    """The new set's samples and tokens per (source, language), and its sample_groups.parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    bounds = np.asarray(plan.file_bounds, np.int64)
    pos = np.arange(len(order), dtype=np.int64)
    file_of = np.searchsorted(bounds, pos, side="right") - 1
    pq.write_table(pa.table({"file": pa.array(file_of.astype(np.int32)), "row": pa.array(pos - bounds[file_of]),
                             "group": pa.array(groups.astype(np.int32))}), os.path.join(staging, SAMPLE_GROUPS))
    tokens = np.concatenate([_sample_tokens(s) for s in sets])
    offsets = np.concatenate([[0], np.cumsum([len(s.row) for s in sets])])
    flat = offsets[sel.set_of[order]] + sel.index[order]
    n = len(sel.names)
    ok = groups >= 0
    samples = np.bincount(groups[ok], minlength=n)
    by_tokens = np.bincount(groups[ok], weights=tokens[flat][ok], minlength=n)
    return {"groups": [{"group": c, "source": src, "language": lang, "tokens": int(round(by_tokens[c])),
                        "samples": int(samples[c])} for c, (src, lang) in enumerate(sel.names)],
            "samples_file": SAMPLE_GROUPS,
            "note": "a sample counts for the (source, language) holding most of its ids, with all its tokens "
                    f"(a token tool's count); {SAMPLE_GROUPS} gives each sample's group by file and row"}


def _manifest(sets: list[ShardSet], files: list[dict], plan: Any, spec: OutputSpec, tool: str, version: str,
              composition: Optional[dict], now: Any) -> dict[str, Any]:
    first = sets[0].manifest
    tok = dict(first["tokenizer"])
    labels, _ = _columns(first)
    basis = json.dumps([tool, [s.manifest.get("config_hash") for s in sets], spec.__dict__], sort_keys=True)
    modes = sorted({s.manifest.get("pack_mode", "concat") for s in sets})
    doc = mf.build(version=version, config_hash=hashlib.sha256(basis.encode()).hexdigest()[:16],
                   created_utc=now.strftime("%Y-%m-%dT%H:%M:%SZ"), seq_length=first["seq_length"],
                   tokenizer=tok, add_bos=bool(tok.get("add_bos")), add_eos=bool(tok.get("add_eos", True)),
                   labels=labels, pack_mode=modes[0] if len(modes) == 1 else "mixed", layout=spec.layout,
                   ranks=spec.ranks, files_per_rank=plan.files_per_rank, samples_per_rank=plan.per_rank,
                   total_samples=plan.used, dropped=plan.dropped, repeated=plan.repeated, remainder=spec.remainder,
                   shuffle_seed=spec.seed, files=files, tokenizer_file=tok["path"], composition=composition)
    doc["tokenizer"] = tok  # as the inputs have it (kind, special token strings, tiktoken settings)
    doc["columns"] = dict(first["columns"])
    if first.get("eod_metadata"):
        doc["eod_metadata"] = dict(first["eod_metadata"])
    doc["made_by"] = {"tool": tool, "inputs": [{"path": s.root, "config_hash": s.manifest.get("config_hash"),
                                                "total_samples": s.manifest["total_samples"]} for s in sets]}
    return doc


# ---- the three tools -----------------------------------------------------------------------------

def merge(inputs: list[str], out: str, spec: Optional[OutputSpec] = None, version: str = "0",
          log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every sample of every input (same tokenizer and seq_length) in one new set, shuffled and
    balanced across ranks (by default the first input's ranks and files per rank)."""
    _ensure_absent(out)
    if len(inputs) < 2:
        raise ToolError("merge needs at least two shard sets")
    sets = [open_set(p, log) for p in inputs]
    check_compatible(sets)
    spec = spec or OutputSpec(sets[0].manifest["ranks"], sets[0].manifest["files_per_rank"])
    _note_megatron(sets, log)
    return write_set(sets, select_all(sets), out, spec, "merge", version, log)


def reshard(inp: str, out: str, spec: OutputSpec, version: str = "0", log: Callable[[str], None] = print) -> dict[str, Any]:
    """The same samples over another number of ranks (or files), shuffled and balanced again."""
    _ensure_absent(out)
    sets = [open_set(inp, log)]
    _note_megatron(sets, log)
    return write_set(sets, select_all(sets), out, spec, "reshard", version, log)


def _note_megatron(sets: list[ShardSet], log: Callable[[str], None]) -> None:
    if any(s.manifest.get("megatron") for s in sets):
        log("shards: note: the inputs' Megatron .bin/.idx pairs are not carried over (the tools write MindRecord)")


def parse_mix(path: str) -> dict[tuple[str, Optional[str]], int]:
    """A mix file: `tokens:` mapping a source to a token budget (all its languages) or to
    {language: budget}; returns {(source, language or None): tokens}. ToolError on anything else."""
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh)
    except OSError as e:
        raise ToolError(f"{path}: cannot be read: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise ToolError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    budgets = doc.get("tokens") if isinstance(doc, dict) else None
    if not isinstance(budgets, dict) or not budgets:
        raise ToolError(f"{path}: expected `tokens:` mapping each source to a token budget or to {{language: budget}}")
    out: dict[tuple[str, Optional[str]], int] = {}
    for src, value in budgets.items():
        items = value.items() if isinstance(value, dict) else [(None, value)]
        for lang, n in items:
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise ToolError(f"{path}: tokens.{src}{'' if lang is None else '.' + str(lang)} is {n!r}, expected a "
                                "token count (a whole number, at least 0)")
            out[(str(src), None if lang is None else str(lang))] = n
    return out


def plan_reweight(sel: Selection, tokens: np.ndarray, budgets: dict[tuple[str, Optional[str]], int],
                  seed: int) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """Which selection entries (with repeats) meet each budget: a group's samples whole as many times
    as the budget holds them, then a seeded subset of them; returns the picks and per budget
    (source, language, asked, available, delivered tokens, samples)."""
    names = sel.names
    sources = {s for s, _ in names}
    for src, lang in budgets:
        if src not in sources:
            raise ToolError(f"the mix names source {src!r}, which the set does not hold (it holds "
                            f"{', '.join(sorted(sources)) or 'no source data'})")
        if lang is not None and (src, lang) not in names:
            have = sorted(g for s, g in names if s == src)
            raise ToolError(f"the mix names {src!r} language {lang!r}, which the set does not hold ({src}: "
                            f"{', '.join(have)})")
    rng = np.random.default_rng(seed)
    picks, rows = [], []
    for (src, lang), asked in sorted(budgets.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        codes = [c for c, (s, g) in enumerate(names) if s == src and (lang is None or g == lang)]
        mine = np.flatnonzero(np.isin(sel.group, codes))
        have = float(tokens[mine].sum())
        per = have / len(mine) if len(mine) else 0.0
        want = int(round(asked / per)) if per else 0
        full, rest = divmod(want, len(mine)) if len(mine) else (0, 0)
        chosen = np.concatenate([np.tile(mine, full), rng.permutation(mine)[:rest]]) if want else np.empty(0, np.int64)
        picks.append(chosen)
        rows.append({"source": src, "language": lang or "*", "asked": asked, "available": int(round(have)),
                     "delivered": int(round(float(tokens[chosen].sum()))), "samples": int(len(chosen)),
                     "copies": round(want / len(mine), 3) if len(mine) else 0.0})
    return (np.concatenate(picks) if picks else np.empty(0, np.int64)), rows


def reweight(inp: str, mix_path: str, out: str, spec: Optional[OutputSpec] = None, version: str = "0",
             log: Callable[[str], None] = print) -> dict[str, Any]:
    """A new set whose (source, language) groups meet the mix file's token budgets (samples left out
    or repeated whole; groups the mix does not name are left out). Prints asked vs delivered."""
    _ensure_absent(out)
    budgets = parse_mix(mix_path)
    sets = [open_set(inp, log)]
    sel = select_all(sets)
    if not sel.names or (sel.group < 0).all():
        raise ToolError(f"{inp}: the set records no per-source data (no composition / {SAMPLE_GROUPS}): it cannot be "
                        "reweighted by source")
    spec = spec or OutputSpec(sets[0].manifest["ranks"], sets[0].manifest["files_per_rank"])
    picks, rows = plan_reweight(sel, _sample_tokens(sets[0]), budgets, spec.seed)
    named = {(r["source"], r["language"]) for r in rows}
    left = sorted({f"{s}/{g}" for s, g in sel.names if (s, g) not in named and (s, "*") not in named})
    for r in rows:
        log(f"  {r['source']}/{r['language']}: asked {r['asked']:,} tokens, delivered {r['delivered']:,} "
            f"({r['samples']:,} samples, {r['copies']}x of the {r['available']:,} available)")
    if left:
        log(f"  left out (not in the mix): {', '.join(left)}")
    chosen = Selection(sel.set_of[picks], sel.index[picks], sel.group[picks], sel.names)
    _note_megatron(sets, log)
    return write_set(sets, chosen, out, spec, "reweight", version, log, extra={"mix": rows, "left_out": left})
