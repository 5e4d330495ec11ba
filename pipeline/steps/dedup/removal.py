"""The last phase of every dedup step: drop the found duplicates from the parts, give each audit row
the removed text, and summarise the clusters for the report."""
from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from dask import delayed

from corpusmill.stages import exact_dedup, near_dedup
from corpusmill.stages.base import REMOVED_META, in_sorted, merge_stats, read_table
from corpusmill.stages.composition import UNKNOWN

from ...executor import attach_removed_text, removed_texts, run_batch_part
from ...config import Config
from ...ledger import DUPLICATES
from ...step import DocumentStep, StepContext


class DedupStep(DocumentStep):
    """What both dedup steps share: their removals are duplicates, their link hashes the dedup
    section, and what they hash is normalised first when the stored text is the original."""

    removes = DUPLICATES
    config_sections = ("dedup",)
    hash_ignores = (("dedup", "paragraph"),)  # paragraph dedup's own settings: its step hashes them
    outputs = {"examples": list}
    kind: ClassVar[str]  # "exact" | "near": part of the link, so the two never share a hash

    def __init__(self, reads: str, normalize_opts: Optional[dict]):
        super().__init__(reads)
        self.normalize_opts = normalize_opts  # a dedup job keeps the original text: normalise only for hashing

    def hash_extra(self, cfg: Config, previous: Optional[str]) -> Any:
        return [previous, self.kind, self.normalize_opts]


def removed_uids(files: list[str]) -> np.ndarray:
    """The sorted uids of a step's removed rows."""
    if not files:
        return np.empty(0, np.int64)
    return np.sort(read_table(files, columns=["uid"]).column("uid").to_numpy())


def remove_documents(ctx: StepContext, source: str, folder: Path, drop: np.ndarray, reason: Optional[str],
                     label: str, audit: Optional[list[Path]] = None) -> dict[str, Any]:
    """Copy the parts of `source` into `folder` without the uids in `drop` (sorted); counted under
    `reason` (None: the caller counts removals by their own reasons). The same pass gives the audit
    rows of the steps in `audit` (their folders) the removed texts (`attach_texts` without a read
    pass of its own)."""
    chars = ctx.cfg.dedup.audit_text_chars
    drop_future = ctx.broadcast(drop)
    kwargs: dict[str, Any] = {"drop_sorted": drop_future}
    if reason is None:
        kwargs["reason"] = None
    with_texts = bool(audit) and chars != 0
    if with_texts:
        kwargs["excerpt_chars"] = chars
    tasks = [delayed(run_batch_part)(exact_dedup.drop_uids_table, p, str(folder), "arrow", kwargs)
             for p in ctx.parts(source)]
    stats: dict = {}
    texts: dict = {}
    for r in ctx.run(tasks, label):
        merge_stats(stats, r["stats"])
        texts.update(r["extra"] or {})
    if with_texts:
        for f in sorted(str(p) for d in audit or [] for p in (d / "removed").glob("*.parquet")):
            attach_removed_text(f, texts)
    return stats


def attach_texts(ctx: StepContext, folder: Path, source: str) -> None:
    """Each removed duplicate's audit row (FOLDER/removed/) gets its text, cut to
    dedup.audit_text_chars, read from the step's input parts, so checking what was removed needs
    no join by id."""
    chars = ctx.cfg.dedup.audit_text_chars
    files = sorted(str(p) for p in (folder / "removed").glob("*.parquet"))
    if chars == 0 or not files:
        return
    uids = np.unique(read_table(files, columns=["uid"]).column("uid").to_numpy())
    wanted = ctx.broadcast(uids)
    texts: dict = {}
    for found in ctx.run([delayed(removed_texts)(p, wanted, chars) for p in ctx.parts(source)],
                         f"{folder.name}: removed texts"):
        texts.update(found)
    for f in files:
        attach_removed_text(f, texts)


