"""Read raw corpus files into document partitions; malformed records go to quarantine.

Inputs: `.jsonl`, `.jsonl.gz`, `.jsonl.zst`, `.parquet`, `.txt` (one document per file), `.warc` /
`.warc.gz` (one document per HTML response record) and `.html` / `.htm` (one document per file; web
pages are decoded and their main text extracted by `stages/html.py`), given as
files, folders (searched recursively, following links to folders) or glob patterns. Every real
file is read once, however many paths, links or patterns lead to it; an unreadable file or folder
is an error before any work (`InputError`), never a silent skip. File names that are not valid
UTF-8 are kept as `str` with surrogate escapes (so they open) and written out in an escaped form
(`display_path`).

Every record ends either as a document (uid = file index << 32 | line) or as a quarantine row
naming file, line, a reason code and an excerpt; no record stops a job (unless
`input.on_error: fail`, which raises `InputError` with the same message at the first one).

Damaged input that holds an unknown number of records - a truncated or corrupt `.gz` / `.zst`
stream, a Parquet file whose footer cannot be read - is *lost input*: every record before the
damage is read, and the rest is one quarantine row (`lost_input: true`, `after_line`,
`lost_bytes`) that counts no document; the ledger reports it apart (`lost_input`), outside
input = kept + filtered + duplicates + quarantined. A Parquet row group that cannot be decoded
has a known row count: it is one quarantine row (`rows`, `documents`) whose rows count as
quarantined documents.

Work is planned as *units*: a slice of one large uncompressed JSONL file (read in parallel), or a
group of small files. Each unit streams its input and writes bounded Parquet parts.

Each part's `language` column is decided as the part is written, for all its documents at once: by
script (zh / en / other, `stages.quality.script_language`), or with `ReadOptions.language` (set when
filter.language.enabled) by the fastText model on each document's normalised start, which also
fills `language_score` (`stages.langid.identify_normalised`).
"""
from __future__ import annotations

import codecs
import fnmatch
import functools
import io
import json
import os
import re
import stat
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import xxhash

from . import storage
from .base import DOC_SCHEMA, merge_stats, write_table_atomic
from .composition import group_counts
from .quality import script_language

WEB_SUFFIXES = (".warc.gz", ".warc", ".html", ".htm")  # pages: decoded and extracted by stages/html.py (Resiliparse)
MAX_LINES_PER_FILE = 1 << 32  # uid = file_index << 32 | line
SNIPPET_CHARS = 200
MAX_NESTING = 200  # deeper JSON records are quarantined: later stages parse `meta` again on deep stacks
STREAM_CHUNK = 64 << 10  # compressed bytes fed to a decompressor at a time
MAX_CHUNK_OUT = 8 << 20  # decompressed bytes taken from one gzip feed at a time
ZSTD_FEED = 1 << 10  # compressed bytes given to the zstd decoder at a time (at most ~32 MiB out of them)
_BOM = codecs.BOM_UTF8
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class InputError(ValueError):
    """The input cannot be used (nothing matched, unsupported or unreadable file), or a bad
    record was met with `input.on_error: fail`."""


def display_path(path: str) -> str:
    """A path as valid UTF-8 text: bytes that are not UTF-8 (kept as surrogate escapes in `str`)
    are shown as \\xNN, so the path can be written to Parquet, JSON and the terminal."""
    try:
        path.encode("utf-8")
        return path
    except UnicodeEncodeError:
        return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _safe_text(text: str) -> str:
    """`text` with lone surrogates shown as \\udXXX (valid UTF-8 for JSON and Parquet)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def file_kind(path: str) -> Optional[str]:
    lower = path.lower()
    for suffix in suffixes():
        if lower.endswith(suffix):
            return suffix.lstrip(".")
    return None


# ---- finding the input files --------------------------------------------------------------

def _unreadable(what: str, path: str, err: OSError) -> InputError:
    reason = err.strerror or str(err)
    return InputError(f"cannot read input {what} {display_path(path)}: {reason} (fix its permissions or leave it out "
                      f"of input.paths; nothing was read)")


def _list_dir(path: str) -> list[os.DirEntry]:
    try:
        with os.scandir(path) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError as e:
        raise _unreadable("folder", path, e) from None


def _dir_key(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _walk_files(top: str, visited: set) -> Iterator[str]:
    """Every entry under `top` that is not a folder, following links to folders; each real
    folder is listed once (a link loop ends), an unreadable folder raises InputError."""
    stack = [top]
    while stack:
        folder = stack.pop()
        try:
            key = _dir_key(folder)
        except OSError as e:
            raise _unreadable("folder", folder, e) from None
        if key in visited:
            continue
        visited.add(key)
        subdirs = []
        for entry in _list_dir(folder):
            try:
                is_dir = entry.is_dir()  # follows links
            except OSError:
                is_dir = False
            if is_dir:
                subdirs.append(entry.path)
            else:
                yield entry.path
        stack.extend(reversed(subdirs))


def _has_magic(s: str) -> bool:
    return any(ch in s for ch in "*?[")


def _glob(pattern: str) -> list[str]:
    """glob.glob(pattern, recursive=True) without its silences: an unreadable folder on the way
    raises InputError, and `**` lists each real folder once (links are followed, loops end).
    Like glob, wildcards do not match names that start with a dot."""
    drive_root = os.sep if pattern.startswith(os.sep) else ""
    comps = [c for c in pattern.split(os.sep) if c not in ("",)]
    first = next(i for i, c in enumerate(comps) if _has_magic(c))
    root = drive_root + os.sep.join(comps[:first]) if first else (drive_root or "")
    rest = comps[first:]
    found: list[str] = []
    visited: set = set()

    def join(base: str, name: str) -> str:
        return os.path.join(base, name) if base else name

    def is_dir(path: str) -> bool:
        return os.path.isdir(path or ".")

    def match(path: str, i: int) -> None:
        if i == len(rest):
            found.append(path)
            return
        comp = rest[i]
        if not is_dir(path):
            return
        if comp == "**":
            try:
                key = (i, *_dir_key(path or "."))
            except OSError as e:
                raise _unreadable("folder", path or ".", e) from None
            if key in visited:  # a real folder seen before at this point of the pattern (a link, a loop)
                return
            visited.add(key)
            match(path, i + 1)
            for entry in _list_dir(path or "."):
                if entry.name.startswith("."):
                    continue
                child = join(path, entry.name)
                try:
                    child_is_dir = entry.is_dir()
                except OSError:
                    child_is_dir = False
                if child_is_dir:
                    match(child, i)
                elif i + 1 == len(rest):
                    found.append(child)
            return
        if not _has_magic(comp):
            child = join(path, comp)
            if i + 1 == len(rest):
                if os.path.lexists(child):
                    found.append(child)
            else:
                match(child, i + 1)
            return
        for entry in _list_dir(path or "."):
            if entry.name.startswith(".") and not comp.startswith("."):
                continue
            if fnmatch.fnmatchcase(entry.name, comp):
                match(join(path, entry.name), i + 1)

    match(root, 0)
    return found


def _check_file(path: str) -> Optional[tuple[int, int]]:
    """The (device, inode) of an input file after opening it once; InputError when it cannot be
    read or is not a regular file."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise InputError(f"input file {display_path(path)} is a broken symbolic link") from None
        raise InputError(f"input path {display_path(path)} does not exist") from None
    except OSError as e:
        raise _unreadable("file", path, e) from None
    if stat.S_ISDIR(st.st_mode):
        return None  # a folder matched by a pattern: patterns pick files
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"input {display_path(path)} is not a regular file")
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise _unreadable("file", path, e) from None
    return (st.st_dev, st.st_ino) if st.st_ino else (st.st_dev, hash(os.path.realpath(path)))


