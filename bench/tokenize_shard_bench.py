"""Tokenize and shard throughput vs their bare baselines, side by side on the same text in one run.

    python bench/tokenize_shard_bench.py CORPUS_DIR WORK_DIR [--mb 100] [--tokenizer PATH]

1. Takes about --mb MB of real English and Chinese documents from CORPUS_DIR (build_corpus.sh output).
2. Runs `corpusmill run` on them (no filter, no dedup; the given tokenizer; seq 2048; 2 ranks x 2 files).
3. Baseline A: plain `sentencepiece` encoding of the very text the tokenize stage saw (its input
   parts), one process per core, batches of 512 documents. Target: the stage >= 85% of it. Also
   given: the same with `return_type="numpy"` (ids into int32 buffers, what the stage uses).
4. Baseline B: a bare `FileWriter` loop writing the very windows the shard stage wrote, 1000 rows per
   call, in one fresh process. The shard stage also shuffles globally, writes one file per task in
   parallel and counts every file back through MindDataset. The one-off MindSpore set-up (import
   and first use, about 1-3 s per process) is timed apart on both sides; the ratio is given
   without it and with it.
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
sys.path.insert(0, str(ROOT))
from corpusmill.stages.base import read_table  # noqa: E402


def take_corpus(corpus: Path, out: Path, mb: float) -> int:
    """About `mb` MB of JSONL, 60% English and 40% Chinese, an equal share from every source file."""
    out.mkdir(parents=True, exist_ok=True)
    total = 0
    for lang, share in (("en", 0.6), ("zh", 0.4)):
        files = sorted((corpus / lang).glob("*.jsonl"))
        per_file = mb * share * 1e6 / max(1, len(files))
        with open(out / f"{lang}.jsonl", "w", encoding="utf-8") as w:
            for f in files:
                size = 0
                for line in open(f, encoding="utf-8"):
                    if size >= per_file:
                        break
                    w.write(line)
                    size += len(line.encode())
                total += size
    return total


def _encode(args: tuple[str, list[str], str]) -> int:
    import sentencepiece as spm

    path, texts, output = args
    sp = spm.SentencePieceProcessor(model_file=path)
    n = 0
    for i in range(0, len(texts), 512):
        if output == "numpy":  # ids into int32 buffers, as the stage asks for them
            n += sum(len(x) for x in sp.encode(texts[i:i + 512], return_type="numpy"))
        else:  # the plain call: a Python list of Python ints per document
            n += sum(len(x) for x in sp.encode(texts[i:i + 512], out_type=int))
    return n


def baseline_tokenize(model: str, texts: list[str], procs: int, output: str = "int") -> tuple[float, int]:
    chunks = [texts[i::procs] for i in range(procs)]
    ctx = mp.get_context("spawn")
    with ctx.Pool(procs) as pool:
        pool.map(_encode, [(model, ["warm up"], output)] * procs)  # process start and model load outside the timing
        start = time.perf_counter()
        tokens = sum(pool.map(_encode, [(model, c, output) for c in chunks]))
        return time.perf_counter() - start, tokens


def _bare_write(rows: np.ndarray, out: str) -> tuple[float, float]:
    start = time.perf_counter()
    from mindspore.mindrecord import FileWriter

    warm = FileWriter(out + ".warmup", shard_num=1, overwrite=True)  # first use initialises native state
    warm.add_schema({"input_ids": {"type": "int32", "shape": [-1]}}, "bare")
    warm.write_raw_data([{"input_ids": rows[0]}])
    warm.commit()
    imported = time.perf_counter()
    writer = FileWriter(str(out), shard_num=1, overwrite=True)
    writer.add_schema({"input_ids": {"type": "int32", "shape": [-1]}}, "bare")
    for i in range(0, len(rows), 1000):
        writer.write_raw_data([{"input_ids": r} for r in rows[i:i + 1000]])
    writer.commit()
    return imported - start, time.perf_counter() - imported


def baseline_write(rows: np.ndarray, out: Path) -> tuple[float, float]:
    """(setup seconds, write seconds) of a bare FileWriter loop in a fresh process; setup is the
    import and a one-row warm-up write, as the shard stage's worker warm-up."""
    with mp.get_context("spawn").Pool(1) as pool:
        return pool.apply(_bare_write, (rows, str(out)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("corpus", type=Path)
    ap.add_argument("work", type=Path)
    ap.add_argument("--mb", type=float, default=100)
    ap.add_argument("--tokenizer", default=str(ROOT.parent / "shared/data/kept/tokenizers/chinese-llama-2_tokenizer.model"))
    ap.add_argument("--repeat", type=int, default=1, help="repeat the whole comparison (a fresh run each time) and "
                    "report each ratio and their median: one run on a shared host moves by +-10%%")
    args = ap.parse_args()
    if args.work.exists():
        shutil.rmtree(args.work)
    size = take_corpus(args.corpus, args.work / "corpus", args.mb)
    results = [compare(args, size) for _ in range(args.repeat)]
    summary = {key: {"each": [r[key] for r in results], "median": float(np.median([r[key] for r in results]))}
               for key in ("tokenize_ratio", "tokenize_ratio_vs_numpy_output", "write_ratio", "write_ratio_with_imports")}
    (args.work / "result.json").write_text(json.dumps({"runs": results, "summary": summary}, indent=2))
    print(json.dumps({"last_run": results[-1], "summary": summary}, indent=2))
    return 0


def compare(args, size: int) -> dict:
    """One side-by-side comparison: a fresh `corpusmill run`, then both baselines on what it saw."""
    cfg = args.work / "config.yaml"
    cfg.write_text(json.dumps({
        "input": {"paths": [str(args.work / "corpus")]},
        "filter": {"length": {"min_chars": 0}, "gopher_quality": {"enabled": False}, "gopher_repetition": {"enabled": False},
                   "c4": {"enabled": False}, "chinese": {"enabled": False}, "boilerplate_lines": {"enabled": False}},
        "dedup": {"exact": False, "minhash": {"enabled": False}},
        "tokenizer": {"model": args.tokenizer},
        "pack": {"seq_length": 2048},
        "shard": {"ranks": 2, "files_per_rank": 2},
    }))
    out = args.work / "run"
    if out.exists():
        shutil.rmtree(out)
    subprocess.run([str(ROOT / ".venv/bin/corpusmill"), "run", str(cfg), "--out", str(out)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tok_done = json.loads((out / "05-tokenize" / "_DONE.json").read_text())
    shard_done = json.loads((out / "shards" / "_DONE.json").read_text())
    texts = [t for p in sorted((out / "02-filter").glob("part-*.parquet")) for t in pq.read_table(p, columns=["text"]).column("text").to_pylist()]
    text_mb = sum(len(t.encode()) for t in texts) / 1e6
    procs = os.cpu_count() or 1
    base_s, base_tokens = baseline_tokenize(args.tokenizer, texts, procs)
    assert base_tokens + len(texts) == tok_done["stats"]["tokens"], "baseline must encode the same text (+ EOS each)"
    base_np_s, np_tokens = baseline_tokenize(args.tokenizer, texts, procs, output="numpy")
    assert np_tokens == base_tokens
    rows = np.concatenate([np.asarray(read_table(p).column("input_ids").to_pylist(), dtype=np.int32)
                           for p in sorted((out / "06-pack").glob("part-*.arrow"))])
    import_s, write_s = baseline_write(rows, args.work / "bare.mindrecord")
    stage_tok_s, stage_shard_s = tok_done["seconds"], shard_done["seconds"]
    stage_write_s, setup_s = shard_done["stats"]["write_s"], shard_done["stats"]["writer_setup_s"]
    result = {
        "input_mb": round(size / 1e6, 1), "text_mb": round(text_mb, 1), "documents": len(texts), "cores": procs,
        "sentencepiece_plain": {"seconds": round(base_s, 1), "mb_per_s": round(text_mb / base_s, 1),
                                "mb_per_s_per_core": round(text_mb / base_s / procs, 1)},
        "tokenize_stage": {"seconds": round(stage_tok_s, 1), "mb_per_s": round(text_mb / stage_tok_s, 1),
                           "tokens": tok_done["stats"]["tokens"]},
        "sentencepiece_numpy_output": {"seconds": round(base_np_s, 1), "mb_per_s": round(text_mb / base_np_s, 1)},
        "tokenize_ratio": round(base_s / stage_tok_s, 3),
        "tokenize_ratio_vs_numpy_output": round(base_np_s / stage_tok_s, 3),
        "bare_filewriter": {"rows": len(rows), "seconds": round(write_s, 2), "rows_per_s": round(len(rows) / write_s),
                            "setup_s": round(import_s, 2)},
        "shard_stage": {"rows": shard_done["stats"]["samples"], "seconds": round(stage_shard_s, 2),
                        "writer_setup_s": setup_s, "shuffle_write_verify_s": stage_write_s,
                        "rows_per_s": round(shard_done["stats"]["samples"] / stage_write_s)},
        # rates without the one-off MindSpore import on either side, then with it on both sides
        "write_ratio": round((shard_done["stats"]["samples"] / stage_write_s) / (len(rows) / write_s), 3),
        "write_ratio_with_imports": round((shard_done["stats"]["samples"] / stage_shard_s)
                                          / (len(rows) / (write_s + import_s)), 3),
        "tokens_to_shards_rows_per_s": round(shard_done["stats"]["samples"] / (stage_tok_s + stage_shard_s +
                                             json.loads((out / "06-pack" / "_DONE.json").read_text())["seconds"])),
    }
    return result


if __name__ == "__main__":
    sys.exit(main())
