"""Decontamination throughput (issue 17): documents/s of `stages.decontaminate.decontaminate_batch`
in one process, against N evaluation items, over the document parts of a finished run; and what it
removes when a few hand-made items copied from real documents are planted among them.

    python bench/decontam_bench.py RUN_DIR/03-exact_dedup --items 10000

The items: N - planted synthetic ones (half English: 20-40 words drawn from the corpus's own
vocabulary; half Chinese: 40-80 characters drawn from its CJK characters), so their n-grams look like
real text but match nothing by chance, plus `--planted` excerpts of real documents (an English
excerpt of 30 words, a Chinese one of 40 characters, each with a question prefix added).
"""
from __future__ import annotations

import argparse
import json
import random
import re
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

from corpusmill.stages.decontaminate import decontaminate_batch, eval_index


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("parts", help="a folder of document parts (part-*.parquet), e.g. RUN/03-exact_dedup")
    ap.add_argument("--items", type=int, default=10_000)
    ap.add_argument("--planted", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    files = sorted(Path(args.parts).glob("part-*.parquet"))
    frames = [pq.read_table(f, columns=["uid", "id", "source", "text"]).to_pandas() for f in files]
    docs = sum(len(f) for f in frames)
    sample = [t for f in frames for t in f["text"].sample(min(len(f), 50), random_state=args.seed).tolist()]
    words = [w for t in sample for w in re.findall(r"[A-Za-z]{3,}", t)] or ["word"]
    hanzi = [c for t in sample for c in t if "\u4e00" <= c <= "\u9fff"] or ["字"]
    items = []
    planted = []
    en_docs = [(f, i) for f in frames for i, t in enumerate(f["text"]) if len(re.findall(r"[A-Za-z]+", t)) > 80]
    zh_docs = [(f, i) for f in frames for i, t in enumerate(f["text"]) if sum("\u4e00" <= c <= "\u9fff" for c in t[:400]) > 120]
    for k in range(args.planted):
        pool = en_docs if k % 2 == 0 else zh_docs
        frame, i = pool[rng.randrange(len(pool))]
        text = frame["text"].iloc[i]
        if k % 2 == 0:
            toks = text.split()
            start = rng.randrange(max(1, len(toks) - 30))
            q = "Question: " + " ".join(toks[start:start + 30])
        else:
            cjk = [m.start() for m in re.finditer(r"[\u4e00-\u9fff]", text)]
            start = cjk[rng.randrange(max(1, len(cjk) - 60))]
            q = "问题：" + text[start:start + 40]
        planted.append(frame["id"].iloc[i])
        items.append({"id": f"planted-{k}", "question": q, "answer": "A"})
    for k in range(args.items - len(items)):
        if k % 2:
            q = " ".join(rng.choice(words) for _ in range(rng.randint(20, 40)))
        else:
            q = "".join(rng.choice(hanzi) for _ in range(rng.randint(40, 80)))
        items.append({"id": f"syn-{k}", "question": q, "answer": rng.choice("ABCD")})
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "eval.jsonl"
        path.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in items), encoding="utf-8")
        t0 = time.perf_counter()
        hashes, item, labels, info = eval_index([("bench", str(path))], ["question", "answer"], "id", 13, 25)
        index_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    removed = []
    for f in frames:
        out = decontaminate_batch(f, hashes, item, labels, 13, 25, audit_text_chars=0)
        removed += list(zip(out.removed.column("id").to_pylist(), out.removed.column("eval_item").to_pylist()))
    scan_s = time.perf_counter() - t0
    chars = sum(int(f["text"].str.len().sum()) for f in frames)
    print(json.dumps({"documents": docs, "characters": chars, "eval_items": info["items"], "eval_ngrams": info["ngrams"],
                      "items_too_short": info["items_too_short"], "index_s": round(index_s, 2),
                      "scan_s": round(scan_s, 2), "docs_per_s": round(docs / scan_s), "mchars_per_s": round(chars / scan_s / 1e6, 2),
                      "planted_documents": planted, "removed": removed}, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()