def expand_inputs(patterns: list[str]) -> list[str]:
    """Files named by paths, folders and globs, sorted; each real file once (by device and inode;
    a path without links names it, else the first in sorted order). Their order fixes uids.
    InputError, before any work, for a path that does not exist, matches nothing, or cannot be read."""
    if not patterns:
        raise InputError("no input paths given (input.paths is empty)")
    keys: dict[str, tuple[int, int]] = {}
    urls: set[str] = set()
    for pattern in patterns:
        if storage.is_url(pattern):
            urls.update(_expand_url(pattern))
            continue
        if _has_magic(pattern):
            matches = _glob(pattern)
        elif os.path.isdir(pattern):
            matches = list(_walk_files(pattern, set()))
        elif os.path.lexists(pattern):
            if file_kind(pattern) is None:
                raise InputError(f"input {display_path(pattern)}: unsupported file type (expected one of {', '.join(suffixes())})")
            matches = [pattern]
        else:
            raise InputError(f"input path {display_path(pattern)} does not exist")
        n = 0
        for m in matches:
            if file_kind(m) is None:
                continue
            p = os.path.normpath(m)
            key = keys.get(p) or _check_file(p)
            if key is not None:
                keys[p] = key
                n += 1
        if not n:
            raise InputError(f"input {display_path(pattern)} matches no {'/'.join(suffixes())} files")
    paths_of: dict[tuple[int, int], list[str]] = {}
    for p, key in keys.items():
        paths_of.setdefault(key, []).append(p)
    # a file reached by links too is named by a path without links, else by the first in sorted order
    return sorted([ps[0] if len(ps) == 1 else min(ps, key=lambda p: (os.path.realpath(p) != os.path.abspath(p), p))
                   for ps in paths_of.values()] + list(urls))


def _expand_url(pattern: str) -> list[str]:
    """The objects an object-storage URL names (a glob, a prefix or one key), as `expand_inputs` does
    for local paths: InputError for a missing bucket, denied access, nothing matched or an
    unsupported object named directly."""
    try:
        found = storage.expand(pattern, lambda u: file_kind(u) is not None)
    except storage.StorageError as e:
        raise InputError(str(e)) from None
    for url in found:
        if file_kind(url) is None:
            raise InputError(f"input {url}: unsupported file type (expected one of {', '.join(suffixes())})")
    if not found:
        if _has_magic(pattern.split("://", 1)[1]):
            raise InputError(f"input {pattern} matches no {'/'.join(suffixes())} objects")
        raise InputError(f"input {pattern} does not exist (no such object or prefix)")
    return found


def input_stamp(path: str) -> tuple:
    """What the read step's link takes of an input: a local file's (name, size, mtime), an object's
    (URL, size, ETag): a rewritten object has a new ETag, so a resumed run reads it again."""
    if storage.is_url(path):
        info = storage.stat(path)
        return (path, info["size"], info["etag"])
    return (display_path(path), os.path.getsize(path), os.stat(path).st_mtime_ns)


# ---- planning -------------------------------------------------------------------------------

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
        size = storage.size(path)
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


@dataclass
class _Oversize:
    """A line longer than max_record_bytes, passed over in bounded pieces: its size (newline left out)
    and its first bytes, the quarantine excerpt; the line itself was never held."""

    size: int
    head: bytes


OVERSIZE_HEAD = SNIPPET_CHARS * 4  # bytes of an oversized record kept for its quarantine excerpt
SKIP_PIECE = 1 << 20  # bytes read at a time while passing over an oversized line


def _iter_block_lines(f: io.BufferedReader, start: int, end: Optional[int], limit: Optional[int] = None
                      ) -> Iterator[Any]:
    """Lines that *start* in [start, end): the owner of a line is the block holding its first byte.
    A line longer than `limit` bytes is an _Oversize (read past in SKIP_PIECE pieces, never whole)."""
    if start > 0:
        f.seek(start - 1)
        _skip_line(f)  # finish the line that began before `start` (or consume the newline at start-1)
    else:
        f.seek(0)
    while True:
        if end is not None and f.tell() >= end:
            return
        line = f.readline() if limit is None else f.readline(limit + 1)
        if not line:
            return
        if limit is not None and len(line) > limit and not line.endswith(b"\n"):
            size = len(line)
            while True:
                piece = f.readline(SKIP_PIECE)
                if not piece:
                    break
                size += len(piece)
                if piece.endswith(b"\n"):
                    size -= 1
                    break
            yield _Oversize(size, line[:OVERSIZE_HEAD])
            continue
        yield line


def _skip_line(f: io.BufferedReader) -> None:
    while True:
        piece = f.readline(SKIP_PIECE)
        if not piece or piece.endswith(b"\n"):
            return


def count_block_lines(path: str, start: int, end: Optional[int]) -> int:
    """How many lines start in [start, end) of a plain file (used to number lines of later blocks);
    a long line is counted without being held."""
    with storage.open_input(path) as f:
        return sum(1 for _ in _iter_block_lines(f, start, end, SKIP_PIECE))


