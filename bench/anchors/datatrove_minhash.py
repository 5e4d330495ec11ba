"""datatrove's four-stage MinHash dedup (run in its own venv by bench/dedup_bench.py).

    python datatrove_minhash.py DATA_DIR WORK_DIR KEPT_IDS_FILE
"""
import json
import sys
from pathlib import Path

from datatrove.executor.local import LocalPipelineExecutor
from datatrove.pipeline.dedup import MinhashDedupBuckets, MinhashDedupCluster, MinhashDedupFilter, MinhashDedupSignature
from datatrove.pipeline.dedup.minhash import MinhashConfig
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.writers.jsonl import JsonlWriter

if __name__ == "__main__":
    data, work, kept_file = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    cfg = MinhashConfig(n_grams=5, num_buckets=14, hashes_per_bucket=8)
    tasks = 2
    sigs = LocalPipelineExecutor(
        pipeline=[JsonlReader(data, glob_pattern="*.jsonl"), MinhashDedupSignature(output_folder=str(work / "sigs"), config=cfg)],
        tasks=tasks, workers=tasks, logging_dir=str(work / "logs/sigs"))
    buckets = LocalPipelineExecutor(
        pipeline=[MinhashDedupBuckets(input_folder=str(work / "sigs"), output_folder=str(work / "buckets"), config=cfg)],
        tasks=cfg.num_buckets, workers=tasks, logging_dir=str(work / "logs/buckets"), depends=sigs)
    cluster = LocalPipelineExecutor(
        pipeline=[MinhashDedupCluster(input_folder=str(work / "buckets"), output_folder=str(work / "remove_ids"), config=cfg)],
        tasks=1, logging_dir=str(work / "logs/cluster"), depends=buckets)
    final = LocalPipelineExecutor(
        pipeline=[JsonlReader(data, glob_pattern="*.jsonl"), MinhashDedupFilter(input_folder=str(work / "remove_ids")),
                  JsonlWriter(str(work / "kept"), compression=None)],
        tasks=tasks, workers=tasks, logging_dir=str(work / "logs/filter"), depends=cluster)
    final.run()
    with open(kept_file, "w") as out:
        for f in sorted((work / "kept").glob("*.jsonl")):
            for line in open(f, encoding="utf-8"):
                out.write(json.loads(line)["id"] + "\n")
