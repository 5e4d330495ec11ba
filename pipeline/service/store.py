"""The job table, in SQLite under the service's state folder, so jobs outlive the service process.

One row per job: what was asked (the validated request, paths resolved), where it runs (its run
directory), its state and the process running it. Rows are only ever updated with a guard on the
state they expect (`WHERE state = ?`), so a cancel and a finish racing each other cannot both win.
"""
from __future__ import annotations

import json
import sqlite3
import threading
import uuid
from pathlib import Path
from typing import Any, Optional

from ..progress import utc_now

STATES = ("queued", "running", "succeeded", "failed", "cancelled")
ACTIVE = ("queued", "running")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    state TEXT NOT NULL,
    request TEXT NOT NULL,
    out TEXT NOT NULL,
    created_utc TEXT NOT NULL,
    started_utc TEXT,
    finished_utc TEXT,
    pid INTEGER,
    attempts INTEGER NOT NULL DEFAULT 0,
    resume_next INTEGER NOT NULL DEFAULT 0,
    restarts INTEGER NOT NULL DEFAULT 0,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    exit_code INTEGER,
    error TEXT,
    summary TEXT
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);
"""


class OutInUse(Exception):
    """Another active job writes to the same run directory, or publishes to the same URL."""

    def __init__(self, job_id: str, where: str = ""):
        super().__init__(job_id)
        self.job_id, self.where = job_id, where


class JobStore:
    """Thread-safe access to STATE/jobs.db (one connection, one lock: the service is one process)."""

    def __init__(self, state_dir: Path):
        self.path = Path(state_dir) / "jobs.db"
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @staticmethod
    def _row(row: Optional[sqlite3.Row]) -> Optional[dict[str, Any]]:
        if row is None:
            return None
        d = dict(row)
        d["request"] = json.loads(d["request"])
        d["summary"] = json.loads(d["summary"]) if d["summary"] else None
        d["cancel_requested"] = bool(d["cancel_requested"])
        d["resume_next"] = bool(d["resume_next"])
        return d

    def add(self, kind: str, request: dict, out: str, max_queued: int, job_id: Optional[str] = None,
            named: Optional[str] = None) -> Optional[str]:
        """Queue a job; None when `max_queued` jobs are already waiting (the queue is bounded), OutInUse
        when a queued or running job writes to the run directory `out`, or to what the request
        names as its out (`named`: the URL a job publishes to), checked in the same transaction as
        the insert."""
        job_id = job_id or uuid.uuid4().hex[:16]
        named = named or out
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                other = self._db.execute(
                    "SELECT id, out, json_extract(request, '$.out') FROM jobs WHERE state IN ('queued', 'running') AND "
                    "(out IN (?, ?) OR json_extract(request, '$.out') IN (?, ?))", (out, named, out, named)).fetchone()
                if other:
                    raise OutInUse(other[0], named if named in (other[1], other[2]) else out)
                queued = self._db.execute("SELECT COUNT(*) FROM jobs WHERE state = 'queued'").fetchone()[0]
                if queued >= max_queued:
                    self._db.execute("ROLLBACK")
                    return None
                self._db.execute(
                    "INSERT INTO jobs (id, kind, state, request, out, created_utc) VALUES (?, ?, 'queued', ?, ?, ?)",
                    (job_id, kind, json.dumps(request, ensure_ascii=False), out, utc_now()))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return job_id

    def get(self, job_id: str) -> Optional[dict[str, Any]]:
        with self._lock:
            return self._row(self._db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone())

    def list(self, state: Optional[str] = None, limit: int = 100, offset: int = 0,
             newest_first: bool = False) -> list[dict[str, Any]]:
        sql, args = "SELECT * FROM jobs", []
        if state:
            sql, args = sql + " WHERE state = ?", [state]
        order = " ORDER BY seq DESC" if newest_first else " ORDER BY seq"
        with self._lock:
            rows = self._db.execute(sql + order + " LIMIT ? OFFSET ?", (*args, limit, offset)).fetchall()
        return [self._row(r) for r in rows]

    def counts(self) -> dict[str, int]:
        with self._lock:
            rows = self._db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall()
        return {s: 0 for s in STATES} | {r[0]: r[1] for r in rows}

    def update(self, job_id: str, expect: Optional[tuple[str, ...]] = None, **fields: Any) -> bool:
        """Set fields; with `expect`, only while the job is in one of those states. True when a row changed."""
        if "summary" in fields and fields["summary"] is not None:
            fields["summary"] = json.dumps(fields["summary"], ensure_ascii=False)
        sets = ", ".join(f"{k} = ?" for k in fields)
        sql, args = f"UPDATE jobs SET {sets} WHERE id = ?", [*fields.values(), job_id]
        if expect:
            sql += f" AND state IN ({', '.join('?' * len(expect))})"
            args += list(expect)
        with self._lock:
            return self._db.execute(sql, args).rowcount > 0

    def bump(self, job_id: str, column: str) -> None:
        assert column in ("attempts", "restarts")
        with self._lock:
            self._db.execute(f"UPDATE jobs SET {column} = {column} + 1 WHERE id = ?", (job_id,))