class _Lines:
    """Splits decoded bytes into lines; a line longer than `limit` becomes an _Oversize as soon as it
    passes the bound (its rest dropped as it comes), so a stream never holds more than one bounded line."""

    def __init__(self, limit: Optional[int]):
        self.limit = limit
        self.pending: list[bytes] = []
        self.plen = 0
        self.over: Optional[_Oversize] = None

    def _checked(self, line: bytes) -> Any:
        body = len(line) - line.endswith(b"\n")
        if self.limit is not None and body > self.limit:
            return _Oversize(body, line[:OVERSIZE_HEAD])
        return line

    def feed(self, out: bytes) -> Iterator[Any]:
        if self.over is not None:
            nl = out.find(b"\n")
            if nl < 0:
                self.over.size += len(out)
                return
            self.over.size += nl
            yield self.over
            self.over = None
            out = out[nl + 1:]
        nl = out.find(b"\n")
        if nl < 0:
            self._keep(out)
            return
        first = b"".join(self.pending) + out[:nl + 1] if self.pending else out[:nl + 1]
        self.pending, self.plen = [], 0
        yield self._checked(first)
        cut = out.rfind(b"\n") + 1
        if cut > nl + 1:
            for line in io.BytesIO(out[nl + 1:cut]):
                yield self._checked(line)
        self._keep(out[cut:])

    def _keep(self, rest: bytes) -> None:
        if not rest:
            return
        if self.limit is not None and self.plen + len(rest) > self.limit:
            head = (b"".join(self.pending) + rest[:OVERSIZE_HEAD])[:OVERSIZE_HEAD]
            self.over = _Oversize(self.plen + len(rest), head)
            self.pending, self.plen = [], 0
            return
        self.pending.append(rest)
        self.plen += len(rest)

    def finish(self) -> Iterator[Any]:
        """The last line, when the stream does not end with a newline."""
        if self.over is not None:
            yield self.over
        elif self.pending:
            yield self._checked(b"".join(self.pending))
        self.over, self.pending, self.plen = None, [], 0

    def partial(self) -> tuple[bytes, int]:
        """(first bytes, size) of the incomplete line held when the stream breaks off."""
        if self.over is not None:
            return self.over.head, self.over.size
        joined = b"".join(self.pending)
        return joined, len(joined)


# ---- quarantine -------------------------------------------------------------------------------

@dataclass
class _Quarantine:
    path: str
    line: Optional[int]
    uid: int
    code: str  # short reason code for counting (invalid_json, invalid_utf8, ...)
    reason: str  # the full, human-readable reason
    raw: bytes = b""
    documents: int = 1  # documents this row stands for: 0 for lost input, a row group's sampled rows
    extra: dict = field(default_factory=dict)  # lost input: after_line, lost_bytes...; row groups: rows

    def message(self) -> str:
        where = f" line {self.line}" if self.line is not None else ""
        return f"{display_path(self.path)}{where}: {_safe_text(self.reason)} [{self.code}]"

    def record(self) -> dict:
        rec = {
            "file": display_path(self.path),
            "line": self.line,
            "uid": self.uid,
            "code": self.code,
            "reason": _safe_text(self.reason),
            "snippet": self.raw[: SNIPPET_CHARS * 4].decode("utf-8", "replace")[:SNIPPET_CHARS],
        }
        if self.documents != 1 or self.extra:
            rec["documents"] = self.documents
        if self.documents == 0 and "rows" not in self.extra:
            rec["lost_input"] = True
        rec.update(self.extra)
        return rec


class _Sink:
    """Where a reader's quarantine rows go: collected, or raised at once with `on_error: fail`."""

    def __init__(self, fail: bool):
        self.fail = fail
        self.rows: list[_Quarantine] = []

    def add(self, q: _Quarantine) -> None:
        if self.fail:
            raise InputError(q.message() + " (input.on_error is fail; set it to quarantine to go on past such input)")
        self.rows.append(q)


class _PartWriter:
    """Accumulates documents and flushes bounded Parquet parts."""

    def __init__(self, out_dir: Path, unit_index: int, part_size: int, cjk_share: float = 0.3,
                 language: Optional[dict] = None):
        self.out_dir, self.unit_index, self.part_size = out_dir, unit_index, part_size
        self.cjk_share = cjk_share
        self.language = language  # ReadOptions.language: the model's settings, or None (scripts)
        self.groups: dict = {}  # {source: {language: {docs, chars}}} of the documents written
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
        c["language"].append(None)  # decided per part, vectorised, in `flush`
        c["language_score"].append(None)
        self.bytes += len(text)
        if self.bytes >= self.part_size:
            self.flush()

    def flush(self) -> None:
        if not self.cols["uid"]:
            return
        name = f"part-{self.unit_index:05d}-{len(self.parts):03d}.parquet"
        texts = pa.array(self.cols["text"], pa.string())
        if self.language is not None:  # the model's ISO 639-1 code and probability (the filter reuses them)
            from .langid import identify_normalised

            codes, probs = identify_normalised(self.cols["text"], self.language["max_chars"], self.language["normalize"])
            self.cols["language"], self.cols["language_score"] = codes.tolist(), probs.tolist()
        else:
            self.cols["language"] = script_language(texts, self.cjk_share).tolist()
        self.cols["text"] = texts
        merge_stats(self.groups, group_counts(self.cols["source"], self.cols["language"],
                                              chars=pc.utf8_length(texts).to_numpy()))
        table = pa.Table.from_pydict(self.cols, schema=DOC_SCHEMA)
        write_table_atomic(table, self.out_dir / name)
        self.parts.append(name)
        self.cols = {name: [] for name in DOC_SCHEMA.names}
        self.bytes = 0
        self.written(table, name)

    def written(self, table: pa.Table, name: str) -> None:
        """Called with each part just written, while its table is in memory (a subclass's hook)."""


@dataclass
class ReadOptions:
    text_field: str = "text"
    id_field: Optional[str] = "id"
    source_field: Optional[str] = "source"
    part_size: int = 32 << 20
    sample: float = 1.0  # keep a document when a seeded hash of its uid falls below this fraction
    sample_seed: int = 0
    on_error: str = "quarantine"  # or "fail": InputError at the first bad record or damaged file
    cjk_share: float = 0.3  # the `language` column: zh at this CJK share of letters (filter.scripts.cjk_share)
    # filter.language.enabled: {max_chars, normalize (the normalize config)}: the `language` column is then the
    # fastText model's code, identified on the normalised start of each text, with `language_score`
    language: Optional[dict] = None
    # input.max_record_mb: a larger record (a JSONL line, a Parquet text value, a .txt / .html file, a WARC
    # record's block) is quarantined as record_too_large without being held whole; None: no bound
    max_record_bytes: Optional[int] = 16 << 20

    def sampled(self, uid: int) -> bool:
        return self.sample >= 1.0 or in_sample(uid, self.sample, self.sample_seed)


def in_sample(uid: int, fraction: float, seed: int) -> bool:
    """Whether a document belongs to the seeded sample: decided by its uid alone, so the same
    documents are chosen on every run, in every stage, however the input is split into tasks."""
    return xxhash.xxh3_64_intdigest(uid.to_bytes(8, "little"), seed) < int(fraction * (1 << 64))


