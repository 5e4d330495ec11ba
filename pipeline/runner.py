"""Runs the stages in order over a run directory; the only place that knows the order of stages.

Each stage writes its outputs (Parquet parts, removed/ audit rows) into its own folder and a
`_DONE.json` completion marker last; `resume=True` skips a stage whose marker carries the same
config hash. The ledger is checked by the code itself: input = kept + filtered + duplicates +
quarantined, per stage and overall.
"""
from __future__ import annotations

import errno
import json
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Optional

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.parquet as pq
from dask import delayed

from stages import (
    boilerplate, components, exact_dedup, filters, minhash, near_dedup, normalize, pack, quality, read, shard, simhash,
    tokenize,
)
from stages.shingles import ShingleSpec
from stages.base import atomic_file, merge_stats, write_frame_partitions, write_json_atomic, write_table_atomic, write_text_atomic

from . import __version__
from .config import Config
from .engine import Heartbeat, dask_client, progress_listener, run_tasks
from .executor import (attach_removed_text, export_kept_part, export_removed_part, kept_field_kinds, kept_field_types,
                       removed_texts, run_batch_part, sample_part)
from .ledger import build_ledger, project_full_run
from .progress import RunProgress
from .report import write_report

Log = Callable[[str], None]

STAGE_DIRS = {
    "read": "00-read",
    "normalize": "01-normalize",
    "filter": "02-filter",
    "exact_dedup": "03-exact_dedup",
    "near_dedup": "04-near_dedup",
    "tokenize": "05-tokenize",
    "pack": "06-pack",
    "shard": "shards",
}


TOKENIZE_SLICE_MB = 2  # tokenizing is the slowest stage: slices this size keep every worker busy to the end
CHECK_SAMPLE_DOCS = 200  # documents the tokenizer checks (unknown-token rate, round trip) look at
TEXT_PER_PARQUET_BYTE = 3  # zstd Parquet of text is about a third of the text's size


class PipelineError(RuntimeError):
    """A run could not complete; the message says which stage and why."""


def _utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _free_bytes(path: Path) -> Optional[int]:
    """Free bytes on the disk holding `path` (or its nearest existing parent); None when unknown."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def free_space(path: Path) -> str:
    """Free space at `path`, for error messages."""
    free = _free_bytes(path)
    return "unknown" if free is None else f"{free / 2**20:,.0f} MiB"


def disk_nearly_full(path: Path, min_free: int = 64 << 20) -> bool:
    free = _free_bytes(path)
    return free is not None and free < min_free


def first_line(e: BaseException) -> str:
    """The line of an error that says what went wrong (MindSpore puts it under a banner, after `[ERROR]`)."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    said = next((line for line in lines if line.startswith("[ERROR]")), lines[0] if lines else type(e).__name__)
    return said[:300]


def os_error_message(stage: str, e: OSError, folder: Path) -> str:
    """One line for an OS error in a stage: what failed, the path, and the free space there."""
    path = e.filename or folder
    what = e.strerror or first_line(e)
    code = f" [{errno.errorcode[e.errno]}]" if e.errno in errno.errorcode else ""
    return f"stage {stage}: {what}{code}: {path} ({free_space(Path(os.fsdecode(path)))} free there)"


@dataclass
class RunResult:
    out: Path
    ledger: dict
    stages: dict
    train: Optional[dict] = None
    skipped: list = field(default_factory=list)


