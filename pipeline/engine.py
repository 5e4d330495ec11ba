"""The Dask engine: an embedded LocalCluster by default, or a running scheduler by address.

Executors know nothing of what a stage does: `run_tasks` computes a list of Dask delayed objects
and shows progress; the stage functions themselves never see Dask.
"""
from __future__ import annotations

import contextvars
import functools
import logging
import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

import dask
from dask.delayed import Delayed
from distributed import Client, LocalCluster, WorkerPlugin, as_completed

Log = Callable[[str], None]

# Who else wants task progress (label, done, total): the runner's progress.json, which the service reads.
progress_listener: contextvars.ContextVar[Optional[Callable[[str, int, int], None]]] = contextvars.ContextVar(
    "progress_listener", default=None)


@contextmanager
def dask_client(cluster_cfg: Any, client: Optional[Client] = None, log: Log = print) -> Iterator[Client]:
    """Yield a client: the one given, one connected to `cluster.address`, or a new LocalCluster's."""
    if client is not None:
        yield client
        return
    dask.config.set({"dataframe.convert-string": True})
    if cluster_cfg.address:
        try:
            c = Client(cluster_cfg.address, timeout="10s")
        except OSError as e:
            raise ConnectionError(f"cannot reach the Dask scheduler at {cluster_cfg.address}: {e}") from None
        log(f"engine: connected to {cluster_cfg.address} ({len(c.scheduler_info()['workers'])} workers)")
        try:
            yield c
        finally:
            c.close()
        return
    n_workers = cluster_cfg.n_workers or os.cpu_count() or 1
    if not cluster_cfg.dashboard:
        # the workers' statistical profiler (a thread sampling every task's stack each 10 ms) feeds only the
        # dashboard, and cost 12 % of the tokenize tasks' CPU (interleaved, same slices: 13.06 vs 11.42 s)
        dask.config.set({"distributed.worker.profile.enabled": False})
        # each process's CPU / network sampling (every 500 ms) feeds the dashboard's plots too
        dask.config.set({"distributed.admin.system-monitor.interval": "2s"})
    # every process of the cluster (scheduler, nannies, workers) woke each 20 ms to check that its event loop
    # was not blocked (only a warning in the log): an idle 2-worker cluster spent 2.7 CPU s per 30 s on these
    # timers, 1.1 with both settings (the workers' memory checks keep their interval); a 100-second dedup run
    # spent several CPU seconds on them, more the longer a loaded host stretched it
    dask.config.set({"distributed.admin.tick.interval": "1s"})
    cluster = LocalCluster(
        n_workers=n_workers,
        threads_per_worker=cluster_cfg.threads_per_worker,
        processes=True,
        memory_limit=cluster_cfg.memory_limit,
        # the scheduler's HTTP server starts even without a dashboard, on 8787 unless told otherwise:
        # bind it to the configured address (loopback, a free port) so runs never fight over a port
        host="127.0.0.1",
        dashboard_address=cluster_cfg.dashboard_address,
        scheduler_kwargs={"dashboard": bool(cluster_cfg.dashboard)},
        # a task's exception is raised again in the driver, which says it in one line: a worker's own
        # "Compute Failed" log with its traceback would only repeat it
        silence_logs=logging.CRITICAL,
    )
    c = Client(cluster)
    dash = f", dashboard {c.dashboard_link}" if cluster_cfg.dashboard else ""
    log(f"engine: LocalCluster with {n_workers} worker processes x {cluster_cfg.threads_per_worker} thread(s){dash}")
    try:
        yield c
    finally:
        c.close()
        cluster.close()