def _describe_type(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _default_source(path: str) -> str:
    name = display_path(os.path.basename(path))
    for suffix in suffixes():
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


# ---- compressed streams -------------------------------------------------------------------

@dataclass
class _Damage:
    """Why a compressed stream stopped before its end, and where."""

    code: str  # truncated_stream | corrupt_stream | unreadable_file
    detail: str
    offset: int  # compressed bytes read without error
    partial: bytes = b""  # decoded bytes after the last complete line (the first of them, for a long one)
    partial_size: Optional[int] = None  # how many there were (None: len(partial))

    def partial_bytes(self) -> int:
        return len(self.partial) if self.partial_size is None else self.partial_size


class _Decoder:
    """One compressed format: feed() yields decoded bytes and raises on corrupt data; complete()
    tells whether the input so far ends at a gzip member / zstd frame boundary."""

    def __init__(self, kind: str):
        self.kind = kind
        self.members = 0  # gzip members / zstd frames decoded to their end
        self.new()

    def new(self) -> None:
        if self.kind == "jsonl.gz":
            self.d = zlib.decompressobj(wbits=31)
        else:
            import zstandard

            self.d = zstandard.ZstdDecompressor().decompressobj()
        self.started = False

    def feed(self, data: bytes) -> Iterator[bytes]:
        while data:
            if self.kind == "jsonl.gz" and not self.started and self.members:
                data = data.lstrip(b"\x00")  # gzip files may be padded with zeros after a member
                if not data:
                    return
            self.started = True
            if self.kind == "jsonl.gz":
                while True:  # bounded output per call: a small file can hold a lot of text
                    out = self.d.decompress(data, MAX_CHUNK_OUT)
                    yield out
                    data = self.d.unconsumed_tail
                    if self.d.eof or (not data and len(out) < MAX_CHUNK_OUT):
                        break
                if not self.d.eof:
                    return
                data = self.d.unused_data  # the next gzip member
            else:
                # zstd's decompressobj has no output bound: feed it small pieces, so one call yields at
                # most ZSTD_FEED x the format's largest ratio, never a whole bomb at once
                rest = data
                while rest and not self.d.eof:
                    piece, rest = rest[:ZSTD_FEED], rest[ZSTD_FEED:]
                    yield self.d.decompress(piece)
                if not self.d.eof:
                    return
                data = self.d.unused_data + rest  # the next zstd frame
            self.members += 1
            self.new()

    def complete(self) -> bool:
        return not self.started


def _stream_lines(path: str, kind: str, damage: list, limit: Optional[int] = None) -> Iterator[Any]:
    """The lines (with their newline) of a .gz / .zst file, decoded in bounded chunks; a line longer
    than `limit` is an _Oversize; every complete line before a damage is yielded, then the damage is
    appended to `damage`."""
    dec = _Decoder(kind)
    offset = 0
    lines = _Lines(limit)
    head: Optional[bytes] = None
    try:
        f = storage.open_input(path)
    except OSError as e:
        damage.append(_Damage("unreadable_file", f"cannot open: {e.strerror or e}", 0))
        return
    with f:
        while True:
            try:
                chunk = f.read(STREAM_CHUNK)
            except OSError as e:
                damage.append(_Damage("unreadable_file", f"read error: {e.strerror or e}", offset, *lines.partial()))
                return
            if not chunk:
                break
            if head is None:
                head = chunk[:4]
            produced = 0
            try:
                for out in dec.feed(chunk):
                    produced += len(out)
                    yield from lines.feed(out)
            except Exception as e:  # noqa: BLE001 - zlib.error, ZstdError: the stream is corrupt from here
                more, at = _salvage(path, kind, offset, chunk, produced)
                yield from lines.feed(more)
                damage.append(_Damage("corrupt_stream", _corrupt_detail(kind, head, e), at, *lines.partial()))
                return
            offset += len(chunk)
    if not dec.complete():
        damage.append(_Damage("truncated_stream", "the stream ends before its end marker (truncated file)", offset,
                              *lines.partial()))
        return
    yield from lines.finish()


def _salvage(path: str, kind: str, offset: int, chunk: bytes, already: int) -> tuple[bytes, int]:
    """After a decoding error in `chunk` (read at `offset`): decode the file again up to there and
    feed `chunk` in small pieces, to keep what precedes the damage. Returns the decoded bytes past
    the `already` ones taken from `chunk`, and the file offset of the damage."""
    got: list[bytes] = []
    pos = 0
    try:
        dec = _Decoder(kind)
        with storage.open_input(path) as f:
            left = offset
            while left > 0:
                data = f.read(min(STREAM_CHUNK, left))
                if not data:
                    return b"", offset
                left -= len(data)
                for _ in dec.feed(data):
                    pass
        for pos in range(0, len(chunk), 256):
            got.extend(dec.feed(chunk[pos:pos + 256]))
        pos = len(chunk)
    except Exception:  # noqa: BLE001 - the damage, now found to within 256 bytes
        pass
    return b"".join(got)[already:], offset + pos


def _corrupt_detail(kind: str, head: bytes, err: Exception) -> str:
    name = "gzip" if kind == "jsonl.gz" else "zstd"
    hint = ""
    is_gzip, is_zstd = head[:2] == b"\x1f\x8b", head[:4] == b"\x28\xb5\x2f\xfd" or head[1:4] == b"\x2a\x4d\x18"
    if kind == "jsonl.zst" and is_gzip:
        hint = " (the file is gzip-compressed: name it .jsonl.gz)"
    elif kind == "jsonl.gz" and is_zstd:
        hint = " (the file is zstd-compressed: name it .jsonl.zst)"
    elif not (is_gzip if kind == "jsonl.gz" else is_zstd):
        hint = f" (not a {name} file)"
    return f"corrupt {name} data: {err}{hint}"


def _lost_input(seg: Segment, line_no: int, dmg: _Damage) -> _Quarantine:
    """The one row for the unreadable rest of a damaged file: no document, bytes lost after a line."""
    size = _file_size(seg.path)
    lost_file = max(0, size - dmg.offset) if dmg.code != "truncated_stream" else 0
    if dmg.code == "truncated_stream":
        reason = (f"{dmg.detail}: records after line {line_no} are lost; {dmg.partial_bytes():,} decoded bytes of an "
                  f"incomplete record were dropped and the rest of the stream is missing from the file")
    else:
        reason = (f"{dmg.detail}: records after line {line_no} are lost; {lost_file:,} of {size:,} file bytes from "
                  f"byte {dmg.offset:,} on could not be read")
    return _Quarantine(seg.path, line_no + 1, (seg.file_index << 32) | (line_no + 1), dmg.code, reason, dmg.partial,
                       documents=0, extra={"after_line": line_no, "lost_bytes": lost_file,
                                           "partial_bytes": dmg.partial_bytes()})


def _file_size(path: str) -> int:
    try:
        return storage.size(path)
    except OSError:
        return 0


# ---- records --------------------------------------------------------------------------------

def _nesting(value: Any) -> int:
    """Depth of nested lists/dicts, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = list(v.values())
        if isinstance(v, list):
            deepest = max(deepest, d)
            stack.extend((x, d + 1) for x in v if isinstance(x, (list, dict)))
    return deepest


def _has_surrogate(s: str) -> bool:
    try:
        s.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


def _surrogate_field(record: dict) -> Optional[str]:
    """The first field (name shown escaped) whose name or value holds a lone surrogate."""
    for key, value in record.items():
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        if _has_surrogate(key) or _has_surrogate(text):
            return _safe_text(key)
    return None


def _check_record(raw: bytes, opts: ReadOptions) -> tuple[Optional[dict], Optional[str], Optional[str]]:
    """(record, None, None) for a usable JSON line, else (None, code, reason)."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, "invalid_utf8", f"invalid UTF-8 at byte {e.start}: {e.reason}"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        return None, "invalid_json", f"invalid JSON: {e.msg} (column {e.colno})"
    except RecursionError:
        return None, "too_deep", "JSON nested too deep to read"
    except ValueError as e:  # an integer beyond Python's digit limit
        return None, "invalid_number", f"number cannot be read: {str(e).split(';')[0]}"
    if not isinstance(record, dict):
        return None, "not_an_object", f"JSON value is {_describe_type(record)}, not an object"
    if opts.text_field not in record:
        return None, "missing_text", f"missing text field '{opts.text_field}'"
    if not isinstance(record[opts.text_field], str):
        return (None, "text_not_string",
                f"text field '{opts.text_field}' is {_describe_type(record[opts.text_field])}, not a string")
    for value in record.values():
        if type(value) in (list, dict):
            if _nesting(record) > MAX_NESTING:
                return None, "too_deep", f"JSON nested more than {MAX_NESTING} levels deep"
            break
    if _SURROGATE_ESCAPE.search(raw):  # a lone surrogate can only come from a \uD800-\uDFFF escape
        bad = _surrogate_field(record)
        if bad is not None:
            return None, "invalid_unicode", f"field '{bad}' holds a lone surrogate (\\ud800-\\udfff), which is not text"
    return record, None, None


def _read_jsonl(seg: Segment, opts: ReadOptions, writer: _PartWriter, sink: _Sink, stats: dict) -> None:
    fallback_source = _default_source(seg.path)
    fallback_id = display_path(seg.path)
    line_no = seg.first_line - 1
    base = seg.file_index << 32
    damage: list[_Damage] = []
    if seg.kind == "jsonl":
        try:
            f = storage.open_input(seg.path)
        except OSError as e:
            sink.add(_lost_input(seg, line_no, _Damage("unreadable_file", f"cannot open: {e.strerror or e}", 0)))
            return
        lines = _iter_block_lines(f, seg.start, seg.end, opts.max_record_bytes)
    else:
        f = None
        lines = _stream_lines(seg.path, seg.kind, damage, opts.max_record_bytes)
    try:
        while True:
            try:
                raw = next(lines)
            except StopIteration:
                break
            except OSError as e:  # a read error in a plain file
                damage.append(_Damage("unreadable_file", f"read error: {e.strerror or e}", f.tell() if f else 0))
                break
            line_no += 1
            if line_no >= MAX_LINES_PER_FILE:
                raise InputError(f"{display_path(seg.path)}: more than {MAX_LINES_PER_FILE - 1} lines; split the file")
            if isinstance(raw, _Oversize):
                uid = base | line_no
                if not opts.sampled(uid):
                    stats["not_sampled"] += 1
                    continue
                stats["docs_in"] += 1
                stats["bytes_in"] += raw.size
                sink.add(_too_large(seg.path, line_no, uid, raw.size, opts, raw.head, "line"))
                continue
            if raw.startswith(_BOM):
                raw = raw[len(_BOM):]
            if not raw.strip():
                stats["blank_lines"] += 1
                continue
            uid = base | line_no
            if not opts.sampled(uid):
                stats["not_sampled"] += 1
                continue
            stats["docs_in"] += 1
            stats["bytes_in"] += len(raw)
            record, code, reason = _check_record(raw, opts)
            meta = None
            if record is not None:
                text = record.pop(opts.text_field)
                doc_id = record.pop(opts.id_field, None) if opts.id_field else None
                source = record.pop(opts.source_field, None) if opts.source_field else None
                try:
                    meta = json.dumps(record, ensure_ascii=False) if record else None
                    doc_id = str(doc_id) if doc_id is not None else f"{fallback_id}:{line_no}"
                    source = str(source) if source is not None else fallback_source
                except (ValueError, RecursionError) as e:
                    code, reason = "unencodable_record", f"record cannot be stored: {e}"
            if code is not None:
                sink.add(_Quarantine(seg.path, line_no, uid, code, reason, raw))
                continue
            writer.add(uid, doc_id, text, source, meta)
    finally:
        if f is not None:
            f.close()
    if damage:
        sink.add(_lost_input(seg, line_no, damage[0]))


def _too_large(path: str, line: Optional[int], uid: int, size: int, opts: "ReadOptions", head: bytes,
               what: str) -> _Quarantine:
    """The quarantine row of a record larger than input.max_record_mb (it was not read whole)."""
    limit = opts.max_record_bytes or 0
    return _Quarantine(path, line, uid, "record_too_large",
                       f"{what} of {size:,} bytes is larger than input.max_record_mb ({limit / 2**20:g} MiB = {limit:,} "
                       f"bytes); it was not read (raise input.max_record_mb to read it)", head[:OVERSIZE_HEAD],
                       extra={"bytes": size})


def _whole_file(seg: Segment, opts: ReadOptions, sink: "_Sink", stats: dict, uid: int) -> Optional[bytes]:
    """The bytes of a one-document file (.txt, .html), counted in; None when the sample leaves it
    out, it cannot be read (then it is lost input, with the reason) or it is larger than
    max_record_bytes (then it is quarantined, its size checked before reading)."""
    if not opts.sampled(uid):
        stats["not_sampled"] += 1
        return None
    try:
        with storage.open_input(seg.path) as f:
            size = storage.size(seg.path) if storage.is_url(seg.path) else os.fstat(f.fileno()).st_size
            if opts.max_record_bytes is not None and size > opts.max_record_bytes:
                stats["docs_in"] += 1
                stats["bytes_in"] += size
                sink.add(_too_large(seg.path, None, uid, size, opts, f.read(OVERSIZE_HEAD), "file"))
                return None
            raw = f.read()
    except OSError as e:
        sink.add(_lost_input(seg, 0, _Damage("unreadable_file", f"cannot read: {e.strerror or e}", 0)))
        return None
    stats["docs_in"] += 1
    stats["bytes_in"] += len(raw)
    return raw


def _read_txt(seg: Segment, opts: ReadOptions, writer: _PartWriter, sink: _Sink, stats: dict) -> None:
    uid = seg.file_index << 32
    raw = _whole_file(seg, opts, sink, stats, uid)
    if raw is None:
        return
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        sink.add(_Quarantine(seg.path, None, uid, "invalid_utf8", f"invalid UTF-8 at byte {e.start}: {e.reason}", raw))
        return
    if text.startswith("\ufeff"):
        text = text[1:]
    writer.add(uid, display_path(seg.path), text, _default_source(seg.path), None)


def _page_document(body: bytes, declared: Optional[str]) -> tuple[Optional[str], dict, Optional[str]]:
    """(main text, meta fields, None) of a web page, or (None, {}, reason) when it cannot be decoded."""
    from .html import UndecodablePage, decode_page, extract_main_text

    try:
        html, codec, where = decode_page(body, declared)
    except UndecodablePage as e:
        return None, {}, str(e)
    try:
        text = extract_main_text(html)
    except Exception as e:  # noqa: BLE001 - a page the parser cannot take is one bad record, not a failed job
        return None, {}, f"main text cannot be extracted ({codec} page): {type(e).__name__}: {e}"
    return text, {"encoding": codec, "encoding_from": where}, None


def _read_html(seg: Segment, opts: ReadOptions, writer: _PartWriter, sink: _Sink, stats: dict) -> None:
    """One HTML file, one document: its main text; meta holds the detected encoding."""
    uid = seg.file_index << 32
    raw = _whole_file(seg, opts, sink, stats, uid)
    if raw is None:
        return
    text, meta, problem = _page_document(raw, None)
    if problem is not None:
        sink.add(_Quarantine(seg.path, None, uid, "undecodable_html", problem, raw))
        return
    writer.add(uid, display_path(seg.path), text, _default_source(seg.path), json.dumps(meta))


def _read_warc(seg: Segment, opts: ReadOptions, writer: _PartWriter, sink: _Sink, stats: dict) -> None:
    """A WARC file: each HTML response record a document (its "line" is its number among them, its
    byte offset in `record_offset`); the id is the URL; meta holds url, crawl_date, encoding and
    warc_record_id. Other records are counted in stats warc_records_skipped. A record that cannot be
    decoded, whose HTTP headers never end, or larger than max_record_bytes is quarantined with its
    offset; a damaged span (corrupt gzip member, bytes that are no record, a cut-off end) is one
    lost-input row with its byte range, and reading goes on at the next record that reads."""
    from .html import WarcDamage, _content_decode

    base, n = seg.file_index << 32, 0
    skipped: dict[str, int] = stats.setdefault("warc_records_skipped", {})
    try:
        items = _warc_items(seg.path, skipped, opts.max_record_bytes)
        for item in items:
            n += 1
            if isinstance(item, WarcDamage):
                sink.add(_warc_lost(seg, n, item))
                continue
            page = item
            uid = base | n
            if not opts.sampled(uid):
                stats["not_sampled"] += 1
                continue
            stats["docs_in"] += 1
            stats["bytes_in"] += page.size if page.problem else len(page.body)
            if page.problem is not None:
                code, reason = page.problem
                sink.add(_Quarantine(seg.path, n, uid, code, reason, page.body,
                                     extra={"record_offset": page.offset, "bytes": page.size}))
                continue
            try:
                body = _content_decode(page.body, page.content_encoding)
                text, meta, problem = _page_document(body, page.charset)
            except ValueError as e:
                text, meta, problem = None, {}, str(e)
            if problem is not None:
                sink.add(_Quarantine(seg.path, n, uid, "undecodable_html", f"record at byte offset {page.offset} "
                                     f"({page.url}): {problem}", page.body, extra={"record_offset": page.offset}))
                continue
            meta = {"url": page.url, "crawl_date": page.date, **meta, "warc_record_id": page.record_id,
                    "record_offset": page.offset}
            writer.add(uid, page.url or f"{display_path(seg.path)}:{n}", text, _default_source(seg.path),
                       json.dumps(meta, ensure_ascii=False))
    except OSError as e:
        sink.add(_lost_input(seg, n, _Damage("unreadable_file", f"cannot read: {e.strerror or e}", 0)))


def _warc_items(path: str, skipped: dict[str, int], max_record_bytes: Optional[int]) -> Iterator[Any]:
    """`html.iter_warc_records` of a local file; an object's records through the same parser, over
    the streamed object (the parser only reads its file forwards)."""
    from . import html

    if not storage.is_url(path):
        yield from html.iter_warc_records(path, skipped, max_record_bytes)
        return
    with storage.open_input(path) as f:
        yield from html._warc_records(html._WarcBytes(f, path.lower().endswith(".gz")), storage.size(path), skipped,
                                      max_record_bytes)


def _warc_lost(seg: Segment, n: int, d: Any) -> _Quarantine:
    """The lost-input row of a damaged WARC span: its byte range, and whether reading went on after it."""
    size = _file_size(seg.path)
    after = (f"reading resumed at the record at byte {d.end:,}" if d.end < size else "the file ends there")
    partial = f"; {d.partial_bytes:,} bytes of the record cut off were read and dropped" if d.partial_bytes else ""
    reason = (f"WARC file damaged: {d.detail}: bytes {d.offset:,}-{d.end:,} ({d.end - d.offset:,} of {size:,}) hold no "
              f"readable record, {after}{partial}")
    return _Quarantine(seg.path, n, (seg.file_index << 32) | n, d.code, reason, d.partial, documents=0,
                       extra={"after_line": n - 1, "lost_bytes": d.end - d.offset, "partial_bytes": d.partial_bytes,
                              "record_offset": d.offset, "end_offset": d.end})


def _column_values(column: pa.ChunkedArray) -> tuple[list, dict[int, str]]:
    """A column as Python values, and {row: problem} for values that cannot be decoded."""
    try:
        return column.to_pylist(), {}
    except Exception:  # noqa: BLE001 - e.g. invalid UTF-8 in a string column: find the rows
        values, bad = [], {}
        for i in range(len(column)):
            try:
                values.append(column[i].as_py())
            except Exception as e:  # noqa: BLE001
                values.append(None)
                bad[i] = f"{type(e).__name__}: {e}"
        return values, bad


def _read_parquet(seg: Segment, opts: ReadOptions, writer: _PartWriter, sink: _Sink, stats: dict) -> None:
    base = seg.file_index << 32
    fallback_source = _default_source(seg.path)
    fallback_id = display_path(seg.path)
    try:
        fh = storage.open_input(seg.path)  # a Python file object: names that are not UTF-8 open too
    except OSError as e:
        sink.add(_lost_input(seg, 0, _Damage("unreadable_file", f"cannot open: {e.strerror or e}", 0)))
        return
    with fh:
        try:  # Arrow's own file reader when the name is UTF-8 (faster); the Python file object otherwise
            local_name = display_path(seg.path) == seg.path and not storage.is_url(seg.path)
            pf = pq.ParquetFile(seg.path if local_name else fh)
            names = pf.schema_arrow.names
            groups = [pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)]
        except Exception as e:  # noqa: BLE001 - any unreadable file is lost input, not fatal
            sink.add(_lost_input(seg, 0, _Damage("unreadable_file", f"unreadable Parquet file: {e}", 0)))
            return
        row = 0
        for g, n in enumerate(groups):
            chosen = [opts.sampled(base | (row + i + 1)) for i in range(n)]
            k = sum(chosen)
            stats["not_sampled"] += n - k
            stats["docs_in"] += k
            try:
                table = pf.read_row_group(g)
                table, oversize = _drop_oversize(table, opts)
                columns = {name: _column_values(table.column(name)) for name in names}
            except Exception as e:  # noqa: BLE001 - a corrupt page: the row group's rows are quarantined
                first = row + 1
                sink.add(_Quarantine(seg.path, first, base | first, "unreadable_row_group",
                                     f"row group {g} (rows {first}-{row + n}) cannot be decoded: {e}",
                                     documents=k, extra={"rows": n, "row_group": g}))
                row += n
                continue
            _parquet_rows(seg, opts, writer, sink, stats, columns, chosen, row, base, fallback_id, fallback_source,
                          oversize)
            row += n


