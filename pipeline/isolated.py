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
step that used them stops them with `stop_helpers` on every worker when it ends.
"""
from __future__ import annotations

import atexit
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
from typing import Any, Callable, Optional

_LENGTH = struct.Struct("<Q")
_SERVE = "import sys; from corpusmill.pipeline.isolated import _serve; _serve(int(sys.argv[1]), int(sys.argv[2]))"


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
        try:
            # stdout goes to stderr: MindSpore's C++ code may print, and nothing shares the answer pipe
            self.proc = subprocess.Popen([sys.executable, "-c", _SERVE, str(to_child), str(from_child)],
                                         pass_fds=(to_child, from_child), stdin=subprocess.DEVNULL,
                                         stdout=sys.stderr.fileno() if _has_fileno(sys.stderr) else None, env=env)
        except OSError as e:
            for fd in (self._requests, self._answers):
                os.close(fd)
            raise HelperError(f"could not start a helper process: {e}") from None
        finally:
            os.close(to_child)
            os.close(from_child)
        try:  # the child imports what this process can: a worker's uploaded files, a test's modules
            _write_message(self._requests, list(sys.path))
        except OSError:
            pass  # it died at once: the first call says how

    def call(self, fn: Callable, args: tuple, kwargs: dict) -> Any:
        try:
            _write_message(self._requests, (fn, args, kwargs))
            whole, answer = _read_message(self._answers)
        except BrokenPipeError:
            whole, answer = False, None
        if not whole:
            raise HelperError(f"the helper process running {getattr(fn, '__name__', fn)} {self._ending()}")
        ok, value = answer
        if ok:
            return value
        raise value

    def _ending(self) -> str:
        """How the process ended, in words (it closed its pipe, so it is ending)."""
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return "stopped answering"
        if code < 0:
            name = signal.Signals(-code).name
            hint = " (out of memory? the kernel's OOM killer sends SIGKILL)" if -code == signal.SIGKILL else ""
            return f"was killed by {name}{hint}"
        return f"exited with code {code}"

    def stop(self) -> None:
        for fd in (self._requests, self._answers):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            self.proc.wait(timeout=30)  # it exits when its request pipe closes
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _has_fileno(stream: Any) -> bool:
    try:
        stream.fileno()
        return True
    except (AttributeError, OSError, ValueError):
        return False


_idle: list[_Helper] = []
_lock = threading.Lock()


def call_in_helper(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` in an idle helper process of this process (started when none is idle);
    its result, or the exception it raised. `fn` and its arguments are pickled: module-level
    functions and plain data. A helper that dies during the call raises HelperError."""
    with _lock:
        helper = _idle.pop() if _idle else None
    if helper is None:
        helper = _Helper()
    try:
        value = helper.call(fn, args, kwargs)
    except HelperError:
        helper.stop()
        raise
    except BaseException:
        with _lock:
            _idle.append(helper)  # the call raised, the helper is fine
        raise
    with _lock:
        _idle.append(helper)
    return value


def warm_up_helpers(fn: Callable, count: int = 0, dask_worker: Any = None) -> float:
    """Have `count` idle helpers (by `Client.run`: the Dask worker's thread count; else 1), each of
    which has run `fn()` once, side by side; returns the largest result (a warm-up's seconds)."""
    if not count:
        state = getattr(dask_worker, "state", dask_worker)
        count = int(getattr(state, "nthreads", 1) or 1)
    with _lock:
        taken, _idle[:] = _idle[:count], _idle[count:]
    helpers: list[Optional[_Helper]] = taken + [None] * (count - len(taken))  # None: start one
    results: list = [None] * count
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            if helpers[i] is None:
                helpers[i] = _Helper()
            results[i] = helpers[i].call(fn, (), {})
        except BaseException as e:  # noqa: BLE001 - re-raised below, in the caller's thread
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for h in helpers:
        if h is not None and h.proc.poll() is not None:
            h.stop()  # it died (its error is among `errors`): close its pipes
    with _lock:
        _idle.extend(h for h in helpers if h is not None and h.proc.poll() is None)
    if errors:
        raise errors[0]
    return max((r for r in results if isinstance(r, (int, float))), default=0.0)


def stop_helpers() -> int:
    """Stop this process's idle helpers (their memory goes back whole); how many were stopped."""
    with _lock:
        helpers, _idle[:] = _idle[:], []
    for h in helpers:
        h.stop()
    return len(helpers)


atexit.register(stop_helpers)


def _serve(requests: int, answers: int) -> None:
    """A helper's loop: run each pickled (fn, args, kwargs) and answer (True, result) or (False,
    the exception); exit when the request pipe closes (the parent stopped it, or died). Ctrl-C is
    the parent's to handle: a terminal sends it to the helpers too."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    whole, path = _read_message(requests)
    if whole:
        sys.path[:] = path
    while whole:
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
            try:
                pickle.loads(pickle.dumps(e))
                answer = (False, e)
            except Exception:  # noqa: BLE001 - an exception that does not travel goes back as text
                answer = (False, RuntimeError(f"{type(e).__name__}: {e}"))
        try:
            _write_message(answers, answer)
        except Exception as e:  # noqa: BLE001 - a result that does not pickle
            _write_message(answers, (False, RuntimeError(f"the helper's result could not be sent back: {e}")))
    os._exit(0)  # the request pipe closed; skip MindSpore's interpreter teardown: nothing is left to say
