"""The job service against a real server on loopback, a real HTTP client, real Dask and real MindRecord.

Servers are `corpusmill serve` processes (so SIGKILL is a real kill), each with its own LocalCluster
or, in one test, a `dask scheduler` and two `dask worker` processes.

The suite must hold on a machine whose cores are busy with other work (load 10+): every wait is on a
condition with a generous deadline (minutes, not seconds), every port is one the OS handed out.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.corpora import build_corpus, service_config
from tests.servers import (BIN, HTTP_S, JOB_S, START_S, TOKEN, Server, follow, free_port, listening_addresses,
                           still_active, wait_until)

def comparable_manifest(out: Path) -> dict:
    manifest = json.loads((out / "shards" / "manifest.json").read_text())
    manifest.pop("created_utc")
    return manifest


def comparable_ledger(out: Path) -> dict:
    ledger = json.loads((out / "ledger.json").read_text())
    ledger.pop("run")
    return ledger


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("service") / "data"
    build_corpus(root / "corpus")
    (root / "elsewhere").mkdir()
    return root


@pytest.fixture(scope="module")
def server(data_root):
    srv = Server(data_root.parent / "state", [data_root], "--max-queued", "5").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def reference_job(server, data_root) -> dict:
    """A run job with training, followed to the end: the run every other test compares with."""
    with server.client() as c:
        cfg = service_config(data_root / "corpus", train={"enabled": True, "steps": 4})
        r = c.post("/v1/jobs", json={"kind": "run", "config": cfg})
        assert r.status_code == 201, r.text
        created = r.json()
        final = follow(c, created["id"])
    return {"id": created["id"], "out": Path(created["out"]), "status": final}


def test_submit_follow_and_fetch_a_job(server, reference_job):
    status = reference_job["status"]
    assert status["state"] == "succeeded", status["error"]
    assert status["exit_code"] == 0 and status["attempts"] == 1 and status["restarts"] == 0
    assert [s["name"] for s in status["stages"]] == ["read", "normalize", "filter", "exact_dedup", "near_dedup",
                                                     "tokenize", "pack", "shard", "train"]
    assert all(s["state"] == "done" and s["seconds"] is not None for s in status["stages"])
    assert status["stages"][0]["counts"]["docs_in"] == status["ledger"]["input"]
    ledger = status["ledger"]
    assert ledger["balanced"] and ledger["input"] == ledger["kept"] + ledger["filtered"] + ledger["duplicates"] + ledger["quarantined"]
    assert ledger["quarantined"] == 3 and ledger["duplicates"] > 0
    assert status["train"]["done"] and status["train"]["steps"] == 4
    assert status["dashboard"] and status["dashboard"].startswith("http://")
    assert reference_job["out"].parent == server.roots[0] / "jobs"
    with server.client() as c:
        report = c.get(f"/v1/jobs/{reference_job['id']}/report")
        assert report.status_code == 200 and report.headers["content-type"].startswith("text/html")
        assert "balanced" in report.text and "<table" in report.text
        assert c.get(f"/v1/jobs/{reference_job['id']}/ledger").json() == json.loads((reference_job["out"] / "ledger.json").read_text())
        log = c.get(f"/v1/jobs/{reference_job['id']}/log", params={"tail": 50}).text
        assert "corpusmill summary" in log
        listed = c.get("/v1/jobs", params={"state": "succeeded"}).json()["jobs"]
        assert reference_job["id"] in [j["id"] for j in listed]
        metrics = c.get("/metrics").text
    assert 'corpusmill_jobs{state="succeeded"}' in metrics
    values = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines() if line and not line.startswith("#")}
    assert values["corpusmill_documents_processed_total"] >= ledger["input"]
    assert values["corpusmill_tokens_processed_total"] >= ledger["tokens"] > 0
    assert values['corpusmill_stage_seconds_total{stage="tokenize"}'] > 0
    # the job's shards are real MindRecord files a stock reader takes
    import mindspore.dataset as ds

    manifest = json.loads((reference_job["out"] / "shards" / "manifest.json").read_text())
    first = manifest["files"][0]
    data = ds.MindDataset([str(reference_job["out"] / "shards" / first["path"])], columns_list=["input_ids"], shuffle=False)
    assert data.get_dataset_size() == first["samples"]


def test_the_dask_dashboard_listens_on_loopback_only(server, reference_job):
    """The dashboard has no authentication: the status names it on 127.0.0.1, and nothing listens on its
    port beyond loopback (no 0.0.0.0, no ::)."""
    if not Path("/proc/net/tcp").exists():
        pytest.skip("needs Linux's /proc/net/tcp")
    with server.client() as c:
        link = c.get(f"/v1/jobs/{reference_job['id']}").json()["dashboard"]
    url = httpx.URL(link)
    assert url.host == "127.0.0.1", link
    assert listening_addresses(url.port) == {"127.0.0.1"}
    assert httpx.get(str(url.copy_with(path="/health")), timeout=HTTP_S).status_code == 200  # it is the dashboard's server


def test_every_endpoint_but_health_needs_the_token(server, reference_job):
    job = reference_job["id"]
    calls = [("get", "/v1/jobs"), ("get", f"/v1/jobs/{job}"), ("get", f"/v1/jobs/{job}/report"),
             ("get", f"/v1/jobs/{job}/ledger"), ("get", f"/v1/jobs/{job}/log"), ("post", f"/v1/jobs/{job}/cancel"),
             ("get", "/metrics"), ("post", "/v1/jobs")]
    for token in (None, "wrong-token-0123456789abcdef", TOKEN[:-1], TOKEN + "x", ""):
        with server.client(token) as c:
            for method, path in calls:
                r = c.request(method, path, json={"kind": "run", "config": {}} if method == "post" else None)
                assert r.status_code == 401, (token, path, r.status_code)
                assert r.headers["www-authenticate"] == "Bearer"
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Basic {TOKEN}"}) as c:
        assert c.get("/v1/jobs").status_code == 401
    assert httpx.get(server.url + "/v1/health").status_code == 200


def test_paths_outside_the_data_roots_are_refused(server, data_root, tmp_path):
    outside = tmp_path / "outside"
    build_corpus(outside)
    (data_root / "link-out").symlink_to(outside, target_is_directory=True)
    base = service_config(data_root / "corpus")
    cases = [
        ("config.input.paths", {**base, "input": {**base["input"], "paths": [str(outside)]}}, {}),
        ("config.input.paths", {**base, "input": {**base["input"], "paths": ["../" + outside.parent.name + "/outside"]}}, {}),
        ("config.input.paths", {**base, "input": {**base["input"], "paths": ["corpus/../../" + data_root.parent.name]}}, {}),
        ("config.input.paths", {**base, "input": {**base["input"], "paths": ["link-out"]}}, {}),
        ("config.input.paths", {**base, "input": {**base["input"], "paths": ["link-*/*.jsonl"]}}, {}),
        ("config.tokenizer.model", {**base, "tokenizer": {"model": "/etc/hostname"}}, {}),
        ("config.filter.classifiers[0].model",
         {**base, "filter": {"classifiers": [{"name": "hq", "model": "/etc/hostname", "min_score": 0.5}]}}, {}),
        ("out", base, {"out": str(tmp_path / "run")}),
        ("out", base, {"out": "../elsewhere-out"}),
        ("out", base, {"out": str(data_root)}),
    ]
    with server.client() as c:
        for key, cfg, extra in cases:
            r = c.post("/v1/jobs", json={"kind": "run", "config": cfg, **extra})
            assert r.status_code == 403, (key, r.text)
            assert r.json()["keys"] == [key], r.text
        r = c.post("/v1/jobs", json={"kind": "train", "config": {}, "shards": str(outside)})
        assert r.status_code == 403 and r.json()["keys"] == ["shards"]
        assert c.get("/v1/jobs", params={"state": "queued"}).json()["jobs"] == []


def test_bad_requests_get_422_naming_the_key(server, data_root, reference_job):
    base = service_config(data_root / "corpus")
    cases = [
        ({"kind": "run", "config": {**base, "filter": {"lenght": {"min_chars": 3}}}}, "config.filter.lenght"),
        ({"kind": "run", "config": {**base, "pack": {"seq_length": -5}}}, "config.pack.seq_length"),
        ({"kind": "run", "config": {**base, "cluster": {"address": "tcp://10.1.2.3:8786"}}}, "config.cluster.address"),
        ({"kind": "run", "config": {**base, "input": {"paths": ["no-such-folder"]}}}, "config.input.paths"),
        ({"kind": "run", "config": {**base, "input": {"paths": []}}}, "config.input.paths"),
        ({"kind": "bake", "config": base}, "kind"),
        ({"kind": "run", "config": base, "colour": "red"}, "colour"),
        ({"kind": "train", "config": {}}, "shards"),
        ({"kind": "train", "config": {}, "shards": "corpus"}, "shards"),
        ({"kind": "run", "config": base, "shards": "corpus"}, "shards"),
        ({"kind": "run", "config": "not a mapping"}, "config"),
    ]
    with server.client() as c:
        for body, key in cases:
            r = c.post("/v1/jobs", json=body)
            assert r.status_code == 422, (body, r.text)
            assert key in r.json()["keys"], (key, r.text)
            assert key.split(".")[-1] in r.json()["detail"]
        r = c.post("/v1/jobs", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 422
        # an out that already holds a run is not overwritten unless resume is asked for
        r = c.post("/v1/jobs", json={"kind": "run", "config": base, "out": str(reference_job["out"])})
        assert r.status_code == 409 and r.json()["keys"] == ["out"]
        assert c.get("/v1/jobs/0123456789abcdef").status_code == 404
        assert c.get("/v1/jobs/not-an-id").status_code == 422
        assert c.post(f"/v1/jobs/{reference_job['id']}/cancel").status_code == 409


@pytest.mark.slow
def test_cancel_a_running_and_a_queued_job(server, data_root, reference_job, tmp_path_factory):
    cfg = service_config(data_root / "corpus", train={"enabled": True, "steps": 5000})
    with server.client() as c:
        running = c.post("/v1/jobs", json={"kind": "run", "config": cfg}).json()["id"]
        queued = c.post("/v1/jobs", json={"kind": "run", "config": cfg}).json()["id"]
        assert c.get(f"/v1/jobs/{queued}").json()["state"] == "queued"  # one job at a time
        r = c.post(f"/v1/jobs/{queued}/cancel")
        assert r.status_code == 202 and r.json()["state"] == "cancelled"

        def training():
            s = still_active(c, running)
            return s["state"] == "running" and s["train"] and s["train"].get("step", 0) >= 2

        wait_until(training, JOB_S, "the job to be training")
        # the queue is bounded (--max-queued 5): the sixth waiting job is refused, nothing is lost
        waiting = [c.post("/v1/jobs", json={"kind": "run", "config": cfg}) for _ in range(6)]
        assert [r.status_code for r in waiting] == [201] * 5 + [429], [r.text for r in waiting]
        for r in waiting[:5]:
            assert c.post(f"/v1/jobs/{r.json()['id']}/cancel").json()["state"] == "cancelled"
        # a job accepted while its input was a real folder, which became a link out of the roots while it waited
        swap = data_root / "swap"
        shutil.copytree(data_root / "corpus", swap)
        swapped = c.post("/v1/jobs", json={"kind": "run", "config": {**cfg, "input": {"paths": ["swap"]}}}).json()["id"]
        shutil.rmtree(swap)
        swap.symlink_to(tmp_path_factory.mktemp("outside"), target_is_directory=True)
        # a job whose run directory gets a link out of the roots while it waits: refused when it starts
        planted = c.post("/v1/jobs", json={"kind": "run", "config": cfg, "out": "planted-later"}).json()
        victim = tmp_path_factory.mktemp("victim") / "notes.md"
        victim.write_text("keep me\n")
        Path(planted["out"]).mkdir(parents=True)
        (Path(planted["out"]) / "report.md").symlink_to(victim)
        r = c.post(f"/v1/jobs/{running}/cancel")
        assert r.status_code == 202 and r.json()["cancel_requested"]
        final = follow(c, running, timeout=START_S)
        assert final["state"] == "cancelled"
        assert final["train"]["step"] < 5000
        assert [s["state"] for s in final["stages"]][-1] == "interrupted"
        assert follow(c, queued, timeout=HTTP_S)["attempts"] == 0  # never started
        refused = follow(c, swapped, timeout=START_S)
        assert refused["state"] == "failed" and "refused at start" in refused["error"] and "swap" in refused["error"]
        refused = follow(c, planted["id"], timeout=START_S)
        assert refused["state"] == "failed" and "refused at start" in refused["error"] and "report.md" in refused["error"]
        assert refused["attempts"] == 1 and victim.read_text() == "keep me\n"
        metrics = c.get("/metrics").text
    cancelled = [ln for ln in metrics.splitlines() if ln.startswith('corpusmill_jobs{state="cancelled"}')]
    assert float(cancelled[0].split()[1]) >= 2


@pytest.mark.slow
def test_service_killed_mid_job_resumes_it_to_the_same_shards(data_root, reference_job, tmp_path):
    state = tmp_path / "state"
    srv = Server(state, [data_root]).start()
    try:
        # no training: what is killed and resumed is the pipeline (a trainer's own resume: test_train)
        cfg = service_config(data_root / "corpus", train={"enabled": False, "steps": 4})
        with srv.client() as c:
            created = c.post("/v1/jobs", json={"kind": "run", "config": cfg, "out": "killed-run"}).json()
            out = Path(created["out"])
            wait_until(lambda: still_active(c, created["id"]) and (out / "02-filter" / "_DONE.json").is_file(), JOB_S,
                       "the filter stage to finish")
        job_pid = json.loads((out / "progress.json").read_text())["pid"]
        srv.proc.send_signal(signal.SIGKILL)
        srv.proc.wait()
        srv.log.close()
        # the job process dies with the service (PR_SET_PDEATHSIG)
        wait_until(lambda: not Path(f"/proc/{job_pid}").exists() or "zombie" in _proc_state(job_pid), HTTP_S,
                   "the job process to die with the service")
        assert not (out / "shards" / "manifest.json").exists()
        srv = Server(state, [data_root]).start()
        with srv.client() as c:
            final = follow(c, created["id"])
    finally:
        srv.stop()
    assert final["state"] == "succeeded", final["error"]
    assert final["restarts"] == 1 and final["attempts"] == 2
    ledger = json.loads((out / "ledger.json").read_text())
    assert {"read", "normalize", "filter"} <= set(ledger["run"]["resumed_stages"])
    assert comparable_manifest(out) == comparable_manifest(reference_job["out"])
    assert comparable_ledger(out) == comparable_ledger(reference_job["out"])


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return "zombie"


@pytest.mark.slow
def test_jobs_run_on_a_real_dask_scheduler_and_workers(data_root, reference_job, tmp_path):
    """`dask scheduler` + two `dask worker` processes on loopback: the same shards and ledger as a LocalCluster run."""
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    procs = [subprocess.Popen([str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--dashboard-address", "127.0.0.1:0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        from distributed import Client

        wait_until(lambda: _reachable(port), START_S, "the dask scheduler")
        for _ in range(2):
            procs.append(subprocess.Popen([str(BIN / "dask"), "worker", address, "--nworkers", "1", "--nthreads", "1",
                                           "--no-dashboard"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        with Client(address, timeout=f"{HTTP_S}s") as client:
            client.wait_for_workers(2, timeout=START_S)
        srv = Server(tmp_path / "state", [data_root], "--scheduler", address).start()
        try:
            # no training: the trainer runs in the job process, not on the cluster's workers
            cfg = service_config(data_root / "corpus", train={"enabled": False, "steps": 4})
            with srv.client() as c:
                created = c.post("/v1/jobs", json={"kind": "run", "config": cfg}).json()
                final = follow(c, created["id"])
        finally:
            srv.stop()
        assert final["state"] == "succeeded", final["error"]
        assert final["dashboard"] and final["dashboard"].startswith("http://")
        out = Path(created["out"])
        assert "engine: connected to " + address in (tmp_path / "state" / "jobs" / created["id"] / "job.log").read_text()
        assert comparable_manifest(out) == comparable_manifest(reference_job["out"])
        assert comparable_ledger(out) == comparable_ledger(reference_job["out"])
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=HTTP_S)
            except subprocess.TimeoutExpired:
                p.kill()


def _reachable(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_refuses_a_public_address_without_a_token_and_a_short_token(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "CORPUSMILL_TOKEN"}
    r = subprocess.run([str(BIN / "corpusmill"), "serve", "--host", "0.0.0.0", "--state", str(tmp_path / "s"),
                        "--data-root", str(tmp_path)], env=env, capture_output=True, text=True, timeout=START_S)
    assert r.returncode == 2 and "without a token" in r.stderr
    r = subprocess.run([str(BIN / "corpusmill"), "serve", "--state", str(tmp_path / "s"), "--data-root", str(tmp_path)],
                       env={**env, "CORPUSMILL_TOKEN": "short"}, capture_output=True, text=True, timeout=START_S)
    assert r.returncode == 2 and "at least 16" in r.stderr
    (tmp_path / "empty-token").write_text("\n")
    r = subprocess.run([str(BIN / "corpusmill"), "serve", "--state", str(tmp_path / "s"), "--data-root", str(tmp_path),
                        "--token-file", str(tmp_path / "empty-token")], env=env, capture_output=True, text=True, timeout=START_S)
    assert r.returncode == 2 and "is empty" in r.stderr
    r = subprocess.run([str(BIN / "corpusmill"), "serve", "--help"], capture_output=True, text=True, timeout=START_S)
    assert "--token" not in r.stdout.replace("--token-file", "")  # no way to pass the token itself as an argument


def test_fuzzing_the_api_from_its_openapi_document_gives_no_server_error(server, reference_job, tmp_path):
    if shutil.which("st", path=str(BIN)) is None:
        pytest.skip("schemathesis is not installed (pip install -e '.[test]')")
    # the job-id operations get a real job (else they would only ever see 404)
    (tmp_path / "schemathesis.toml").write_text(f'[parameters]\n"path.job_id" = "{reference_job["id"]}"\n')
    checks = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"
    r = subprocess.run([str(BIN / "st"), "run", server.url + "/openapi.json", "--checks", checks,
                        "-H", f"Authorization: Bearer {TOKEN}", "--max-examples", "25", "--workers", "1",
                        "--phases", "examples,coverage,fuzzing", "--seed", "1"],
                       capture_output=True, text=True, timeout=3 * JOB_S, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    with server.client() as c:
        assert c.get("/v1/health").status_code == 200
        assert all(j["state"] != "failed" or j["error"] for j in c.get("/v1/jobs").json()["jobs"])


def _string_fields(model, prefix=()):
    """Every leaf field of the config models whose type can hold a string."""
    import typing

    from pydantic import BaseModel

    for name, field in model.model_fields.items():
        if field.exclude:
            continue
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from _string_fields(ann, prefix + (name,))
        elif "str" in repr(ann) or "Literal" in repr(ann) or ann is str:
            yield prefix + (name,)
        elif typing.get_origin(ann) is not None and any(a is str for a in typing.get_args(ann)):
            yield prefix + (name,)


def test_every_string_option_of_the_config_is_classed_as_path_or_not():
    """A new option naming a file must be added to the guard's PATH_FIELDS, or the service would not check it."""
    from corpusmill.pipeline.config import Config
    from corpusmill.pipeline.service.guard import NOT_PATHS, PATH_FIELDS

    fields = set(_string_fields(Config))
    unclassified = fields - set(PATH_FIELDS) - NOT_PATHS
    assert not unclassified, f"classify these config options in pipeline/service/guard.py: {sorted(unclassified)}"
    assert set(PATH_FIELDS) <= fields and NOT_PATHS <= fields  # no stale entries


