"""The exact piece-cache encoder (stages.piece_cache) against plain SentencePiece, side by side on the
same real documents in one process: MB of text per CPU second, the ratio, and how many documents
got identical ids (every one must).

    python bench/encode_bench.py [--corpus /work/corpus] [--mb-en 40] [--mb-zh 40] [--model PATH ...]

The English set takes every k-th document of every file (Gutenberg books, dictionaries, manuals) up
to --mb-en MB, so long and short documents both count; the Chinese set likewise (laws, poetry,
manuals). Both encoders get the same batches of 512 documents, as the tokenize step passes them:
plain is `sp.encode(batch, num_threads=1)`, fast is `PieceCache.encode_flat(batch)` from an empty
cache (its warm-up counted). Targets (issue 34): >= 3x on English, >= 1.5x on Chinese.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
DEFAULT_MODEL = "/work/shared/data/kept/tokenizers/chinese-llama-2_tokenizer.model"


def take(folder: Path, mb: float) -> list[str]:
    """Every k-th document of every file under `folder`, k chosen so the set is about `mb` MB."""
    files = sorted(folder.glob("*.jsonl"))
    total = sum(f.stat().st_size for f in files)
    k = max(1, round(total / (mb * 2**20)))
    texts = []
    for f in files:
        with open(f, encoding="utf-8") as fh:
            for i, line in enumerate(fh):
                if i % k == 0:
                    texts.append(json.loads(line)["text"])
    return texts


def bench(model: str, name: str, texts: list[str], batch: int = 512) -> dict:
    import sentencepiece as spm

    from corpusmill.stages import piece_cache

    sp = spm.SentencePieceProcessor(model_file=model)
    enc, why = piece_cache.build(sp, model)
    if enc is None:
        return {"set": name, "declined": why}
    enc.encode_flat(["warm the compiled loops"])
    enc._clear()
    mb = sum(len(t.encode("utf-8")) for t in texts) / 2**20
    batches = [texts[i:i + batch] for i in range(0, len(texts), batch)]
    t = time.process_time()
    plain = [sp.encode(b, num_threads=1) for b in batches]
    plain_s = time.process_time() - t
    t = time.process_time()
    fast = [enc.encode_flat(b) for b in batches]
    fast_s = time.process_time() - t
    same = 0
    for want, (lengths, values) in zip(plain, fast):
        for w, got in zip(want, np.split(values, np.cumsum(lengths)[:-1])):
            same += int(len(w) == got.size and np.array_equal(got, w))
    return {"set": name, "model": Path(model).name, "docs": len(texts), "mb": round(mb, 1),
            "longest_doc_mb": round(max(len(t.encode()) for t in texts) / 2**20, 2),
            "plain_mb_per_cpu_s": round(mb / plain_s, 2), "fast_mb_per_cpu_s": round(mb / fast_s, 2),
            "ratio": round(plain_s / fast_s, 2), "identical_docs": same,
            "cache_hit_rate": round(enc.hit_rate(), 4), **{k: v for k, v in enc.stats.items() if k != "hits"}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default="/work/corpus")
    ap.add_argument("--mb-en", type=float, default=40)
    ap.add_argument("--mb-zh", type=float, default=40)
    ap.add_argument("--model", action="append")
    a = ap.parse_args()
    sets = [("en", take(Path(a.corpus) / "en", a.mb_en)), ("zh", take(Path(a.corpus) / "zh", a.mb_zh))]
    for model in a.model or [DEFAULT_MODEL]:
        for name, texts in sets:
            r = bench(model, name, texts)
            print(json.dumps(r), flush=True)
            if "identical_docs" in r and r["identical_docs"] != r["docs"]:
                sys.exit(f"{r['docs'] - r['identical_docs']} documents differ")


if __name__ == "__main__":
    main()
