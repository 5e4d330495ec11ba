"""Dedup against earlier runs: each run can leave an index of what it deduplicated (DIR/04b-dedup_index/);
a later run names such runs in `dedup.reference` and removes its documents that duplicate theirs.

The index (`index.json`, format INDEX_FORMAT) holds:
- `exact.parquet`: the 128-bit hash of every document the run's exact dedup saw (uid, id, h_hi, h_lo);
- `keepers.parquet`: for every document the run removed as a duplicate, the document it kept instead;
- `near`: where the run's MinHash signatures are (its own 04-near_dedup/signatures/, reused as they are)
  and the settings that made them (a later run must shingle and hash the same way).

The reference step runs before this run's own dedup: first the exact hashes (one sorted array of the
earlier runs' hashes broadcast to every task), then MinHash: this run's signatures and LSH band keys
joined with the earlier runs' band keys, each candidate pair kept when the signatures' estimate of
the Jaccard similarity reaches `minhash.threshold`. A removed document's `duplicate_of_id` names the
earlier run and the id of the document that run kept (`RUN_DIR::id`), `duplicate_of` its uid there.
Earlier runs are only read. Documents of this run that duplicate each other are left to the exact and
near steps after this one, so a corpus deduplicated as two runs loses the same documents as one run
over both (when the earlier run's copy is the one a single run would keep: lowest_uid, earlier files
first).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from dask import delayed

from corpusmill.stages import exact_dedup, minhash, near_dedup
from corpusmill.stages.base import in_sorted, read_table, write_json_atomic, write_table_atomic

from ...config import Config
from ...rundir import DIGEST, describe_files, verify_files
from ...step import PipelineError, Step, StepContext, StepResult
from . import removal, signatures

INDEX_FORMAT = "corpusmill-dedup-index/1"
INDEX_FILE = "index.json"
EXACT_REASON, NEAR_REASON = "exact_earlier_run", "near_earlier_run"


def _exact_fingerprint(normalize_opts: Optional[dict], cfg: Config) -> dict:
    """What makes two runs' exact hashes comparable: the text normalisation they hash."""
    return {"normalize": normalize_opts if normalize_opts is not None else cfg.normalize.model_dump(mode="json")}


def _near_fingerprint(cfg: Config, normalize_opts: Optional[dict]) -> dict:
    """What makes two runs' MinHash signatures comparable (and their texts, for verification)."""
    dc = cfg.dedup
    return {"minhash": {k: v for k, v in dc.minhash.model_dump(mode="json").items()
                        if k in ("word_ngram", "char_ngram", "num_perm", "seed")},
            "shingling": dc.shingling.model_dump(mode="json"), "text_normalize": normalize_opts}


# ---- writing a run's index --------------------------------------------------------------------

def hash_part(path: str, normalize: Optional[dict], out_path: str) -> int:
    """The exact hashes of one part's documents into `out_path` (uid, id, h_hi, h_lo)."""
    df = exact_dedup.hash_file(path, normalize)
    write_table_atomic(pa.Table.from_pandas(df[["uid", "id", "h_hi", "h_lo"]], preserve_index=False), Path(out_path))
    return len(df)


