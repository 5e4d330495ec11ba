"""Connected components of duplicate edges: every component is labelled by its smallest uid.

In memory (scipy.sparse.csgraph) while the edge list fits a budget; beyond it, the alternating
large-star / small-star algorithm (Kiveris et al., "Connected Components in MapReduce and Beyond",
2014): the per-partition halves of each round are here, the shuffles that bring a node's edges
together are in pipeline/steps/dedup/clustering.py. Both return the same labelling.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

LABEL_META = pd.DataFrame({"uid": pd.Series(dtype="int64"), "root": pd.Series(dtype="int64")})
EDGE_META = pd.DataFrame({"u": pd.Series(dtype="int64"), "v": pd.Series(dtype="int64")})


def components_in_memory(a: np.ndarray, b: np.ndarray) -> pd.DataFrame:
    """(uid, root) for every node on an edge; root = the smallest uid of its component."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    if len(a) == 0:
        return LABEL_META.copy()
    nodes, inverse = np.unique(np.concatenate([a, b]), return_inverse=True)
    n = len(nodes)
    graph = coo_matrix((np.ones(len(a), dtype=np.int8), (inverse[: len(a)], inverse[len(a):])), shape=(n, n))
    _, labels = connected_components(graph, directed=False)
    # nodes are sorted, so the first node seen per label is its smallest uid
    first = np.full(labels.max() + 1, -1, dtype=np.int64)
    order = np.arange(n)[::-1]
    first[labels[order]] = order  # the last write per label is the smallest index
    return pd.DataFrame({"uid": nodes.astype(np.int64), "root": nodes[first[labels]].astype(np.int64)})


def large_star(part: pd.DataFrame) -> pd.DataFrame:
    """For each node u (all its neighbours are in this partition): link every larger neighbour to
    the smallest of u and its neighbours."""
    if part.empty:
        return EDGE_META.copy()
    m = np.minimum(part.groupby("u", sort=False)["v"].transform("min").to_numpy(), part["u"].to_numpy())
    v = part["v"].to_numpy()
    keep = v > part["u"].to_numpy()
    out = pd.DataFrame({"u": v[keep], "v": m[keep]})
    return out[out["u"] != out["v"]].drop_duplicates(ignore_index=True)


def small_star(part: pd.DataFrame) -> pd.DataFrame:
    """For each node u with its smaller-or-equal neighbours N: link u and every node of N to min(N)."""
    if part.empty:
        return EDGE_META.copy()
    m = part.groupby("u", sort=False)["v"].transform("min").to_numpy()
    u, v = part["u"].to_numpy(), part["v"].to_numpy()
    out = pd.DataFrame({"u": np.concatenate([v, u]), "v": np.concatenate([m, m])})
    return out[out["u"] != out["v"]].drop_duplicates(ignore_index=True)


def flipped(part: pd.DataFrame) -> pd.DataFrame:
    """Every edge the other way round (u, v) -> (v, u)."""
    return pd.DataFrame({"u": part["v"].to_numpy(), "v": part["u"].to_numpy()})


def larger_to_smaller(part: pd.DataFrame) -> pd.DataFrame:
    """Every edge pointing from its larger end to its smaller end."""
    return pd.DataFrame({"u": np.maximum(part["u"], part["v"]).to_numpy(), "v": np.minimum(part["u"], part["v"]).to_numpy()})


SIGNATURE_META = pd.DataFrame({"n": pd.Series(dtype=object), "s": pd.Series(dtype=object)})


def part_signature(p: pd.DataFrame) -> pd.DataFrame:
    """(edge count, order-independent hash) of one partition of edges: summed over partitions, equal
    for two rounds when a round changed nothing."""
    with np.errstate(over="ignore"):
        h = (p["u"].to_numpy().astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) ^ p["v"].to_numpy().astype(np.uint64)
        h = h * np.uint64(0xBF58476D1CE4E5B9)
    return pd.DataFrame({"n": [len(p)], "s": [int(h.sum(dtype=np.uint64))]}, dtype=object)