def _drop_oversize(table: pa.Table, opts: ReadOptions) -> tuple[pa.Table, dict[int, tuple[int, bytes]]]:
    """The row group with text values longer than max_record_bytes made null before anything turns them
    into Python strings, and {row: (their size in bytes, first bytes)}."""
    if opts.max_record_bytes is None or opts.text_field not in table.column_names:
        return table, {}
    col = table.column(opts.text_field)
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type) or pa.types.is_binary(col.type)
            or pa.types.is_large_binary(col.type)):
        return table, {}
    lengths = pc.binary_length(col)
    big = pc.greater(lengths, opts.max_record_bytes)
    if not pc.any(big).as_py():
        return table, {}
    rows = pc.indices_nonzero(pc.fill_null(big, False)).to_pylist()
    sizes = pc.take(lengths, rows).to_pylist()
    heads = pc.binary_slice(pc.take(col, rows).cast(pa.large_binary()), 0, OVERSIZE_HEAD).to_pylist()
    cleared = pc.if_else(big, pa.scalar(None, col.type), col)
    table = table.set_column(table.column_names.index(opts.text_field), opts.text_field, cleared)
    return table, {r: (n, h) for r, n, h in zip(rows, sizes, heads)}


def _parquet_rows(seg: Segment, opts: ReadOptions, writer: _PartWriter, sink: _Sink, stats: dict,
                  columns: dict[str, tuple[list, dict]], chosen: list[bool], row: int, base: int,
                  fallback_id: str, fallback_source: str, oversize: dict[int, tuple[int, bytes]]) -> None:
    if opts.text_field not in columns:
        for i, c in enumerate(chosen):
            if c:
                sink.add(_Quarantine(seg.path, row + i + 1, base | (row + i + 1), "missing_text",
                                     f"no column '{opts.text_field}'"))
        return
    bad = {i: (name, problem) for name, (_, errs) in columns.items() for i, problem in errs.items()}
    data = {name: values for name, (values, _) in columns.items()}
    texts = data.pop(opts.text_field)
    ids = data.pop(opts.id_field, None) if opts.id_field else None
    sources = data.pop(opts.source_field, None) if opts.source_field else None
    for i, c in enumerate(chosen):
        if not c:
            continue
        line = row + i + 1  # 1-based row number, reported as the "line"
        if i in oversize:
            size, head = oversize[i]
            stats["bytes_in"] += size
            sink.add(_too_large(seg.path, line, base | line, size, opts, head, f"text value ('{opts.text_field}')"))
            continue
        if i in bad:
            name, problem = bad[i]
            code = "invalid_utf8" if problem.startswith("UnicodeDecodeError") else "undecodable_value"
            sink.add(_Quarantine(seg.path, line, base | line, code, f"column '{name}' cannot be read: {problem}"))
            continue
        text = texts[i]
        if not isinstance(text, str):
            reason = f"text column '{opts.text_field}' is {_describe_type(text)}, not a string"
            sink.add(_Quarantine(seg.path, line, base | line, "text_not_string", reason))
            continue
        stats["bytes_in"] += len(text)
        meta = {k: v[i] for k, v in data.items()}
        doc_id = ids[i] if ids is not None and ids[i] is not None else f"{fallback_id}:{line}"
        source = sources[i] if sources is not None and sources[i] is not None else fallback_source
        try:
            meta_json = json.dumps(meta, ensure_ascii=False, default=str) if meta else None
            doc_id, source = str(doc_id), str(source)
        except (ValueError, RecursionError) as e:
            sink.add(_Quarantine(seg.path, line, base | line, "unencodable_record", f"record cannot be stored: {e}"))
            continue
        writer.add(base | line, doc_id, text, source, meta_json)


