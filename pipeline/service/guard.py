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

A root may also be an object-storage URL (`s3://bucket/prefix`). Object keys are literal strings,
with no symlink to follow and nothing to fold, so a URL is checked as written and never normalised:
it must be plain (no credentials, query, fragment, `.`/`..`/empty segments, backslash, control
character or percent-encoded `.`, `/` or `\\`) else it is refused (HTTP 422), and it must then lie
in a URL root of the same scheme and bucket, below its prefix on a `/` boundary, else it is
refused as any path outside the roots (HTTP 403). A URL `out` publishes to object storage as the
CLI's `--out URL` does; its run directory (`work`) stays local: inside a folder root, or by default
in the service's own work area (STATE/work/, which no job can name).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Iterable, Optional

from corpusmill.stages import storage
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
    # a registered rule family's settings (stages/quality_rules.py): numbers and words the family decides
    # with; a family that needs files brings them in its own package, the guard resolves no path in them
    ("filter", "rules"),
    ("input", "text_field"), ("input", "id_field"), ("input", "source_field"), ("input", "on_error"),
    ("dedup", "keep"), ("dedup", "keep_field"), ("dedup", "keep_order"), ("dedup", "shingling", "unit"),
    ("dedup", "simhash", "unit"), ("dedup", "paragraph", "keep"),
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


class UrlRefused(ValueError):
    """An object-storage URL the service does not take as written (HTTP 422): credentials or a query
    in it, dot or empty segments, characters a store or proxy might read otherwise."""

    def __init__(self, key: str, url: str, reason: str):
        super().__init__(f"{key}: {shown_url(url)!r} {reason}")
        self.key = key


# S3's key limit (bytes of UTF-8); a segment is held to NAME_MAX, as a local copy of the object needs
URL_KEY_MAX, URL_SEGMENT_MAX = 1024, 255
_BUCKET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")
_ENCODED = re.compile(r"%(2e|2f|5c)", re.IGNORECASE)  # an encoded ".", "/" or "\\"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def shown_url(url: str) -> str:
    """`url` fit to print: a user:secret@ part and a query (a presigned signature) blanked."""
    text = str(url)
    if "://" in text:
        scheme, rest = text.split("://", 1)
        authority, slash, path = rest.partition("/")
        if "@" in authority:
            authority = "***@" + authority.rsplit("@", 1)[1]
        text = f"{scheme}://{authority}{slash}{path}"
    for mark in "?#":
        if mark in text:
            text = text.split(mark, 1)[0] + mark + "***"
    return text.replace("\x00", "\\0")


@dataclass(frozen=True)
class UrlRoot:
    scheme: str
    bucket: str
    prefix: str  # the key prefix, no slash at either end; "" for the whole bucket

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")

    def holds(self, scheme: str, bucket: str, key: str) -> bool:
        return (scheme, bucket) == (self.scheme, self.bucket) and (
            not self.prefix or key == self.prefix or key.startswith(self.prefix + "/"))


def split_url(key: str, url: str, reserve: int = 0) -> tuple[str, str, str]:
    """(scheme, bucket, key) of a plain object-storage URL (one trailing slash dropped from the key);
    UrlRefused for anything that is not one, PathTooLong for a key over S3's 1024 bytes (plus
    `reserve` bytes of the names a run publishes below it) or a segment over 255 bytes."""
    scheme, rest = storage.protocol(url), url.split("://", 1)[1]
    authority, _, path = rest.partition("/")
    if "@" in authority:
        raise UrlRefused(key, url, "holds credentials: they come only from the service's environment "
                         "(AWS_ACCESS_KEY_ID ..., AWS_PROFILE), never from a URL")
    if "?" in url or "#" in url:
        raise UrlRefused(key, url, "has a query or fragment (?versionId=, a presigned signature); name the object only")
    if _CONTROL.search(url):
        raise UrlRefused(key, url, "contains a NUL byte or another control character")
    if not _BUCKET.match(authority):
        raise UrlRefused(key, url, "names no bucket (letters, digits, '.', '-', '_'; no port, no wildcard)")
    if "\\" in path or _ENCODED.search(path):
        raise UrlRefused(key, url, "holds a backslash or a percent-encoded '.', '/' or '\\'; write the key plainly")
    path = path[:-1] if path.endswith("/") else path
    segments = path.split("/") if path else []
    if any(seg in ("", ".", "..") for seg in segments):
        raise UrlRefused(key, url, "has an empty, '.' or '..' segment (object keys are taken as written, never folded)")
    for seg in segments:
        if len(seg.encode("utf-8")) > URL_SEGMENT_MAX:
            raise PathTooLong(key, url, f"has a segment of more than {URL_SEGMENT_MAX} bytes")
    size = len(path.encode("utf-8"))
    if size + reserve > URL_KEY_MAX:
        room = f" with the {reserve} bytes of the names a run publishes below it" if reserve else ""
        raise PathTooLong(key, url, f"has a key of {size:,} bytes{room}: over object storage's {URL_KEY_MAX}")
    return scheme.lower(), authority, path


