"""Paths the file system cannot hold are refused when a job is submitted, on a real `corpusmill serve`
process and a real HTTP client: a 6,000-character `out`, a name over NAME_MAX in `out` or in a config
path field get a 422 naming the key and the limit, and no job is queued (before, such an `out` was
accepted with 201 and the job failed with "File name too long")."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.corpora import build_corpus
from tests.servers import Server


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("paths") / "data"
    build_corpus(root / "corpus")
    return root


@pytest.fixture(scope="module")
def server(data):
    srv = Server(data.parent / "state", [data]).start()
    yield srv
    srv.stop()


def _path_of(root_len: int, total: int) -> str:
    """A relative path of components of at most 200 bytes that is `total` bytes long below a root of `root_len`."""
    left, parts = total - root_len - 1, []
    while left > 0:
        n = min(200, left)
        parts.append("e" * n)
        left -= n + 1
    return "/".join(parts)


def _jobs(client) -> list[dict]:
    return client.get("/v1/jobs", params={"limit": 1000}).json()["jobs"]


def test_paths_over_the_os_limits_are_refused_at_submission(server, data):
    name_max, path_max = os.pathconf(data, "PC_NAME_MAX"), os.pathconf(data, "PC_PATH_MAX")
    config = {"input": {"paths": ["corpus"]}, "dedup": {"minhash": {"enabled": False}}}
    long_out = "/".join(["d" * 200] * 30)  # 6,029 characters, each component a legal name
    cases = {
        "out over PATH_MAX": ({"out": long_out}, "out", "PATH_MAX"),
        "out component over NAME_MAX": ({"out": "x" * (name_max + 1)}, "out", "NAME_MAX"),
        # room for the run's own files below `out`: a path that fits alone but not with them
        "out without room for its files": ({"out": _path_of(len(str(data)), path_max - 50)}, "out", "PATH_MAX"),
        "tokenizer over NAME_MAX": ({"config": {**config, "tokenizer": {"model": "t" * (name_max + 1) + ".json"}}},
                                    "config.tokenizer.model", "NAME_MAX"),
        "eval set over PATH_MAX": ({"config": {**config, "decontaminate": {"sets": [{"name": "ev", "path": long_out}]}}},
                                   "config.decontaminate.sets[0].path", "PATH_MAX"),
        "input over NAME_MAX": ({"config": {**config, "input": {"paths": ["corpus/" + "i" * (name_max + 1)]}}},
                                "config.input.paths", "NAME_MAX"),
    }
    with server.client() as c:
        before = len(_jobs(c))
        for what, (fields, key, limit) in cases.items():
            body = {"kind": "dedup", "config": config, **fields}
            r = c.post("/v1/jobs", json=body)
            assert r.status_code == 422, (what, r.status_code, r.text)
            assert r.json()["keys"] == [key] and limit in r.json()["detail"], (what, r.text)
            assert len(r.json()["detail"]) < 400, (what, r.text)  # the path is shortened in the message
        assert len(_jobs(c)) == before  # nothing was queued
        # a long but legal out is still accepted (and its job finishes)
        ok = c.post("/v1/jobs", json={"kind": "dedup", "config": config, "out": "/".join(["f" * name_max] * 3)})
        assert ok.status_code == 201, ok.text
        assert c.post(f"/v1/jobs/{ok.json()['id']}/cancel").status_code == 202