def examples(files: list[str], columns: tuple[str, ...], n: int = 10) -> list[dict]:
    """The first removed rows of `files`, for the report: the files are read in order until there
    are `n` (not every removed row, text excerpts included, into the driver)."""
    rows: list[dict] = []
    for f in files:
        reader = pq.ParquetFile(f)
        for batch in reader.iter_batches(batch_size=n, columns=[c for c in columns if c in reader.schema_arrow.names]):
            rows += batch.slice(0, n - len(rows)).to_pylist()
            if len(rows) >= n:
                return [{k: r.get(k) for k in columns} for r in rows]
    return [{k: r.get(k) for k in columns} for r in rows]


# ---- near duplicates: which document each cluster keeps, and why the others go ---------------

def _thresholds(ctx: StepContext) -> tuple[float, float]:
    from .simhash_edges import similarity

    dc = ctx.cfg.dedup
    return dc.minhash.threshold, similarity(dc.simhash.max_distance)


def near_removed_in_memory(ctx: StepContext, labels: pd.DataFrame, edge_files: list[str], sig_paths: list[str],
                           parts: list[str], spec: near_dedup.SignatureSpec,
                           stats: Optional[dict[str, Any]] = None) -> pd.DataFrame:
    """Keepers, reasons and similarities when the clustered documents fit in memory. With a method's
    verification on, the documents it removed score their true Jaccard to the kept one, and with
    `dedup.minhash.verify_keeper` those below the threshold are regrouped (`_guard_in_memory`)."""
    from .minhash_edges import rows_for_uids

    dc = ctx.cfg.dedup
    if labels.empty:
        return REMOVED_META.copy()
    nodes = labels["uid"].to_numpy()
    sig_col = "minhash" if dc.minhash.enabled else "simhash"
    rows = pd.concat(rows_for_uids(ctx, sig_paths, nodes, ["uid", "id", "source", "n_chars", "keep_key", sig_col],
                                   "near_dedup: fetch clustered documents"), ignore_index=True)
    clusters = labels.merge(rows.drop(columns=[sig_col]), on="uid")
    removed = near_dedup.choose_keepers(clusters, dc.keep, dc.keep_order)
    methods = pd.concat([near_dedup.node_methods(f) for f in edge_files], ignore_index=True)
    removed = removed.merge(methods.groupby("uid", as_index=False)["method"].min(), on="uid", how="left")
    uids, values = near_dedup.signature_lookup([rows[["uid", sig_col]]], sig_col)

    def signatures_of(which: np.ndarray) -> Any:
        found = near_dedup.lookup(uids, values, which)
        return list(found) if sig_col == "minhash" else found.view(np.int64)

    removed["sig_a"] = signatures_of(removed["uid"].to_numpy())
    removed["sig_b"] = signatures_of(removed["duplicate_of"].to_numpy())
    out = near_dedup.finish_removed(removed, *_thresholds(ctx))
    verified = _checked(ctx, out)
    checked = verified.copy()
    if verified.any():  # a removed document next to its keeper on a verified edge has its Jaccard there
        known = _verified_edge_similarity(edge_files, out["uid"].to_numpy(), out["duplicate_of"].to_numpy(),
                                          dc.minhash.enabled and dc.minhash.verify, dc.simhash.enabled and dc.simhash.verify)
        hit = verified & ~np.isnan(known)
        out.loc[hit, "score"] = known[hit]
        out.loc[hit, "threshold"] = dc.minhash.threshold
        verified &= np.isnan(known)
    if parts and spec.verify is not None and verified.any():
        a, b = out["uid"].to_numpy()[verified], out["duplicate_of"].to_numpy()[verified]
        want = np.unique(np.concatenate([a, b]))
        future = ctx.broadcast(want)
        texts = pd.concat(ctx.run([delayed(near_dedup.texts_for_uids)(p, future, spec.normalize) for p in parts],
                                  "near_dedup: similarity to the kept documents"), ignore_index=True).sort_values("uid")
        uids, values = texts["uid"].to_numpy(), np.asarray(texts["text"].tolist(), dtype=object)
        exact = near_dedup.verify_pairs_exact(a, b, list(near_dedup.lookup(uids, values, a)),
                                              list(near_dedup.lookup(uids, values, b)), spec.verify, None)
        out.loc[verified, "score"] = exact["similarity"].to_numpy()
        out.loc[verified, "threshold"] = dc.minhash.threshold
    if dc.minhash.verify_keeper and parts and spec.verify is not None:
        out = _guard_in_memory(ctx, out, clusters, checked, parts, spec, stats if stats is not None else {})
    return out


