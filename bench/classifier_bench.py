"""Learned quality selection on the real corpus (issue 33), in one invocation of a few minutes:

1. `corpusmill quality train` a zh+en fastText classifier on a labelled split of /work/corpus by source
   (books and laws against dictionary entries and man pages) and print its held-out precision / recall / AUC;
2. the model's scoring throughput on one core (documents and MB per CPU second, as the filter step prepares them);
3. the whole pipeline (read .. shard with a real SentencePiece model) on a slice of every source of the corpus,
   without classifier and with it scoring every document but keeping all (so the later steps get the same
   documents), in the order A B B A on one LocalCluster: the ratio of the wall and CPU seconds;
4. a `keep_top_fraction: 0.5` run on the same slice: what it keeps per source.

    .venv/bin/python bench/classifier_bench.py [--corpus /work/corpus] [--slice 0.05] [--out /tmp/clf-bench]

The machine is shared: compare the ratios within one invocation, not seconds across invocations.
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
POSITIVE = ["en/gutenberg.jsonl", "zh/lawrefbook.jsonl"]
NEGATIVE = ["en/dict-gcide.jsonl", "en/dict-wn.jsonl", "en/manpages.jsonl", "en/manpages-dev.jsonl",
            "zh/manpages-zh.jsonl"]
TOKENIZER = Path("/work/shared/data/kept/tokenizers/chinese-llama-2_tokenizer.model")


def make_slice(corpus: Path, out: Path, share: float) -> tuple[int, int]:
    """The first `share` of every file's bytes (whole lines), so every source is in the slice."""
    docs = size = 0
    for f in sorted(corpus.glob("*/*.jsonl")):
        budget = max(1, int(f.stat().st_size * share))
        target = out / f.parent.name / f.name
        target.parent.mkdir(parents=True, exist_ok=True)
        taken = 0
        with open(f, "rb") as src, open(target, "wb") as dst:
            for line in src:
                dst.write(line)
                taken += len(line)
                docs += 1
                if taken >= budget:
                    break
        size += taken
    return docs, size


def tree_cpu(seen: dict) -> float:
    """CPU seconds of this process and every child (the Dask workers), the children's last reading kept
    once they end."""
    me = psutil.Process()
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            seen[p.pid] = t.user + t.system
        except psutil.Error:
            pass
    return sum(seen.values())


