"""Object storage (S3, OBS, MinIO, Ceph RGW, any fsspec URL): the one owner of paths that are URLs.

A path with a scheme (`s3://bucket/key`, `gs://...`; not `file://`) is read through fsspec, whose
filesystem package must be installed (`pip install "corpusmill[s3]"` for s3://). Nothing here takes an
endpoint, a region or a credential: fsspec / botocore find them in the standard places
(`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_PROFILE`, `~/.aws/config`
and `~/.aws/credentials`), so they never reach a config, a log line, the manifest or the report;
every message made here from a storage error is also scrubbed of the credential values.

- Reading: `expand` lists objects (globs, prefixes, single keys) with their size and ETag (the read
  step hashes those instead of a local file's mtime); `open_input` gives a buffered, seekable reader
  that streams byte ranges on the worker that reads the object (never the whole object at once), and
  turns any transport error into an OSError, which the reader records as a lost-input row like a
  local read error.
- Writing: `put_checked` uploads one local file and checks what arrived (size, and the S3 ETag
  against the MD5 computed here); `publish` (pipeline/rundir.py) orders the uploads.
- `mirror` copies a prefix into a local cache (MindRecord's reader needs local paths), reusing the
  files whose size and ETag are unchanged.
"""
from __future__ import annotations

import errno
import hashlib
import io
import json
import math
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable, Optional

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
S3_PROTOCOLS = ("s3", "s3a")
_FS: dict[tuple, Any] = {}  # one filesystem per scheme and AWS_* environment (a changed credential: a new one)
_INFO: dict[str, dict] = {}  # url -> {size, etag} from the listing that found it (this process)
READ_BLOCK = 8 << 20  # bytes one ranged GET fetches ahead of the reader
BUFFER = 1 << 20  # the BufferedReader's buffer over the remote file
MULTIPART_CHUNK = 50 << 20  # s3fs's part size: above 2 x this an upload is multipart
CREDENTIAL_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")


class StorageError(ValueError):
    """Object storage cannot be used as asked (no filesystem package, no such bucket, access denied,
    the endpoint cannot be reached, an upload that did not arrive whole): one line, exit 2."""


def is_url(path: Any) -> bool:
    """Whether `path` names object storage (a scheme other than file://)."""
    if not isinstance(path, str):
        return False
    m = _SCHEME.match(path)
    return bool(m) and m.group(1).lower() != "file"


def protocol(url: str) -> str:
    return _SCHEME.match(url).group(1).lower()


def _install_hint(proto: str) -> str:
    if proto in S3_PROTOCOLS:
        return 'pip install "corpusmill[s3]"'
    return f"install the fsspec filesystem package for {proto}://"