class DedupIndexStep(Step):
    """dedup.write_index: this run's dedup as an index a later run can reference (see the module)."""

    name = "dedup_index"
    uses = ("exact_dedup", "near_dedup")  # their removed rows (the keepers) and near dedup's signatures
    config_reads = ("normalize",)  # in a run job, the normalisation its exact hashes were made under (hashed upstream)
    config_sections = ("dedup",)
    counters = ("documents", "exact", "near")

    def __init__(self, reads: str, exact_reads: Optional[str], near_reads: Optional[str], normalize_opts: Optional[dict]):
        super().__init__(reads)
        # the steps whose parts this run's exact and near dedup read (None: that dedup is off)
        self.exact_reads, self.near_reads, self.normalize_opts = exact_reads, near_reads, normalize_opts
        self.near = near_reads is not None

    def reads_steps(self) -> set[str]:
        return super().reads_steps() | {s for s in (self.exact_reads, self.near_reads) if s}

    def summary(self, s: dict) -> str:
        return f"index of {s['documents']} documents (exact hashes: {s['exact']}, MinHash signatures: {s['near']})"

    def run(self, ctx: StepContext, folder: Path) -> StepResult:
        cfg = ctx.cfg
        index: dict[str, Any] = {"format": INDEX_FORMAT, "run": str(ctx.rundir.root.resolve()), "exact": None,
                                 "near": None}
        documents = 0
        if self.exact_reads:
            parts = ctx.parts(self.exact_reads)
            out = folder / "exact"
            out.mkdir()
            counts = ctx.run([delayed(hash_part)(p, self.normalize_opts, str(out / Path(p).name)) for p in parts],
                             "dedup_index: exact hashes")
            documents = int(sum(counts))
            index["exact"] = {"folder": "exact", **_exact_fingerprint(self.normalize_opts, cfg)}
        if self.near and cfg.dedup.minhash.enabled:
            sig_dir = ctx.folder("near_dedup") / "signatures"  # reused by later runs as they are
            index["near"] = {"signatures": [str(p.relative_to(ctx.rundir.root)) for p in sorted(sig_dir.glob("*.parquet"))],
                             # the texts the signatures were made from (exact verification of candidates)
                             "texts": [str(Path(p).relative_to(ctx.rundir.root)) for p in ctx.parts(self.near_reads)],
                             **_near_fingerprint(cfg, self.normalize_opts)}
        keepers = []
        steps = (["exact_dedup"] if self.exact_reads else []) + (["near_dedup"] if self.near else [])
        for step in steps:
            files = ctx.removed_files(step)
            if files:
                keepers.append(read_table(files, columns=["uid", "duplicate_of", "duplicate_of_id"]).to_pandas())
        frame = (pd.concat(keepers, ignore_index=True).drop_duplicates("uid", keep="last") if keepers
                 else pd.DataFrame({"uid": pd.Series(dtype="int64"), "duplicate_of": pd.Series(dtype="int64"),
                                    "duplicate_of_id": pd.Series(dtype="string")}))
        write_table_atomic(pa.Table.from_pandas(frame.reset_index(drop=True), preserve_index=False),
                           folder / "keepers.parquet")
        index["keepers"] = "keepers.parquet"
        # sizes and checksums of every file a later run reads: `dedup --against` names a damaged one before any work
        root = ctx.rundir.root
        index["files"] = describe_files(root, [str(p.relative_to(root)) for p in _named_files(root, folder, index)])
        write_json_atomic(folder / INDEX_FILE, index)
        return StepResult({"documents": documents, "exact": index["exact"] is not None,
                           "near": index["near"] is not None})


# ---- reading earlier runs' indexes --------------------------------------------------------------

def load_index(run_dir: str) -> tuple[Path, dict]:
    """(the index folder, index.json) of an earlier run, or a PipelineError saying what is missing."""
    from ...rundir import RunDir

    folder = RunDir(Path(run_dir)).folder("dedup_index")
    path = folder / INDEX_FILE
    if not path.is_file():
        raise PipelineError(f"dedup.reference {run_dir}: no dedup index ({path} is missing); run it with "
                            "dedup.write_index: true (corpusmill dedup --write-index) to make one")
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise PipelineError(f"dedup.reference {run_dir}: {path} cannot be read: {e}") from None
    if not isinstance(index, dict) or index.get("format") != INDEX_FORMAT:
        raise PipelineError(f"dedup.reference {run_dir}: {path} is not a {INDEX_FORMAT} index")
    return folder, index


def _named_files(run_dir: Path, folder: Path, index: dict) -> list[Path]:
    """Every file a later run reads from this index: the exact hashes' parts, the keepers, and the near
    dedup's signatures and texts (paths in the index are relative to the run directory)."""
    files = []
    if isinstance(index.get("exact"), dict):
        files += sorted((folder / str(index["exact"].get("folder", "exact"))).glob("*.parquet"))
    if index.get("keepers"):
        files.append(folder / str(index["keepers"]))
    near = index.get("near")
    if isinstance(near, dict):
        files += [run_dir / str(rel) for rel in [*near.get("signatures", []), *(near.get("texts") or [])]]
    return files