def _checked(ctx: StepContext, out: Any) -> Any:
    """Which removed rows (pandas) a verifying method found: their score is (or becomes) the true
    Jaccard to the keeper, which the keeper guard checks."""
    dc = ctx.cfg.dedup
    return (((out["reason"] == "minhash") & dc.minhash.enabled & dc.minhash.verify)
            | ((out["reason"] == "simhash") & dc.simhash.enabled & dc.simhash.verify)).to_numpy()


def _guard_stats(stats: dict[str, Any], checked: int, rejected: int, regrouped: int) -> None:
    stats["keeper_guard"] = {"checked": int(checked), "below_threshold": int(rejected),
                             "regrouped": int(regrouped), "released": int(rejected - regrouped)}


def _guard_in_memory(ctx: StepContext, out: pd.DataFrame, clusters: pd.DataFrame, checked: np.ndarray,
                     parts: list[str], spec: near_dedup.SignatureSpec, stats: dict[str, Any]) -> pd.DataFrame:
    """The keeper guard in the driver's path: the removed members below the threshold to their keeper
    (their score is already the true Jaccard) are re-clustered among themselves, in tasks of whole
    clusters over their texts (read once, only theirs)."""
    dc = ctx.cfg.dedup
    rejected = checked & (out["score"].to_numpy() < dc.minhash.threshold)
    rej = np.sort(out["uid"].to_numpy()[rejected])
    if not len(rej):
        _guard_stats(stats, checked.sum(), 0, 0)
        return out
    future = ctx.broadcast(rej)
    texts = pd.concat(ctx.run([delayed(near_dedup.texts_for_uids)(p, future, spec.normalize) for p in parts],
                              "near_dedup: keeper guard texts"), ignore_index=True)
    members = out.loc[rejected, ["uid", "cluster_id"]].merge(
        clusters[["uid", "id", "n_chars", "keep_key"]], on="uid").merge(texts, on="uid")
    ids = np.unique(members["cluster_id"].to_numpy())
    chunks = [c for c in np.array_split(ids, max(1, min(len(ids), 2 * ctx.n_workers))) if len(c)]
    tasks = [delayed(near_dedup.regroup_rejected)(members[members["cluster_id"].isin(c)], spec.verify,
                                                  dc.minhash.threshold, dc.keep, dc.keep_order) for c in chunks]
    regrouped = pd.concat(ctx.run(tasks, "near_dedup: keeper guard (regrouping)"), ignore_index=True)
    _guard_stats(stats, checked.sum(), len(rej), len(regrouped))
    return near_dedup.apply_guard(out, regrouped, rej)


def _verified_edge_similarity(edge_files: list[str], uid: np.ndarray, keeper: np.ndarray, minhash_verified: bool,
                              simhash_verified: bool) -> np.ndarray:
    """The exact Jaccard of (uid, keeper) where that pair is an edge a verifying method wrote (NaN
    elsewhere): edges carry it already, so only removed documents whose keeper is not their
    neighbour need their texts read again."""
    from .minhash_edges import METHOD as MINHASH
    from .simhash_edges import METHOD as SIMHASH

    out = np.full(len(uid), np.nan)
    if not edge_files or not len(uid):
        return out
    e = read_table(edge_files, columns=["a", "b", "similarity", "method"]).to_pandas()
    e = e[e["method"].isin([m for m, on in ((MINHASH, minhash_verified), (SIMHASH, simhash_verified)) if on])]
    if e.empty:
        return out
    hi, lo = np.maximum(e["a"], e["b"]).to_numpy(), np.minimum(e["a"], e["b"]).to_numpy()
    edges = pd.Series(e["similarity"].to_numpy(), index=pd.MultiIndex.from_arrays([hi, lo])).groupby(level=[0, 1]).max()
    found = edges.reindex(pd.MultiIndex.from_arrays([np.maximum(uid, keeper), np.minimum(uid, keeper)]))
    return found.to_numpy(dtype=float)