# ---- input formats: the registry ----------------------------------------------------------------

@dataclass(frozen=True)
class InputFormat:
    """One kind of input file: the suffixes that name it and the function that reads a segment of one.
    `read(seg, opts, writer, sink, stats)` is the built-in readers' contract; a new format written
    with `records_format` only turns a file's bytes into `Record`s and `BadRecord`s."""

    name: str
    suffixes: tuple[str, ...]  # with the dot, lowercase: ".jsonl.gz"
    read: Callable[..., None]


@dataclass
class Record:
    """A document a `records_format` parser found: `line` is its number in the file (1, 2, ...;
    unique and below 2**32, it fixes the uid); id and source default as for JSONL."""

    line: int
    text: Any
    id: Optional[str] = None
    source: Optional[str] = None
    meta: Optional[dict] = None


@dataclass
class BadRecord:
    """A record a parser could not take: quarantined with its line, code and detail."""

    line: int
    code: str
    detail: str
    raw: bytes = b""


_FORMATS: dict[str, InputFormat] = {}  # suffix -> format
ENTRY_POINT_GROUP = "corpusmill.input_formats"  # a package's entry point here registers its formats on load
_plugins_loaded = False


def register_format(fmt: InputFormat) -> InputFormat:
    """Make `fmt`'s suffixes readable input (a module in this family, or a package's entry point,
    calls it on import). A suffix already taken by another format is refused."""
    for suffix in fmt.suffixes:
        if not suffix.startswith(".") or suffix != suffix.lower():
            raise ValueError(f"input format {fmt.name}: suffix {suffix!r} must start with '.' and be lowercase")
        taken = _FORMATS.get(suffix)
        if taken is not None and taken.name != fmt.name:
            raise ValueError(f"input format {fmt.name}: suffix {suffix} is already read by {taken.name}")
    for suffix in fmt.suffixes:
        _FORMATS[suffix] = fmt
    return fmt


