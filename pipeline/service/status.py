"""What a job looks like from outside: built from its row and its run directory, never from a log.

The run directory already says everything: `progress.json` (planned stages, the one running now and
its task count), each stage's `_DONE.json` (counts and seconds), `ledger.json` when the run is done,
and for training `metrics.jsonl` / `summary.json`. The service adds nothing of its own but the state.
Every file is read through `safefs`, which follows no symlink: a link planted in a run directory
reads as no file at all.
"""
from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

from ..progress import PROGRESS_FILE
from ..rundir import MARKER, STAGE_DIRS
from .safefs import read_optional

LOG_NAME = "job.log"


def _read_json(path: Path) -> Optional[dict]:
    data = read_optional(path)
    if data is None:
        return None
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None  # every file read here holds an object


def _markers(out: Path) -> dict[str, dict]:
    found = {}
    for name, folder in STAGE_DIRS.items():
        marker = _read_json(out / folder / MARKER)
        if marker and isinstance(marker.get("stats"), dict):
            found[name] = marker
    return found


def _last_line(path: Path, max_bytes: int = 65536) -> Optional[str]:
    data = read_optional(path, max_bytes, tail=True)
    lines = [ln for ln in (data or b"").splitlines() if ln.strip()]
    return lines[-1].decode("utf-8", "replace") if lines else None


def train_dir(row: dict) -> Path:
    return Path(row["out"]) / "train" if row["kind"] == "run" else Path(row["out"])


def train_progress(folder: Path, planned_steps: Optional[int]) -> Optional[dict]:
    summary = _read_json(folder / "summary.json")
    if summary:
        keys = ("steps", "first_loss", "last_loss", "tokens", "tokens_per_s", "data_wait_share", "num_parallel_workers",
                "wall_s")
        return {"done": True, "planned_steps": planned_steps, **{k: summary.get(k) for k in keys}}
    last = _last_line(folder / "metrics.jsonl")
    if last is None:
        return None
    try:
        record = json.loads(last)
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict):
        return None
    return {"done": False, "planned_steps": planned_steps, "step": record.get("step"), "loss": record.get("loss"),
            "lr": record.get("lr"), "tokens_per_s": record.get("tokens_per_s")}


class StepRates:
    """The ETA of each running job's current step, from the rate its tasks were seen to finish at.

    A run's progress.json holds the running step's task count, not when the step began, so the rate is
    measured across status reads (the page and `corpusmill jobs` poll): from the first read that saw
    this step to the latest one, as the CLI's own progress line measures it from the step's start.
    One entry per running job, dropped when the job is seen ended."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[tuple, float, int]] = {}

    def eta(self, job_id: str, label: str, done: int, total: int, now: Optional[float] = None) -> Optional[float]:
        """Seconds left for this step, or None until a task was seen to finish."""
        now = time.monotonic() if now is None else now
        key = (label, total)
        with self._lock:
            entry = self._seen.get(job_id)
            if entry is None or entry[0] != key or done < entry[2]:
                self._seen[job_id] = (key, now, done)
                return None
            _, first, done_then = entry
        if done <= done_then or now <= first or done >= total:
            return 0.0 if done >= total else None
        return (total - done) * (now - first) / (done - done_then)

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._seen.pop(job_id, None)


def _utc_seconds(text: Optional[str]) -> Optional[float]:
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp() if text else None
    except (TypeError, ValueError):
        return None


def elapsed_seconds(row: dict, now: Optional[float] = None) -> Optional[float]:
    """Seconds from the job's start to its end (or to now while it runs); None before it started."""
    start = _utc_seconds(row.get("started_utc"))
    if start is None:
        return None
    end = _utc_seconds(row.get("finished_utc")) if row.get("finished_utc") else (time.time() if now is None else now)
    return max(0.0, round((end or start) - start, 1))