HEARTBEAT_S = 30.0  # a line at least this often on a non-terminal while a step runs, even with no task done


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class Progress:
    """A step's progress: tasks done of total, elapsed, rate and ETA. On a terminal one self-rewriting
    line with a bar (redrawn each second, so elapsed and ETA move while a long task runs); otherwise
    a line per 10% and at least every `heartbeat_s` seconds, so a log never goes quiet for minutes."""

    def __init__(self, label: str, total: int, stream=None, heartbeat_s: Optional[float] = None):
        self.label, self.total = label, total
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.heartbeat_s = HEARTBEAT_S if heartbeat_s is None else heartbeat_s
        self.start = time.perf_counter()
        self.done = 0
        self._last_decile = -1
        self._last_line = self.start
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener = progress_listener.get()
        if self._listener is not None:
            self._listener(label, 0, total)
        self._thread = threading.Thread(target=self._beat, name=f"progress {label}", daemon=True)
        self._thread.start()

    def line(self, now: Optional[float] = None) -> str:
        """`label: done/total tasks (pct), elapsed, rate, ETA` (the ETA from the rate so far)."""
        elapsed = (now or time.perf_counter()) - self.start
        pct = 100 * self.done // max(1, self.total)
        text = f"  {self.label}: {self.done}/{self.total} tasks ({pct}%), {_duration(elapsed)}"
        if self.done and elapsed > 0:
            rate = self.done / elapsed
            text += f", {rate:,.2f} tasks/s" if rate >= 0.1 else f", {elapsed / self.done:.0f} s/task"
            if self.done < self.total:
                text += f", ETA {_duration((self.total - self.done) / rate)}"
        elif self.done < self.total:
            text += ", ETA after the first task"
        if self.tty:
            width = 20
            filled = width * self.done // max(1, self.total)
            text = f"  [{'#' * filled}{'.' * (width - filled)}]" + text[1:]
        return text

    def _emit(self, final: bool = False) -> None:
        now = time.perf_counter()
        if self.tty:
            self.stream.write("\r" + self.line(now) + ("\n" if final else ""))
        else:
            self.stream.write(self.line(now) + "\n")
        self.stream.flush()
        self._last_line = now

    def update(self, n: int = 1) -> None:
        with self._lock:
            self.done += n
            if self._listener is not None:
                self._listener(self.label, self.done, self.total)
            finished = self.done >= self.total
            if self.tty:
                self._emit(final=finished)
            else:
                decile = (10 * self.done) // max(1, self.total)
                due = time.perf_counter() - self._last_line >= self.heartbeat_s
                if due or finished or (decile != self._last_decile and (decile % 5 == 0 or self.total >= 20)):
                    self._last_decile = decile
                    self._emit()
        if finished:
            self.close()

    def _beat(self) -> None:
        interval = 1.0 if self.tty else max(0.05, min(5.0, self.heartbeat_s / 4))
        while not self._stop.wait(interval):
            with self._lock:
                if self._stop.is_set():
                    return
                if self.tty or time.perf_counter() - self._last_line >= self.heartbeat_s:
                    self._emit()

    def close(self) -> None:
        """Stop the heartbeat (a finished or failed step)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


class Heartbeat:
    """For a blocking step with no task count (a Dask shuffle, a groupby): a line at least every
    `heartbeat_s` seconds saying it is still running and for how long."""

    def __init__(self, label: str, log: Optional[Callable[[str], None]] = None, heartbeat_s: Optional[float] = None):
        self.label, self.heartbeat_s = label, HEARTBEAT_S if heartbeat_s is None else heartbeat_s
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))

    def __enter__(self) -> "Heartbeat":
        self.start = time.perf_counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat {self.label}", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            self.log(f"  {self.label}: still running, {_duration(time.perf_counter() - self.start)}")

    def __exit__(self, *exc) -> bool:
        self._stop.set()
        self._thread.join(timeout=5)
        return False


def follow(client: Client, futures: list, label: str, on_done: Optional[Callable[[Any], None]] = None) -> None:
    """Wait for `futures` with a progress line (one step when there are none, so the label still shows);
    `on_done` takes each future as it finishes. A task's exception is raised here and the others are
    cancelled."""
    progress = Progress(label, max(1, len(futures)))
    try:
        for future in as_completed(futures):
            if on_done is not None:
                on_done(future)
            elif future.status == "error":
                future.result()  # re-raises the task's exception
            progress.update()
        if not futures:
            progress.update()
    except BaseException:
        client.cancel(futures)
        raise
    finally:
        progress.close()


def release_memory() -> None:
    """Give back to the OS what the finished task freed but this worker's allocators kept: Arrow's
    pool (mimalloc keeps freed pages in each thread's own heap, so this runs as a task on the worker
    that holds the result: in the task's own thread when the worker has one, as by default) and
    glibc's arenas (numpy, pandas). Kept memory made a worker's peak grow with the number of tasks it
    had run, not with the size of one task: the same 21 filter tasks run four times in one process
    kept 489-667 MB between tasks; released after each, 318-330 MB."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.lru_cache(maxsize=1)
def _malloc_trim() -> Optional[Callable[[int], int]]:
    """glibc's malloc_trim, None where the C library has none (macOS, musl)."""
    import ctypes
    import ctypes.util

    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), "malloc_trim", None)
    except OSError:
        return None


class ReleaseAfterEveryTask(WorkerPlugin):
    """glibc's `malloc_trim` on a worker each time a task leaves it (done or failed), the tasks of Dask
    shuffles and merges included, which `run_tasks` does not follow with `release_memory`. Without
    it a worker's heap grew with every shuffle task it ran within a step (near dedup at 5 GB: 519 ->
    780 MB between tasks). It runs in the worker's event loop, so Arrow's per-thread pool is left to
    `release_memory`."""

    name = "corpusmill-release-after-every-task"

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        if start == "executing" and finish != "executing":
            trim = _malloc_trim()
            if trim is not None:
                trim(0)


def release_after_every_task(client: Client) -> None:
    """Install `ReleaseAfterEveryTask` on the cluster's workers (those that join later too)."""
    client.register_plugin(ReleaseAfterEveryTask())


def _released(result: Any) -> Any:
    """A task's result, passed on after `release_memory` in the worker that holds it."""
    release_memory()
    return result


def run_tasks(client: Client, tasks: list, label: str) -> list:
    """Compute delayed tasks on the cluster, in order, with a progress line. Each task is followed
    on its worker by `release_memory`, so the next task starts from a returned heap."""
    if not tasks:
        return []
    futures = client.compute([dask.delayed(_released)(t) if isinstance(t, Delayed) else t for t in tasks])
    index = {f.key: i for i, f in enumerate(futures)}
    results: list = [None] * len(futures)

    def collect(future: Any) -> None:
        results[index[future.key]] = future.result()  # re-raises a task's exception here

    follow(client, futures, label, collect)
    return results
