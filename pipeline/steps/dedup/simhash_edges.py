"""Near dedup phase: SimHash pairs within `max_distance` bits, found by block-pair tables (k + 2
blocks: two fingerprints within k bits agree on at least two), then, with `dedup.simhash.verify`,
kept only when their true Jaccard reaches `dedup.minhash.threshold`."""
from __future__ import annotations

from typing import Any

import dask.dataframe as dd
import numpy as np
import pandas as pd
from dask import delayed

from corpusmill.stages import near_dedup, simhash

from ...step import StepContext
from .minhash_edges import signature_rows
from .verify import exact_check

TABLE_ROW_BYTES = 160  # one (key, uid, fingerprint) row in the driver with the grouping's and pairing's temporaries
METHOD = 1  # edge method code (MinHash's 0 wins when both reach a document)


def similarity(distance: Any) -> Any:
    """A SimHash pair's similarity: the share of its 64 bits the fingerprints agree on."""
    return 1.0 - distance / 64.0


def simhash_edges(ctx: StepContext, sig_paths: list[str], parts: list[str], spec: near_dedup.SignatureSpec,
                  stats: dict[str, Any]) -> Any:
    """SimHash edges (a, b, similarity, method): a pandas frame when the driver held every step, else
    a lazy Dask frame."""
    dc = ctx.cfg.dedup
    sc = dc.simhash
    k = sc.max_distance
    nparts = max(1, len(parts))
    n_tables = (k + 2) * (k + 1) // 2
    ctx.log(f"  near_dedup: SimHash, Hamming <= {k} via {n_tables} tables (pairs of {k + 2} blocks)")
    if n_tables * signature_rows(sig_paths) * TABLE_ROW_BYTES <= dc.components_memory_mb << 20:
        # every table row fits the driver: the same kernel over one frame holding every bucket, no shuffle
        frames = ctx.run([delayed(near_dedup.simhash_block_part)(p, k) for p in sig_paths], "near_dedup: SimHash table keys")
        near = simhash.near_edges(pd.concat(frames, ignore_index=True), k, sc.max_bucket, sc.window)
        if not sc.verify:
            return _as_edges(near)
        stats["simhash_candidates"] = len(near)
        # pandas: the exact check goes on with it in the driver (no Dask frame, no task to count it)
        verified = exact_check(ctx, near[["a", "b"]].reset_index(drop=True), parts, spec, dc.minhash.threshold,
                               "simhash", len(near), stats)
        return verified.assign(method=np.int8(METHOD))
    else:
        blocks = dd.from_map(near_dedup.simhash_block_part, sig_paths, max_distance=k,
                             meta=simhash.BLOCK_META, enforce_metadata=False)
        near = blocks.shuffle(on="block_key", npartitions=nparts).map_partitions(
            simhash.near_edges, k, sc.max_bucket, sc.window, meta=simhash.EDGE_META)
        near = near.shuffle(on="a", npartitions=nparts).map_partitions(
            lambda p: p.drop_duplicates(subset=["a", "b"]), meta=simhash.EDGE_META)
    if not sc.verify:
        return near.map_partitions(_as_edges, meta=near_dedup.VERIFIED_META.assign(method=np.int8(0)))
    near = ctx.persist(near, "near_dedup: SimHash tables -> candidate pairs (Dask shuffles)")
    n_cand = int(near.map_partitions(len).compute().sum())
    stats["simhash_candidates"] = n_cand
    if n_cand * 16 <= dc.components_memory_mb << 20:
        # one partition: the texts are then joined onto it without shuffling them (as MinHash's in-memory estimate)
        near = dd.from_pandas(near[["a", "b"]].compute().reset_index(drop=True), npartitions=1)
    verified = exact_check(ctx, near, parts, spec, dc.minhash.threshold, "simhash", n_cand, stats)
    return verified.assign(method=np.int8(METHOD))


def _as_edges(p: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"a": p["a"].to_numpy(), "b": p["b"].to_numpy(),
                         "similarity": similarity(p["distance"].to_numpy()), "method": np.int8(METHOD)})
