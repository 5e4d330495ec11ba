"""corpusmill against datatrove, side by side on the same input with the same tokenizer library.

    python bench/datatrove_compare.py WORK --datatrove-python /work/anchors/dt/bin/python
        [--corpus /work/corpus/en] [--mb 98] [--rounds 1] [--json OUT.json]

1. The slice: about --mb MB of every file of CORPUS (JSONL), every k-th document of every file with
   the same fractional stride k = total/target (so Gutenberg books and long man pages are in it),
   written in file order as four files of about equal bytes (datatrove hands whole files to its two
   tasks; equal files keep both busy). Deterministic; rebuilt only when WORK/slice is missing.
2. The tokenizer: a 32k byte-level BPE tokenizer.json (ByteLevel pre-tokenizer, <|endoftext|> as EOS)
   trained with `tokenizers` on the slice, outside the timing; both tools load it from disk.
3. The runs, in A B B A order per round (corpusmill, datatrove, datatrove, corpusmill; --order), each measured
   from outside by bench/measure.py (wall, CPU seconds of the whole process tree, peak RSS):
   - corpusmill: `corpusmill run` with that tokenizer (tokenizer.kind hf), filters, exact + MinHash
     dedup, pack and MindRecord shards at their defaults, no training;
   - datatrove (bench/datatrove/pipeline.py in its own venv): JsonlReader -> Gopher repetition,
     Gopher quality, C4 quality filters -> MinHash signatures, buckets, cluster, filter (its
     defaults: 5-grams, 14 x 8) -> DocumentTokenizer; LocalPipelineExecutor, 2 tasks on 2 workers.
4. Prints a table (wall, CPU s, peak RSS, documents in / kept / removed, tokens out) and the ratios
   datatrove / corpusmill of wall and CPU seconds (the median over the runs of each side and each
   A-B pair's own ratio), and writes the figures as JSON (--json, default WORK/datatrove_compare.json).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from measure import measure  # noqa: E402

EOS = "<|endoftext|>"
FILES = 4


def build_slice(corpus: Path, out: Path, target_mb: float) -> dict:
    """Every k-th document of every file (k = total bytes / target, fractional), cut into FILES files."""
    meta_file = out.with_name(out.name + ".json")  # beside the slice, not in it (the readers take the folder)
    if meta_file.exists() and out.is_dir():
        return json.loads(meta_file.read_text())
    files = sorted(corpus.glob("*.jsonl"))
    total = sum(f.stat().st_size for f in files)
    stride = total / (target_mb * 1e6)
    lines: list[bytes] = []
    for f in files:
        with open(f, "rb") as fh:
            for i, line in enumerate(fh):
                if int((i + 1) / stride) > int(i / stride) and line.strip():
                    lines.append(line if line.endswith(b"\n") else line + b"\n")
    size = sum(len(x) for x in lines)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    start, acc, part = 0, 0, 0
    for j, line in enumerate(lines):
        acc += len(line)
        if acc >= size * (part + 1) / FILES or j == len(lines) - 1:
            (tmp / f"slice-{part:03d}.jsonl").write_bytes(b"".join(lines[start:j + 1]))
            start, part = j + 1, part + 1
    meta = {"corpus": str(corpus), "stride": round(stride, 4), "documents": len(lines), "bytes": size,
            "files": part}
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    meta_file.write_text(json.dumps(meta, indent=1))
    return meta


def train_tokenizer(slice_dir: Path, path: Path, vocab: int = 32000) -> None:
    """A byte-level BPE tokenizer.json trained on the slice (each document's first 20,000 characters)."""
    if path.exists():
        return
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    def texts():
        for f in sorted(slice_dir.glob("*.jsonl")):
            for line in open(f, encoding="utf-8"):
                yield json.loads(line)["text"][:20000]

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts(), trainer=trainer)
    tmp = path.with_suffix(".tmp")
    tok.save(str(tmp))
    tmp.rename(path)


def corpusmill_config(work: Path, slice_dir: Path, tokenizer: Path) -> Path:
    cfg = work / "corpusmill.yaml"
    cfg.write_text(json.dumps({
        "config_version": 2,
        "input": {"paths": [str(slice_dir)]},
        "tokenizer": {"model": str(tokenizer), "kind": "hf", "eos_token": EOS},
    }, indent=1))
    return cfg


def run_corpusmill(work: Path, cfg: Path, tag: str) -> dict:
    out = work / "runs" / f"corpusmill-{tag}"
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(work / "runs" / f"corpusmill-{tag}.log", "wb") as log:
        m = measure([str(ROOT / ".venv/bin/corpusmill"), "run", str(cfg), "--out", str(out)], stdout=log, stderr=log)
    if m["returncode"] != 0:
        raise SystemExit(f"corpusmill run failed (rc {m['returncode']}); see {work}/runs/corpusmill-{tag}.log")
    ledger = json.loads((out / "ledger.json").read_text())
    tok = json.loads(next(out.glob("*-tokenize/_DONE.json")).read_text())["stats"]
    m.update(docs_in=ledger["input"], kept=ledger["kept"], filtered=ledger["filtered"],
             duplicates=ledger["duplicates"], removed=ledger["input"] - ledger["kept"], tokens=ledger["tokens"],
             seconds_per_stage={k: round(v, 1) for k, v in ledger["run"]["seconds_per_stage"].items()},
             tokenize={k: tok.get(k) for k in ("encoder", "chars", "tokens", "task_cpu_s", "verified_docs")})
    shutil.rmtree(out / "shards", ignore_errors=True)  # keep the ledger and report, not the shard bytes
    return m


