"""The `corpusmill` command line."""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from .jobs_cli import add_jobs as _add_jobs  # the standard library only: nothing heavy loaded at start-up
from .jobs_cli import cmd_jobs as _cmd_jobs

if TYPE_CHECKING:
    from pydantic import ValidationError

DEFAULT_DEMO_OUT = "corpusmill-demo"
CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


def _log(msg: str) -> None:
    print(msg, flush=True)


WORK_HELP = ("with --out URL: the local run directory (stage folders, markers, the shards staged before upload); "
             "default a folder under $CORPUSMILL_CACHE (~/.cache/corpusmill/runs/) named after the URL")


def _add_run(sub: argparse._SubParsersAction) -> None:
    """`corpusmill run CONFIG --out DIR`: the whole pipeline a config describes."""
    run = sub.add_parser("run", help="run the pipeline a YAML config describes",
                         description="Run the pipeline described by CONFIG into the run directory --out.")
    run.add_argument("config", help="YAML config (see configs/example.yaml for every option and its default)")
    run.add_argument("--out", required=True, help="run directory: stage outputs, ledger.json, report.md, shards/, train/; "
                     "or an object-storage URL (s3://bucket/prefix) the results are published to")
    run.add_argument("--work", metavar="DIR", help=WORK_HELP)
    run.add_argument("--resume", action="store_true",
                     help="skip stages whose completion marker matches the config; rerun the rest")
    run.add_argument("--scheduler", metavar="ADDRESS",
                     help="use a running Dask scheduler (tcp://HOST:8786) instead of cluster.address / a LocalCluster")
    run.add_argument("--train", dest="train", action="store_true", default=None, help="train after sharding (train.enabled)")
    run.add_argument("--no-train", dest="train", action="store_false", help="do not train, whatever the config says")
    run.add_argument("--sample", type=float, metavar="FRACTION",
                     help="run on a seeded sample of the documents (e.g. 0.01; input.sample) through the same code path; "
                     "the report projects the full run's figures")


def _add_demo(sub: argparse._SubParsersAction) -> None:
    """`corpusmill demo`: a built-in corpus through every stage and a tiny training run."""
    demo = sub.add_parser("demo", help="build a local demo corpus, run the whole pipeline on it, train a tiny model",
                          description="Build a bilingual demo corpus (no download) with planted duplicates, junk and "
                          "malformed lines, run configs/quickstart.yaml on it, and train a tiny model on the shards.")
    demo.add_argument("--out", default=DEFAULT_DEMO_OUT, help=f"run directory (default: ./{DEFAULT_DEMO_OUT})")
    demo.add_argument("--steps", type=int, help="training steps (default: the quickstart config's train.steps)")
    demo.add_argument("--no-train", action="store_true", help="stop after writing the shards")
    demo.add_argument("--resume", action="store_true", help="reuse finished stages of an earlier demo run in --out")
    demo.add_argument("--scheduler", metavar="ADDRESS", help="use a running Dask scheduler instead of a LocalCluster")


def _add_dedup(sub: argparse._SubParsersAction) -> None:
    """`corpusmill dedup INPUT... --out DIR`: the batch dedup job."""
    dedup = sub.add_parser("dedup", help="remove exact and near duplicates from a corpus (a batch dedup job)",
                           description="Read INPUT files/folders/globs, remove exact duplicates and near duplicates "
                           "(MinHash LSH and/or SimHash, connected components), and write DIR/kept/ with the input's "
                           "fields and DIR/removed/ with uid, id, reason, duplicate_of (the kept document's id), "
                           "cluster_id, cluster_size and similarity. DIR/ledger.json: input = kept + duplicates + quarantined.")
    dedup.add_argument("inputs", nargs="+", metavar="INPUT", help="files, folders or globs (as input.paths)")
    dedup.add_argument("--out", required=True, help="output directory, or an object-storage URL (s3://bucket/prefix) "
                       "kept/, removed/, ledger.json and the report are published to")
    dedup.add_argument("--work", metavar="DIR", help=WORK_HELP)
    dedup.add_argument("--methods", help="comma-separated subset of exact,minhash,simhash "
                       "(default: the config's dedup section; without --config exact,minhash)")
    dedup.add_argument("--threshold", type=float, help="MinHash Jaccard threshold (dedup.minhash.threshold, default 0.8)")
    dedup.add_argument("--keep", help="which document of a near-duplicate cluster is kept: lowest_uid (default), "
                       "longest, or field:NAME[:min] (largest value of input field NAME, e.g. field:date for the newest; "
                       "documents without it lose, and an input where none has it is an error)")
    dedup.add_argument("--against", action="append", metavar="RUN_DIR", default=[],
                       help="an earlier run (written with --write-index) whose documents count as already kept: "
                       "documents here that duplicate them are removed, duplicate_of naming that run and its kept "
                       "document (dedup.reference; repeat for several runs)")
    dedup.add_argument("--write-index", action="store_true", help="write DIR/04b-dedup_index/ so a later run can "
                       "dedup --against this one (dedup.write_index)")
    dedup.add_argument("--format", choices=["parquet", "jsonl"], default="parquet", help="format of DIR/kept/ (default parquet)")
    dedup.add_argument("--config", help="YAML config: its input (fields), normalize, dedup and cluster sections apply")
    dedup.add_argument("--resume", action="store_true", help="skip stages finished by an earlier run into --out")
    dedup.add_argument("--scheduler", metavar="ADDRESS", help="use a running Dask scheduler instead of a LocalCluster")
    dedup.add_argument("--sample", type=float, metavar="FRACTION",
                       help="dedup a seeded sample of the documents (input.sample); the report projects the full run")


