"""The service against hostile requests, on a real `corpusmill serve` process and a real HTTP client.

A token holder must not reach files outside the data roots through links planted in a run
directory, must not get past the body limit by leaving out Content-Length, and must get a 422 naming
the key (never a 500, never a job that fails hours later) for text that is not valid Unicode or a
size out of every sane range. The service's token file lies outside the roots here, as it would in a
deployment, and is the file the links aim at.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.corpora import build_corpus
from tests.servers import BIN, HTTP_S, START_S, TOKEN, Server, follow, listening_addresses

LEAK = "LEAKED-31337"


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("hostile")
    build_corpus(base / "data" / "corpus")
    (base / "outside").mkdir()
    token_file = base / "outside" / "service-token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    return base


@pytest.fixture(scope="module")
def server(base):
    # 127.0.0.2 is loopback too (127/8): a dashboard address asked for is the one used
    srv = Server(base / "state", [base / "data"], "--token-file", str(base / "outside" / "service-token"),
                 "--dashboard-address", "127.0.0.2:0", token=None).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def dedup_job(server) -> dict:
    """A finished dedup job (it writes report.html and ledger.json like a run, in a fraction of the time)."""
    with server.client() as c:
        r = c.post("/v1/jobs", json={"kind": "dedup", "format": "jsonl",
                                     "config": {"input": {"paths": ["corpus"]}, "dedup": {"minhash": {"enabled": False}}}})
        assert r.status_code == 201, r.text
        final = follow(c, r.json()["id"])
    assert final["state"] == "succeeded", final["error"]
    return final


def post_raw(client: httpx.Client, body: bytes) -> httpx.Response:
    """POST a body as given: JSON text with escapes (a lone surrogate) that httpx's json= cannot send."""
    return client.post("/v1/jobs", content=body, headers={"content-type": "application/json"})


def jobs_with_out(client: httpx.Client, out: Path) -> list[dict]:
    return [j for j in client.get("/v1/jobs", params={"limit": 1000}).json()["jobs"] if j["out"] == str(out)]


def test_a_run_directory_holding_links_out_is_refused_at_submission(server, base):
    """`config.yaml` and `report.md` linked to files outside the roots, `report.html` to the token file, a
    stage folder linked out: no job is queued for such an `out` (resume or not), and the files stay as they were."""
    data, outside = base / "data", base / "outside"
    victims = {name: outside / f"victim-{name}" for name in ("config.yaml", "report.md")}
    for path in victims.values():
        path.write_text("not yours\n")
    planted = {
        "links-out": [("config.yaml", victims["config.yaml"]), ("report.md", victims["report.md"])],
        "token-link": [("report.html", outside / "service-token")],
        "folder-link": [("00-read", outside)],
    }
    with server.client() as c:
        for name, links in planted.items():
            out = data / name
            out.mkdir()
            for link, target in links:
                (out / link).symlink_to(target)
            for resume in (True, False):
                r = c.post("/v1/jobs", json={"kind": "run", "config": {"input": {"paths": ["corpus"]}}, "out": name,
                                             "resume": resume})
                assert r.status_code == 422, (name, resume, r.text)
                assert r.json()["keys"] == ["out"] and "symlink" in r.json()["detail"], r.text
                assert any(link in r.json()["detail"] for link, _ in links) and TOKEN not in r.text
            assert jobs_with_out(c, out) == []
        # a train job's shards folder is checked the same way (the trainer reads every file in it)
        shards = data / "shards-with-link"
        shards.mkdir()
        (shards / "manifest.json").write_text("{}")
        (shards / "rank0.mindrecord").symlink_to(victims["config.yaml"])
        r = c.post("/v1/jobs", json={"kind": "train", "config": {}, "shards": "shards-with-link"})
        assert r.status_code == 422 and r.json()["keys"] == ["shards"], r.text
    assert all(p.read_text() == "not yours\n" for p in victims.values())


