"""Near dedup phase: the true Jaccard of candidate pairs (MinHash or SimHash), from the two texts.

The threshold is on the shingle sets of `SignatureSpec.verify` (dedup.shingling with MinHash's
n-gram sizes: the space `dedup.minhash.threshold` is defined on), whichever method found the pair."""
from __future__ import annotations

from typing import Any

import dask.dataframe as dd
import numpy as np
import pandas as pd
from dask import delayed

from corpusmill.stages import near_dedup

from ...step import StepContext


def exact_check(ctx: StepContext, pairs: Any, parts: list[str], spec: near_dedup.SignatureSpec, threshold: float,
                method: str, n_cand: int, stats: dict[str, Any]) -> Any:
    """A lazy Dask frame (a, b, similarity) of the pairs whose true Jaccard reaches `threshold`,
    reading only the endpoints' texts (once, shared by both sides of the merge)."""
    plausible = pairs[["a", "b"]]
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
