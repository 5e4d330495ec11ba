"""Near-duplicate benchmark: quality per Jaccard band, speed and memory, side by side in one run.

    python bench/dedup_bench.py BENCH_DIR [--tools corpusmill,corpusmill-both,corpusmill-word,text-dedup,datatrove] [--anchors DIR]

BENCH_DIR is made by bench/dedup_corpus.py (data/*.jsonl and truth.jsonl). corpusmill runs
`corpusmill dedup` (exact + MinHash, exact + SimHash, exact alone; corpusmill-both: exact + SimHash +
MinHash in one run); the
anchors run from their own venvs under --anchors (made by bench/dedup_bench.sh): text-dedup's
MinHash (b=14, r=8, 5-grams, num_proc 2) and datatrove's four-stage MinHash (2 local tasks).
Every run goes through bench/measure.py (wall, CPU seconds and peak RSS of the whole process tree).

Quality, per planted family (a source and its copy, true Jaccard J in the space corpusmill's threshold
is on: character 5-grams after dedup's normalisation, see dedup_corpus.py):
- a family is *resolved* when exactly one of the two documents is kept;
- recall = resolved families with J >= threshold + 0.05 / all such families; recall_at_t the same
  for J >= threshold (the issue-14 target: >= 0.99);
- precision = removed documents that resolve a family with J >= threshold - 0.05 / all removed
  documents (a base document removed, or both members of a family removed, counts against it);
  precision_at_t the same counting only families with J >= threshold.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from measure import measure  # noqa: E402

BANDS = [(0.0, 0.5), (0.5, 0.6), (0.6, 0.7), (0.7, 0.75), (0.75, 0.8), (0.8, 0.85), (0.85, 0.9), (0.9, 0.95), (0.95, 1.0001)]


def corpus_ids(data: Path) -> tuple[list[str], int]:
    ids, size = [], 0
    for f in sorted(data.glob("*.jsonl")):
        size += f.stat().st_size
        with open(f, encoding="utf-8") as fh:
            ids.extend(json.loads(line)["id"] for line in fh)
    return ids, size


def quality(all_ids: list[str], kept: set[str], truth: list[dict], t: float) -> dict:
    removed = set(all_ids) - kept
    resolved = [((f["copy"] in removed) != (f["source"] in removed)) for f in truth]
    good = sum(1 for f, ok in zip(truth, resolved) if ok and f["jaccard"] >= t - 0.05)
    target = [ok for f, ok in zip(truth, resolved) if f["jaccard"] >= t + 0.05]
    bands = {}
    for lo, hi in BANDS:
        sel = [ok for f, ok in zip(truth, resolved) if f["kind"] == "near" and lo <= f["jaccard"] < hi]
        bands[f"{lo:.2f}-{min(hi, 1):.2f}"] = {"pairs": len(sel), "resolved": round(float(np.mean(sel)), 3) if sel else None}
    exact = [ok for f, ok in zip(truth, resolved) if f["kind"] == "exact"]
    by_lang = {}
    for lang in ("en", "zh"):
        sel = [ok for f, ok in zip(truth, resolved) if f["lang"] == lang and f["jaccard"] >= t + 0.05]
        by_lang[lang] = round(float(np.mean(sel)), 4) if sel else None
    at_t = [ok for f, ok in zip(truth, resolved) if f["jaccard"] >= t]
    at_09 = [ok for f, ok in zip(truth, resolved) if f["jaccard"] >= 0.9]
    strict = sum(1 for f, ok in zip(truth, resolved) if ok and f["jaccard"] >= t)
    return {
        "removed": len(removed),
        "precision": round(good / max(1, len(removed)), 4),
        "precision_at_t": round(strict / max(1, len(removed)), 4),
        "recall": round(float(np.mean(target)), 4) if target else None,
        "recall_at_t": round(float(np.mean(at_t)), 4) if at_t else None,
        "recall_at_0.9": round(float(np.mean(at_09)), 4) if at_09 else None,
        "recall_by_lang": by_lang,
        "exact_resolved": round(float(np.mean(exact)), 4) if exact else None,
        "bands": bands,
    }


def run_corpusmill(data: Path, out: Path, methods: str, t: float, unit: str = "char") -> tuple[dict, set[str]]:
    exe = HERE.parent / ".venv" / "bin" / "corpusmill"
    if out.exists():
        shutil.rmtree(out)
    extra = []
    if unit != "char":  # the shingle unit is a config setting (dedup.shingling.unit)
        cfg = Path(str(out) + ".yaml")
        cfg.write_text(f"dedup:\n  shingling:\n    unit: {unit}\n")
        extra = ["--config", str(cfg)]
    m = measure([str(exe), "dedup", str(data), "--out", str(out), "--methods", methods, "--threshold", str(t), *extra],
                stdout=open(os.devnull, "w"), stderr=open(str(out) + ".log", "w"))
    kept = set(pq.read_table(str(out / "kept"), columns=["id"]).column("id").to_pylist()) if m["returncode"] == 0 else set()
    return m, kept


def run_text_dedup(data: Path, work: Path, venv: Path, t: float) -> tuple[dict, set[str]]:
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    cmd = [str(venv / "bin" / "python"), "-m", "text_dedup.minhash", "--path", "json", "--data_files", str(data / "*.jsonl"),
           "--split", "train", "--cache_dir", str(work / "cache"), "--output", str(work / "out"), "--column", "text",
           "--b", "14", "--r", "8", "--ngram", "5", "--num_proc", "2", "--threshold", str(t)]
    m = measure(cmd, stdout=open(work / "log.txt", "w"), stderr=open(work / "err.txt", "w"))
    ids_file = work / "kept.txt"
    if m["returncode"] == 0:
        os.system(f"{venv / 'bin' / 'python'} {HERE / 'anchors' / 'text_dedup_ids.py'} {work / 'out'} {ids_file} > /dev/null 2>&1")
    return m, set(ids_file.read_text().split("\n")) - {""} if ids_file.exists() else set()


def run_datatrove(data: Path, work: Path, venv: Path) -> tuple[dict, set[str]]:
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    ids_file = work / "kept.txt"
    cmd = [str(venv / "bin" / "python"), str(HERE / "anchors" / "datatrove_minhash.py"), str(data), str(work / "w"), str(ids_file)]
    m = measure(cmd, stdout=open(work / "log.txt", "w"), stderr=open(work / "err.txt", "w"))
    return m, set(ids_file.read_text().split("\n")) - {""} if ids_file.exists() else set()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bench", type=Path)
    ap.add_argument("--tools", default="corpusmill,text-dedup,datatrove")
    ap.add_argument("--anchors", type=Path, default=HERE.parent.parent / "corpusmill-anchors",
                    help="folder holding the anchors' venvs td/ and dt/")
    ap.add_argument("--threshold", type=float, default=0.8)
    args = ap.parse_args()
    data = args.bench / "data"
    truth = [json.loads(x) for x in (args.bench / "truth.jsonl").read_text().splitlines()]
    all_ids, size = corpus_ids(data)
    runs_dir = args.bench / "runs"
    runs_dir.mkdir(exist_ok=True)
    tools = args.tools.split(",")
    results = {}

    def record(name: str, m: dict, kept: set[str], with_quality: bool = True) -> None:
        r = {**m, "docs_per_s": round(len(all_ids) / m["wall_s"]), "mb_per_s": round(size / 1e6 / m["wall_s"], 1)}
        if with_quality and m["returncode"] == 0:
            r.update(quality(all_ids, kept, truth, args.threshold))
        r.pop("cmd", None)
        results[name] = r
        print(f"{name}: {json.dumps(r)}", flush=True)

    if "corpusmill" in tools:
        record("corpusmill exact+minhash", *run_corpusmill(data, runs_dir / "cm-minhash", "exact,minhash", args.threshold))
        record("corpusmill exact+simhash", *run_corpusmill(data, runs_dir / "cm-simhash", "exact,simhash", args.threshold))
        record("corpusmill exact", *run_corpusmill(data, runs_dir / "cm-exact", "exact", args.threshold), with_quality=False)
    if "corpusmill-both" in tools:  # SimHash and MinHash in one run (the guide's "simhash plus MinHash")
        record("corpusmill exact+simhash+minhash",
               *run_corpusmill(data, runs_dir / "cm-both", "exact,simhash,minhash", args.threshold))
    if "corpusmill-word" in tools:  # the same with word 5-gram shingles (dedup.shingling.unit: word)
        record("corpusmill exact+minhash, word shingles",
               *run_corpusmill(data, runs_dir / "cm-minhash-word", "exact,minhash", args.threshold, unit="word"))
    if "text-dedup" in tools:
        record("text-dedup minhash", *run_text_dedup(data, runs_dir / "text-dedup", args.anchors / "td", args.threshold))
    if "datatrove" in tools:
        record("datatrove minhash", *run_datatrove(data, runs_dir / "datatrove", args.anchors / "dt"))
    summary = {"documents": len(all_ids), "mb": round(size / 1e6, 1), "planted": len(truth), "threshold": args.threshold,
               "results": results}
    (args.bench / "results.json").write_text(json.dumps(summary, indent=2))
    print(markdown(summary))
    return 0


def markdown(summary: dict) -> str:
    lines = [f"{summary['documents']:,} documents, {summary['mb']} MB, {summary['planted']:,} planted copies, "
             f"threshold {summary['threshold']}", "",
             "| run | wall s | CPU s | docs/s | MB/s | peak RSS MB | precision | recall (J>=t+0.05) | recall (J>=t) | "
             "recall (J>=0.9) | recall en / zh |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for name, r in summary["results"].items():
        lang = r.get("recall_by_lang") or {}
        lines.append(f"| {name} | {r['wall_s']} | {r['cpu_s']} | {r['docs_per_s']:,} | {r['mb_per_s']} | "
                     f"{r['peak_rss_tree_mb']:,} | {r.get('precision', '-')} | {r.get('recall', '-')} | {r.get('recall_at_t', '-')} | "
                     f"{r.get('recall_at_0.9', '-')} | "
                     f"{lang.get('en', '-')} / {lang.get('zh', '-')} |")
    bands = [n for n, r in summary["results"].items() if "bands" in r]
    if bands:
        lines += ["", "Share of planted near-duplicate pairs resolved, per true Jaccard band:", "",
                  "| band | pairs | " + " | ".join(bands) + " |", "|---|---:|" + "---:|" * len(bands)]
        for band in summary["results"][bands[0]]["bands"]:
            pairs = summary["results"][bands[0]]["bands"][band]["pairs"]
            cells = [str(summary["results"][n]["bands"][band]["resolved"]) for n in bands]
            lines.append(f"| {band} | {pairs} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
