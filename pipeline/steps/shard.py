"""shard: packed windows -> per-rank MindRecord files (shuffled by a seed, equal per rank) with a
manifest, the tokenizer and a mindformers dataset snippet. Files are written into `shards.tmp/` and
the folder is renamed to `shards/` when all are written and checked (a MindRecord file itself can
never be renamed)."""
from __future__ import annotations

import contextlib
import os
import shutil
import time
from functools import partial
from pathlib import Path
from typing import Optional

import numpy as np
import pyarrow as pa
from dask import delayed

from corpusmill.stages import manifest, megatron, pack, shard
from corpusmill.stages.base import write_json_atomic, write_table_atomic, write_text_atomic

from .. import __version__, isolated
from ..config import MAX_FILES_PER_RANK, Config, ShardConfig
from ..progress import utc_now
from ..rundir import SHARDS_STAGING, VALIDATION_SHARDS
from ..step import PipelineError, Step, StepContext, StepResult
from .tokenize import VALIDATION, select_documents


SAMPLE_GROUPS = "sample_groups.parquet"  # each sample's (source, language) group, beside the MindRecord files


def _nested(groups: list[dict]) -> dict:
    """The manifest's group list as {source: {language: {tokens, samples}}} (the ledger's shape)."""
    out: dict = {}
    for g in groups:
        out.setdefault(g["source"], {})[g["language"]] = {"tokens": g["tokens"], "samples": g["samples"]}
    return out


def _add_set_stats(stats: dict, plan: shard.ShardPlan, doc: dict, files: list[dict], mix: Optional[dict]) -> None:
    """What a published set of shards (training or validation) adds to its step stats."""
    stats.update(samples=plan.used, samples_per_rank=plan.per_rank, dropped_samples=plan.dropped,
                 repeated_samples=plan.repeated, tokens=doc["total_tokens"], bytes=sum(x["bytes"] for x in files))
    if mix:
        stats["by_group"] = _nested(mix["groups"])


MEGATRON_DIR = "megatron"  # the .bin/.idx pairs' folder inside shards/
MEGATRON_YAML = "mindformers_megatron_train_dataset.yaml"
_NO_SAMPLES = shard.ShardPlan(0, 1, 1, 0, 0, 0, [0])  # shard.format megatron: no MindRecord sample


def _add_megatron_stats(stats: dict, pairs: Optional[list[dict]], only: bool) -> None:
    """What a set's Megatron pairs add to its stats (`only`: no MindRecord beside them, so its tokens)."""
    if pairs is None:
        return
    stats.update(megatron_pairs=len(pairs), megatron_documents=sum(p["documents"] for p in pairs),
                 megatron_tokens=sum(p["tokens"] for p in pairs), megatron_dtype=pairs[0]["dtype"],
                 megatron_bytes=sum(p["bin_bytes"] + p["idx_bytes"] for p in pairs))
    stats["bytes"] += stats["megatron_bytes"]
    if only:
        stats["tokens"] = stats["megatron_tokens"]


def _eod_args(ctx: StepContext, sc: ShardConfig) -> Optional[tuple[int, int]]:
    """(eos id, pad length) for the actual_seq_len column (shard.eod_metadata), or None; refused
    when documents carry no EOS (tokenizer.add_eos false): there would be no boundary to record."""
    if not sc.eod_metadata:
        return None
    if not ctx.cfg.tokenizer.add_eos:
        raise PipelineError("shard.eod_metadata needs tokenizer.add_eos: true (document ends are found by their EOS)")
    return ctx.output("tokenize", "tokenizer").eos_id, sc.eod_pad_length


def add_eod_metadata(doc: dict, eos_id: int, pad_length: int) -> None:
    """The manifest's record of the actual_seq_len column: its shape, and how it was computed."""
    doc["columns"][shard.ACTUAL_SEQ_LEN] = {
        "type": "int32", "shape": [pad_length],
        "note": "cumulative end of each document among the first seq_length ids (the position after each EOS, an EOS "
                "in the last position not counted), padded with seq_length: mindformers' compressed EOD mask"}
    doc["eod_metadata"] = {"column": shard.ACTUAL_SEQ_LEN, "eod_pad_length": pad_length, "eos_id": eos_id}


