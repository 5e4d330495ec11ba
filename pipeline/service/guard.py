"""Data roots: the only folders a service job may read or write.

Every path a job names (the config's path fields, the run directory, a train job's shards) is
resolved with `os.path.realpath` — which follows symlinks and folds `..` — and must land inside one
of the roots. Inputs are checked twice: the pattern as written, then every file it expands to, so a
symlink or glob inside a root that points outside it is refused as well. The service's own state
folder (the job database, the token file) is never readable or writable by a job, even when it lies
inside a root.

A run directory (`out`) and a train job's shards folder must hold no symlink at all, checked when the
job is submitted and again when it starts or resumes (`check_no_links`): corpusmill never creates one
there, and a planted `report.md -> /etc/...` or `report.html -> the token file` would otherwise be
written through by the job or served by the API. (The service's own reads of a run directory follow
no link either; see safefs.)
"""
from __future__ import annotations

import os
from typing import Iterable, Optional

from corpusmill.stages.read import InputError, expand_inputs

from .safefs import find_link

# Every config field that names a file or folder, with how the job uses it. A test walks the config
# models and fails when a string field is in neither this table nor NOT_PATHS, so a new path option
# cannot slip past the guard.
PATH_FIELDS: dict[tuple[str, ...], str] = {
    ("input", "paths"): "inputs",
    ("tokenizer", "model"): "file",  # or a Hugging Face folder holding tokenizer.json
    ("dedup", "reference"): "folders",  # earlier run directories (read only); decontaminate.sets[].path and
    # filter.classifiers[].model (lists of models, resolved one by one in app.py): "file"
    ("filter", "blocked_words", "file"): "file",  # the user's word list
}
NOT_PATHS: set[tuple[str, ...]] = {
    ("input", "text_field"), ("input", "id_field"), ("input", "source_field"), ("input", "on_error"),
    ("dedup", "keep"), ("dedup", "keep_field"), ("dedup", "keep_order"), ("dedup", "shingling", "unit"),
    ("dedup", "simhash", "unit"),
    ("tokenizer", "train", "model_type"), ("tokenizer", "train", "user_symbols"), ("tokenizer", "kind"),
    ("tokenizer", "bos_token"), ("tokenizer", "eos_token"), ("tokenizer", "pad_token"), ("tokenizer", "tiktoken_pattern"),
    ("tokenizer", "tiktoken_special_tokens"), ("shard", "format"), ("shard", "megatron_split"),
    ("filter", "scripts", "keep"), ("filter", "language", "keep"), ("normalize", "chinese_convert"),
    *((("pii", kind, key)) for kind in ("email", "phone", "id_number", "bank_card", "ip") for key in ("action", "token")),
    ("pack", "mode"), ("pack", "remainder"), ("mix", "rest"), ("filter", "classifier_combine", "mode"), ("shard", "eod_metadata"),
    ("shard", "layout"), ("shard", "remainder"), ("shard", "verify"),
    ("cluster", "address"), ("cluster", "memory_limit"), ("cluster", "dashboard_address"),
    ("train", "num_parallel_workers"), ("train", "precision"),
}


class PathRefused(PermissionError):
    """A job named a path outside the data roots (HTTP 403)."""

    def __init__(self, key: str, path: str, reason: str):
        super().__init__(f"{key}: {path!r} {reason}")
        self.key, self.path, self.reason = key, path, reason


class PathTooLong(ValueError):
    """A path longer than the file system allows (HTTP 422): refused when the job is submitted, not
    accepted and then failed by the first open() with ENAMETOOLONG."""

    def __init__(self, key: str, path: str, reason: str):
        shown = path if len(path) <= 120 else f"{path[:60]}...{path[-40:]} ({len(path):,} characters)"
        super().__init__(f"{key}: {shown!r} {reason}")
        self.key = key


# bytes a run directory's own files add below `out` (04-near_dedup/signatures/part-00000-00000.parquet.tmp-...,
# removed/, _tasks/ markers): an `out` this much under PATH_MAX leaves room for every file a job writes there
RUN_FILES_RESERVE = 160


def _limits(path: str) -> tuple[int, int]:
    """(NAME_MAX, PATH_MAX) of the file system holding `path` (its nearest existing ancestor)."""
    probe = path
    while probe and not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    try:
        return os.pathconf(probe or os.sep, "PC_NAME_MAX"), os.pathconf(probe or os.sep, "PC_PATH_MAX")
    except (OSError, ValueError):
        return 255, 4096  # Linux's limits


def check_length(key: str, raw: str, path: str, reserve: int = 0) -> None:
    """PathTooLong when a component of the absolute `path` is over NAME_MAX bytes, or the whole (plus
    `reserve` bytes of files a job writes below it) over PATH_MAX."""
    name_max, path_max = _limits(path)
    for part in path.split(os.sep):
        if len(os.fsencode(part)) > name_max:
            shown = part if len(part) <= 40 else f"{part[:30]}... ({len(os.fsencode(part)):,} bytes)"
            raise PathTooLong(key, raw, f"has a component of more than {name_max} bytes (NAME_MAX): '{shown}'")
    size = len(os.fsencode(path))
    if size + reserve >= path_max:
        room = f" with the {reserve} bytes the run's own files add below it" if reserve else ""
        raise PathTooLong(key, raw, f"is {size:,} bytes long{room}: over the {path_max} of PATH_MAX")