def run(cfg: dict, out: Path, client) -> dict:  # noqa: ANN001 - a distributed.Client
    from corpusmill.pipeline.config import parse_config
    from corpusmill.pipeline.runner import Pipeline

    shutil.rmtree(out, ignore_errors=True)
    seen: dict = {}
    cpu0, t0 = tree_cpu(seen), time.perf_counter()
    result = Pipeline(parse_config(cfg), out, client=client, log=lambda m: None).run()
    return {"wall": time.perf_counter() - t0, "cpu": tree_cpu(seen) - cpu0, "stats": result.stages}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default="/work/corpus")
    ap.add_argument("--slice", type=float, default=0.05, help="share of every file in the pipeline runs (default 0.05)")
    ap.add_argument("--max-docs", type=int, default=3000, help="training documents per side (default 3000)")
    ap.add_argument("--out", default="/tmp/clf-bench")
    args = ap.parse_args()
    corpus, out = Path(args.corpus), Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    report: dict = {"slice": args.slice}
    began = time.perf_counter()

    # 1. train with the command a user runs
    model = out / "quality.bin"
    t0 = time.perf_counter()
    cmd = [str(ROOT / ".venv/bin/corpusmill"), "quality", "train", "--positive", *[str(corpus / p) for p in POSITIVE],
           "--negative", *[str(corpus / n) for n in NEGATIVE], "--out", str(model), "--max-docs", str(args.max_docs),
           "--seed", "0", "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
        print(done.stderr.strip(), file=sys.stderr)
        return 1
    trained = json.loads(done.stdout)
    report["train"] = {"seconds": round(time.perf_counter() - t0, 1), "docs": trained["train_docs"],
                       "holdout": trained["holdout"], "model_mb": round(model.stat().st_size / 1e6, 1)}
    print(f"train: {trained['train_docs']} documents, {report['train']['seconds']} s, model "
          f"{report['train']['model_mb']} MB; held out: " + ", ".join(
              f"{k} {v:.4f}" for k, v in trained["holdout"].items() if k in ("precision", "recall", "accuracy", "auc")), flush=True)

    # 2. scoring throughput on one core, on the normalised text of a sample of every source
    from corpusmill.stages import classifier as clf
    from corpusmill.stages.normalize import normalize_array

    import pyarrow as pa

    rng = random.Random(0)
    texts = []
    for f in sorted(corpus.glob("*/*.jsonl")):
        with open(f, encoding="utf-8") as fh:
            for i, line in enumerate(fh):
                if i >= 400:
                    break
                texts.append(json.loads(line)["text"])
    rng.shuffle(texts)
    texts = normalize_array(pa.array(texts, pa.string())).to_pylist()
    m = clf.load(str(model))
    c0 = time.process_time()
    scores = clf.score_texts(m, texts, "__label__hq")
    cpu = time.process_time() - c0
    mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    read_mb = sum(len(t[:clf.DEFAULT_MAX_CHARS].encode("utf-8")) for t in texts) / 1e6
    report["scoring_one_core"] = {"docs": len(texts), "mb": round(mb, 1), "cpu_s": round(cpu, 2),
                                  "docs_per_cpu_s": round(len(texts) / cpu), "mb_per_cpu_s": round(mb / cpu, 1),
                                  "read_mb_per_cpu_s": round(read_mb / cpu, 1),
                                  "mean_score": round(float(np.mean(scores)), 3)}
    print(f"scoring (one core): {len(texts)} documents, {mb:.1f} MB in {cpu:.2f} CPU s: "
          f"{len(texts) / cpu:,.0f} docs/s, {mb / cpu:.1f} MB/s of documents ({read_mb / cpu:.1f} MB/s of the "
          f"first {clf.DEFAULT_MAX_CHARS} characters the model reads)", flush=True)

    # 3. and 4. the pipeline on a slice, side by side
    from distributed import Client, LocalCluster

    sl = out / "slice"
    docs, size = make_slice(corpus, sl, args.slice)
    report["slice_docs"], report["slice_mb"] = docs, round(size / 1e6, 1)
    print(f"slice: {docs:,} documents, {size / 1e6:.1f} MB ({args.slice:g} of every file)", flush=True)
    base = {"input": {"paths": [str(sl / "en"), str(sl / "zh")], "part_size_mb": 8}, "tokenizer": {"model": str(TOKENIZER), "add_bos": True},
            "pack": {"seq_length": 2048}, "shard": {"ranks": 2, "files_per_rank": 1}}
    scored = json.loads(json.dumps(base))
    scored["filter"] = {"classifiers": [{"name": "quality", "model": str(model),
                                         "buckets": [{"name": "high", "min": 0.5}, {"name": "low", "min": 0, "max": 0.5}]}]}
    top = json.loads(json.dumps(base))
    top["filter"] = {"classifiers": [{"name": "quality", "model": str(model), "keep_top_fraction": 0.5}]}
    per_language = json.loads(json.dumps(base))  # the same model, each language's own top half
    per_language["filter"] = {"classifiers": [{"name": lg, "model": str(model), "match": {"language": lg},
                                               "keep_top_fraction": 0.5} for lg in ("zh", "en")]}
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                           dashboard_address="127.0.0.1:0", scheduler_kwargs={"dashboard": False})
    client = Client(cluster)
    try:
        warm = json.loads(json.dumps(scored))
        tiny = out / "tiny"
        make_slice(corpus, tiny, 0.002)
        warm["input"]["paths"] = [str(tiny / "en"), str(tiny / "zh")]
        run(warm, out / "run-warm", client)  # imports, numba, the tokenizer and the model in every worker
        runs: dict[str, list] = {"without": [], "with": []}
        for label in ("without", "with", "with", "without"):
            r = run(base if label == "without" else scored, out / f"run-{label}", client)
            runs[label].append(r)
            print(f"  {label} classifier: {r['wall']:.1f} s wall, {r['cpu']:.1f} CPU s", flush=True)
        wall = {k: sum(r["wall"] for r in v) for k, v in runs.items()}
        cpu = {k: sum(r["cpu"] for r in v) for k, v in runs.items()}
        c = runs["with"][-1]["stats"]["filter"]["classifiers"]
        report["pipeline"] = {"wall_s": {k: round(v / 2, 1) for k, v in wall.items()},
                              "cpu_s": {k: round(v / 2, 1) for k, v in cpu.items()},
                              "wall_ratio": round(wall["with"] / wall["without"], 3),
                              "cpu_ratio": round(cpu["with"] / cpu["without"], 3),
                              "scoring_in_run": c["scoring"], "buckets": c.get("buckets")}
        print(f"pipeline with / without the classifier: wall {report['pipeline']['wall_ratio']:.3f}, CPU "
              f"{report['pipeline']['cpu_ratio']:.3f}; in the run the model scored "
              f"{c['scoring']['docs_per_cpu_second']:,.0f} docs and {c['scoring']['mb_per_cpu_second']:.2f} M chars "
              "per CPU second", flush=True)
        for key, conf in (("top_half", top), ("top_half_per_language", per_language)):
            r = run(conf, out / f"run-{key}", client)
            c = r["stats"]["filter"]["classifiers"]
            per: dict = {}
            for column in c["by_source"].values():
                for src, v in column.items():
                    have = per.setdefault(src.split("=")[0].split("@")[0], {"scored": 0, "kept": 0})
                    have["scored"] += v["scored"]
                    have["kept"] += v["kept"]
            for v in per.values():
                v["share"] = round(v["kept"] / v["scored"], 3) if v["scored"] else None
            report[key] = {"thresholds": {k: q["threshold"] for k, q in c["quantiles"].items()}, "by_source": per,
                           "wall_s": round(r["wall"], 1), "docs_in": r["stats"]["filter"]["docs_in"],
                           "docs_out": r["stats"]["filter"]["docs_out"]}
            print(f"{key}: thresholds " + ", ".join(f"{k} {t:.4f}" for k, t in report[key]["thresholds"].items())
                  + "; kept per source (of the documents the rules kept):")
            for src, v in sorted(per.items(), key=lambda kv: -(kv[1]["share"] or 0)):
                print(f"  {src:36s} {v['kept']:6,} / {v['scored']:6,}  {100 * (v['share'] or 0):5.1f}%")
    finally:
        client.close()
        cluster.close()
    report["seconds"] = round(time.perf_counter() - began, 1)
    (out / "classifier_bench.json").write_text(json.dumps(report, indent=2))
    print(f"total {report['seconds']} s; figures in {out / 'classifier_bench.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