class ShardStep(Step):
    name = "shard"
    uses = ("tokenize", "filter")  # the tokenizer (its ids, the model file) and, for Megatron pairs, the parts and buckets
    config_sections = ("shard",)
    # hashed upstream (pack, tokenize, filter, read) or, for Megatron pairs without a pack step, by hash_extra
    config_reads = ("pack", "split", "mix", "tokenizer", "filter", "input")
    counters = ("samples", "files", "samples_per_rank", "dropped_samples", "bytes", "tokens")

    def hash_extra(self, cfg: Config, previous: Optional[str]) -> object:
        """Megatron pairs choose their documents from the tokenized parts by pack.seed's order, the
        validation split and the mixture; with shard.format megatron no pack step puts those into the
        chain, so this link does."""
        if cfg.shard.format != "megatron":
            return previous
        extra: dict = {"pack_seed": cfg.pack.seed}
        if cfg.split.validation > 0:
            extra["split"] = cfg.split.model_dump(mode="json")
        if cfg.mix.sources:
            extra["mix"] = cfg.mix.model_dump(mode="json")
        if cfg.pack.rehydrate.enabled:
            extra["rehydrate"] = cfg.pack.rehydrate.model_dump(mode="json")
        return [previous, extra]

    def summary(self, s: dict) -> str:
        mega = (f"; {s['megatron_documents']} documents, {s['megatron_tokens']} tokens in {s['megatron_pairs']} Megatron "
                f".bin/.idx pair(s)") if "megatron_pairs" in s else ""
        return (f"{s['samples']} samples in {s['files']} MindRecord files ({s['samples_per_rank']} per rank, "
                f"{s['dropped_samples']} dropped){mega}, {s['bytes'] / 1e6:.1f} MB")

    def run(self, ctx: StepContext, folder: Path) -> StepResult:
        try:
            return self._run(ctx, folder)
        finally:  # the MindRecord writers' helper processes: a call still running is killed, idle ones are
            # stopped a minute later unless the next run on this cluster takes them (isolated.release_helpers)
            with contextlib.suppress(Exception):  # best effort: a helper also ends with its worker
                ctx.on_every_worker(isolated.release_helpers)

    def _run(self, ctx: StepContext, folder: Path) -> StepResult:
        sc = ctx.cfg.shard
        validation = ctx.rundir.file(VALIDATION_SHARDS)
        if validation.exists():  # never left from an earlier run: it would be trained against as this run's
            shutil.rmtree(validation)
        staging = ctx.rundir.file(SHARDS_STAGING)
        if staging.exists():
            shutil.rmtree(staging)
        staging.mkdir()
        try:
            mix, chosen = None, None
            if sc.format == "megatron":
                stats, files, plan, labels = {"windows_in": 0, "files": 0, "layout": sc.layout}, [], _NO_SAMPLES, False
            else:
                parts = ctx.parts(self.reads)
                stats, files, plan, labels, found = self._write_mindrecord(ctx, parts, staging, sc, "shard")
                mix = self._composition(ctx, found, plan, staging)
            pairs = None
            if sc.format != "mindrecord":  # the documents the pack step packs (split and mixture applied), whole
                chosen = select_documents(ctx, ctx.parts("tokenize"), "shard: megatron")
                pairs = self._write_megatron(ctx, staging, chosen.order, chosen.pairs, sc.ranks, "megatron")
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)  # half-written files are never resumed
            raise
        doc = self._publish(ctx, folder, staging, files, plan, labels, sc, pairs, mix,
                            mixed=chosen is not None and (chosen.mixed is not None or chosen.rehydrated is not None))
        _add_set_stats(stats, plan, doc, files, mix)
        _add_megatron_stats(stats, pairs, sc.format == "megatron")
        if sc.format == "megatron" and chosen is not None:  # no pack step: the ledger reads the split and mixture here
            if chosen.mixed is not None:
                stats["mix"] = chosen.mixed
            if chosen.rehydrated is not None:
                stats["rehydrate"] = chosen.rehydrated
            if chosen.held_out is not None:
                stats["held_out"] = {"docs_in": len(chosen.held_out.length), "tokens_in": int(chosen.held_out.length.sum()),
                                     "windows": 0}
        held_out = ctx.folder(self.reads) / VALIDATION
        val_parts = sorted(str(p) for p in held_out.glob("part-*.arrow")) if held_out.is_dir() else []
        val_docs = chosen.held_out if chosen is not None and chosen.held_out is not None and len(chosen.held_out.length) \
            else None
        if val_parts or val_docs is not None:
            # one rank, one file unless shard.max_samples_per_file needs more (one Megatron pair, or one per
            # source): any rank may evaluate on all of it
            vc = sc.model_copy(update={"ranks": 1, "files_per_rank": 1, "layout": "per_rank", "remainder": "drop"})
            stats["validation"] = self._write_validation(ctx, val_parts, validation, vc, val_docs,
                                                         chosen.pairs if chosen is not None else [])
        elif ctx.cfg.split.validation > 0:
            ctx.log("  shard: the validation split holds no " + ("document" if sc.format == "megatron" else "complete window")
                    + ": no validation shards written")
        return StepResult(stats)

    def _write_validation(self, ctx: StepContext, parts: list[str], folder: Path, sc: ShardConfig,
                          documents: Optional[pack.DocumentOrder] = None, names: Optional[list] = None) -> dict:
        """The held-out set in `folder`, with its own manifest, in the training set's formats: its
        packed windows as MindRecord (`parts`, when the pack step wrote any) and its whole documents
        as Megatron pairs (`documents`: one pair, or one per source)."""
        staging = ctx.rundir.file(VALIDATION_SHARDS + ".tmp")
        if staging.exists():
            shutil.rmtree(staging)
        staging.mkdir()
        try:
            mix, pairs = None, None
            if parts:
                stats, files, plan, labels, found = self._write_mindrecord(ctx, parts, staging, sc, "shard validation")
                mix = self._composition(ctx, found, plan, staging)
            else:
                stats, files, plan, labels = {"windows_in": 0, "files": 0, "layout": sc.layout}, [], _NO_SAMPLES, False
            if documents is not None:
                pairs = self._write_megatron(ctx, staging, documents, names or [], 1, "megatron-validation")
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        doc = self._publish(ctx, folder, staging, files, plan, labels, sc, pairs, mix)
        _add_set_stats(stats, plan, doc, files, mix)
        _add_megatron_stats(stats, pairs, not files)
        return stats

    def _write_mindrecord(self, ctx: StepContext, parts: list[str], staging: Path, sc: ShardConfig,
                          label: str) -> tuple[dict, list[dict], shard.ShardPlan, bool, list]:
        """The packed windows of `parts` shuffled into per-rank (or global) MindRecord files in `staging`;
        also each file's (sample groups, ids per group), or None, for `_composition`."""
        window = ctx.cfg.pack.seq_length + 1
        labels = ctx.cfg.pack.mode != "concat"  # windows that can hold padding carry masked labels
        counts = [shard.count_windows(p) for p in parts]
        total = int(sum(counts))
        try:
            plan = shard.plan_shards(total, sc.ranks, sc.files_per_rank, sc.remainder, sc.max_samples_per_file,
                                     MAX_FILES_PER_RANK)
        except shard.ShardError as e:
            raise PipelineError(str(e)) from None
        if plan.files_per_rank != sc.files_per_rank:
            ctx.log(f"  {label}: {plan.files_per_rank} files per rank, not shard.files_per_rank {sc.files_per_rank}: "
                    f"{sc.files_per_rank} would hold {-(-plan.per_rank // sc.files_per_rank):,} samples each, above "
                    f"shard.max_samples_per_file {sc.max_samples_per_file:,}")
        names = [shard.file_name(sc.layout, *plan.file_of(i), plan.files_per_rank, sc.ranks) for i in range(plan.files)]
        # each file is written in a helper process of its worker (pipeline.isolated): MindSpore's
        # libraries and heap never stay in the worker, and its crash is the task's error, not a lost worker
        eod = _eod_args(ctx, sc)
        tasks = [delayed(isolated.call_in_helper)(shard.gather_and_write, parts, counts, sc.seed, plan.file_bounds[i],
                                                  plan.file_bounds[i + 1], plan.used, str(staging / name), window,
                                                  sc.write_batch, labels, sc.verify, eod,
                                                  dask_key_name=f"{label.replace(' ', '-')}-write-{i}")
                 for i, name in enumerate(names)]
        balance = (f"{plan.dropped} dropped" if sc.remainder == "drop" else f"{plan.repeated} repeated") + " for equal ranks"
        ctx.log(f"  {label}: {total} samples -> {sc.ranks} ranks x {plan.per_rank} samples ({balance}), "
                f"{plan.files} MindRecord files, layout {sc.layout}")
        setup_s = self._warm_up_writers(ctx)
        started = time.perf_counter()
        try:
            written = ctx.run(tasks, f"{label}: shuffle + write + {sc.verify} check")
        except shard.ShardError as e:
            raise PipelineError(f"{label}: {e}") from None
        write_s = time.perf_counter() - started
        task_seconds = sum(w.pop("task_seconds") for w in written)
        found = [(w.pop("sample_group"), w.pop("group_tokens")) if "sample_group" in w else None for w in written]
        files = [{"path": name, "rank": plan.file_of(i)[0] if sc.layout == "per_rank" else None, **w}
                 for i, (name, w) in enumerate(zip(names, written))]
        self._check_balance(files, plan, sc)
        return {
            "windows_in": total,
            "files": plan.files,
            "layout": sc.layout,
            "writer_setup_s": round(setup_s, 3),
            "task_seconds": task_seconds,
            "payload_bytes_per_sample": window * 4 * (2 if labels else 1),
            "write_s": round(write_s, 3),
        }, files, plan, labels, found

    def _composition(self, ctx: StepContext, found: list, plan: shard.ShardPlan, staging: Path) -> Optional[dict]:
        """Tokens and samples per source and language in the shards (a sample counts for the group
        holding most of its ids), and `sample_groups.parquet`: each sample's group, by file and row.
        The write tasks counted them per file (`stages.shard.file_groups`); here they are only added
        up, so the driver never reads the corpus's windows. None when the packed windows carry no groups."""
        names = ctx.stats(self.reads).get("group_names")
        if not names or not found or any(f is None for f in found):
            return None
        sample_group = np.concatenate([f[0] for f in found]).astype(np.int64)
        n_codes = max(len(names), int(sample_group.max(initial=-1)) + 1, *(max(f[1], default=-1) + 1 for f in found))
        tokens = np.zeros(n_codes, np.int64)
        for _, by_code in found:
            for c, n in by_code.items():
                tokens[c] += n
        samples = np.bincount(sample_group[sample_group >= 0], minlength=n_codes).astype(np.int64)
        found = {"tokens": tokens, "samples": samples}
        bounds = np.asarray(plan.file_bounds, np.int64)
        pos = np.arange(plan.used, dtype=np.int64)
        file_of = np.searchsorted(bounds, pos, side="right") - 1
        write_table_atomic(pa.table({"file": pa.array(file_of.astype(np.int32)),
                                     "row": pa.array(pos - bounds[file_of]),
                                     "group": pa.array(sample_group.astype(np.int32))}), staging / SAMPLE_GROUPS)
        groups = [{"group": c, "source": src, "language": lang,
                   "tokens": int(found["tokens"][c]) if c < len(found["tokens"]) else 0,
                   "samples": int(found["samples"][c]) if c < len(found["samples"]) else 0}
                  for c, (src, lang) in enumerate(names)]
        return {"groups": groups, "samples_file": SAMPLE_GROUPS,
                "note": "a sample counts for the (source, language) holding most of its ids; "
                        f"{SAMPLE_GROUPS} gives each sample's group by file (index into files) and row"}

    def _write_megatron(self, ctx: StepContext, staging: Path, order: pack.DocumentOrder, names: list, ranks: int,
                        label: str) -> list[dict]:
        """Megatron `.bin/.idx` pairs under `staging/megatron/`: the ordered documents (`select_documents`),
        whole, cut into `ranks` pairs of about equal tokens (megatron_split rank) or into one pair per
        source in that order (megatron_split source; `names` are the codes' (source, language) pairs)."""
        sc, tok = ctx.cfg.shard, ctx.output("tokenize", "tokenizer")
        parts = ctx.parts("tokenize")
        (staging / MEGATRON_DIR).mkdir()
        if sc.megatron_split == "source":
            code = order.code if order.code is not None else np.full(len(order.length), -1, np.int32)
            groups = megatron.source_groups([src for src, _ in names], code)
            plans = [(f"{MEGATRON_DIR}/{megatron.source_prefix(src)}", {"rank": None, "source": src}, pos)
                     for src, pos in groups]
            if len({p for p, _, _ in plans}) != len(plans):  # 40 bits of sha256 apart: never in practice, refused if so
                raise PipelineError("megatron: two sources give the same file prefix; rename one of them")
            what = f"{len(plans)} Megatron .bin/.idx pair(s), one per source"
        else:
            plans = [(f"{MEGATRON_DIR}/corpus-r{r:04d}", {"rank": r}, np.arange(a, b))
                     for r, (a, b) in enumerate(megatron.rank_bounds(order.length, ranks))]
            what = f"{ranks} Megatron .bin/.idx pair(s)"
        if sc.eod_metadata:
            most = megatron.most_document_ends(order.length, ctx.cfg.pack.seq_length)
            if most > sc.eod_pad_length:
                ctx.log(f"  shard: warning: a sample of {ctx.cfg.pack.seq_length} ids may hold up to {most} document ends "
                        f"(the shortest documents together), more than shard.eod_pad_length {sc.eod_pad_length}: "
                        "mindformers' GPTDataset stops on a sample that holds more")
        dtype = megatron.best_dtype(tok.vocab_size)
        ctx.log(f"  shard: {len(order.length)} documents -> {what} ({dtype.name} ids, whole documents ending with EOS)")
        tasks = [delayed(megatron.write_pair)(parts, megatron.PairPlan(order.part[pos], order.row[pos], order.length[pos]),
                                              str(staging / prefix), tok.vocab_size, tok.eos_id,
                                              dask_key_name=f"{label}-write-{i}")
                 for i, (prefix, _, pos) in enumerate(plans)]
        try:
            written = ctx.run(tasks, f"shard: {label} .bin/.idx")
        except ValueError as e:
            raise PipelineError(f"megatron: {e}") from None
        return [{"prefix": prefix, **keys, **w} for (prefix, keys, _), w in zip(plans, written)]

    def _publish(self, ctx: StepContext, folder: Path, staging: Path, files: list[dict], plan: shard.ShardPlan,
                 labels: bool, sc: ShardConfig, pairs: Optional[list[dict]] = None, mix: Optional[dict] = None,
                 mixed: bool = False) -> dict:
        """The tokenizer, the manifest and the mindformers snippet beside the written files, then
        `shards.tmp/` renamed to `shards/` (the folder, never a MindRecord file). Returns the manifest."""
        window = ctx.cfg.pack.seq_length + 1
        tok = ctx.output("tokenize", "tokenizer")
        tokenizer_file = Path(tok.path).name  # tokenizer.model, tokenizer.json, tokenizer.tekken.json, tokenizer.tiktoken
        shutil.copyfile(tok.path, staging / tokenizer_file)
        beside = Path(tok.path).with_name("tokenizer_config.json")
        if tok.kind == "hf" and beside.is_file():
            shutil.copyfile(beside, staging / beside.name)
        doc = manifest.build(
            version=__version__, config_hash=ctx.link(self.name), created_utc=utc_now(), seq_length=ctx.cfg.pack.seq_length,
            tokenizer=tok.__dict__, add_bos=ctx.cfg.tokenizer.add_bos, add_eos=ctx.cfg.tokenizer.add_eos, labels=labels,
            pack_mode=ctx.cfg.pack.mode, layout=sc.layout, ranks=sc.ranks,
            files_per_rank=plan.files_per_rank if files else sc.files_per_rank,
            samples_per_rank=plan.per_rank, total_samples=plan.used, dropped=plan.dropped, repeated=plan.repeated,
            remainder=sc.remainder, shuffle_seed=sc.seed, files=files, tokenizer_file=tokenizer_file,
            megatron=None if pairs is None else {"dtype": pairs[0]["dtype"], "split": sc.megatron_split, "pairs": pairs},
            formats=(["mindrecord"] if files else []) + ["megatron"] if pairs is not None else None, composition=mix)
        pad_length = sc.eod_pad_length if sc.eod_metadata else None
        if files and pad_length is not None:
            add_eod_metadata(doc, tok.eos_id, pad_length)
        if files:
            write_text_atomic(staging / "mindformers_train_dataset.yaml", shard.mindformers_snippet(
                str(folder.resolve()), sc.layout, window, ["input_ids", "labels"] if labels else ["input_ids"],
                tok.eos_id if ctx.cfg.pack.mode != "pad" and ctx.cfg.tokenizer.add_eos else None,
                eod_pad_length=pad_length))
        if pairs is not None:
            write_text_atomic(staging / MEGATRON_YAML, megatron.mindformers_snippet(
                str(folder.resolve()), [p for p in pairs if p["tokens"]], ctx.cfg.pack.seq_length, tok.eos_id, tok.pad_id,
                ctx.cfg.pack.seed, mixed=mixed, eod_pad_length=pad_length))
        write_json_atomic(staging / manifest.MANIFEST_NAME, doc)
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(staging, folder)
        return doc

    @staticmethod
    def _warm_up_writers(ctx: StepContext) -> float:
        """Start a writer helper per worker thread, each importing the MindRecord writer once, before
        the write tasks; the seconds (the slowest worker) are reported apart from the writing."""
        started = time.perf_counter()
        ctx.on_every_worker(partial(isolated.warm_up_helpers, shard.warm_up_writer))
        return time.perf_counter() - started

    @staticmethod
    def _check_balance(files: list[dict], plan: shard.ShardPlan, sc) -> None:
        written_total = sum(x["samples"] for x in files)
        per_rank = {r: sum(x["samples"] for x in files if x["rank"] == r) for r in range(sc.ranks)}
        if written_total != plan.used or (sc.layout == "per_rank" and set(per_rank.values()) != {plan.per_rank}):
            raise PipelineError(f"shards hold {written_total} samples ({per_rank} per rank), planned "
                                f"{sc.ranks} x {plan.per_rank}")
