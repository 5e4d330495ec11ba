"""Two corpusmill builds and text-dedup side by side on one benchmark corpus, interleaved (A B B A),
with the removed rows of the two builds compared.

    python bench/dedup_ab.py BENCH_DIR --base BASE_DIR [--rounds 2] [--text-dedup VENV] [--methods exact,minhash]

BENCH_DIR is made by bench/dedup_corpus.py. BASE_DIR holds an earlier tree as BASE_DIR/corpusmill
(for instance `mkdir -p B/corpusmill && git archive COMMIT | tar -x -C B/corpusmill`); it runs with
PYTHONPATH=BASE_DIR, which comes before the editable install, and "new" is this checkout. Rounds run
base, new, new, base, ... so load that drifts over the run hits both alike; text-dedup (from VENV, made
by bench/dedup_bench.sh) runs once between them. Every run is measured from outside (wall, CPU seconds
of the process tree, peak RSS). The removed rows (uid, id, duplicate_of, reason, score) of every run
must be identical: the script says so or names the first difference. Writes BENCH_DIR/ab.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from dedup_bench import corpus_ids, quality, run_text_dedup  # noqa: E402
from measure import measure  # noqa: E402

REMOVED_COLUMNS = ["uid", "id", "duplicate_of", "reason", "similarity"]


def run(data: Path, out: Path, methods: str, t: float, pythonpath: str | None) -> tuple[dict, set, list]:
    exe = HERE.parent / ".venv" / "bin" / "corpusmill"
    if out.exists():
        shutil.rmtree(out)
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    else:
        env.pop("PYTHONPATH", None)
    m = measure([str(exe), "dedup", str(data), "--out", str(out), "--methods", methods, "--threshold", str(t)],
                stdout=open(os.devnull, "w"), stderr=open(str(out) + ".log", "w"), env=env)
    if m["returncode"] != 0:
        return m, set(), []
    kept = set(pq.read_table(str(out / "kept"), columns=["id"]).column("id").to_pylist())
    removed = pq.read_table(str(out / "removed"))
    cols = [c for c in REMOVED_COLUMNS if c in removed.column_names]
    rows = sorted(zip(*[removed.column(c).to_pylist() for c in cols]))
    return m, kept, rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bench", type=Path)
    ap.add_argument("--base", required=True, help="folder holding the base tree as corpusmill/")
    ap.add_argument("--rounds", type=int, default=2, help="A B pairs (A B B A for 2)")
    ap.add_argument("--text-dedup", type=Path, default=None, help="text-dedup's venv (skipped without it)")
    ap.add_argument("--methods", default="exact,minhash")
    ap.add_argument("--threshold", type=float, default=0.8)
    args = ap.parse_args()
    data = args.bench / "data"
    truth = [json.loads(x) for x in (args.bench / "truth.jsonl").read_text().splitlines()]
    all_ids, size = corpus_ids(data)
    runs = args.bench / "runs-ab"
    runs.mkdir(exist_ok=True)
    order = []
    for r in range(args.rounds):
        order += ["base", "new"] if r % 2 == 0 else ["new", "base"]
    if args.text_dedup:
        order.insert(len(order) // 2, "text-dedup")
    results: dict[str, list] = {}
    reference_rows = None
    identical = True
    for i, name in enumerate(order):
        if name == "text-dedup":
            m, kept = run_text_dedup(data, runs / "text-dedup", args.text_dedup, args.threshold)
            rows = None
        else:
            m, kept, rows = run(data, runs / f"{name}-{i}", args.methods, args.threshold,
                                str(Path(args.base).resolve()) if name == "base" else None)
        q = quality(all_ids, kept, truth, args.threshold) if m["returncode"] == 0 else {}
        r = {k: v for k, v in m.items() if k != "cmd"} | {k: q.get(k) for k in ("removed", "precision", "recall", "recall_at_t")}
        if rows is not None:
            if reference_rows is None:
                reference_rows = rows
            elif rows != reference_rows:
                identical = False
                diff = next((a, b) for a, b in zip(rows + [None] * len(reference_rows), reference_rows + [None] * len(rows)) if a != b)
                print(f"  {name} run {i}: removed rows differ from the first run's ({len(rows)} vs {len(reference_rows)}); first: {diff}")
            r["removed_rows"] = len(rows)
        results.setdefault(name, []).append(r)
        print(f"{name}: {json.dumps(r)}", flush=True)
    summary = {"documents": len(all_ids), "mb": round(size / 1e6, 1), "order": order, "identical_removed_rows": identical,
               "results": results}
    (args.bench / "ab.json").write_text(json.dumps(summary, indent=2))
    print(f"{len(all_ids):,} documents, {size / 1e6:.0f} MB; removed rows identical across corpusmill runs: {identical}")
    for name, rs in results.items():
        print(f"  {name}: wall {[x['wall_s'] for x in rs]} s, CPU {[x['cpu_s'] for x in rs]} s, "
              f"precision {rs[0].get('precision')}, recall(J>=t) {rs[0].get('recall_at_t')}")
    if "text-dedup" in results and "new" in results:
        td = results["text-dedup"][0]
        for name in ("base", "new"):
            w = min(x["wall_s"] for x in results[name])
            c = min(x["cpu_s"] for x in results[name])
            print(f"  text-dedup / {name}: wall {td['wall_s'] / w:.2f}x, CPU {td['cpu_s'] / c:.2f}x (best of its runs)")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
