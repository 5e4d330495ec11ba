"""The job service with object-storage data roots, against a real S3 server (the `seaweedfs` fixture of
tests/conftest.py) and a real `corpusmill serve` process.

One run job reads `s3://corpus/in/*.jsonl` (inside the URL root `s3://corpus/in`) and publishes to
`s3://corpus/out/job1` (inside `s3://corpus/out`), its run directory local under STATE/work/. While it
runs, hostile requests are refused as local paths are: 403 for a bucket, a sibling prefix or a glob
outside the roots, 422 for a URL that is not plain (`..`, credentials, a query) — and no job is queued
for any of them. Neither the service's log nor anything the API answers holds a credential.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tests.corpora import build_corpus, e2e_config
from tests.servers import Server, follow

IN_ROOT, OUT_ROOT = "s3://corpus/in", "s3://corpus/out"


@pytest.fixture(scope="module")
def objects(seaweedfs, tmp_path_factory) -> dict:
    """The test corpus's JSONL files under corpus/in/, a copy under the sibling prefix corpus/in2/
    (outside the root) and one in another bucket."""
    fs = seaweedfs["fs"]
    local = tmp_path_factory.mktemp("svc-s3") / "corpus"
    build_corpus(local)
    (local / "b.jsonl").write_bytes(gzip.decompress((local / "b.jsonl.gz").read_bytes()))  # the copies, plain
    names = ["a.jsonl", "b.jsonl"]
    for name in names:
        fs.put_file(str(local / name), f"corpus/in/{name}")
        fs.put_file(str(local / name), f"corpus/in2/{name}")
    fs.mkdir("elsewhere")
    fs.pipe("elsewhere/in/a.jsonl", (local / "a.jsonl").read_bytes())
    return {"names": names, "local": local}


@pytest.fixture(scope="module")
def server(seaweedfs, objects, tmp_path_factory):
    """`corpusmill serve` with a folder root and two URL roots; the AWS_* environment is the server's own."""
    base = tmp_path_factory.mktemp("svc-s3-server")
    (base / "data").mkdir()
    srv = Server(base / "state", [base / "data", IN_ROOT, OUT_ROOT]).start()  # type: ignore[list-item]
    yield srv
    srv.stop()


def _config(paths: list[str]) -> dict:
    cfg = e2e_config(Path("unused"), input={"paths": paths, "part_size_mb": 0.02, "block_size_mb": 0.04},
                     shard={"ranks": 2, "files_per_rank": 1})
    cfg["train"]["enabled"] = False
    return cfg


def _job_ids(client) -> set[str]:
    return {j["id"] for j in client.get("/v1/jobs", params={"limit": 1000}).json()["jobs"]}


# (what, request body changes, expected status, the key the error names)
HOSTILE = [
    ("input in another bucket", {"paths": ["s3://elsewhere/in/*.jsonl"]}, 403, "config.input.paths"),
    ("input under a sibling prefix", {"paths": ["s3://corpus/in2/*.jsonl"]}, 403, "config.input.paths"),
    ("a glob whose fixed part leaves the root", {"paths": ["s3://corpus/i*/a.jsonl"]}, 403, "config.input.paths"),
    ("a glob on the root's own name", {"paths": ["s3://corpus/in*"]}, 403, "config.input.paths"),
    ("another scheme for the same bucket", {"paths": ["s3a://corpus/in/a.jsonl"]}, 403, "config.input.paths"),
    ("dot-dot out of the root", {"paths": ["s3://corpus/in/../in2/a.jsonl"]}, 422, "config.input.paths"),
    ("an empty segment", {"paths": ["s3://corpus/in//a.jsonl"]}, 422, "config.input.paths"),
    ("credentials in the URL", {"paths": ["s3://AKIAFAKE:sekrit-in-url@corpus/in/a.jsonl"]}, 422, "config.input.paths"),
    ("a version query", {"paths": ["s3://corpus/in/a.jsonl?versionId=sekrit-in-url"]}, 422, "config.input.paths"),
    ("out in another bucket", {"out": "s3://elsewhere/out/j"}, 403, "out"),
    ("out under a sibling prefix", {"out": "s3://corpus/out2/j"}, 403, "out"),
    ("out is the root itself", {"out": OUT_ROOT}, 403, "out"),
    ("out with dot-dot", {"out": "s3://corpus/out/../in/j"}, 422, "out"),
    ("out with credentials", {"out": "s3://AKIAFAKE:sekrit-in-url@corpus/out/j"}, 422, "out"),
    ("work without a URL out", {"work": "w"}, 422, "work"),
    ("a tokenizer model from object storage", {"tokenizer": "s3://corpus/in/a.jsonl"}, 403, "config.tokenizer.model"),
]


def _hostile_body(change: dict) -> dict:
    body = {"kind": "run", "config": _config(change.get("paths", [f"{IN_ROOT}/*.jsonl"])), "out": change.get("out", "")}
    if not body["out"]:
        body.pop("out")
    if "work" in change:
        body["work"] = change["work"]
    if "tokenizer" in change:
        body["config"]["tokenizer"] = {"model": change["tokenizer"]}
    return body