def _add_train(sub: argparse._SubParsersAction) -> None:
    """`corpusmill train [lr-find] --shards DIR`: training, or the learning-rate range test."""
    train = sub.add_parser("train", help="train on shards a run produced (or find a learning rate: train lr-find)",
                           description="Train the decoder on one rank's share of a shard directory; writes "
                           "OUT/metrics.jsonl (one JSON object per step), OUT/summary.json and, with --checkpoint-every, "
                           "OUT/checkpoints/. `corpusmill train lr-find` runs a learning-rate range test instead.")
    train.add_argument("action", nargs="?", choices=["lr-find"],
                       help="lr-find: raise the learning rate exponentially over a few steps and print the largest "
                       "rate at which the loss still falls steadily, and a suggested rate 25%% below it")
    train.add_argument("--shards", required=True, help="a shards/ directory holding manifest.json, or its URL "
                       "(s3://bucket/prefix/shards: copied to a local cache first, unchanged objects reused)")
    train.add_argument("--steps", type=int, help="optimizer steps (default: train.steps of --config, else 30)")
    train.add_argument("--out", help="output directory (default: the shards directory's sibling train/)")
    train.add_argument("--config", help="YAML config whose train: section sets the model and optimiser")
    train.add_argument("--rank", type=int, help="which rank's files to read (default 0)")
    train.add_argument("--batch-size", type=int, help="samples per micro-batch (default: 8 samples per step, as the largest micro-batch that fits the available memory with gradient accumulation for the rest)")
    train.add_argument("--lr", type=float, help="peak learning rate (default 3e-3)")
    train.add_argument("--num-parallel-workers", help="MindDataset reader threads (at most the CPU count), or auto")
    train.add_argument("--grad-accumulation", type=int, help="micro-batches per optimizer step (default 1)")
    train.add_argument("--checkpoint-every", type=int, metavar="N", help="write an atomic checkpoint every N steps")
    train.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in OUT/checkpoints, "
                       "at the exact next batch, with the optimizer state and learning-rate step restored")
    train.add_argument("--validation", metavar="DIR", help="held-out shards with their own manifest (a run's "
                       "shards-validation/): the validation loss every train.eval_every steps, in metrics.jsonl "
                       "(val_loss) and summary.json (validation); default: the shards' sibling shards-validation/ "
                       "when it exists")
    train.add_argument("--no-verify", dest="verify", action="store_false",
                       help="skip the start-up check of the shards' sizes and sha256, tokenizer and indexes against "
                       "manifest.json (the manifest itself and the files' presence are always checked)")


def _add_tokenizer(sub: argparse._SubParsersAction) -> None:
    """`corpusmill tokenizer train INPUT... --out MODEL`: a SentencePiece model from a sample."""
    tok = sub.add_parser("tokenizer", help="train a SentencePiece or Hugging Face tokenizer from a corpus sample",
                         description="Tokenizer tools.")
    tok_sub = tok.add_subparsers(dest="tokenizer_command", required=True, metavar="ACTION")
    ttrain = tok_sub.add_parser("train", help="train a tokenizer on a seeded sample of INPUT",
                                description="Read INPUT (files, folders, globs), normalise a seeded sample of documents "
                                "as the pipeline does, train a SentencePiece model (unk/bos/eos/pad = 0/1/2/3, byte "
                                "fallback, newline piece, digits split) or, with --kind hf, a byte-level BPE "
                                "tokenizer.json, and check it (ids, <unk> rate, round trip).")
    ttrain.add_argument("inputs", nargs="+", metavar="INPUT", help="files, folders or globs")
    ttrain.add_argument("--kind", choices=["sentencepiece", "hf"], default="sentencepiece",
                        help="sentencepiece: a .model (default); hf: a byte-level BPE Hugging Face tokenizer.json with "
                        "tokenizer_config.json beside it (<s>/</s>/<pad> = 0/1/2, user symbols next)")
    ttrain.add_argument("--out", required=True, help="where to write the model (sentencepiece: .model added if missing, "
                        ".vocab beside it; hf: a .json file name, or a folder that gets tokenizer.json)")
    ttrain.add_argument("--vocab-size", type=int, help="vocabulary size (default 8000)")
    ttrain.add_argument("--model-type", choices=["bpe", "unigram"], help="SentencePiece model type (default bpe)")
    ttrain.add_argument("--character-coverage", type=float, help="share of characters covered (default 0.9995, for Chinese)")
    ttrain.add_argument("--no-byte-fallback", action="store_true", help="map unknown characters to <unk> instead of bytes")
    ttrain.add_argument("--user-symbols", help="comma-separated special tokens kept whole, e.g. '<|im_start|>,<|im_end|>'")
    ttrain.add_argument("--sample-docs", type=int, help="documents sampled to train on (default 20000)")
    ttrain.add_argument("--config", help="YAML config whose input, normalize and tokenizer.train sections apply")


def _add_shards(sub: argparse._SubParsersAction) -> None:
    """`corpusmill shards verify|inspect DIR`: check or look into a shard directory."""
    shards = sub.add_parser("shards", help="verify or inspect a shard directory",
                            description="Check or look into a shards/ directory a run wrote.")
    shards_sub = shards.add_subparsers(dest="shards_command", required=True, metavar="ACTION")
    verify = shards_sub.add_parser("verify", help="check every file and sample against manifest.json",
                                   description="Everything manifest.json claims: its format and keys, every path "
                                   "inside the folder, size and sha256 of every .mindrecord and .db and of the tokenizer, "
                                   "the tokenizer's vocabulary and special ids, each .mindrecord with its own .db, ranks "
                                   "against files, no unlisted MindRecord file; then every sample read back in a child "
                                   "process (count, length, dtype, contents, ids below the vocabulary, equal samples per "
                                   "rank). Exit code 1 and one line per problem on any mismatch.")
    verify.add_argument("dir", help="the shards/ directory (holding manifest.json), or its URL (s3://...: every "
                        "object is downloaded to a temporary folder and checked there)")
    inspect_ = shards_sub.add_parser("inspect", help="print totals and decoded samples",
                                     description="Print the manifest's totals and decode the first samples with the "
                                     "tokenizer stored beside the shards.")
    inspect_.add_argument("dir", help="the shards/ directory (holding manifest.json), or its URL (via the local cache)")
    inspect_.add_argument("--decode", type=int, default=2, metavar="N", help="samples to decode (default 2), with "
                          "their document boundaries marked: BOS as ⟨s⟩, EOS as ⟨/s⟩, trailing padding as ⟨pad×N⟩")
    from .shard_tools_cli import add_shard_tools

    add_shard_tools(shards_sub)  # merge, reshard, reweight: new shard sets from existing ones