def test_report_ledger_and_status_never_read_through_a_link(server, base, dedup_job):
    """After a job finished, its report.html, ledger.json, progress.json and a stage folder are swapped for
    links out of the roots (report.html to the service's token file): the API serves none of what they
    point at, and a resume of that run directory is refused."""
    out, outside = Path(dedup_job["out"]), base / "outside"
    job = dedup_job["id"]
    with server.client() as c:
        assert c.get(f"/v1/jobs/{job}/report").status_code == 200  # the real one, before
        (outside / "ledger.json").write_text(json.dumps({"input": 31337, "kept": 31337, "note": LEAK}))
        (outside / "progress.json").write_text(json.dumps({"state": "succeeded", "stages": {LEAK: {"state": "done"}}}))
        (outside / "fake-read").mkdir()
        (outside / "fake-read" / "_DONE.json").write_text(json.dumps({"stats": {"docs_in": 31337, "note": LEAK},
                                                                       "seconds": 31337}))
        for name, target in (("report.html", outside / "service-token"), ("ledger.json", outside / "ledger.json"),
                             ("progress.json", outside / "progress.json")):
            (out / f"{name}.tmp-link").symlink_to(target)
            os.replace(out / f"{name}.tmp-link", out / name)
        os.rename(out / "00-read", out / "00-read.real")
        (out / "00-read").symlink_to(outside / "fake-read", target_is_directory=True)

        report = c.get(f"/v1/jobs/{job}/report")
        assert report.status_code == 403 and TOKEN not in report.text, report.text
        ledger = c.get(f"/v1/jobs/{job}/ledger")
        assert ledger.status_code in (200, 404) and LEAK not in ledger.text and "31337" not in ledger.text
        status = c.get(f"/v1/jobs/{job}")
        assert status.status_code == 200 and LEAK not in status.text and "31337" not in status.text
        assert "read" not in [s["name"] for s in status.json()["stages"]]  # the linked stage folder reads as absent
        listed = c.get("/v1/jobs")
        assert listed.status_code == 200 and LEAK not in listed.text
        metrics = c.get("/metrics")
        assert metrics.status_code == 200 and "31337" not in metrics.text
        r = c.post("/v1/jobs", json={"kind": "dedup", "config": {"input": {"paths": ["corpus"]}}, "out": str(out),
                                     "resume": True})
        assert r.status_code == 422 and r.json()["keys"] == ["out"], r.text


def test_a_chunked_body_is_held_to_the_limit_as_it_arrives(server):
    """No Content-Length (Transfer-Encoding: chunked): 413 once the running total passes 1 MiB, without
    reading the other 199 MiB; a chunked body within the limit is read whole and validated as usual."""
    sent = 0

    def huge():
        nonlocal sent
        for _ in range(200):
            sent += 1 << 20
            yield b" " * (1 << 20)

    with server.client() as c:
        r = c.post("/v1/jobs", content=huge(), headers={"content-type": "application/json"})
        assert r.status_code == 413, r.text
        assert sent < 200 << 20, f"the whole body was sent ({sent >> 20} MiB): the server kept reading"
        request = json.dumps({"kind": "run", "config": {"pack": {"seq_length": 100_000_000_000}}}).encode()
        for size, expected in ((1 << 20, 422), ((1 << 20) + 1, 413)):
            body = request + b" " * (size - len(request))  # JSON allows trailing white space

            def pieces(body=body):
                for i in range(0, len(body), 7919):
                    yield body[i:i + 7919]

            r = c.post("/v1/jobs", content=pieces(), headers={"content-type": "application/json"})
            assert r.status_code == expected, (size, r.text)
            if expected == 422:
                assert r.json()["keys"] == ["config.pack.seq_length"]
        # a Content-Length over the limit is refused before the body is read
        r = c.post("/v1/jobs", content=b" " * ((1 << 20) + 1), headers={"content-type": "application/json"})
        assert r.status_code == 413
        assert c.get("/v1/health").status_code == 200