def near_removed_distributed(ctx: StepContext, labels: Any, edge_files: list[str], sig_paths: list[str],
                             nparts: int, parts: Optional[list[str]] = None, spec: Optional[near_dedup.SignatureSpec] = None,
                             stats: Optional[dict[str, Any]] = None) -> Any:
    """The same rows as `near_removed_in_memory` (similarity: the signatures' estimate, or with the
    keeper guard the true Jaccard of every verified row), as a lazy Dask frame: clusters are
    shuffled on their root so each is whole in one partition."""
    import dask.dataframe as dd  # here: workers running this module's task bodies need not import it

    dc = ctx.cfg.dedup
    attrs = dd.from_map(near_dedup.load_signatures, sig_paths, fields=["uid", "id", "source", "n_chars", "keep_key"],
                        enforce_metadata=False)
    nodes = labels.merge(attrs, on="uid", how="inner")
    removed = nodes.shuffle(on="root", npartitions=nparts).map_partitions(
        near_dedup.choose_keepers, dc.keep, dc.keep_order, meta=near_dedup.CLUSTER_META)
    method = dd.from_map(near_dedup.node_methods, edge_files or [None], enforce_metadata=False)
    removed = removed.merge(method, on="uid", how="left")
    sig = "minhash" if dc.minhash.enabled else "simhash"
    su = dd.from_map(near_dedup.load_signatures, sig_paths, fields=["uid", sig], rename={sig: "sig_a"},
                     enforce_metadata=False)
    sk = dd.from_map(near_dedup.load_signatures, sig_paths, fields=["uid", sig],
                     rename={"uid": "duplicate_of", sig: "sig_b"}, enforce_metadata=False)
    out = removed.merge(su, on="uid").merge(sk, on="duplicate_of").map_partitions(
        near_dedup.finish_removed, *_thresholds(ctx), meta=REMOVED_META)
    if dc.minhash.verify_keeper and parts and spec is not None and spec.verify is not None:
        out = _guard_distributed(ctx, out, attrs, parts, spec, nparts, stats if stats is not None else {})
    return out


GUARD_META = REMOVED_META.assign(checked=pd.Series(dtype="bool"))


def _mark_checked(part: pd.DataFrame, flags: tuple[bool, bool]) -> pd.DataFrame:
    """`_checked` of one partition (flags: MinHash verified, SimHash verified)."""
    reason = part["reason"].to_numpy()
    return part.assign(checked=((reason == "minhash") & flags[0]) | ((reason == "simhash") & flags[1]))


