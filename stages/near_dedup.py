"""Near-duplicate removal: per-partition signatures, and the choice of the document a cluster keeps.

The steps in pipeline/steps/dedup/ wire these with Dask: signatures per part, LSH/SimHash buckets
through shuffles, connected components, then `choose_keepers` per cluster. Finding duplicates is kept
apart from removing them (one removal pass, `exact_dedup.drop_uids_table`, drops exact and near duplicates).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.parquet as pq

from . import exact_dedup, minhash, simhash, sketch
from .base import REMOVED_META, in_sorted, one_array, read_table, write_table_atomic
from .normalize import normalize_array
from .shingles import ShingleSpec, same_components, shingle_hashes, shingle_hashes_multi


@dataclass(frozen=True)
class SignatureSpec:
    minhash: Optional[ShingleSpec]  # None: MinHash disabled
    num_perm: int
    seed: int
    simhash: Optional[ShingleSpec]  # None: SimHash disabled
    verify: Optional[ShingleSpec] = None  # the space of the Jaccard threshold (exact checks of either method)
    keep_field: Optional[str] = None
    normalize: Optional[dict] = None  # normalise before shingling (when the stored text is the original)
    exact: bool = False  # also the exact-dedup hash (h_hi, h_lo) of the normalised text: one pass for both steps

    def near(self) -> "SignatureSpec":
        """The spec without the exact hash: what near dedup's own signatures depend on."""
        return dataclasses.replace(self, exact=False)


def signature_part(in_path: str, out_path: str, spec: SignatureSpec, exclude: Optional[np.ndarray] = None) -> dict:
    """Signatures and keep attributes of one part: uid, id, source, n_chars, keep_key, minhash, simhash,
    and with `spec.exact` the xxh3-128 (h_hi, h_lo) of the text normalised as exact dedup hashes it.
    The text is read and normalised once for all of them (the fused pass of exact and near dedup);
    with `spec.exact` also each document's `language` and `raw_chars` (the stored text's length), so
    the exact step can count what it passes on without writing it. `exclude` (sorted uids) leaves
    out documents an earlier find phase removed whose removal is deferred to a later pass."""
    columns = ["uid", "id", "source", "text"] + (["meta"] if spec.keep_field else [])
    has_language = spec.exact and "language" in pq.read_schema(in_path).names
    table = read_table(in_path, columns=columns + (["language"] if has_language else []))
    if exclude is not None and len(exclude) and table.num_rows:
        table = table.filter(pa.array(~in_sorted(table.column("uid").to_numpy(), exclude)))
    return signature_table(table, out_path, spec)


