"""`corpusmill shards merge|reshard|reweight`: token-level tools over finished shard sets
(stages.shard_tools). `add_shard_tools(shards_sub)` adds the three actions to the `shards`
subparsers; `cmd_shard_tools(args)` runs one and returns the exit code (2 and one line on bad input)."""
from __future__ import annotations

import argparse
import sys
from typing import Optional

TOOLS = ("merge", "reshard", "reweight")


def _output_args(p: argparse.ArgumentParser, ranks_required: bool = False) -> None:
    p.add_argument("--out", required=True, help="the new shard folder (must not exist)")
    p.add_argument("--ranks", type=int, required=ranks_required, help="data-parallel ranks of the new set"
                   + ("" if ranks_required else " (default: the first input's)"))
    p.add_argument("--files-per-rank", type=int, help="MindRecord files per rank (default: the first input's, or 1 "
                   "when --ranks is given)")
    p.add_argument("--layout", choices=["per_rank", "global"], default="per_rank", help="file layout (default per_rank)")
    p.add_argument("--remainder", choices=["drop", "pad"], default="drop", help="samples that do not divide by the "
                   "ranks: dropped, or ranks padded with repeats (default drop)")
    p.add_argument("--seed", type=int, default=0, help="seed of the new set's sample shuffle (default 0)")
    p.add_argument("--max-samples-per-file", type=int, default=32768, help="most samples in one file (default 32768)")


def add_shard_tools(shards_sub: argparse._SubParsersAction) -> None:
    """merge, reshard and reweight as actions of `corpusmill shards`."""
    merge = shards_sub.add_parser("merge", help="merge shard sets of the same tokenizer and seq_length into one",
                                  description="Every sample of every input set (each verified first; same tokenizer "
                                  "sha256 and seq_length) in one new set with its own manifest, shuffled and balanced "
                                  "across ranks; never re-tokenized.")
    merge.add_argument("inputs", nargs="+", help="two or more shard folders")
    _output_args(merge)
    reshard = shards_sub.add_parser("reshard", help="the same samples over another number of ranks",
                                    description="The samples of one verified set, shuffled and balanced again over "
                                    "--ranks ranks, in a new set with its own manifest.")
    reshard.add_argument("input", help="the shard folder")
    _output_args(reshard, ranks_required=True)
    reweight = shards_sub.add_parser("reweight", help="a new set meeting token budgets per source/language",
                                     description="Token budgets per source (or source and language) from a mix file "
                                     "(`tokens: {web: 1000000, wiki: {en: 50000, zh: 20000}}`), met by leaving out or "
                                     "repeating whole samples of each group (a sample counts for the group holding "
                                     "most of its ids, as the manifest's composition does); sources the mix does not "
                                     "name are left out. Prints asked vs delivered tokens.")
    reweight.add_argument("input", help="the shard folder (with composition and sample_groups.parquet)")
    reweight.add_argument("--mix", required=True, help="the mix YAML file")
    _output_args(reweight)


def _spec(args: argparse.Namespace, first: Optional[str]):
    from corpusmill.stages import manifest as mf
    from corpusmill.stages.shard_tools import OutputSpec, ToolError

    ranks, fpr = args.ranks, args.files_per_rank
    if ranks is None or fpr is None:
        m, problems = mf.parse(first) if first else (None, [])
        if m is None:
            if ranks is None:
                raise ToolError(mf.summary_line(first, problems))
            m = {"ranks": ranks, "files_per_rank": 1}
        ranks = ranks if ranks is not None else m["ranks"]
        fpr = fpr if fpr is not None else (m["files_per_rank"] if args.ranks is None else 1)
    for flag, value, low in (("--ranks", ranks, 1), ("--files-per-rank", fpr, 1), ("--max-samples-per-file",
                                                                                args.max_samples_per_file, 0),
                             ("--seed", args.seed, 0)):
        if value < low:
            raise ToolError(f"{flag} is {value}, expected at least {low}")
    return OutputSpec(ranks, fpr, args.layout, args.remainder, args.seed, args.max_samples_per_file)


def cmd_shard_tools(args: argparse.Namespace) -> int:
    """Run `shards merge|reshard|reweight`; 0 when the new set is written and verified, 2 on bad input."""
    from corpusmill import pipeline
    from corpusmill.stages import shard_tools as st

    version = getattr(pipeline, "__version__", "0")
    try:
        if args.shards_command == "merge":
            st.merge(args.inputs, args.out, _spec(args, args.inputs[0]), version)
        elif args.shards_command == "reshard":
            st.reshard(args.input, args.out, _spec(args, args.input), version)
        elif args.shards_command == "reweight":
            st.reweight(args.input, args.mix, args.out, _spec(args, args.input), version)
        else:
            raise st.ToolError(f"unknown shards action {args.shards_command!r}")
    except st.ToolError as e:
        print(f"corpusmill: error: {e}", file=sys.stderr)
        return 2
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    """`python -m corpusmill.pipeline.shard_tools_cli merge|reshard|reweight ...` (what `corpusmill shards` runs)."""
    parser = argparse.ArgumentParser(prog="corpusmill shards")
    add_shard_tools(parser.add_subparsers(dest="shards_command", required=True, metavar="ACTION"))
    return cmd_shard_tools(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