def run_datatrove(work: Path, python: str, slice_dir: Path, tokenizer: Path, tag: str) -> dict:
    out = work / "runs" / f"datatrove-{tag}"
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    with open(work / "runs" / f"datatrove-{tag}.log", "wb") as log:
        m = measure([python, str(HERE / "datatrove" / "pipeline.py"), str(slice_dir), str(out), str(tokenizer)],
                    stdout=log, stderr=log, env=env)
    if m["returncode"] != 0:
        raise SystemExit(f"datatrove run failed (rc {m['returncode']}); see {work}/runs/datatrove-{tag}.log")
    c = json.loads((out / "counts.json").read_text())
    kept = c["after_dedup"]
    m.update(docs_in=c["docs_in"], kept=kept, filtered=c["docs_in"] - c["after_filters"],
             duplicates=c["after_filters"] - kept, removed=c["docs_in"] - kept, tokens=c["tokens"])
    for d in ("filtered", "sigs", "buckets", "tokenized"):
        shutil.rmtree(out / d, ignore_errors=True)
    return m


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("work", type=Path)
    ap.add_argument("--datatrove-python", required=True)
    ap.add_argument("--corpus", type=Path, default=ROOT.parent / "corpus" / "en")
    ap.add_argument("--mb", type=float, default=98)
    ap.add_argument("--rounds", type=int, default=1, help="rounds of --order")
    ap.add_argument("--order", default="ABBA", help="A corpusmill, B datatrove (default ABBA; ABA when time is short)")
    ap.add_argument("--reuse", action="store_true", help="take a run's figures from WORK/runs/SIDE-TAG.json when "
                    "present (a benchmark stopped part way goes on where it stopped)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    slice_dir = work / "slice"
    meta = build_slice(args.corpus, slice_dir, args.mb)
    print(f"slice: {meta['documents']:,} documents, {meta['bytes'] / 1e6:.1f} MB, stride {meta['stride']}", flush=True)
    tokenizer = work / "tokenizer.json"
    t0 = time.perf_counter()
    train_tokenizer(slice_dir, tokenizer)
    print(f"tokenizer: {tokenizer} ({time.perf_counter() - t0:.0f} s)", flush=True)
    cfg = corpusmill_config(work, slice_dir, tokenizer)
    runs: list[dict] = []
    order = args.order * args.rounds
    for i, letter in enumerate(order):
        side = {"A": "corpusmill", "B": "datatrove"}[letter]
        tag = f"r{i // len(args.order)}-{i % len(args.order)}"
        saved = work / "runs" / f"{side}-{tag}.json"
        if args.reuse and saved.exists():
            m = json.loads(saved.read_text())
        else:
            load = os.getloadavg()[0]
            m = (run_corpusmill(work, cfg, tag) if side == "corpusmill"
                 else run_datatrove(work, args.datatrove_python, slice_dir, tokenizer, tag))
            m.update(side=side, tag=tag, load_before=round(load, 1))
            saved.write_text(json.dumps(m, indent=1))
        runs.append(m)
        print(f"{side:10s} {tag}: wall {m['wall_s']} s, CPU {m['cpu_s']} s, peak {m['peak_rss_tree_mb']} MB, "
              f"kept {m['kept']:,}, tokens {m['tokens']:,} (load {m['load_before']})", flush=True)
    by = {s: [m for m in runs if m["side"] == s] for s in ("corpusmill", "datatrove")}
    med = {s: {k: statistics.median(m[k] for m in v) for k in ("wall_s", "cpu_s", "peak_rss_tree_mb")}
           for s, v in by.items()}
    # every datatrove run against each corpusmill run next to it (A B B A: two pairs; A B A: two pairs)
    pairs = []
    for i, m in enumerate(runs):
        for j in (i - 1, i + 1):
            if m["side"] == "datatrove" and 0 <= j < len(runs) and runs[j]["side"] == "corpusmill":
                cm = runs[j]
                pairs.append({"corpusmill": cm["tag"], "datatrove": m["tag"], "wall": round(m["wall_s"] / cm["wall_s"], 2),
                              "cpu": round(m["cpu_s"] / cm["cpu_s"], 2)})
    ratio = {"wall": round(med["datatrove"]["wall_s"] / med["corpusmill"]["wall_s"], 2),
             "cpu": round(med["datatrove"]["cpu_s"] / med["corpusmill"]["cpu_s"], 2)}
    print()
    print("| tool | wall s | CPU s | peak RSS MB | docs in | kept | filtered | duplicates | tokens out |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s, v in by.items():
        f = v[0]
        print(f"| {s} (median of {len(v)}) | {med[s]['wall_s']:.1f} | {med[s]['cpu_s']:.1f} | "
              f"{med[s]['peak_rss_tree_mb']:.0f} | {f['docs_in']:,} | {f['kept']:,} | {f['filtered']:,} | "
              f"{f['duplicates']:,} | {f['tokens']:,} |")
    pair_text = ", ".join(f"{p['wall']}/{p['cpu']}" for p in pairs)
    print(f"\ndatatrove / corpusmill: wall {ratio['wall']}x, CPU seconds {ratio['cpu']}x (pairs, wall/CPU: {pair_text})")
    out = args.json or work / "datatrove_compare.json"
    out.write_text(json.dumps({"slice": meta, "tokenizer": str(tokenizer), "runs": runs, "median": med,
                               "ratio_datatrove_over_corpusmill": ratio, "pairs": pairs}, indent=1))
    print(f"figures: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
