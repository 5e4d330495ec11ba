"""Task bodies that run on Dask workers: map a batch stage over one Parquet part.

They live in an importable module (not in the driver script) so spawned workers can unpickle them
by reference; they know the file layout but nothing of what the stage function does.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from stages.base import DOC_SCHEMA, REMOVED_SCHEMA, BatchResult, write_table_atomic


def _as_table(data: Any, schema: pa.Schema) -> pa.Table:
    if isinstance(data, pa.Table):
        return data
    return pa.Table.from_pandas(data, schema=schema, preserve_index=False)


def run_batch_part(fn: Callable[..., Any], in_path: str, out_dir: str, reader: str, kwargs: dict) -> dict:
    """Read one part, apply `fn`, write kept rows to `out_dir/<name>` and removed to `out_dir/removed/`."""
    start = time.perf_counter()
    table = pq.read_table(in_path)
    data = table if reader == "arrow" else table.to_pandas(types_mapper=pd.ArrowDtype)
    result = fn(data, **kwargs)
    extra = None
    if isinstance(result, tuple):
        result, extra = result
    assert isinstance(result, BatchResult)
    name = Path(in_path).name
    write_table_atomic(_as_table(result.kept, DOC_SCHEMA), Path(out_dir) / name)
    if result.removed is not None and len(result.removed):
        write_table_atomic(_as_table(result.removed, REMOVED_SCHEMA), Path(out_dir) / "removed" / name)
    stats = dict(result.stats)
    stats["task_seconds"] = time.perf_counter() - start
    return {"stats": stats, "extra": extra, "part": name}


def read_part(path: str, columns: list[str]) -> pd.DataFrame:
    return pq.read_table(path, columns=columns).to_pandas(types_mapper=pd.ArrowDtype)


def sample_part(path: str, seed: int, rate: float, max_chars: int) -> list[str]:
    """A deterministic sample of texts: a document is chosen when a seeded hash of its uid is small."""
    import xxhash

    table = pq.read_table(path, columns=["uid", "text"])
    uids = table.column("uid").to_numpy()
    threshold = int(rate * (1 << 64))
    chosen = [i for i, u in enumerate(uids.tolist()) if xxhash.xxh3_64_intdigest(int(u).to_bytes(8, "little", signed=True), seed) < threshold]
    texts = table.column("text").take(pa.array(np.asarray(chosen, dtype=np.int64))).to_pylist()
    out, total = [], 0
    for t in texts:
        if total >= max_chars:
            break
        out.append(t)
        total += len(t)
    return out