def _guard_distributed(ctx: StepContext, out: Any, attrs: Any, parts: list[str], spec: near_dedup.SignatureSpec,
                       nparts: int, stats: dict[str, Any]) -> Any:
    """The keeper guard on Dask: every verified removed row gets its true Jaccard to its keeper (both
    texts merged onto the pair, as the exact check does), the rows below the threshold are shuffled
    on their cluster with their texts and regrouped per partition (`near_dedup.regroup_partition`)."""
    import dask.dataframe as dd

    dc = ctx.cfg.dedup
    flags = (dc.minhash.enabled and dc.minhash.verify, dc.simhash.enabled and dc.simhash.verify)
    out = ctx.persist(out.map_partitions(_mark_checked, flags, meta=GUARD_META), "near_dedup: removed rows")
    pairs = out[out["checked"]][["uid", "duplicate_of"]]
    ends = dd.concat([pairs[["uid"]], pairs[["duplicate_of"]].rename(columns={"duplicate_of": "uid"})])
    endpoints = np.unique(ctx.compute(ends["uid"].unique(), "near_dedup: keeper guard documents").to_numpy()).astype(np.int64)
    text_meta = pd.DataFrame({"uid": pd.Series(dtype="int64"), "text": pd.Series(dtype=object)})
    future = ctx.broadcast(endpoints)
    texts = ctx.persist(dd.from_delayed([delayed(near_dedup.texts_for_uids)(p, future, spec.normalize) for p in parts],
                                        meta=text_meta, verify_meta=False), "near_dedup: keeper guard texts")
    exact = pairs.rename(columns={"uid": "a", "duplicate_of": "b"}).merge(
        texts.rename(columns={"uid": "a", "text": "text_a"}), on="a").merge(
        texts.rename(columns={"uid": "b", "text": "text_b"}), on="b").map_partitions(
        near_dedup.verify_exact_edges, spec.verify, None, meta=near_dedup.VERIFIED_META)
    exact = exact[["a", "similarity"]].rename(columns={"a": "uid"})
    out = ctx.persist(out.merge(exact, on="uid", how="left").map_partitions(
        _exact_score, dc.minhash.threshold, meta=GUARD_META.assign(rejected=pd.Series(dtype="bool"))),
        "near_dedup: keeper guard (similarity to the keeper)")
    rejected = out[out["rejected"]][["uid", "cluster_id"]]
    members = rejected.merge(attrs[["uid", "id", "n_chars", "keep_key"]], on="uid").merge(texts, on="uid")
    regrouped = ctx.persist(members.shuffle(on="cluster_id", npartitions=nparts).map_partitions(
        near_dedup.regroup_partition, spec.verify, dc.minhash.threshold, dc.keep, dc.keep_order,
        meta=near_dedup.REGROUP_META), "near_dedup: keeper guard (regrouping)")
    counts = ctx.compute(out[["checked", "rejected"]].astype("int64").sum(), "near_dedup: keeper guard counts")
    _guard_stats(stats, int(counts["checked"]), int(counts["rejected"]),
                 int(regrouped.map_partitions(len).compute().sum()))
    back = regrouped.rename(columns={"duplicate_of": "new_of", "duplicate_of_id": "new_of_id", "score": "new_score"})
    return out.merge(back[["uid", "new_of", "new_of_id", "new_score"]], on="uid", how="left").map_partitions(
        _guarded_rows, meta=REMOVED_META)


def _exact_score(part: pd.DataFrame, threshold: float) -> pd.DataFrame:
    """A verified row's score becomes its true Jaccard to the keeper; `rejected` when it is below."""
    sim = part["similarity"].to_numpy(dtype=float)
    checked = part["checked"].to_numpy(dtype=bool) & ~np.isnan(sim)
    score = np.where(checked, sim, part["score"].to_numpy(dtype=float))
    out = part.drop(columns=["similarity"]).assign(score=score, rejected=checked & (score < threshold))
    out.loc[checked, "threshold"] = threshold
    return out


def _guarded_rows(part: pd.DataFrame) -> pd.DataFrame:
    """The removed rows after the guard: rejected members leave unless a new keeper took them."""
    new = part["new_of"].notna().to_numpy()
    keep = ~part["rejected"].to_numpy(dtype=bool) | new
    out = part[keep].copy()
    hit = new[keep]
    out.loc[hit, "duplicate_of"] = out.loc[hit, "new_of"].astype("int64")
    out.loc[hit, "duplicate_of_id"] = out.loc[hit, "new_of_id"]
    out.loc[hit, "score"] = out.loc[hit, "new_score"]
    return out[list(REMOVED_META.columns)].astype(REMOVED_META.dtypes.to_dict())


