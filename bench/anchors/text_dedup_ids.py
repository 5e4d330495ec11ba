"""Read the ids text-dedup kept (run in its venv by bench/dedup_bench.py): python text_dedup_ids.py OUTPUT KEPT_IDS_FILE"""
import sys

from datasets import load_from_disk

if __name__ == "__main__":
    ds = load_from_disk(sys.argv[1])
    with open(sys.argv[2], "w") as out:
        for doc_id in ds["id"]:
            out.write(doc_id + "\n")
