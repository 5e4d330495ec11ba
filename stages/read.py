"""Read raw corpus files into document partitions; malformed records go to quarantine.

Inputs: `.jsonl`, `.jsonl.gz`, `.jsonl.zst`, `.parquet`, `.txt` (one document per file), given as
files, folders (searched recursively) or glob patterns. Every record ends either as a document
(uid = file index << 32 | line) or as a quarantine record naming file, line and reason.

Work is planned as *units*: a slice of one large uncompressed JSONL file (read in parallel), or a
group of small files. Each unit streams its input and writes bounded Parquet parts.
"""
from __future__ import annotations

import glob
import gzip
import io
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from .base import DOC_SCHEMA, write_table_atomic

SUFFIXES = (".jsonl.gz", ".jsonl.zst", ".jsonl", ".parquet", ".txt")
MAX_LINES_PER_FILE = 1 << 32  # uid = file_index << 32 | line
SNIPPET_CHARS = 200


class InputError(ValueError):
    """The input paths cannot be used at all (nothing matched, unsupported file)."""


def file_kind(path: str) -> Optional[str]:
    lower = path.lower()
    for suffix in SUFFIXES:
        if lower.endswith(suffix):
            return suffix.lstrip(".")
    return None


def expand_inputs(patterns: list[str]) -> list[str]:
    """Files named by paths, folders and globs, sorted and de-duplicated (their order fixes uids)."""
    if not patterns:
        raise InputError("no input paths given (input.paths is empty)")
    found: list[str] = []
    for pattern in patterns:
        if any(ch in pattern for ch in "*?["):
            matches = sorted(glob.glob(pattern, recursive=True))
        elif os.path.isdir(pattern):
            matches = sorted(str(p) for p in Path(pattern).rglob("*") if p.is_file())
        elif os.path.exists(pattern):
            if file_kind(pattern) is None:
                raise InputError(f"input {pattern}: unsupported file type (expected one of {', '.join(SUFFIXES)})")
            matches = [pattern]
        else:
            raise InputError(f"input path {pattern} does not exist")
        matches = [m for m in matches if os.path.isfile(m) and file_kind(m) is not None]
        if not matches:
            raise InputError(f"input {pattern} matches no {'/'.join(SUFFIXES)} files")
        found.extend(matches)
    return sorted(dict.fromkeys(os.path.normpath(p) for p in found))


@dataclass
class Segment:
    """A byte range of one input file (the whole file unless a large plain JSONL is split)."""

    file_index: int
    path: str
    kind: str
    start: int = 0
    end: Optional[int] = None  # None = to end of file
    first_line: int = 1  # line number of the first line that starts in [start, end)


@dataclass
class ReadUnit:
    index: int
    segments: list[Segment] = field(default_factory=list)


def plan_units(files: list[str], block_size: int, part_size: int) -> tuple[list[ReadUnit], list[Segment]]:
    """Split large plain JSONL files into blocks and group small files; returns units and the
    blocks whose first line number still has to be counted (all blocks after the first of a file)."""
    units: list[ReadUnit] = []
    to_count: list[Segment] = []
    group: Optional[ReadUnit] = None
    group_bytes = 0
    for file_index, path in enumerate(files):
        kind = file_kind(path)
        size = os.path.getsize(path)
        if kind == "jsonl" and size > block_size:
            starts = list(range(0, size, block_size))
            for i, start in enumerate(starts):
                end = starts[i + 1] if i + 1 < len(starts) else None
                seg = Segment(file_index, path, kind, start, end)
                units.append(ReadUnit(len(units), [seg]))
                to_count.append(seg)
            continue
        if group is None or group_bytes + size > part_size:
            group = ReadUnit(len(units))
            units.append(group)
            group_bytes = 0
        group.segments.append(Segment(file_index, path, kind))
        group_bytes += size
    return units, to_count


def _iter_block_lines(f: io.BufferedReader, start: int, end: Optional[int]) -> Iterator[bytes]:
    """Lines that *start* in [start, end): the owner of a line is the block holding its first byte."""
    if start > 0:
        f.seek(start - 1)
        f.readline()  # finish the line that began before `start` (or consume the newline at start-1)
    else:
        f.seek(0)
    while True:
        if end is not None and f.tell() >= end:
            return
        line = f.readline()
        if not line:
            return
        yield line


def count_block_lines(path: str, start: int, end: Optional[int]) -> int:
    """How many lines start in [start, end) of a plain file (used to number lines of later blocks)."""
    with open(path, "rb") as f:
        return sum(1 for _ in _iter_block_lines(f, start, end))


