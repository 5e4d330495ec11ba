"""Scale benchmark (issue 19): `corpusmill run` at 1x, 4x and 10x of a corpus made from the real one,
on the embedded LocalCluster and on a real `dask scheduler` with separate `dask worker` processes
(each with a --memory-limit and its own local directory, sharing only the data folder, as separate
machines would).

    python bench/scale_bench.py CORPUS WORK [--base-mb 500] [--scales 1,4,10] [--engines local,cluster]
                                             [--memory-limit 3GB] [--workers 2]

CORPUS is the real corpus (`../shared/data/build_corpus.sh OUT`). The corpus of the largest scale is
made once (in `--jobs` processes): `base-mb` of real documents (extended by rewrites of them when
the real corpus is smaller), then for every further copy each document is rewritten by a seeded
paragraph shuffle and a substitution of 15% of its words (Latin) or characters (CJK) by others of
the same document, which keeps any two copies below a character 5-gram Jaccard of 0.5, so copies
are not duplicates of each other; on top, per copy, a known number of exact copies and of near
copies (1% of words or characters substituted) is planted, their ids written to truth.json. A
smaller scale is the first copies of it (a folder of links). Each run's folder is deleted after it
is measured (its report, progress, ledger and manifest are kept in run-*-kept/) unless
`--keep-runs`: a 10x run of a 500 MB base writes about 18 GB.

Recorded per run: wall seconds, CPU seconds of every process, peak RSS of the driver, of the largest
worker and of all processes together, bytes spilled to the workers' local directories, planted
exact and near duplicates found, whether a worker was killed (its process gone before the end), and
sha256 of the removed ids and of the shards' rows, so two engines' results can be compared. Results
go to WORK/results.jsonl (with each step's seconds and peak RSS) and a table to stdout; each run's
RSS timeline (every 0.25 s: seconds, step, the label of its running tasks, MB per process, the
driver first) to WORK/run-SCALEx-ENGINE-rss.tsv, to see which part of a step holds the peak.
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


def _real_docs_at_least(corpus: Path, limit: int) -> list[dict]:
    """`limit` bytes of base documents: the real ones, then (when the corpus is smaller than `limit`)
    seeded rewrites of them (paragraph shuffle, 15% substitution: below Jaccard 0.5 of their
    originals), so a 500 MB base can be made from a 391 MB corpus."""
    base = _real_docs(corpus, limit)
    total, k = sum(len(d["text"].encode()) for d in base), 0
    originals = list(base)
    while total < limit and originals:
        d = originals[k % len(originals)]
        text = _rewrite(d["text"], random.Random(f"base-{k}"), 0.15, True)
        base.append({"text": text, "source": d["source"]})
        total += len(text.encode())
        k += 1
    return base


_BASE: list[dict] = []


def _write_copy(args: tuple) -> dict:
    """copy-NNN.jsonl (the base, rewritten for copy > 0) and plant-NNN.jsonl (PLANT_EXACT exact and
    PLANT_NEAR near copies of that copy's documents). A copy depends only on (seed, copy), so the 4x
    corpus is the first four copies of the 10x one."""
    data, copy, seed = args
    base = _BASE
    rng = random.Random(f"{seed}-plant-{copy}")
    truth: dict = {"exact": {}, "near": {}, "documents": 0, "bytes": 0}

    def text_of(i: int) -> str:
        return base[i]["text"] if copy == 0 else _rewrite(base[i]["text"], random.Random(f"{seed}-{copy}-{i}"), 0.15, True)

    with open(data / f"copy-{copy:03d}.jsonl", "w", encoding="utf-8") as f:
        for i, d in enumerate(base):
            text = text_of(i)
            f.write(json.dumps({"id": f"c{copy}-{i}", "text": text, "source": d["source"]}, ensure_ascii=False) + "\n")
            truth["documents"] += 1
            truth["bytes"] += len(text.encode())
    with open(data / f"plant-{copy:03d}.jsonl", "w", encoding="utf-8") as f:
        for k in range(PLANT_EXACT + PLANT_NEAR):
            i = rng.randrange(len(base))
            near = k >= PLANT_EXACT
            text = _rewrite(text_of(i), random.Random(f"plant-{copy}-{k}"), 0.01, False) if near else text_of(i)
            doc_id = f"p{copy}-{k}"
            truth["near" if near else "exact"][doc_id] = f"c{copy}-{i}"
            f.write(json.dumps({"id": doc_id, "text": text, "source": base[i]["source"]}, ensure_ascii=False) + "\n")
            truth["documents"] += 1
            truth["bytes"] += len(text.encode())
    return truth


def make_corpus(corpus: Path, out: Path, base_bytes: int, scale: int, seed: int = 0, jobs: int = 2) -> list[dict]:
    """out/data/{copy,plant}-NNN.jsonl for `scale` copies (made in `jobs` processes); returns each
    copy's truth (planted id -> the id it copies, documents, bytes), also kept in out/truth.json."""
    if (out / "truth.json").is_file():
        return json.loads((out / "truth.json").read_text())
    data = out / "data"
    shutil.rmtree(out, ignore_errors=True)
    data.mkdir(parents=True)
    global _BASE
    _BASE = _real_docs_at_least(corpus, base_bytes)  # read by the forked writers, not pickled to them
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        per_copy = pool.map(_write_copy, [(data, c, seed) for c in range(scale)], chunksize=1)
    (out / "truth.json").write_text(json.dumps(per_copy))
    return per_copy


def corpus_at(made: Path, per_copy: list[dict], scale: int, work: Path) -> tuple[Path, dict]:
    """The first `scale` copies of the made corpus as their own folder of links, and their truth."""
    data = work / f"data-{scale}x"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    for c in range(scale):
        for kind in ("copy", "plant"):
            (data / f"{kind}-{c:03d}.jsonl").symlink_to(made / "data" / f"{kind}-{c:03d}.jsonl")
    truth = {"exact": {}, "near": {}, "documents": 0, "bytes": 0}
    for t in per_copy[:scale]:
        truth["exact"].update(t["exact"])
        truth["near"].update(t["near"])
        truth["documents"] += t["documents"]
        truth["bytes"] += t["bytes"]
    return data, truth


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

    def _step(self) -> tuple[str, str]:
        """(the running step, or "after STEP" between steps; the label of its running tasks)."""
        try:
            doc = json.loads((self.out / "progress.json").read_text())
            stage = doc.get("stage")
            if not stage:
                return ("finish" if doc.get("state") != "running" else "setup"), ""
            label = (doc.get("step") or {}).get("label", "")
            # between two steps (the runner's own work after a step: ledger, report) is its own row
            if doc["stages"].get(stage, {}).get("state") == "running":
                return stage, label
            return f"after {stage}", ""
        except (OSError, ValueError, AttributeError, TypeError, KeyError):
            return "setup", ""

    def _run(self) -> None:
        driver = self.roots[0].pid
        started = time.perf_counter()
        timeline = open(self.out.parent / (self.out.name + "-rss.tsv"), "w") if self.out else None
        while not self._stop.is_set():
            total, worker = 0, 0
            step, label = self._step()
            rss_of: dict[int, int] = {}
            at = self.by_step.setdefault(step, {"driver": 0, "worker": 0, "all": 0})
            for p in self._procs():
                try:
                    rss = p.memory_info().rss
                    t = p.cpu_times()
                    self.names.setdefault(p.pid, " ".join(p.cmdline()[:6])[-80:])
                except psutil.Error:
                    continue
                total += rss
                rss_of[p.pid] = rss
                self.peak[p.pid] = max(self.peak.get(p.pid, 0), rss)
                self.cpu[p.pid] = t.user + t.system
                if p.pid == driver:
                    at["driver"] = max(at["driver"], rss)
                elif "scheduler" not in self.names[p.pid]:
                    worker = max(worker, rss)
            at["worker"] = max(at["worker"], worker)
            at["all"] = max(at["all"], total)
            self.total_peak = max(self.total_peak, total)
            if timeline:  # seconds, step, task label, then MB per process (the driver first)
                cells = [f"{pid}:{rss >> 20}" for pid, rss in sorted(rss_of.items(), key=lambda kv: kv[0] != driver)]
                timeline.write(f"{time.perf_counter() - started:.1f}\t{step}\t{label}\t" + "\t".join(cells) + "\n")
            time.sleep(0.25)
        if timeline:
            timeline.close()

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
    run_bytes = _dir_bytes(out)
    try:
        stages = json.loads((out / "progress.json").read_text()).get("stages", {})
        step_s = {k: v.get("seconds") for k, v in stages.items() if v.get("seconds") is not None}
    except (OSError, ValueError):
        step_s = {}
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
        "step_s": step_s,
        "run_dir_gb": round(run_bytes / 2**30, 2),
    }