def signature_table(table: pa.Table, out_path: str, spec: SignatureSpec) -> dict:
    """`signature_part` of documents already in memory (uid, id, source, text; meta with a keep field;
    language with `spec.exact`): the reader of a dedup job signs each part it has just written
    without reading it back (`read_and_sign_unit`)."""
    has_language = "language" in table.column_names
    raw = one_array(table.column("text"))
    texts = raw
    if spec.normalize is not None:
        # shingling splits on any whitespace, so folding it here would change nothing
        texts = normalize_array(raw, **{**spec.normalize, "fold_whitespace": False})
    cols = {
        "uid": table.column("uid"),
        "id": table.column("id"),
        "source": table.column("source"),
        "n_chars": pa.compute.utf8_length(texts).cast(pa.int64()),
        "keep_key": pa.array(_keep_keys(table.column("meta").to_pylist() if spec.keep_field else [None] * table.num_rows,
                                        spec.keep_field), pa.string()),
    }
    if spec.exact:
        cols["h_hi"], cols["h_lo"] = (pa.array(h) for h in exact_dedup.hash_texts(_exact_text(raw, texts, spec.normalize)))
        cols["language"] = table.column("language") if has_language else pa.nulls(table.num_rows, pa.string())
        cols["raw_chars"] = pa.compute.fill_null(pa.compute.utf8_length(raw), 0).cast(pa.int64())
    stats = {"docs": table.num_rows}
    if spec.keep_field:  # the step stops when no document has the field, and says how many lack it
        stats["keep_field_missing"] = cols["keep_key"].null_count
    sigs, n_sh, fps, n_feat = [], [], [], []
    shared = spec.minhash is not None and spec.simhash is not None and same_components(spec.minhash, spec.simhash)
    for piece in _slices(texts, SLICE_BYTES):  # transient arrays stay bounded whatever the part size
        if shared:  # one decoding for both methods' n-grams
            (hashes, offsets), (sim_hashes, sim_offsets) = shingle_hashes_multi(piece, [spec.minhash, spec.simhash])
        if spec.minhash is not None:
            if not shared and spec.minhash.unit == "char":  # one fused loop, no array of shingles
                sig, counts = minhash.char_signatures(piece, spec.minhash, spec.num_perm, spec.seed)
                sigs.append(sig)
                n_sh.append(counts)
            else:
                if not shared:
                    hashes, offsets = shingle_hashes(piece, spec.minhash)
                sigs.append(minhash.signatures(hashes, offsets, spec.num_perm, spec.seed))
                n_sh.append(np.diff(offsets))
        if spec.simhash is not None:
            if not shared:
                sim_hashes, sim_offsets = shingle_hashes(piece, spec.simhash)
            fps.append(simhash.fingerprints(sim_hashes, sim_offsets))
            n_feat.append(np.diff(sim_offsets))
    if spec.minhash is not None:
        sig = np.concatenate(sigs) if sigs else np.empty((0, spec.num_perm), np.uint32)
        width = spec.num_perm * 4
        cols["minhash"] = pa.Array.from_buffers(
            pa.binary(), len(sig), [None, pa.py_buffer((np.arange(len(sig) + 1, dtype=np.int64) * width).astype(np.int32)),
                                    pa.py_buffer(np.ascontiguousarray(sig).view(np.uint8))])
        cols["minhash_shingles"] = pa.array(np.concatenate(n_sh) if n_sh else np.empty(0, np.int64))
        stats["minhash_shingles"] = int(cols["minhash_shingles"].to_numpy().sum()) if len(sig) else 0
    if spec.simhash is not None:
        cols["simhash"] = pa.array((np.concatenate(fps) if fps else np.empty(0, np.uint64)).view(np.int64))
        cols["simhash_features"] = pa.array(np.concatenate(n_feat) if n_feat else np.empty(0, np.int64))
    write_table_atomic(pa.table(cols), Path(out_path))
    return stats


SIGNATURES = "signatures"  # the folder beside a dedup job's read parts holding their signatures


def read_and_sign_unit(unit: Any, opts: Any, out_dir: str, spec: SignatureSpec) -> dict:
    """`read.read_unit` that also signs every part while it is in memory (`signature_table` into
    out_dir/signatures/, named as the part): the dedup job's first pass, so the text is parsed,
    written once and never read back before the removal. Its result lists both as `files`."""
    from . import read

    sig_dir = Path(out_dir) / SIGNATURES

    def sign(table: pa.Table, name: str) -> list[str]:
        signature_table(table, str(sig_dir / name), spec)
        return [f"{SIGNATURES}/{name}"]

    writer = read.PartHookWriter(Path(out_dir), unit.index, opts.part_size, opts.cjk_share, opts.language, sign)
    result = read.read_unit(unit, opts, out_dir, writer=writer)
    result["files"] = list(result["parts"]) + writer.files
    return result


def _exact_text(raw: pa.Array, unfolded: pa.Array, normalize: Optional[dict]) -> pa.Array:
    """The text exact dedup hashes (`normalize_array(raw, **normalize)`), from the unfolded
    normalisation already made for shingling when folding is the last pass (no Chinese conversion
    after it), else normalised again."""
    if normalize is None:
        return raw
    if not normalize.get("fold_whitespace", True):
        return unfolded
    if normalize.get("chinese_convert"):
        return normalize_array(raw, **normalize)
    return exact_dedup.fold_whitespace(unfolded)