def test_data_roots_resolve_symlinks_dotdot_and_keep_the_state_folder_out(tmp_path):
    from corpusmill.pipeline.service.guard import DataRoots, PathRefused

    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "state").mkdir(parents=True)
    (root / "docs").mkdir()
    outside.mkdir()
    (root / "docs" / "a.jsonl").write_text('{"text": "x"}\n')
    (outside / "b.jsonl").write_text('{"text": "y"}\n')
    (root / "docs" / "sneaky.jsonl").symlink_to(outside / "b.jsonl")
    roots = DataRoots([str(root)], forbidden=[str(root / "state")])
    assert roots.resolve("k", "docs/a.jsonl") == str(root / "docs" / "a.jsonl")
    assert roots.resolve("k", "docs/../docs/a.jsonl") == str(root / "docs" / "a.jsonl")
    for bad in ("../outside/b.jsonl", str(outside), "docs/sneaky.jsonl", "state/jobs.db", "docs/../state", "/"):
        with pytest.raises(PathRefused):
            roots.resolve("k", bad)
    with pytest.raises(PathRefused, match="sneaky"):  # a folder inside the root holding a link out of it
        roots.resolve_inputs("config.input.paths", ["docs"])
    with pytest.raises(PathRefused):
        roots.resolve_inputs("config.input.paths", ["docs/*.jsonl"])
    (root / "docs" / "sneaky.jsonl").unlink()
    assert roots.resolve_inputs("config.input.paths", ["docs/*.jsonl"]) == [str(root / "docs" / "*.jsonl")]
    with pytest.raises(PathRefused, match="data root itself"):
        roots.out_dir("out", str(root), "unused")


