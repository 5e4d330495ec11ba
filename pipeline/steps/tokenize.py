"""tokenize and pack: documents -> token ids (a given tokenizer of any kind -- SentencePiece, Hugging
Face tokenizer.json, tiktoken/tekken -- or one trained on a sample of this corpus, checked before
use) -> fixed-length windows."""
from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
from dask import delayed

from corpusmill.stages import mixing, pack, tokenize
from corpusmill.stages import tokenizer_kinds as kinds
from corpusmill.stages.base import merge_stats, read_table, write_table_atomic

from ..config import Config
from ..executor import sample_part
from ..step import PipelineError, Step, StepContext, StepResult

TOKENIZE_SLICE_MB = 2  # tokenizing is the slowest step: slices this size keep every worker busy to the end
CHECK_SAMPLE_DOCS = 200  # documents the tokenizer checks (unknown-token rate, round trip) look at
MODEL_FILE = "tokenizer.model"  # the SentencePiece file's name in the step folder and beside the shards
VALIDATION = "validation"  # the pack step's subfolder of held-out windows (split.validation)
HF_CONFIG_FILE = "tokenizer_config.json"


def model_file_name(kind: str, source: Optional[str] = None) -> str:
    """The tokenizer's file name in the run: tokenizer.model, tokenizer.json, tokenizer.tekken.json or
    tokenizer.tiktoken (a tekken .json and a plain ranks file load differently)."""
    if kind == "hf":
        return "tokenizer.json"
    if kind == "tiktoken":
        return "tokenizer.tekken.json" if source and kinds._is_json(source) else "tokenizer.tiktoken"
    return MODEL_FILE


def tokenizer_kind(tc: Any) -> str:
    """The configured kind, or the given file's detected kind, or sentencepiece (trained)."""
    if tc.kind:
        return tc.kind
    if tc.model:
        try:
            return kinds.detect_kind(tc.model)
        except (kinds.TokenizerFormatError, OSError) as e:
            raise PipelineError(f"tokenizer.model: {e}") from None
    return "sentencepiece"


def given_tokens(tc: Any) -> dict:
    """The special tokens the config names by string."""
    return {"bos": tc.bos_token, "eos": tc.eos_token, "pad": tc.pad_token}


@dataclass
class TokenizerInfo(tokenize.TokenizerReport):
    """The checked tokenizer as later steps see it (pack: pad_id; shard: the model file and its ids)."""

    origin: str = ""  # "given (PATH)" or "trained on this corpus"