def _add_config(sub: argparse._SubParsersAction) -> None:
    """`corpusmill config show|diff|example`: configs inspected without running anything."""
    config = sub.add_parser("config", help="print a resolved config, or the documented example",
                            description="Inspect configs without running anything.")
    config_sub = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    show = config_sub.add_parser("show", help="print CONFIG fully resolved, every default filled in",
                                 description="Validate CONFIG and print it with every default filled in.")
    show.add_argument("config", help="YAML config to resolve")
    diff = config_sub.add_parser("diff", help="show what differs between two configs or two runs' configs",
                                 description="Resolve A and B (YAML configs, or run directories: their config.yaml) "
                                 "with every default filled in and print each key whose value differs. Exit code 1 "
                                 "when they differ, 0 when they are the same.")
    diff.add_argument("a", help="a YAML config or a run directory")
    diff.add_argument("b", help="a YAML config or a run directory")
    config_sub.add_parser("example", help="print configs/example.yaml (every option, its default and meaning)",
                          description="Print every option at its default with its description.")


def _add_doctor(sub: argparse._SubParsersAction) -> None:
    """`corpusmill doctor`: the environment checked before a run."""
    doctor = sub.add_parser("doctor", help="check the environment (and a config) before a run",
                            description="Python and package versions against the pins, mindspore.run_check(), the "
                            "device, CPUs vs Dask workers and num_parallel_workers, free memory and disk vs what the "
                            "config needs, the Dask scheduler, the tokenizer and input files. Each check prints ok, "
                            "warning or error with the fix; exit code 1 on any error.")
    doctor.add_argument("--config", help="YAML config to check against")
    doctor.add_argument("--out", help="the run directory the config would write (for the disk check; default .)")
    doctor.add_argument("--skip-mindspore", action="store_true", help="skip mindspore.run_check() (about 5-10 s)")


def _add_serve(sub: argparse._SubParsersAction) -> None:
    """`corpusmill serve`: the job API over HTTP."""
    srv = sub.add_parser("serve", help="run the job API: submit, follow, cancel run/dedup/train jobs over HTTP",
                         description="An authenticated HTTP API (OpenAPI at /openapi.json) that runs run, dedup and "
                         "train jobs on a shared Dask cluster. The bearer token comes from $CORPUSMILL_TOKEN or "
                         "--token-file, never from the command line; on a loopback address without one, a token is "
                         "generated into STATE/token. Jobs may only use paths and URLs inside the --data-root folders and prefixes. Job "
                         "state lives in STATE/jobs.db: jobs running when the service stops are resumed when it starts.")
    srv.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; any other "
                     "address needs a token)")
    srv.add_argument("--port", type=int, default=8787, help="port (default 8787)")
    srv.add_argument("--state", default=".corpusmill-service", help="state folder: jobs.db, job logs and configs "
                     "(default ./.corpusmill-service)")
    srv.add_argument("--data-root", action="append", default=[], metavar="DIR|URL",
                     help="a folder, or an object-storage prefix (s3://bucket/prefix), jobs may read and write "
                     "(repeatable; default the current folder); relative job paths are taken from the first folder")
    srv.add_argument("--scheduler", metavar="ADDRESS", help="run jobs on this Dask scheduler (tcp://HOST:8786) "
                     "instead of a LocalCluster the service starts")
    srv.add_argument("--workers", type=int, help="LocalCluster worker processes (default: the CPU count)")
    srv.add_argument("--dashboard-address", default="127.0.0.1:0", metavar="HOST:PORT",
                     help="where the LocalCluster's Dask dashboard listens (default 127.0.0.1:0: loopback, a free port; "
                     "it has no authentication)")
    srv.add_argument("--token-file", help="file holding the bearer token (when $CORPUSMILL_TOKEN is unset)")
    srv.add_argument("--max-concurrent", type=int, default=1, help="jobs running at once (default 1)")
    srv.add_argument("--max-queued", type=int, default=100, help="jobs waiting at most; more get 429 (default 100)")


# one function per subcommand, in the order `corpusmill --help` lists them
def _add_quality(sub) -> None:
    from .quality_cli import add_quality

    add_quality(sub)


_SUBCOMMANDS = (_add_run, _add_demo, _add_dedup, _add_train, _add_tokenizer, _add_quality, _add_shards, _add_config,
                _add_doctor, _add_serve, _add_jobs)


