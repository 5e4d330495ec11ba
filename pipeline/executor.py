"""Task bodies that run on Dask workers: map a kernel over one part, sample texts, find removed texts.

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

from corpusmill.stages.base import REMOVED_SCHEMA, BatchResult, doc_schema, read_rows, read_table, write_table_atomic


def _as_table(data: Any, schema: Optional[pa.Schema]) -> pa.Table:
    """A kernel's frame as a table of `schema`; a nullable column the frame lacks (a part written
    before the column existed, a kernel that builds its frame anew) is written as nulls."""
    if isinstance(data, pa.Table):
        return data
    missing = [f.name for f in schema if f.name not in data.columns and f.nullable]
    if missing:
        data = data.assign(**{name: None for name in missing})
    return pa.Table.from_pandas(data, schema=schema, preserve_index=False)


def run_batch_part(fn: Callable[..., Any], in_path: str, out_dir: str, reader: str, kwargs: dict,
                   rows: Optional[tuple[int, int]] = None, name: Optional[str] = None, suffix: str = ".parquet",
                   columns: Optional[list[str]] = None) -> dict:
    """Read one part (or its rows [start, stop)), apply `fn`, write kept rows to `out_dir/<name>` and
    removed to `out_dir/removed/<name>`."""
    start, cpu = time.perf_counter(), time.process_time()
    table = read_table(in_path, columns) if rows is None else read_rows(in_path, rows[0], rows[1], columns)
    data = table if reader == "arrow" else table.to_pandas(types_mapper=pd.ArrowDtype)
    result = fn(data, **kwargs)
    extra = None
    if isinstance(result, tuple):
        result, extra = result
    assert isinstance(result, BatchResult)
    name = name or Path(in_path).stem + suffix
    kept_schema = doc_schema(result.kept.columns) if isinstance(result.kept, pd.DataFrame) else None
    write_table_atomic(_as_table(result.kept, kept_schema), Path(out_dir) / name)  # optional columns kept (quality_bucket)
    if result.removed is not None and len(result.removed):
        write_table_atomic(_as_table(result.removed, REMOVED_SCHEMA), Path(out_dir) / "removed" / (Path(name).stem + ".parquet"))
    files = [name]
    if result.removed is not None and len(result.removed):
        files.append(f"removed/{Path(name).stem}.parquet")
    stats = dict(result.stats)
    if "by_group" not in stats and isinstance(result.kept, pd.DataFrame) and {"source", "language", "text"} <= set(result.kept):
        stats["by_group"] = kept_groups(result.kept)  # what a document step passes on, per source and language
    stats["task_seconds"] = time.perf_counter() - start
    stats["task_cpu_s"] = time.process_time() - cpu  # the worker's CPU (benchmarks compare it under load)
    return {"stats": stats, "extra": extra, "part": name, "files": files}


def kept_groups(df: pd.DataFrame) -> dict:
    """`stages.composition.group_counts` (documents and characters) of a document frame."""
    import pyarrow.compute as pc

    from corpusmill.stages.composition import group_counts

    text = df["text"].array
    arrow = text._pa_array if hasattr(text, "_pa_array") else pa.array(df["text"].tolist(), pa.string())
    chars = pc.fill_null(pc.utf8_length(arrow), 0).to_numpy() if len(df) else np.empty(0, np.int64)
    return group_counts(df["source"].tolist(), df["language"].tolist(), chars=chars)


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
        table = read_table(path, columns=["uid", "text"])
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
    table = read_table(path)
    if "text" in table.column_names:
        table = table.drop(["text"])
    column = pa.array([texts.get(u) for u in table.column("uid").to_pylist()], pa.string())
    write_table_atomic(table.append_column("text", column), Path(path))