SLICE_BYTES = 8 << 20


def _slices(texts: pa.Array, max_bytes: int):
    """Consecutive slices of a string array holding about `max_bytes` of text each."""
    if len(texts) == 0:
        return
    sizes = pa.compute.binary_length(texts).to_numpy(zero_copy_only=False)
    ends = np.cumsum(sizes)
    start = 0
    while start < len(texts):
        base = ends[start - 1] if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, base + max_bytes, side="right")))
        yield texts.slice(start, stop - start)
        start = stop


def _keep_keys(metas: list, field: Optional[str]) -> list:
    """The `field` value of each document's input fields as text; None where it is absent or null."""
    if not field:
        return [None] * len(metas)
    out = []
    for m in metas:
        value = json.loads(m).get(field) if m else None
        out.append(None if value is None else str(value))
    return out


def load_signatures(path: str, fields: list[str], rename: Optional[dict] = None) -> pd.DataFrame:
    """Columns of a signature part, optionally renamed (merges need distinct names per side)."""
    table = read_table(path, columns=fields)
    # binary columns stay Arrow-backed: Dask would otherwise try to turn bytes objects into strings
    df = table.to_pandas(types_mapper=lambda t: pd.ArrowDtype(t) if pa.types.is_binary(t) else None)
    return df.rename(columns=rename) if rename else df


def minhash_band_part(path: str, bands: int, rows: int) -> pd.DataFrame:
    df = read_table(path, columns=["uid", "minhash"]).to_pandas()
    sig = _sig_matrix(df["minhash"])
    return minhash.band_rows(df["uid"].to_numpy(), sig, bands, rows)


def simhash_block_part(path: str, max_distance: int) -> pd.DataFrame:
    df = read_table(path, columns=["uid", "simhash", "simhash_features"]).to_pandas()
    fps = df["simhash"].to_numpy().view(np.uint64)
    return simhash.block_rows(df["uid"].to_numpy(), fps, df["simhash_features"].to_numpy() > 0, max_distance)


def _sig_matrix(blobs: pd.Series) -> np.ndarray:
    values = blobs.tolist()
    if not values:
        return np.empty((0, 0), np.uint32)
    return np.frombuffer(b"".join(values), dtype=np.uint32).reshape(len(values), -1)


VERIFIED_META = pd.DataFrame({"a": pd.Series(dtype="int64"), "b": pd.Series(dtype="int64"),
                              "similarity": pd.Series(dtype="float64")})


def verify_minhash_edges(part: pd.DataFrame, threshold: Optional[float]) -> pd.DataFrame:
    """Estimated Jaccard of each candidate pair from their signatures; pairs below `threshold` dropped."""
    if part.empty:
        return VERIFIED_META.copy()
    sim = minhash.signature_jaccard(_sig_matrix(part["sig_a"]), _sig_matrix(part["sig_b"]))
    out = pd.DataFrame({"a": part["a"].to_numpy(), "b": part["b"].to_numpy(), "similarity": sim})
    return out if threshold is None else out[out["similarity"] >= threshold].reset_index(drop=True)


def exact_jaccard(texts_a: pa.Array, texts_b: pa.Array, spec: ShingleSpec) -> np.ndarray:
    """True Jaccard of the shingle sets (64-bit shingle hashes) of each row-aligned pair of texts:
    both sides shingled in bulk, then one compiled loop per pair sorts, dedups and merges the two
    sets (`sketch.pair_jaccard`; a lexsort over every pair's rows at once took ~10 s per 4,096 pairs)."""
    if len(texts_a) == 0:
        return np.zeros(0)
    ha, oa = shingle_hashes(texts_a, spec)
    hb, ob = shingle_hashes(texts_b, spec)
    return sketch.pair_jaccard(ha, oa, hb, ob)


