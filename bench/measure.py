"""Run a command and report its wall time and peak memory, summed over the whole process tree
(the driver and every Dask worker), sampled every 0.2 s.

    python bench/measure.py --json OUT.json -- corpusmill run CONFIG --out DIR
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time

import psutil


def _tree_rss(proc: psutil.Process) -> tuple[int, int]:
    total = biggest = 0
    try:
        procs = [proc] + proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0, 0
    for p in procs:
        try:
            rss = p.memory_info().rss
        except psutil.NoSuchProcess:
            continue
        total += rss
        biggest = max(biggest, rss)
    return total, biggest


def _tree_cpu(proc: psutil.Process, seen: dict) -> None:
    """Remember the latest user+system CPU seconds of every process in the tree."""
    try:
        procs = [proc] + proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            t = p.cpu_times()
            seen[p.pid] = t.user + t.system
        except psutil.NoSuchProcess:
            continue


def measure(cmd: list[str], **popen) -> dict:
    start = time.perf_counter()
    child = subprocess.Popen(cmd, **popen)
    proc = psutil.Process(child.pid)
    peak = {"tree": 0, "process": 0}
    cpu: dict = {}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            tree, biggest = _tree_rss(proc)
            peak["tree"] = max(peak["tree"], tree)
            peak["process"] = max(peak["process"], biggest)
            _tree_cpu(proc, cpu)
            time.sleep(0.2)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    rc = child.wait()
    done.set()
    t.join()
    return {"cmd": cmd, "returncode": rc, "wall_s": round(time.perf_counter() - start, 1),
            "cpu_s": round(sum(cpu.values()), 1),
            "peak_rss_tree_mb": round(peak["tree"] / 2**20), "peak_rss_process_mb": round(peak["process"] / 2**20)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    result = measure(cmd)
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result["returncode"]


if __name__ == "__main__":
    sys.exit(main())
