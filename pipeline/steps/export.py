"""export (the dedup job's last step): DIR/kept/ holds every kept document with every field the
input gave it, DIR/removed/ every removed duplicate with what it duplicates. The one owner of that
format: the step and the task bodies its workers run (by reference, so they live in this module)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pandas as pd
import pyarrow as pa
from dask import delayed

from corpusmill.stages.base import excerpt, in_sorted, write_json_atomic, write_table_atomic, write_text_atomic

from ..rundir import EXPORT_KEPT, EXPORT_REMOVED
from ..step import Step, StepContext, StepResult
from corpusmill.stages.base import read_table

DEDUP_STEPS = ("reference_dedup", "exact_dedup", "near_dedup")
DEFERRED_STEPS = ("exact_dedup", "near_dedup")  # the steps whose removal a dedup job leaves to the export


class ExportStep(Step):
    name = "export"
    uses = DEDUP_STEPS  # their removed rows: the export's audit and, with removal deferred, what it drops
    config_reads = ("dedup", "input")  # not resumable: it runs every time
    resumable = False  # no folder of its own: always rewritten from the last document step
    counters = ("kept_files", "removed_files")

    def __init__(self, reads: str, parts_from: Optional[str] = None):
        super().__init__(reads)
        # the dedup steps left their removal to this pass (the plan sets it): the kept documents are the
        # parts of `parts_from` less every document exact and near dedup removed, written once, straight
        # to the export format, and the audit rows get the removed texts in the same pass
        self.parts_from = parts_from

    def reads_steps(self) -> set[str]:
        return super().reads_steps() | ({self.parts_from} if self.parts_from else set())

    def run(self, ctx: StepContext, folder: Path) -> StepResult:
        """A Parquet export decides each field's column type over all parts first."""
        from .dedup.removal import removed_uids

        kept_dir, removed_dir = ctx.rundir.file(EXPORT_KEPT), ctx.rundir.file(EXPORT_REMOVED)
        for d in (kept_dir, removed_dir):
            if d.exists():
                shutil.rmtree(d)
        kept_dir.mkdir(parents=True)
        parts = ctx.parts(self.parts_from or self.reads)
        ic, fmt = ctx.cfg.input, ctx.export_format
        drop: Any = None
        audit = [f for step in DEFERRED_STEPS for f in ctx.removed_files(step)] if self.parts_from else []
        if self.parts_from:
            found = removed_uids(audit)
            drop = ctx.broadcast(found) if len(found) else None
        field_types = None
        if fmt == "parquet":
            kinds: dict[str, set] = {}
            for part_kinds in ctx.run([delayed(kept_field_kinds)(p, drop) for p in parts], "export: field types"):
                for name, k in part_kinds.items():
                    kinds.setdefault(name, set()).update(k)
            field_types = kept_field_types(kinds)
            as_json = sorted(n for n, t in field_types.items() if t == "json")
            if as_json:
                ctx.log(f"  export: fields whose type changes between documents are kept as JSON text: {', '.join(as_json)}")
            write_json_atomic(kept_dir / "_fields.json", field_types)
        chars = ctx.cfg.dedup.audit_text_chars if audit else 0
        results = ctx.run([delayed(export_kept_part)(p, str(kept_dir), fmt, ic.text_field, ic.id_field, ic.source_field,
                                                     field_types, drop, chars) for p in parts],
                          "export kept" + (" (the dedup steps' one removal pass)" if self.parts_from else ""))
        if chars != 0 and audit and drop is not None:
            from ..executor import attach_removed_text

            texts: dict = {}
            for r in results:
                texts.update(r[1])
            for f in audit:
                attach_removed_text(f, texts)
        removed_dir.mkdir(parents=True)
        n = 0
        for step in DEDUP_STEPS:
            for f in ctx.removed_files(step):
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


# ---- task bodies (run on the workers) ------------------------------------------------------
def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        if not -(1 << 63) <= value < (1 << 63):
            return "bigint"
        # beside floats an int becomes a double, which holds integers exactly only up to 2**53
        return "int" if -(1 << 53) <= value <= (1 << 53) else "int64"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    return "list" if isinstance(value, list) else "dict"


def _kept_rows(table: pa.Table, drop_sorted: Optional[np.ndarray]) -> np.ndarray:
    """Which rows of a part are kept: those whose uid is not in `drop_sorted` (None: every row)."""
    uids = table.column("uid").to_numpy()
    return np.ones(len(uids), dtype=bool) if drop_sorted is None else ~in_sorted(uids, drop_sorted)


def kept_field_kinds(path: str, drop_sorted: Optional[np.ndarray] = None) -> dict[str, list[str]]:
    """The JSON kinds each extra input field takes in one part (the first pass of a Parquet export:
    the column types of kept/ are decided over all parts, so every file has the same schema); only
    of the kept documents when the part still holds the removed ones (`drop_sorted`)."""
    kinds: dict[str, set] = {}
    table = read_table(path, columns=["uid", "meta"])
    table = table.filter(pa.array(_kept_rows(table, drop_sorted)))
    for m in table.column("meta").to_pylist():
        if m:
            for name, value in json.loads(m).items():
                kinds.setdefault(name, set()).add(_json_kind(value))
    return {name: sorted(k) for name, k in kinds.items()}