def filesystem(url: str) -> Any:
    """The fsspec filesystem for `url`'s scheme, configured only from the environment and config files
    (one per process and AWS_* environment: fsspec's own instance cache would keep old credentials)."""
    proto = protocol(url)
    try:
        import fsspec
    except ImportError:
        raise StorageError(f"{url}: reading object storage needs fsspec and its filesystem package: "
                           f"{_install_hint(proto)}") from None
    key = (proto, hashlib.sha256(repr(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
                                 .encode()).hexdigest())
    if key in _FS:
        return _FS[key]
    try:
        fs = fsspec.filesystem(proto, skip_instance_cache=True)
    except (ImportError, ValueError) as e:
        missing = isinstance(e, ImportError) or "not installed" in str(e) or "Install" in str(e)
        if missing or proto in S3_PROTOCOLS:
            raise StorageError(f"{url}: no filesystem package for {proto}:// is installed: {_install_hint(proto)}") from None
        raise StorageError(f"{url}: unknown URL scheme {proto}:// (no fsspec filesystem for it)") from None
    _FS[key] = fs
    return fs


def scrub(text: str) -> str:
    """`text` with the values of the credential variables blanked (a server's error can quote what it got)."""
    for var in CREDENTIAL_VARS:
        value = os.environ.get(var)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    return text


def _bucket(url: str) -> str:
    rest = url.split("://", 1)[1]
    return rest.split("/", 1)[0]


def describe(e: BaseException, url: str) -> str:
    """What went wrong talking to object storage, as words a user can act on (no endpoint, no credential)."""
    name = type(e).__name__
    text = str(e)
    low = text.lower()
    if "bucket does not exist" in low or "nosuchbucket" in low:
        return f"no such bucket: {_bucket(url)}"
    if isinstance(e, PermissionError) or "accessdenied" in low or "access denied" in low or "signature" in low \
            or "invalidaccesskeyid" in low or "forbidden" in low:
        return ("access denied (check the credentials the AWS environment, AWS_PROFILE or ~/.aws/credentials "
                "provide, and the bucket's policy)")
    if "endpointconnection" in name.lower() or "could not connect" in low or "connect" in name.lower():
        return ("cannot connect to the object store (check AWS_ENDPOINT_URL or the profile's endpoint_url, and "
                "the network)")
    if "nocredentials" in name.lower() or "unable to locate credentials" in low:
        return "no credentials found (set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or AWS_PROFILE)"
    if "FileExpired" in name:
        return "the object changed while it was being read (its ETag is no longer the one listed)"
    if isinstance(e, FileNotFoundError):
        return "no such object"
    first = text.strip().splitlines()[0] if text.strip() else ""
    return scrub(f"{name}: {first}"[:300])


def _etag(info: dict) -> str:
    return str(info.get("ETag") or info.get("etag") or info.get("md5Hash") or info.get("mtime") or "").strip('"')


def _remember(url: str, info: dict) -> dict:
    found = {"size": int(info.get("size") or info.get("Size") or 0), "etag": _etag(info)}
    _INFO[url] = found
    return found


def _full(proto: str, path: str) -> str:
    return f"{proto}://{path}"


def _has_magic(s: str) -> bool:
    return any(ch in s for ch in "*?[")


def expand(pattern: str, accept: Callable[[str], bool]) -> list[str]:
    """The object URLs a pattern names: a glob's matches, every object under a prefix (a "folder"),
    or the one object. Only names `accept` takes are kept (supported suffixes); a pattern naming an
    object directly is kept whatever its name (the caller refuses it). StorageError for a missing
    bucket, denied access or an unreachable endpoint; [] when nothing matches."""
    fs = filesystem(pattern)
    proto = protocol(pattern)
    fs.invalidate_cache()  # a listing is always asked afresh: an object rewritten since has a new ETag
    try:
        if _has_magic(pattern.split("://", 1)[1]):
            found = fs.glob(pattern, detail=True)
        else:
            found = {}
            stripped = pattern.rstrip("/")
            try:
                info = fs.info(stripped)
            except FileNotFoundError:
                info = None
            if info is not None and info.get("type") != "directory":
                found = {fs._strip_protocol(stripped): info}
            else:
                found = fs.find(stripped, detail=True)
        if not found:  # an empty listing: tell a missing bucket from a missing key
            fs.ls(_bucket(pattern), detail=False)
    except StorageError:
        raise
    except Exception as e:  # noqa: BLE001 - botocore and aiohttp errors are not OSErrors: name them, once
        raise StorageError(f"input {pattern}: {describe(e, pattern)}") from None
    urls = []
    for path, info in sorted(found.items()):
        if info.get("type") == "directory":
            continue
        url = _full(proto, path)
        if accept(url) or not _has_magic(pattern.split("://", 1)[1]) and url.rstrip("/") == pattern.rstrip("/"):
            _remember(url, info)
            urls.append(url)
    return urls


def stat(url: str) -> dict:
    """{size, etag} of an object: from the listing that found it, else asked of the store."""
    if url in _INFO:
        return _INFO[url]
    fs = filesystem(url)
    try:
        return _remember(url, fs.info(url))
    except Exception as e:  # noqa: BLE001
        raise _os_error(e, url) from None


def size(path: str) -> int:
    """Bytes of a local file or an object."""
    return stat(path)["size"] if is_url(path) else os.path.getsize(path)


def _os_error(e: BaseException, url: str) -> OSError:
    if isinstance(e, OSError) and not isinstance(e, (FileNotFoundError, PermissionError)) and e.strerror:
        return OSError(e.errno or errno.EIO, scrub(e.strerror), url)
    code = errno.ENOENT if isinstance(e, FileNotFoundError) else errno.EACCES if isinstance(e, PermissionError) \
        else errno.EIO
    return OSError(code, describe(e, url), url)


class _RemoteRaw(io.RawIOBase):
    """An fsspec file as a raw stream for io.BufferedReader (fast readline with a limit, seek, tell);
    any error of the transport is an OSError, as a local read error is."""

    def __init__(self, f: Any, url: str):
        self.f, self.url = f, url

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        try:
            data = self.f.read(len(b))
        except Exception as e:  # noqa: BLE001 - a dropped connection, an expired object, a server error
            raise _os_error(e, self.url) from None
        n = len(data)
        b[:n] = data
        return n

    def seek(self, pos: int, whence: int = 0) -> int:
        return self.f.seek(pos, whence)

    def tell(self) -> int:
        return self.f.tell()

    def close(self) -> None:
        if not self.closed:
            try:
                self.f.close()
            finally:
                super().close()


def open_input(path: str) -> Any:
    """A binary reader: `open(path, "rb")` for a local file (unchanged), else a buffered, seekable
    stream of the object's bytes fetched in READ_BLOCK ranges. OSError when it cannot be opened."""
    if not is_url(path):
        return open(path, "rb")
    fs = filesystem(path)
    try:
        f = fs.open(path, "rb", block_size=READ_BLOCK, cache_type="readahead")
    except Exception as e:  # noqa: BLE001
        raise _os_error(e, path) from None
    return io.BufferedReader(_RemoteRaw(f, path), BUFFER)


# ---- writing -----------------------------------------------------------------------------------

def join(url: str, *parts: str) -> str:
    return "/".join([url.rstrip("/"), *[p.strip("/") for p in parts if p]])


def _expected_etag(path: Path, chunk: int = MULTIPART_CHUNK) -> tuple[str, int]:
    """The S3 ETag an upload of `path` by s3fs must get: MD5 of the bytes for one PUT, MD5 of the
    parts' MD5s with -N for a multipart upload (s3fs's part size), and the file's size."""
    n = path.stat().st_size
    multipart = n >= min(5 << 30, 2 * chunk)
    if not multipart:
        h = hashlib.md5()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(8 << 20), b""):
                h.update(block)
        return h.hexdigest(), n
    chunk = max(chunk, math.ceil(n / 10000))
    digests = []
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            digests.append(hashlib.md5(block).digest())
    return f"{hashlib.md5(b''.join(digests)).hexdigest()}-{len(digests)}", n