BAD_VALUES = [
    # (raw JSON body, the key the 422 must name)
    (rb'{"kind": "run", "config": {"input": {"paths": ["corpus\ud800"]}}}', "config.input.paths"),
    (rb'{"kind": "run", "config": {"input": {"paths": ["corpus"], "text_field": "\udcff"}}}', "config.input.text_field"),
    (rb'{"kind": "run", "config": {"input": {"paths": ["corpus"]}, "tokenizer": {"model": "m\ud800.model"}}}',
     "config.tokenizer.model"),
    (rb'{"kind": "run", "config": {"input": {"paths": ["corpus"]}}, "out": "run-\ud800"}', "out"),
    (rb'{"kind": "train", "config": {}, "shards": "\udfff"}', "shards"),
    (rb'{"kind": "run", "config": {"input": {"paths": ["corpus"], "\ud800": 1}}}', "config.input"),
    (rb'{"kind": "run", "config": {"input": {"paths": ["corpus"]}}, "\ud800": 1}', "body"),
    (rb'{"kind": "run", "config": {"input": {"paths": ["corpus"]}, "pack": {"seq_length": 100000000000}}}',
     "config.pack.seq_length"),
    (rb'{"kind": "run", "config": {"input": {"paths": ["corpus"]}, "shard": {"ranks": 1000000}}}', "config.shard.ranks"),
    (rb'{"kind": "run", "config": {"input": {"paths": ["corpus"]}, "shard": {"files_per_rank": 100000}}}',
     "config.shard.files_per_rank"),
    (rb'{"kind": "run", "config": {"input": {"paths": ["corpus"]}, "tokenizer": {"train": {"vocab_size": 2147483648}}}}',
     "config.tokenizer.train.vocab_size"),
    (rb'{"kind": "run", "config": {"input": {"paths": ["corpus"]}, "train": {"model": {"vocab_size": 2147483648}}}}',
     "config.train.model.vocab_size"),
    (rb'{"kind": "run", "config": {"input": {"paths": ["corpus"]}, "train": {"batch_size": 1000000000}}}',
     "config.train.batch_size"),
    (rb'{"kind": "run", "config": {"input": {"paths": ["corpus"]}, "train": {"steps": 1000000000000}}}', "config.train.steps"),
    (rb'{"kind": "run", "config": {"input": {"paths": ["corpus"]}, "train": {"num_parallel_workers": 1000000}}}',
     "config.train.num_parallel_workers"),
    (rb'{"kind": "run", "config": {"input": {"paths": ["corpus"]}, "cluster": {"n_workers": 1000000}}}',
     "config.cluster.n_workers"),
    (rb'{"kind": "run", "config": {"input": {"paths": ["corpus"], "part_size_mb": 1000000000}}}', "config.input.part_size_mb"),
    (rb'{"kind": "run", "config": {"input": {"paths": ["corpus"], "block_size_mb": Infinity}}}', "config.input.block_size_mb"),
    (rb'{"kind": "run", "config": {"input": {"paths": ["corpus"]}, "train": {"lr": NaN}}}', "config.train.lr"),
    (rb'{"kind": "run", "config": {"input": {"paths": ["corpus"]}, "dedup": {"minhash": {"num_perm": 10000000}}}}',
     "config.dedup.minhash.num_perm"),
    (rb'{"kind": "run", "config": {"input": {"paths": ["corpus"]}, "train": {"seed": -1}}}', "config.train.seed"),
    (b'{"kind": "run", "config": {"pack": {"seq_length": ' + b"9" * 5000 + b"}}}", "body"),
    (b"[" * 100_000 + b"]" * 100_000, "body"),
]


def test_text_that_is_not_unicode_and_sizes_out_of_range_are_422_naming_the_key(server):
    """A lone surrogate anywhere (a path, a field name, a key, out, shards), a size past its bound, a float
    that is not finite, JSON that cannot be decoded: a 422 with the key, whose body is valid JSON."""
    with server.client() as c:
        for body, key in BAD_VALUES:
            r = post_raw(c, body)
            assert r.status_code == 422, (body[:120], r.status_code, r.text)
            answer = r.json()
            assert key in answer["keys"], (key, answer)
            assert key.split(".")[-1] in answer["detail"], (key, answer)
        assert c.get("/v1/jobs", params={"state": "queued"}).json()["jobs"] == []


def test_the_cli_refuses_out_of_range_values_before_any_work(tmp_path, base):
    """The same bounds hold for a config file: one error naming the key, exit 2, no traceback, no run directory."""
    cases = {
        "input:\n  paths: [{corpus}]\npack:\n  seq_length: 100000000000\n": "pack.seq_length",
        "input:\n  paths: [{corpus}]\nshard:\n  ranks: 1000000\n": "shard.ranks",
        "input:\n  paths: [{corpus}]\ntokenizer:\n  train:\n    vocab_size: 4294967296\n": "tokenizer.train.vocab_size",
        'input:\n  paths: [{corpus}]\n  text_field: "\\ud800"\n': "input.text_field",
        "input:\n  paths: [{corpus}]\ntrain:\n  lr: .nan\n": "train.lr",
    }
    for i, (text, key) in enumerate(cases.items()):
        config = tmp_path / f"c{i}.yaml"
        config.write_text(text.replace("{corpus}", str(base / "data" / "corpus")))
        out = tmp_path / f"out{i}"
        r = subprocess.run([str(BIN / "corpusmill"), "run", str(config), "--out", str(out)], capture_output=True,
                           text=True, timeout=START_S, env={**os.environ, "PYTHONIOENCODING": "utf-8"})
        assert r.returncode == 2, (key, r.stdout[-2000:], r.stderr[-2000:])
        assert "Traceback" not in r.stderr and f"'{key}'" in r.stderr, (key, r.stderr)
        assert r.stderr.count("corpusmill: error:") == 1
        assert not out.exists()