def _discard_run(out: Path) -> None:
    """Keep the run's report, progress, ledger and manifest beside it; drop its parts (a 10x run of a
    500 MB base writes about 18 GB)."""
    keep = out.parent / (out.name + "-kept")
    shutil.rmtree(keep, ignore_errors=True)
    keep.mkdir()
    for name in ("report.md", "progress.json", "ledger.json", "summary.json", "shards/manifest.json"):
        if (out / name).is_file():
            shutil.copy(out / name, keep / name.replace("/", "-"))
    shutil.rmtree(out, ignore_errors=True)


def _removed_ids(out: Path) -> set[str]:
    import pyarrow.parquet as pq

    ids: set[str] = set()
    for step in ("01-normalize", "02-filter", "03-exact_dedup", "04-near_dedup"):
        for f in sorted((out / step / "removed").glob("*.parquet")):
            ids.update(x for x in pq.read_table(f, columns=["id"]).column("id").to_pylist() if x)
    return ids


def _shards_rows(out: Path) -> str:
    """A hash of each rank's rows (per rank, the sum of its files' row digests), so two runs compare
    equal when their ranks hold the same samples, however shard.max_samples_per_file cut them into files."""
    m = out / "shards" / "manifest.json"
    if not m.is_file():
        return "-"
    return rank_rows_hash(json.loads(m.read_text()))