def test_a_job_reads_and_publishes_inside_the_url_roots_and_nothing_else_passes(server, seaweedfs, objects):
    fs = seaweedfs["fs"]
    with server.client() as c:
        r = c.post("/v1/jobs", json={"kind": "run", "config": _config([f"{IN_ROOT}/*.jsonl"]), "out": f"{OUT_ROOT}/job1"})
        assert r.status_code == 201, r.text
        created = r.json()
        assert created["out"] == f"{OUT_ROOT}/job1"
        work = Path(created["work"])
        assert work.parent == (server.state / "work").resolve()  # the run directory stays local, in the service's state
        # while it runs: every hostile request refused, one line naming the field, no job queued
        before = _job_ids(c)
        for what, change, status, key in HOSTILE:
            r = c.post("/v1/jobs", json=_hostile_body(change))
            assert r.status_code == status, (what, r.status_code, r.text)
            body = r.json()
            assert body["keys"] == [key] and body["detail"].startswith(key + ":"), (what, r.text)
            assert "\n" not in body["detail"] and "sekrit-in-url" not in r.text, (what, r.text)
        # the same URL again while the first job writes there: a conflict
        r = c.post("/v1/jobs", json={"kind": "dedup", "config": _config([f"{IN_ROOT}/a.jsonl"]), "out": f"{OUT_ROOT}/job1",
                                     "resume": True})
        assert r.status_code == 409 and r.json()["keys"] == ["out"] and "already writing" in r.text, r.text
        assert _job_ids(c) == before
        final = follow(c, created["id"])
        assert final["state"] == "succeeded", final["error"]
        assert final["out"] == f"{OUT_ROOT}/job1" and final["work"] == str(work)
        ledger = final["ledger"]
        assert ledger["balanced"] and ledger["quarantined"] == 3 and ledger["duplicates"] > 0
        request = c.get(f"/v1/jobs/{created['id']}/request").json()
        assert request["config"]["input"]["paths"] == [f"{IN_ROOT}/*.jsonl"]
        assert c.get(f"/v1/jobs/{created['id']}/report").status_code == 200  # read from the local run directory
        # the results were published, the manifest last, and match the run directory's files
        manifest = json.loads(fs.cat("corpus/out/job1/shards/manifest.json"))
        assert manifest["files"] and manifest == json.loads((work / "shards" / "manifest.json").read_text())
        assert json.loads(fs.cat("corpus/out/job1/ledger.json"))["input"] == final["ledger"]["input"]
        # a finished URL out holds objects: a new job there without resume is refused, as a full run directory is
        r = c.post("/v1/jobs", json={"kind": "run", "config": _config([f"{IN_ROOT}/*.jsonl"]), "out": f"{OUT_ROOT}/job1"})
        assert r.status_code == 409 and r.json()["keys"] == ["out"] and "already holds" in r.text, r.text
        log = c.get(f"/v1/jobs/{created['id']}/log", params={"tail": 100000}).text
        assert "published to s3://corpus/out/job1" in log
        answers = log + json.dumps(request) + c.get("/v1/jobs").text + c.get("/metrics").text
    for secret in (seaweedfs["secret_key"], seaweedfs["access_key"]):
        assert secret not in answers and secret not in server.read_log()


def test_prefixes_stop_at_a_slash_and_every_listed_object_is_checked(seaweedfs, objects, tmp_path):
    """In this process, with the server's environment: a root's prefix named without a slash lists
    only below it (not the sibling in2/), and an object a glob finds is refused when its key is not
    plain, though the pattern was."""
    from corpusmill.pipeline.service.guard import DataRoots, UrlRefused
    from corpusmill.stages.read import expand_inputs

    roots = DataRoots([IN_ROOT])
    assert roots.resolve_inputs("config.input.paths", [IN_ROOT]) == [IN_ROOT]
    assert sorted(u.rsplit("/", 1)[1] for u in expand_inputs([IN_ROOT])) == objects["names"]
    seaweedfs["fs"].pipe("corpus/in/odd/x%2e%2e.jsonl", b'{"text": "odd"}\n')
    try:
        with pytest.raises(UrlRefused, match="percent-encoded"):
            roots.resolve_inputs("config.input.paths", [f"{IN_ROOT}/odd/*.jsonl"])
    finally:
        seaweedfs["fs"].rm("corpus/in/odd/x%2e%2e.jsonl")


def test_url_roots_are_checked_when_the_service_starts(tmp_path):
    from corpusmill.pipeline.service.guard import DataRoots

    for bad, said in (("s3://key:secret@corpus/in", "credentials"), ("s3://corpus/in/*", "not a glob"),
                      ("s3://corpus/a/../b", "'..'"), ("s3://corpus/in?versionId=1", "query")):
        with pytest.raises(ValueError, match=said) as e:
            DataRoots([bad])
        assert "secret@" not in str(e.value)
    roots = DataRoots([str(tmp_path), "s3://corpus/in/"])
    assert roots.roots == [str(tmp_path.resolve()), "s3://corpus/in"]
    # a URL first: jobs without `out` publish under it; relative paths and a train job's output stay in the folder
    roots = DataRoots(["s3://corpus/out", str(tmp_path)])
    assert roots.default_out("j1") == "s3://corpus/out/jobs/j1"
    assert roots.default_out("j1", local=True) == str(tmp_path.resolve() / "jobs" / "j1")
    (tmp_path / "tok.model").write_text("x")
    assert roots.resolve("config.tokenizer.model", "tok.model") == str(tmp_path.resolve() / "tok.model")
