"""Starts, watches, cancels and recovers job processes; the only code that touches them.

A job runs as `corpusmill run|dedup|train ...` in its own process (see jobproc), connected to the
service's Dask scheduler: a crash in a job cannot take the service down, MindSpore never runs in the
service process (a process that forks after running a graph deadlocks), and cancelling is a signal
to the job's process group. Everything here runs on the event loop's thread: a child's death signal
follows the thread that forked it, so children must not be started from short-lived worker threads.
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import yaml

from ..progress import utc_now
from corpusmill.stages.base import write_text_atomic
from .guard import DataRoots, InputError, PathRefused, PathTooLong, UnsafeFolder, UrlRefused
from .status import LOG_NAME, error_from_log, job_counters, train_dir
from .store import JobStore

CANCEL_GRACE_S = 15.0  # SIGINT first (the CLI stops its Dask tasks), SIGKILL after this
TICK_S = 0.25
JOB_ENV = "CORPUSMILL_JOB_ID"


def _alive_job_process(pid: Optional[int], job_id: str) -> bool:
    """True when `pid` is still the process of `job_id` (pids are reused; its environment says whose it is)."""
    if not pid:
        return False
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return sys.platform != "linux"  # without /proc we cannot tell; assume it is ours
    return f"{JOB_ENV}={job_id}".encode() in environ.split(b"\0")


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Supervisor:
    def __init__(self, store: JobStore, state_dir: Path, scheduler: str, max_concurrent: int,
                 log: Callable[[str], None] = print, roots: Optional[DataRoots] = None):
        self.store, self.state_dir, self.scheduler, self.roots = store, Path(state_dir), scheduler, roots
        self.max_concurrent, self.log = max_concurrent, log
        self.procs: dict[str, subprocess.Popen] = {}
        self.signalled: dict[str, float] = {}
        self.stopping = False

    def job_dir(self, job_id: str) -> Path:
        return self.state_dir / "jobs" / job_id

    # ---- recovery -----------------------------------------------------------------------
    def recover(self) -> list[str]:
        """Jobs that were running when the service stopped go back to the head of the queue, to be
        resumed from their run directories' completion markers."""
        requeued = []
        for row in self.store.list(state="running", limit=1_000_000):
            if _alive_job_process(row["pid"], row["id"]):  # it outlived the service: stop it before resuming
                _kill_group(row["pid"], signal.SIGKILL)
                deadline = time.monotonic() + 10
                while _alive_job_process(row["pid"], row["id"]) and time.monotonic() < deadline:
                    time.sleep(0.1)
            if row["cancel_requested"]:
                self.store.update(row["id"], expect=("running",), state="cancelled", finished_utc=utc_now(), pid=None)
                continue
            self.store.update(row["id"], expect=("running",), state="queued", resume_next=1, pid=None)
            self.store.bump(row["id"], "restarts")
            requeued.append(row["id"])
        if requeued:
            self.log(f"service: resuming {len(requeued)} job(s) interrupted by the last stop: {', '.join(requeued)}")
        return requeued

    # ---- the loop -----------------------------------------------------------------------
    async def run_forever(self) -> None:
        while not self.stopping:
            try:
                self.tick()
            except Exception as e:  # one bad tick must not stop the supervisor
                self.log(f"service: supervisor error: {type(e).__name__}: {e}")
            await asyncio.sleep(TICK_S)

    def tick(self) -> None:
        for job_id, proc in list(self.procs.items()):
            rc = proc.poll()
            if rc is not None:
                self._finish(job_id, rc)
        for row in self.store.list(state="running", limit=1_000_000):
            if row["cancel_requested"] and row["id"] in self.procs:
                self._cancel(row["id"])
        while len(self.procs) < self.max_concurrent:
            queued = self.store.list(state="queued", limit=1)
            if not queued:
                break
            self._start(queued[0])

    def _command(self, row: dict, resume: bool) -> list[str]:
        req = row["request"]
        folder = self.job_dir(row["id"])
        folder.mkdir(parents=True, exist_ok=True)
        config_path = folder / "config.yaml"
        write_text_atomic(config_path, yaml.safe_dump(req["config"], sort_keys=False, allow_unicode=True))
        kind, out = row["kind"], row["out"]
        # a URL out: published there at the end, run in its local run directory (the CLI's --work)
        where = ["--out", req["out"], "--work", req["work"]] if req.get("work") else ["--out", out]
        if kind == "run":
            args = ["run", str(config_path), *where, "--scheduler", self.scheduler]
        elif kind == "dedup":
            args = ["dedup", *req["config"]["input"]["paths"], "--config", str(config_path), *where,
                    "--scheduler", self.scheduler, "--format", req.get("format", "parquet")]
        else:
            args = ["train", "--shards", req["shards"], "--config", str(config_path), "--out", out]
            # training resumes from a checkpoint; without one (none written yet) it starts again
            resume = resume and any((train_dir(row) / "checkpoints").glob("*"))
        if resume:
            args.append("--resume")
        return [sys.executable, "-m", "corpusmill.pipeline.service.jobproc", "--parent", str(os.getpid()), "--", *args]

    def _start(self, row: dict) -> None:
        job_id = row["id"]
        # claim the job first: a cancel that got in between leaves it cancelled and it is not started
        if not self.store.update(job_id, expect=("queued",), state="running",
                                 started_utc=row["started_utc"] or utc_now()):
            return
        self.store.bump(job_id, "attempts")
        resume = row["resume_next"] or bool(row["request"].get("resume"))
        if self.roots is not None:
            try:
                self.roots.recheck(row["request"])
            except (PathRefused, PathTooLong, InputError, UnsafeFolder, UrlRefused) as e:
                self.store.update(job_id, state="failed", finished_utc=utc_now(),
                                  error=f"refused at start (paths changed since the job was accepted): {e}")
                return
        try:
            argv = self._command(row, resume)
            Path(row["out"]).parent.mkdir(parents=True, exist_ok=True)
            log = os.fdopen(os.open(self.job_dir(job_id) / LOG_NAME,
                                    os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600), "ab")
            log.write(f"\n== {utc_now()} attempt {row['attempts'] + 1}: {' '.join(argv[6:])}\n".encode())
            log.flush()
            env = {**os.environ, JOB_ENV: job_id, "PYTHONUNBUFFERED": "1"}
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    cwd=str(self.job_dir(job_id)), env=env, start_new_session=True)
            log.close()
        except Exception as e:
            self.store.update(job_id, state="failed", finished_utc=utc_now(), error=f"could not start the job: {e}")
            return
        self.procs[job_id] = proc
        self.store.update(job_id, pid=proc.pid, resume_next=0)
        self.log(f"service: job {job_id} ({row['kind']}) started, pid {proc.pid}{', resuming' if resume else ''}")

    def _cancel(self, job_id: str) -> None:
        proc = self.procs[job_id]
        first = self.signalled.get(job_id)
        if first is None:
            self.signalled[job_id] = time.monotonic()
            _kill_group(proc.pid, signal.SIGINT)
            self.log(f"service: job {job_id}: cancel requested, SIGINT sent")
        elif time.monotonic() - first > CANCEL_GRACE_S:
            _kill_group(proc.pid, signal.SIGKILL)

    def _finish(self, job_id: str, rc: int) -> None:
        self.procs.pop(job_id, None)
        self.signalled.pop(job_id, None)
        if self.stopping:
            return  # stopped by the service's own shutdown: stays running, resumed at the next start
        row = self.store.get(job_id)
        if row is None:
            return
        if row["pid"]:
            _kill_group(row["pid"], signal.SIGKILL)  # anything the job left behind in its group
        summary = job_counters(row)
        if row["cancel_requested"]:
            state, error = "cancelled", None
        elif rc == 0:
            state, error = "succeeded", None
        else:
            state, error = "failed", error_from_log(self.job_dir(job_id) / LOG_NAME)
        self.store.update(job_id, expect=("running",), state=state, finished_utc=utc_now(), exit_code=rc,
                          error=error, summary=summary)
        self.log(f"service: job {job_id} {state} (exit code {rc})")

    def shutdown(self) -> None:
        """Stop the job processes; their rows stay `running`, so the next start resumes them."""
        self.stopping = True
        for proc in self.procs.values():
            _kill_group(proc.pid, signal.SIGINT)
        deadline = time.monotonic() + 10
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _kill_group(proc.pid, signal.SIGKILL)
        self.procs.clear()
