"""paragraph_dedup: paragraphs (lines) repeated across documents are removed from all but the first
(`stages.paragraph_dedup`). Three rounds of tasks, no shuffle and no process holding the corpus's
pairs: each part writes its (paragraph hash, uid) pairs to a file cut into hash-range buckets by the
top bits; one task per range of buckets reads that range from every file and writes the rows to
remove (sorted by part); each part then reads its own rows and drops its repeated paragraphs. The
driver holds the files' cut points and the few examples. A document left (almost) empty is removed
whole (reason paragraph_dedup_empty, its audit row naming the keeper of its first removed paragraph);
the others stay, counted in `paragraphs_removed` / `paragraph_chars_removed` and the step's stats."""
from __future__ import annotations

import math
import os
import shutil
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pyarrow as pa
from dask import delayed

from corpusmill.stages import near_dedup
from corpusmill.stages import paragraph_dedup as kernel
from corpusmill.stages.base import REMOVED_SCHEMA, merge_stats, read_table, write_table_atomic

from ...config import Config
from ...executor import run_batch_part
from ...ledger import DUPLICATES
from ...step import DOCUMENT_COUNTERS, DocumentStep, StepContext, StepResult, TEXT_PER_PARQUET_BYTE

ROWS_PER_FINE_BUCKET = 1 << 20  # pairs a file's bucket holds, estimated from the input's size (16 MiB)
ROWS_PER_RANGE = 1 << 22  # pairs one range task holds (64 MiB, about 4x that while it sorts)
BYTES_PER_PARAGRAPH = 40  # a conservative mean size of an eligible paragraph, for the estimate


class ParagraphDedupStep(DocumentStep):
    name = "paragraph_dedup"
    removes = DUPLICATES
    config_reads = ("dedup",)  # dedup.paragraph and audit_text_chars: hash_extra
    counters = DOCUMENT_COUNTERS + ("paragraphs_removed", "chars_removed", "docs_touched", "repeated_paragraphs")
    outputs = {"examples": list}

    def hash_extra(self, cfg: Config, previous: Optional[str]) -> Any:
        """Its own settings (not the whole dedup section: a paragraph setting reruns only this step)
        and the audit text length of its removed rows."""
        return [previous, "paragraph", cfg.dedup.paragraph.model_dump(mode="json"), cfg.dedup.audit_text_chars]

    def summary(self, s: dict[str, Any]) -> str:
        return (f"{super().summary(s)}; {s.get('paragraphs_removed', 0)} repeated paragraphs "
                f"({s.get('chars_removed', 0)} characters) removed from {s.get('docs_touched', 0)} documents")

    def run(self, ctx: StepContext, folder: Path) -> StepResult:
        pc = ctx.cfg.dedup.paragraph
        started = time.perf_counter()
        parts = ctx.parts(self.reads)
        work = folder / "_pairs"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        bits = fine_bits(parts)
        files = [str(work / f"{i:06d}.npy") for i in range(len(parts))]
        counted = ctx.run([delayed(kernel.pairs_to_file)(p, pc.min_chars, bits, f) for p, f in zip(parts, files)],
                          "paragraph_dedup: paragraph hashes per part")
        cuts = np.array([c["cuts"] for c in counted], dtype=np.int64).reshape(len(parts), (1 << bits) + 1)
        ranges = bucket_ranges(cuts, ctx.n_workers)
        outs = [str(work / f"range-{j:05d}.npy") for j in range(len(ranges))]
        found = ctx.run([delayed(kernel.repeated_in_buckets)(files, cuts[:, [a, b]], pc.min_docs, o, pc.examples)
                         for (a, b), o in zip(ranges, outs)], "paragraph_dedup: repeated paragraphs per hash range")
        part_cuts = np.array([r["part_cuts"] for r in found], dtype=np.int64).reshape(len(ranges), len(parts) + 1)
        top = _top([r["top"] for r in found], pc.examples)
        example_hashes = np.array([t[0] for t in top], dtype=np.int64)
        chars = ctx.cfg.dedup.audit_text_chars
        tasks = [delayed(run_batch_part)(kernel.remove_part, p, str(folder), "arrow",
                                         {"files": outs, "cuts": part_cuts[:, [i, i + 1]], "min_chars": pc.min_chars,
                                          "min_doc_chars_left": pc.min_doc_chars_left, "audit_chars": chars,
                                          "example_hashes": example_hashes})
                 for i, p in enumerate(parts)]
        stats: dict[str, Any] = {}
        named: dict[str, list] = {}
        for r in ctx.run(tasks, "paragraph_dedup: remove repeated paragraphs"):
            merge_stats(stats, r["stats"])
            for h, (text, n) in (r["extra"] or {}).items():
                named.setdefault(h, [text, 0])[1] += n
        shutil.rmtree(work, ignore_errors=True)
        for key, empty in (("docs_in", 0), ("docs_out", 0), ("removed", {}), ("paragraphs_removed", 0),
                           ("chars_removed", 0), ("docs_touched", 0), ("docs_emptied", 0)):
            stats.setdefault(key, empty)
        stats.update(paragraphs=sum(c["paragraphs"] for c in counted), eligible_paragraphs=sum(c["eligible"] for c in counted),
                     pairs=sum(c["pairs"] for c in counted), repeated_paragraphs=sum(r["repeated"] for r in found),
                     hash_buckets=1 << bits, hash_ranges=len(ranges))
        stats["by_source"] = dict(sorted((stats.get("by_source") or {}).items()))
        ids = _fill_keeper_ids(ctx, folder, parts, [t[1] for t in top])
        examples = [{"text": named.get(str(h), ["", 0])[0], "documents": int(d), "removed": int(named.get(str(h), ["", 0])[1]),
                     "keeper_id": ids.get(int(k))} for h, k, d in top]
        seconds = time.perf_counter() - started
        mb = sum(os.path.getsize(p) for p in parts) * TEXT_PER_PARQUET_BYTE / 2**20
        ctx.log(f"  paragraph_dedup: {stats['repeated_paragraphs']} repeated paragraphs in {stats['pairs']} (paragraph, "
                f"document) pairs; {stats['paragraphs_removed']} removed from {stats['docs_touched']} documents, "
                f"{stats.get('docs_emptied', 0)} documents emptied (about {mb / max(seconds, 1e-9):.1f} MB/s of text)")
        return StepResult(stats, {"examples": examples} if examples else {})


