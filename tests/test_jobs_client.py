"""`corpusmill jobs ...` against a real `corpusmill serve` on a free loopback port, through its real command
line (`python -m corpusmill.pipeline.jobs_cli`, what `corpusmill jobs` runs).

A small dedup job is submitted, followed to its end (its progress lines, with ETA, as they are written),
looked at (status, list, log, report), and a long one and a queued one are cancelled. Every failure a
user can meet — a wrong or missing token, a server that is not there, an unknown job, a config the
service refuses — must be one line `corpusmill: error: ...` and exit code 2, with the token never shown.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.corpora import write_long_corpus, write_small_corpus
from tests.servers import HTTP_S, JOB_S, START_S, TOKEN, Server, free_port, wait_until

def jobs_cli(*args: str, server: str | None = None, token: str | None = TOKEN, cwd: Path | None = None,
             env: dict | None = None, timeout: float = HTTP_S) -> subprocess.CompletedProcess:
    """The real command line, in a clean environment: only the server and the token given here."""
    environ = {k: v for k, v in os.environ.items() if k not in ("CORPUSMILL_TOKEN", "CORPUSMILL_SERVER")}
    if server:
        environ["CORPUSMILL_SERVER"] = server
    if token:
        environ["CORPUSMILL_TOKEN"] = token
    environ.update(env or {})
    return subprocess.run([sys.executable, "-m", "corpusmill.pipeline.jobs_cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, env=environ)


def one_line_error(r: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit 2, nothing on stdout, one `corpusmill: error:` line on stderr holding every needle, no token."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stdout == "" and r.stderr.count("\n") == 1 and r.stderr.startswith("corpusmill: error: "), r.stderr
    for needle in needles:
        assert needle in r.stderr, (needle, r.stderr)
    assert TOKEN not in r.stderr and "Traceback" not in r.stderr
    return r.stderr


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("jobs-client") / "data"
    write_small_corpus(root / "corpus")
    write_long_corpus(root / "long")
    return root


@pytest.fixture(scope="module")
def server(data_root):
    srv = Server(data_root.parent / "state", [data_root], "--workers", "1", "--max-concurrent", "1").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def configs(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("configs")
    texts = {"small": "input:\n  paths: [corpus]\n  part_size_mb: 0.001\ndedup:\n  minhash:\n    enabled: true\n",
             "long": "input:\n  paths: [long]\n  part_size_mb: 1\n  block_size_mb: 1\n",
             "unknown_key": "input:\n  paths: [corpus]\nfilter:\n  lenght: 3\n",
             "outside": "input:\n  paths: [/etc/hostname]\n",
             "bad_yaml": "input:\n  paths: [corpus\n",
             "a_list": "- input\n"}
    for name, text in texts.items():
        (folder / f"{name}.yaml").write_text(text)
    return {name: folder / f"{name}.yaml" for name in texts}


@pytest.fixture(scope="module")
def finished(server, configs) -> dict:
    """A small dedup job submitted and followed to its end by the client."""
    r = jobs_cli("submit", str(configs["small"]), "--kind", "dedup", "--format", "jsonl", "-q", server=server.url)
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip()
    follow = jobs_cli("follow", job_id, server=server.url, timeout=JOB_S)
    return {"id": job_id, "follow": follow}


def test_submit_and_follow_a_job_to_its_end(server, finished):
    follow = finished["follow"]
    assert follow.returncode == 0, follow.stderr
    # the job's own progress lines, printed as the job wrote them: several read tasks, so an ETA
    assert "read (and dedup signatures): 4/4 tasks (100%)" in follow.stdout
    assert any("ETA" in line and "tasks" in line for line in follow.stdout.splitlines()), follow.stdout
    assert "== corpusmill dedup summary ==" in follow.stdout
    assert follow.stderr.splitlines()[-1] == f"corpusmill jobs: job {finished['id']} succeeded (exit code 0)"
    # every line of the job's log printed once, in order
    log = (server.state / "jobs" / finished["id"] / "job.log").read_text()
    assert [ln for ln in follow.stdout.splitlines() if ln.strip()] == [ln for ln in log.splitlines() if ln.strip()]


def test_status_list_log_and_report(server, finished, tmp_path):
    job_id = finished["id"]
    status = jobs_cli("status", job_id, "--json", server=server.url)
    doc = json.loads(status.stdout)
    assert doc["state"] == "succeeded" and doc["exit_code"] == 0 and doc["elapsed_s"] >= 0
    out = Path(doc["out"])
    ledger = json.loads((out / "ledger.json").read_text())
    text = jobs_cli("status", job_id, server=server.url).stdout
    assert "state:     succeeded" in text
    assert (f"documents: input {ledger['input']} = kept {ledger['kept']} + filtered {ledger['filtered']} + "
            f"duplicates {ledger['duplicates']} + quarantined {ledger['quarantined']}  (balanced)") in text
    assert ledger["duplicates"] > 0 and "read" in text and "near_dedup" in text
    listed = jobs_cli("list", server=server.url).stdout.splitlines()
    assert listed[0].split() == ["ID", "KIND", "STATE", "PROGRESS", "ETA", "ELAPSED", "SUBMITTED"]
    row = next(line.split() for line in listed if line.startswith(job_id))
    assert row[1:3] == ["dedup", "succeeded"]
    assert job_id in [j["id"] for j in json.loads(jobs_cli("list", "--state", "succeeded", "--json",
                                                           server=server.url).stdout)]
    log = jobs_cli("log", job_id, "--tail", "5", server=server.url)
    on_disk = (server.state / "jobs" / job_id / "job.log").read_text().splitlines()
    assert log.returncode == 0 and log.stdout.splitlines() == on_disk[-5:]
    # the report, byte for byte; --open hands the written file to $BROWSER
    target = tmp_path / "report.html"
    r = jobs_cli("report", job_id, "--out", str(target), server=server.url)
    assert r.returncode == 0, r.stderr
    assert target.read_bytes() == (out / "report.html").read_bytes() and b"<table" in target.read_bytes()
    assert jobs_cli("report", job_id, server=server.url).stdout.encode() == (out / "report.html").read_bytes()
    seen = tmp_path / "browser-was-given.txt"
    recorder = tmp_path / "browser.py"
    recorder.write_text(f"import sys\nopen({str(seen)!r}, 'w').write(sys.argv[1])\n")
    opened = tmp_path / "opened.html"
    r = jobs_cli("report", job_id, "--out", str(opened), "--open", server=server.url,
                 env={"BROWSER": f"{sys.executable} {recorder} %s"})
    assert r.returncode == 0, r.stderr
    wait_until(seen.exists, HTTP_S, "the browser command to run")
    assert seen.read_text() == opened.resolve().as_uri() and opened.read_bytes() == target.read_bytes()


def test_cancel_a_running_and_a_queued_job(server, configs, finished):
    # one job at a time (--max-concurrent 1): the long job runs, the small one waits behind it
    long_id = jobs_cli("submit", str(configs["long"]), "--kind", "dedup", "-q", server=server.url).stdout.strip()
    queued_id = jobs_cli("submit", str(configs["small"]), "--kind", "dedup", "-q", server=server.url).stdout.strip()

    def state(job_id: str) -> str:
        return json.loads(jobs_cli("status", job_id, "--json", server=server.url).stdout)["state"]

    assert state(queued_id) == "queued"
    r = jobs_cli("cancel", queued_id, server=server.url)
    assert r.returncode == 0 and r.stdout.strip() == f"job {queued_id} cancelled"
    wait_until(lambda: state(long_id) == "running", START_S, "the long job to start")
    listed = jobs_cli("list", "--state", "running", server=server.url).stdout
    assert long_id in listed
    r = jobs_cli("cancel", long_id, server=server.url)
    assert r.returncode == 0 and "cancel requested" in r.stdout, r.stderr
    follow = jobs_cli("follow", long_id, server=server.url, timeout=JOB_S)
    assert follow.returncode == 130, follow.stderr
    assert follow.stderr.splitlines()[-1].startswith(f"corpusmill jobs: job {long_id} cancelled")
    status = json.loads(jobs_cli("status", queued_id, "--json", server=server.url).stdout)
    assert status["state"] == "cancelled" and status["attempts"] == 0  # never started
    one_line_error(jobs_cli("cancel", queued_id, server=server.url), "conflict (409)", "already cancelled")
    assert jobs_cli("follow", queued_id, server=server.url).returncode == 130


def test_every_failure_is_one_line(server, configs, finished, tmp_path):
    url = server.url
    one_line_error(jobs_cli("list", server=url, token="a-wrong-token-0123456789"), "401", "the token given")
    one_line_error(jobs_cli("list", server=url, token=None, cwd=tmp_path), "401", "no token given")
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    r = jobs_cli("list", "--token-file", str(token_file), server=url, token=None, cwd=tmp_path)
    assert r.returncode == 0 and finished["id"] in r.stdout and TOKEN not in r.stdout
    one_line_error(jobs_cli("list", "--token-file", str(tmp_path / "nope"), server=url), "cannot read it")
    # the token `corpusmill serve` generates into its default state folder is found from the folder it ran in
    (tmp_path / ".corpusmill-service").mkdir()
    (tmp_path / ".corpusmill-service" / "token").write_text(TOKEN + "\n")
    assert jobs_cli("status", finished["id"], server=url, token=None, cwd=tmp_path).returncode == 0
    one_line_error(jobs_cli("status", "0123456789abcdef", server=url), "not found (404)", "no job 0123456789abcdef")
    one_line_error(jobs_cli("status", "<b>nope</b>", server=url), "is not a job id")
    one_line_error(jobs_cli("submit", str(configs["unknown_key"]), server=url), "invalid request (422)",
                   "config: unknown key 'filter.lenght'")
    one_line_error(jobs_cli("submit", str(configs["outside"]), "--kind", "dedup", server=url), "refused (403)", "/etc/hostname")
    one_line_error(jobs_cli("submit", str(configs["bad_yaml"]), server=url), "not valid YAML")
    one_line_error(jobs_cli("submit", str(configs["a_list"]), server=url), "a config is a mapping")
    one_line_error(jobs_cli("submit", str(tmp_path / "missing.yaml"), server=url), "no such file")
    one_line_error(jobs_cli("report", finished["id"], "--out", str(tmp_path / "no-such-dir" / "r.html"), server=url),
                   "cannot write it")
    one_line_error(jobs_cli("list", "--server", "ftp://example"), "expected http://HOST:PORT")


def test_a_server_that_is_not_there_is_one_line(tmp_path):
    port = free_port()  # nothing listens on it
    r = jobs_cli("list", "--server", f"http://127.0.0.1:{port}", cwd=tmp_path)
    one_line_error(r, f"cannot reach the service at http://127.0.0.1:{port}: connection refused")
    r = jobs_cli("follow", "0123456789abcdef", server=f"http://127.0.0.1:{port}", cwd=tmp_path)
    one_line_error(r, "connection refused")


def test_the_eta_comes_from_the_rate_tasks_were_seen_to_finish_at():
    """The API's eta_s, on a clock the test holds: as the CLI's progress line, the rate so far of this step."""
    from corpusmill.pipeline.service.status import StepRates

    rates = StepRates()
    assert rates.eta("j", "read", 0, 40, now=100.0) is None  # first sight of the step: no rate yet
    assert rates.eta("j", "read", 0, 40, now=102.0) is None  # no task finished since
    assert rates.eta("j", "read", 10, 40, now=105.0) == pytest.approx(15.0)  # 10 tasks in 5 s, 30 left
    assert rates.eta("j", "read", 40, 40, now=110.0) == 0.0
    assert rates.eta("j", "dedup: counting", 3, 9, now=111.0) is None  # a new step starts its own clock
    assert rates.eta("j", "dedup: counting", 6, 9, now=114.0) == pytest.approx(3.0)
    rates.forget("j")
    assert rates.eta("j", "dedup: counting", 7, 9, now=115.0) is None