def finish_near(ctx: StepContext, folder: Path, source: str, stats: dict[str, Any],
                pending: Optional[np.ndarray] = None, counted_from: Optional[list[str]] = None) -> dict[str, Any]:
    """Remove what the near-duplicate search found (and `pending`: the exact step's duplicates when it
    deferred their removal to this one pass), repoint exact duplicates of removed documents to their
    keeper, and summarise the clusters. Returns the report's examples. With `counted_from` (signature
    files of every document, the removal left to the dedup job's export) nothing is written: what
    passes on is counted from their columns."""
    files = sorted(str(p) for p in (folder / "removed").glob("*.parquet"))
    columns = ["uid", "id", "source", "reason", "score", "cluster_id", "cluster_size", "duplicate_of", "duplicate_of_id"]
    table = read_table(files, columns=columns) if files else None
    drop = np.sort(table.column("uid").to_numpy()) if table is not None else np.empty(0, np.int64)
    audit = [folder]
    if pending is not None:  # the exact step's removal is deferred to this pass: its audit texts too
        drop = np.union1d(drop, pending)
        audit.append(ctx.folder("exact_dedup"))
    if counted_from is not None:
        passed = passed_on(ctx, counted_from, drop)
    else:
        passed = remove_documents(ctx, source, folder, drop, None, "near_dedup: remove", audit)
    stats["docs_out"] = passed.get("docs_out", 0)
    stats["by_group"] = passed.get("by_group", {})
    reasons = table.column("reason").to_pandas().value_counts().to_dict() if table is not None else {}
    stats["removed"] = {str(k): int(v) for k, v in reasons.items()}
    exact_files = ctx.removed_files("exact_dedup")
    if exact_files:  # an exact duplicate of a document removed here names that document's keeper
        near = (table.select(["uid", "duplicate_of", "duplicate_of_id"]).to_pandas() if table is not None
                else pd.DataFrame({"uid": [], "duplicate_of": [], "duplicate_of_id": []}))
        stats["exact_repointed"] = near_dedup.repoint_exact_removed(exact_files, near)
    if table is None or not table.num_rows:
        return {}
    sizes = table.select(["cluster_id", "cluster_size"]).to_pandas().drop_duplicates("cluster_id")["cluster_size"]
    stats["clusters"] = int(len(sizes))
    stats["largest_cluster"] = int(sizes.max())
    stats["cluster_sizes"] = {str(k): int(v) for k, v in sizes.value_counts().sort_index().items()}
    return {"examples": examples(files[:1], ("id", "duplicate_of_id", "cluster_size", "reason", "score")),
            "largest_clusters": largest_clusters(ctx, table.to_pandas(), ctx.parts(source))}


LARGEST_CLUSTERS = 10
EXCERPT_CHARS = 120


def largest_clusters(ctx: StepContext, removed: pd.DataFrame, parts: list[str], n: int = LARGEST_CLUSTERS) -> list[dict]:
    """The `n` largest connected components (ties: lowest cluster id) for the report: size, documents
    removed and released (kept by the keeper guard although on the component), how many keepers the
    guard left it, the sources of its documents, its main keeper (the one most removed rows name) and
    the removed member farthest from its keeper, each with the first characters of its text (read
    for these 2n documents only)."""
    if removed.empty:
        return []
    g = removed.groupby("cluster_id").agg(size=("cluster_size", "max"), removed=("uid", "count"),
                                          keepers=("duplicate_of", "nunique"))
    top = g.reset_index().sort_values(["size", "cluster_id"], ascending=[False, True], kind="stable").head(n)
    rows = removed[removed["cluster_id"].isin(top["cluster_id"])]
    votes = rows.groupby(["cluster_id", "duplicate_of"], as_index=False).size().sort_values(
        ["cluster_id", "size", "duplicate_of"], ascending=[True, False, True], kind="stable").drop_duplicates("cluster_id")
    keeper_of = dict(zip(votes["cluster_id"], votes["duplicate_of"]))
    out, wanted = [], []
    for c in top.itertuples():
        members = rows[rows["cluster_id"] == c.cluster_id]
        keeper = int(keeper_of[c.cluster_id])
        far = members[members["duplicate_of"] == keeper].sort_values(["score", "uid"], kind="stable").iloc[0]
        wanted += [keeper, int(far["uid"])]
        out.append({"cluster_id": int(c.cluster_id), "size": int(c.size), "removed": int(c.removed),
                    "released": int(c.size - 1 - c.removed), "keepers": int(c.keepers),
                    "sources": {str(k): int(v) for k, v in members["source"].fillna("?").value_counts().items()},
                    "keeper_uid": keeper, "keeper_id": str(far["duplicate_of_id"]),
                    "removed_uid": int(far["uid"]), "removed_id": str(far["id"]), "removed_score": float(far["score"])})
    texts = _excerpts(ctx, parts, np.unique(np.array(wanted, dtype=np.int64)))
    for c in out:
        c["keeper_text"], c["removed_text"] = texts.get(c["keeper_uid"], ""), texts.get(c["removed_uid"], "")
    return out


