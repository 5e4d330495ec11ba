"""Scale benchmark (issue 19): `corpusmill run` at 1x, 4x and 10x of a corpus made from the real one,
on the embedded LocalCluster and on a real `dask scheduler` with separate `dask worker` processes
(each with a --memory-limit and its own local directory, sharing only the data folder, as separate
machines would).

    python bench/scale_bench.py CORPUS WORK [--base-mb 500] [--scales 1,4,10] [--engines local,cluster]
                                             [--memory-limit 3GB] [--workers 2]

CORPUS is the real corpus (`../shared/data/build_corpus.sh OUT`). For each scale the corpus is made
once: `base-mb` of real documents, then for every further copy each document is rewritten by a
seeded paragraph shuffle and a substitution of 15% of its words (Latin) or characters (CJK) by
others of the same document, which keeps any two copies below a character 5-gram Jaccard of 0.5,
so copies are not duplicates of each other; on top, a known number of exact copies and of near
copies (1% of words or characters substituted) is planted, their ids
written to truth.json.

Recorded per run: wall seconds, CPU seconds of every process, peak RSS of the driver, of the largest
worker and of all processes together, bytes spilled to the workers' local directories, planted
exact and near duplicates found, whether a worker was killed (its process gone before the end), and
sha256 of the removed ids and of the shards' rows, so two engines' results can be compared. Results
go to WORK/results.jsonl and a table to stdout.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
CORPUSMILL = [sys.executable, "-m", "corpusmill.pipeline.cli"]
CJK = re.compile(r"[\u3400-\u9fff]")
PLANT_EXACT, PLANT_NEAR = 200, 200  # planted per 1x of corpus


# ---- the corpus --------------------------------------------------------------------------------
def _real_docs(corpus: Path, limit: int) -> list[dict]:
    """Real documents (text, source) in a stable order until `limit` bytes of text."""
    docs, total = [], 0
    files = sorted(p for p in corpus.rglob("*.jsonl"))
    per_file = max(1, limit // max(1, len(files)))
    for f in files:
        got = 0
        with open(f, encoding="utf-8") as fh:
            for line in fh:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                text = rec.get("text")
                if not isinstance(text, str) or len(text) < 200:
                    continue
                docs.append({"text": text, "source": rec.get("source") or f.stem})
                got += len(text.encode())
                if got >= per_file:
                    break
        total += got
        if total >= limit:
            break
    return docs


def _rewrite(text: str, rng: random.Random, rate: float, shuffle: bool) -> str:
    """Paragraphs shuffled (when asked) and `rate` of the words (Latin) or characters (CJK) replaced
    by others of the same text."""
    paras = text.split("\n\n")
    if shuffle and len(paras) > 1:
        rng.shuffle(paras)
    out = []
    for p in paras:
        if len(CJK.findall(p)) * 2 > len(p):
            chars = list(p)
            pool = [c for c in chars if CJK.match(c)] or chars
            for i in range(len(chars)):
                if rng.random() < rate and CJK.match(chars[i]):
                    chars[i] = rng.choice(pool)
            out.append("".join(chars))
        else:
            words = p.split(" ")
            for i in range(len(words)):
                if rng.random() < rate:
                    words[i] = rng.choice(words)
                    if rng.random() < 0.5:
                        words[i] = words[i][::-1]  # a reversed word is a new token: keeps copies apart
            out.append(" ".join(words))
    return "\n\n".join(out)


def make_corpus(corpus: Path, out: Path, base_bytes: int, scale: int, seed: int = 0) -> dict:
    """out/data/*.jsonl and out/truth.json (planted exact and near copies: id -> id it copies)."""
    if (out / "truth.json").is_file():
        return json.loads((out / "truth.json").read_text())
    data = out / "data"
    shutil.rmtree(out, ignore_errors=True)
    data.mkdir(parents=True)
    base = _real_docs(corpus, base_bytes)
    rng = random.Random(seed)
    truth: dict = {"exact": {}, "near": {}, "documents": 0, "bytes": 0}
    n = 0
    for copy in range(scale):
        with open(data / f"copy-{copy:03d}.jsonl", "w", encoding="utf-8") as f:
            for i, d in enumerate(base):
                text = d["text"] if copy == 0 else _rewrite(d["text"], random.Random(f"{seed}-{copy}-{i}"), 0.15, True)
                doc_id = f"c{copy}-{i}"
                f.write(json.dumps({"id": doc_id, "text": text, "source": d["source"]}, ensure_ascii=False) + "\n")
                n += 1
                truth["bytes"] += len(text.encode())
        with open(data / f"plant-{copy:03d}.jsonl", "w", encoding="utf-8") as f:
            for k in range(PLANT_EXACT + PLANT_NEAR):
                i = rng.randrange(len(base))
                original = f"c{copy}-{i}"
                src = base[i]["text"] if copy == 0 else _rewrite(base[i]["text"], random.Random(f"{seed}-{copy}-{i}"), 0.15, True)
                near = k >= PLANT_EXACT
                text = _rewrite(src, random.Random(f"plant-{copy}-{k}"), 0.01, False) if near else src
                doc_id = f"p{copy}-{k}"
                truth["near" if near else "exact"][doc_id] = original
                f.write(json.dumps({"id": doc_id, "text": text, "source": base[i]["source"]}, ensure_ascii=False) + "\n")
                n += 1
                truth["bytes"] += len(text.encode())
    truth["documents"] = n
    (out / "truth.json").write_text(json.dumps(truth))
    return truth


# ---- measuring ---------------------------------------------------------------------------------
class Sampler:
    """Peak RSS per process and CPU seconds over a set of process trees, sampled every 0.25 s."""

    def __init__(self, roots: list[psutil.Process], out: Path | None = None):
        self.roots, self.peak, self.cpu, self.total_peak = roots, {}, {}, 0
        self.names: dict[int, str] = {}
        # per step (the run's progress.json "stage"): peak of the driver, of the largest worker, of all
        self.out = out
        self.by_step: dict[str, dict[str, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _procs(self) -> list[psutil.Process]:
        out = []
        for r in self.roots:
            try:
                out += [r] + r.children(recursive=True)
            except psutil.NoSuchProcess:
                continue
        return out

    def _step(self) -> str:
        try:
            doc = json.loads((self.out / "progress.json").read_text())
            stage = doc.get("stage")
            if not stage:
                return "finish" if doc.get("state") != "running" else "setup"
            # between two steps (the runner's own work after a step: ledger, report) is its own row
            return stage if doc["stages"].get(stage, {}).get("state") == "running" else f"after {stage}"
        except (OSError, ValueError, AttributeError, TypeError, KeyError):
            return "setup"

    def _run(self) -> None:
        driver = self.roots[0].pid
        while not self._stop.is_set():
            total, worker = 0, 0
            step = self._step()
            at = self.by_step.setdefault(step, {"driver": 0, "worker": 0, "all": 0})
            for p in self._procs():
                try:
                    rss = p.memory_info().rss
                    t = p.cpu_times()
                    self.names.setdefault(p.pid, " ".join(p.cmdline()[:6])[-80:])
                except psutil.Error:
                    continue
                total += rss
                self.peak[p.pid] = max(self.peak.get(p.pid, 0), rss)
                self.cpu[p.pid] = t.user + t.system
                if p.pid == driver:
                    at["driver"] = max(at["driver"], rss)
                elif "scheduler" not in self.names[p.pid]:
                    worker = max(worker, rss)
            at["worker"] = max(at["worker"], worker)
            at["all"] = max(at["all"], total)
            self.total_peak = max(self.total_peak, total)
            time.sleep(0.25)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def start_cluster(work: Path, workers: int, memory_limit: str) -> tuple[str, list[subprocess.Popen], list[Path]]:
    """A real scheduler and `workers` worker processes, each with its own local directory."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    sched_file = work / "scheduler.json"
    bindir = Path(sys.executable).parent
    procs = [subprocess.Popen([str(bindir / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0",
                               "--dashboard-address", ":0", "--scheduler-file", str(sched_file)],
                              stdout=subprocess.DEVNULL, stderr=open(work / "scheduler.log", "w"))]
    for _ in range(600):
        if sched_file.is_file() and json.loads(sched_file.read_text() or "{}").get("address"):
            break
        time.sleep(0.1)
    address = json.loads(sched_file.read_text())["address"]
    local_dirs = []
    for i in range(workers):
        d = work / f"worker-{i}"
        d.mkdir()
        local_dirs.append(d)
        procs.append(subprocess.Popen([str(bindir / "dask"), "worker", address, "--nworkers", "1", "--nthreads", "1",
                                       "--memory-limit", memory_limit, "--local-directory", str(d), "--no-dashboard"],
                                      stdout=subprocess.DEVNULL, stderr=open(work / f"worker-{i}.log", "w"), cwd=d))
    from distributed import Client

    with Client(address, timeout=60) as c:
        c.wait_for_workers(workers, timeout=120)
    return address, procs, local_dirs


def run_once(data: Path, truth: dict, out: Path, engine: str, args) -> dict:
    cfg = {"input": {"paths": [str(data)], "part_size_mb": args.part_size_mb},
           "tokenizer": {"model": args.tokenizer}, "pack": {"seq_length": 2048},
           "shard": {"ranks": 2, "files_per_rank": 4}, "train": {"enabled": False},
           "cluster": {"n_workers": args.workers}}
    if args.components_mb is not None:  # the near-dup budget in the driver: above it, candidates and edges stay on Dask
        cfg["dedup"] = {"components_memory_mb": args.components_mb}
    cluster_procs: list[subprocess.Popen] = []
    local_dirs: list[Path] = []
    if engine == "cluster":
        address, cluster_procs, local_dirs = start_cluster(out.parent / (out.name + "-cluster"), args.workers,
                                                           args.memory_limit)
        cfg["cluster"] = {"address": address}
    else:
        cfg["cluster"]["memory_limit"] = args.memory_limit
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    (out.parent / (out.name + ".yaml")).write_text(json.dumps(cfg))
    started = time.perf_counter()
    log = open(out.parent / (out.name + ".log"), "w")
    driver = subprocess.Popen([*CORPUSMILL, "run", str(out.parent / (out.name + ".yaml")), "--out", str(out)],
                              stdout=log, stderr=subprocess.STDOUT)
    roots = [psutil.Process(driver.pid)] + [psutil.Process(p.pid) for p in cluster_procs]
    with Sampler(roots, out) as s:
        rc = driver.wait()
    wall = time.perf_counter() - started
    alive = [p.poll() is None for p in cluster_procs]
    spilled = sum(_dir_bytes(d) for d in local_dirs)
    for p in cluster_procs[::-1]:
        p.terminate()
    for p in cluster_procs:
        p.wait(timeout=60)
    removed = _removed_ids(out)
    found_exact = sum(1 for k in truth["exact"] if k in removed or truth["exact"][k] in removed)
    found_near = sum(1 for k in truth["near"] if k in removed or truth["near"][k] in removed)
    worker_peaks = [v for pid, v in s.peak.items() if pid != driver.pid and "scheduler" not in s.names.get(pid, "")]
    return {
        "engine": engine, "rc": rc, "wall_s": round(wall, 1), "cpu_s": round(sum(s.cpu.values()), 1),
        "peak_driver_mb": round(s.peak.get(driver.pid, 0) / 2**20),
        "peak_worker_mb": round(max(worker_peaks, default=0) / 2**20),
        "peak_all_mb": round(s.total_peak / 2**20),
        "spilled_mb": round(spilled / 2**20, 1),
        "workers_alive_at_end": all(alive) if alive else None,
        "planted_exact_found": f"{found_exact}/{len(truth['exact'])}",
        "planted_near_found": f"{found_near}/{len(truth['near'])}",
        "removed_sha256": hashlib.sha256("\n".join(sorted(removed)).encode()).hexdigest()[:16],
        "shards_rows": _shards_rows(out),
        "by_step_mb": {k: {r: round(v / 2**20) for r, v in d.items()} for k, d in s.by_step.items()},
    }


def _removed_ids(out: Path) -> set[str]:
    import pyarrow.parquet as pq

    ids: set[str] = set()
    for step in ("01-normalize", "02-filter", "03-exact_dedup", "04-near_dedup"):
        for f in sorted((out / step / "removed").glob("*.parquet")):
            ids.update(x for x in pq.read_table(f, columns=["id"]).column("id").to_pylist() if x)
    return ids


def _shards_rows(out: Path) -> str:
    m = out / "shards" / "manifest.json"
    if not m.is_file():
        return "-"
    files = json.loads(m.read_text())["files"]
    return hashlib.sha256(json.dumps([f.get("rows_xxh3_sum") for f in files]).encode()).hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("corpus", type=Path)
    ap.add_argument("work", type=Path)
    ap.add_argument("--base-mb", type=float, default=500)
    ap.add_argument("--scales", default="1,4,10")
    ap.add_argument("--engines", default="local,cluster")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--memory-limit", default="3GB")
    ap.add_argument("--part-size-mb", type=float, default=32)
    ap.add_argument("--components-mb", type=int, default=None,
                    help="dedup.components_memory_mb (default: the config's): near-dup candidates and edges held in "
                         "the driver up to this much, on the workers above it")
    ap.add_argument("--tokenizer", default=str(HERE.parent.parent / "shared/data/kept/tokenizers/chinese-llama-2_tokenizer.model"))
    args = ap.parse_args()
    results = []
    for scale in [int(x) for x in args.scales.split(",")]:
        made = args.work / f"corpus-{scale}x"
        truth = make_corpus(args.corpus, made, int(args.base_mb * 2**20), scale)
        print(f"{scale}x: {truth['documents']:,} documents, {truth['bytes'] / 2**20:,.0f} MB", flush=True)
        for engine in args.engines.split(","):
            r = {"scale": scale, "mb": round(truth["bytes"] / 2**20), **run_once(made / "data", truth,
                                                                              args.work / f"run-{scale}x-{engine}", engine, args)}
            print(json.dumps(r), flush=True)
            with open(args.work / "results.jsonl", "a") as f:
                f.write(json.dumps(r) + "\n")
            results.append(r)
    cols = ["scale", "mb", "engine", "rc", "wall_s", "cpu_s", "peak_driver_mb", "peak_worker_mb", "peak_all_mb",
            "spilled_mb", "workers_alive_at_end", "planted_exact_found", "planted_near_found", "removed_sha256",
            "shards_rows"]
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in results:
        print("| " + " | ".join(str(r.get(c)) for c in cols) + " |")


if __name__ == "__main__":
    main()