def rank_rows_hash(manifest: dict) -> str:
    by_rank: dict = {}
    for f in manifest["files"]:
        key = f.get("rank") if f.get("rank") is not None else -1  # global layout: one set
        by_rank[key] = (by_rank.get(key, 0) + int(f.get("rows_xxh3_sum") or 0)) % (1 << 64)
    return hashlib.sha256(json.dumps(sorted(by_rank.items())).encode()).hexdigest()[:16]


def _positive(value: str) -> int:
    """argparse type: an integer of at least 1."""
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"expected an integer of at least 1, got {value!r}")
    return int(value)


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
    ap.add_argument("--keep-runs", action="store_true", help="keep every run's folder (default: only its report)")
    ap.add_argument("--jobs", type=_positive, default=2, help="processes making the corpus")
    ap.add_argument("--tokenizer", default=str(HERE.parent.parent / "shared/data/kept/tokenizers/chinese-llama-2_tokenizer.model"))
    ap.add_argument("--tables", action="store_true", help="only print the tables of WORK/results.jsonl")
    args = ap.parse_args()
    if args.tables:
        if not (args.work / "results.jsonl").is_file():
            ap.error(f"--tables: {args.work / 'results.jsonl'} does not exist (no run has finished in {args.work})")
        print(tables([json.loads(line) for line in open(args.work / "results.jsonl")]))
        return
    results = []
    scales = [int(x) for x in args.scales.split(",")]
    # a corpus made earlier for a larger scale serves (its first copies are the smaller corpus)
    made = min((d for d in args.work.glob("corpus-*x") if (d / "truth.json").is_file()
                and int(d.name[7:-1]) >= max(scales)), key=lambda d: int(d.name[7:-1]),
               default=args.work / f"corpus-{max(scales)}x")
    per_copy = make_corpus(args.corpus, made, int(args.base_mb * 2**20), max(scales), jobs=args.jobs)
    for scale in scales:
        data, truth = corpus_at(made, per_copy, scale, args.work)
        print(f"{scale}x: {truth['documents']:,} documents, {truth['bytes'] / 2**20:,.0f} MB", flush=True)
        for engine in args.engines.split(","):
            out = args.work / f"run-{scale}x-{engine}"
            r = {"scale": scale, "mb": round(truth["bytes"] / 2**20), **run_once(data, truth, out, engine, args)}
            print(json.dumps(r), flush=True)
            with open(args.work / "results.jsonl", "a") as f:
                f.write(json.dumps(r) + "\n")
            results.append(r)
            if not args.keep_runs:
                _discard_run(out)
    print(tables(results))


STEPS = ("read", "normalize", "filter", "exact_dedup", "near_dedup", "tokenize", "pack", "shard", "after shard")


def tables(results: list[dict]) -> str:
    """Markdown: one row per run; peak RSS per step (driver / largest worker, MB); seconds per step
    with each step's ratio to the same engine's smallest scale."""
    cols = ["scale", "mb", "engine", "rc", "wall_s", "cpu_s", "peak_driver_mb", "peak_worker_mb", "peak_all_mb",
            "spilled_mb", "workers_alive_at_end", "planted_exact_found", "planted_near_found", "removed_sha256",
            "shards_rows"]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(str(r.get(c)) for c in cols) + " |" for r in results]
    out += ["", "| run | " + " | ".join(STEPS) + " |", "|---|" + "---:|" * len(STEPS)]
    for r in results:
        by = r.get("by_step_mb", {})
        out.append(f"| {r['scale']}x {r['engine']} | " + " | ".join(
            f"{by[s]['driver']} / {by[s]['worker']}" if s in by else "-" for s in STEPS) + " |")
    base = {}
    for r in sorted(results, key=lambda r: r["scale"]):
        base.setdefault(r["engine"], r)
    out += ["", "| run | " + " | ".join(STEPS[:-1]) + " | wall |", "|---|" + "---:|" * len(STEPS)]
    for r in results:
        b, steps = base[r["engine"]], r.get("step_s", {})
        same = r is b
        out.append(f"| {r['scale']}x {r['engine']} | " + " | ".join(
            _cell(steps.get(s), b.get("step_s", {}).get(s), same) for s in STEPS[:-1])
            + f" | {_cell(r['wall_s'], b['wall_s'], same)} |")
    return "\n".join(out)


def _cell(value, ref, same: bool) -> str:
    """Seconds, and (but on the base run) their ratio to the base run's."""
    if value is None:
        return "-"
    return f"{value:.0f}" if same or not ref else f"{value:.0f} ({value / ref:.1f}x)"


if __name__ == "__main__":
    main()
