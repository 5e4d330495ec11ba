"""exact_dedup: documents whose normalised text hashes equal to a lower uid's are removed.

Find apart from remove: the hashes of every part are shuffled on the hash so every copy of a text
meets in one partition (bounded memory per worker), the duplicates found there are written as
removed rows, then a second pass copies the parts without them."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import dask.dataframe as dd

from corpusmill.stages import exact_dedup
from corpusmill.stages.base import REMOVED_META

from ...step import StepContext, StepResult
from . import removal


class ExactDedupStep(removal.DedupStep):
    name = "exact_dedup"
    kind = "exact"

    def run(self, ctx: StepContext, folder: Path) -> StepResult:
        parts = ctx.parts(self.reads)
        hashes = dd.from_map(exact_dedup.hash_file, parts, normalize=self.normalize_opts, meta=exact_dedup.HASH_META,
                             enforce_metadata=False)
        ctx.write_partitions(find_duplicates(hashes), folder / "removed", "exact_dedup: grouping hashes across partitions (Dask shuffle)")
        files = sorted(str(p) for p in (folder / "removed").glob("*.parquet"))
        drop = removal.removed_uids(files)
        stats = removal.remove_documents(ctx, self.reads, folder, drop, "exact", "exact_dedup: remove")
        outputs = {}
        if len(drop):
            outputs["examples"] = removal.examples(files, ("id", "duplicate_of_id", "cluster_size"))
        removal.attach_texts(ctx, folder, self.reads)
        return StepResult(stats, outputs)


def find_duplicates(hashes: Any) -> Any:
    """Lazy Dask frame of the removed rows: documents whose hash occurs at a lower uid. One shuffle
    on the hash puts every copy of a text in the same partition; the grouping there is pandas."""
    grouped = hashes.shuffle(on=["h_hi", "h_lo"], npartitions=max(1, hashes.npartitions))
    return grouped.map_partitions(exact_dedup.duplicates_in_group, meta=REMOVED_META)
