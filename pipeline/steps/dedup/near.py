"""near_dedup: signatures -> candidate edges (MinHash LSH, SimHash blocks) -> clusters -> keepers ->
removal. Each phase is a module of this package; this step only wires them in order."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import dask.dataframe as dd
import pyarrow as pa
from dask import delayed

from corpusmill.stages import near_dedup
from corpusmill.stages.base import write_table_atomic

from ...config import Config
from ...step import PipelineError, StepContext, StepResult
from . import clustering, reference, removal, signatures
from .minhash_edges import minhash_edges
from .simhash_edges import simhash_edges


class NearDedupStep(removal.DedupStep):
    name = "near_dedup"
    # exact dedup's removed rows and the signatures its pass (or a dedup job's read pass, or reference
    # dedup) made for these documents
    uses = ("exact_dedup", "read", "reference_dedup")
    kind = "near"
    names_keepers = True  # its duplicate_of is a document of this run (reference dedup's is an earlier run's)
    outputs = {"examples": list, "largest_clusters": list}

    def signature_spec(self, cfg: Config) -> near_dedup.SignatureSpec:
        return signatures.signature_spec(cfg, self.normalize_opts)

    @staticmethod
    def _check_keep_field(ctx: StepContext, name: str, docs: int, results: list[dict]) -> int:
        """With keep: field, the documents without the field (they lose in their cluster). None
        having it is a misspelt or absent field: an error, never a silent fall back to the lowest uid."""
        missing = sum(r["keep_field_missing"] for r in results)
        if docs and missing == docs:
            raise PipelineError(f"keep field {name!r} (dedup.keep_field, --keep field:{name}): none of the {docs} "
                                f"documents has it (or every value is null); name a field the input records carry, "
                                f"or keep lowest_uid or longest")
        if missing:
            ctx.log(f"  near_dedup: {missing} of {docs} documents have no {name!r} field; in a cluster they lose to one that has it")
        return missing

    def __init__(self, reads: str, normalize_opts: Optional[dict], parts_from: Optional[str] = None,
                 defer_removal: bool = False):
        super().__init__(reads, normalize_opts)
        # the exact step before this one only found its duplicates: its documents are still in the
        # parts of `parts_from` (its input), and this step's removal pass drops both (the plan sets it)
        self.parts_from = parts_from
        # a dedup job's export drops both sets as it writes kept/ (the plan sets it): this step only finds
        self.defer_removal = defer_removal

    def reads_steps(self) -> set[str]:
        return super().reads_steps() | ({self.parts_from} if self.parts_from else set())

    def _from_exact(self, ctx: StepContext, parts: list[str], sig_paths: list[str],
                    spec: near_dedup.SignatureSpec, exclude: Any) -> Optional[list]:
        """This run's exact dedup step made the signatures in its pass, or the read step of a dedup job
        as it read the parts (when they are of the parts this step's input came from, with the same
        settings): take the rows of the documents exact dedup kept. None when neither did."""
        owners = (["exact_dedup"] if self.reads == "exact_dedup" else []) + (["read"] if (self.parts_from or self.reads) == "read" else [])
        folders = [ctx.folder(o) / "signatures" for o in owners]
        folder = next((f for f in folders if signatures.reusable(f, spec, parts)), None)
        if folder is None:
            return None
        return ctx.run([delayed(reference.filter_signatures)(str(folder / Path(p).name), p, o, exclude)
                        for p, o in zip(parts, sig_paths)], "near_dedup: signatures (from the " + folder.parent.name + " pass)")

    def _counted_from(self, ctx: StepContext, parts: list[str], spec: near_dedup.SignatureSpec) -> Optional[list[str]]:
        """With the removal deferred to the export: the signature files holding the source, language
        and stored length of every document of `parts` (the exact step's, or the read step's), from
        which this step counts what it passes on. None when neither is there (a run directory an
        earlier version started): this step then writes its parts as before (the export still drops
        every found duplicate from the read parts, so kept/ is the same)."""
        full = signatures.signature_spec(ctx.cfg, self.normalize_opts, exact=True,
                                         near=not (ctx.cfg.dedup.reference and ctx.cfg.dedup.minhash.enabled))
        for owner in ("exact_dedup", "read"):
            folder = ctx.folder(owner) / "signatures"
            if signatures.reusable(folder, full, parts, full=True):
                return [str(folder / Path(p).name) for p in parts]
        return None

    def run(self, ctx: StepContext, folder: Path) -> StepResult:
        dc = ctx.cfg.dedup
        source = self.parts_from or self.reads
        parts = ctx.parts(source)
        pending = removal.removed_uids(ctx.removed_files("exact_dedup")) if self.parts_from else None
        exclude = ctx.broadcast(pending) if pending is not None and len(pending) else None
        nparts = max(1, len(parts))
        spec = self.signature_spec(ctx.cfg)
        sig_paths = [str(folder / "signatures" / Path(p).name) for p in parts]
        results = reference.reused_signatures(ctx, parts, sig_paths, exclude) or \
            self._from_exact(ctx, parts, sig_paths, spec, exclude) or \
            signatures.compute(ctx, parts, folder / "signatures", spec, "near_dedup: signatures", exclude)
        stats: dict = {"docs_in": sum(r["docs"] for r in results), "edges": {}}
        if spec.keep_field:
            stats["keep_field_missing"] = self._check_keep_field(ctx, spec.keep_field, stats["docs_in"], results)
        edge_sets = []
        if dc.minhash.enabled:
            edge_sets.append(minhash_edges(ctx, sig_paths, parts, spec, stats))
        if dc.simhash.enabled:
            edge_sets.append(simhash_edges(ctx, sig_paths, parts, spec, stats))
        edge_files = clustering.write_edges(ctx, edge_sets, folder / "edges", stats)
        n_edges = clustering.edge_count(edge_files)
        in_memory = n_edges * 16 <= dc.components_memory_mb << 20
        mode = "in_memory" if in_memory else "distributed"
        if in_memory:
            labels = clustering.cluster_in_memory(edge_files)
        else:
            labels = clustering.cluster_distributed(ctx, dd.read_parquet(edge_files, columns=["a", "b"]))
        ctx.log(f"  near_dedup: {n_edges} edges -> connected components {mode.replace('_', ' ')} "
                f"(edge list {n_edges * 16 / 2**20:.1f} MiB, budget {dc.components_memory_mb} MiB)")
        stats["components_mode"] = mode
        if in_memory:
            removed = removal.near_removed_in_memory(ctx, labels, edge_files, sig_paths, parts, spec, stats)
            if len(removed):
                write_table_atomic(pa.Table.from_pandas(removed, preserve_index=False), folder / "removed" / "part.0.parquet")
        else:
            removed = removal.near_removed_distributed(ctx, labels, edge_files, sig_paths, nparts, parts, spec, stats)
            ctx.write_partitions(removed, folder / "removed", "near_dedup: keepers per cluster (Dask shuffle)")
        outputs = removal.finish_near(ctx, folder, source, stats, pending,
                                      self._counted_from(ctx, parts, spec) if self.defer_removal else None)
        return StepResult(stats, outputs)