def fine_bits(parts: list[str]) -> int:
    """Bits of the hash-range buckets a part's pairs file is cut into: enough that one holds about
    ROWS_PER_FINE_BUCKET pairs of the whole corpus (estimated from the parts' sizes), 16 to 4096."""
    text = sum(os.path.getsize(p) for p in parts) * TEXT_PER_PARQUET_BYTE
    rows = text / BYTES_PER_PARAGRAPH
    return int(min(kernel.FINE_BITS_MAX, max(4, math.ceil(math.log2(max(1.0, rows / ROWS_PER_FINE_BUCKET))))))


def bucket_ranges(cuts: np.ndarray, n_workers: int) -> list[tuple[int, int]]:
    """Contiguous ranges of buckets [a, b) for the range tasks: each about ROWS_PER_RANGE pairs (the
    real counts, from the files' cuts), and at least two per worker when there are pairs to spread."""
    per_bucket = (cuts[:, 1:] - cuts[:, :-1]).sum(axis=0) if len(cuts) else np.zeros(cuts.shape[1] - 1, np.int64)
    total = int(per_bucket.sum())
    target = max(1, min(ROWS_PER_RANGE, math.ceil(total / max(1, 2 * n_workers))))
    ranges, start, held = [], 0, 0
    for b, n in enumerate(per_bucket.tolist()):
        held += n
        if held >= target:
            ranges.append((start, b + 1))
            start, held = b + 1, 0
    if start < len(per_bucket) or not ranges:
        ranges.append((start, len(per_bucket)))
    return ranges


def _top(found: list[list], n: int) -> list[tuple[int, int, int]]:
    """The `n` most widespread repeated paragraphs of every range, (hash, keeper uid, documents)."""
    rows = [tuple(int(x) for x in t) for f in found for t in f]
    return sorted(rows, key=lambda t: (-t[2], t[0]))[:n]


def _fill_keeper_ids(ctx: StepContext, folder: Path, parts: list[str], extra_uids: list[int]) -> dict[int, Optional[str]]:
    """The removed rows' duplicate_of_id (the keeper's id, looked up in the step's input, a part per
    task, for those uids only; the rows are rewritten a file at a time). Returns {uid: id} of the
    keepers, `extra_uids` (the examples' keepers) included."""
    files = sorted(str(p) for p in (folder / "removed").glob("*.parquet"))
    keepers = [read_table(f, columns=["duplicate_of"]).column("duplicate_of").to_numpy() for f in files]
    want = np.unique(np.concatenate(keepers + [np.asarray(extra_uids, np.int64)])).astype(np.int64)
    if not len(want):
        return {}
    future = ctx.broadcast(want)
    ids: dict[int, Optional[str]] = {}
    for frame in ctx.run([delayed(near_dedup.rows_for_uids)(p, future, ["uid", "id"]) for p in parts],
                         "paragraph_dedup: the keepers' ids"):
        ids.update(zip(frame["uid"].tolist(), frame["id"].tolist()))
    for f in files:
        table = read_table(f)
        of = pa.array([ids.get(u) for u in table.column("duplicate_of").to_pylist()], pa.string())
        table = table.set_column(table.column_names.index("duplicate_of_id"), "duplicate_of_id", of)
        write_table_atomic(table.cast(REMOVED_SCHEMA), Path(f))
    return ids
