"""Reading a job's files without following links, and finding links a job must not be given.

A run directory lies inside a data root, where whoever can write to the root can also plant a
symlink: `report.html -> /srv/corpusmill/state/token` would make `GET /report` serve the token. So
the service never resolves a path it reads under a run directory (or its own state folder) through
the kernel's ordinary lookup: every component is opened relative to the one before it (`dir_fd`)
with O_NOFOLLOW, starting at `/`. The paths it reads come from the job table, where they were stored
as real paths (`os.path.realpath`) when the job was accepted, so a symlink anywhere on the way now
means someone changed the tree: the read is refused (`LinkRefused`), never redirected.

The other half is `find_link`: a job is given a run directory (or a shards folder) only when nothing
under it is a symlink. corpusmill itself never creates links there, so any link is foreign; it is
refused when the job is submitted and again when it starts (or resumes).
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Optional, Union

_DIR_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a FIFO must not hang a read

MAX_READ_BYTES = 64 << 20


class LinkRefused(PermissionError):
    """A path the service reads leads through a symlink (or to something that is not a regular file)."""


def _components(path: Union[str, Path]) -> list[str]:
    text = os.fspath(path)
    if not os.path.isabs(text):
        raise ValueError(f"{text!r} is not an absolute path")
    parts = [p for p in text.split(os.sep) if p not in ("", ".")]
    if ".." in parts:
        raise LinkRefused(f"{text}: '..' in a path the service reads")
    return parts


def _open_nofollow(path: Union[str, Path]) -> int:
    """A read-only fd of the regular file at `path`, no component of which may be a symlink."""
    parts = _components(path)
    if not parts:
        raise IsADirectoryError(errno.EISDIR, "not a file", os.fspath(path))
    fd = os.open("/", _DIR_FLAGS)
    try:
        for i, name in enumerate(parts[:-1]):
            try:
                nxt = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(os.sep + os.sep.join(parts[:i + 1])):
                    raise LinkRefused(f"{path}: {os.sep + os.sep.join(parts[:i + 1])} is a symlink") from None
                raise
            os.close(fd)
            fd = nxt
        try:
            file_fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=fd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise LinkRefused(f"{path} is a symlink") from None
            raise
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(file_fd).st_mode):
        os.close(file_fd)
        raise LinkRefused(f"{path} is not a regular file")
    return file_fd


def read_bytes(path: Union[str, Path], max_bytes: int = MAX_READ_BYTES, tail: bool = False) -> bytes:
    """The file's bytes (its first `max_bytes`, or with `tail` its last), read without following links.
    FileNotFoundError when it is not there; LinkRefused when a link or a non-file is in the way."""
    fd = _open_nofollow(path)
    with os.fdopen(fd, "rb") as f:
        if tail:
            size = os.fstat(fd).st_size
            f.seek(max(0, size - max_bytes))
        return f.read(max_bytes)


def read_range(path: Union[str, Path], offset: Optional[int], max_bytes: int) -> tuple[bytes, int, int]:
    """(data, where it starts, the file's size): at most `max_bytes` from `offset`, or with offset None the
    file's last `max_bytes`; read without following links, as read_bytes. A log follower resumes at
    start + len(data)."""
    fd = _open_nofollow(path)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(fd).st_size
        start = max(0, size - max_bytes) if offset is None else min(offset, size)
        f.seek(start)
        return f.read(max_bytes), start, size


def read_text(path: Union[str, Path], max_bytes: int = MAX_READ_BYTES, tail: bool = False) -> str:
    return read_bytes(path, max_bytes, tail).decode("utf-8", "replace")


def read_optional(path: Union[str, Path], max_bytes: int = MAX_READ_BYTES, tail: bool = False) -> Optional[bytes]:
    """read_bytes, or None when the file is missing, a link, or unreadable (for status documents)."""
    try:
        return read_bytes(path, max_bytes, tail)
    except (OSError, ValueError):
        return None


def find_link(folder: Union[str, Path]) -> Optional[str]:
    """The first symlink found at or under `folder` (not followed), or None. A folder that does not
    exist has none. Entries are checked with lstat semantics, so a link to a folder is found, not entered."""
    top = os.fspath(folder)
    if os.path.islink(top):
        return top
    if not os.path.isdir(top):
        return None
    stack = [top]
    while stack:
        current = stack.pop()
        try:
            entries = list(os.scandir(current))
        except FileNotFoundError:
            continue
        for entry in entries:
            if entry.is_symlink():
                return entry.path
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
    return None


__all__ = ["LinkRefused", "find_link", "read_bytes", "read_optional", "read_range", "read_text"]
