"""Near dedup phase: the candidate edges written once, then connected components over them, in
memory (scipy) while the edge list fits `dedup.components_memory_mb`, else the large-star /
small-star rounds on Dask (each round two shuffles on the node; the per-partition halves are the
kernels in `stages/components.py`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from corpusmill.stages import components
from corpusmill.stages.base import read_table, write_table_atomic

from ...step import StepContext

MAX_ROUNDS = 64


def write_edges(ctx: StepContext, edge_sets: list, folder: Path, stats: dict[str, Any]) -> list[str]:
    """All edges as `folder/part.N.parquet`; `stats["edges"]` counts them per method."""
    dc = ctx.cfg.dedup
    if all(isinstance(e, pd.DataFrame) for e in edge_sets):  # every method stayed in the driver: written here
        edges = pd.concat(edge_sets, ignore_index=True) if edge_sets else None
        if edges is not None:
            write_table_atomic(pa.Table.from_pandas(edges, preserve_index=False), folder / "part.0.parquet")
    else:
        edge_sets = [dd.from_pandas(e, npartitions=1) if isinstance(e, pd.DataFrame) else e for e in edge_sets]
        ctx.write_partitions(dd.concat(edge_sets), folder, "near_dedup: bucketing candidates (Dask shuffles)")
    files = sorted(str(p) for p in folder.glob("*.parquet"))
    for f in files:
        method = read_table(f, columns=["method"]).column("method").to_numpy()
        for code, name in ((0, "minhash"), (1, "simhash")):
            if getattr(dc, name).enabled:
                stats["edges"][name] = stats["edges"].get(name, 0) + int(np.sum(method == code))
    return files


def edge_count(files: list[str]) -> int:
    return sum(pq.ParquetFile(f).metadata.num_rows for f in files)


def cluster_in_memory(files: list[str]) -> Any:
    """(uid, root) for every document on an edge; root = the smallest uid of its component."""
    e = read_table(files, columns=["a", "b"]) if files else None
    return components.components_in_memory(
        e.column("a").to_numpy() if e is not None else np.empty(0, np.int64),
        e.column("b").to_numpy() if e is not None else np.empty(0, np.int64))


def cluster_distributed(ctx: StepContext, edges: Any) -> Any:
    """Dask edges (a, b) -> Dask (uid, root) labels, by alternating large- and small-star rounds.

    Each round is materialised (persist) so the graph stays short; it stops when a round leaves the
    edge set unchanged, at which point every edge points from a node to its root."""
    nparts = max(1, edges.npartitions)
    meta = components.EDGE_META
    # persisted without waiting: waiting here let a later round's graph lose this one's keys
    # ("lost dependencies" from a repartition dask-expr inserts); each round below is waited for
    current = edges.rename(columns={"a": "u", "b": "v"})[["u", "v"]].map_partitions(
        components.larger_to_smaller, meta=meta).persist()
    previous = None
    for round_no in range(1, MAX_ROUNDS + 1):
        both = dd.concat([current, current.map_partitions(components.flipped, meta=meta)])
        large = both.shuffle(on="u", npartitions=nparts).map_partitions(components.large_star, meta=meta)
        small = large.map_partitions(components.larger_to_smaller, meta=meta).shuffle(
            on="u", npartitions=nparts).map_partitions(components.small_star, meta=meta)
        current = ctx.persist(small.drop_duplicates(split_out=nparts), f"components: round {round_no}")
        sig = _signature(current)
        ctx.log(f"  components: round {round_no}: {sig[0]} edges")
        if sig == previous:
            break
        previous = sig
    else:
        raise RuntimeError(f"connected components did not converge in {MAX_ROUNDS} rounds")
    # converged: a star per component, every edge (u, v) with v the component's smallest uid
    labels = current.rename(columns={"u": "uid", "v": "root"})
    roots = current[["v"]].drop_duplicates(split_out=nparts).rename(columns={"v": "uid"})
    roots = roots.assign(root=roots["uid"])
    return dd.concat([labels, roots]).drop_duplicates(subset=["uid"], split_out=nparts)


def _signature(edges: Any) -> tuple[int, int]:
    """(count, order-independent hash) of an edge set: equal when a round changed nothing."""
    parts = edges.map_partitions(components.part_signature, meta=components.SIGNATURE_META).compute()
    return int(sum(parts["n"])), int(sum(parts["s"])) % (1 << 64)
