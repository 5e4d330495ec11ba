"""corpusmill's Megatron `.bin/.idx` pairs read by mindformers' own classes (issue 16).

    # 1. in the project's venv: two runs on a few MB of real text
    .venv/bin/python bench/megatron_mindformers.py make /tmp/i14/corpus /tmp/mfcheck --mb 3
    # 2. in a SEPARATE venv holding mindformers (never the project's): see docs/history/benchmark-passes.md, "Megatron pairs read by mindformers"
    /tmp/mf/bin/python bench/megatron_mindformers.py check /tmp/mfcheck

`make` runs `corpusmill run` twice on about --mb MB of English and Chinese documents (an equal share
of every source file, each record's own `source`):

- `run-source`: SentencePiece chinese-llama-2 (55,296 ids: uint16 pairs), `shard.megatron_split:
  source`, `split.validation: 0.05`, and a mixture that takes the fortunes sources twice
  (`epochs: 2`);
- `run-rank`: SentencePiece internlm-7b (103,168 ids: int32 pairs), two ranks (`megatron_split: rank`).

`check` reads every pair of `shards/` and `shards-validation/` with mindformers'
`IndexedDataset` (mindformers/dataset/blended_datasets/indexed_dataset.py) and compares: the
sequence count, lengths and document index with the manifest; every document's ids, per source,
with the tokenize step's output for that source's documents (the validation split's documents in
`shards-validation`, the rest in `shards`, the mixture's sources twice), recomputed here from the
tokenized parts (`doc_hash` and the seeded split), not from the writer. Then it reads
`mindformers_megatron_train_dataset.yaml` as mindformers' `BlendedMegatronDatasetDataLoader` does:
`get_blend_from_list(data_path)`, the GPTDatasetConfig its `init_gpt_dataset_config` builds, and
`BlendedMegatronDatasetBuilder(GPTDataset, sizes, ...).build()` (mindformers' C++ helpers compiled
with its Makefile); it draws every training sample and counts which pair each came from against the
weights, and checks each sample's ids against the vocabulary and its EOD resets. Writes
WORK/mindformers_check.json (mindformers logs to stdout); exits 1 on any mismatch.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TOKENIZERS = ROOT.parent / "shared" / "data" / "kept" / "tokenizers"
SPLIT, SPLIT_SEED = 0.05, 7
MIXED = "debian:fortunes*"  # these sources twice


def make(corpus: Path, work: Path, mb: float) -> None:
    sys.path.insert(0, str(HERE))
    from tokenize_shard_bench import take_corpus

    work.mkdir(parents=True, exist_ok=True)
    take_corpus(corpus, work / "corpus", mb)
    base = {"input": {"paths": [str(work / "corpus")]},
            "filter": {"gopher_quality": {"enabled": False}, "gopher_repetition": {"enabled": False},
                       "c4": {"enabled": False}, "chinese": {"enabled": False}},
            "dedup": {"minhash": {"enabled": False}}, "pack": {"seq_length": 512}}
    runs = {
        "run-source": {**base, "tokenizer": {"model": str(TOKENIZERS / "chinese-llama-2_tokenizer.model")},
                       "split": {"validation": SPLIT, "seed": SPLIT_SEED},
                       "mix": {"sources": [{"match": {"source": MIXED}, "epochs": 2}]},
                       "shard": {"format": "megatron", "megatron_split": "source"}},
        "run-rank": {**base, "tokenizer": {"model": str(TOKENIZERS / "internlm-7b_V7_sft.model")},
                     "shard": {"format": "megatron", "ranks": 2}},
    }
    for name, cfg in runs.items():
        path = work / f"{name}.yaml"
        path.write_text(json.dumps(cfg))
        started = time.perf_counter()
        subprocess.run([str(ROOT / ".venv/bin/corpusmill"), "run", str(path), "--out", str(work / name)], check=True,
                       stdout=subprocess.DEVNULL)
        print(f"{name}: {time.perf_counter() - started:.0f} s", flush=True)


def _expected(run: Path, split: bool, mixed: bool) -> tuple[dict, dict]:
    """Per source: the tokenized documents' ids (tuples) for training and for validation, from the
    tokenize step's parts, the split recomputed from each document's doc_hash."""
    import fnmatch

    import numpy as np

    from corpusmill.stages.base import read_table
    from corpusmill.stages.mixing import validation_mask

    train: dict = {}
    held: dict = {}
    for part in sorted(run.glob("*-tokenize/part-*.arrow")):
        t = read_table(str(part))
        out = validation_mask(t.column("doc_hash").to_numpy().astype(np.uint64), SPLIT if split else 0.0, SPLIT_SEED)
        for src, ids, h in zip(t.column("source").to_pylist(), t.column("input_ids").to_pylist(), out.tolist()):
            copies = 2 if mixed and fnmatch.fnmatchcase(src, MIXED) and not h else 1
            (held if h else train).setdefault(src, Counter())[tuple(ids)] += copies
    return train, held


def check_pairs(shards: Path, want: dict, report: dict) -> list[str]:
    """Every pair of `shards` read with mindformers' IndexedDataset against the manifest and `want`
    (per source, or all sources together for rank pairs)."""
    import numpy as np
    from mindformers.dataset.blended_datasets.indexed_dataset import IndexedDataset

    manifest = json.loads((shards / "manifest.json").read_text())
    problems = []
    rank_docs: Counter = Counter()
    for pair in manifest["megatron"]["pairs"]:
        prefix = str(shards / pair["prefix"])
        ds = IndexedDataset(prefix)
        n = len(ds)
        docs = [tuple(int(x) for x in ds[i]) for i in range(n)]
        row = {"prefix": pair["prefix"], "source": pair.get("source"), "documents": n, "dtype": ds.index.dtype.__name__,
               "tokens": int(np.sum(ds.index.sequence_lengths))}
        report.setdefault("pairs", []).append(row)
        if n != pair["documents"] or row["tokens"] != pair["tokens"] or row["dtype"] != pair["dtype"]:
            problems.append(f"{pair['prefix']}: mindformers reads {row}, the manifest says {pair}")
        if not np.array_equal(ds.index.document_indices, np.arange(n + 1)):
            problems.append(f"{pair['prefix']}: document index is not 0..{n}")
        if pair.get("source") is not None:
            if Counter(docs) != want.get(pair["source"], Counter()):
                problems.append(f"{pair['prefix']}: the documents differ from the tokenize output of {pair['source']!r}")
        else:
            rank_docs.update(docs)
    if manifest["megatron"].get("split", "rank") == "rank":
        every = sum(want.values(), Counter())
        if rank_docs != every:
            problems.append(f"{shards}: the rank pairs' documents differ from the tokenize output")
    elif {p.get("source") for p in manifest["megatron"]["pairs"]} != {s for s, c in want.items() if c}:
        problems.append(f"{shards}: the pairs' sources differ from the tokenized documents' sources")
    return problems


def check_loader(shards: Path, cache: Path, report: dict) -> list[str]:
    """The YAML read as BlendedMegatronDatasetDataLoader reads it, the datasets built by mindformers'
    builder, every training sample drawn."""
    import numpy as np
    import yaml
    from mindformers.dataset.blended_datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from mindformers.dataset.blended_datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from mindformers.dataset.blended_datasets.utils import get_blend_from_list

    section = yaml.safe_load((shards / "mindformers_megatron_train_dataset.yaml").read_text())
    loader = section["train_dataset"]["data_loader"]
    c = loader["config"]
    prefixes, weights = get_blend_from_list(c["data_path"])
    manifest = json.loads((shards / "manifest.json").read_text())
    pairs = {str(shards / p["prefix"]): p for p in manifest["megatron"]["pairs"]}
    total = sum(p["tokens"] for p in pairs.values())
    problems = []
    if sorted(prefixes) != sorted(k for k, p in pairs.items() if p["tokens"]):
        problems.append(f"data_path prefixes {prefixes} are not the manifest's pairs")
    for pre, w in zip(prefixes, weights):
        if abs(w - pairs[pre]["tokens"] / total) > 1e-5:
            problems.append(f"{pre}: weight {w}, token share {pairs[pre]['tokens'] / total}")
    cfg = GPTDatasetConfig(  # as BlendedMegatronDatasetDataLoader.init_gpt_dataset_config builds it
        random_seed=c.get("seed", 1234), sequence_length=c["seq_length"], blend=get_blend_from_list(c["data_path"]),
        blend_per_split=[None, None, None], split=c.get("split"), num_dataset_builder_threads=1,
        path_to_cache=str(cache), mmap_bin_files=True, tokenizer=None,
        reset_position_ids=c["reset_position_ids"], reset_attention_mask=c["reset_attention_mask"],
        eod_mask_loss=c["eod_mask_loss"], create_attention_mask=False, eod=c["eod"], pad=c["pad"])
    started = time.perf_counter()
    train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, loader["sizes"], lambda: True, cfg).build()
    built = time.perf_counter() - started
    n = len(train)
    vocab = manifest["vocab_size"]
    bad_ids = bad_reset = 0
    for i in range(n):
        sample = train[i]
        tokens = np.asarray(sample[0] if isinstance(sample, (tuple, list)) else sample["tokens"])
        position = np.asarray(sample[3] if isinstance(sample, (tuple, list)) else sample["position_ids"])
        bad_ids += int((tokens < 0).any() or (tokens >= vocab).any())
        eod = np.flatnonzero(tokens[:-1] == c["eod"])  # after an EOD the next position starts again at 0
        bad_reset += int(c["reset_position_ids"] and len(eod) and (position[eod + 1] != 0).any())
    drawn = {}
    if hasattr(train, "dataset_index"):  # a BlendedDataset: which pair each sample came from
        counts = np.bincount(np.asarray(train.dataset_index), minlength=len(prefixes))
        drawn = {os.path.basename(p): {"weight": round(w, 4), "share_drawn": round(int(k) / n, 4)}
                 for p, w, k in zip(prefixes, weights, counts)}
        worst = max(abs(v["weight"] - v["share_drawn"]) for v in drawn.values())
        if worst > max(0.02, 2 / n ** 0.5):
            problems.append(f"samples drawn per pair {drawn} are off the weights by {worst:.3f}")
    if len(prefixes) == 1 and hasattr(train, "indexed_dataset"):
        drawn = {os.path.basename(prefixes[0]): {"weight": 1.0, "share_drawn": 1.0}}
    asked = loader["sizes"][0]  # the builder asks each pair for ceil(weight * size * 1.005) samples and blends them all
    if not asked <= n <= math.ceil(asked * 1.005) + len(prefixes):
        problems.append(f"the builder made {n} samples, sizes[0] asks {asked}")
    if bad_ids or bad_reset:
        problems.append(f"{bad_ids} samples with ids outside the vocabulary, {bad_reset} with a position not reset after EOD")
    report["loader"] = {"class": type(train).__name__, "samples": n, "build_s": round(built, 2), "blend": drawn,
                        "seq_length": c["seq_length"], "eod": c["eod"]}
    return problems


def check(work: Path) -> int:
    import mindformers

    out: dict = {"mindformers": mindformers.__version__, "runs": {}}
    problems: list[str] = []
    for run in sorted(p for p in work.glob("run-*") if p.is_dir()):
        split = run.name == "run-source"
        train, held = _expected(run, split, mixed=split)
        rep: dict = {}
        for folder, want in (("shards", train), ("shards-validation", held)):
            if (run / folder / "manifest.json").is_file():
                rep[folder] = {}
                problems += check_pairs(run / folder, want, rep[folder])
        problems += check_loader(run / "shards", work / f"cache-{run.name}", rep["shards"])
        out["runs"][run.name] = rep
    out["problems"] = problems
    (work / "mindformers_check.json").write_text(json.dumps(out, indent=1))  # mindformers logs to stdout
    print(f"mindformers {out['mindformers']}: {sum(len(r[f]['pairs']) for r in out['runs'].values() for f in r)} pairs "
          f"read, {len(problems)} problems; report in {work / 'mindformers_check.json'}", file=sys.stderr)
    return 1 if problems else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("corpus", type=Path)
    m.add_argument("work", type=Path)
    m.add_argument("--mb", type=float, default=3)
    c = sub.add_parser("check")
    c.add_argument("work", type=Path)
    args = ap.parse_args()
    if args.cmd == "make":
        make(args.corpus, args.work, args.mb)
        return 0
    return check(args.work)


if __name__ == "__main__":
    sys.exit(main())