VERIFY_PAIRS = 4096  # pairs per exact_jaccard call: bounds the transient shingle arrays


def verify_pairs_exact(a: np.ndarray, b: np.ndarray, text_a: list, text_b: list, spec: ShingleSpec,
                       threshold: Optional[float]) -> pd.DataFrame:
    """(a, b, similarity) with the true shingle-set Jaccard; pairs below `threshold` dropped."""
    sims = [exact_jaccard(pa.array(text_a[i:i + VERIFY_PAIRS], pa.string()), pa.array(text_b[i:i + VERIFY_PAIRS], pa.string()), spec)
            for i in range(0, len(a), VERIFY_PAIRS)]
    sim = np.concatenate(sims) if sims else np.zeros(0)
    out = pd.DataFrame({"a": np.asarray(a, dtype=np.int64), "b": np.asarray(b, dtype=np.int64), "similarity": sim})
    return out if threshold is None else out[out["similarity"] >= threshold].reset_index(drop=True)


def verify_pairs_by_uid(a: np.ndarray, b: np.ndarray, texts: tuple, spec: ShingleSpec,
                        threshold: Optional[float]) -> pd.DataFrame:
    """`verify_pairs_exact` with the texts given once, by uid (`texts`: sorted uids and their texts,
    shared by every chunk of pairs): a document in several pairs is shingled and sorted once per
    `VERIFY_PAIRS` pairs instead of once per pair."""
    uids, values = texts
    a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    sims = []
    for i in range(0, len(a), VERIFY_PAIRS):
        ca, cb = a[i:i + VERIFY_PAIRS], b[i:i + VERIFY_PAIRS]
        ends = np.unique(np.concatenate([ca, cb]))
        hashes, offsets = shingle_hashes(pa.array(list(values[np.searchsorted(uids, ends)]), pa.string()), spec)
        sims.append(sketch.pair_jaccard_indexed(hashes, offsets, np.searchsorted(ends, ca), np.searchsorted(ends, cb)))
    sim = np.concatenate(sims) if sims else np.zeros(0)
    out = pd.DataFrame({"a": a, "b": b, "similarity": sim})
    return out if threshold is None else out[out["similarity"] >= threshold].reset_index(drop=True)


def verify_exact_edges(part: pd.DataFrame, spec: ShingleSpec, threshold: Optional[float]) -> pd.DataFrame:
    """`verify_pairs_exact` of one partition of candidates joined with both texts (text_a, text_b)."""
    if part.empty:
        return VERIFIED_META.copy()
    return verify_pairs_exact(part["a"].to_numpy(), part["b"].to_numpy(), part["text_a"].tolist(),
                              part["text_b"].tolist(), spec, threshold)


def texts_for_uids(path: str, uids_sorted: np.ndarray, normalize: Optional[dict] = None,
                   rename: Optional[dict] = None) -> pd.DataFrame:
    """(uid, text) of the documents of one part whose uid is in `uids_sorted`, normalised as
    `signature_part` normalises them (so verification sees the text the signatures saw)."""
    table = read_table(path, columns=["uid", "text"])
    table = table.filter(pa.array(in_sorted(table.column("uid").to_numpy(), uids_sorted)))
    texts = one_array(table.column("text"))
    if normalize is not None:
        texts = normalize_array(texts, **{**normalize, "fold_whitespace": False})
    df = pd.DataFrame({"uid": table.column("uid").to_numpy(), "text": texts.to_pylist()})
    return df.rename(columns=rename) if rename else df


CLUSTER_META = pd.DataFrame({
    "uid": pd.Series(dtype="int64"), "id": pd.Series(dtype="string[pyarrow]"),
    "source": pd.Series(dtype="string[pyarrow]"), "duplicate_of": pd.Series(dtype="int64"),
    "duplicate_of_id": pd.Series(dtype="string[pyarrow]"), "cluster_id": pd.Series(dtype="int64"),
    "cluster_size": pd.Series(dtype="int64"),
})