def _excerpts(ctx: StepContext, parts: list[str], uids: np.ndarray) -> dict[int, str]:
    """{uid: first EXCERPT_CHARS characters} of a few documents, a task per part reading only the row
    groups whose uid range holds one of them."""
    future = ctx.broadcast(uids)
    found: dict[int, str] = {}
    for part in ctx.run([delayed(excerpts_part)(p, future) for p in parts], "near_dedup: largest clusters' texts"):
        found.update(part)
    return found


def excerpts_part(path: str, uids: np.ndarray) -> dict[int, str]:
    """`_excerpts` of one part."""
    lo, hi = (int(uids.min()), int(uids.max())) if len(uids) else (0, -1)
    table = read_table(path, columns=["uid", "text"], filters=[("uid", ">=", lo), ("uid", "<=", hi)])
    table = table.filter(pa.array(in_sorted(table.column("uid").to_numpy(), uids)))
    return {int(u): (t or "")[:EXCERPT_CHARS] for u, t in zip(table.column("uid").to_pylist(), table.column("text").to_pylist())}


def passed_on(ctx: StepContext, sig_files: list[str], drop: np.ndarray) -> dict[str, Any]:
    """The step's counts when its removal is deferred: documents in, out, removed, and `by_group` of
    what it passes on (as `remove_documents` would count the parts it does not write), from the
    signature pass's uid, source, language and raw_chars columns, a part per task: read into the
    driver at once they grew it by 210 MB at 5 GB."""
    stats: dict[str, Any] = {"docs_in": 0, "docs_out": 0, "removed": {"exact": 0}, "by_group": {}}
    if not sig_files:
        return stats
    drop_future = ctx.broadcast(drop)
    for part in ctx.run([delayed(passed_on_part)(f, drop_future) for f in sig_files], "dedup: counting what passes on"):
        merge_stats(stats, part)
    # as `_group_counts` orders one part's groups: by source, then language
    stats["by_group"] = {s: dict(sorted(g.items())) for s, g in sorted(stats["by_group"].items())}
    return stats


def passed_on_part(sig_file: str, drop: np.ndarray) -> dict[str, Any]:
    """`passed_on` of one signature part."""
    table = read_table(sig_file, columns=["uid", "source", "language", "raw_chars"])
    uid = table.column("uid").to_numpy()
    keep = ~in_sorted(uid, drop)
    return {"docs_in": int(len(uid)), "docs_out": int(keep.sum()), "removed": {"exact": int((~keep).sum())},
            "by_group": _group_counts(table.filter(pa.array(keep)))}


def _group_counts(kept: pa.Table) -> dict:
    """`group_counts(source, language, chars=raw_chars)` of a table, grouped by Arrow (no Python
    string per document): the same groups, counts and order (sorted by source, then language)."""
    text = [pc.fill_null(kept.column(c).cast(pa.string()), UNKNOWN) for c in ("source", "language")]
    grouped = pa.table({"s": text[0], "l": text[1], "c": kept.column("raw_chars")}).group_by(["s", "l"]).aggregate(
        [("c", "count"), ("c", "sum")]).sort_by([("s", "ascending"), ("l", "ascending")])
    out: dict = {}
    for s, lg, n, chars in zip(*(grouped.column(c).to_pylist() for c in ("s", "l", "c_count", "c_sum"))):
        out.setdefault(s, {})[lg] = {"docs": int(n), "chars": int(chars or 0)}
    return out