def _build_parser() -> argparse.ArgumentParser:
    """The whole command line; each subcommand's arguments come from its own `_add_*` function."""
    p = argparse.ArgumentParser(
        prog="corpusmill",
        description="Raw text corpus -> normalised, filtered, deduplicated, tokenized, packed per-rank "
        "MindRecord shards with a manifest -> MindSpore pretraining. Runs on an embedded Dask LocalCluster "
        "or on a Dask cluster given by address.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in _SUBCOMMANDS:
        add(sub)
    return p


def _cmd_quality(args) -> int:
    from .quality_cli import cmd_quality

    return cmd_quality(args)


def _cmd_tokenizer(args) -> int:
    import shutil
    import tempfile

    from .config import Config, parse_config
    from .executor import sample_part
    from .steps.read import max_record_bytes
    from .steps.tokenize import check_sample, sample_plan
    from corpusmill.stages import read, tokenize
    from corpusmill.stages.normalize import normalize_array

    cfg = _load(args.config) if args.config else Config()
    tc = cfg.tokenizer.train
    for attr, value in (("vocab_size", args.vocab_size), ("model_type", args.model_type),
                        ("character_coverage", args.character_coverage), ("sample_docs", args.sample_docs)):
        if value is not None:
            setattr(tc, attr, value)
    if args.no_byte_fallback:
        tc.byte_fallback = False
    if args.user_symbols:
        tc.user_symbols = [x for x in args.user_symbols.split(",") if x]
    cfg = parse_config(cfg.model_dump(mode="json"), "command line")
    tc = cfg.tokenizer.train
    if args.kind == "hf":
        out = Path(args.out) if args.out.endswith(".json") else Path(args.out) / "tokenizer.json"
    else:
        out = Path(args.out if args.out.endswith(".model") else args.out + ".model")
    files = read.expand_inputs(list(args.inputs))
    with tempfile.TemporaryDirectory() as tmp:
        units, to_count = read.plan_units(files, 1 << 62, int(cfg.input.part_size_mb * 2**20))
        opts = read.ReadOptions(cfg.input.text_field, cfg.input.id_field, cfg.input.source_field,
                                int(cfg.input.part_size_mb * 2**20), max_record_bytes=max_record_bytes(cfg))
        docs = sum(read.read_unit(u, opts, tmp)["stats"]["docs_out"] for u in units)
        parts = sorted(str(p) for p in Path(tmp).glob("part-*.parquet"))
        sample = [t for args in sample_plan(parts, cfg.tokenizer.model_copy(update={"model": None}), docs)
                  for t in sample_part(*args)]
        import pyarrow as pa

        sample = normalize_array(pa.array(sample, pa.string()), **cfg.normalize.model_dump()).to_pylist()
        lines = tokenize.write_training_sample(sample, Path(tmp) / "sample.txt")
        what = "byte-level BPE (tokenizer.json)" if args.kind == "hf" else tc.model_type
        _log(f"tokenizer: training {what}, vocab {tc.vocab_size}, on {len(sample):,} of {docs:,} documents "
             f"({lines:,} lines)")
        out.parent.mkdir(parents=True, exist_ok=True)
        check = check_sample(sample, tc.seed)
        if args.kind == "hf":
            tokenize.train_hf_tokenizer(Path(tmp) / "sample.txt", out, vocab_size=tc.vocab_size, seed=tc.seed,
                                        user_symbols=tuple(tc.user_symbols))
            return _report_trained(out, cfg, check, tokenize.spec_of("hf"))
        model = tokenize.train_tokenizer(Path(tmp) / "sample.txt", Path(tmp) / "tok", vocab_size=tc.vocab_size,
                                         model_type=tc.model_type, character_coverage=tc.character_coverage,
                                         byte_fallback=tc.byte_fallback, seed=tc.seed, num_threads=os.cpu_count() or 1,
                                         user_symbols=tuple(tc.user_symbols))
        shutil.copyfile(model, out)
        shutil.copyfile(str(model)[: -len(".model")] + ".vocab", out.with_suffix(".vocab"))
    return _report_trained(out, cfg, check, tokenize.spec_of("sentencepiece"))


def _report_trained(out: Path, cfg: Any, check: list[str], spec: Any) -> int:
    """Check a trained tokenizer on a sample and print its ids and rates."""
    from corpusmill.stages import tokenize

    report = tokenize.check_tokenizer(str(out), add_bos=cfg.tokenizer.add_bos, add_eos=cfg.tokenizer.add_eos,
                                      pad_id=None, model_vocab_size=None, sample_texts=check, spec=spec)
    _log(f"tokenizer: {out} (sha256 {report.sha256[:16]}…): vocabulary {report.vocab_size:,}; unk {report.unk_id}, "
         f"bos {report.bos_id}, eos {report.eos_id}, pad {report.pad_id}; on {report.sample_docs} sample documents "
         f"<unk> rate {report.unk_rate:.4%}, round-trip mismatches {report.roundtrip_mismatch_rate:.1%}")
    return 0


def _cmd_shards(args) -> int:
    if args.shards_command in ("merge", "reshard", "reweight"):
        from .shard_tools_cli import cmd_shard_tools

        return cmd_shard_tools(args)
    from corpusmill.stages import storage

    if args.shards_command == "verify":
        if storage.is_url(args.dir):
            return _verify_url(args.dir)
        return _verify_dir(args.dir, args.dir)
    if storage.is_url(args.dir):
        from corpusmill.trainer.data import local_shards

        args.dir = local_shards(args.dir, log=_log)
    import json

    import mindspore.dataset as ds

    from corpusmill.trainer.data import check_shards
    from corpusmill.stages import tokenizer_kinds
    from corpusmill.stages.manifest import tokenizer_spec

    manifest = check_shards(args.dir, verify=True, log=lambda m: None,  # never hand a damaged file to the reader
                            need_mindrecord=False)
    _log(json.dumps({k: v for k, v in manifest.items() if k != "files"}, indent=1, ensure_ascii=False))
    for e in manifest["files"]:
        _log(f"  {e['path']}: rank {e['rank']}, {e['samples']:,} samples, {e.get('tokens', 0):,} tokens")
    tok = manifest["tokenizer"]
    sp = tokenizer_kinds.load(str(Path(args.dir) / tok["path"]), tokenizer_spec(tok))  # any kind: .decode(ids)
    if not manifest["files"]:  # Megatron pairs only: decode the first documents of the first pair
        from corpusmill.stages.megatron import read_documents

        for p in manifest["megatron"]["pairs"]:
            _log(f"  {p['prefix']}.bin/.idx: rank {p['rank']}, {p['documents']:,} documents, {p['tokens']:,} tokens")
        prefix = manifest["megatron"]["pairs"][0]["prefix"]
        for i, ids in enumerate(read_documents(str(Path(args.dir) / prefix))):
            if i >= args.decode:
                break
            _log(f"--- document {i} of {prefix} ({len(ids)} ids) ---")
            _log(decode_window(sp, ids, tok["bos_id"], tok["eos_id"]))
        return 0
    first = str(Path(args.dir) / manifest["files"][0]["path"])
    columns = ["input_ids", "labels"] if "labels" in manifest["columns"] else ["input_ids"]
    data = ds.MindDataset([first], columns_list=columns, shuffle=False)
    if args.decode > 0:
        _log(f"document boundaries: {BOS_MARK} BOS (id {tok['bos_id']}), {EOS_MARK} EOS (id {tok['eos_id']}, a line "
             f"break follows it), {PAD_MARK.format(n='N')} N padding ids (id {tok['pad_id']})")
    for i, row in enumerate(data.create_tuple_iterator(output_numpy=True, num_epochs=1)):
        if i >= args.decode:
            break
        ids = row[0]
        n_pad = trailing_padding(ids, row[1] if len(row) > 1 else None, tok["pad_id"], tok["eos_id"], tok["bos_id"])
        ends = int((ids[: len(ids) - n_pad] == tok["eos_id"]).sum())
        _log(f"--- sample {i} of {manifest['files'][0]['path']} ({len(ids)} ids: {ends} document ends, {n_pad} padding) ---")
        _log(decode_window(sp, ids, tok["bos_id"], tok["eos_id"], n_pad))
    return 0


def _verify_dir(folder: str, name: str) -> int:
    """`shards verify`: one line per problem (the folder written as `name`), exit 1 on any."""
    from corpusmill.stages.shard import verify_shard_dir

    def shown(text: str) -> str:
        for local in {os.path.abspath(folder), folder}:
            text = text.replace(local, name.rstrip("/"))
        return text

    started = time.perf_counter()
    problems, totals = verify_shard_dir(folder)
    for p in problems:
        print(f"corpusmill: shards: {shown(p)}", file=sys.stderr)
    if problems:
        unread = " (samples not read back: fix these first)" if totals and not totals.get("rows_checked") else ""
        print(f"corpusmill: shards verify: {len(problems)} problem(s) in {name}{unread}", file=sys.stderr)
        return 1
    mega = (f"; {totals['megatron_pairs']} Megatron .bin/.idx pair(s), {totals['megatron_documents']:,} documents, "
            f"{totals['megatron_tokens']:,} tokens") if "megatron_pairs" in totals else ""
    per_rank = next(iter(totals["samples_per_rank"].values()), 0)
    mindrecord = (f"{totals['files']} files, {totals['samples']:,} samples, {totals['ranks']} ranks x {per_rank:,} "
                  f"samples" if totals["files"] else "no MindRecord files")
    _log(f"shards ok: {mindrecord}{mega}, largest id {totals['max_token_id']} "
         f"< vocabulary {totals['vocab_size']}; checked in {time.perf_counter() - started:.1f} s")
    return 0


def _verify_url(url: str) -> int:
    """`shards verify URL`: every object downloaded afresh into a temporary folder (a damaged object is
    found, never an older cached copy) and checked there; the problems name the URL."""
    import tempfile

    from corpusmill.stages import storage

    with tempfile.TemporaryDirectory(prefix="corpusmill-verify-") as tmp:
        local = storage.mirror(url, Path(tmp) / "shards", log=_log, reuse=False)
        return _verify_dir(str(local), url)


BOS_MARK, EOS_MARK, PAD_MARK = "⟨s⟩", "⟨/s⟩", "⟨pad×{n}⟩"


def trailing_padding(ids: Any, labels: Any, pad_id: int, eos_id: int, bos_id: int) -> int:
    """The padding at the end of a sample: the masked labels (-100) when the shards carry labels;
    otherwise the run of pad ids after the sample's last EOS (concat pads only the last window, after
    a document's end), none when the pad id is EOS or BOS itself."""
    import numpy as np

    if labels is not None:
        masked = np.asarray(labels) == -100
        return int(len(masked) - np.flatnonzero(~masked)[-1] - 1) if (~masked).any() else len(masked)
    ids = np.asarray(ids)
    if pad_id in (eos_id, bos_id):
        return 0
    real = np.flatnonzero(ids != pad_id)
    run = len(ids) - (int(real[-1]) + 1 if len(real) else 0)
    return run if run and len(real) and ids[real[-1]] == eos_id else 0


def decode_window(sp: Any, ids: Any, bos_id: int, eos_id: int, n_pad: int = 0) -> str:
    """A sample's text with its document boundaries visible: each run of ordinary ids decoded on its
    own, BOS as ⟨s⟩, EOS as ⟨/s⟩ and a line break, the trailing `n_pad` padding ids as ⟨pad×N⟩ (what
    a plain decode hides: documents would run into one another)."""
    body = [int(x) for x in ids[: len(ids) - n_pad]]
    out: list[str] = []
    run: list[int] = []
    for t in body:
        if t == bos_id or t == eos_id:
            if run:
                out.append(sp.decode(run))
                run = []
            out.append(BOS_MARK if t == bos_id else EOS_MARK + "\n")
        else:
            run.append(t)
    if run:
        out.append(sp.decode(run))
    if n_pad:
        out.append(PAD_MARK.format(n=n_pad))
    return "".join(out)


def _cmd_config(args) -> int:
    from .config import EXAMPLE_PATHS, render_example

    if args.config_command == "show":
        sys.stdout.write(_load(args.config).to_yaml())
    elif args.config_command == "diff":
        return _config_diff(args.a, args.b)
    else:
        sys.stdout.write(render_example(EXAMPLE_PATHS))
    return 0


def _flatten(value, prefix: str = "") -> dict:
    if isinstance(value, dict):
        out: dict = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def _config_diff(a: str, b: str) -> int:
    import json

    def resolve(path: str):
        p = Path(path)
        return _load(str(p / "config.yaml") if p.is_dir() else str(p))

    fa, fb = (_flatten(resolve(x).model_dump(mode="json")) for x in (a, b))
    keys = sorted(set(fa) | set(fb))
    changed = [k for k in keys if fa.get(k, "<absent>") != fb.get(k, "<absent>")]
    for k in changed:
        print(f"{k}: {json.dumps(fa.get(k, '<absent>'), ensure_ascii=False)} -> {json.dumps(fb.get(k, '<absent>'), ensure_ascii=False)}")
    if not changed:
        print(f"no differences ({len(keys)} keys compared)")
    return 1 if changed else 0


def _cmd_doctor(args) -> int:
    from .doctor import ERROR, WARNING, run_checks

    cfg = _load(args.config) if args.config else None
    checks = run_checks(cfg, args.out, mindspore=not args.skip_mindspore)
    for c in checks:
        print(c.line())
    n_err = sum(c.status == ERROR for c in checks)
    n_warn = sum(c.status == WARNING for c in checks)
    print(f"doctor: {len(checks)} checks, {n_err} errors, {n_warn} warnings")
    return 1 if n_err else 0


def _load(path: str):
    from .config import load_config

    cfg = load_config(path)
    for note in cfg.migration_notes:
        print(f"corpusmill: {path}: migrated {note} (set config_version and the new keys to silence this)",
              file=sys.stderr)
    return cfg


def _print_run_summary(result, out: Path) -> None:
    led = result.ledger
    _log("")
    _log("== corpusmill summary ==")
    _log(f"documents: input {led['input']:,} = kept {led['kept']:,} + filtered {led['filtered']:,} + "
         f"duplicates {led['duplicates']:,} + quarantined {led['quarantined']:,}  (balanced)")
    for name, s in led["stages"].items():
        removed = ", ".join(f"{k} {v}" for k, v in sorted(s["removed"].items())) or "-"
        _log(f"  {name:<12} {s['in']:>9,} -> {s['out']:>9,}   removed: {removed}")
    if "tokens" in led and "packing" not in led:  # shard.format megatron: whole documents, no packing
        _log(f"tokens: {led['tokens']:,} (whole documents, not packed)")
    elif "tokens" in led:
        p = led["packing"]
        _log(f"tokens: {led['tokens']:,}; packing {p['mode']}: {p['windows']:,} windows (seq+1 ids each), "
             f"{p['docs_split']:,} documents split, {p['docs_truncated']:,} truncated, {p['tokens_dropped']:,} tokens "
             f"dropped, {100 * p['padding_share']:.2f}% padding")
    if "megatron" in led:
        m = led["megatron"]
        _log(f"megatron: {m['documents']:,} documents, {m['tokens']:,} tokens in {m['pairs']} .bin/.idx pair(s) -> "
             f"{out / 'shards' / 'megatron'}")
    if "samples" in led and led["samples"]:
        _log(f"shards: {led['samples']:,} samples, {led['samples_per_rank']:,} per rank "
             f"({led['samples_dropped_for_equal_ranks']} dropped for equal ranks) -> {out / 'shards' / 'manifest.json'}")
    if result.train:
        t = result.train
        _log(f"training: {t['steps']} steps, loss {t['first_loss']:.3f} -> {t['last_loss']:.3f}, "
             f"data wait {100 * t['data_wait_share']:.1f}% -> {out / 'train' / 'metrics.jsonl'}")
    _log_sample(led)
    _log(f"report: {out / 'report.md'}   ledger: {out / 'ledger.json'}")


def _log_sample(led: dict) -> None:
    sample = led.get("sample")
    if not sample:
        return
    p = sample["projected_full_run"]
    shown = ", ".join(f"{k} {v:,}" for k, v in p.items() if k != "wall_s")
    _log(f"SAMPLE RUN of {sample['fraction']:.2%} of the documents; projected full run: {shown}, "
         f"about {p['wall_s']:,.0f} s ({sample['note']})")


def _cmd_run(args) -> int:
    cfg = _load(args.config)  # before the runner's imports (Dask): a bad config fails in a second
    from .runner import Pipeline

    if args.scheduler:
        cfg.cluster.address = args.scheduler
    if args.sample is not None:
        cfg.input.sample = args.sample
    if args.train is not None:
        cfg.train.enabled = args.train
    result = Pipeline(cfg, args.out, resume=args.resume, log=_log, work=_work(args)).run()
    _print_run_summary(result, result.out)
    _log_published(args.out, ["shards/manifest.json", "ledger.json", "report.md"])
    return 0


def _work(args) -> Optional[str]:
    """--work, which only a URL --out takes (a local --out is the run directory itself)."""
    from corpusmill.stages import storage

    if args.work and not storage.is_url(args.out):
        from .config import ConfigError

        raise ConfigError("--work is for --out URL (object storage); with a local --out the run directory is --out")
    return args.work


def _log_published(out: str, names: list[str]) -> None:
    from corpusmill.stages import storage

    if storage.is_url(out):
        _log("published: " + "   ".join(storage.join(out, n) for n in names))


def _cmd_demo(args) -> int:
    from .demo import build_demo_corpus
    from .runner import Pipeline

    out = Path(args.out)
    cfg = _load(str(CONFIG_DIR / "quickstart.yaml"))
    corpus = out / "corpus"
    t0 = time.perf_counter()
    if args.resume and (corpus / "PLANTED.json").is_file():  # rewriting it would make every stage rerun
        import json

        planted = json.loads((corpus / "PLANTED.json").read_text(encoding="utf-8"))
        verb = "reused the corpus in"
    else:
        planted = build_demo_corpus(corpus)
        verb = "wrote a corpus to"
    c = planted["counts"]
    _log(f"demo: {verb} {corpus} in {time.perf_counter() - t0:.1f}s with {c['exact_duplicates']} planted exact "
         f"duplicates, {c['near_duplicates']} near duplicates, {c['junk']} junk documents, {c['malformed']} malformed records")
    cfg.input.paths = [str(corpus)]
    if args.scheduler:
        cfg.cluster.address = args.scheduler
    cfg.train.enabled = not args.no_train
    if args.steps:
        cfg.train.steps = args.steps
    result = Pipeline(cfg, out, resume=args.resume, log=_log).run()
    _print_run_summary(result, out)
    filtered = _removed_ids(out / "02-filter")
    found, both = _planted_pairs_found(out / "03-exact_dedup", planted["exact_duplicates"], "duplicate_of", filtered)
    near, near_both = _planted_pairs_found(out / "04-near_dedup", planted["near_duplicates"], "near", filtered)
    near_exact, _ = _planted_pairs_found(out / "03-exact_dedup", planted["near_duplicates"], "near", filtered)
    near += near_exact  # an edit that normalisation undoes leaves an exact copy
    # a pair the quality filters split (one copy removed there) needs no near dedup: one copy is left
    near_one = sum((p["id"] in filtered) != (p["near"] in filtered) for p in planted["near_duplicates"])
    _log(f"demo check: planted exact-duplicate pairs: {found} resolved by exact dedup + {both} with both copies "
         f"filtered first = {found + both} / {c['exact_duplicates']}; planted near-duplicate pairs: {near} resolved by "
         f"dedup + {near_one} with one copy filtered + {near_both} both filtered = {near + near_one + near_both} / "
         f"{c['near_duplicates']}{_planted_span(planted, cfg)}; "
         f"quarantined {result.ledger['quarantined']} / planted malformed {c['malformed']}")
    return 0


def _planted_span(planted: dict, cfg) -> str:
    """The planted near copies' true character 5-gram Jaccard range beside the threshold they must clear."""
    js = [p["jaccard"] for p in planted["near_duplicates"] if "jaccard" in p]
    if not js:
        return ""
    return f" (true Jaccard {min(js):.2f}-{max(js):.2f}, threshold {cfg.dedup.minhash.threshold})"


def _removed_ids(stage_dir: Path) -> set:
    from corpusmill.stages.base import read_table

    removed_dir = stage_dir / "removed"
    if not any(removed_dir.glob("*.parquet")):
        return set()
    return set(read_table(str(removed_dir), columns=["id"]).column("id").to_pylist())


def _planted_pairs_found(stage_dir: Path, pairs: list[dict], other: str, filtered: set) -> tuple[int, int]:
    """Planted (copy, original) pairs that ended with one side removed as a duplicate of the other,
    and pairs whose copies were both removed by the quality filters before dedup saw them."""
    import pyarrow.parquet as pq

    from corpusmill.stages.base import read_table

    removed_dir = stage_dir / "removed"
    links: set = set()
    if any(removed_dir.glob("*.parquet")):
        # exact dedup's first match stays in exact_of_id when near dedup later removed it (duplicate_of then names its keeper)
        col = "exact_of_id" if "exact_of_id" in pq.read_schema(next(removed_dir.glob("*.parquet"))).names else "duplicate_of_id"
        removed = read_table(str(removed_dir), columns=["id", col]).to_pylist()
        links = {(r["id"], r[col]) for r in removed}
    found = sum((p["id"], p[other]) in links or (p[other], p["id"]) in links for p in pairs)
    both = sum(p["id"] in filtered and p[other] in filtered for p in pairs)
    return found, both


def _cmd_dedup(args) -> int:
    from .config import Config, ConfigError, parse_config
    from .runner import Pipeline

    cfg = _load(args.config) if args.config else Config()
    cfg.input.paths = list(args.inputs)
    if args.methods:
        methods = {m.strip() for m in args.methods.split(",") if m.strip()}
        unknown = methods - {"exact", "minhash", "simhash"}
        if unknown or not methods:
            raise ConfigError(f"--methods: unknown {sorted(unknown)}; choose from exact, minhash, simhash")
        cfg.dedup.exact = "exact" in methods
        cfg.dedup.minhash.enabled = "minhash" in methods
        cfg.dedup.simhash.enabled = "simhash" in methods
    if args.threshold is not None:
        cfg.dedup.minhash.threshold = args.threshold
    if args.keep:
        policy, _, rest = args.keep.partition(":")
        if policy == "field":
            name, _, order = rest.partition(":")
            if not name:
                raise ConfigError("--keep field:NAME needs a field name")
            cfg.dedup.keep_field, cfg.dedup.keep_order = name, order or "max"
        elif policy not in ("lowest_uid", "longest"):
            raise ConfigError(f"--keep {args.keep}: expected lowest_uid, longest or field:NAME")
        if policy != "lowest_uid" and not (cfg.dedup.minhash.enabled or cfg.dedup.simhash.enabled):
            raise ConfigError(f"--keep {args.keep}: applies to near duplicates (methods minhash, simhash); exact "
                              "duplicates always keep the first copy (lowest uid)")
        cfg.dedup.keep = policy
    if args.sample is not None:
        cfg.input.sample = args.sample
    if args.against:
        cfg.dedup.reference = list(cfg.dedup.reference) + list(args.against)
    if args.write_index:
        cfg.dedup.write_index = True
    cfg = parse_config(cfg.model_dump(mode="json"), "command line")  # re-validate the combination
    if args.scheduler:
        cfg.cluster.address = args.scheduler
    result = Pipeline(cfg, args.out, resume=args.resume, log=_log, job="dedup", export_format=args.format,
                      work=_work(args)).run()
    out = result.out
    led = result.ledger
    _log("")
    _log("== corpusmill dedup summary ==")
    _log(f"documents: input {led['input']:,} = kept {led['kept']:,} + duplicates {led['duplicates']:,} + "
         f"quarantined {led['quarantined']:,}  (balanced)")
    for name in ("reference_dedup", "exact_dedup", "near_dedup"):
        if name in led["stages"]:
            removed = ", ".join(f"{k} {v:,}" for k, v in sorted(led["stages"][name]["removed"].items())) or "none"
            _log(f"  {name:<12} removed: {removed}")
    near = result.stages.get("near_dedup", {})
    if near.get("clusters"):
        _log(f"  near-duplicate clusters: {near['clusters']:,} (largest {near['largest_cluster']}); "
             f"sizes: {near['cluster_sizes']}")
    _log_sample(led)
    _log(f"kept: {out / 'kept'}   removed: {out / 'removed'}   ledger: {out / 'ledger.json'}   report: {out / 'report.md'}")
    _log_published(args.out, ["kept/", "removed/", "ledger.json", "report.md"])
    return 0


def _cmd_serve(args) -> int:
    from .service.serve import serve

    return serve(args.host, args.port, args.state, args.data_root, scheduler=args.scheduler, token_file=args.token_file,
                 max_concurrent=args.max_concurrent, max_queued=args.max_queued, n_workers=args.workers,
                 dashboard_address=args.dashboard_address, log=_log)


def _cmd_train(args) -> int:
    from .config import ConfigError, TrainConfig
    from corpusmill.trainer.train import train

    tcfg = _load(args.config).train if args.config else TrainConfig()
    workers = args.num_parallel_workers
    if workers is not None and workers != "auto":
        try:
            workers = int(workers)
        except ValueError:
            raise ConfigError(f"--num-parallel-workers {workers}: expected a positive integer or auto") from None
    for attr, value in (("steps", args.steps), ("rank", args.rank), ("batch_size", args.batch_size), ("lr", args.lr),
                        ("num_parallel_workers", workers), ("grad_accumulation", args.grad_accumulation),
                        ("checkpoint_every", args.checkpoint_every)):
        if value is not None:
            setattr(tcfg, attr, value)
    if args.action == "lr-find":
        from corpusmill.trainer.train import lr_find

        from corpusmill.trainer.data import local_shards

        result = lr_find(local_shards(args.shards, log=_log), tcfg, log=_log, verify=args.verify)
        _log(f"largest lr at which the loss still falls steadily: {result['largest_falling_lr']:.3g}; "
             f"suggested: {result['suggested_lr']:.3g}")
        return 0
    from corpusmill.trainer.data import local_shards, remote_sibling

    shards_arg = args.shards
    args.shards = local_shards(shards_arg, log=_log)  # a URL: the local copy MindDataset reads
    out = args.out or str(Path(args.shards).resolve().parent / "train")
    sibling = Path(args.shards).resolve().parent / "shards-validation"
    validation = local_shards(args.validation, log=_log) if args.validation else None
    if validation is None and shards_arg != args.shards:
        validation = remote_sibling(shards_arg, "shards-validation", log=_log)
    elif validation is None:
        validation = str(sibling) if (sibling / "manifest.json").is_file() else None
    summary = train(args.shards, out, tcfg, log=_log, resume=args.resume, verify=args.verify, validation_dir=validation)
    val = summary.get("validation")
    _log(f"training: {summary['steps']} steps, loss {summary['first_loss']:.3f} -> {summary['last_loss']:.3f}; "
         + (f"validation loss {val['first_loss']:.3f} -> {val['last_loss']:.3f}; " if val and val["losses"] else "")
         + f"data wait {100 * summary['data_wait_share']:.1f}%; metrics in {Path(out) / 'metrics.jsonl'}")
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    os.environ.setdefault("GLOG_v", "3")  # MindSpore's C++ warnings drown the progress lines
    args = _build_parser().parse_args(argv)
    handlers = {"run": _cmd_run, "demo": _cmd_demo, "train": _cmd_train, "config": _cmd_config, "dedup": _cmd_dedup,
                "shards": _cmd_shards, "tokenizer": _cmd_tokenizer, "doctor": _cmd_doctor,
                "quality": _cmd_quality, "serve": _cmd_serve, "jobs": _cmd_jobs}
    previous_sigterm = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)  # Slurm, Kubernetes, `timeout`
    try:
        return handlers[args.command](args)
    except _loaded(_USER_ERRORS) + (ConnectionError, FileNotFoundError) as e:
        print(f"corpusmill: error: {e}", file=sys.stderr)
        return 2
    except _loaded(_FLAG_ERRORS) as e:  # a command-line value out of range (config files are checked by load_config)
        print(f"corpusmill: error: {_flag_error(e)}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:  # an optional extra this command needs is not installed
        from .extras import missing_hint

        why = missing_hint(e)
        if why is None:
            raise
        print(f"corpusmill: error: {why}", file=sys.stderr)
        return 2
    except OSError as e:  # outside a run's stages (those name the stage themselves)
        where = f": {e.filename}" if e.filename else ""
        print(f"corpusmill: error: {e.strerror or e}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        how = "stopped by SIGTERM" if isinstance(e, Terminated) else "interrupted"
        print(f"corpusmill: {how}; rerun with --resume to continue from the last finished stage", file=sys.stderr)
        return 143 if isinstance(e, Terminated) else 130
    finally:
        signal.signal(signal.SIGTERM, previous_sigterm)


# The errors that are the user's to fix, each a one-line message and exit 2, named by (module, class) so
# that catching them imports nothing: a command that fails on its config never loads Dask or MindSpore,
# and a class whose module was never imported cannot have been raised.
_USER_ERRORS = (("corpusmill.stages.base", "ConfigError"), ("corpusmill.stages.read", "InputError"),
                ("corpusmill.pipeline.step", "PipelineError"), ("corpusmill.pipeline.ledger", "LedgerError"),
                ("corpusmill.stages.manifest", "ShardMismatch"), ("corpusmill.stages.tokenize", "TokenizerError"),
                ("corpusmill.stages.storage", "StorageError"))
_FLAG_ERRORS = (("pydantic", "ValidationError"),)


def _loaded(names: tuple[tuple[str, str], ...]) -> tuple[type, ...]:
    """The classes among `names` whose modules are imported (evaluated when an exception is caught)."""
    return tuple(getattr(sys.modules[m], c) for m, c in names if m in sys.modules)


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C: the run records `interrupted` and can be resumed."""


def _sigterm_as_interrupt(signum, frame) -> None:
    raise Terminated()


def _flag_error(err: ValidationError) -> str:
    """One line per bad value, named by the flag that set it: `--threshold: must be <= 1 (got 1.5)`."""
    lines = []
    for e in err.errors():
        if not e["loc"]:  # a check across fields: its message names them
            lines.append(str(e["msg"]).removeprefix("Value error, "))
            continue
        lines.append(f"--{str(e['loc'][-1]).replace('_', '-')}: {e['msg']} (got {e.get('input')!r})")
    return "; ".join(lines)


if __name__ == "__main__":
    sys.exit(main())