def keep_rank(df: pd.DataFrame, policy: str, order: str = "max") -> Optional[np.ndarray]:
    """The keep policy as one float per row (lower is kept first; None for lowest_uid, where the uid
    alone decides): shared by `choose_keepers` and the keeper guard's regrouping, so a regrouped
    cluster keeps the document the policy would have kept."""
    if policy == "lowest_uid":
        return None
    if policy == "longest":
        return -df["n_chars"].astype("float64").to_numpy()
    if policy == "field":
        raw = df["keep_key"]
        numeric = pd.to_numeric(raw, errors="coerce")
        if numeric.notna().sum() == raw.notna().sum():  # every present value is a number
            key = numeric.astype("float64")
        else:  # compare as text (ISO dates sort correctly); a dense rank keeps the order within any frame
            key = raw.astype(object).rank(method="dense").astype("float64")
        return (-key if order == "max" else key).fillna(np.inf).to_numpy()  # documents without the field lose
    raise ValueError(f"unknown keep policy {policy!r}")


def _keeper_order(df: pd.DataFrame, group: str, policy: str, order: str) -> pd.DataFrame:
    """`df` sorted so each `group`'s first row is the document `policy` keeps (ties: the lowest uid)."""
    df = df.sort_values([group, "uid"], kind="stable")
    rank = keep_rank(df, policy, order)
    return df if rank is None else df.assign(_rank=rank).sort_values([group, "_rank", "uid"], kind="stable")


def choose_keepers(nodes: pd.DataFrame, policy: str, order: str = "max") -> pd.DataFrame:
    """Within a frame holding whole clusters (uid, root, id, source, n_chars, keep_key): one document
    kept per cluster, every other one returned with the kept one's uid and id.

    policy: lowest_uid | longest (most characters) | field (meta field value, `order` max or min);
    ties always go to the lowest uid, so the result never depends on partitioning."""
    if nodes.empty:
        return CLUSTER_META.copy()
    df = _keeper_order(nodes, "root", policy, order)
    first = ~df["root"].duplicated()
    keeper_uid = df["uid"].where(first).ffill().astype("int64")
    keeper_id = df["id"].where(first).ffill()
    size = df.groupby("root")["uid"].transform("count")
    out = pd.DataFrame({
        "uid": df["uid"].to_numpy(), "id": df["id"].to_numpy(), "source": df["source"].to_numpy(),
        "duplicate_of": keeper_uid.to_numpy(), "duplicate_of_id": keeper_id.to_numpy(),
        "cluster_id": df["root"].to_numpy(), "cluster_size": size.to_numpy().astype("int64"),
    })
    return out[~first.to_numpy()].reset_index(drop=True).astype(CLUSTER_META.dtypes.to_dict())


def node_methods(edge_path: Optional[str]) -> pd.DataFrame:
    """(uid, method) per node of one edge part: 0 when any MinHash edge touches it, else 1 (SimHash)."""
    if edge_path is None:
        return pd.DataFrame({"uid": pd.Series(dtype="int64"), "method": pd.Series(dtype="int8")})
    e = read_table(edge_path, columns=["a", "b", "method"]).to_pandas()
    nodes = pd.DataFrame({"uid": np.concatenate([e["a"], e["b"]]), "method": np.concatenate([e["method"], e["method"]])})
    return nodes.groupby("uid", as_index=False)["method"].min()