_ARROW_OF_KINDS = {frozenset({"str"}): pa.string(), frozenset({"int"}): pa.int64(), frozenset({"int64"}): pa.int64(),
                   frozenset({"int", "int64"}): pa.int64(), frozenset({"float"}): pa.float64(),
                   frozenset({"int", "float"}): pa.float64(), frozenset({"bool"}): pa.bool_()}


def kept_field_types(kinds: dict[str, set]) -> dict[str, str]:
    """One Parquet type per extra field: its own type when every document agrees (nulls allowed),
    otherwise `json` (the value as JSON text), so a field whose type changes is kept, never dropped."""
    types = {}
    for name, k in sorted(kinds.items()):
        arrow = _ARROW_OF_KINDS.get(frozenset(set(k) - {"null"}))
        types[name] = str(arrow) if arrow is not None else ("string" if set(k) == {"null"} else "json")
    return types


def export_kept_part(path: str, out_dir: str, fmt: str, text_field: str, id_field: Optional[str],
                     source_field: Optional[str], field_types: Optional[dict[str, str]] = None,
                     drop_sorted: Optional[np.ndarray] = None, excerpt_chars: Optional[int] = 0) -> Any:
    """Write kept documents with every field the input gave them: id, text, source and each other
    field from meta. JSONL keeps every value as the input had it; Parquet uses `field_types`
    (from `kept_field_types`) so every part has the same schema. With `drop_sorted` (the dedup
    steps' removal left to this pass) the part's documents with those uids are left out, and with
    `excerpt_chars` not 0 returns (rows, {uid: text excerpt} of those left out) for the audit rows."""
    table = read_table(path)
    if drop_sorted is not None:
        keep = _kept_rows(table, drop_sorted)
        gone = table.filter(pa.array(~keep))
        table = table.filter(pa.array(keep))
        rows = _write_kept(table, path, out_dir, fmt, text_field, id_field, source_field, field_types)
        if excerpt_chars == 0:
            return rows
        return rows, dict(zip(gone.column("uid").to_pylist(), excerpt(gone.column("text").to_pylist(), excerpt_chars)))
    return _write_kept(table, path, out_dir, fmt, text_field, id_field, source_field, field_types)


def _write_kept(table: pa.Table, path: str, out_dir: str, fmt: str, text_field: str, id_field: Optional[str],
                source_field: Optional[str], field_types: Optional[dict[str, str]]) -> int:
    fixed: dict[str, pa.Array] = {}
    if id_field:
        fixed[id_field] = table.column("id")
    fixed[text_field] = table.column("text")
    if source_field:
        fixed[source_field] = table.column("source")
    metas = [json.loads(m) if m else {} for m in table.column("meta").to_pylist()]
    stem = Path(path).stem
    if fmt == "jsonl":
        columns = {name: col.to_pylist() for name, col in fixed.items()}
        lines = []
        for i, meta in enumerate(metas):
            rec = {name: values[i] for name, values in columns.items()}
            rec.update((k, v) for k, v in meta.items() if k not in rec)
            lines.append(json.dumps(rec, ensure_ascii=False) + "\n")
        write_text_atomic(Path(out_dir) / f"{stem}.jsonl", "".join(lines))
        return len(metas)
    arrays = dict(fixed)
    for name, kind in (field_types or {}).items():
        if name in arrays:
            continue
        values = [m.get(name) for m in metas]
        if kind == "json":
            arrays[name] = pa.array([None if v is None else json.dumps(v, ensure_ascii=False) for v in values], pa.string())
        else:
            arrays[name] = pa.array(values, type=pa.type_for_alias(kind))
    write_table_atomic(pa.table(arrays), Path(out_dir) / f"{stem}.parquet")
    return table.num_rows


REMOVED_EXPORT_COLUMNS = ["uid", "id", "source", "reason", "duplicate_of", "duplicate_of_uid", "cluster_id",
                          "cluster_size", "similarity", "threshold", "text"]


def export_removed_part(path: str, target: str, fmt: str = "parquet") -> int:
    """A removed-documents part as the dedup job presents it, in the job's format (`target` is
    written with the suffix .parquet or .jsonl): `duplicate_of` is the kept document's id, `text`
    the removed document's text (or its excerpt), `similarity` its Jaccard (or SimHash) similarity to
    that document and `threshold` the bar it passed (1.0: exact). Returns the rows written."""
    df = read_table(path).to_pandas()
    out = pd.DataFrame({
        "uid": df["uid"], "id": df["id"], "source": df["source"], "reason": df["reason"],
        "duplicate_of": df["duplicate_of_id"], "duplicate_of_uid": df["duplicate_of"],
        "cluster_id": df["cluster_id"], "cluster_size": df["cluster_size"], "similarity": df["score"],
        "threshold": df["threshold"] if "threshold" in df else None, "text": df["text"] if "text" in df else None,
    })[REMOVED_EXPORT_COLUMNS]
    target_path = Path(target).with_suffix("." + fmt)
    if fmt == "jsonl":
        rows = out.astype(object).where(out.notna(), None).to_dict("records")
        write_text_atomic(target_path, "".join(json.dumps({k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()},
                                                          ensure_ascii=False) + "\n" for r in rows))
    else:
        table = pa.Table.from_pandas(out.astype({"text": "string"}), preserve_index=False)
        write_table_atomic(table, target_path)
    return len(out)
