"""The process a service job runs in: exactly `corpusmill ARGS`, tied to the service's life.

`python -m corpusmill.pipeline.service.jobproc --parent PID -- run CONFIG --out DIR ...` asks Linux to kill this
process when the service dies (PR_SET_PDEATHSIG), so a killed service never leaves a job writing
into a run directory that the restarted service is about to resume. The service starts it in a new
session, so a cancel can signal the whole process group.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the service died before prctl took effect
        os._exit(75)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] != "--parent" or argv[2] != "--":
        print("usage: python -m corpusmill.pipeline.service.jobproc --parent PID -- CORPUSMILL_ARGS...", file=sys.stderr)
        return 2
    _die_with_parent(int(argv[1]))
    from corpusmill.pipeline.cli import main as corpusmill

    return corpusmill(argv[3:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