@dataclass
class _Quarantine:
    path: str
    line: Optional[int]
    uid: int
    code: str  # short reason code for counting (invalid_json, invalid_utf8, ...)
    reason: str  # the full, human-readable reason
    raw: bytes = b""

    def record(self) -> dict:
        return {
            "file": self.path,
            "line": self.line,
            "uid": self.uid,
            "code": self.code,
            "reason": self.reason,
            "snippet": self.raw[: SNIPPET_CHARS * 4].decode("utf-8", "replace")[:SNIPPET_CHARS],
        }


class _PartWriter:
    """Accumulates documents and flushes bounded Parquet parts."""

    def __init__(self, out_dir: Path, unit_index: int, part_size: int):
        self.out_dir, self.unit_index, self.part_size = out_dir, unit_index, part_size
        self.cols: dict[str, list] = {name: [] for name in DOC_SCHEMA.names}
        self.bytes = 0
        self.parts: list[str] = []

    def add(self, uid: int, doc_id: str, text: str, source: str, meta: Optional[str]) -> None:
        c = self.cols
        c["uid"].append(uid)
        c["id"].append(doc_id)
        c["text"].append(text)
        c["source"].append(source)
        c["meta"].append(meta)
        self.bytes += len(text)
        if self.bytes >= self.part_size:
            self.flush()

    def flush(self) -> None:
        if not self.cols["uid"]:
            return
        name = f"part-{self.unit_index:05d}-{len(self.parts):03d}.parquet"
        write_table_atomic(pa.Table.from_pydict(self.cols, schema=DOC_SCHEMA), self.out_dir / name)
        self.parts.append(name)
        self.cols = {name: [] for name in DOC_SCHEMA.names}
        self.bytes = 0


@dataclass
class ReadOptions:
    text_field: str = "text"
    id_field: Optional[str] = "id"
    source_field: Optional[str] = "source"
    part_size: int = 32 << 20
    sample: float = 1.0  # keep a document when a seeded hash of its uid falls below this fraction
    sample_seed: int = 0

    def sampled(self, uid: int) -> bool:
        return self.sample >= 1.0 or in_sample(uid, self.sample, self.sample_seed)


def in_sample(uid: int, fraction: float, seed: int) -> bool:
    """Whether a document belongs to the seeded sample: decided by its uid alone, so the same
    documents are chosen on every run, in every stage, however the input is split into tasks."""
    return xxhash.xxh3_64_intdigest(uid.to_bytes(8, "little"), seed) < int(fraction * (1 << 64))


def _describe_type(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _open_lines(path: str, kind: str) -> io.BufferedReader:
    if kind == "jsonl.gz":
        return io.BufferedReader(gzip.open(path, "rb"))  # type: ignore[arg-type]
    if kind == "jsonl.zst":
        import zstandard

        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(open(path, "rb")))
    return open(path, "rb")


def _default_source(path: str) -> str:
    name = os.path.basename(path)
    for suffix in SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


def _read_jsonl(seg: Segment, opts: ReadOptions, writer: _PartWriter, quarantine: list, stats: dict) -> None:
    fallback_source = _default_source(seg.path)
    line_no = seg.first_line - 1
    base = seg.file_index << 32
    f = _open_lines(seg.path, seg.kind)
    try:
        lines = _iter_block_lines(f, seg.start, seg.end) if seg.kind == "jsonl" else iter(f.readline, b"")
        while True:
            try:
                raw = next(lines)
            except StopIteration:
                break
            except (OSError, EOFError, ValueError) as e:  # corrupt compressed stream
                line_no += 1
                quarantine.append(
                    _Quarantine(seg.path, line_no, base | line_no, "unreadable_file", f"unreadable {seg.kind} stream: {e}; rest of file lost")
                )
                stats["docs_in"] += 1
                break
            line_no += 1
            if line_no >= MAX_LINES_PER_FILE:
                raise InputError(f"{seg.path}: more than {MAX_LINES_PER_FILE - 1} lines; split the file")
            if not raw.strip():
                stats["blank_lines"] += 1
                continue
            uid = base | line_no
            if not opts.sampled(uid):
                stats["not_sampled"] += 1
                continue
            stats["docs_in"] += 1
            stats["bytes_in"] += len(raw)
            reason = code = None
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                code, reason = "invalid_utf8", f"invalid UTF-8 at byte {e.start}: {e.reason}"
            else:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    code, reason = "invalid_json", f"invalid JSON: {e.msg} (column {e.colno})"
                else:
                    if not isinstance(record, dict):
                        code, reason = "not_an_object", f"JSON value is {_describe_type(record)}, not an object"
                    elif opts.text_field not in record:
                        code, reason = "missing_text", f"missing text field '{opts.text_field}'"
                    elif not isinstance(record[opts.text_field], str):
                        code, reason = "text_not_string", f"text field '{opts.text_field}' is {_describe_type(record[opts.text_field])}, not a string"
            if reason is not None:
                quarantine.append(_Quarantine(seg.path, line_no, uid, code, reason, raw))
                continue
            text = record.pop(opts.text_field)
            doc_id = record.pop(opts.id_field, None) if opts.id_field else None
            source = record.pop(opts.source_field, None) if opts.source_field else None
            meta = json.dumps(record, ensure_ascii=False) if record else None
            writer.add(
                uid,
                str(doc_id) if doc_id is not None else f"{seg.path}:{line_no}",
                text,
                str(source) if source is not None else fallback_source,
                meta,
            )
    finally:
        f.close()


