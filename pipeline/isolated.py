"""Calls that load MindSpore run in helper Python processes, never in a Dask worker itself.

Why: MindSpore's import and its MindRecord writer put about 300 MB into a process, and a Dask worker
would keep them for the rest of its life on top of whatever heap the steps before left (a worker's
RSS never falls back to where it started). A helper is a fresh interpreter started with
`subprocess` (not `multiprocessing`: Dask's worker processes are daemons, which may not have
`multiprocessing` children, and a fresh interpreter never forks after MindSpore use, which can
deadlock). Its memory is given back whole when it stops; a crash in MindSpore's C++ code (SIGSEGV,
abort, the kernel's out-of-memory killer) ends the helper and becomes a clear error in the task,
not a lost worker.

Each process keeps its idle helpers for later calls (MindSpore's import costs 2-3 s): a call takes
an idle helper or starts one, so concurrent calls (a worker's threads) each have their own. The
step that used them releases them with `release_helpers` on every worker when it ends: a call still
running is killed, and idle helpers are stopped after `KEEP_IDLE_S` seconds unless a call took them
first (the next run on a long-lived cluster, a service's or a test session's, does not import
MindSpore again). The expiry is the parent's, under the same lock as a call's take, so a helper
never exits under a call.
"""
from __future__ import annotations

import atexit
import json
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Optional

_LENGTH = struct.Struct("<Q")
# sys.path is set before anything is imported: the worker's own (uploaded files, a test's modules),
# not the current directory a `-c` child would put first
_SERVE = ("import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
          "from corpusmill.pipeline.isolated import _serve; _serve(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))")
OOM_SCORE_ADJ = 500  # the kernel's OOM killer takes a helper before its worker
KEEP_IDLE_S = 60.0  # how long a released idle helper waits for the next call before it is stopped


class HelperError(RuntimeError):
    """A helper process ended before it answered (crashed, killed, or could not start)."""


def _write_message(fd: int, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_LENGTH.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read_exactly(fd: int, n: int) -> Optional[bytes]:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 24))
        if not chunk:
            return None  # the other end closed
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read_message(fd: int) -> tuple[bool, Any]:
    """(True, the object), or (False, None) when the other end closed before a whole message."""
    head = _read_exactly(fd, _LENGTH.size)
    body = None if head is None else _read_exactly(fd, _LENGTH.unpack(head)[0])
    return (False, None) if body is None else (True, pickle.loads(body))


class _Helper:
    """One helper process and the two pipes to it (requests in, answers out)."""

    def __init__(self) -> None:
        to_child, self._requests = os.pipe()
        self._answers, from_child = os.pipe()
        env = {**os.environ, "GLOG_v": os.environ.get("GLOG_v", "3")}  # MindSpore's INFO/WARNING chatter off
        argv = [sys.executable, "-c", _SERVE, json.dumps(sys.path), str(to_child), str(from_child), str(os.getpid())]
        try:
            # stdout goes to stderr: MindSpore's C++ code may print, and nothing shares the answer pipe
            self.proc = subprocess.Popen(argv, pass_fds=(to_child, from_child), stdin=subprocess.DEVNULL,
                                         stdout=sys.stderr.fileno() if _has_fileno(sys.stderr) else None, env=env)
        except Exception as e:  # noqa: BLE001 - OSError, or a bad environment: either way no helper
            for fd in (self._requests, self._answers):
                os.close(fd)
            raise HelperError(f"could not start a helper process: {e}") from None
        finally:
            os.close(to_child)
            os.close(from_child)
        self._fds: tuple[int, ...] = (self._requests, self._answers)
        self._closing = threading.Lock()

    def call(self, fn: Callable, args: tuple, kwargs: dict) -> tuple[bool, Any]:
        """(True, result) or (False, the exception it raised), from a whole answer; HelperError when
        the helper died first."""
        try:
            _write_message(self._requests, (fn, args, kwargs))
            whole, answer = _read_message(self._answers)
        except (BrokenPipeError, ConnectionResetError):
            whole, answer = False, None
        if not whole:
            raise HelperError(f"the helper process running {getattr(fn, '__name__', fn)} {self._ending()}")
        return answer

    def _ending(self) -> str:
        """How the process ended, in words (it closed its pipe, so it is ending)."""
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()
            return "stopped answering"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            hint = " (out of memory? the kernel's OOM killer sends SIGKILL)" if -code == signal.SIGKILL else ""
            return f"was killed by {name}{hint}"
        return f"exited with code {code}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _close_pipes(self) -> None:
        """Once only: a closed descriptor's number may already belong to another file."""
        with self._closing:
            fds, self._fds = self._fds, ()
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass

    def stop(self) -> None:
        """Close its pipes (an idle helper exits at once) and reap it."""
        self._close_pipes()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """For a helper whose conversation cannot go on (interrupted, or its call's step ended)."""
        try:
            self.proc.kill()
        except OSError:
            pass
        self.proc.wait()
        self._close_pipes()


def _has_fileno(stream: Any) -> bool:
    try:
        stream.fileno()
        return True
    except (AttributeError, OSError, ValueError):
        return False


_idle: list[_Helper] = []
_busy: set[_Helper] = set()
_idle_since: dict[_Helper, float] = {}  # monotonic time each idle helper went idle
_lock = threading.Lock()


def _take() -> _Helper:
    """A live idle helper (dead ones, e.g. taken by the OOM killer while idle, are reaped), or a new one."""
    while True:
        with _lock:
            helper = _idle.pop() if _idle else None
            _idle_since.pop(helper, None)
            if helper is not None and helper.alive():
                _busy.add(helper)
                return helper
        if helper is None:
            break
        helper.stop()
    helper = _Helper()
    with _lock:
        _busy.add(helper)
    return helper


