"""export (the dedup job's last step): DIR/kept/ holds every kept document with every field the
input gave it, DIR/removed/ every removed duplicate with what it duplicates."""
from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
from dask import delayed

from corpusmill.stages.base import write_json_atomic, write_table_atomic, write_text_atomic

from ..executor import export_kept_part, export_removed_part, kept_field_kinds, kept_field_types
from ..rundir import EXPORT_KEPT, EXPORT_REMOVED
from ..step import Step, StepContext, StepResult

DEDUP_STEPS = ("exact_dedup", "near_dedup")


class ExportStep(Step):
    name = "export"
    resumable = False  # no folder of its own: always rewritten from the last document step
    counters = ("kept_files", "removed_files")

    def run(self, ctx: StepContext, folder: Path) -> StepResult:
        """A Parquet export decides each field's column type over all parts first."""
        kept_dir, removed_dir = ctx.rundir.file(EXPORT_KEPT), ctx.rundir.file(EXPORT_REMOVED)
        for d in (kept_dir, removed_dir):
            if d.exists():
                shutil.rmtree(d)
        kept_dir.mkdir(parents=True)
        parts = ctx.parts(self.reads)
        ic, fmt = ctx.cfg.input, ctx.export_format
        field_types = None
        if fmt == "parquet":
            kinds: dict[str, set] = {}
            for part_kinds in ctx.run([delayed(kept_field_kinds)(p) for p in parts], "export: field types"):
                for name, k in part_kinds.items():
                    kinds.setdefault(name, set()).update(k)
            field_types = kept_field_types(kinds)
            as_json = sorted(n for n, t in field_types.items() if t == "json")
            if as_json:
                ctx.log(f"  export: fields whose type changes between documents are kept as JSON text: {', '.join(as_json)}")
            write_json_atomic(kept_dir / "_fields.json", field_types)
        ctx.run([delayed(export_kept_part)(p, str(kept_dir), fmt, ic.text_field, ic.id_field, ic.source_field, field_types)
                 for p in parts], "export kept")
        removed_dir.mkdir(parents=True)
        n = 0
        for step in DEDUP_STEPS:
            for f in ctx.rundir.removed_files(step):
                export_removed_part(f, str(removed_dir / f"{step}-{n:05d}.{fmt}"), fmt)
                n += 1
        if not parts:  # one empty file with the columns, so readers of kept/ get an empty table, not an error
            names = [n for n in (ic.id_field, ic.text_field, ic.source_field) if n]
            empty = kept_dir / f"part-00000-000.{fmt}"
            if fmt == "jsonl":
                write_text_atomic(empty, "")
            else:
                write_table_atomic(pa.table({n: pa.array([], pa.string()) for n in names}), empty)
            ctx.log("[export] no document was kept (see the ledger): kept/ holds one empty file")
        ctx.log(f"[export] kept documents in {kept_dir} ({fmt}), removed in {removed_dir}")
        return StepResult({"kept_files": max(1, len(parts)), "removed_files": n})