def test_the_dashboard_address_asked_for_is_the_one_used(server, dedup_job):
    """`serve --dashboard-address 127.0.0.2:0`: the status names that address, and the dashboard listens there only."""
    if not Path("/proc/net/tcp").exists():
        pytest.skip("needs Linux's /proc/net/tcp")
    url = httpx.URL(dedup_job["dashboard"])
    assert url.host == "127.0.0.2"
    assert listening_addresses(url.port) == {"127.0.0.2"}
    assert httpx.get(str(url.copy_with(path="/health")), timeout=HTTP_S).status_code == 200


def test_links_planted_while_a_run_job_works_are_replaced_not_written_through(server, base):
    """Links to files outside the roots put into a running job's directory (after its first stage): the
    job writes its report and ledger by replacing the names (atomic rename), so the outside files are
    untouched and the run directory ends up holding regular files."""
    from tests.corpora import service_config
    from tests.servers import JOB_S, still_active, wait_until

    outside = base / "outside" / "mid-run"
    outside.mkdir()
    names = ("report.md", "report.html", "ledger.json")
    for name in names:
        (outside / name).write_text("not yours\n")
    with server.client() as c:
        r = c.post("/v1/jobs", json={"kind": "run", "config": service_config(base / "data" / "corpus"), "out": "mid-run"})
        assert r.status_code == 201, r.text
        out = Path(r.json()["out"])
        wait_until(lambda: still_active(c, r.json()["id"]) and (out / "00-read" / "_DONE.json").is_file(), JOB_S,
                   "the read stage to finish")
        for name in names:
            (out / name).symlink_to(outside / name)
        final = follow(c, r.json()["id"])
        assert final["state"] == "succeeded", final["error"]
        assert [(outside / n).read_text() for n in names] == ["not yours\n"] * 3
        assert not any((out / n).is_symlink() for n in names) and (out / "report.html").is_file()
        assert c.get(f"/v1/jobs/{final['id']}/report").status_code == 200


def test_safe_reads_refuse_links_fifos_and_dot_dot(tmp_path):
    """The reader the service uses for run-directory files: a link at any depth, a FIFO (which would block a
    plain open) or a '..' is refused; a missing file is FileNotFoundError; a regular file reads."""
    from corpusmill.pipeline.service.safefs import LinkRefused, find_link, read_bytes

    real, outside = tmp_path / "run", tmp_path / "outside"
    (real / "stage").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret").write_text("secret")
    (real / "stage" / "ok.json").write_text("{}")
    (real / "linked-dir").symlink_to(outside, target_is_directory=True)
    (real / "stage" / "link").symlink_to(outside / "secret")
    os.mkfifo(real / "fifo")
    assert read_bytes(real / "stage" / "ok.json") == b"{}"
    for path in (real / "linked-dir" / "secret", real / "stage" / "link", real / "fifo", real / "stage",
                 Path(str(real / "stage") + "/../stage/ok.json")):
        with pytest.raises(LinkRefused):
            read_bytes(path)
    with pytest.raises(FileNotFoundError):
        read_bytes(real / "stage" / "missing.json")
    assert find_link(real) in (str(real / "linked-dir"), str(real / "stage" / "link"))
    assert find_link(real / "stage") == str(real / "stage" / "link")
    assert find_link(outside) is None and find_link(tmp_path / "nowhere") is None


def test_serve_refuses_a_dashboard_address_it_cannot_use(tmp_path):
    """A malformed or unresolvable --dashboard-address is one line and exit 2, before any cluster starts."""
    env = {**os.environ, "CORPUSMILL_TOKEN": TOKEN}
    for address, why in (("nonsense:xx", "expected HOST:PORT"), ("8787", "expected HOST:PORT"),
                         ("no-such-host.invalid:0", "unknown host")):
        r = subprocess.run([str(BIN / "corpusmill"), "serve", "--state", str(tmp_path / "s"), "--data-root", str(tmp_path),
                            "--dashboard-address", address], env=env, capture_output=True, text=True, timeout=START_S)
        assert r.returncode == 2 and why in r.stderr and "Traceback" not in r.stderr, (address, r.stderr[-2000:])


def test_a_port_in_use_is_one_line_before_anything_is_started_or_announced(tmp_path):
    import socket

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        done = subprocess.run([str(BIN / "corpusmill"), "serve", "--port", str(port), "--state", str(tmp_path / "state"),
                               "--data-root", str(tmp_path)], capture_output=True, text=True, timeout=START_S,
                              env={**os.environ, "CORPUSMILL_TOKEN": TOKEN})
    finally:
        holder.close()
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"corpusmill: error: --port {port}: cannot listen on 127.0.0.1:{port}: Address already in use"
    assert "http://" not in done.stdout  # nothing was announced