def _progress(view: dict[str, Any], rates: Optional[StepRates]) -> Optional[dict[str, Any]]:
    """Where a running job is: its stage (n of m), the running step's tasks and their ETA."""
    if view["state"] != "running":
        if rates is not None:
            rates.forget(view["id"])
        return None
    stages = view["stages"]
    progress: dict[str, Any] = {"stage": view["stage"], "stages_done": sum(s["state"] in ("done", "skipped") for s in stages),
                                "stages_total": len(stages), "label": None, "tasks_done": None, "tasks_total": None,
                                "percent": None, "eta_s": None}
    step = next((s.get("step") for s in stages if s["state"] == "running" and s.get("step")), None)
    train = view.get("train")
    if step and isinstance(step.get("tasks_done"), int) and isinstance(step.get("tasks_total"), int):
        label, done, total = str(step.get("label")), step["tasks_done"], step["tasks_total"]
    elif view["stage"] == "train" and train and isinstance(train.get("step"), int) and isinstance(train.get("planned_steps"), int):
        label, done, total = "train", train["step"], train["planned_steps"]
    else:
        return progress
    progress.update(label=label, tasks_done=done, tasks_total=total,
                    percent=round(100.0 * done / total, 1) if total > 0 else None)
    if rates is not None and total > 0:
        eta = rates.eta(view["id"], label, done, total)
        progress["eta_s"] = None if eta is None else round(eta, 1)
    return progress


def job_view(row: dict, dashboard: Optional[str], rates: Optional[StepRates] = None) -> dict[str, Any]:
    """The job's status document (GET /v1/jobs/{id}); `rates` adds the running step's ETA."""
    out = Path(row["out"])
    request = row["request"]
    view: dict[str, Any] = {k: row[k] for k in ("id", "kind", "state", "created_utc", "started_utc", "finished_utc",
                                                  "attempts", "restarts", "cancel_requested", "exit_code", "error")}
    # a URL out: `out` is the URL the results are published to, `work` the run directory read here
    view.update(out=str(request.get("out") or out), work=request.get("work"), dashboard=dashboard, stage=None, stages=[],
                ledger=None, train=None)
    planned_steps = (request.get("config") or {}).get("train", {}).get("steps")
    if row["kind"] in ("run", "dedup"):
        progress = _read_json(out / PROGRESS_FILE)
        progress = progress if isinstance(progress, dict) else {}
        markers = _markers(out)
        names = list(progress.get("stages") or markers)
        step = progress.get("step")
        for name in names:
            p = (progress.get("stages") or {}).get(name, {})
            state = p.get("state", "done" if name in markers else "pending")
            if state == "running" and row["state"] != "running":
                state = "interrupted"  # the process died (or the service did) while it ran
            entry: dict[str, Any] = {"name": name, "state": state, "seconds": p.get("seconds")}
            if name in markers:
                stats = markers[name]["stats"]
                entry["seconds"] = markers[name].get("seconds", entry["seconds"])
                entry["counts"] = {k: stats[k] for k in ("docs_in", "docs_out", "removed", "quarantined", "tokens",
                                                         "windows", "samples") if k in stats}
            if state == "running":
                view["stage"] = name
                if step:
                    entry["step"] = step
            view["stages"].append(entry)
        ledger = _read_json(out / "ledger.json")
        if ledger and progress.get("state") == "succeeded":
            view["ledger"] = ledger
        elif markers:
            view["ledger"] = {"partial": True, "stages": {n: {"in": m["stats"].get("docs_in"), "out": m["stats"].get("docs_out"),
                                                               "removed": m["stats"].get("removed", {})}
                                                           for n, m in markers.items() if "docs_in" in m["stats"]}}
    if row["kind"] == "train" or (request.get("config") or {}).get("train", {}).get("enabled"):
        view["train"] = train_progress(train_dir(row), planned_steps)
    if row["kind"] == "train":  # one stage, whose state is the job's
        state = {"queued": "pending", "succeeded": "done", "cancelled": "interrupted"}.get(row["state"], row["state"])
        done = view["train"] if view["train"] and view["train"]["done"] else {}
        view["stages"] = [{"name": "train", "state": state, "seconds": done.get("wall_s")}]
        view["stage"] = "train" if row["state"] == "running" else None
    view["elapsed_s"] = elapsed_seconds(row)
    view["progress"] = _progress(view, rates)
    return view


