"""MindSpore work in helper processes (pipeline.isolated): results and errors come back as if the call
ran in place, a helper that dies is a clear error in the task while its Dask worker lives on, and a
MindRecord file written through a helper leaves no MindSpore in the worker (real LocalCluster)."""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

from corpusmill.pipeline import isolated
from corpusmill.stages import shard
from tests.servers import wait_until


def _pid_and_parent() -> tuple[int, int]:
    return os.getpid(), os.getppid()


def _refuse(path: str) -> None:
    raise shard.ShardError(f"{path}: samples hold (7,) ids, expected (2049,)")


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _answer_unpicklable():
    return lambda: None


def test_calls_run_in_a_kept_helper_and_their_exceptions_come_back_as_raised():
    try:
        first, second = isolated.call_in_helper(_pid_and_parent), isolated.call_in_helper(_pid_and_parent)
        assert first == second and first[0] != os.getpid() and first[1] == os.getpid()  # one child, kept
        with pytest.raises(shard.ShardError, match=r"x.mindrecord: samples hold \(7,\)"):
            isolated.call_in_helper(_refuse, "x.mindrecord")
        assert isolated.call_in_helper(_pid_and_parent) == first  # an exception leaves the helper in use
        with pytest.raises(RuntimeError, match="could not be sent back"):
            isolated.call_in_helper(_answer_unpicklable)
        assert isolated.call_in_helper(_pid_and_parent) == first
    finally:
        assert isolated.stop_helpers() == 1


def test_a_helper_killed_during_a_call_is_a_clear_error_and_the_next_call_gets_a_new_one():
    try:
        before = isolated.call_in_helper(_pid_and_parent)[0]
        with pytest.raises(isolated.HelperError, match="killed by SIGKILL .*out of memory"):
            isolated.call_in_helper(_die)
        after = isolated.call_in_helper(_pid_and_parent)[0]
        assert after != before
        with pytest.raises(ProcessLookupError):
            os.kill(before, 0)  # reaped, not a zombie
    finally:
        isolated.stop_helpers()


def _exited(pid: int) -> bool:
    """Gone, or a zombie: exited, and not yet reaped by its parent."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _sleep(seconds: float) -> float:
    import time

    time.sleep(seconds)
    return seconds


def test_a_helper_that_died_while_idle_is_replaced_and_stop_ends_busy_ones_too():
    import threading

    try:
        idle = isolated.call_in_helper(_pid_and_parent)[0]
        os.kill(idle, signal.SIGKILL)  # as the OOM killer would, between two calls
        isolated._idle[0].proc.wait()  # all of it gone (a killed process's threads end one by one)
        assert isolated.call_in_helper(_pid_and_parent)[0] != idle

        raised: list = []
        busy = threading.Thread(target=lambda: raised.append(pytest.raises(isolated.HelperError, isolated.call_in_helper,
                                                                           _sleep, 600)))
        busy.start()
        while not isolated._busy:  # the call has taken its helper
            busy.join(0.05)
        assert not isolated._idle and isolated.stop_helpers() == 1  # the one still sleeping: killed
        busy.join(60)
        assert not busy.is_alive() and raised and "SIGKILL" in str(raised[0].value)
    finally:
        isolated.stop_helpers()


_ORPHAN = """
import sys, threading, time
from corpusmill.pipeline import isolated
threading.Thread(target=isolated.call_in_helper, args=(time.sleep, 600), daemon=True).start()
while not isolated._busy:
    time.sleep(0.05)
print(next(iter(isolated._busy)).proc.pid, flush=True)
time.sleep(600)
"""


def test_a_helper_ends_when_its_parent_is_killed_in_the_middle_of_a_call():
    import subprocess
    import time

    parent = subprocess.Popen([sys.executable, "-c", _ORPHAN], stdout=subprocess.PIPE, text=True)
    try:
        helper = int(parent.stdout.readline())
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 120  # the watchdog looks every second; generous for a busy machine
        while time.monotonic() < deadline:
            if _exited(helper):
                break
            time.sleep(0.2)
        else:
            pytest.fail("the helper outlived its parent")
    finally:
        parent.kill()


def _write_one_file(path: str) -> dict:
    rng = np.random.default_rng(0)
    windows = shard.Windows(np.arange(40), rng.integers(0, 1000, (40, 9), dtype=np.int32), np.zeros(40, np.int32))
    return isolated.call_in_helper(shard.write_mindrecord, windows, path, 9, 16, False, "full")


def _worker_state() -> tuple[int, bool, int]:
    import psutil

    return os.getpid(), "mindspore" in sys.modules, len(psutil.Process().children())


def test_a_file_written_through_a_helper_leaves_no_mindspore_in_the_worker_and_a_crash_spares_it(tmp_path):
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0", scheduler_kwargs={"dashboard": False}) as cluster, \
            Client(cluster) as client:
        (pid, loaded, _), = client.run(_worker_state).values()
        assert not loaded
        seconds = list(client.run(isolated.warm_up_helpers, shard.warm_up_writer).values())
        assert seconds[0] > 0
        assert list(client.run(_worker_state).values()) == [(pid, False, 2)]  # one helper per worker thread

        path = str(tmp_path / "one.mindrecord")
        out = client.submit(_write_one_file, path, pure=False).result()
        assert out["samples"] == 40 and out["tokens"] == 40 * 9

        import mindspore.dataset as ds

        rows = [r[0] for r in ds.MindDataset([path], columns_list=["input_ids"], shuffle=False)
                .create_tuple_iterator(output_numpy=True, num_epochs=1)]
        expected = np.random.default_rng(0).integers(0, 1000, (40, 9), dtype=np.int32)
        assert np.array_equal(np.stack(rows), expected)

        with pytest.raises(isolated.HelperError, match="SIGKILL"):
            client.submit(isolated.call_in_helper, _die, pure=False).result()
        assert list(client.run(_worker_state).values())[0][:2] == (pid, False)  # the same worker, still clean
        assert sum(client.run(isolated.stop_helpers).values()) >= 1
        assert list(client.run(_worker_state).values()) == [(pid, False, 0)]


def test_released_helpers_serve_the_next_call_and_stop_when_kept_idle_too_long():
    """release_helpers: a helper taken again within keep_s is the same process (no new MindSpore
    import); one left idle longer is stopped by the parent (never under a call)."""
    try:
        first = isolated.call_in_helper(_pid_and_parent)[0]
        assert isolated.release_helpers(keep_s=30) == 0  # nothing busy: nothing killed now
        assert isolated.call_in_helper(_pid_and_parent)[0] == first  # reused, not restarted
        isolated.release_helpers(keep_s=0.2)
        wait_until(lambda: not isolated._idle, 30, "the idle helper to be stopped")
        assert not Path(f"/proc/{first}").exists() or "zombie" in Path(f"/proc/{first}/status").read_text().lower()
        assert isolated.call_in_helper(_pid_and_parent)[0] != first  # a new one
    finally:
        isolated.stop_helpers()