class Pipeline:
    """One run of the configured flow into `out`."""

    def __init__(self, cfg: Config, out: str | Path, *, resume: bool = False, client=None, log: Log = print,
                 job: str = "run", export_format: str = "parquet"):
        if job not in ("run", "dedup"):
            raise ValueError(f"unknown job {job!r}")
        self.cfg, self.out, self.resume, self.log = cfg, Path(out), resume, log
        self.job, self.export_format = job, export_format
        self.client_arg = client
        self.stats: dict[str, dict] = {}
        self.seconds: dict[str, float] = {}
        self.skipped: list[str] = []
        self.extra: dict[str, Any] = {}
        self.doc_stages: list[str] = []
        self.progress: Optional[RunProgress] = None

    # ---- run directory ------------------------------------------------------------------
    def stage_dir(self, name: str) -> Path:
        return self.out / STAGE_DIRS[name]

    def parts(self, name: str) -> list[str]:
        folder = self.stage_dir(name)
        return sorted(str(p) for p in [*folder.glob("part-*.parquet"), *folder.glob("part-*.arrow")])

    def _stage(self, name: str, config_hash: str, body: Callable[[Path], dict], summary: Callable[[dict], str]) -> dict:
        """Run `body` into a fresh stage folder unless a matching completion marker says it is done."""
        folder = self.stage_dir(name)
        marker_path = folder / "_DONE.json"
        if self.resume and marker_path.is_file():
            marker = json.loads(marker_path.read_text(encoding="utf-8"))
            if marker.get("config_hash") == config_hash:
                self.stats[name] = marker["stats"]
                self.extra[name] = marker.get("extra", {})
                self.seconds[name] = marker.get("seconds", 0.0)
                self.skipped.append(name)
                self._progress("stage_finished", name, self.seconds[name], skipped=True)
                self.log(f"[{name}] done in an earlier run (config unchanged): {summary(marker['stats'])}; skipped")
                return marker["stats"]
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        self._progress("stage_started", name)
        start = time.perf_counter()
        try:
            stats = body(folder)
        except OSError as e:
            raise PipelineError(os_error_message(name, e, folder)) from None
        except (PipelineError, KeyboardInterrupt):
            raise
        except Exception as e:
            # MindSpore's writer and Arrow wrap a full disk in their own errors: name it when it is the cause
            if disk_nearly_full(folder):
                raise PipelineError(f"stage {name}: no space left on device: {folder} ({free_space(folder)} free "
                                    f"there); the step failed with {type(e).__name__}: {first_line(e)}") from None
            raise
        seconds = time.perf_counter() - start
        self.stats[name], self.seconds[name] = stats, seconds
        marker = {
            "stage": name,
            "config_hash": config_hash,
            "stats": stats,
            "extra": self.extra.get(name, {}),
            "seconds": seconds,
            "finished_utc": _utc_now(),
        }
        write_json_atomic(marker_path, marker)
        self._progress("stage_finished", name, seconds)
        self.log(f"[{name}] {summary(stats)} in {seconds:.1f}s")
        return stats

    def _progress(self, event: str, *args, **kwargs) -> None:
        if self.progress is not None:
            getattr(self.progress, event)(*args, **kwargs)

    def planned_stages(self) -> list[str]:
        """The stages this run will go through, in order (progress.json lists them up front)."""
        cfg = self.cfg
        names = ["read"] + (["normalize", "filter"] if self.job == "run" else [])
        if cfg.dedup.exact:
            names.append("exact_dedup")
        if cfg.dedup.minhash.enabled or cfg.dedup.simhash.enabled:
            names.append("near_dedup")
        if self.job == "dedup":
            return names + ["export"]
        return names + ["tokenize", "pack", "shard"] + (["train"] if cfg.train.enabled else [])

    def _map(self, in_name: str, folder: Path, fn: Callable, kwargs: dict, reader: str = "pandas",
             split_mb: Optional[float] = None, suffix: str = ".parquet", columns: Optional[list[str]] = None
             ) -> tuple[dict, list]:
        """Map a batch stage over the parts of `in_name`. With `split_mb`, a part is cut into row slices
        of about that much text (estimated from its Parquet size), so a slow stage spreads evenly over
        the workers; slice outputs are named so that they sort in the parts' order."""
        tasks = []
        for p in self.parts(in_name):
            k = 1
            if split_mb:
                k = max(1, min(64, math.ceil(os.path.getsize(p) * TEXT_PER_PARQUET_BYTE / (split_mb * 2**20))))
            if k == 1:
                tasks.append(delayed(run_batch_part)(fn, p, str(folder), reader, kwargs, suffix=suffix, columns=columns))
                continue
            n = pq.ParquetFile(p).metadata.num_rows
            bounds = np.linspace(0, n, k + 1).astype(int)
            stem = Path(p).stem
            for i in range(k):
                tasks.append(delayed(run_batch_part)(fn, p, str(folder), reader, kwargs,
                                                     (int(bounds[i]), int(bounds[i + 1])), f"{stem}-s{i:02d}{suffix}",
                                                     columns=columns))
        results = run_tasks(self.client, tasks, folder.name)
        total: dict = {}
        for r in results:
            merge_stats(total, r["stats"])
        return total, results

    # ---- the flow -----------------------------------------------------------------------
    def run(self) -> RunResult:
        self.out.mkdir(parents=True, exist_ok=True)
        self.progress = RunProgress(self.out, self.job, self.planned_stages())
        token = progress_listener.set(self.progress.tasks)
        try:
            try:
                result = self._run()
            except OSError as e:  # outside a stage body: the run directory's own files
                raise PipelineError(os_error_message(self.progress.doc.get("stage") or "setup", e, self.out)) from None
        except KeyboardInterrupt:
            self.progress.finished(error="interrupted", interrupted=True)
            raise
        except BaseException as e:
            self.progress.finished(error=f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)
            raise
        finally:
            progress_listener.reset(token)
        self.progress.finished()
        return result

    def _run(self) -> RunResult:
        cfg = self.cfg
        write_text_atomic(self.out / "config.yaml", cfg.to_yaml())
        started = time.perf_counter()
        self._preflight()
        files = read.expand_inputs(cfg.input.paths)
        identity = [(read.display_path(f), os.path.getsize(f), os.stat(f).st_mtime_ns) for f in files]
        h = cfg.section_hash("input", extra=identity)
        with dask_client(cfg.cluster, self.client_arg, self.log) as client:
            self.client = client
            self.n_workers = max(1, len(client.scheduler_info().get("workers", {})))
            self._stage("read", h, lambda d: self._read(d, files), _docs_summary)
            self.doc_stages = ["read"]
            if self.job == "dedup":
                # a dedup job keeps the original text: the dedup stages normalise only for hashing
                last, h = self._dedup_stages("read", h, normalize_opts=cfg.normalize.model_dump())
                build_ledger(self.stats, self.doc_stages)
                self._progress("stage_started", "export")
                t0 = time.perf_counter()
                self._export_dedup(last)
                self._progress("stage_finished", "export", time.perf_counter() - t0)
            else:
                self.doc_stages += ["normalize", "filter"]
                h = cfg.section_hash("normalize", extra=h)
                self._stage("normalize", h, self._skip_if_empty(
                    "read", lambda d: self._map("read", d, normalize.normalize_batch, cfg.normalize.model_dump())[0]),
                    _docs_summary)
                normalized = h
                h = cfg.section_hash("filter", extra=h)
                self._stage("filter", h, self._skip_if_empty("normalize", lambda d: self._filter(d, normalized)),
                            _docs_summary)
                last, h = self._dedup_stages("filter", h, normalize_opts=None)
                build_ledger(self.stats, self.doc_stages)  # checked before the long tokenizer work starts
                if not self.stats[last]["docs_out"]:
                    self._finish_empty(started)
                h = cfg.section_hash("tokenizer", extra=[h, cfg.train.model.vocab_size])
                self._stage("tokenize", h, lambda d: self._tokenize(d, last), _token_summary)
                h = cfg.section_hash("pack", extra=h)
                self._stage("pack", h, self._pack, _pack_summary)
                h = cfg.section_hash("shard", extra=h)
                self._stage("shard", h, lambda d: self._shard(d, h), _shard_summary)
        ledger = self._final_ledger(started)
        train_summary = None
        if cfg.train.enabled and self.job == "run":
            from trainer.train import train

            self.log("[train] starting")
            self._progress("stage_started", "train")
            t0 = time.perf_counter()
            train_summary = train(str(self.stage_dir("shard")), str(self.out / "train"), cfg.train, log=self.log)
            self._progress("stage_finished", "train", time.perf_counter() - t0)
            ledger["run"]["wall_s"] = time.perf_counter() - started
        write_json_atomic(self.out / "ledger.json", ledger)
        write_report(self.out, ledger, self.stats, self.extra, self.seconds, train_summary)
        return RunResult(self.out, ledger, self.stats, train_summary, self.skipped)

    def _final_ledger(self, started: float) -> dict:
        ledger = build_ledger(self.stats, self.doc_stages)
        ledger["run"] = {
            "corpusmill_version": __version__,
            "finished_utc": _utc_now(),
            "wall_s": time.perf_counter() - started,
            "seconds_per_stage": self.seconds,
            "resumed_stages": self.skipped,
        }
        if self.cfg.input.sample < 1.0:
            ledger["sample"] = project_full_run(ledger, self.stats, self.cfg.input.sample, self.cfg.input.sample_seed,
                                                n_workers=self.n_workers)
        return ledger

    def _finish_empty(self, started: float) -> None:
        """No document survived the document stages: the ledger and report still tell where every
        input document went, and the run stops with one clear message instead of sharding nothing."""
        ledger = self._final_ledger(started)
        write_json_atomic(self.out / "ledger.json", ledger)
        write_report(self.out, ledger, self.stats, self.extra, self.seconds, None)
        raise PipelineError(
            f"nothing to tokenize and shard: of {ledger['input']:,} input documents {ledger['filtered']:,} were "
            f"filtered, {ledger['duplicates']:,} were duplicates and {ledger['quarantined']:,} were quarantined "
            f"(see {self.out / 'report.md'})")

    def _skip_if_empty(self, source_stage: str, body: Callable[[Path], dict]) -> Callable[[Path], dict]:
        """A document stage's body, or empty stats when the stage before it passed on no document
        (a stage body may assume it has parts to work on)."""
        def run(folder: Path) -> dict:
            if self.stats[source_stage]["docs_out"]:
                return body(folder)
            self.log(f"  no documents left after {source_stage}: nothing to do")
            return {"docs_in": 0, "docs_out": 0, "removed": {}}
        return run

    def _preflight(self) -> None:
        """`corpusmill doctor`'s checks for this config (all but mindspore.run_check, which the doctor
        runs in a child process): warnings are logged, any error stops the run before work starts."""
        from .doctor import ERROR, WARNING, run_checks

        checks = run_checks(self.cfg, str(self.out), mindspore=False)
        for c in checks:
            if c.status == WARNING:
                self.log(f"  preflight warning: {c.name}: {c.detail} (fix: {c.fix})")
        failed = [c for c in checks if c.status == ERROR]
        if failed:
            raise PipelineError("preflight checks failed (see `corpusmill doctor`):\n" +
                                "\n".join(f"  {c.name}: {c.detail}\n    fix: {c.fix}" for c in failed))

    def _dedup_stages(self, last: str, h: str, normalize_opts: Optional[dict]) -> tuple[str, str]:
        """Exact then near-duplicate removal after stage `last`; returns the new last stage and its hash."""
        cfg = self.cfg
        if cfg.dedup.exact:
            h = cfg.section_hash("dedup", extra=[h, "exact", normalize_opts])
            self._stage("exact_dedup", h, self._skip_if_empty(last, lambda d: self._with_removed_text(
                d, last, self._exact_dedup(d, last, normalize_opts))), _docs_summary)
            self.doc_stages.append("exact_dedup")
            last = "exact_dedup"
        if cfg.dedup.minhash.enabled or cfg.dedup.simhash.enabled:
            h = cfg.section_hash("dedup", extra=[h, "near", normalize_opts])
            source = last
            self._stage("near_dedup", h, self._skip_if_empty(source, lambda d: self._with_removed_text(
                d, source, self._near_dedup(d, source, normalize_opts))), _docs_summary)
            self.doc_stages.append("near_dedup")
            last = "near_dedup"
        return last, h

    def _with_removed_text(self, folder: Path, source_stage: str, stats: dict) -> dict:
        """Each removed duplicate's audit row (FOLDER/removed/) gets its text, cut to
        dedup.audit_text_chars, read from the stage's input parts, so checking what was removed
        needs no join by id."""
        chars = self.cfg.dedup.audit_text_chars
        files = sorted(str(p) for p in (folder / "removed").glob("*.parquet"))
        if chars == 0 or not files:
            return stats
        uids = np.unique(pq.read_table(files, columns=["uid"]).column("uid").to_numpy())
        wanted = self.client.scatter(uids, broadcast=True, hash=False)  # a key of its own: never shared, never released early
        texts: dict = {}
        for found in run_tasks(self.client, [delayed(removed_texts)(p, wanted, chars) for p in self.parts(source_stage)],
                               f"{folder.name}: removed texts"):
            texts.update(found)
        for f in files:
            attach_removed_text(f, texts)
        return stats

    # ---- stage bodies -------------------------------------------------------------------
    def _read(self, folder: Path, files: list[str]) -> dict:
        ic = self.cfg.input
        units, to_count = read.plan_units(files, int(ic.block_size_mb * 2**20), int(ic.part_size_mb * 2**20))
        if to_count:
            counts = run_tasks(
                self.client, [delayed(read.count_block_lines)(s.path, s.start, s.end) for s in to_count], "count lines"
            )
            running: dict[int, int] = {}
            for seg, n in zip(to_count, counts):
                seg.first_line = running.get(seg.file_index, 0) + 1
                running[seg.file_index] = running.get(seg.file_index, 0) + n
        opts = read.ReadOptions(ic.text_field, ic.id_field, ic.source_field, int(ic.part_size_mb * 2**20),
                                sample=ic.sample, sample_seed=ic.sample_seed, on_error=ic.on_error)
        results = run_tasks(self.client, [delayed(read.read_unit)(u, opts, str(folder)) for u in units], "read")
        stats: dict = {}
        with atomic_file(folder / "quarantine.jsonl") as q:
            for r in results:
                merge_stats(stats, r["stats"])
                for rec in r["quarantine"]:  # the reader writes paths, reasons and snippets as valid UTF-8
                    q.write((json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8"))
        stats["input_files"] = len(files)
        stats["removed"] = dict(stats.pop("quarantine_reasons", {}))
        lost = stats.get("lost_input") or {}
        if lost.get("files"):
            self.log(f"  read: {lost['files']} damaged file(s): their unreadable rest ({lost['bytes']:,} file bytes "
                     f"+ {lost['partial_bytes']:,} bytes of incomplete records) is lost input, outside the document "
                     f"count; see {folder / 'quarantine.jsonl'} (rows with lost_input)")
        if stats.get("docs_out", 0) == 0:
            self.log("  read: no document survived reading (every record was quarantined or the input holds none)")
        self.extra["read"] = {"quarantine_examples": [rec for r in results for rec in r["quarantine"]][:20]}
        return stats

    def _filter(self, folder: Path, input_hash: str) -> dict:
        """Boilerplate lines, then quality scores, then the keep/drop decision. Lines and scores are
        cached beside the stage (02-filter.scores/) under a hash of what they depend on, so a
        changed threshold reruns only the decision."""
        fc = self.cfg.filter
        parts = self.parts("normalize")
        score_options = {"cjk_share": fc.scripts.cjk_share, "cjk_ngram_scale": fc.gopher_repetition.cjk_ngram_scale,
                         "short_line_chars": fc.c4.short_line_chars, "short_line_chars_cjk": fc.c4.short_line_chars_cjk}
        cache = self.out / (self.stage_dir("filter").name + ".scores")
        scoring_hash = self.cfg.section_hash(extra=[input_hash, fc.boilerplate_lines.model_dump(), score_options,
                                                    quality.SCORES_VERSION])
        marker = cache / "_DONE.json"
        reuse = fc.keep_scores and marker.is_file() and json.loads(marker.read_text())["scoring_hash"] == scoring_hash
        if not reuse and cache.exists():
            shutil.rmtree(cache)
        cache.mkdir(exist_ok=True)
        drop_lines, line_stats = self._boilerplate_lines(parts, cache, reuse)
        drop_future = self.client.scatter(drop_lines, broadcast=True) if drop_lines else None
        rules = quality.rule_table(fc)
        tasks = []
        for p in parts:
            kwargs = {"rules": rules, "drop_lines": drop_future, "keep_scripts": fc.scripts.keep,
                      "min_script_share": fc.scripts.min_share, "score_options": score_options,
                      "audit_text_chars": fc.audit_text_chars,
                      "name_lines": sorted({t["hash"] for t in line_stats.get("top", [])}),
                      "scores_path": str(cache / Path(p).name) if fc.keep_scores else None, "reuse_scores": reuse}
            tasks.append(delayed(run_batch_part)(filters.filter_batch, p, str(folder), "pandas", kwargs))
        results = run_tasks(self.client, tasks, "02-filter: " + ("decide (scores reused)" if reuse else "score + decide"))
        stats: dict = {}
        for r in results:
            merge_stats(stats, r["stats"])
        if fc.keep_scores and not reuse:
            write_json_atomic(marker, {"scoring_hash": scoring_hash, "finished_utc": _utc_now()})
        stats["scores_reused"] = bool(reuse)
        texts = stats.pop("boilerplate_line_texts", {})
        times = stats.pop("boilerplate_line_removed", {})
        for t in line_stats.get("top", []):  # the most frequent removed lines, as text, for the report
            t["line"], t["removed"] = texts.get(str(t["hash"])), int(times.get(str(t["hash"]), 0))
        line_stats.get("top", []).sort(key=lambda t: (-t["removed"], -t["docs"]))
        stats["boilerplate_lines"] = line_stats
        self.extra["filter"] = {
            "examples": _removed_examples(folder / "removed", self.stage_dir("normalize")),
            "rules": [{"reason": name, "column": col, "kind": kind, "threshold": limit, "applies_to": applies,
                       "guard": list(guard) if guard else None} for name, col, kind, limit, applies, guard in rules],
            "scores_dir": str(cache) if fc.keep_scores else None,
        }
        return stats

    def _boilerplate_lines(self, parts: list[str], cache: Path, reuse: bool) -> tuple[dict, dict]:
        """{source: set of line hashes} to remove: lines in at least `min_docs` documents and
        `min_doc_share` of their source's documents, counted with a Dask groupby over the corpus."""
        bc = self.cfg.filter.boilerplate_lines
        if not bc.enabled:
            return {}, {"enabled": False}
        path = cache / "boilerplate_lines.parquet"
        if not (reuse and path.is_file()):
            meta = pd.DataFrame({"source": pd.Series(dtype="string"), "hash": pd.Series(dtype="int64"),
                                 "docs": pd.Series(dtype="int64")})
            counted = dd.from_map(boilerplate.count_lines_part, parts, min_width=bc.min_width, meta=meta,
                                  enforce_metadata=False)
            totals = counted.groupby(["source", "hash"])["docs"].sum(split_out=max(1, len(parts) // 4))
            per_source = totals[totals < 0]  # hash 0 rows carry -(documents of the source)
            frequent = totals[totals >= bc.min_docs]
            with _ProgressNote(self.log, "02-filter: counting lines across the corpus"):
                source_docs, frequent = self.client.compute([per_source, frequent], sync=True)
            source_docs = (-source_docs).reset_index().groupby("source")["docs"].sum()
            frequent = frequent.reset_index()
            need = np.maximum(bc.min_docs, bc.min_doc_share * frequent["source"].map(source_docs).to_numpy(dtype=float))
            chosen = frequent[(frequent["docs"].to_numpy() >= need) & (frequent["hash"].to_numpy() != 0)]
            write_table_atomic(pa.Table.from_pandas(chosen.reset_index(drop=True), preserve_index=False), path)
        chosen = pq.read_table(path).to_pandas()
        drop = {str(s): set(g["hash"].tolist()) for s, g in chosen.groupby("source")}
        top = chosen.sort_values(["docs", "source", "hash"], ascending=[False, True, True]).head(TOP_BOILERPLATE_LINES)
        stats = {"enabled": True, "distinct_lines": int(len(chosen)),
                 "by_source": {s: len(v) for s, v in sorted(drop.items(), key=lambda kv: -len(kv[1]))[:20]},
                 "top": [{"source": str(s), "hash": int(h), "docs": int(d)}
                         for s, h, d in zip(top["source"], top["hash"], top["docs"])]}
        self.log(f"  filter: {len(chosen)} boilerplate lines in {len(drop)} sources")
        return drop, stats

    def _exact_dedup(self, folder: Path, source_stage: str, normalize_opts: Optional[dict]) -> dict:
        parts = self.parts(source_stage)
        hashes = dd.from_map(
            exact_dedup.hash_file,
            parts,
            normalize=normalize_opts,
            meta=exact_dedup.HASH_META,
            enforce_metadata=False,
        )
        removed_dir = folder / "removed"
        dups = exact_dedup.find_exact_duplicates(hashes)
        with _ProgressNote(self.log, "exact_dedup: grouping hashes across partitions (Dask shuffle)"):
            write_frame_partitions(dups, removed_dir)
        removed = pq.read_table(str(removed_dir), columns=["uid"]) if any(removed_dir.glob("*.parquet")) else None
        drop = np.sort(removed.column("uid").to_numpy()) if removed is not None else np.empty(0, np.int64)
        drop_future = self.client.scatter(drop, broadcast=True)
        tasks = [delayed(run_batch_part)(exact_dedup.drop_uids_batch, p, str(folder), "pandas", {"drop_sorted": drop_future})
                 for p in parts]
        results = run_tasks(self.client, tasks, "exact_dedup: remove")
        stats: dict = {}
        for r in results:
            merge_stats(stats, r["stats"])
        if len(drop):
            examples = pq.read_table(str(removed_dir)).slice(0, 10).to_pylist()
            self.extra["exact_dedup"] = {"examples": [{k: e[k] for k in ("id", "duplicate_of_id", "cluster_size")} for e in examples]}
        return stats

    def _near_dedup(self, folder: Path, source_stage: str, normalize_opts: Optional[dict]) -> dict:
        """Signatures -> candidate edges (MinHash LSH, SimHash blocks) -> components -> keepers -> removal."""
        dc, client = self.cfg.dedup, self.client
        parts = self.parts(source_stage)
        nparts = max(1, len(parts))
        sh = dc.shingling
        spec = near_dedup.SignatureSpec(
            minhash=ShingleSpec(dc.minhash.word_ngram, dc.minhash.char_ngram, sh.lowercase, sh.strip_punctuation, sh.cjk_share,
                                sh.unit) if dc.minhash.enabled else None,
            num_perm=dc.minhash.num_perm,
            seed=dc.minhash.seed,
            simhash=ShingleSpec(dc.simhash.word_ngram, dc.simhash.char_ngram, sh.lowercase, sh.strip_punctuation, sh.cjk_share,
                                dc.simhash.unit) if dc.simhash.enabled else None,
            keep_field=dc.keep_field if dc.keep == "field" else None,
            normalize=normalize_opts,
        )
        sig_dir = folder / "signatures"
        sig_paths = [str(sig_dir / Path(p).name) for p in parts]
        results = run_tasks(client, [delayed(near_dedup.signature_part)(p, s, spec) for p, s in zip(parts, sig_paths)],
                            "near_dedup: signatures")
        stats: dict = {"docs_in": sum(r["docs"] for r in results), "edges": {}}
        edge_sets = []
        budget = dc.components_memory_mb << 20
        if dc.minhash.enabled:
            bands, rows = dc.minhash.bands, dc.minhash.rows
            if bands is None or rows is None:
                bands, rows = minhash.optimal_bands(dc.minhash.threshold, dc.minhash.num_perm, dc.minhash.verify)
            if bands * rows > dc.minhash.num_perm:
                raise PipelineError(f"dedup.minhash.bands x rows = {bands * rows} exceeds num_perm {dc.minhash.num_perm}")
            self.log(f"  near_dedup: MinHash LSH, {bands} bands x {rows} rows (threshold {dc.minhash.threshold})")
            stats["minhash_bands"], stats["minhash_rows"] = bands, rows
            buckets = dd.from_map(near_dedup.minhash_band_part, sig_paths, bands=bands, rows=rows,
                                  meta=minhash.BAND_META, enforce_metadata=False)
            cand = buckets.shuffle(on="band_key", npartitions=nparts).map_partitions(minhash.bucket_edges, meta=minhash.EDGE_META)
            cand = cand.shuffle(on="a", npartitions=nparts).map_partitions(lambda p: p.drop_duplicates(), meta=minhash.EDGE_META)
            cand = cand.persist()
            n_cand = int(cand.map_partitions(len).compute().sum())
            threshold = dc.minhash.threshold if dc.minhash.verify else None
            # first the signatures' estimate; with verification on, only pairs it puts within 5 standard
            # deviations of the threshold go on to the exact check (a cheap filter that loses no true pair)
            floor = minhash.estimate_floor(threshold, dc.minhash.num_perm) if threshold is not None else None
            if n_cand * (8 * dc.minhash.num_perm + 16) <= budget:
                pairs = cand.compute()
                endpoints = np.unique(np.concatenate([pairs["a"].to_numpy(), pairs["b"].to_numpy()]))
                sigs = self._rows_for_uids(sig_paths, endpoints, ["uid", "minhash"], "near_dedup: fetch candidate signatures")
                uids, matrix = near_dedup.signature_lookup(sigs, "minhash")
                sim = minhash.signature_jaccard(near_dedup.lookup(uids, matrix, pairs["a"].to_numpy()),
                                                near_dedup.lookup(uids, matrix, pairs["b"].to_numpy()))
                verified = pd.DataFrame({"a": pairs["a"].to_numpy(), "b": pairs["b"].to_numpy(), "similarity": sim})
                if floor is not None:
                    verified = verified[verified["similarity"] >= floor]
                verified = dd.from_pandas(verified.reset_index(drop=True), npartitions=1)
            else:
                sig_a = dd.from_map(near_dedup.load_signatures, sig_paths, fields=["uid", "minhash"],
                                    rename={"uid": "a", "minhash": "sig_a"}, enforce_metadata=False)
                sig_b = dd.from_map(near_dedup.load_signatures, sig_paths, fields=["uid", "minhash"],
                                    rename={"uid": "b", "minhash": "sig_b"}, enforce_metadata=False)
                verified = cand.merge(sig_a, on="a").merge(sig_b, on="b").map_partitions(
                    near_dedup.verify_minhash_edges, floor, meta=near_dedup.VERIFIED_META).persist()
            if threshold is not None:
                # exact verification: the true Jaccard of the two shingle sets, from the endpoints' texts only
                plausible = verified[["a", "b"]]
                ends = dd.concat([plausible[["a"]].rename(columns={"a": "u"}), plausible[["b"]].rename(columns={"b": "u"})])
                endpoints = np.unique(ends["u"].unique().compute().to_numpy()).astype(np.int64)
                ends_future = client.scatter(endpoints, broadcast=True)
                text_meta = pd.DataFrame({"uid": pd.Series(dtype="int64"), "text": pd.Series(dtype=object)})
                # the endpoints' texts are read once (both sides of the merge share these tasks)
                texts = dd.from_delayed([delayed(near_dedup.texts_for_uids)(p, ends_future, normalize_opts) for p in parts],
                                        meta=text_meta, verify_meta=False)
                n_plausible = int(plausible.map_partitions(len).compute().sum())
                stats["minhash_exact_checks"] = n_plausible
                self.log(f"  near_dedup: {n_cand} candidate pairs, {n_plausible} within reach of the threshold by "
                         f"their signatures: verifying those by exact Jaccard ({len(endpoints)} documents)")
                verified = plausible.merge(texts.rename(columns={"uid": "a", "text": "text_a"}), on="a").merge(
                    texts.rename(columns={"uid": "b", "text": "text_b"}), on="b").map_partitions(
                    near_dedup.verify_exact_edges, spec.minhash, threshold, meta=near_dedup.VERIFIED_META)
            stats["minhash_candidates"] = n_cand
            edge_sets.append(verified.assign(method=np.int8(0)))
        if dc.simhash.enabled:
            k = dc.simhash.max_distance
            self.log(f"  near_dedup: SimHash, Hamming <= {k} via {k + 1} blocks")
            blocks = dd.from_map(near_dedup.simhash_block_part, sig_paths, max_distance=k,
                                 meta=simhash.BLOCK_META, enforce_metadata=False)
            near = blocks.shuffle(on="block_key", npartitions=nparts).map_partitions(
                simhash.near_edges, k, dc.simhash.max_bucket, dc.simhash.window, meta=simhash.EDGE_META)
            near = near.shuffle(on="a", npartitions=nparts).map_partitions(
                lambda p: p.drop_duplicates(subset=["a", "b"]), meta=simhash.EDGE_META)
            edge_sets.append(near.map_partitions(
                lambda p: pd.DataFrame({"a": p["a"].to_numpy(), "b": p["b"].to_numpy(),
                                        "similarity": 1.0 - p["distance"].to_numpy() / 64.0, "method": np.int8(1)}),
                meta=near_dedup.VERIFIED_META.assign(method=np.int8(0))))
        edges_dir = folder / "edges"
        self.log("  near_dedup: bucketing candidates (Dask shuffles)")
        write_frame_partitions(dd.concat(edge_sets), edges_dir)
        edge_files = sorted(str(p) for p in edges_dir.glob("*.parquet"))
        edge_tables = [pq.read_table(f, columns=["method"]) for f in edge_files]
        n_edges = sum(t.num_rows for t in edge_tables)
        for t in edge_tables:
            for code, name in ((0, "minhash"), (1, "simhash")):
                if not getattr(dc, name).enabled:
                    continue
                stats["edges"][name] = stats["edges"].get(name, 0) + int(np.sum(t.column("method").to_numpy() == code))
        if n_edges * 16 <= budget:
            mode = "in_memory"
            e = pq.read_table(edge_files, columns=["a", "b"]) if edge_files else None
            labels = components.components_in_memory(
                e.column("a").to_numpy() if e is not None else np.empty(0, np.int64),
                e.column("b").to_numpy() if e is not None else np.empty(0, np.int64))
            labels_dd = dd.from_pandas(labels, npartitions=nparts)
        else:
            mode = "distributed"
            labels_dd = components.components_distributed(dd.read_parquet(edge_files, columns=["a", "b"]), log=self.log)
        self.log(f"  near_dedup: {n_edges} edges -> connected components {mode.replace('_', ' ')} "
                 f"(edge list {n_edges * 16 / 2**20:.1f} MiB, budget {dc.components_memory_mb} MiB)")
        stats["components_mode"] = mode
        if mode == "in_memory":
            removed_pd = self._removed_in_memory(labels, edge_files, sig_paths, parts, normalize_opts, spec.minhash)
            removed_dir = folder / "removed"
            if len(removed_pd):
                write_table_atomic(pa.Table.from_pandas(removed_pd, preserve_index=False), removed_dir / "part.0.parquet")
            return self._finish_near_dedup(folder, parts, stats)
        attrs = dd.from_map(near_dedup.load_signatures, sig_paths, fields=["uid", "id", "source", "n_chars", "keep_key"],
                            enforce_metadata=False)
        nodes = labels_dd.merge(attrs, on="uid", how="inner")
        removed = nodes.shuffle(on="root", npartitions=nparts).map_partitions(
            near_dedup.choose_keepers, dc.keep, dc.keep_order, meta=near_dedup.CLUSTER_META)
        method = dd.from_map(near_dedup.node_methods, edge_files or [None], enforce_metadata=False)
        removed = removed.merge(method, on="uid", how="left")
        if dc.minhash.enabled:
            su = dd.from_map(near_dedup.load_signatures, sig_paths, fields=["uid", "minhash"],
                             rename={"minhash": "sig_a"}, enforce_metadata=False)
            sk = dd.from_map(near_dedup.load_signatures, sig_paths, fields=["uid", "minhash"],
                             rename={"uid": "duplicate_of", "minhash": "sig_b"}, enforce_metadata=False)
        else:
            su = dd.from_map(near_dedup.load_signatures, sig_paths, fields=["uid", "simhash"],
                             rename={"simhash": "sig_a"}, enforce_metadata=False)
            sk = dd.from_map(near_dedup.load_signatures, sig_paths, fields=["uid", "simhash"],
                             rename={"uid": "duplicate_of", "simhash": "sig_b"}, enforce_metadata=False)
        removed = removed.merge(su, on="uid").merge(sk, on="duplicate_of").map_partitions(
            near_dedup.finish_removed, dc.minhash.threshold, 1.0 - dc.simhash.max_distance / 64.0, meta=near_dedup.REMOVED_META)
        write_frame_partitions(removed, folder / "removed")
        return self._finish_near_dedup(folder, parts, stats)

    def _rows_for_uids(self, sig_paths: list[str], uids: np.ndarray, fields: list[str], label: str) -> list:
        uids_future = self.client.scatter(np.sort(uids), broadcast=True)
        return run_tasks(self.client, [delayed(near_dedup.rows_for_uids)(p, uids_future, fields) for p in sig_paths], label)

    def _removed_in_memory(self, labels: pd.DataFrame, edge_files: list[str], sig_paths: list[str],
                           parts: Optional[list[str]] = None, normalize_opts: Optional[dict] = None,
                           exact_spec: Optional[ShingleSpec] = None) -> pd.DataFrame:
        """Keepers, reasons and similarities when the clustered documents fit in memory. With MinHash
        verification on, a MinHash-removed document's score is its true Jaccard to the kept one."""
        dc = self.cfg.dedup
        if labels.empty:
            return near_dedup.REMOVED_META.copy()
        nodes = labels["uid"].to_numpy()
        sig_col = "minhash" if dc.minhash.enabled else "simhash"
        rows = pd.concat(self._rows_for_uids(sig_paths, nodes, ["uid", "id", "source", "n_chars", "keep_key", sig_col],
                                             "near_dedup: fetch clustered documents"), ignore_index=True)
        clusters = labels.merge(rows.drop(columns=[sig_col]), on="uid")
        removed = near_dedup.choose_keepers(clusters, dc.keep, dc.keep_order)
        methods = pd.concat([near_dedup.node_methods(f) for f in edge_files], ignore_index=True)
        removed = removed.merge(methods.groupby("uid", as_index=False)["method"].min(), on="uid", how="left")
        uids, values = near_dedup.signature_lookup([rows[["uid", sig_col]]], sig_col)

        def signatures_of(which: np.ndarray):
            found = near_dedup.lookup(uids, values, which)
            return list(found) if sig_col == "minhash" else found.view(np.int64)

        removed["sig_a"] = signatures_of(removed["uid"].to_numpy())
        removed["sig_b"] = signatures_of(removed["duplicate_of"].to_numpy())
        out = near_dedup.finish_removed(removed, dc.minhash.threshold, 1.0 - dc.simhash.max_distance / 64.0)
        by_minhash = (out["reason"] == "minhash").to_numpy()
        if dc.minhash.enabled and dc.minhash.verify and parts and exact_spec is not None and by_minhash.any():
            a, b = out["uid"].to_numpy()[by_minhash], out["duplicate_of"].to_numpy()[by_minhash]
            want = np.unique(np.concatenate([a, b]))
            future = self.client.scatter(want, broadcast=True)
            texts = pd.concat(run_tasks(self.client, [delayed(near_dedup.texts_for_uids)(p, future, normalize_opts) for p in parts],
                                        "near_dedup: similarity to the kept documents"), ignore_index=True).sort_values("uid")
            uids, values = texts["uid"].to_numpy(), np.asarray(texts["text"].tolist(), dtype=object)
            exact = near_dedup.verify_pairs_exact(a, b, list(near_dedup.lookup(uids, values, a)),
                                                  list(near_dedup.lookup(uids, values, b)), exact_spec, None)
            out.loc[by_minhash, "score"] = exact["similarity"].to_numpy()
        return out

    def _finish_near_dedup(self, folder: Path, parts: list[str], stats: dict) -> dict:
        """Remove what the near-duplicate search found, and summarise the clusters."""
        client = self.client
        removed_dir = folder / "removed"
        removed_files = sorted(str(p) for p in removed_dir.glob("*.parquet"))
        table = pq.read_table(removed_files, columns=["uid", "reason", "cluster_id", "cluster_size"]) if removed_files else None
        drop = np.sort(table.column("uid").to_numpy()) if table is not None else np.empty(0, np.int64)
        drop_future = client.scatter(drop, broadcast=True)
        tasks = [delayed(run_batch_part)(exact_dedup.drop_uids_batch, p, str(folder), "pandas",
                                         {"drop_sorted": drop_future, "reason": None}) for p in parts]
        for r in run_tasks(client, tasks, "near_dedup: remove"):
            stats["docs_out"] = stats.get("docs_out", 0) + r["stats"]["docs_out"]
        reasons = table.column("reason").to_pandas().value_counts().to_dict() if table is not None else {}
        stats["removed"] = {str(k): int(v) for k, v in reasons.items()}
        exact_files = sorted(str(p) for p in (self.stage_dir("exact_dedup") / "removed").glob("*.parquet"))
        if exact_files:  # an exact duplicate of a document removed here names that document's keeper
            near = (pq.read_table(removed_files, columns=["uid", "duplicate_of", "duplicate_of_id"]).to_pandas()
                    if removed_files else pd.DataFrame({"uid": [], "duplicate_of": [], "duplicate_of_id": []}))
            stats["exact_repointed"] = near_dedup.repoint_exact_removed(exact_files, near)
        if table is not None and table.num_rows:
            sizes = table.to_pandas().drop_duplicates("cluster_id")["cluster_size"]
            stats["clusters"] = int(len(sizes))
            stats["largest_cluster"] = int(sizes.max())
            stats["cluster_sizes"] = {str(k): int(v) for k, v in sizes.value_counts().sort_index().items()}
            examples = pq.read_table(removed_files[0]).slice(0, 10).to_pylist()
            self.extra["near_dedup"] = {"examples": [{k: e[k] for k in ("id", "duplicate_of_id", "cluster_size", "reason", "score")}
                                                     for e in examples]}
        return stats

    def _export_dedup(self, last: str) -> None:
        """DIR/kept/ (every field the input gave each document) and DIR/removed/ (every duplicate, with
        what it duplicates). A Parquet export decides each field's column type over all parts first."""
        kept_dir, removed_dir = self.out / "kept", self.out / "removed"
        for d in (kept_dir, removed_dir):
            if d.exists():
                shutil.rmtree(d)
        kept_dir.mkdir(parents=True)
        parts = self.parts(last)
        ic, fmt = self.cfg.input, self.export_format
        field_types = None
        if fmt == "parquet":
            kinds: dict[str, set] = {}
            for part_kinds in run_tasks(self.client, [delayed(kept_field_kinds)(p) for p in parts], "export: field types"):
                for name, k in part_kinds.items():
                    kinds.setdefault(name, set()).update(k)
            field_types = kept_field_types(kinds)
            as_json = sorted(n for n, t in field_types.items() if t == "json")
            if as_json:
                self.log(f"  export: fields whose type changes between documents are kept as JSON text: {', '.join(as_json)}")
            write_json_atomic(kept_dir / "_fields.json", field_types)
        tasks = [delayed(export_kept_part)(p, str(kept_dir), fmt, ic.text_field, ic.id_field, ic.source_field, field_types)
                 for p in parts]
        run_tasks(self.client, tasks, "export kept")
        removed_dir.mkdir(parents=True)
        n = 0
        for stage in ("exact_dedup", "near_dedup"):
            for f in sorted((self.stage_dir(stage) / "removed").glob("*.parquet")):
                export_removed_part(str(f), str(removed_dir / f"{stage}-{n:05d}.{fmt}"), fmt)
                n += 1
        if not parts:  # one empty file with the columns, so readers of kept/ get an empty table, not an error
            names = [n for n in (ic.id_field, ic.text_field, ic.source_field) if n]
            empty = kept_dir / f"part-00000-000.{fmt}"
            if fmt == "jsonl":
                write_text_atomic(empty, "")
            else:
                write_table_atomic(pa.table({n: pa.array([], pa.string()) for n in names}), empty)
            self.log("[export] no document was kept (see the ledger): kept/ holds one empty file")
        self.log(f"[export] kept documents in {kept_dir} ({fmt}), removed in {removed_dir}")

    def _tokenize(self, folder: Path, source_stage: str) -> dict:
        tc = self.cfg.tokenizer
        started = time.perf_counter()
        parts = self.parts(source_stage)
        kept_docs = self.stats[source_stage]["docs_out"]
        if kept_docs == 0:
            raise PipelineError("no documents are left to tokenize: every input was filtered, removed or quarantined")
        if tc.model:  # only the checks need a sample: a few hundred documents from 4 spread-out parts
            sampled = [parts[i] for i in sorted({round(j * (len(parts) - 1) / 3) for j in range(4)})]
            rate, first_group, max_docs = 1.0, True, -(-2 * CHECK_SAMPLE_DOCS // len(sampled))
        else:  # training needs a sample of the whole corpus
            sampled, rate, first_group, max_docs = parts, min(1.0, tc.train.sample_docs / kept_docs), False, None
        max_chars = (tc.train.max_sample_mb << 20) // max(1, len(sampled))
        samples = run_tasks(
            self.client, [delayed(sample_part)(p, tc.train.seed, rate, max_chars, first_group, max_docs) for p in sampled],
            "tokenize: sample")
        sample = [t for chunk in samples for t in chunk]
        model_path = folder / "tokenizer.model"
        if tc.model:
            if not os.path.isfile(tc.model):
                raise PipelineError(f"tokenizer.model {tc.model} does not exist")
            shutil.copyfile(tc.model, model_path)
            origin = f"given ({tc.model})"
        else:
            sample_file = folder / "tokenizer_sample.txt"
            lines = tokenize.write_training_sample(sample, sample_file)
            self.log(f"  tokenize: training a {tc.train.model_type} tokenizer (vocab {tc.train.vocab_size}) "
                     f"on {len(sample)} sampled documents ({lines} lines)")
            try:
                tokenize.train_tokenizer(
                    sample_file, folder / "tokenizer", vocab_size=tc.train.vocab_size, model_type=tc.train.model_type,
                    character_coverage=tc.train.character_coverage, byte_fallback=tc.train.byte_fallback,
                    seed=tc.train.seed, num_threads=os.cpu_count() or 1, user_symbols=tuple(tc.train.user_symbols),
                )
            except tokenize.TokenizerError as e:
                raise PipelineError(str(e)) from None
            sample_file.unlink()
            origin = "trained on this corpus"
        rng = np.random.default_rng(tc.train.seed)
        check_sample = [sample[i] for i in sorted(rng.choice(len(sample), size=min(CHECK_SAMPLE_DOCS, len(sample)), replace=False))]
        try:
            report = tokenize.check_tokenizer(
                str(model_path), add_bos=tc.add_bos, add_eos=tc.add_eos, pad_id=tc.pad_id,
                model_vocab_size=self.cfg.train.model.vocab_size, sample_texts=check_sample,
                max_unk_rate=tc.max_unk_rate,
            )
        except tokenize.TokenizerError as e:
            raise PipelineError(str(e)) from None
        for w in report.warnings:
            self.log(f"  tokenize: warning: {w}")
        info = dict(report.__dict__)
        info["origin"] = origin
        info["path"] = str(model_path)
        self.extra["tokenize"] = {"tokenizer": info}
        prepared = time.perf_counter()
        stats, _ = self._map(source_stage, folder, tokenize.tokenize_batch,
                             {"model_path": str(model_path), "add_bos": tc.add_bos, "add_eos": tc.add_eos,
                              "batch_docs": tc.batch_docs}, reader="arrow", split_mb=TOKENIZE_SLICE_MB,
                             suffix=".arrow", columns=["uid", "text"])  # uncompressed Arrow IPC: 3x faster to write than zstd Parquet
        stats["prepare_s"] = round(prepared - started, 3)  # sample, train or copy the model, checks
        stats["encode_s"] = round(time.perf_counter() - prepared, 3)
        return stats

    def _pack(self, folder: Path) -> dict:
        pc_, window = self.cfg.pack, self.cfg.pack.seq_length + 1
        pad_id = self.extra["tokenize"]["tokenizer"]["pad_id"]
        stats, results = self._map("tokenize", folder, pack.pack_batch,
                                   {"window": window, "mode": pc_.mode, "pad_id": pad_id}, reader="arrow",
                                   suffix=".arrow")  # Arrow IPC: the shard stage memory-maps it and picks rows
        stats["mode"] = pc_.mode
        if pc_.mode == "concat":
            table, tail_stats = pack.pack_tails([r["extra"] for r in results], window, pc_.remainder, pad_id)
            if table.num_rows:
                write_table_atomic(table, folder / "part-tail.arrow")
            stats["windows"] += tail_stats.pop("windows")
            stats["tokens_dropped"] = stats.get("tokens_dropped", 0) + tail_stats.pop("tokens_dropped")
            stats["pad_tokens"] = stats.get("pad_tokens", 0) + tail_stats.pop("pad_tokens")
            stats.update(tail_stats)
        stats.setdefault("docs_truncated", 0)
        stats["tokens_kept"] = stats["tokens_in"] - stats["tokens_dropped"]
        stats["padding_share"] = stats["pad_tokens"] / max(1, stats["windows"] * window)
        return stats

    def _warm_up_writers(self) -> float:
        """Import the MindRecord writer on every worker once, before the write tasks; the seconds
        (the slowest worker) are reported apart from the writing."""
        started = time.perf_counter()
        self.client.run(shard.warm_up_writer)
        return time.perf_counter() - started

    def _shard(self, folder: Path, config_hash: str) -> dict:
        sc, window = self.cfg.shard, self.cfg.pack.seq_length + 1
        labels = self.cfg.pack.mode != "concat"  # windows that can hold padding carry masked labels
        parts = self.parts("pack")
        counts = [shard.count_windows(p) for p in parts]
        total = int(sum(counts))
        try:
            plan = shard.plan_shards(total, sc.ranks, sc.files_per_rank, sc.remainder)
        except shard.ShardError as e:
            raise PipelineError(str(e)) from None
        staging = self.out / "shards.tmp"
        if staging.exists():
            shutil.rmtree(staging)
        staging.mkdir()
        names = [shard.file_name(sc.layout, *plan.file_of(i), sc.files_per_rank, sc.ranks) for i in range(plan.files)]
        tasks = [delayed(shard.gather_and_write)(parts, counts, sc.seed, plan.file_bounds[i], plan.file_bounds[i + 1], plan.used,
                                            str(staging / name), window, sc.write_batch, labels, sc.verify,
                                            dask_key_name=f"shard-write-{i}")
                 for i, name in enumerate(names)]
        balance = (f"{plan.dropped} dropped" if sc.remainder == "drop" else f"{plan.repeated} repeated") + " for equal ranks"
        self.log(f"  shard: {total} samples -> {sc.ranks} ranks x {plan.per_rank} samples ({balance}), "
                 f"{plan.files} MindRecord files, layout {sc.layout}")
        setup_s = self._warm_up_writers()
        started = time.perf_counter()
        try:
            written = run_tasks(self.client, tasks, f"shard: shuffle + write + {sc.verify} check")
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)  # half-written MindRecord files are never resumed
            raise
        write_s = time.perf_counter() - started
        files = []
        task_seconds = sum(w.pop("task_seconds") for w in written)
        for i, (name, w) in enumerate(zip(names, written)):
            rank, _ = plan.file_of(i)
            files.append({"path": name, "rank": rank if sc.layout == "per_rank" else None, **w})
        written_total = sum(x["samples"] for x in files)
        per_rank = {r: sum(x["samples"] for x in files if x["rank"] == r) for r in range(sc.ranks)}
        if written_total != plan.used or (sc.layout == "per_rank" and set(per_rank.values()) != {plan.per_rank}):
            raise PipelineError(f"shards hold {written_total} samples ({per_rank} per rank), planned "
                                f"{sc.ranks} x {plan.per_rank}")
        tok = self.extra["tokenize"]["tokenizer"]
        shutil.copyfile(tok["path"], staging / "tokenizer.model")
        manifest = {
            "format": "corpusmill-shards/1",
            "corpusmill_version": __version__,
            "config_hash": config_hash,
            "created_utc": _utc_now(),
            "seq_length": self.cfg.pack.seq_length,
            "sample_length": window,
            "vocab_size": tok["vocab_size"],
            "tokenizer": {k: tok[k] for k in ("sha256", "bos_id", "eos_id", "unk_id", "pad_id", "pad_source", "vocab_size")}
            | {"path": "tokenizer.model", "add_bos": self.cfg.tokenizer.add_bos, "add_eos": self.cfg.tokenizer.add_eos},
            "columns": {"input_ids": {"type": "int32", "shape": [window],
                                      "note": "seq_length + 1 ids; the model shifts by one for labels; EOS ends every document"}}
            | ({"labels": {"type": "int32", "shape": [window], "note": "input_ids with -100 on trailing padding"}}
               if labels else {}),
            "pack_mode": self.cfg.pack.mode,
            "layout": sc.layout,
            "ranks": sc.ranks,
            "files_per_rank": sc.files_per_rank,
            "samples_per_rank": plan.per_rank,
            "total_samples": plan.used,
            "dropped_samples": plan.dropped,
            "repeated_samples": plan.repeated,
            "remainder": sc.remainder,
            "total_tokens": sum(x["tokens"] for x in files),
            "shuffle_seed": sc.seed,
            "files": files,
        }
        write_text_atomic(staging / "mindformers_train_dataset.yaml", shard.mindformers_snippet(
            str(folder.resolve()), sc.layout, window, ["input_ids", "labels"] if labels else ["input_ids"],
            tok["eos_id"] if self.cfg.pack.mode != "pad" and self.cfg.tokenizer.add_eos else None))
        write_json_atomic(staging / "manifest.json", manifest)
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(staging, folder)  # rename the folder, never the MindRecord files
        return {
            "windows_in": total,
            "samples": plan.used,
            "samples_per_rank": plan.per_rank,
            "dropped_samples": plan.dropped,
            "repeated_samples": plan.repeated,
            "files": plan.files,
            "layout": sc.layout,
            "writer_setup_s": round(setup_s, 3),
            "task_seconds": task_seconds,
            "payload_bytes_per_sample": window * 4 * (2 if labels else 1),
            "write_s": round(write_s, 3),
            "tokens": manifest["total_tokens"],
            "bytes": sum(x["bytes"] for x in files),
        }


class _ProgressNote:
    """A line when a blocking step starts and its seconds when it ends (for steps with no task count)."""

    def __init__(self, log, label: str):
        self.log, self.label = log, label

    def __enter__(self):
        self.started = time.perf_counter()
        self.log(f"  {self.label} ...")
        self.heartbeat = Heartbeat(self.label, self.log).__enter__()  # a line every 30 s while it runs
        return self

    def __exit__(self, *exc):
        self.heartbeat.__exit__(*exc)
        if exc[0] is None:
            self.log(f"  {self.label}: done in {time.perf_counter() - self.started:.1f}s")
        return False


TOP_BOILERPLATE_LINES = 20  # the most frequent removed boilerplate lines the report lists, with their text


def _removed_examples(removed_dir: Path, text_dir: Path, per_reason: int = 3) -> dict:
    """A few removed documents per reason (every reason, from all parts), with the first 300
    characters of their text."""
    files = sorted(removed_dir.glob("*.parquet"))
    if not files:
        return {}
    removed = pd.concat([pq.read_table(str(f), columns=["uid", "id", "reason", "score"]).to_pandas() for f in files],
                        ignore_index=True)
    picked = removed.groupby("reason").head(per_reason)
    want = set(picked["uid"].tolist())
    texts: dict[int, str] = {}
    for f in sorted(text_dir.glob("part-*.parquet")):
        t = pq.read_table(f, columns=["uid", "text"])
        mask = pa.compute.is_in(t.column("uid"), value_set=pa.array(sorted(want), type=pa.int64()))
        for row in t.filter(mask).to_pylist():
            texts[row["uid"]] = row["text"][:300]
        if len(texts) == len(want):
            break
    out: dict = {}
    for row in picked.itertuples():
        out.setdefault(row.reason, []).append({"id": row.id, "score": row.score, "text": texts.get(int(row.uid), "")})
    return out


def _docs_summary(s: dict) -> str:
    removed = s.get("removed") or {}
    detail = ", ".join(f"{k} {v}" for k, v in sorted(removed.items()))
    return f"{s.get('docs_in', 0)} docs in -> {s.get('docs_out', 0)} out" + (f" (removed: {detail})" if detail else "")


def _token_summary(s: dict) -> str:
    return f"{s['docs_in']} docs -> {s['tokens']} tokens"


def _pack_summary(s: dict) -> str:
    return (f"{s['mode']}: {s['tokens_in']} tokens -> {s['windows']} windows; {s['docs_split']} docs split across windows, "
            f"{s['docs_truncated']} truncated; {s['tokens_dropped']} tokens dropped, {s['pad_tokens']} pad tokens "
            f"({100 * s['padding_share']:.1f}% padding)")


def _shard_summary(s: dict) -> str:
    return (f"{s['samples']} samples in {s['files']} files ({s['samples_per_rank']} per rank, "
            f"{s['dropped_samples']} dropped), {s['bytes'] / 1e6:.1f} MB")