def _call(helper: _Helper, fn: Callable, args: tuple, kwargs: dict) -> tuple[bool, Any]:
    """One call; the helper goes back to the idle list only after a whole answer, else it is ended
    (a half-read answer would be the next call's)."""
    try:
        answer = helper.call(fn, args, kwargs)
    except BaseException:
        with _lock:
            _busy.discard(helper)
        helper.kill()
        raise
    with _lock:
        _busy.discard(helper)
        _idle.append(helper)
        _idle_since[helper] = time.monotonic()
    return answer


def call_in_helper(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` in an idle helper process of this process (started when none is idle);
    its result, or the exception it raised. `fn` and its arguments are pickled: module-level
    functions and plain data. A helper that dies during the call raises HelperError."""
    ok, value = _call(_take(), fn, args, kwargs)
    if ok:
        return value
    raise value


def warm_up_helpers(fn: Callable, count: int = 0, dask_worker: Any = None) -> float:
    """Have `count` idle helpers (by `Client.run`: the Dask worker's thread count; else 1), each of
    which has run `fn()` once, side by side; returns the largest result (a warm-up's seconds)."""
    if not count:
        state = getattr(dask_worker, "state", dask_worker)
        count = int(getattr(state, "nthreads", 1) or 1)
    helpers = [_take() for _ in range(count)]  # each busy until its warm-up answers
    results: list = [None] * count
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            ok, value = _call(helpers[i], fn, (), {})
            if not ok:
                raise value
            results[i] = value
        except BaseException as e:  # noqa: BLE001 - re-raised below, in the caller's thread
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return max((r for r in results if isinstance(r, (int, float))), default=0.0)


def stop_helpers() -> int:
    """Stop this process's helpers, their memory going back whole; how many were stopped. Idle ones
    exit when their pipe closes; a busy one is still running a call whose step has ended (a task
    cancelled after another failed), so it is killed, and its call raises HelperError."""
    with _lock:
        idle, busy = _idle[:], list(_busy)
        _idle.clear()
        _idle_since.clear()
    _kill_busy(busy)
    for h in idle:
        h.stop()
    return len(idle) + len(busy)


def _kill_busy(busy: list[_Helper]) -> None:
    for h in busy:  # its calling thread sees the pipe close, reaps it and closes its end
        try:
            h.proc.kill()
        except OSError:
            pass


def release_helpers(keep_s: float = KEEP_IDLE_S) -> int:
    """A step that used helpers has ended: a busy one is still running a call whose step is over (a
    task cancelled after another failed), so it is killed now; idle ones are kept `keep_s` seconds for
    the next call and then stopped, their memory going back whole (0: stopped now). How many were
    killed or stopped now."""
    if keep_s <= 0:
        return stop_helpers()
    with _lock:
        busy = list(_busy)
    _kill_busy(busy)
    timer = threading.Timer(keep_s, _expire, args=(keep_s,))
    timer.daemon = True
    timer.start()
    return len(busy)


def _expire(keep_s: float) -> None:
    """Stop the helpers idle for `keep_s` seconds or more (taken from the idle list under the lock
    first, so no call can take one being stopped)."""
    now = time.monotonic()
    with _lock:
        old = [h for h in _idle if now - _idle_since.get(h, now) >= keep_s * 0.99]
        for h in old:
            _idle.remove(h)
            _idle_since.pop(h, None)
    for h in old:
        h.stop()


atexit.register(stop_helpers)


def _serve(requests: int, answers: int, parent: int) -> None:
    """A helper's loop: run each pickled (fn, args, kwargs) and answer (True, result) or (False, the
    exception, with its traceback as a note); exit when the request pipe closes (the parent stopped
    it), and, from a watchdog thread, as soon as the parent is gone, even in the middle of a call
    (its files would be written for nobody). Ctrl-C is the parent's to handle: a terminal sends it
    to the helpers too."""
    import traceback

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(OOM_SCORE_ADJ))
    except OSError:
        pass  # not Linux, or not allowed: the worker stays as exposed as the helper

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1)
        os._exit(3)

    threading.Thread(target=watch, daemon=True).start()
    while True:
        try:
            whole, request = _read_message(requests)
        except Exception as e:  # noqa: BLE001 - a request that does not unpickle here (a module it cannot import)
            _write_message(answers, (False, RuntimeError(f"the helper could not read the call: {type(e).__name__}: {e}")))
            continue
        if not whole:
            break
        fn, args, kwargs = request
        try:
            answer: tuple = (True, fn(*args, **kwargs))
        except BaseException as e:  # noqa: BLE001 - it goes back to the caller, which raises it
            if not isinstance(e, Exception):  # SystemExit, KeyboardInterrupt: not the worker's to raise
                e = RuntimeError(f"{type(e).__name__} in the helper: {e}")
            if hasattr(e, "add_note"):  # Python 3.11+
                e.add_note("in the helper process:\n" + "".join(traceback.format_exception(type(e), e, e.__traceback__)).rstrip())
            try:
                pickle.loads(pickle.dumps(e))
                answer = (False, e)
            except Exception:  # noqa: BLE001 - an exception that does not travel goes back as text
                answer = (False, RuntimeError(f"{type(e).__name__}: {e}"))
        try:
            _write_message(answers, answer)
        except Exception as e:  # noqa: BLE001 - a result that does not pickle
            _write_message(answers, (False, RuntimeError(f"the helper's result could not be sent back: {e}")))
    os._exit(0)  # skip MindSpore's interpreter teardown: nothing is left to say
