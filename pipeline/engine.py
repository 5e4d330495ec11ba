"""The Dask engine: an embedded LocalCluster by default, or a running scheduler by address.

Executors know nothing of what a stage does: `run_tasks` computes a list of Dask delayed objects
and shows progress; the stage functions themselves never see Dask.
"""
from __future__ import annotations

import contextvars
import logging
import os
import sys
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

import dask
from distributed import Client, LocalCluster, as_completed

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


class Progress:
    """One self-rewriting line on a terminal, a line per 10% otherwise."""

    def __init__(self, label: str, total: int, stream=None):
        self.label, self.total = label, total
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.start = time.perf_counter()
        self.done = 0
        self._last_decile = -1
        self._listener = progress_listener.get()
        if self._listener is not None:
            self._listener(label, 0, total)

    def update(self, n: int = 1) -> None:
        self.done += n
        if self._listener is not None:
            self._listener(self.label, self.done, self.total)
        elapsed = time.perf_counter() - self.start
        line = f"  {self.label}: {self.done}/{self.total} tasks, {elapsed:.1f}s"
        if self.tty:
            self.stream.write("\r" + line + ("\n" if self.done >= self.total else ""))
            self.stream.flush()
        else:
            decile = (10 * self.done) // max(1, self.total)
            if decile != self._last_decile and (decile % 5 == 0 or self.total >= 20):
                self._last_decile = decile
                self.stream.write(line + "\n")
                self.stream.flush()


def run_tasks(client: Client, tasks: list, label: str) -> list:
    """Compute delayed tasks on the cluster, in order, with a progress line."""
    if not tasks:
        return []
    futures = client.compute(tasks)
    progress = Progress(label, len(futures))
    index = {f.key: i for i, f in enumerate(futures)}
    results: list = [None] * len(futures)
    try:
        for future in as_completed(futures):
            results[index[future.key]] = future.result()  # re-raises a task's exception here
            progress.update()
    except BaseException:
        client.cancel(futures)
        raise
    return results