@pytest.mark.slow
def test_dedup_and_train_jobs(server, data_root, reference_job):
    """The other two kinds: a batch dedup job (kept/ and removed/ as the CLI writes them) and a train job on shards."""
    with server.client() as c:
        cfg = {"input": {"paths": ["corpus"]}, "dedup": {"minhash": {"enabled": True}}}
        dedup = c.post("/v1/jobs", json={"kind": "dedup", "config": cfg, "format": "jsonl"}).json()
        train = c.post("/v1/jobs", json={"kind": "train", "shards": str(reference_job["out"] / "shards"),
                                         "config": {"train": {"steps": 3, "batch_size": 4,
                                                              "model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2}}}})
        assert train.status_code == 201, train.text
        d, t = follow(c, dedup["id"]), follow(c, train.json()["id"])
        assert d["state"] == "succeeded", d["error"]
        assert [s["name"] for s in d["stages"]] == ["read", "exact_dedup", "near_dedup", "export"]
        ledger = c.get(f"/v1/jobs/{dedup['id']}/ledger").json()
        assert ledger["input"] == ledger["kept"] + ledger["duplicates"] + ledger["quarantined"] and ledger["duplicates"] > 0
        out = Path(dedup["out"])
        assert sum(1 for f in (out / "kept").glob("*.jsonl") for _ in open(f)) == ledger["kept"]
        assert t["state"] == "succeeded", t["error"]
        assert t["stage"] is None and t["train"]["done"] and t["train"]["steps"] == 3
        assert [(s["name"], s["state"]) for s in t["stages"]] == [("train", "done")]
        assert c.get(f"/v1/jobs/{t['id']}/ledger").json()["steps"] == 3
        assert c.get(f"/v1/jobs/{t['id']}/report").status_code == 404


def test_the_token_can_come_from_a_file(data_root, tmp_path):
    """What the Docker image does: --token-file (a compose secret), nothing in the environment."""
    token_file = data_root / "service-token"  # inside the data root, yet never readable by a job
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    srv = Server(tmp_path / "state", [data_root], "--token-file", str(token_file), token=None).start()
    try:
        with srv.client() as c:
            assert c.get("/v1/jobs").status_code == 200
            r = c.post("/v1/jobs", json={"kind": "run", "config": {"input": {"paths": [str(token_file)]}}})
            assert r.status_code == 403 and "belongs to the service" in r.json()["detail"]
        with srv.client("another-token-0123456789") as c:
            assert c.get("/v1/jobs").status_code == 401
    finally:
        srv.stop()
        token_file.unlink()