def _read_txt(seg: Segment, opts: ReadOptions, writer: _PartWriter, quarantine: list, stats: dict) -> None:
    uid = seg.file_index << 32
    if not opts.sampled(uid):
        stats["not_sampled"] += 1
        return
    raw = Path(seg.path).read_bytes()
    stats["docs_in"] += 1
    stats["bytes_in"] += len(raw)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        quarantine.append(_Quarantine(seg.path, None, uid, "invalid_utf8", f"invalid UTF-8 at byte {e.start}: {e.reason}", raw))
        return
    writer.add(uid, seg.path, text, _default_source(seg.path), None)


def _read_parquet(seg: Segment, opts: ReadOptions, writer: _PartWriter, quarantine: list, stats: dict) -> None:
    base = seg.file_index << 32
    fallback_source = _default_source(seg.path)
    try:
        pf = pq.ParquetFile(seg.path)
    except Exception as e:  # noqa: BLE001 - any unreadable file is quarantined, not fatal
        stats["docs_in"] += 1
        quarantine.append(_Quarantine(seg.path, None, base, "unreadable_file", f"unreadable Parquet file: {e}"))
        return
    names = pf.schema_arrow.names
    row = 0
    for batch in pf.iter_batches(batch_size=4096):
        n = batch.num_rows
        chosen = [opts.sampled(base | (row + i + 1)) for i in range(n)]
        stats["not_sampled"] += n - sum(chosen)
        stats["docs_in"] += sum(chosen)
        if opts.text_field not in names:
            for i in range(n):
                if chosen[i]:
                    quarantine.append(_Quarantine(seg.path, row + i + 1, base | (row + i + 1), "missing_text",
                                                  f"no column '{opts.text_field}'"))
            row += n
            continue
        data = batch.to_pydict()
        texts = data.pop(opts.text_field)
        ids = data.pop(opts.id_field, None) if opts.id_field else None
        sources = data.pop(opts.source_field, None) if opts.source_field else None
        for i in range(n):
            if not chosen[i]:
                continue
            line = row + i + 1  # 1-based row number, reported as the "line"
            text = texts[i]
            if not isinstance(text, str):
                reason = f"text column '{opts.text_field}' is {_describe_type(text)}, not a string"
                quarantine.append(_Quarantine(seg.path, line, base | line, "text_not_string", reason))
                continue
            stats["bytes_in"] += len(text)
            meta = {k: v[i] for k, v in data.items()}
            doc_id = ids[i] if ids is not None and ids[i] is not None else f"{seg.path}:{line}"
            source = sources[i] if sources is not None and sources[i] is not None else fallback_source
            writer.add(base | line, str(doc_id), text, str(source), json.dumps(meta, ensure_ascii=False, default=str) if meta else None)
        row += n


_READERS = {"jsonl": _read_jsonl, "jsonl.gz": _read_jsonl, "jsonl.zst": _read_jsonl, "txt": _read_txt, "parquet": _read_parquet}


def read_unit(unit: ReadUnit, opts: ReadOptions, out_dir: str) -> dict:
    """Read one unit into `out_dir/part-*.parquet`; returns stats and the quarantine records."""
    started = time.perf_counter()
    writer = _PartWriter(Path(out_dir), unit.index, opts.part_size)
    quarantine: list[_Quarantine] = []
    stats: dict[str, Any] = {"docs_in": 0, "blank_lines": 0, "bytes_in": 0, "files": 0, "not_sampled": 0}
    for seg in unit.segments:
        if seg.start == 0:
            stats["files"] += 1
        _READERS[seg.kind](seg, opts, writer, quarantine, stats)
    writer.flush()
    q = [x.record() for x in quarantine]
    stats["quarantined"] = len(q)
    stats["docs_out"] = stats["docs_in"] - len(q)
    stats["quarantine_reasons"] = {}
    for rec in q:
        key = rec["code"]
        stats["quarantine_reasons"][key] = stats["quarantine_reasons"].get(key, 0) + 1
    stats["task_seconds"] = time.perf_counter() - started
    return {"stats": stats, "quarantine": q, "parts": writer.parts}
