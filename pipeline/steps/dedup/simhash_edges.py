"""Near dedup phase: SimHash pairs within `max_distance` bits, found by the pigeonhole blocks
(k + 1 blocks: two fingerprints within k bits agree on at least one block)."""
from __future__ import annotations

from typing import Any

import dask.dataframe as dd
import numpy as np
import pandas as pd

from corpusmill.stages import near_dedup, simhash

from ...step import StepContext

METHOD = 1  # edge method code (MinHash's 0 wins when both reach a document)


def similarity(distance: Any) -> Any:
    """A SimHash pair's similarity: the share of its 64 bits the fingerprints agree on."""
    return 1.0 - distance / 64.0


def simhash_edges(ctx: StepContext, sig_paths: list[str], nparts: int) -> Any:
    """A lazy Dask frame of SimHash edges (a, b, similarity, method)."""
    sc = ctx.cfg.dedup.simhash
    k = sc.max_distance
    ctx.log(f"  near_dedup: SimHash, Hamming <= {k} via {k + 1} blocks")
    blocks = dd.from_map(near_dedup.simhash_block_part, sig_paths, max_distance=k,
                         meta=simhash.BLOCK_META, enforce_metadata=False)
    near = blocks.shuffle(on="block_key", npartitions=nparts).map_partitions(
        simhash.near_edges, k, sc.max_bucket, sc.window, meta=simhash.EDGE_META)
    near = near.shuffle(on="a", npartitions=nparts).map_partitions(
        lambda p: p.drop_duplicates(subset=["a", "b"]), meta=simhash.EDGE_META)
    return near.map_partitions(_as_edges, meta=near_dedup.VERIFIED_META.assign(method=np.int8(0)))


def _as_edges(p: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"a": p["a"].to_numpy(), "b": p["b"].to_numpy(),
                         "similarity": similarity(p["distance"].to_numpy()), "method": np.int8(METHOD)})
