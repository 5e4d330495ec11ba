"""Connected components of duplicate edges: every component is labelled by its smallest uid.

In memory (scipy.sparse.csgraph) while the edge list fits a budget; beyond it, the alternating
large-star / small-star algorithm (Kiveris et al., "Connected Components in MapReduce and Beyond",
2014) on Dask DataFrames, where each step is one shuffle on the node plus vectorised pandas work per
partition. Both return the same labelling.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

LABEL_META = pd.DataFrame({"uid": pd.Series(dtype="int64"), "root": pd.Series(dtype="int64")})
_EDGE_META = pd.DataFrame({"u": pd.Series(dtype="int64"), "v": pd.Series(dtype="int64")})


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


def _large_star(part: pd.DataFrame) -> pd.DataFrame:
    """For each node u (all its neighbours are in this partition): link every larger neighbour to
    the smallest of u and its neighbours."""
    if part.empty:
        return _EDGE_META.copy()
    m = np.minimum(part.groupby("u", sort=False)["v"].transform("min").to_numpy(), part["u"].to_numpy())
    v = part["v"].to_numpy()
    keep = v > part["u"].to_numpy()
    out = pd.DataFrame({"u": v[keep], "v": m[keep]})
    return out[out["u"] != out["v"]].drop_duplicates(ignore_index=True)


def _small_star(part: pd.DataFrame) -> pd.DataFrame:
    """For each node u with its smaller-or-equal neighbours N: link u and every node of N to min(N)."""
    if part.empty:
        return _EDGE_META.copy()
    m = part.groupby("u", sort=False)["v"].transform("min").to_numpy()
    u, v = part["u"].to_numpy(), part["v"].to_numpy()
    out = pd.DataFrame({"u": np.concatenate([v, u]), "v": np.concatenate([m, m])})
    return out[out["u"] != out["v"]].drop_duplicates(ignore_index=True)


def _both_directions(edges):
    flipped = edges.map_partitions(lambda p: pd.DataFrame({"u": p["v"].to_numpy(), "v": p["u"].to_numpy()}), meta=_EDGE_META)
    import dask.dataframe as dd

    return dd.concat([edges, flipped])


def _larger_to_smaller(edges):
    return edges.map_partitions(
        lambda p: pd.DataFrame({"u": np.maximum(p["u"], p["v"]).to_numpy(), "v": np.minimum(p["u"], p["v"]).to_numpy()}),
        meta=_EDGE_META,
    )


def _part_signature(p: pd.DataFrame) -> pd.DataFrame:
    with np.errstate(over="ignore"):
        h = (p["u"].to_numpy().astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) ^ p["v"].to_numpy().astype(np.uint64)
        h = h * np.uint64(0xBF58476D1CE4E5B9)
    return pd.DataFrame({"n": [len(p)], "s": [int(h.sum(dtype=np.uint64))]}, dtype=object)


def _edge_set_signature(edges) -> tuple[int, int]:
    """(count, order-independent hash) of an edge set: equal when a round changed nothing."""
    parts = edges.map_partitions(_part_signature, meta=pd.DataFrame({"n": pd.Series(dtype=object), "s": pd.Series(dtype=object)})).compute()
    return int(sum(parts["n"])), int(sum(parts["s"])) % (1 << 64)


def components_distributed(edges, max_rounds: int = 64, log=None) -> "object":
    """Dask edges (columns a, b) -> Dask (uid, root) labels, by alternating large- and small-star.

    Each round materialises the edge list (persist) so the graph stays short; it stops when a
    round leaves the edge set unchanged, at which point every edge points from a node to its root.
    """
    nparts = max(1, edges.npartitions)
    current = _larger_to_smaller(edges.rename(columns={"a": "u", "b": "v"})[["u", "v"]]).persist()
    previous_sig = None
    for round_no in range(1, max_rounds + 1):
        large = _both_directions(current).shuffle(on="u", npartitions=nparts).map_partitions(_large_star, meta=_EDGE_META)
        small = _larger_to_smaller(large).shuffle(on="u", npartitions=nparts).map_partitions(_small_star, meta=_EDGE_META)
        current = small.drop_duplicates(split_out=nparts).persist()
        sig = _edge_set_signature(current)
        if log:
            log(f"  components: round {round_no}: {sig[0]} edges")
        if sig == previous_sig:
            break
        previous_sig = sig
    else:
        raise RuntimeError(f"connected components did not converge in {max_rounds} rounds")
    # converged: a star per component, every edge (u, v) with v the component's smallest uid
    labels = current.rename(columns={"u": "uid", "v": "root"})
    roots = current[["v"]].drop_duplicates(split_out=nparts).rename(columns={"v": "uid"})
    roots = roots.assign(root=roots["uid"])
    import dask.dataframe as dd

    return dd.concat([labels, roots]).drop_duplicates(subset=["uid"], split_out=nparts)
