"""A real `corpusmill serve` process on a port the OS hands out, and the waits the service tests
share: every wait is on a condition with a generous deadline (the suite must hold on a busy machine)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

TOKEN = "test-token-0123456789abcdef"
BIN = Path(sys.executable).parent
# deadlines: far above what a quiet machine needs, so a loaded one (load 10+ on 2 cores) still passes
START_S = 300  # a service (and its LocalCluster) to answer
JOB_S = 1200  # a small run job with training to finish
HTTP_S = 120  # one request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout: float, what: str, interval: float = 0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


class Server:
    """A `corpusmill serve` process and an authenticated client for it."""

    def __init__(self, state: Path, roots: list[Path], *extra: str, token: str = TOKEN):
        self.state, self.roots, self.extra, self.token = state, roots, extra, token
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def start(self) -> "Server":
        args = [str(BIN / "corpusmill"), "serve", "--port", str(self.port), "--state", str(self.state), "--workers", "2",
                *[a for r in self.roots for a in ("--data-root", str(r))], *self.extra]
        env = {k: v for k, v in os.environ.items() if k != "CORPUSMILL_TOKEN"}
        if self.token:
            env["CORPUSMILL_TOKEN"] = self.token
        self.log = open(self.state.parent / f"{self.state.name}-serve.log", "ab")
        self.proc = subprocess.Popen(args, env=env, stdout=self.log, stderr=subprocess.STDOUT)

        def up():
            if self.proc.poll() is not None:
                raise AssertionError(f"the service exited with {self.proc.returncode}: {self.read_log()}")
            try:
                return httpx.get(self.url + "/v1/health", timeout=HTTP_S).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, START_S, "the service to answer /v1/health")
        return self

    def read_log(self) -> str:
        return (self.state.parent / f"{self.state.name}-serve.log").read_text(errors="replace")[-3000:]

    def client(self, token: str | None = TOKEN) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=HTTP_S)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=HTTP_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def follow(client: httpx.Client, job_id: str, until=("succeeded", "failed", "cancelled"), timeout: float = JOB_S) -> dict:
    seen = []

    def done():
        r = client.get(f"/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        status = r.json()
        seen.append(status)
        return status if status["state"] in until else None

    return wait_until(done, timeout, f"job {job_id} to reach {until}", interval=0.5)


def still_active(client: httpx.Client, job_id: str) -> dict:
    """The job's status; AssertionError (with its error) when it already ended, so a wait for something
    it does while it runs fails at once instead of at the deadline."""
    status = client.get(f"/v1/jobs/{job_id}").json()
    if status["state"] not in ("queued", "running"):
        raise AssertionError(f"job {job_id} ended ({status['state']}) while it was waited on: {status['error']}")
    return status


def listening_addresses(port: int) -> set[str]:
    """The local addresses with a TCP socket listening on `port` (from /proc/net/tcp and tcp6)."""
    found = set()
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            address, hex_port = fields[1].split(":")
            if fields[3] != "0A" or int(hex_port, 16) != port:  # 0A: LISTEN
                continue
            if not v6:
                found.add(".".join(str(int(address[i:i + 2], 16)) for i in (6, 4, 2, 0)))
            else:
                found.add({"0" * 32: "::", "0" * 24 + "01000000": "::1"}.get(address, "ipv6:" + address))
    return found