def _opens(path: Path) -> Optional[str]:
    """What is wrong with a Parquet or Arrow file whose size no index recorded: its footer is read."""
    try:
        if path.suffix == ".arrow":
            with pa.memory_map(str(path)) as source:
                pa.ipc.open_file(source).schema  # noqa: B018 - opening reads the footer
        else:
            pq.ParquetFile(path).metadata  # noqa: B018
    except FileNotFoundError:
        return "missing"
    except (OSError, pa.ArrowException) as e:
        return f"not a readable {'Arrow' if path.suffix == '.arrow' else 'Parquet'} file ({str(e).splitlines()[0][:160]})"
    return None


def verify_reference(run_dir: str) -> tuple[list[str], str]:
    """(one line per problem, a summary when there is none) for an earlier run named in
    dedup.reference: its index, and each file it names against the size and checksum recorded when
    it was written (an index written before they were recorded: each file exists and its Parquet
    footer opens). A file deleted from the exact hashes' folder, or one added to it, is named too."""
    try:
        folder, index = load_index(run_dir)
    except PipelineError as e:
        return [str(e).removeprefix(f"dedup.reference {run_dir}: ")], ""
    root = Path(run_dir)
    named = _named_files(root, folder, index)
    if isinstance(index.get("exact"), dict) and not (folder / str(index["exact"].get("folder", "exact"))).is_dir():
        return [f"{folder / str(index['exact'].get('folder', 'exact'))}: the exact hashes' folder is missing"], ""
    recorded = index.get("files")
    if isinstance(recorded, dict):
        problems = verify_files(root, recorded)
        rels = {str(p.relative_to(root)) for p in named if p.is_relative_to(root)}
        problems += [f"{root / rel}: not written by that run (no size or checksum recorded for it)"
                     for rel in sorted(rels - set(recorded))]
        how = f"{len(recorded)} files match their recorded sizes and {DIGEST} checksums"
    else:
        problems = [f"{p}: {why}" for p in named if (why := _opens(p))]
        how = f"{len(named)} files open (an older index: no checksums recorded)"
    return problems, "" if problems else f"index of {how}"


def _keepers(folder: Path, index: dict) -> pd.DataFrame:
    return read_table(folder / index["keepers"]).to_pandas()