def remote_matches(url: str, local: Path, remote: Optional[dict] = None) -> bool:
    """Whether the object at `url` holds `local`'s bytes (size, and the ETag on S3)."""
    etag, n = _expected_etag(local)
    if remote is None:
        fs = filesystem(url)
        try:
            info = fs.info(url)
        except FileNotFoundError:
            return False
        remote = {"size": int(info.get("size") or 0), "etag": _etag(info)}
    if remote["size"] != n:
        return False
    if protocol(url) in S3_PROTOCOLS and re.fullmatch(r"[0-9a-f]{32}(-\d+)?", remote["etag"] or ""):
        return remote["etag"] == etag
    return True


def put_checked(local: Path, url: str) -> None:
    """Upload one file and check what arrived (size, and the ETag against the MD5 computed here)."""
    fs = filesystem(url)
    try:
        fs.put_file(str(local), url)
        fs.invalidate_cache(url)
        info = fs.info(url)
    except Exception as e:  # noqa: BLE001
        raise StorageError(f"upload to {url} failed: {describe(e, url)}") from None
    if not remote_matches(url, local, {"size": int(info.get("size") or 0), "etag": _etag(info)}):
        raise StorageError(f"upload to {url} did not arrive whole: the stored object's size or checksum differs from "
                           f"{local} (rerun to publish again)")


def listing(url: str) -> dict[str, dict]:
    """{key relative to `url`: {size, etag}} of every object under the prefix `url` ({} when none)."""
    fs = filesystem(url)
    base = fs._strip_protocol(url).rstrip("/")
    fs.invalidate_cache()
    try:
        found = fs.find(url.rstrip("/"), detail=True)
    except FileNotFoundError:
        return {}
    except Exception as e:  # noqa: BLE001
        raise StorageError(f"{url}: {describe(e, url)}") from None
    out = {}
    for path, info in found.items():
        if info.get("type") == "directory" or not path.startswith(base + "/"):
            continue
        out[path[len(base) + 1:]] = {"size": int(info.get("size") or 0), "etag": _etag(info)}
    return out