class UnsafeFolder(ValueError):
    """A run directory or shards folder holds a symlink, or cannot be checked (HTTP 422)."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key


def check_no_links(key: str, folder: str) -> None:
    """UnsafeFolder when `folder` (when it exists) is, or holds at any depth, a symlink."""
    try:
        link = find_link(folder)
    except OSError as e:
        raise UnsafeFolder(key, f"cannot check {folder} for symlinks: {e.strerror or e}") from None
    if link is not None:
        try:
            target = os.readlink(link)
        except OSError:
            target = "?"
        raise UnsafeFolder(key, f"{link} is a symlink (to {target!r}); corpusmill writes no links into a run "
                           "directory or shards folder and follows none there: remove it")


class DataRoots:
    """The folders jobs may use; `forbidden` folders inside them (the service state) stay off limits."""

    def __init__(self, roots: Iterable[str], forbidden: Iterable[str] = ()):
        self.roots = [os.path.realpath(r) for r in roots]
        if not self.roots:
            raise ValueError("at least one data root is needed (--data-root DIR)")
        for r in self.roots:
            if not os.path.isdir(r):
                raise ValueError(f"data root {r} is not a folder")
        self.forbidden = [os.path.realpath(f) for f in forbidden]

    @staticmethod
    def _within(path: str, folder: str) -> bool:
        return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)

    def resolve(self, key: str, raw: str, *, allow_root: bool = True) -> str:
        """The real absolute path of `raw` (relative paths are taken from the first root), or PathRefused."""
        if not isinstance(raw, str) or not raw.strip():
            raise PathRefused(key, str(raw), "is empty")
        if "\x00" in raw:
            raise PathRefused(key, raw.replace("\x00", "\\0"), "contains a NUL byte")
        path = raw if os.path.isabs(raw) else os.path.join(self.roots[0], raw)
        check_length(key, raw, os.path.abspath(path))  # realpath of an over-long path is no path at all
        real = os.path.realpath(path)
        return self.check(key, raw, real, allow_root=allow_root)

    def check(self, key: str, raw: str, real: str, *, allow_root: bool = True) -> str:
        if any(self._within(real, f) for f in self.forbidden):
            raise PathRefused(key, raw, "belongs to the service (its state folder or token file)")
        inside = [r for r in self.roots if self._within(real, r)]
        if not inside:
            raise PathRefused(key, raw, f"resolves to {real}, outside the data roots ({', '.join(self.roots)})")
        if not allow_root and real in self.roots:
            raise PathRefused(key, raw, "is a data root itself; name a folder inside it")
        return real

    def resolve_inputs(self, key: str, patterns: list[str]) -> list[str]:
        """Resolve input patterns and check every file they expand to. InputError when nothing matches."""
        resolved = []
        for raw in patterns:
            if any(ch in raw for ch in "*?["):
                # the folder part before the first wildcard must be inside; the matches are checked below
                head = raw.split("*")[0].split("?")[0].split("[")[0]
                folder = os.path.dirname(head) or "."
                real_folder = self.resolve(key, folder)
                resolved.append(os.path.join(real_folder, raw[len(folder):].lstrip(os.sep)) if folder != "." else
                                os.path.join(real_folder, raw))
            else:
                resolved.append(self.resolve(key, raw))
        for f in expand_inputs(resolved):
            self.check(key, f, os.path.realpath(f))
        return resolved

    def out_dir(self, key: str, raw: Optional[str], default: str) -> str:
        """The real run directory, with room below it for every file a job writes there."""
        real = self.resolve(key, raw or default, allow_root=False)
        check_length(key, raw or default, real, RUN_FILES_RESERVE)
        return real

    def recheck(self, request: dict) -> None:
        """Check an accepted job's paths again when it starts: it may have waited in the queue while
        someone replaced a folder with a symlink or planted one in `out`. PathRefused, InputError or
        UnsafeFolder when they no longer pass."""
        config = request["config"]
        if request["kind"] in ("run", "dedup"):
            self.resolve_inputs("config.input.paths", config["input"]["paths"])
        if config["tokenizer"].get("model"):
            self.resolve("config.tokenizer.model", config["tokenizer"]["model"])
        for i, c in enumerate(config.get("filter", {}).get("classifiers") or []):
            self.resolve(f"config.filter.classifiers[{i}].model", c["model"])
        if request.get("shards"):
            if self.resolve("shards", request["shards"]) != request["shards"]:
                raise PathRefused("shards", request["shards"], "now leads through a symlink")
            check_no_links("shards", request["shards"])
        out = request["out"]
        if self.resolve("out", out, allow_root=False) != out:  # stored as its real path when accepted
            raise PathRefused("out", out, f"now leads through a symlink (to {os.path.realpath(out)})")
        check_no_links("out", out)


__all__ = ["DataRoots", "InputError", "NOT_PATHS", "PATH_FIELDS", "PathRefused", "PathTooLong", "UnsafeFolder", "check_no_links"]
