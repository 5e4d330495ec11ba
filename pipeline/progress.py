"""`OUT/progress.json`: where a run is, for anyone following it without parsing its log.

The runner writes the planned stages up front, then each stage's state (pending, running, done,
skipped, failed) and seconds, and the task count of the step running now. The file is replaced
atomically (task updates at most twice a second), so a reader never sees half of it; the service's
job status is built from it and the stages' `_DONE.json` markers.
"""
from __future__ import annotations

import json
import os
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

from corpusmill.stages.base import write_bytes_atomic

PROGRESS_FILE = "progress.json"
_MIN_INTERVAL_S = 0.5


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class RunProgress:
    """Writes OUT/progress.json as the run goes."""

    def __init__(self, out: Path, job: str, planned: list[str]):
        self.path = Path(out) / PROGRESS_FILE
        self._lock = threading.Lock()
        self._last_write = 0.0
        self._started: dict[str, float] = {}
        self.doc: dict[str, Any] = {
            "job": job,
            "state": "running",
            "pid": os.getpid(),
            "started_utc": utc_now(),
            "updated_utc": utc_now(),
            "stage": None,
            "stages": {name: {"state": "pending"} for name in planned},
            "step": None,
            "error": None,
        }
        self._write()

    def stage_started(self, name: str) -> None:
        with self._lock:
            self._started[name] = time.perf_counter()
            self.doc["stage"] = name
            self.doc["step"] = None
            self.doc["stages"].setdefault(name, {}).update(state="running", started_utc=utc_now())
            self._write()

    def stage_finished(self, name: str, seconds: float, skipped: bool = False) -> None:
        with self._lock:
            entry = self.doc["stages"].setdefault(name, {})
            entry.update(state="skipped" if skipped else "done", seconds=round(seconds, 3))
            if not skipped:
                entry["finished_utc"] = utc_now()
            self.doc["step"] = None
            self._write()

    def tasks(self, label: str, done: int, total: int) -> None:
        """A step's task count (the engine's progress listener); throttled unless the step just began or ended."""
        with self._lock:
            self.doc["step"] = {"label": label, "tasks_done": done, "tasks_total": total}
            if done in (0, total) or time.perf_counter() - self._last_write >= _MIN_INTERVAL_S:
                self._write()

    def finished(self, error: Optional[str] = None, interrupted: bool = False) -> None:
        """The run ended: succeeded, failed (with the error) or interrupted (Ctrl-C, a cancelled job)."""
        with self._lock:
            state = "interrupted" if interrupted else "failed" if error else "succeeded"
            self.doc["state"], self.doc["error"] = state, error
            current = self.doc["stage"]
            entry = self.doc["stages"].get(current, {}) if current else {}
            if state != "succeeded" and entry.get("state") == "running":
                entry["state"] = state
                entry["seconds"] = round(time.perf_counter() - self._started.get(current, time.perf_counter()), 3)
            if state == "succeeded":
                self.doc["stage"] = None
            self.doc["step"] = None
            self._write()

    def _write(self) -> None:
        self.doc["updated_utc"] = utc_now()
        data = json.dumps(self.doc, indent=1, ensure_ascii=False).encode("utf-8")
        try:
            write_bytes_atomic(self.path, data)
        except OSError:
            # a full disk has no room for a second copy: the run's end state still has to be told, so
            # rewrite the file in place (truncating frees its blocks first); a reader may then see a
            # half-written file for a moment, which the service and `corpusmill` status readers treat as no progress yet
            if self.doc["state"] == "running":
                return
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
            except OSError:
                return
        self._last_write = time.perf_counter()