def _resolve(uids: np.ndarray, ids: np.ndarray, keepers: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The document each earlier-run document stands for: itself when that run kept it, else its keeper."""
    if not len(keepers):
        return uids, ids
    table = keepers.set_index("uid")
    hit = np.isin(uids, table.index.to_numpy())
    out_uid, out_id = uids.copy(), ids.astype(object).copy()
    if hit.any():
        out_uid[hit] = table.loc[uids[hit], "duplicate_of"].to_numpy()
        out_id[hit] = table.loc[uids[hit], "duplicate_of_id"].to_numpy()
    return out_uid, out_id


def exact_matches_part(path: str, ref_keys: np.ndarray, normalize: Optional[dict]) -> pd.DataFrame:
    """This part's documents whose exact hash is in `ref_keys` (sorted structured (h_hi, h_lo)): uid,
    id, source and the position of the hash in `ref_keys`."""
    df = exact_dedup.hash_file(path, normalize)
    keys = np.rec.fromarrays([df["h_hi"].to_numpy(), df["h_lo"].to_numpy()], names="h_hi,h_lo")
    if not len(ref_keys) or not len(keys):
        return pd.DataFrame({"uid": [], "id": [], "source": [], "ref": []})
    pos = np.searchsorted(ref_keys, keys).clip(max=len(ref_keys) - 1)
    hit = ref_keys[pos] == keys
    return pd.DataFrame({"uid": df["uid"].to_numpy()[hit], "id": df["id"].to_numpy(dtype=object)[hit],
                         "source": df["source"].to_numpy(dtype=object)[hit], "ref": pos[hit]})


def band_part(path: str, bands: int, rows: int, run: int) -> pd.DataFrame:
    """LSH band keys of one signature part (an earlier run's, as stored), with the run's number."""
    out = near_dedup.minhash_band_part(path, bands, rows)
    out["run"] = np.int64(run)
    return out


class ReferenceDedupStep(removal.DedupStep):
    """dedup.reference: remove documents that duplicate an earlier run's (see the module)."""

    name = "reference_dedup"
    config_reads = ("normalize",)  # as the index step: the normalisation the reference's hashes must share
    kind = "reference"

    def hash_extra(self, cfg: Config, previous: Optional[str]) -> Any:
        """The earlier runs' indexes too: a rebuilt reference reruns this step."""
        stamps = []
        for run_dir in cfg.dedup.reference:
            path = Path(run_dir) / "04b-dedup_index" / INDEX_FILE
            stamps.append([str(Path(run_dir).resolve()), path.stat().st_mtime_ns if path.is_file() else None])
        return [previous, self.kind, self.normalize_opts, stamps]

    def run(self, ctx: StepContext, folder: Path) -> StepResult:
        cfg = ctx.cfg
        refs = [(run_dir, *load_index(run_dir)) for run_dir in cfg.dedup.reference]
        parts = ctx.parts(self.reads)
        removed: list[pd.DataFrame] = []
        stats: dict[str, Any] = {"docs_in": ctx.stats(self.reads)["docs_out"], "reference_runs": [r[0] for r in refs]}
        exact_refs = [r for r in refs if r[2].get("exact")]
        if cfg.dedup.exact and exact_refs:
            removed.append(self._exact(ctx, parts, exact_refs, stats))
        near_refs = [r for r in refs if r[2].get("near")]
        if cfg.dedup.minhash.enabled and near_refs:
            already = np.sort(np.concatenate([r["uid"].to_numpy() for r in removed])) if removed else np.empty(0, np.int64)
            removed.append(self._near(ctx, folder, parts, near_refs, already, stats))
        rows = pd.concat(removed, ignore_index=True) if removed else pd.DataFrame()
        if len(rows):
            write_table_atomic(pa.Table.from_pandas(rows.astype(removal.REMOVED_META.dtypes.to_dict()),
                                                    preserve_index=False), folder / "removed" / "part.0.parquet")
        drop = np.sort(rows["uid"].to_numpy(dtype=np.int64)) if len(rows) else np.empty(0, np.int64)
        passed = removal.remove_documents(ctx, self.reads, folder, drop, None, "reference_dedup: remove")
        stats["docs_out"] = passed.get("docs_out", 0)
        stats["by_group"] = passed.get("by_group", {})
        stats["removed"] = {str(k): int(v) for k, v in rows["reason"].value_counts().items()} if len(rows) else {}
        removal.attach_texts(ctx, folder, self.reads)
        outputs = {"examples": removal.examples(sorted(str(p) for p in (folder / "removed").glob("*.parquet")),
                                                ("id", "duplicate_of_id", "reason"))} if len(rows) else {}
        return StepResult(stats, outputs)

    def _exact(self, ctx: StepContext, parts: list[str], refs: list, stats: dict) -> pd.DataFrame:
        """Documents whose exact hash an earlier run holds."""
        mine = _exact_fingerprint(self.normalize_opts, ctx.cfg)
        tables, runs = [], []
        for k, (run_dir, folder, index) in enumerate(refs):
            if {key: index["exact"].get(key) for key in mine} != mine:
                raise PipelineError(f"dedup.reference {run_dir}: its exact hashes were made with other normalize "
                                    "settings than this run's; they cannot be compared")
            t = read_table(folder / index["exact"]["folder"]).to_pandas()
            t["uid"], t["id"] = _resolve(t["uid"].to_numpy(), t["id"].to_numpy(dtype=object), _keepers(folder, index))
            tables.append(t)
            runs.append(np.full(len(t), k, np.int64))
        ref = pd.concat(tables, ignore_index=True)
        ref["run"] = np.concatenate(runs)
        keys = np.rec.fromarrays([ref["h_hi"].to_numpy(), ref["h_lo"].to_numpy()], names="h_hi,h_lo")
        order = np.argsort(keys, order=("h_hi", "h_lo"), kind="stable")
        ref, keys = ref.iloc[order].reset_index(drop=True), keys[order]
        stats["reference_hashes"] = len(ref)
        shared = ctx.broadcast(keys)
        found = ctx.run([delayed(exact_matches_part)(p, shared, self.normalize_opts) for p in parts],
                        "reference_dedup: exact hashes against the earlier runs")
        hits = pd.concat(found, ignore_index=True) if found else pd.DataFrame()
        if not len(hits):
            return pd.DataFrame()
        matched = ref.iloc[hits["ref"].to_numpy(dtype=np.int64)]
        names = [r[0] for r in refs]
        return pd.DataFrame({
            "uid": hits["uid"].to_numpy(dtype=np.int64), "id": hits["id"].to_numpy(dtype=object),
            "source": hits["source"].to_numpy(dtype=object), "reason": EXACT_REASON, "score": 1.0, "threshold": 1.0,
            "duplicate_of": matched["uid"].to_numpy(dtype=np.int64),
            "duplicate_of_id": [f"{names[r]}::{i}" for r, i in zip(matched["run"].to_numpy(), matched["id"].to_numpy())],
            "cluster_size": np.int64(0), "cluster_id": matched["uid"].to_numpy(dtype=np.int64)})

    def _near(self, ctx: StepContext, folder: Path, parts: list[str], refs: list, already: np.ndarray,
              stats: dict) -> pd.DataFrame:
        """Documents whose MinHash signature shares an LSH band with an earlier run's and whose
        estimated Jaccard similarity reaches the threshold; the earlier signatures are read as stored."""
        import dask.dataframe as dd

        from .minhash_edges import lsh_shape

        cfg, mc = ctx.cfg, ctx.cfg.dedup.minhash
        mine = _near_fingerprint(cfg, self.normalize_opts)
        for run_dir, _, index in refs:
            if {key: index["near"].get(key) for key in mine} != mine:
                raise PipelineError(f"dedup.reference {run_dir}: its MinHash signatures were made with other "
                                    "dedup.minhash (word_ngram, char_ngram, num_perm, seed) or dedup.shingling "
                                    "settings than this run's; they cannot be compared")
        spec = signatures.signature_spec(cfg, self.normalize_opts)
        sig_dir = folder / "signatures"
        sig_paths = [str(sig_dir / Path(p).name) for p in parts]
        ctx.run([delayed(near_dedup.signature_part)(p, s, spec) for p, s in zip(parts, sig_paths)],
                "reference_dedup: this run's MinHash signatures")
        bands, rows = lsh_shape(ctx)
        ref_paths = [(k, str(Path(run_dir) / rel)) for k, (run_dir, _, index) in enumerate(refs)
                     for rel in index["near"]["signatures"]]
        rows_est = bands * (sum(pq.ParquetFile(p).metadata.num_rows for _, p in ref_paths)
                            + sum(pq.ParquetFile(p).metadata.num_rows for p in sig_paths))
        if rows_est * 24 <= cfg.dedup.components_memory_mb << 20:  # the band rows fit: join them in the driver
            theirs_rows = pd.concat(ctx.run([delayed(band_part)(p, bands, rows, k) for k, p in ref_paths],
                                            "reference_dedup: earlier runs' LSH bands"), ignore_index=True)
            ours_rows = pd.concat(ctx.run([delayed(near_dedup.minhash_band_part)(p, bands, rows) for p in sig_paths],
                                          "reference_dedup: this run's LSH bands"), ignore_index=True)
            pairs = ours_rows.merge(theirs_rows.rename(columns={"uid": "ref_uid"}), on="band_key")[["uid", "ref_uid", "run"]]
            pairs = pairs.drop_duplicates().reset_index(drop=True)
        else:
            meta = minhash.BAND_META.assign(run=pd.Series(dtype="int64"))
            theirs = dd.from_map(lambda a: band_part(a[1], bands, rows, a[0]), ref_paths, meta=meta,
                                 enforce_metadata=False)
            ours = dd.from_map(near_dedup.minhash_band_part, sig_paths, bands=bands, rows=rows, meta=minhash.BAND_META,
                               enforce_metadata=False)
            pairs = ours.merge(theirs.rename(columns={"uid": "ref_uid"}), on="band_key")[["uid", "ref_uid", "run"]]
            pairs = ctx.compute(pairs.drop_duplicates(), "reference_dedup: LSH bands against the earlier runs")
        if len(already):
            pairs = pairs[~np.isin(pairs["uid"].to_numpy(), already)]
        stats["reference_candidates"] = len(pairs)
        if not len(pairs):
            return pd.DataFrame()
        ours_sig = near_dedup.signature_lookup(
            ctx.run([delayed(near_dedup.rows_for_uids)(p, np.unique(pairs["uid"].to_numpy()), ["uid", "minhash"])
                     for p in sig_paths], "reference_dedup: candidate signatures"), "minhash")
        sim = np.zeros(len(pairs))
        for k, (run_dir, _, index) in enumerate(refs):
            sel = pairs["run"].to_numpy() == k
            if not sel.any():
                continue
            want = np.unique(pairs["ref_uid"].to_numpy()[sel])
            paths = [str(Path(run_dir) / rel) for rel in index["near"]["signatures"]]
            theirs_sig = near_dedup.signature_lookup(
                ctx.run([delayed(near_dedup.rows_for_uids)(p, want, ["uid", "minhash"]) for p in paths],
                        "reference_dedup: earlier signatures"), "minhash")
            sim[sel] = minhash.signature_jaccard(near_dedup.lookup(*ours_sig, pairs["uid"].to_numpy()[sel]),
                                                 near_dedup.lookup(*theirs_sig, pairs["ref_uid"].to_numpy()[sel]))
        pairs = pairs.assign(similarity=sim)
        if mc.verify:  # as this run's own near dedup: the estimate's floor, then the true Jaccard of the texts
            pairs = pairs[pairs["similarity"] >= minhash.estimate_floor(mc.threshold, mc.num_perm)]
            pairs = self._verify(ctx, parts, refs, pairs.reset_index(drop=True), spec)
            pairs = pairs[pairs["similarity"] >= mc.threshold]
        stats["reference_near_pairs"] = len(pairs)
        if not len(pairs):
            return pd.DataFrame()
        best = pairs.sort_values(["uid", "similarity", "run", "ref_uid"], ascending=[True, False, True, True])
        best = best.drop_duplicates("uid").reset_index(drop=True)
        keeper_uid = best["ref_uid"].to_numpy(dtype=np.int64).copy()
        keeper_id = np.empty(len(best), dtype=object)
        for k, (run_dir, ref_folder, index) in enumerate(refs):
            sel = best["run"].to_numpy() == k
            if not sel.any():
                continue
            paths = [str(Path(run_dir) / rel) for rel in index["near"]["signatures"]]
            want = np.unique(keeper_uid[sel])
            ids = pd.concat(ctx.run([delayed(near_dedup.rows_for_uids)(p, want, ["uid", "id"]) for p in paths],
                                    "reference_dedup: earlier ids"), ignore_index=True).set_index("uid")["id"]
            uid_k, id_k = _resolve(keeper_uid[sel], ids.loc[keeper_uid[sel]].to_numpy(dtype=object),
                                   _keepers(ref_folder, index))
            keeper_uid[sel], keeper_id[sel] = uid_k, [f"{run_dir}::{i}" for i in id_k]
        info = pd.concat(ctx.run([delayed(near_dedup.rows_for_uids)(p, np.sort(best["uid"].to_numpy()), ["uid", "id", "source"])
                                  for p in sig_paths], "reference_dedup: removed ids"), ignore_index=True).set_index("uid")
        return pd.DataFrame({
            "uid": best["uid"].to_numpy(dtype=np.int64), "id": info.loc[best["uid"], "id"].to_numpy(dtype=object),
            "source": info.loc[best["uid"], "source"].to_numpy(dtype=object), "reason": NEAR_REASON,
            "score": best["similarity"].to_numpy(), "threshold": mc.threshold, "duplicate_of": keeper_uid,
            "duplicate_of_id": keeper_id, "cluster_size": np.int64(0), "cluster_id": keeper_uid})

    def _verify(self, ctx: StepContext, parts: list[str], refs: list, pairs: pd.DataFrame,
                spec: near_dedup.SignatureSpec) -> pd.DataFrame:
        """The true Jaccard of each candidate pair's shingle sets: this run's texts from its parts, the
        earlier run's from the parts its near dedup read (named in its index)."""
        if not len(pairs):
            return pairs
        want = np.unique(pairs["uid"].to_numpy())
        ours = pd.concat(ctx.run([delayed(near_dedup.texts_for_uids)(p, want, spec.normalize) for p in parts],
                                 "reference_dedup: texts to verify"), ignore_index=True).set_index("uid")["text"]
        theirs = np.empty(len(pairs), dtype=object)
        for k, (run_dir, _, index) in enumerate(refs):
            sel = pairs["run"].to_numpy() == k
            if not sel.any():
                continue
            texts = index["near"].get("texts") or []
            wanted = np.unique(pairs["ref_uid"].to_numpy()[sel])
            found = pd.concat(ctx.run([delayed(near_dedup.texts_for_uids)(str(Path(run_dir) / rel), wanted, spec.normalize)
                                       for rel in texts], "reference_dedup: earlier texts to verify"),
                              ignore_index=True).set_index("uid")["text"] if texts else pd.Series(dtype=object)
            missing = np.setdiff1d(wanted, found.index.to_numpy())
            if len(missing):
                raise PipelineError(f"dedup.reference {run_dir}: {len(missing)} documents named by its signatures are "
                                    "not in the parts its index lists (was the run changed or moved?)")
            theirs[sel] = found.loc[pairs["ref_uid"].to_numpy()[sel]].to_numpy()
        checked = near_dedup.verify_pairs_exact(np.arange(len(pairs)), np.arange(len(pairs)),
                                                ours.loc[pairs["uid"].to_numpy()].tolist(), list(theirs),
                                                spec.minhash, None)
        return pairs.assign(similarity=checked["similarity"].to_numpy())


EXACT_ONLY_COLUMNS = ("h_hi", "h_lo", "language", "raw_chars")  # what the signature pass adds for exact dedup


def filter_signatures(src: str, part: str, out_path: str, exclude: Optional[np.ndarray] = None) -> dict:
    """The rows of an already computed signature part (`src`) for the documents of `part` (less the
    sorted uids `exclude`, removed by a find phase whose removal is deferred), written to `out_path`,
    with the stats `near_dedup.signature_part` returns."""
    uids = np.sort(read_table(part, columns=["uid"]).column("uid").to_numpy())
    if exclude is not None:
        uids = uids[~in_sorted(uids, exclude)]
    table = read_table(src)
    table = table.filter(pa.array(in_sorted(table.column("uid").to_numpy(), uids)))
    if table.num_rows != len(uids):
        raise ValueError(f"{src}: holds {table.num_rows} of the {len(uids)} documents of {part}")
    table = table.drop([c for c in EXACT_ONLY_COLUMNS if c in table.column_names])
    write_table_atomic(table, Path(out_path))
    stats = {"docs": table.num_rows, "keep_field_missing": table.column("keep_key").null_count}
    if "minhash_shingles" in table.column_names:
        stats["minhash_shingles"] = int(pc.sum(table.column("minhash_shingles")).as_py() or 0)
    return stats


def reused_signatures(ctx: StepContext, parts: list[str], sig_paths: list[str], exclude: Any = None) -> Optional[list]:
    """When this run's reference_dedup already computed the signatures (with the same settings), the
    near dedup step takes its documents' rows from them instead of computing them again; None when it
    cannot (no reference step, or a part it did not see)."""
    folder = ctx.folder("reference_dedup") / "signatures"
    if not cfg_has_reference(ctx) or not folder.is_dir():
        return None
    sources = [folder / Path(p).name for p in parts]
    if not all(s.is_file() for s in sources):
        return None
    return ctx.run([delayed(filter_signatures)(str(s), p, o, exclude) for s, p, o in zip(sources, parts, sig_paths)],
                   "near_dedup: signatures (reused from reference_dedup)")


def cfg_has_reference(ctx: StepContext) -> bool:
    return bool(ctx.cfg.dedup.reference) and ctx.cfg.dedup.minhash.enabled