def remove(urls: list[str]) -> None:
    if not urls:
        return
    fs = filesystem(urls[0])
    try:
        fs.rm(urls)
    except FileNotFoundError:
        pass
    except Exception as e:  # noqa: BLE001
        raise StorageError(f"cannot remove {urls[0]}{' ...' if len(urls) > 1 else ''}: {describe(e, urls[0])}") from None
    for u in urls:
        fs.invalidate_cache(u)


def check_writable(url: str) -> None:
    """Before any work: the bucket exists and takes a write under the prefix (a probe object, removed)."""
    fs = filesystem(url)
    probe = join(url, ".corpusmill-write-probe")
    try:
        fs.ls(_bucket(url), detail=False)
        fs.pipe_file(probe, b"probe")
        fs.rm_file(probe)
    except Exception as e:  # noqa: BLE001
        raise StorageError(f"--out {url}: {describe(e, url)}") from None


# ---- reading a prefix through a local cache ------------------------------------------------------

def cache_root() -> Path:
    """Where copies of remote shard sets and remote runs' work folders live ($CORPUSMILL_CACHE, else
    $XDG_CACHE_HOME/corpusmill, else ~/.cache/corpusmill)."""
    if os.environ.get("CORPUSMILL_CACHE"):
        return Path(os.environ["CORPUSMILL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "corpusmill"


def cache_dir(kind: str, url: str) -> Path:
    """A stable local folder for `url` (the same URL finds the same folder on the next run)."""
    digest = hashlib.sha256(url.rstrip("/").encode("utf-8")).hexdigest()[:16]
    tail = re.sub(r"[^A-Za-z0-9._-]+", "_", url.split("://", 1)[1].rstrip("/"))[-48:]
    return cache_root() / kind / f"{tail}-{digest}"


MIRROR_STATE = ".corpusmill-mirror.json"


def mirror(url: str, dest: Optional[Path] = None, log: Callable[[str], None] = print, reuse: bool = True) -> Path:
    """Copy every object under the prefix `url` into a local folder (default: `cache_dir("shards", url)`),
    downloading only the objects whose size or ETag changed since the last copy (`reuse`; else every
    object again) and removing local files the prefix no longer holds. Returns the folder.
    StorageError when the prefix holds nothing."""
    dest = Path(dest) if dest is not None else cache_dir("shards", url)
    objects = listing(url)
    if not objects:
        try:
            filesystem(url).ls(_bucket(url), detail=False)
        except Exception as e:  # noqa: BLE001
            raise StorageError(f"{url}: {describe(e, url)}") from None
        raise StorageError(f"{url}: no objects under this prefix")
    dest.mkdir(parents=True, exist_ok=True)
    state_file = dest / MIRROR_STATE
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        state = {}
    fs = filesystem(url)
    fetched = 0
    for rel, info in sorted(objects.items()):
        if rel == MIRROR_STATE or ".." in Path(rel).parts or Path(rel).is_absolute():
            continue
        target = dest / rel
        if reuse and state.get(rel) == info and target.is_file() and target.stat().st_size == info["size"]:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".part")
        try:
            fs.get_file(join(url, rel), str(tmp))
        except Exception as e:  # noqa: BLE001
            tmp.unlink(missing_ok=True)
            raise StorageError(f"cannot download {join(url, rel)}: {describe(e, url)}") from None
        os.replace(tmp, target)
        state[rel] = info
        fetched += info["size"]
    for path in sorted(dest.rglob("*"), reverse=True):
        rel = path.relative_to(dest).as_posix()
        if path.is_file() and rel != MIRROR_STATE and rel not in objects:
            path.unlink()
            state.pop(rel, None)
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()
    state = {k: v for k, v in state.items() if k in objects}
    state_file.write_text(json.dumps(state, indent=1), encoding="utf-8")
    log(f"{url}: {len(objects)} objects in the local copy {dest} ({fetched / 2**20:,.1f} MiB downloaded)")
    return dest


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
