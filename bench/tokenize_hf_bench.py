"""Tokenize throughput with a Hugging Face tokenizer.json vs `tokenizers.Tokenizer.encode_batch`
called directly, side by side on the same text in one run.

    python bench/tokenize_hf_bench.py CORPUS_DIR WORK_DIR [--mb 30] [--repeat 5] [--tokenizer PATH]

1. Takes about --mb MB of real English and Chinese documents from CORPUS_DIR (as
   tokenize_shard_bench.py does).
2. Without --tokenizer, trains a byte-level BPE tokenizer.json (vocab 32000) on a sample of them with
   `corpusmill tokenizer train --kind hf` (outside the timing).
3. Each repeat is a pair, alternating which side goes first (stage, baseline; then baseline, stage;
   ...), so a change in the host's load hits both sides alike over the pairs. The stage: the first
   repeat is a whole `corpusmill run` (no filter, no dedup, that tokenizer, shard.format megatron so
   no pack and no MindRecord); later repeats delete the tokenize step's folder and after and rerun
   with `--resume`, so only tokenize (and the Megatron write) run again. The baseline: on the very
   text the tokenize stage saw: one
   process per core, batches of 512 documents, `Tokenizer.encode_batch(add_special_tokens=False)`
   and the ids of every document taken as Python lists (what a direct caller gets), one thread
   per process (TOKENIZERS_PARALLELISM=false, as in the stage). Also given: `encode_batch_fast`
   (no offsets; the call the stage makes). The stage's time is its whole step (sample, checks,
   reading parts, encoding, writing Arrow). Target: the stage >= 0.85 of encode_batch; the median
   of the repeats is reported, each ratio too, with the CPU-second ratio beside it (the baseline
   processes' CPU vs the stage's encode tasks' CPU on the workers, `task_cpu_s`: read, encode,
   write; the driver's prepare -- sample, checks -- is in the wall time only) and the host's load
   average before each pair.
4. --kernel-only: the tokenize kernel vs encode_batch in CPU seconds, alternating slice by slice in
   each process (one per core) over the stage's 2 MB slices: what the stage adds to the library's
   own work, measured so that other load on the host hits both sides alike.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from tokenize_shard_bench import take_corpus  # noqa: E402

BATCH = 512


def _encode(args: tuple[str, list[str], str]) -> tuple[int, float]:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per process, as the stage's workers
    from tokenizers import Tokenizer

    path, texts, call = args
    tok = Tokenizer.from_file(path)
    encode = tok.encode_batch_fast if call == "fast" else tok.encode_batch
    n = 0
    cpu = time.process_time()
    for i in range(0, len(texts), BATCH):
        n += sum(len(e.ids) for e in encode(texts[i:i + BATCH], add_special_tokens=False))
    return n, time.process_time() - cpu


def baseline(path: str, texts: list[str], procs: int, call: str) -> tuple[float, int, float]:
    """(wall seconds, tokens, CPU seconds) of `procs` processes encoding a share of `texts` each."""
    chunks = [texts[i::procs] for i in range(procs)]
    with mp.get_context("spawn").Pool(procs) as pool:
        pool.map(_encode, [(path, ["warm up"], call)] * procs)  # process start and tokenizer load outside the timing
        start = time.perf_counter()
        out = pool.map(_encode, [(path, c, call) for c in chunks])
        return time.perf_counter() - start, sum(o[0] for o in out), sum(o[1] for o in out)


def _kernel_vs_library(args: tuple[str, list[list[str]]]) -> tuple[float, float, int]:
    """(CPU seconds of the stage's kernel, of encode_batch, tokens) over the same slices, the two
    alternating slice by slice in this one process, so load from other processes hits both alike."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    import pyarrow as pa
    from tokenizers import Tokenizer

    from corpusmill.stages import tokenize
    from corpusmill.stages.tokenizer_kinds import TokenizerSpec

    path, slices = args
    lib = Tokenizer.from_file(path)
    spec = TokenizerSpec("hf")
    tokenize.tokenize_batch(pa.table({"uid": [0], "text": ["warm up"]}), path, False, True, BATCH, spec, -1, 1)
    kernel = library = 0.0
    tokens = 0
    for i, texts in enumerate(slices):
        table = pa.table({"uid": pa.array(range(len(texts)), pa.int64()), "text": texts})
        for side in ((0, 1) if i % 2 == 0 else (1, 0)):
            start = time.process_time()
            if side == 0:
                tokenize.tokenize_batch(table, path, False, True, BATCH, spec, -1, 1)
                kernel += time.process_time() - start
            else:
                for j in range(0, len(texts), BATCH):
                    tokens += sum(len(e.ids) for e in lib.encode_batch(texts[j:j + BATCH], add_special_tokens=False))
                library += time.process_time() - start
    return kernel, library, tokens


def kernel_compare(tokenizer: str, texts: list[str], procs: int, slice_mb: float = 2.0) -> dict:
    """The tokenize kernel (`stages.tokenize.tokenize_batch`: Arrow in, encode, int32 buffers, Arrow
    list<int32> out) vs encode_batch in CPU seconds, over the stage's own 2 MB slices."""
    slices, cur, size = [], [], 0
    for t in texts:
        cur.append(t)
        size += len(t.encode())
        if size >= slice_mb * 1e6:
            slices.append(cur)
            cur, size = [], 0
    if cur:
        slices.append(cur)
    with mp.get_context("spawn").Pool(procs) as pool:
        out = pool.map(_kernel_vs_library, [(tokenizer, slices[i::procs]) for i in range(procs)])
    kernel, library = sum(o[0] for o in out), sum(o[1] for o in out)
    return {"kernel_cpu_s": round(kernel, 2), "encode_batch_cpu_s": round(library, 2), "slices": len(slices),
            "ratio": round(library / kernel, 3)}


def run_stage(args: argparse.Namespace, tokenizer: str) -> dict:
    """The tokenize step of a `corpusmill run` (the first time whole, then only from tokenize on,
    `--resume`): its _DONE.json."""
    cfg = args.work / "config.yaml"
    out = args.work / "run"
    if not cfg.exists():
        cfg.write_text(json.dumps({
            "input": {"paths": [str(args.work / "corpus")]},
            "filter": {"length": {"min_chars": 0}, "gopher_quality": {"enabled": False},
                       "gopher_repetition": {"enabled": False}, "c4": {"enabled": False}, "chinese": {"enabled": False},
                       "boilerplate_lines": {"enabled": False}},
            "dedup": {"exact": False, "minhash": {"enabled": False}},
            "tokenizer": {"model": tokenizer},
            "pack": {"seq_length": 2048},
            "shard": {"ranks": 2, "format": "megatron"},
        }))
    cmd = [str(ROOT / ".venv/bin/corpusmill"), "run", str(cfg), "--out", str(out)]
    if out.exists():
        for later in [*out.glob("*-tokenize"), out / "shards"]:
            shutil.rmtree(later, ignore_errors=True)
        cmd.append("--resume")
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads(next(out.glob("*-tokenize/_DONE.json")).read_text())


def compare(args: argparse.Namespace, tokenizer: str, stage_first: bool) -> dict:
    load = os.getloadavg()
    out = args.work / "run"
    done = run_stage(args, tokenizer) if stage_first else None
    texts = [t for p in sorted(next(out.glob("*-filter")).glob("part-*.parquet"))
             for t in pq.read_table(p, columns=["text"]).column("text").to_pylist()] if out.exists() else None
    if texts is None:  # the very first pair starts with the baseline: the filter's parts come from a run
        done = run_stage(args, tokenizer)
        return compare(args, tokenizer, True)
    text_mb = sum(len(t.encode()) for t in texts) / 1e6
    procs = os.cpu_count() or 1
    base_s, base_tokens, base_cpu = baseline(tokenizer, texts, procs, "plain")
    fast_s, fast_tokens, fast_cpu = baseline(tokenizer, texts, procs, "fast")
    assert fast_tokens == base_tokens
    if not stage_first:
        done = run_stage(args, tokenizer)
    assert base_tokens + len(texts) == done["stats"]["tokens"], "the baseline must encode the same text (+ EOS each)"
    stage_s = done["seconds"]
    stage_cpu = done["stats"]["task_cpu_s"]  # the encode tasks' CPU on the workers (read, encode, write); prepare apart
    return {
        "order": "stage first" if stage_first else "baseline first", "load_avg_1_5_15": [round(x, 1) for x in load],
        "text_mb": round(text_mb, 1), "documents": len(texts), "cores": procs, "tokens": done["stats"]["tokens"],
        "encode_batch": {"seconds": round(base_s, 2), "cpu_s": round(base_cpu, 2), "mb_per_s": round(text_mb / base_s, 2)},
        "encode_batch_fast": {"seconds": round(fast_s, 2), "cpu_s": round(fast_cpu, 2),
                              "mb_per_s": round(text_mb / fast_s, 2)},
        "tokenize_stage": {"seconds": round(stage_s, 2), "cpu_s": round(stage_cpu, 2), "mb_per_s": round(text_mb / stage_s, 2),
                           "prepare_s": done["stats"].get("prepare_s"), "encode_s": done["stats"].get("encode_s")},
        "ratio": round(base_s / stage_s, 3),
        "cpu_ratio": round(base_cpu / stage_cpu, 3),
        "ratio_vs_encode_batch_fast": round(fast_s / stage_s, 3),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("corpus", type=Path)
    ap.add_argument("work", type=Path)
    ap.add_argument("--mb", type=float, default=30)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--tokenizer", help="a tokenizer.json (default: one trained here on the same text, vocab 32000)")
    ap.add_argument("--kernel-only", action="store_true", help="only the CPU-time comparison of the kernel and "
                    "encode_batch, interleaved slice by slice (robust on a loaded host); no corpusmill run")
    args = ap.parse_args()
    if args.work.exists():
        shutil.rmtree(args.work)
    take_corpus(args.corpus, args.work / "corpus", args.mb)
    tokenizer = args.tokenizer
    if not tokenizer:
        tokenizer = str(args.work / "hf" / "tokenizer.json")
        subprocess.run([str(ROOT / ".venv/bin/corpusmill"), "tokenizer", "train", "--kind", "hf", "--vocab-size", "32000",
                        "--sample-docs", "5000", "--out", tokenizer, str(args.work / "corpus")], check=True,
                       stdout=subprocess.DEVNULL)
    if args.kernel_only:
        texts = [json.loads(line)["text"] for f in sorted((args.work / "corpus").glob("*.jsonl"))
                 for line in open(f, encoding="utf-8")]
        runs = [kernel_compare(tokenizer, texts, os.cpu_count() or 1) for _ in range(args.repeat)]
        summary = {"each": [r["ratio"] for r in runs], "median": float(np.median([r["ratio"] for r in runs]))}
        (args.work / "kernel_result.json").write_text(json.dumps({"runs": runs, "summary": summary}, indent=2))
        print(json.dumps({"runs": runs, "summary": summary}, indent=2))
        return 0
    results = []
    for i in range(args.repeat):
        results.append(compare(args, tokenizer, stage_first=i % 2 == 0))
        print(json.dumps(results[-1]), flush=True)
    summary = {k: {"each": [r[k] for r in results], "median": float(np.median([r[k] for r in results]))}
               for k in ("ratio", "cpu_ratio", "ratio_vs_encode_batch_fast")}
    (args.work / "result.json").write_text(json.dumps({"runs": results, "summary": summary}, indent=2))
    print(json.dumps({"last_run": results[-1], "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