def job_counters(row: dict) -> dict[str, Any]:
    """Documents, tokens and stage seconds a job has processed so far (for /metrics)."""
    out = Path(row["out"])
    counters: dict[str, Any] = {"documents": 0, "documents_kept": 0, "tokens": 0, "train_tokens": 0, "stage_seconds": {}}
    markers = _markers(out) if row["kind"] in ("run", "dedup") else {}
    if "read" in markers:
        counters["documents"] = int(markers["read"]["stats"].get("docs_in", 0))
    if "tokenize" in markers:
        counters["tokens"] = int(markers["tokenize"]["stats"].get("tokens", 0))
    for name, m in markers.items():
        counters["stage_seconds"][name] = float(m.get("seconds", 0.0))
    ledger = _read_json(out / "ledger.json")
    if ledger:
        counters["documents_kept"] = int(ledger.get("kept", 0))
    summary = _read_json(train_dir(row) / "summary.json")
    if summary:
        counters["train_tokens"] = int(summary.get("tokens", 0))
        counters["stage_seconds"]["train"] = float(summary.get("wall_s", 0.0))
    return counters


def error_from_log(log_path: Path, max_lines: int = 20) -> str:
    """The CLI's `corpusmill: error:` message, else the log's last lines (a traceback)."""
    data = read_optional(log_path, 1 << 20, tail=True)
    if data is None:
        return "the job process exited with an error (no log)"
    text = data.decode("utf-8", "replace")
    lines = text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("corpusmill: error:"):
            block = [lines[i]] + [ln for ln in lines[i + 1:] if ln.startswith(" ")]
            return "\n".join(block)[:4000]
    return "\n".join(lines[-max_lines:])[-4000:] or "the job process exited with an error"


def prometheus_text(counts: dict[str, int], rows: list[dict], live: dict[str, dict]) -> str:
    """Prometheus exposition text: jobs by state, documents and tokens processed, stage seconds."""
    totals = {"documents": 0, "documents_kept": 0, "tokens": 0, "train_tokens": 0}
    seconds: dict[str, float] = {}
    for row in rows:
        c = live.get(row["id"]) or row.get("summary") or {}
        for k in totals:
            totals[k] += int(c.get(k, 0))
        for stage, s in (c.get("stage_seconds") or {}).items():
            seconds[stage] = seconds.get(stage, 0.0) + float(s)
    lines = ["# HELP corpusmill_jobs Jobs by state.", "# TYPE corpusmill_jobs gauge"]
    lines += [f'corpusmill_jobs{{state="{s}"}} {n}' for s, n in counts.items()]
    for name, key, help_ in (
        ("corpusmill_documents_processed_total", "documents", "Input documents read by jobs."),
        ("corpusmill_documents_kept_total", "documents_kept", "Documents kept by finished jobs."),
        ("corpusmill_tokens_processed_total", "tokens", "Tokens written by the tokenize stage of jobs."),
        ("corpusmill_train_tokens_total", "train_tokens", "Tokens trained on by jobs."),
    ):
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} counter", f"{name} {totals[key]}"]
    lines += ["# HELP corpusmill_stage_seconds_total Seconds spent in each stage, over all jobs.",
              "# TYPE corpusmill_stage_seconds_total counter"]
    lines += [f'corpusmill_stage_seconds_total{{stage="{s}"}} {v:.3f}' for s, v in sorted(seconds.items())]
    return "\n".join(lines) + "\n"