def _load_plugins() -> None:
    """Import every installed package's `corpusmill.input_formats` entry point once per process (the
    driver and each Dask worker find the same ones); one that fails to load is named, not skipped."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()
        except Exception as e:  # noqa: BLE001 - a broken plugin ends in one line naming it
            raise InputError(f"input format plugin {ep.name} ({ep.value}) cannot be loaded: {type(e).__name__}: {e}") from None


def input_formats() -> dict[str, InputFormat]:
    """suffix -> InputFormat, the built-in ones and every plugin's."""
    _load_plugins()
    return dict(_FORMATS)


def suffixes() -> tuple[str, ...]:
    """Every readable suffix, longest first (".jsonl.gz" is tried before a plugin's ".gz")."""
    return tuple(sorted(input_formats(), key=lambda s: (-len(s), s)))


def records_format(name: str, suffixes: tuple[str, ...],
                   parse: Callable[[bytes, str], Iterable["Record | BadRecord"]]) -> InputFormat:
    """An InputFormat from a parser of whole files: `parse(data, path)` yields a Record per document
    and a BadRecord per record it cannot take. The reader does the rest as for the built-in formats:
    the sample, the uid (file index and line), input.max_record_mb, quarantine of a text that is not a
    string, and a parser that raises part-way costs only the rest of its file (lost input, with the
    error), never the job."""
    return InputFormat(name, tuple(s.lower() for s in suffixes), functools.partial(_read_records, parse))


