"""datatrove's side of bench/datatrove_compare.py, run in its own venv (datatrove[processing], spacy):
read JSONL -> Gopher repetition + Gopher quality + C4 quality filters (English defaults) -> the four
MinHash stages (its default config: 5-grams, 14 buckets x 8 hashes) -> DocumentTokenizer with a local
tokenizer.json. Two tasks on two workers per stage (one cluster task), as in datatrove's examples.

    python pipeline.py DATA_DIR WORK_DIR TOKENIZER_JSON [--tasks 2]

Writes WORK_DIR/counts.json: documents in, after the filters, after dedup, tokens out (from the
executors' own stats.json files).
"""
import argparse
import json
import os
from pathlib import Path

from datatrove.executor.local import LocalPipelineExecutor
from datatrove.pipeline.dedup import MinhashDedupBuckets, MinhashDedupCluster, MinhashDedupFilter, MinhashDedupSignature
from datatrove.pipeline.dedup.minhash import MinhashConfig
from datatrove.pipeline.filters import C4QualityFilter, GopherQualityFilter, GopherRepetitionFilter
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.tokens import DocumentTokenizer
from datatrove.pipeline.writers.jsonl import JsonlWriter


def _stats(logdir: Path) -> list[dict]:
    return json.loads((logdir / "stats.json").read_text())


def _total(stats: list[dict], name_prefix: str, key: str) -> int:
    """Sum a counter (e.g. 'total', 'dropped', 'forwarded') of the step whose name starts with name_prefix."""
    for step in stats:
        if step["name"].startswith(name_prefix):
            v = step["stats"].get(key, 0)
            return int(v["total"] if isinstance(v, dict) else v)
    raise KeyError(f"{name_prefix}/{key} not in stats: {[s['name'] for s in stats]}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("work", type=Path)
    ap.add_argument("tokenizer")
    ap.add_argument("--tasks", type=int, default=2)
    args = ap.parse_args()
    work, tasks = args.work, args.tasks
    cfg = MinhashConfig()  # datatrove's defaults: 5-grams, 14 buckets x 8 hashes (about the 0.8 Jaccard point)
    logs = work / "logs"
    filt = LocalPipelineExecutor(
        pipeline=[
            JsonlReader(args.data, glob_pattern="*.jsonl"),
            GopherRepetitionFilter(),
            GopherQualityFilter(),
            C4QualityFilter(),
            JsonlWriter(str(work / "filtered")),
            MinhashDedupSignature(output_folder=str(work / "sigs"), config=cfg),
        ],
        tasks=tasks, workers=tasks, logging_dir=str(logs / "filter_sigs"))
    buckets = LocalPipelineExecutor(
        pipeline=[MinhashDedupBuckets(input_folder=str(work / "sigs"), output_folder=str(work / "buckets"), config=cfg)],
        tasks=cfg.num_buckets, workers=tasks, logging_dir=str(logs / "buckets"), depends=filt)
    cluster = LocalPipelineExecutor(
        pipeline=[MinhashDedupCluster(input_folder=str(work / "buckets"), output_folder=str(work / "remove_ids"), config=cfg)],
        tasks=1, logging_dir=str(logs / "cluster"), depends=buckets)
    final = LocalPipelineExecutor(
        pipeline=[
            JsonlReader(str(work / "filtered")),
            MinhashDedupFilter(input_folder=str(work / "remove_ids")),
            DocumentTokenizer(output_folder=str(work / "tokenized"), tokenizer_name_or_path=args.tokenizer,
                              eos_token="<|endoftext|>"),
        ],
        tasks=tasks, workers=tasks, logging_dir=str(logs / "dedup_tokenize"), depends=cluster)
    final.run()
    fs, dt = _stats(logs / "filter_sigs"), _stats(logs / "dedup_tokenize")
    counts = {
        "docs_in": _total(fs, "📖 - READER", "documents"),
        "after_filters": _total(fs, "💽 - WRITER", "total"),
        "after_dedup": _total(dt, "🫂 - DEDUP", "forwarded"),
        "tokens": _total(dt, "🔢 - TOKENIZER", "tokens"),
        "stats": {"filter_sigs": fs, "dedup_tokenize": dt},
    }
    (work / "counts.json").write_text(json.dumps(counts, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local tokenizer.json; never a download
    main()
