"""Shared fixtures: a real Dask LocalCluster (worker processes) and corpus-writing helpers."""
from __future__ import annotations

import json
import os
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