def _read_records(parse: Callable, seg: Segment, opts: ReadOptions, writer: "_PartWriter", sink: "_Sink",
                  stats: dict) -> None:
    base = seg.file_index << 32
    try:
        with storage.open_input(seg.path) as f:
            data = f.read()
    except OSError as e:
        sink.add(_lost_input(seg, 0, _Damage("unreadable_file", f"cannot read: {e.strerror or e}", 0)))
        return
    last = 0
    try:
        for item in parse(data, seg.path):
            line = int(item.line)
            if not 0 < line < MAX_LINES_PER_FILE:
                raise ValueError(f"record line {line} is outside 1..{MAX_LINES_PER_FILE - 1}")
            last = max(last, line)
            uid = base | line
            if not opts.sampled(uid):
                stats["not_sampled"] += 1
                continue
            stats["docs_in"] += 1
            if isinstance(item, BadRecord):
                stats["bytes_in"] += len(item.raw)
                sink.add(_Quarantine(seg.path, line, uid, item.code, item.detail, item.raw))
                continue
            if not isinstance(item.text, str):
                sink.add(_Quarantine(seg.path, line, uid, "invalid_text",
                                     f"text is {_describe_type(item.text)}, not a string"))
                continue
            raw = _safe_text(item.text).encode("utf-8")
            stats["bytes_in"] += len(raw)
            if opts.max_record_bytes is not None and len(raw) > opts.max_record_bytes:
                sink.add(_too_large(seg.path, line, uid, len(raw), opts, raw[:OVERSIZE_HEAD], "record"))
                continue
            try:
                meta = json.dumps(item.meta, ensure_ascii=False, default=str) if item.meta else None
            except (ValueError, RecursionError) as e:
                sink.add(_Quarantine(seg.path, line, uid, "unencodable_record", f"record cannot be stored: {e}", raw))
                continue
            doc_id = str(item.id) if item.id is not None else f"{display_path(seg.path)}:{line}"
            source = str(item.source) if item.source is not None else _default_source(seg.path)
            writer.add(uid, doc_id, raw.decode("utf-8"), source, meta)
    except InputError:
        raise
    except Exception as e:  # noqa: BLE001 - a parser that fails costs the rest of its file, not the job
        sink.add(_lost_input(seg, last, _Damage("reader_error", f"{type(e).__name__}: {e}", 0)))


for _fmt in (InputFormat("jsonl", (".jsonl", ".jsonl.gz", ".jsonl.zst"), _read_jsonl),
             InputFormat("parquet", (".parquet",), _read_parquet), InputFormat("txt", (".txt",), _read_txt),
             InputFormat("warc", (".warc", ".warc.gz"), _read_warc), InputFormat("html", (".html", ".htm"), _read_html)):
    register_format(_fmt)


def read_unit(unit: ReadUnit, opts: ReadOptions, out_dir: str, writer: Optional[_PartWriter] = None) -> dict:
    """Read one unit into `out_dir/part-*.parquet`; returns stats and the quarantine records.

    stats: docs_in = docs_out + quarantined (documents); `quarantine_reasons` counts documents by
    code; `lost_input` counts the damaged files whose rest could not be read (no documents).
    `writer`: a `PartHookWriter` made for this unit (the dedup job's reader), else a plain one."""
    started = time.perf_counter()
    writer = writer or _PartWriter(Path(out_dir), unit.index, opts.part_size, opts.cjk_share, opts.language)
    sink = _Sink(opts.on_error == "fail")
    stats: dict[str, Any] = {"docs_in": 0, "blank_lines": 0, "bytes_in": 0, "files": 0, "not_sampled": 0}
    for seg in unit.segments:
        if seg.start == 0:
            stats["files"] += 1
        input_formats()["." + seg.kind].read(seg, opts, writer, sink, stats)
    writer.flush()
    q = [x.record() for x in sink.rows]
    quarantined = sum(x.documents for x in sink.rows)
    stats["quarantined"] = quarantined
    stats["quarantine_rows"] = len(q)
    stats["docs_out"] = stats["docs_in"] - quarantined
    stats["quarantine_reasons"] = {}
    lost = {"files": 0, "bytes": 0, "partial_bytes": 0}
    damaged: set = set()
    for x in sink.rows:
        if x.documents:
            stats["quarantine_reasons"][x.code] = stats["quarantine_reasons"].get(x.code, 0) + x.documents
        elif "rows" not in x.extra:
            lost["files"] += x.path not in damaged  # a WARC file may hold several damaged spans: one file
            damaged.add(x.path)
            lost["bytes"] += x.extra.get("lost_bytes", 0)
            lost["partial_bytes"] += x.extra.get("partial_bytes", 0)
    stats["lost_input"] = lost
    stats["by_group"] = writer.groups
    stats["task_seconds"] = time.perf_counter() - started
    return {"stats": stats, "quarantine": q, "parts": writer.parts}


# ---- the dedup job's reader: each part handed on while it is in memory ---------------------------

class PartHookWriter(_PartWriter):
    """A `_PartWriter` that hands every part it writes, as the Arrow table, to `on_part(table, name)`
    (the dedup job signs it there without reading it back). Its parts are `_PartWriter`'s."""

    def __init__(self, out_dir: Path, unit_index: int, part_size: int, cjk_share: float, language: Optional[dict],
                 on_part: Any) -> None:
        super().__init__(out_dir, unit_index, part_size, cjk_share, language)
        self.on_part = on_part
        self.files: list[str] = []  # what on_part wrote, relative to out_dir

    def written(self, table: pa.Table, name: str) -> None:
        self.files += self.on_part(table, name)
