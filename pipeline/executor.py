"""Task bodies that run on Dask workers: map a batch stage over one Parquet part.

They live in an importable module (not in the driver script) so spawned workers can unpickle them
by reference; they know the file layout but nothing of what the stage function does.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from corpusmill.stages.base import DOC_SCHEMA, REMOVED_SCHEMA, BatchResult, read_rows, read_table, write_table_atomic, write_text_atomic


def _as_table(data: Any, schema: pa.Schema) -> pa.Table:
    if isinstance(data, pa.Table):
        return data
    return pa.Table.from_pandas(data, schema=schema, preserve_index=False)


def run_batch_part(fn: Callable[..., Any], in_path: str, out_dir: str, reader: str, kwargs: dict,
                   rows: Optional[tuple[int, int]] = None, name: Optional[str] = None, suffix: str = ".parquet",
                   columns: Optional[list[str]] = None) -> dict:
    """Read one part (or its rows [start, stop)), apply `fn`, write kept rows to `out_dir/<name>` and
    removed to `out_dir/removed/<name>`."""
    start = time.perf_counter()
    table = read_table(in_path, columns) if rows is None else read_rows(in_path, rows[0], rows[1], columns)
    data = table if reader == "arrow" else table.to_pandas(types_mapper=pd.ArrowDtype)
    result = fn(data, **kwargs)
    extra = None
    if isinstance(result, tuple):
        result, extra = result
    assert isinstance(result, BatchResult)
    name = name or Path(in_path).stem + suffix
    write_table_atomic(_as_table(result.kept, DOC_SCHEMA), Path(out_dir) / name)
    if result.removed is not None and len(result.removed):
        write_table_atomic(_as_table(result.removed, REMOVED_SCHEMA), Path(out_dir) / "removed" / (Path(name).stem + ".parquet"))
    stats = dict(result.stats)
    stats["task_seconds"] = time.perf_counter() - start
    return {"stats": stats, "extra": extra, "part": name}


def sample_part(path: str, seed: int, rate: float, max_chars: int, first_row_group_only: bool = False,
                max_docs: Optional[int] = None) -> list[str]:
    """A deterministic sample of texts: a document is chosen when a seeded hash of its uid is small.
    `first_row_group_only` reads one row group (about 4 MB) instead of the whole part; `max_docs`
    keeps only the documents with the smallest hashes (the tokenizer checks need a few hundred, and
    shipping a whole row group of text to the driver cost more than the checks themselves)."""
    import xxhash

    if first_row_group_only:
        table = pq.ParquetFile(path).read_row_group(0, columns=["uid", "text"])
    else:
        table = pq.read_table(path, columns=["uid", "text"])
    uids = table.column("uid").to_numpy()
    hashes = np.fromiter((xxhash.xxh3_64_intdigest(int(u).to_bytes(8, "little", signed=True), seed) for u in uids.tolist()),
                         dtype=np.uint64, count=len(uids))
    chosen = np.arange(len(uids)) if rate >= 1.0 else np.flatnonzero(hashes < np.uint64(int(rate * (1 << 64))))
    if max_docs is not None and len(chosen) > max_docs:
        chosen = np.sort(chosen[np.argsort(hashes[chosen], kind="stable")[:max_docs]])
    texts = table.column("text").take(pa.array(chosen.astype(np.int64))).to_pylist()
    out, total = [], 0
    for t in texts:
        if total >= max_chars:
            break
        out.append(t)
        total += len(t)
    return out


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


def kept_field_kinds(path: str) -> dict[str, list[str]]:
    """The JSON kinds each extra input field takes in one part (the first pass of a Parquet export:
    the column types of kept/ are decided over all parts, so every file has the same schema)."""
    import json

    kinds: dict[str, set] = {}
    for m in pq.read_table(path, columns=["meta"]).column("meta").to_pylist():
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
                     source_field: Optional[str], field_types: Optional[dict[str, str]] = None) -> int:
    """Write kept documents with every field the input gave them: id, text, source and each other
    field from meta. JSONL keeps every value as the input had it; Parquet uses `field_types`
    (from `kept_field_types`) so every part has the same schema."""
    import json

    table = pq.read_table(path)
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
                          "cluster_size", "similarity", "text"]


def export_removed_part(path: str, target: str, fmt: str = "parquet") -> int:
    """A removed-documents part as the dedup job presents it, in the job's format (`target` is
    written with the suffix .parquet or .jsonl): `duplicate_of` is the kept document's id, `text`
    the removed document's text (or its excerpt). Returns the rows written."""
    import json

    df = pq.read_table(path).to_pandas()
    out = pd.DataFrame({
        "uid": df["uid"], "id": df["id"], "source": df["source"], "reason": df["reason"],
        "duplicate_of": df["duplicate_of_id"], "duplicate_of_uid": df["duplicate_of"],
        "cluster_id": df["cluster_id"], "cluster_size": df["cluster_size"], "similarity": df["score"],
        "text": df["text"] if "text" in df else None,
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


def removed_texts(part: str, uids: np.ndarray, chars: Optional[int]) -> dict[int, Optional[str]]:
    """{uid: text cut to `chars`} for the documents of one stage part whose uid is in the sorted `uids`."""
    from corpusmill.stages.base import excerpt

    found = read_table(part, ["uid"]).column("uid").to_numpy()
    if not len(uids) or not len(found):
        return {}
    pos = np.minimum(np.searchsorted(uids, found), len(uids) - 1)
    hit = np.flatnonzero(uids[pos] == found)
    if not len(hit):
        return {}
    texts = read_table(part, ["text"]).column("text").take(pa.array(hit.astype(np.int64))).to_pylist()
    return dict(zip(found[hit].tolist(), excerpt(texts, chars)))


def attach_removed_text(path: str, texts: dict[int, Optional[str]]) -> None:
    """Rewrite one removed/ part with a `text` column (replacing an older one)."""
    table = pq.read_table(path)
    if "text" in table.column_names:
        table = table.drop(["text"])
    column = pa.array([texts.get(u) for u in table.column("uid").to_pylist()], pa.string())
    write_table_atomic(table.append_column("text", column), Path(path))