def sample_plan(parts: list[str], tc: Any, docs: int) -> list[tuple]:
    """`executor.sample_part` arguments per part: for training (no model given), a seeded share of
    every part's documents, `tc.train.sample_docs` in all and at most `tc.train.max_sample_mb` of
    text; for the checks only (a model given), a few hundred documents from 4 spread-out parts.
    The pipeline and `corpusmill tokenizer train` both sample this way."""
    if tc.model:
        sampled = [parts[i] for i in sorted({round(j * (len(parts) - 1) / 3) for j in range(4)})]
        rate, first_group, max_docs = 1.0, True, -(-2 * CHECK_SAMPLE_DOCS // len(sampled))
    else:
        sampled, rate, first_group, max_docs = parts, min(1.0, tc.train.sample_docs / max(1, docs)), False, None
    max_chars = (tc.train.max_sample_mb << 20) // max(1, len(sampled))
    return [(p, tc.train.seed, rate, max_chars, first_group, max_docs) for p in sampled]


def check_sample(sample: list[str], seed: int) -> list[str]:
    """A seeded choice of CHECK_SAMPLE_DOCS texts of `sample`, in sample order, for the checks."""
    rng = np.random.default_rng(seed)
    return [sample[i] for i in sorted(rng.choice(len(sample), size=min(CHECK_SAMPLE_DOCS, len(sample)), replace=False))]


class TokenizeStep(Step):
    name = "tokenize"
    config_sections = ("tokenizer",)
    config_reads = ("train",)  # the model's vocab_size: hash_extra
    counters = ("docs_in", "tokens")
    outputs = {"tokenizer": TokenizerInfo}

    def hash_extra(self, cfg: Config, previous: Optional[str]) -> Any:
        # the checks compare the vocabulary with the model's; "text-sliced": the parts are cut at equal text
        # bytes (StepContext.map_parts balance_text), so a try with the older equal-row slices never resumes into it
        return [previous, cfg.train.model.vocab_size, "text-sliced"]

    def summary(self, s: dict) -> str:
        return f"{s['docs_in']} docs -> {s['tokens']} tokens"

    def run(self, ctx: StepContext, folder: Path) -> StepResult:
        tc = ctx.cfg.tokenizer
        started = time.perf_counter()
        kept_docs = ctx.stats(self.reads)["docs_out"]
        if kept_docs == 0:
            raise PipelineError("no documents are left to tokenize: every input was filtered, removed or quarantined")
        if tc.model and not os.path.exists(tc.model):
            raise PipelineError(f"tokenizer.model {tc.model} does not exist")
        kind = tokenizer_kind(tc)
        sample = self._sample(ctx, kept_docs)
        try:
            model_path = folder / model_file_name(kind, kinds.resolve_file(tc.model) if tc.model else None)
        except (kinds.TokenizerFormatError, OSError) as e:
            raise PipelineError(f"tokenizer.model: {e}") from None
        origin = self._model(ctx, folder, model_path, sample, kind)
        info = self._check(ctx, model_path, sample, origin, kind)
        prepared = time.perf_counter()
        stats, _ = ctx.map_parts(self.reads, folder, tokenize.tokenize_batch,
                                 {"model_path": str(model_path), "add_bos": tc.add_bos, "add_eos": tc.add_eos,
                                  "batch_docs": tc.batch_docs, "spec": info.spec(), "bos_id": info.bos_id,
                                  "eos_id": info.eos_id, "fast_encode": tc.fast_encode,
                                  "verify_sample": tc.verify_sample}, reader="arrow", split_mb=TOKENIZE_SLICE_MB,
                                 suffix=".arrow", columns=["uid", "text", "source", "language"],  # uncompressed Arrow IPC: 3x faster to write than zstd Parquet
                                 fingerprint=info.sha256,  # a resumed try keeps the parts of this tokenizer file only
                                 balance_text=True)  # equal text per slice: equal rows left one worker the long tail
        self._report_encoder(ctx, stats)
        stats["prepare_s"] = round(prepared - started, 3)  # sample, train or copy the model, checks
        stats["encode_s"] = round(time.perf_counter() - prepared, 3)
        return StepResult(stats, {"tokenizer": info})

    @staticmethod
    def _report_encoder(ctx: StepContext, stats: dict) -> None:
        """Which encoder ran (the exact piece cache or the plain one, and why), its cache hit rate and
        the documents checked against the plain encoder, in the log and the stats."""
        cache = stats.get("fast_cache")
        if cache:
            stats["cache_hit_rate"] = round(cache["hits"] / max(1, cache["lookups"]), 4)
            ctx.log(f"  tokenize: exact piece-cache encoder: {cache['lookups']:,} pieces, {stats['cache_hit_rate']:.1%} "
                    f"from the cache, {cache['pieces_encoded']:,} encoded by the tokenizer, {cache['long_pieces']:,} "
                    "long ones uncached; " + (f"{cache['plain_docs']:,} documents holding an added token's text encoded "
                                              "whole; " if cache.get("plain_docs") else "") + (f"{stats['verified_docs']:,} documents re-encoded by the plain encoder, "
                                              "all identical" if stats.get("verified_docs") else
                                              "no document re-encoded (tokenizer.verify_sample: 0)"))
            parts = stats.get("encoder_parts") or {}
            if parts.get("plain"):
                ctx.log(f"  tokenize: {parts['plain']} of {sum(parts.values())} parts encoded by the plain encoder, "
                        "which cost less CPU per character here (its pieces rarely repeat); the same ids either way")
        elif stats.get("fast_declined"):
            ctx.log(f"  tokenize: plain encoder (the fast path declined this model: {stats['fast_declined']})")

    def _sample(self, ctx: StepContext, kept_docs: int) -> list[str]:
        tc = ctx.cfg.tokenizer
        plan = sample_plan(ctx.parts(self.reads), tc, kept_docs)
        samples = ctx.run([delayed(sample_part)(*args) for args in plan], "tokenize: sample")
        return [t for chunk in samples for t in chunk]

    def _model(self, ctx: StepContext, folder: Path, model_path: Path, sample: list[str], kind: str) -> str:
        """The model file in the step's folder: the given one copied (a Hugging Face folder: its
        tokenizer.json and tokenizer_config.json), or one trained on `sample`."""
        tc = ctx.cfg.tokenizer
        if tc.model:
            source = kinds.resolve_file(tc.model)
            if not os.path.isfile(source):
                raise PipelineError(f"tokenizer.model {tc.model} does not exist")
            shutil.copyfile(source, model_path)
            beside = Path(source).with_name(HF_CONFIG_FILE)
            if kind == "hf" and beside.is_file():
                shutil.copyfile(beside, folder / HF_CONFIG_FILE)
            return f"given ({tc.model})"
        sample_file = folder / "tokenizer_sample.txt"
        lines = tokenize.write_training_sample(sample, sample_file)
        what = "byte-level BPE tokenizer.json" if kind == "hf" else f"{tc.train.model_type} tokenizer"
        ctx.log(f"  tokenize: training a {what} (vocab {tc.train.vocab_size}) "
                f"on {len(sample)} sampled documents ({lines} lines)")
        try:
            if kind == "hf":
                tokenize.train_hf_tokenizer(sample_file, model_path, vocab_size=tc.train.vocab_size, seed=tc.train.seed,
                                            user_symbols=tuple(tc.train.user_symbols))
            else:
                tokenize.train_tokenizer(
                    sample_file, folder / "tokenizer", vocab_size=tc.train.vocab_size, model_type=tc.train.model_type,
                    character_coverage=tc.train.character_coverage, byte_fallback=tc.train.byte_fallback,
                    seed=tc.train.seed, num_threads=os.cpu_count() or 1, user_symbols=tuple(tc.train.user_symbols),
                )
        except tokenize.TokenizerError as e:
            raise PipelineError(str(e)) from None
        sample_file.unlink()
        return "trained on this corpus"

    def _check(self, ctx: StepContext, model_path: Path, sample: list[str], origin: str, kind: str) -> TokenizerInfo:
        """Special ids, pad choice, vocabulary vs the model, unknown-token rate and round trip on a
        seeded subsample; an error stops the run before any document is encoded."""
        tc = ctx.cfg.tokenizer
        try:
            report = tokenize.check_tokenizer(
                str(model_path), add_bos=tc.add_bos, add_eos=tc.add_eos, pad_id=tc.pad_id,
                model_vocab_size=ctx.cfg.train.model.vocab_size, sample_texts=check_sample(sample, tc.train.seed),
                max_unk_rate=tc.max_unk_rate, spec=tokenize.spec_of(kind, tc.tiktoken_pattern, tc.tiktoken_special_tokens),
                tokens=given_tokens(tc),
            )
        except tokenize.TokenizerError as e:
            raise PipelineError(str(e)) from None
        for w in report.warnings:
            ctx.log(f"  tokenize: warning: {w}")
        return TokenizerInfo(**{**report.__dict__, "path": str(model_path)}, origin=origin)


class PackStep(Step):
    """Windows of `pack.seq_length + 1` ids. By default the documents of the whole corpus are packed
    in a seeded order (a hash of each uid, `stages.pack.order_keys`), so a window mixes sources: the
    index pass reads every tokenized part's uids and lengths, the driver sorts them and cuts the
    ordered stream into groups of about PACK_GROUP_TOKENS ids, and each task gathers its group's ids
    out of the memory-mapped parts. No process holds more than a group. With
    `pack.shuffle_documents: false` each part is packed in uid order (corpus order)."""

    name = "pack"
    uses = ("filter",)  # the quality buckets a mixture weighs (the filter's parts)
    config_sections = ("pack",)
    # split and mix: hash_extra when used; filter (bucket names) and input (paths in the plan) hashed upstream
    config_reads = ("split", "mix", "filter", "input")

    def hash_extra(self, cfg: Config, previous: Optional[str]) -> Any:
        """The validation split and the mixture join the link only when used, so a run without them
        resumes as before."""
        extra = {}
        if cfg.split.validation > 0:
            extra["split"] = cfg.split.model_dump(mode="json")
        if cfg.mix.sources:
            extra["mix"] = cfg.mix.model_dump(mode="json")
        return [previous, extra] if extra else previous
    counters = ("mode", "tokens_in", "windows", "docs_split", "docs_truncated", "tokens_dropped", "pad_tokens",
                "padding_share")

    def summary(self, s: dict) -> str:
        order = f", documents in a seeded order (seed {s['order_seed']})" if "order_seed" in s else ""
        return (f"{s['mode']}{order}: {s['tokens_in']} tokens -> {s['windows']} windows; {s['docs_split']} docs split "
                f"across windows, {s['docs_truncated']} truncated; {s['tokens_dropped']} tokens dropped, {s['pad_tokens']} "
                f"pad tokens ({100 * s['padding_share']:.1f}% padding)")

    def run(self, ctx: StepContext, folder: Path) -> StepResult:
        pc, window = ctx.cfg.pack, ctx.cfg.pack.seq_length + 1
        pad_id = ctx.output("tokenize", "tokenizer").pad_id
        if pc.shuffle_documents:
            stats = self._pack_shuffled(ctx, folder, window, pad_id)
        else:
            stats = self._pack_in_corpus_order(ctx, folder, window, pad_id)
        stats["mode"] = pc.mode
        stats.setdefault("docs_truncated", 0)
        stats["tokens_kept"] = stats["tokens_in"] - stats["tokens_dropped"]
        stats["padding_share"] = stats["pad_tokens"] / max(1, stats["windows"] * window)
        return StepResult(stats)

    def _pack_in_corpus_order(self, ctx: StepContext, folder: Path, window: int, pad_id: int) -> dict:
        """Each part's documents in uid order; concat joins the parts' tails into the last windows."""
        pc = ctx.cfg.pack
        stats, results = ctx.map_parts(self.reads, folder, pack.pack_batch,
                                       {"window": window, "mode": pc.mode, "pad_id": pad_id}, reader="arrow",
                                       suffix=".arrow")  # Arrow IPC: the shard step memory-maps it and picks rows
        if pc.mode == "concat":
            table, tail_stats = pack.pack_tails([r["extra"] for r in results], window, pc.remainder, pad_id)
            if table.num_rows:
                write_table_atomic(table, folder / "part-tail.arrow")
            stats["windows"] += tail_stats.pop("windows")
            stats["tokens_dropped"] = stats.get("tokens_dropped", 0) + tail_stats.pop("tokens_dropped")
            stats["pad_tokens"] = stats.get("pad_tokens", 0) + tail_stats.pop("pad_tokens")
            stats.update(tail_stats)
        return stats

    def _pack_shuffled(self, ctx: StepContext, folder: Path, window: int, pad_id: int) -> dict:
        """The corpus's documents in the seeded order, packed group by group (see the class). With
        `split.validation`, the held-out documents are packed apart into `validation/`."""
        parts = ctx.parts(self.reads)
        if ctx.cfg.pack.mode == "concat" and not ctx.cfg.mix.sources and not ctx.cfg.pack.rehydrate.enabled:
            return self._pack_ranges(ctx, folder, parts, window, pad_id)
        chosen = select_documents(ctx, parts, "pack")
        stats = self._pack_order(ctx, folder, parts, chosen.order, chosen.pairs, window, pad_id, "pack")
        if chosen.mixed is not None:
            stats["mix"] = chosen.mixed
        if chosen.rehydrated is not None:
            stats["rehydrate"] = chosen.rehydrated
        if chosen.held_out is not None:
            val_order = chosen.held_out
            val_folder = folder / VALIDATION
            val_folder.mkdir()
            stats["validation"] = self._pack_order(ctx, val_folder, parts, val_order, chosen.pairs, window, pad_id,
                                                   "pack validation") if len(val_order.length) else {"docs_in": 0}
            v = stats["validation"]
            ctx.log(f"  pack: validation split {ctx.cfg.split.validation:g} (seed {ctx.cfg.split.seed}): {v['docs_in']} "
                    "documents held out" + (f", {v['tokens_in']} tokens -> {v['windows']} windows" if v["docs_in"] else ""))
        return stats

    def _pack_ranges(self, ctx: StepContext, folder: Path, parts: list[str], window: int, pad_id: int) -> dict:
        """concat in the seeded order with no process holding the whole order (`stages.pack`,
        "range-partitioned"): the index pass writes each part's documents sorted by key and returns
        per-bucket totals; each pack task reads the buckets its range of the stream falls in. The
        same groups, windows and bytes as `_pack_order` over the whole order (which the mixture,
        pad and best_fit still use)."""
        pc, share = ctx.cfg.pack, ctx.cfg.split.validation
        order_dir = folder / ORDER_DIR
        order_dir.mkdir(exist_ok=True)
        tasks = [delayed(pack.order_index_part)(p, pc.seed, str(order_dir / f"{i:05d}"), share, ctx.cfg.split.seed,
                                                dask_key_name=f"pack-order-index-{i}") for i, p in enumerate(parts)]
        try:
            found = ctx.run(tasks, "pack: document order (range-partitioned)")
        except ValueError as e:
            raise PipelineError(f"pack: {e}") from None
        pairs = sorted({tuple(g) for x in found for g in (x["groups"] or [])})
        where = {g: i for i, g in enumerate(pairs)}
        remaps = [np.asarray([where[tuple(g)] for g in x["groups"]], np.int32) if x["groups"] is not None else None
                  for x in found]
        sets = {}
        for name in pack.ORDER_SETS:
            if found and name in found[0]["sets"]:
                sets[name] = ([x["sets"][name]["path"] for x in found],
                              sum(x["sets"][name]["docs"] for x in found), sum(x["sets"][name]["tokens"] for x in found))
        del found
        files, docs, tokens = sets.get("train", ([], np.zeros(1, np.int64), np.zeros(1, np.int64)))
        if not int(docs.sum()):
            raise PipelineError(f"pack: no document is left for training after holding out split.validation {share}")
        stats = self._pack_range_set(ctx, folder, parts, files, remaps, docs, tokens, pairs, window, pad_id, "pack")
        if "validation" in sets:
            files, docs, tokens = sets["validation"]
            val_folder = folder / VALIDATION
            val_folder.mkdir()
            stats["validation"] = self._pack_range_set(ctx, val_folder, parts, files, remaps, docs, tokens, pairs,
                                                       window, pad_id, "pack validation") if int(docs.sum()) else {"docs_in": 0}
            v = stats["validation"]
            ctx.log(f"  pack: validation split {share:g} (seed {ctx.cfg.split.seed}): {v['docs_in']} documents held out"
                    + (f", {v['tokens_in']} tokens -> {v['windows']} windows" if v["docs_in"] else ""))
        shutil.rmtree(order_dir, ignore_errors=True)  # the sorted index files served the tasks only
        return stats

    def _pack_range_set(self, ctx: StepContext, folder: Path, parts: list[str], files: list[str], remaps: list,
                        docs: np.ndarray, tokens: np.ndarray, pairs: list, window: int, pad_id: int, label: str) -> dict:
        """One set (training or validation) of `_pack_ranges`: its stats as `_pack_order`'s."""
        pc = ctx.cfg.pack
        plans = pack.plan_ranges(tokens, window, PACK_GROUP_TOKENS)
        n_docs, total = int(docs.sum()), int(tokens.sum())
        width = max(5, len(str(len(plans))))
        ctx.log(f"  {label}: {n_docs} documents of {len(parts)} parts in a seeded order (seed {pc.seed}, "
                f"range-partitioned in {pack.ORDER_BUCKETS} key buckets) -> {len(plans)} groups of about "
                f"{PACK_GROUP_TOKENS:,} ids")
        names = [f"part-{i:0{width}d}.arrow" for i in range(len(plans))]
        rel = [os.path.relpath(folder / name, ctx.folder(self.name)) for name in names]
        results = ctx.run_parts([(r.replace(os.sep, "__"), delayed(_timed)(pack.pack_range, parts, files, remaps, plan,
                                                                          window, pc.remainder, pad_id, str(folder / name),
                                                                          dask_key_name=f"{label.replace(' ', '-')}-group-{i}"),
                                  [r]) for i, (name, r, plan) in enumerate(zip(names, rel, plans))], f"{label}: gather + pack")
        stats = _merged_pack_stats(results)
        gathered = stats.pop("ids", 0)
        stats.update(docs_in=n_docs, tokens_in=total)
        if gathered != total:
            raise PipelineError(f"{label}: gathered {gathered} ids of {total} tokenized")
        stats.update(order_seed=pc.seed, groups=len(plans))
        return _finish_pack_stats(stats, pairs)

    def _pack_order(self, ctx: StepContext, folder: Path, parts: list[str], order: pack.DocumentOrder,
                    pairs: list, window: int, pad_id: int, label: str) -> dict:
        """Pack one ordered stream of documents into `folder` (the training set, or the validation set)."""
        pc = ctx.cfg.pack
        groups = pack.plan_groups(order, window, pc.mode, PACK_GROUP_TOKENS)
        width = max(5, len(str(len(groups))))
        ctx.log(f"  {label}: {len(order.length)} documents of {len(parts)} parts in a seeded order (seed {pc.seed}) -> "
                f"{len(groups)} groups of about {PACK_GROUP_TOKENS:,} ids")
        names = [f"part-{i:0{width}d}.arrow" for i in range(len(groups))]
        # a task's key and files are relative to the step's folder (the validation set packs into a subfolder)
        rel = [os.path.relpath(folder / name, ctx.folder(self.name)) for name in names]
        results = ctx.run_parts([(r.replace(os.sep, "__"), delayed(_timed)(pack.pack_group, parts, g, window, pc.mode,
                                                                          pc.remainder, pad_id, str(folder / name),
                                                                          dask_key_name=f"{label.replace(' ', '-')}-group-{i}"),
                                  [r]) for i, (name, r, g) in enumerate(zip(names, rel, groups))], f"{label}: gather + pack")
        stats = _merged_pack_stats(results)
        if pc.mode == "concat":
            gathered = stats.pop("ids", 0)
            stats.update(pack.concat_stats(order.length, window))
            if gathered != stats["tokens_in"]:
                raise PipelineError(f"{label}: gathered {gathered} ids of {stats['tokens_in']} tokenized")
        stats.update(docs_in=len(order.length), order_seed=pc.seed, groups=len(groups))
        return _finish_pack_stats(stats, pairs)


def _merged_pack_stats(results: list) -> dict:
    """The pack tasks' stats summed (both packers' tasks return the same keys)."""
    stats: dict = {"windows": 0, "tokens_dropped": 0, "pad_tokens": 0, "docs_split": 0, "docs_truncated": 0}
    for r in results:
        merge_stats(stats, r)
    return stats


def _finish_pack_stats(stats: dict, pairs: list) -> dict:
    """Tokens kept, and per (source, language): ids in the windows, and windows in which it holds the
    most ids (the tasks count them by the pair's index)."""
    stats["tokens_kept"] = stats["tokens_in"] - stats["tokens_dropped"]
    tokens, samples = stats.pop("group_tokens", {}), stats.pop("group_samples", {})
    if pairs:
        stats["by_group"] = {}
        for c, (source, language) in enumerate(pairs):
            stats["by_group"].setdefault(source, {})[language] = {"tokens": int(tokens.get(str(c), 0)),
                                                                 "samples": int(samples.get(str(c), 0))}
        stats["group_names"] = [list(p) for p in pairs]
    return stats


@dataclass
class Selection:
    """Which tokenized documents a set of shards holds, in the seeded pack order: the training
    documents (the mixture's copies included), the held-out validation documents, and the codes'
    (source, language) pairs. The shard step's Megatron writer and the pack step with a mixture, pad or
    best_fit choose through `select_documents`; plain concat packs by key ranges
    (`PackStep._pack_ranges`, `stages.pack.order_index_part`), which applies the same validation mask
    and the same (key, uid) order without holding it in one process, so MindRecord windows and Megatron
    pairs hold the same documents."""

    pairs: list
    order: pack.DocumentOrder
    held_out: Optional[pack.DocumentOrder]  # None: no split.validation
    mixed: Optional[dict]  # what mix.sources asked for and delivered (None: no mixture)
    rehydrated: Optional[dict] = None  # what pack.rehydrate added (None: not enabled)


def select_documents(ctx: StepContext, parts: list[str], label: str) -> Selection:
    """The index pass over the tokenized `parts` (uids, lengths, groups, text hashes; no ids), the
    validation split (`split.validation`) and the mixture (`mix.sources`) decided in the driver, and
    the documents' seeded order (`pack.seed`)."""
    share, seed = ctx.cfg.split.validation, ctx.cfg.pack.seed
    index = ctx.run([delayed(pack.document_index)(p, seed) for p in parts], f"{label}: document order")
    pairs, codes = pack.global_codes(index)
    held_out = None
    if share > 0:
        if any("doc_hash" not in x for x in index):
            raise PipelineError(f"{label}: split.validation needs the tokenized parts' doc_hash column (rerun tokenize)")
        masks = [mixing.validation_mask(x["doc_hash"], share, ctx.cfg.split.seed) for x in index]
        held_out = pack.document_order([pack.subset(x, m) for x, m in zip(index, masks)],
                                       [c[m] for c, m in zip(codes, masks)])
        index = [pack.subset(x, ~m) for x, m in zip(index, masks)]
        codes = [c[~m] for c, m in zip(codes, masks)]
    rehydrated = None
    if ctx.cfg.pack.rehydrate.enabled:  # before the mixture: its budgets are met from the upsampled pool
        index, codes, rehydrated = _rehydrate(ctx, index, codes, label)
    mixed = None
    if ctx.cfg.mix.sources:
        index, codes, mixed = _mix(ctx, index, codes, pairs, label)
    order = pack.document_order(index, codes)
    if not len(order.length):
        raise PipelineError(f"{label}: no document is left for training after holding out split.validation {share}")
    return Selection(pairs, order, held_out, mixed, rehydrated)


def _rehydrate(ctx: StepContext, index: list[dict], codes: list[np.ndarray],
               label: str) -> tuple[list[dict], list[np.ndarray], dict]:
    """`pack.rehydrate:` each training document's copies by the size of the duplicate cluster it kept
    (`mixing.cluster_sizes` over exact and near dedup's removed rows), and what that added."""
    files = ctx.keeper_rows()
    if files:
        rows = read_table(files, columns=["uid", "duplicate_of"])
        known = rows.column("duplicate_of").is_valid().to_numpy(zero_copy_only=False)
        removed = rows.column("uid").to_numpy(zero_copy_only=False)[known]
        target = rows.column("duplicate_of").to_numpy(zero_copy_only=False)[known].astype(np.int64)
        del rows
    else:
        removed = target = np.empty(0, np.int64)
    try:
        roots, sizes = mixing.cluster_sizes(removed, target)
    except ValueError as e:
        raise PipelineError(f"{label}: rehydrate: {e}") from None
    weights = [w.model_dump() for w in ctx.cfg.pack.rehydrate.weights]
    out_index, out_codes, all_tokens, all_sizes, all_copies = [], [], [], [], []
    for x, c in zip(index, codes):
        copies, size = mixing.rehydrate_copies(x["uid"], roots, sizes, weights)
        out_index.append(pack.with_copies(x, copies))
        out_codes.append(np.repeat(c, copies))
        all_tokens.append(x["n_tokens"])
        all_sizes.append(size)
        all_copies.append(copies)
    cat = lambda xs: np.concatenate(xs) if xs else np.empty(0, np.int64)  # noqa: E731
    summary = mixing.rehydrate_summary(cat(all_tokens), cat(all_sizes), cat(all_copies), weights)
    ctx.log(f"  {label}: rehydrate: {summary['documents_in_clusters']:,} of {summary['documents']:,} documents kept a "
            f"duplicate cluster (largest {summary['largest_cluster']:,}); {summary['repeated_copies']:,} repeated copies, "
            f"{summary['tokens_once']:,} -> {summary['tokens_packed']:,} tokens")
    return out_index, out_codes, summary


def _mix(ctx: StepContext, index: list[dict], codes: list[np.ndarray], pairs: list,
         label: str) -> tuple[list[dict], list[np.ndarray], dict]:
    """`mix:` applied to the training documents: each one's copies (0: left out, 2+: repeated), drawn
    in the driver from the index alone; returns the index with the copies, their codes, and what
    each rule asked for and got."""
    from corpusmill.stages import read
    from corpusmill.stages.classifier import bucket_shares

    from .filter import mix_buckets

    mc = ctx.cfg.mix
    if any("doc_hash" not in x for x in index):
        raise PipelineError(f"{label}: mix needs the tokenized parts' doc_hash column (rerun tokenize)")
    sizes = [len(x["uid"]) for x in index]
    cat = lambda k, dt: np.concatenate([x[k] for x in index]) if index else np.empty(0, dt)  # noqa: E731
    uids, tokens, hashes = cat("uid", np.int64), cat("n_tokens", np.int64), cat("doc_hash", np.uint64)
    all_codes = np.concatenate(codes) if codes else np.empty(0, np.int32)
    paths = [read.display_path(f) for f in read.expand_inputs(ctx.cfg.input.paths)]
    rules = [{"name": r.label(), **r.match.model_dump(), "weight": r.weight, "tokens": r.tokens, "epochs": r.epochs,
              "max_epochs": r.max_epochs} for r in mc.sources]
    buckets = mix_buckets(ctx, uids, rules)  # each document's quality_bucket (filter.classifiers buckets; None: none)
    owner, home = mixing.match_rules(pairs, all_codes, (uids >> 32).astype(np.int64), paths, rules, buckets)
    copies, summary = mixing.plan_mix(tokens, hashes, owner, home, rules, mc.rest, mc.total_tokens, mc.seed)
    summary["quality_buckets"] = bucket_shares(buckets, tokens, copies) if buckets is not None else None
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    out_index, out_codes = [], []
    for i, x in enumerate(index):
        c = copies[bounds[i]:bounds[i + 1]]
        out_index.append(pack.with_copies(x, c))
        out_codes.append(np.repeat(codes[i], c))
    for r in summary["rules"]:
        ctx.log(f"  {label}: mix {r['rule']}: {r['kind']} {r['value']:g} -> {r['tokens_delivered']:,} tokens "
                f"({100 * r['share_delivered']:.2f}% delivered, {100 * r['share_asked']:.2f}% asked); "
                f"{r['documents_drawn']:,} of {r['documents']:,} documents, {r['repeated_copies']:,} repeated copies")
    return out_index, out_codes, summary


ORDER_DIR = "_order"  # the range-partitioned order's sorted index files, removed when the step ends
PACK_GROUP_TOKENS = 1 << 24  # ids a pack task gathers (64 MiB of int32); decided in the driver, from totals only


def _timed(fn: Callable[..., dict], *args: Any) -> dict:
    """`fn(*args)`'s stats with its seconds as `task_seconds` (the ledger's projection reads them)."""
    started = time.perf_counter()
    stats = fn(*args)
    stats["task_seconds"] = time.perf_counter() - started
    return stats
