"""exact_dedup: documents whose normalised text hashes equal to a lower uid's are removed.
Find apart from remove: the hashes come from the signature pass (`signatures.py`: one read and one
normalisation per document, which also makes near dedup's signatures when that step follows); every
copy of a hash is brought together (in the driver while the hashes fit `dedup.components_memory_mb`,
else by a Dask shuffle on the hash, bounded memory per worker), the duplicates found there are
written as removed rows, then a second pass copies the parts without them (or, when near dedup
follows, near dedup's one removal pass drops them with its own: `defer_removal`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import dask.dataframe as dd
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from corpusmill.stages import exact_dedup, near_dedup
from corpusmill.stages.base import REMOVED_META, read_table, write_table_atomic

from ...step import StepContext, StepResult
from . import removal, signatures

HASH_COLUMNS = ["uid", "id", "source", "h_hi", "h_lo"]
ROW_BYTES = 256  # a hash row in the driver's frame, its id and source strings and the grouping's temporaries


class ExactDedupStep(removal.DedupStep):
    name = "exact_dedup"
    kind = "exact"
    names_keepers = True  # its duplicate_of is a document of this run (reference dedup's is an earlier run's)

    def __init__(self, reads: str, normalize_opts: Optional[dict], defer_removal: bool = False):
        super().__init__(reads, normalize_opts)
        # near dedup follows: this step only finds (removed rows, counts); near's removal pass drops
        # these documents with its own, so the kept parts are written once (the plan sets it)
        self.defer_removal = defer_removal

    def run(self, ctx: StepContext, folder: Path) -> StepResult:
        dc = ctx.cfg.dedup
        parts = ctx.parts(self.reads)
        # near dedup follows (and does not take its signatures from reference_dedup): make them in this pass
        near = (dc.minhash.enabled or dc.simhash.enabled) and not (dc.reference and dc.minhash.enabled)
        spec = signatures.signature_spec(ctx.cfg, self.normalize_opts, exact=True, near=near)
        sig_dir = ctx.folder(self.reads) / near_dedup.SIGNATURES
        if self.reads == "read" and signatures.reusable(sig_dir, spec, parts, full=True):
            sig_files = [str(sig_dir / Path(p).name) for p in parts]  # the read step signed its parts
            n_docs = sum(pq.read_metadata(f).num_rows for f in sig_files)
        else:
            sig_dir = folder / "signatures"
            label = "exact_dedup: hashes" + (" and near-duplicate signatures (one pass)" if near else "")
            results = signatures.compute(ctx, parts, sig_dir, spec, label)
            sig_files = [str(sig_dir / Path(p).name) for p in parts]
            n_docs = sum(r["docs"] for r in results)
        if n_docs * ROW_BYTES <= dc.components_memory_mb << 20:
            removed = find_duplicates_in_memory(sig_files)
            if len(removed):
                write_table_atomic(pa.Table.from_pandas(removed, preserve_index=False), folder / "removed" / "part.0.parquet")
        else:
            hashes = dd.from_map(near_dedup.load_signatures, sig_files, fields=HASH_COLUMNS, meta=exact_dedup.HASH_META,
                                 enforce_metadata=False)
            ctx.write_partitions(find_duplicates(hashes), folder / "removed",
                                 "exact_dedup: grouping hashes across partitions (Dask shuffle)")
        files = sorted(str(p) for p in (folder / "removed").glob("*.parquet"))
        drop = removal.removed_uids(files)
        if self.defer_removal:
            stats = removal.passed_on(ctx, sig_files, drop)
        else:
            stats = removal.remove_documents(ctx, self.reads, folder, drop, "exact", "exact_dedup: remove", [folder])
        outputs = {}
        if len(drop):
            outputs["examples"] = removal.examples(files, ("id", "duplicate_of_id", "cluster_size"))
        return StepResult(stats, outputs)


def find_duplicates_in_memory(sig_files: list[str]) -> pd.DataFrame:
    """The removed rows of `find_duplicates`, from every part's hashes read into the driver at once
    (the same kernel on one frame holding every copy of every hash)."""
    if not sig_files:
        return REMOVED_META.copy()
    hashes = read_table(sig_files, columns=HASH_COLUMNS).to_pandas()
    return exact_dedup.duplicates_in_group(hashes)


def find_duplicates(hashes: Any) -> Any:
    """Lazy Dask frame of the removed rows: documents whose hash occurs at a lower uid. One shuffle
    on the hash puts every copy of a text in the same partition; the grouping there is pandas."""
    grouped = hashes.shuffle(on=["h_hi", "h_lo"], npartitions=max(1, hashes.npartitions))
    return grouped.map_partitions(exact_dedup.duplicates_in_group, meta=REMOVED_META)