def finish_removed(part: pd.DataFrame, minhash_threshold: float = np.nan, simhash_threshold: float = np.nan) -> pd.DataFrame:
    """Reason (the method whose edges reached the document) and its estimated similarity to the kept one."""
    if part.empty:
        return REMOVED_META.copy()
    if not pd.api.types.is_integer_dtype(part["sig_a"].dtype):  # MinHash signatures (binary)
        sim = minhash.signature_jaccard(_sig_matrix(part["sig_a"]), _sig_matrix(part["sig_b"]))
    else:  # SimHash fingerprints
        sim = 1.0 - simhash.popcount64(part["sig_a"].to_numpy() ^ part["sig_b"].to_numpy()) / 64.0
    # a node may appear in several edge parts: the smallest method code wins
    method = part.groupby("uid")["method"].transform("min").fillna(0).to_numpy()
    out = pd.DataFrame({
        "uid": part["uid"].to_numpy(), "id": part["id"].to_numpy(), "source": part["source"].to_numpy(),
        "reason": np.where(method == 0, "minhash", "simhash"), "score": sim,
        "threshold": np.where(method == 0, minhash_threshold, simhash_threshold),
        "duplicate_of": part["duplicate_of"].to_numpy(), "duplicate_of_id": part["duplicate_of_id"].to_numpy(),
        "cluster_size": part["cluster_size"].to_numpy(), "cluster_id": part["cluster_id"].to_numpy(),
    })
    return out.drop_duplicates("uid").astype(REMOVED_META.dtypes.to_dict())


def rows_for_uids(path: str, uids_sorted: np.ndarray, fields: list[str]) -> pd.DataFrame:
    """The rows of one signature part whose uid is in `uids_sorted` (only what a small step needs)."""
    table = read_table(path, columns=fields)
    return table.filter(pa.array(in_sorted(table.column("uid").to_numpy(), uids_sorted))).to_pandas()


def signature_lookup(frames: list[pd.DataFrame], column: str) -> tuple[np.ndarray, np.ndarray]:
    """(sorted uids, values aligned to them) from `rows_for_uids` results."""
    df = pd.concat(frames, ignore_index=True).sort_values("uid")
    values = _sig_matrix(df[column]) if column == "minhash" else df[column].to_numpy().view(np.uint64)
    return df["uid"].to_numpy(), values


def lookup(uids_sorted: np.ndarray, values: np.ndarray, want: np.ndarray) -> np.ndarray:
    return values[np.searchsorted(uids_sorted, want)]


def repoint_exact_removed(exact_files: list[str], near_removed: pd.DataFrame) -> int:
    """Make every exact duplicate name a KEPT document: an exact duplicate of a document that near
    dedup then removed points at that document's near-duplicate keeper instead. The exact match
    found first stays in `exact_of` / `exact_of_id` (and is what a rerun repoints from, so the
    result does not depend on an earlier run). Returns how many rows changed their duplicate_of."""
    keeper = dict(zip(near_removed["uid"].to_numpy().tolist(), zip(near_removed["duplicate_of"].tolist(),
                                                                    near_removed["duplicate_of_id"].tolist())))
    changed = 0
    for path in exact_files:
        df = read_table(path).to_pandas()
        if "exact_of" not in df.columns:
            df["exact_of"], df["exact_of_id"] = df["duplicate_of"], df["duplicate_of_id"]
        hits = [keeper.get(int(u)) for u in df["exact_of"].to_numpy()]
        new_uid = np.array([h[0] if h else u for h, u in zip(hits, df["exact_of"].to_numpy())], dtype=np.int64)
        new_id = [h[1] if h else i for h, i in zip(hits, df["exact_of_id"].tolist())]
        changed += int((new_uid != df["duplicate_of"].to_numpy()).sum())
        df["duplicate_of"], df["duplicate_of_id"] = new_uid, pd.array(new_id, dtype=df["exact_of_id"].dtype)
        write_table_atomic(pa.Table.from_pandas(df, preserve_index=False), Path(path))
    return changed


# ---- the keeper guard: no removed document below the threshold to the document it duplicates ----