class DataRoots:
    """The folders and object-storage prefixes jobs may use; `forbidden` folders inside them (the
    service state) stay off limits; `work_area` holds the local run directories of URL outputs."""

    def __init__(self, roots: Iterable[str], forbidden: Iterable[str] = (), work_area: Optional[str] = None):
        self.roots: list[str] = []  # as given, in order: folders as real paths, URL roots as plain URLs
        self.local: list[str] = []
        self.urls: list[UrlRoot] = []
        for r in roots:
            if storage.is_url(r):
                try:
                    scheme, bucket, prefix = split_url("--data-root", r)
                except (UrlRefused, PathTooLong) as e:
                    raise ValueError(str(e)) from None
                if any(ch in prefix for ch in "*?["):
                    raise ValueError(f"--data-root {r}: a root is a prefix, not a glob")
                root = UrlRoot(scheme, bucket, prefix)
                self.urls.append(root)
                self.roots.append(root.url)
            else:
                real = os.path.realpath(r)
                if not os.path.isdir(real):
                    raise ValueError(f"data root {real} is not a folder")
                self.local.append(real)
                self.roots.append(real)
        if not self.roots:
            raise ValueError("at least one data root is needed (--data-root DIR or URL)")
        self.forbidden = [os.path.realpath(f) for f in forbidden]
        self.work_area = os.path.realpath(work_area) if work_area else None

    @staticmethod
    def _within(path: str, folder: str) -> bool:
        return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)

    def resolve(self, key: str, raw: str, *, allow_root: bool = True) -> str:
        """The real absolute path of `raw` (relative paths are taken from the first folder root), or
        PathRefused (an object-storage URL too: only inputs and `out` may be one)."""
        if not isinstance(raw, str) or not raw.strip():
            raise PathRefused(key, str(raw), "is empty")
        if storage.is_url(raw):
            raise PathRefused(key, shown_url(raw), "is an object-storage URL; only config.input.paths and out may "
                              "be one: name a file inside a folder data root")
        if "\x00" in raw:
            raise PathRefused(key, raw.replace("\x00", "\\0"), "contains a NUL byte")
        if not os.path.isabs(raw) and not self.local:
            raise PathRefused(key, raw, "is relative, and no data root is a folder to take it from")
        path = raw if os.path.isabs(raw) else os.path.join(self.local[0], raw)
        check_length(key, raw, os.path.abspath(path))  # realpath of an over-long path is no path at all
        real = os.path.realpath(path)
        return self.check(key, raw, real, allow_root=allow_root)

    def check(self, key: str, raw: str, real: str, *, allow_root: bool = True) -> str:
        if any(self._within(real, f) for f in self.forbidden):
            raise PathRefused(key, raw, "belongs to the service (its state folder or token file)")
        inside = [r for r in self.local if self._within(real, r)]
        if not inside:
            raise PathRefused(key, raw, f"resolves to {real}, outside the data roots ({', '.join(self.roots)})")
        if not allow_root and real in self.local:
            raise PathRefused(key, raw, "is a data root itself; name a folder inside it")
        return real

    def check_url(self, key: str, url: str, *, allow_root: bool = True, reserve: int = 0) -> str:
        """`url` (its scheme in lower case) when it is plain and inside a URL root: UrlRefused or
        PathTooLong (422) when it is not plain, PathRefused (403) when it lies outside. A glob is
        held by what comes before its first wildcard, on a `/` boundary (the folder it lists)."""
        if "\x00" in url:
            raise UrlRefused(key, url, "contains a NUL byte")
        scheme, bucket, path = split_url(key, url, reserve)
        wild = min((i for i in (path.find(ch) for ch in "*?[") if i >= 0), default=-1)
        fixed = path if wild < 0 else path[:wild].rpartition("/")[0]
        inside = [r for r in self.urls if r.holds(scheme, bucket, fixed)]
        if not inside:
            where = "its part before the first wildcard is " if wild >= 0 else ""
            roots = ", ".join(r.url for r in self.urls) or "none is a URL"
            raise PathRefused(key, url, f"{where}outside the object-storage data roots ({roots})")
        if not allow_root and any(r.prefix == path for r in inside):
            raise PathRefused(key, url, "is a data root itself; name a prefix inside it")
        return f"{scheme}://{url.split('://', 1)[1]}"

    def resolve_inputs(self, key: str, patterns: list[str]) -> list[str]:
        """Resolve input patterns and check every file they expand to. InputError when nothing matches."""
        resolved = []
        for raw in patterns:
            if storage.is_url(raw):
                resolved.append(self.check_url(key, raw))
            elif any(ch in raw for ch in "*?["):
                # the folder part before the first wildcard must be inside; the matches are checked below
                head = raw.split("*")[0].split("?")[0].split("[")[0]
                folder = os.path.dirname(head) or "."
                real_folder = self.resolve(key, folder)
                resolved.append(os.path.join(real_folder, raw[len(folder):].lstrip(os.sep)) if folder != "." else
                                os.path.join(real_folder, raw))
            else:
                resolved.append(self.resolve(key, raw))
        for f in expand_inputs(resolved):  # every file and object the patterns name, checked one by one
            if storage.is_url(f):
                self.check_url(key, f)
            else:
                self.check(key, f, os.path.realpath(f))
        return resolved

    def out_dir(self, key: str, raw: Optional[str], default: str) -> str:
        """The real run directory, with room below it for every file a job writes there."""
        real = self.resolve(key, raw or default, allow_root=False)
        check_length(key, raw or default, real, RUN_FILES_RESERVE)
        return real

    def out_url(self, key: str, raw: str) -> str:
        """An object-storage `out`: inside a URL root, not a root itself, with room for a run's names."""
        return self.check_url(key, raw, allow_root=False, reserve=RUN_FILES_RESERVE).rstrip("/")

    def work_dir(self, key: str, raw: Optional[str], url: str) -> str:
        """The local run directory of a job publishing to `url`: `raw` inside a folder root (as an
        `out` is), else WORK_AREA (or FIRST_FOLDER_ROOT/jobs) / a name made from the URL, the same for
        the same URL, so that a resume finds the steps an earlier job finished."""
        if raw:
            return self.out_dir(key, raw, raw)
        name = storage.cache_dir("runs", url).name
        if self.work_area:
            real = os.path.realpath(os.path.join(self.work_area, name))
            if os.path.dirname(real) != self.work_area:  # the work area's own entry replaced by a link
                raise PathRefused(key, os.path.join(self.work_area, name), f"resolves to {real}, outside {self.work_area}")
            check_length(key, real, real, RUN_FILES_RESERVE)
            return real
        if not self.local:
            raise PathRefused(key, url, "needs a local run directory: name `work` inside a folder data root")
        return self.out_dir(key, None, os.path.join(self.local[0], "jobs", name))

    def default_out(self, job_id: str, local: bool = False) -> str:
        """FIRST_ROOT/jobs/ID: a folder, or a prefix the results are published to (`local`: the first
        folder root's, for a train job)."""
        first = (self.local or [None])[0] if local else self.roots[0]
        if first is None:
            raise PathRefused("out", "", "is needed: no data root is a folder to make a train job's output folder in")
        return storage.join(first, "jobs", job_id) if storage.is_url(first) else os.path.join(first, "jobs", job_id)

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
        if request.get("work"):  # a URL out: the URL as accepted, and its local run directory
            self.out_url("out", out)
            work = request["work"]
            again = self.work_dir("work", work if not self._in_work_area(work) else None, out)
            if again != work:
                raise PathRefused("work", work, f"now leads through a symlink (to {os.path.realpath(work)})")
            check_no_links("work", work)
            return
        if self.resolve("out", out, allow_root=False) != out:  # stored as its real path when accepted
            raise PathRefused("out", out, f"now leads through a symlink (to {os.path.realpath(out)})")
        check_no_links("out", out)

    def _in_work_area(self, path: str) -> bool:
        return bool(self.work_area) and os.path.dirname(path) == self.work_area


__all__ = ["DataRoots", "InputError", "NOT_PATHS", "PATH_FIELDS", "PathRefused", "PathTooLong", "UnsafeFolder", "UrlRefused",
           "UrlRoot", "check_no_links", "shown_url", "split_url"]
