"""Near dedup phase: MinHash LSH candidate pairs, checked by the signatures' estimate and then (with
`dedup.minhash.verify`) by the exact Jaccard of the two shingle sets."""
from __future__ import annotations

from typing import Any, Optional

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
from dask import delayed

from corpusmill.stages import minhash, near_dedup

from ...step import PipelineError, StepContext
from .verify import exact_check

METHOD = 0  # edge method code: MinHash edges win over SimHash ones when both reach a document


def lsh_shape(ctx: StepContext) -> tuple[int, int]:
    """(bands, rows): the configured ones, or the recall-tuned choice for the threshold."""
    mc = ctx.cfg.dedup.minhash
    bands, rows = mc.bands, mc.rows
    if bands is None or rows is None:
        bands, rows = minhash.optimal_bands(mc.threshold, mc.num_perm, mc.verify)
    if bands * rows > mc.num_perm:
        raise PipelineError(f"dedup.minhash.bands x rows = {bands * rows} exceeds num_perm {mc.num_perm}")
    return bands, rows


def minhash_edges(ctx: StepContext, sig_paths: list[str], parts: list[str], spec: near_dedup.SignatureSpec,
                  stats: dict[str, Any]) -> Any:
    """Verified MinHash edges (a, b, similarity, method): a pandas frame when the driver held every
    step (within `dedup.components_memory_mb`), else a lazy Dask frame."""
    mc = ctx.cfg.dedup.minhash
    nparts = max(1, len(parts))
    budget = ctx.cfg.dedup.components_memory_mb << 20
    bands, rows = lsh_shape(ctx)
    ctx.log(f"  near_dedup: MinHash LSH, {bands} bands x {rows} rows (threshold {mc.threshold})")
    stats["minhash_bands"], stats["minhash_rows"] = bands, rows
    if bands * signature_rows(sig_paths) * LSH_ROW_BYTES <= budget:
        # every band key fits the driver: the same kernel over one frame holding every bucket, no shuffle
        frames = ctx.run([delayed(near_dedup.minhash_band_part)(p, bands, rows) for p in sig_paths],
                         "near_dedup: LSH band keys")
        cand = minhash.bucket_edges(pd.concat(frames, ignore_index=True))  # pandas: the driver goes on with it
    else:
        buckets = dd.from_map(near_dedup.minhash_band_part, sig_paths, bands=bands, rows=rows,
                              meta=minhash.BAND_META, enforce_metadata=False)
        cand = buckets.shuffle(on="band_key", npartitions=nparts).map_partitions(minhash.bucket_edges, meta=minhash.EDGE_META)
        cand = cand.shuffle(on="a", npartitions=nparts).map_partitions(lambda p: p.drop_duplicates(), meta=minhash.EDGE_META)
        cand = ctx.persist(cand, "near_dedup: LSH buckets -> candidate pairs (Dask shuffles)")
    n_cand = len(cand) if isinstance(cand, pd.DataFrame) else int(cand.map_partitions(len).compute().sum())
    threshold = mc.threshold if mc.verify else None
    # first the signatures' estimate; with verification on, only pairs it puts within 5 standard
    # deviations of the threshold go on to the exact check (a cheap filter that loses no true pair)
    floor = minhash.estimate_floor(threshold, mc.num_perm) if threshold is not None else None
    if n_cand * (8 * mc.num_perm + 16) <= budget:
        verified = _estimate_in_memory(ctx, cand, sig_paths, floor)
    else:
        if isinstance(cand, pd.DataFrame):
            cand = dd.from_pandas(cand, npartitions=1)
        verified = _estimate_distributed(ctx, cand, sig_paths, floor)
    if threshold is not None:
        verified = exact_check(ctx, verified, parts, spec, threshold, "minhash", n_cand, stats)
    stats["minhash_candidates"] = n_cand
    return verified.assign(method=np.int8(METHOD))


LSH_ROW_BYTES = 128  # one (band key, uid) row in the driver with the grouping's and pairing's temporaries


def signature_rows(sig_paths: list[str]) -> int:
    """Documents in the signature parts (from their Parquet footers)."""
    return sum(pq.ParquetFile(p).metadata.num_rows for p in sig_paths)


def _estimate_in_memory(ctx: StepContext, cand: Any, sig_paths: list[str], floor: Optional[float]) -> Any:
    """The signatures' Jaccard estimate of every candidate pair, in the driver (they fit the budget):
    a pandas frame."""
    pairs = cand if isinstance(cand, pd.DataFrame) else cand.compute()
    endpoints = np.unique(np.concatenate([pairs["a"].to_numpy(), pairs["b"].to_numpy()]))
    sigs = rows_for_uids(ctx, sig_paths, endpoints, ["uid", "minhash"], "near_dedup: fetch candidate signatures")
    uids, matrix = near_dedup.signature_lookup(sigs, "minhash")
    sim = minhash.signature_jaccard(near_dedup.lookup(uids, matrix, pairs["a"].to_numpy()),
                                    near_dedup.lookup(uids, matrix, pairs["b"].to_numpy()))
    verified = pd.DataFrame({"a": pairs["a"].to_numpy(), "b": pairs["b"].to_numpy(), "similarity": sim})
    if floor is not None:
        verified = verified[verified["similarity"] >= floor]
    return verified.reset_index(drop=True)


def _estimate_distributed(ctx: StepContext, cand: Any, sig_paths: list[str], floor: Optional[float]) -> Any:
    """The same estimate with both signatures joined onto the pairs on the workers."""
    sig_a = dd.from_map(near_dedup.load_signatures, sig_paths, fields=["uid", "minhash"],
                        rename={"uid": "a", "minhash": "sig_a"}, enforce_metadata=False)
    sig_b = dd.from_map(near_dedup.load_signatures, sig_paths, fields=["uid", "minhash"],
                        rename={"uid": "b", "minhash": "sig_b"}, enforce_metadata=False)
    joined = cand.merge(sig_a, on="a").merge(sig_b, on="b").map_partitions(
        near_dedup.verify_minhash_edges, floor, meta=near_dedup.VERIFIED_META)
    return ctx.persist(joined, "near_dedup: signature estimate of the candidate pairs")


def rows_for_uids(ctx: StepContext, sig_paths: list[str], uids: np.ndarray, fields: list[str], label: str) -> list:
    """The signature rows of the given documents, from every signature part."""
    uids_future = ctx.broadcast(np.sort(uids))
    return ctx.run([delayed(near_dedup.rows_for_uids)(p, uids_future, fields) for p in sig_paths], label)
