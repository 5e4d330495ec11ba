"""Shared fixtures: a real Dask LocalCluster (worker processes) and corpus-writing helpers."""
from __future__ import annotations

import gzip
import json
import os
import random
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

        precompile()


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
