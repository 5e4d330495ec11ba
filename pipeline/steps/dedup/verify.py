"""Near dedup phase: the true Jaccard of candidate pairs (MinHash or SimHash), from the two texts.

The threshold is on the shingle sets of `SignatureSpec.verify` (dedup.shingling with MinHash's
n-gram sizes: the space `dedup.minhash.threshold` is defined on), whichever method found the pair."""
from __future__ import annotations

import os
from typing import Any

import dask.dataframe as dd
import numpy as np
import pandas as pd
from dask import delayed

from corpusmill.stages import near_dedup

from ...step import TEXT_PER_PARQUET_BYTE, StepContext


def exact_check(ctx: StepContext, pairs: Any, parts: list[str], spec: near_dedup.SignatureSpec, threshold: float,
                method: str, n_cand: int, stats: dict[str, Any]) -> Any:
    """(a, b, similarity) of the pairs whose true Jaccard reaches `threshold`, reading only the endpoints'
    texts (once, shared by both sides of the merge): a pandas frame when `pairs` is one (found in the
    driver) and the texts fit the driver, else a lazy Dask frame."""
    plausible = pairs[["a", "b"]]
    if isinstance(plausible, pd.DataFrame):  # found in the driver: verified there too while the texts fit
        if _texts_fit(ctx, parts, plausible):
            return _exact_check_in_memory(ctx, plausible.reset_index(drop=True), parts, spec, threshold, method, n_cand, stats)
        plausible = dd.from_pandas(plausible.reset_index(drop=True), npartitions=1)
    elif plausible.npartitions == 1:  # the candidates are in memory already: verify without Dask merges
        local = plausible.compute()
        if _texts_fit(ctx, parts, local):
            return _exact_check_in_memory(ctx, local, parts, spec, threshold, method, n_cand, stats)
    ends = dd.concat([plausible[["a"]].rename(columns={"a": "u"}), plausible[["b"]].rename(columns={"b": "u"})])
    endpoints = np.unique(ctx.compute(ends["u"].unique(), f"near_dedup: {method} documents to verify").to_numpy()).astype(np.int64)
    ends_future = ctx.broadcast(endpoints)
    text_meta = pd.DataFrame({"uid": pd.Series(dtype="int64"), "text": pd.Series(dtype=object)})
    texts = dd.from_delayed([delayed(near_dedup.texts_for_uids)(p, ends_future, spec.normalize) for p in parts],
                            meta=text_meta, verify_meta=False)
    n_plausible = int(plausible.map_partitions(len).compute().sum())
    stats[f"{method}_exact_checks"] = n_plausible
    ctx.log(f"  near_dedup: {method}: {n_cand} candidate pairs, {n_plausible} within reach of the threshold: "
            f"verifying those by exact Jaccard ({len(endpoints)} documents)")
    return plausible.merge(texts.rename(columns={"uid": "a", "text": "text_a"}), on="a").merge(
        texts.rename(columns={"uid": "b", "text": "text_b"}), on="b").map_partitions(
        near_dedup.verify_exact_edges, spec.verify, threshold, meta=near_dedup.VERIFIED_META)


def _texts_fit(ctx: StepContext, parts: list[str], pairs: pd.DataFrame) -> bool:
    """Whether the endpoints' texts (estimated from the parts' mean document size) fit the driver's
    budget `dedup.components_memory_mb`."""
    import pyarrow.parquet as pq

    docs = sum(pq.ParquetFile(p).metadata.num_rows for p in parts)
    mean_bytes = sum(os.path.getsize(p) for p in parts) * TEXT_PER_PARQUET_BYTE / max(1, docs)
    endpoints = len(np.unique(np.concatenate([pairs["a"].to_numpy(), pairs["b"].to_numpy()])))
    return endpoints * mean_bytes * 4 <= ctx.cfg.dedup.components_memory_mb << 20


def _exact_check_in_memory(ctx: StepContext, pairs: pd.DataFrame, parts: list[str], spec: near_dedup.SignatureSpec,
                           threshold: float, method: str, n_cand: int, stats: dict[str, Any]) -> Any:
    """`exact_check` when the pairs and their texts fit the driver: the endpoints' texts are read once
    (one task per part), and the pairs are checked in one task per worker-sized chunk."""
    a, b = pairs["a"].to_numpy(), pairs["b"].to_numpy()
    endpoints = np.unique(np.concatenate([a, b])).astype(np.int64)
    stats[f"{method}_exact_checks"] = len(pairs)
    ctx.log(f"  near_dedup: {method}: {n_cand} candidate pairs, {len(pairs)} within reach of the threshold: "
            f"verifying those by exact Jaccard ({len(endpoints)} documents)")
    if not len(pairs):
        return near_dedup.VERIFIED_META.copy()
    ends_future = ctx.broadcast(endpoints)
    texts = pd.concat(ctx.run([delayed(near_dedup.texts_for_uids)(p, ends_future, spec.normalize) for p in parts],
                              f"near_dedup: {method} texts to verify"), ignore_index=True).sort_values("uid")
    # every worker gets the texts once; each task names its pairs by uid
    shared = ctx.broadcast((texts["uid"].to_numpy(), np.asarray(texts["text"].tolist(), dtype=object)))
    chunks = np.array_split(np.arange(len(pairs)), max(1, min(len(pairs) // 256, 2 * ctx.n_workers)))
    tasks = [delayed(near_dedup.verify_pairs_by_uid)(a[c], b[c], shared, spec.verify, threshold) for c in chunks if len(c)]
    return pd.concat(ctx.run(tasks, f"near_dedup: {method}: exact Jaccard"), ignore_index=True)
