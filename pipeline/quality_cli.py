"""`corpusmill quality train`: a fastText quality classifier from a user's own examples (issue 33).

Kept apart from cli.py so the command's arguments and its one-line errors live beside nothing else;
cli.py adds the subcommand with `add_quality(sub)` and runs it with `cmd_quality(args)`.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Optional


def add_quality(sub: argparse._SubParsersAction) -> None:
    """`corpusmill quality train --positive SRC... --negative SRC... --out MODEL.bin`."""
    q = sub.add_parser("quality", help="train a fastText quality classifier from your own examples",
                       description="Learned quality selection: train a classifier that filter.classifiers applies.")
    q_sub = q.add_subparsers(dest="quality_command", required=True, metavar="ACTION")
    t = q_sub.add_parser(
        "train", help="train a binary fastText classifier: positive examples against negative ones",
        description="Read a seeded sample of each side's documents (files, folders: .jsonl, .jsonl.gz, .json, .txt "
        "(one document a file), .parquet (a run's stage output, e.g. RUN/02-filter)), normalise them as the "
        "normalize step does, prepare each as the filter step does (first --max-chars characters, a space around "
        "each CJK character, whitespace runs as one space), hold out a seeded share, train fastText (word n-grams: "
        "character n-grams for Chinese) and print precision / recall / AUC on the held-out documents. The model "
        "loads in stock fastText; the printed YAML goes under filter.classifiers.")
    t.add_argument("--positive", nargs="+", required=True, metavar="SRC", help="sources of good documents")
    t.add_argument("--negative", nargs="+", required=True, metavar="SRC", help="sources of documents to select against")
    t.add_argument("--out", required=True, help="the model file to write (.bin)")
    t.add_argument("--text-field", default="text", help="JSON field / Parquet column of the text (default text)")
    t.add_argument("--max-docs", type=int, default=100000, help="documents sampled per side (default 100000)")
    t.add_argument("--holdout", type=float, default=0.1, help="share of each side held out for the metrics (default 0.1)")
    t.add_argument("--seed", type=int, default=0, help="seed of the sample, the split and fastText (default 0)")
    t.add_argument("--max-chars", type=int, default=20000, help="characters of each document the model reads "
                   "(default 20000; 0: all); the same value goes into filter.classifiers")
    t.add_argument("--lowercase", action="store_true", help="lowercase the text (then set lowercase: true to apply)")
    t.add_argument("--no-cjk-spaces", action="store_true", help="do not split CJK text into characters")
    t.add_argument("--epoch", type=int, default=5)
    t.add_argument("--lr", type=float, default=0.1)
    t.add_argument("--dim", type=int, default=64)
    t.add_argument("--word-ngrams", type=int, default=2, help="word n-gram length (default 2)")
    t.add_argument("--min-count", type=int, default=2, help="words seen fewer times are left out (default 2)")
    t.add_argument("--bucket", type=int, default=200000, help="hash buckets of the n-grams (default 200000; "
                   "the model holds bucket x dim floats)")
    t.add_argument("--threads", type=int, default=1, help="fastText threads (default 1: the same model every time)")
    t.add_argument("--label", default="__label__hq", help="the positive label (default __label__hq)")
    t.add_argument("--config", help="a YAML config whose normalize section applies (default: the normalize defaults)")
    t.add_argument("--json", action="store_true", help="print the result as JSON")


def cmd_quality(args: argparse.Namespace) -> int:
    """Run `quality train`; a problem with a source, the training set or fastText is one line, exit 2."""
    from corpusmill.stages.classifier import ClassifierError, train

    from .config import ConfigError, load_config

    try:
        for flag, value, ok in (("--max-docs", args.max_docs, args.max_docs >= 2),
                                ("--max-chars", args.max_chars, args.max_chars >= 0),
                                ("--epoch", args.epoch, args.epoch >= 1), ("--lr", args.lr, args.lr > 0),
                                ("--dim", args.dim, args.dim >= 1), ("--word-ngrams", args.word_ngrams, args.word_ngrams >= 1),
                                ("--min-count", args.min_count, args.min_count >= 1),
                                ("--bucket", args.bucket, args.bucket >= 0), ("--threads", args.threads, args.threads >= 1)):
            if not ok:
                raise ClassifierError(f"{flag} {value}: out of range")
        normalize = load_config(args.config).normalize.model_dump() if args.config else None
        result = train(args.positive, args.negative, args.out, max_docs=args.max_docs, holdout=args.holdout,
                       seed=args.seed, text_field=args.text_field, normalize=normalize,
                       max_chars=args.max_chars or None, lowercase=args.lowercase, cjk_spaces=not args.no_cjk_spaces,
                       epoch=args.epoch, lr=args.lr, dim=args.dim, word_ngrams=args.word_ngrams,
                       min_count=args.min_count, bucket=args.bucket, threads=args.threads, label=args.label)
    except (ClassifierError, ConfigError) as e:
        print(f"corpusmill: error: {e}", file=sys.stderr)
        return 2
    h = result.holdout
    if args.json:
        print(json.dumps({"model": result.model, "train_docs": result.train_docs, "holdout": h,
                          "prepare": result.prepare, "settings": result.settings}, indent=2))
        return 0
    print(f"wrote {result.model} (trained on {result.train_docs['positive']} positive, "
          f"{result.train_docs['negative']} negative documents)")
    print(f"held out {h['positives']} positive, {h['negatives']} negative: precision {h['precision']:.3f} "
          f"recall {h['recall']:.3f} accuracy {h['accuracy']:.3f} AUC {h['auc']:.3f} (at {h['threshold']})")
    p = result.prepare
    print("filter:\n  classifiers:\n"
          f"    - name: quality\n      model: {result.model}\n      label: {args.label}\n      min_score: 0.5\n"
          f"      max_chars: {p['max_chars'] if p['max_chars'] else 'null'}\n"
          f"      lowercase: {str(p['lowercase']).lower()}\n      cjk_spaces: {str(p['cjk_spaces']).lower()}")
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    """`python -m corpusmill.pipeline.quality_cli train ...`: the command without cli.py (tests, scripts)."""
    p = argparse.ArgumentParser(prog="corpusmill")
    add_quality(p.add_subparsers(dest="command", required=True))
    return cmd_quality(p.parse_args(["quality", *(argv or sys.argv[1:])]))


if __name__ == "__main__":
    raise SystemExit(main())
