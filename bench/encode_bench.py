"""The exact piece-cache encoders against the plain ones, side by side on the same real documents in
one process: MB of text per CPU second, the ratio, and how many documents got identical ids (every
one must). SentencePiece models (stages.piece_cache against `sp.encode`), byte-level BPE tokenizer.json
(stages.pretoken_cache against `Tokenizer.encode_batch_fast`) and tiktoken files, Mistral's tekken
among them (stages.pretoken_cache against `encode_to_numpy`).

    python bench/encode_bench.py [--corpus /work/corpus] [--mb-en 40] [--mb-zh 40] [--all]
                                 [--model PATH ...] [--train-hf gpt2|llama3|qwen2 ...]

--model takes any tokenizer file the pipeline reads (kind detected). --train-hf trains a 32k byte-level BPE
tokenizer.json with that pre-tokenizer (Qwen2's with its NFC normalizer, Llama-3's with
`ignore_merges`, as the released files have them) on every 20th document of
both sets (their first 20,000 characters), outside the timing: no pretrained tokenizer.json can be
downloaded here. --all takes every document of the corpus.

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


def train_hf(kind: str, texts: list[str], out: Path, vocab: int = 32000) -> str:
    """A byte-level BPE tokenizer.json with `kind`'s pre-tokenizer, trained on `texts`."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    from corpusmill.stages.pretoken_cache import PATTERNS

    tok = Tokenizer(models.BPE(ignore_merges=kind == "llama3"))  # as Llama-3's own tokenizer.json has it
    if kind == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(PATTERNS[kind]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if kind == "qwen2":
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((t[:20000] for t in texts), trainer=trainer)
    path = out / f"{kind}-{vocab // 1000}k.json"
    tok.save(str(path))
    return str(path)


def encoders(model: str) -> tuple:
    """(plain encode of a batch, the fast encoder or None, why not) of a model file of any kind
    (detected as the pipeline detects it)."""
    from corpusmill.stages import tokenizer_kinds as kinds

    tok = kinds.load(model)
    if tok.kind == "hf":  # the call the tokenize step makes (no offsets), ids as lists
        return (lambda b: [e.ids for e in tok.tok.encode_batch_fast(b, add_special_tokens=False)]), *tok.fast_encoder()
    return tok.encode, *tok.fast_encoder()


def bench(model: str, name: str, texts: list[str], batch: int = 512) -> dict:
    plain_encode, enc, why = encoders(model)
    if enc is None:
        return {"set": name, "declined": why}
    enc.encode_flat(["warm the compiled loops"])
    enc._clear()
    mb = sum(len(t.encode("utf-8")) for t in texts) / 2**20
    batches = [texts[i:i + batch] for i in range(0, len(texts), batch)]
    t = time.process_time()
    plain = [plain_encode(b) for b in batches]
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
    ap.add_argument("--all", action="store_true", help="every document of the corpus")
    ap.add_argument("--model", action="append")
    ap.add_argument("--train-hf", action="append", choices=["gpt2", "llama3", "qwen2"])
    a = ap.parse_args()
    big = 1e12 if a.all else None
    sets = [("en", take(Path(a.corpus) / "en", big or a.mb_en)), ("zh", take(Path(a.corpus) / "zh", big or a.mb_zh))]
    models = list(a.model or ([] if a.train_hf else [DEFAULT_MODEL]))
    if a.train_hf:
        import os
        import tempfile

        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread, as in the tokenize step's workers
        out = Path(tempfile.mkdtemp(prefix="encode-bench-"))
        sample = [t for _, texts in sets for t in texts[::20]]
        models += [train_hf(kind, sample, out) for kind in a.train_hf]
    for model in models:
        for name, texts in sets:
            r = bench(model, name, texts)
            print(json.dumps(r), flush=True)
            if "identical_docs" in r and r["identical_docs"] != r["docs"]:
                sys.exit(f"{r['docs'] - r['identical_docs']} documents differ")


if __name__ == "__main__":
    main()