REGROUP_META = pd.DataFrame({"uid": pd.Series(dtype="int64"), "duplicate_of": pd.Series(dtype="int64"),
                             "duplicate_of_id": pd.Series(dtype="string[pyarrow]"), "score": pd.Series(dtype="float64"),
                             "cluster_id": pd.Series(dtype="int64")})
GUARD_ROUNDS = 32  # keepers chosen per cluster at most; members still unplaced after them are kept


def regroup_rejected(members: pd.DataFrame, spec: ShingleSpec, threshold: float, policy: str, order: str = "max",
                     max_rounds: int = GUARD_ROUNDS) -> pd.DataFrame:
    """The members of a cluster that are not near its keeper (whole per cluster_id: uid, id,
    cluster_id, n_chars, keep_key, text), re-clustered among themselves: the best of them by the keep
    policy becomes a keeper, the others whose true Jaccard to it reaches `threshold` its duplicates,
    and so on with the rest. Every cluster advances in the same vectorised round (one bulk Jaccard per
    round), so the work is rounds x members, never a Python loop per cluster. Returns the members that
    are duplicates of a new keeper (uid, duplicate_of, duplicate_of_id, score, cluster_id); the new
    keepers and whatever `max_rounds` left unplaced are kept (keeping is the safe side)."""
    if members.empty:
        return REGROUP_META.copy()
    df = _keeper_order(members, "cluster_id", policy, order)
    df = df.reset_index(drop=True)
    hashes, offsets = shingle_hashes(pa.array(df["text"].tolist(), pa.string()), spec)
    cluster = df["cluster_id"].to_numpy()
    uid = df["uid"].to_numpy()
    open_ = np.ones(len(df), bool)
    dup_of = np.full(len(df), -1, np.int64)
    score = np.full(len(df), np.nan)
    for _ in range(max_rounds):
        idx = np.flatnonzero(open_)
        if len(idx) == 0:
            break
        c = cluster[idx]
        first = np.r_[True, c[1:] != c[:-1]]  # rows are in keep order within a cluster: its first open row keeps
        keeper = idx[first][np.cumsum(first) - 1]  # each open row's new keeper (itself for the keepers)
        open_[idx[first]] = False
        others = idx[~first]
        if len(others):
            sim = sketch.pair_jaccard_indexed(hashes, offsets, others, keeper[~first])
            near = sim >= threshold
            dup_of[others[near]], score[others[near]] = keeper[~first][near], sim[near]
            open_[others[near]] = False
    hit = np.flatnonzero(dup_of >= 0)
    return pd.DataFrame({"uid": uid[hit], "duplicate_of": uid[dup_of[hit]],
                         "duplicate_of_id": df["id"].to_numpy()[dup_of[hit]], "score": score[hit],
                         "cluster_id": cluster[hit]}).astype(REGROUP_META.dtypes.to_dict())


def regroup_partition(part: pd.DataFrame, spec: ShingleSpec, threshold: float, policy: str, order: str = "max") -> pd.DataFrame:
    """`regroup_rejected` of one Dask partition (clusters shuffled whole onto it)."""
    return regroup_rejected(part, spec, threshold, policy, order)


def apply_guard(removed: pd.DataFrame, regrouped: pd.DataFrame, rejected: np.ndarray) -> pd.DataFrame:
    """The removed rows after the guard: the rejected members (sorted uids) leave, and those that
    are duplicates of a new keeper come back naming it, with their Jaccard to it as the score."""
    keep = removed[~in_sorted(removed["uid"].to_numpy(), rejected)]
    if regrouped.empty:
        return keep.reset_index(drop=True)
    back = removed.set_index("uid").loc[regrouped["uid"].to_numpy()].reset_index()
    back["duplicate_of"] = regrouped["duplicate_of"].to_numpy()
    back["duplicate_of_id"] = regrouped["duplicate_of_id"].to_numpy()
    back["score"] = regrouped["score"].to_numpy()
    return pd.concat([keep, back], ignore_index=True).astype(removed.dtypes.to_dict())
