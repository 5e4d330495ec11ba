"""Two corpusmill builds side by side on one config: runs alternate (A, B, A, B, ...), each under a
sampler of the CPU time of its whole process tree (driver and Dask workers, every 0.5 s), so each
step's wall seconds (progress.json) get their CPU seconds too. Prints one table; the machine is
shared, so compare the ratios within one invocation.

    python bench/step_ab.py --config C.yaml --out DIR --rounds 1 \
        --run main=/work/main/.venv/bin/corpusmill --run new=.venv/bin/corpusmill
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure import _tree_cpu  # noqa: E402  (the same process-tree CPU reading as bench/measure.py)


def _sample(proc: psutil.Popen, samples: list, stop: threading.Event) -> None:
    seen: dict[int, float] = {}
    while not stop.is_set():
        _tree_cpu(proc, seen)
        samples.append((time.time(), sum(seen.values())))
        stop.wait(0.5)


def _cpu_between(samples: list, t0: float, t1: float) -> float:
    def at(t: float) -> float:
        before = [c for s, c in samples if s <= t]
        return before[-1] if before else 0.0
    return at(t1) - at(t0)


def _utc(s: str) -> float:
    return datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()


def run_once(label: str, exe: str, config: str, out: Path) -> dict:
    """One `corpusmill run` into out/label: wall, CPU (whole tree), and per step wall and CPU."""
    folder = out / label
    subprocess.run(["rm", "-rf", str(folder)], check=True)
    load = os.getloadavg()
    samples: list = []
    stop = threading.Event()
    start = time.time()
    with open(out / f"{label}.log", "w") as log:
        proc = psutil.Popen([exe, "run", config, "--out", str(folder)], stdout=log, stderr=subprocess.STDOUT)
        sampler = threading.Thread(target=_sample, args=(proc, samples, stop), daemon=True)
        sampler.start()
        rc = proc.wait()
    wall = time.time() - start
    stop.set()
    sampler.join()
    progress = json.loads((folder / "progress.json").read_text())
    steps = {}
    for name, s in progress.get("stages", {}).items():
        if s.get("started_utc") and s.get("finished_utc"):
            steps[name] = {"wall": s.get("seconds"), "cpu": round(_cpu_between(samples, _utc(s["started_utc"]), _utc(s["finished_utc"]) + 1), 1)}
    return {"label": label, "rc": rc, "wall": round(wall, 1), "cpu": round(samples[-1][1] if samples else 0.0, 1),
            "load_before": [round(x, 1) for x in load], "load_after": [round(x, 1) for x in os.getloadavg()], "steps": steps}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--run", action="append", required=True, help="label=path/to/corpusmill (two or more)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--input-mb", type=float, default=None, help="MB of the corpus, for MB/s columns")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    builds = [r.split("=", 1) for r in args.run]
    results = []
    for k in range(args.rounds):
        for label, exe in builds:
            r = run_once(f"{label}-{k}", exe, args.config, out)
            results.append(r)
            print(json.dumps(r), flush=True)
    (out / "step_ab.json").write_text(json.dumps(results, indent=1))
    mb = args.input_mb
    print("\n| run | load (1 min) before/after | wall s | CPU s | filter wall s | filter CPU s | filter MB/s per core (wall x 2) | filter MB per CPU s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        f = r["steps"].get("filter", {})
        per_core = f"{mb / (f['wall'] * 2):.1f}" if mb and f.get("wall") else "-"
        per_cpu = f"{mb / f['cpu']:.1f}" if mb and f.get("cpu") else "-"
        print(f"| {r['label']} | {r['load_before'][0]} / {r['load_after'][0]} | {r['wall']} | {r['cpu']} | {f.get('wall')} | "
              f"{f.get('cpu')} | {per_core} | {per_cpu} |")


if __name__ == "__main__":
    main()
