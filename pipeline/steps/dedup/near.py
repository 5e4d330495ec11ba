"""near_dedup: signatures -> candidate edges (MinHash LSH, SimHash blocks) -> clusters -> keepers ->
removal. Each phase is a module of this package; this step only wires them in order."""
from __future__ import annotations

from pathlib import Path

import dask.dataframe as dd
import pyarrow as pa
from dask import delayed

from corpusmill.stages import near_dedup
from corpusmill.stages.base import write_table_atomic
from corpusmill.stages.shingles import ShingleSpec

from ...config import Config
from ...step import PipelineError, StepContext, StepResult
from . import clustering, reference, removal
from .minhash_edges import minhash_edges
from .simhash_edges import simhash_edges


class NearDedupStep(removal.DedupStep):
    name = "near_dedup"
    kind = "near"

    def signature_spec(self, cfg: Config) -> near_dedup.SignatureSpec:
        dc, sh = cfg.dedup, cfg.dedup.shingling
        return near_dedup.SignatureSpec(
            minhash=ShingleSpec(dc.minhash.word_ngram, dc.minhash.char_ngram, sh.lowercase, sh.strip_punctuation,
                                sh.cjk_share, sh.unit) if dc.minhash.enabled else None,
            num_perm=dc.minhash.num_perm,
            seed=dc.minhash.seed,
            simhash=ShingleSpec(dc.simhash.word_ngram, dc.simhash.char_ngram, sh.lowercase, sh.strip_punctuation,
                                sh.cjk_share, dc.simhash.unit) if dc.simhash.enabled else None,
            verify=ShingleSpec(dc.minhash.word_ngram, dc.minhash.char_ngram, sh.lowercase, sh.strip_punctuation,
                               sh.cjk_share, sh.unit),
            keep_field=dc.keep_field if dc.keep == "field" else None,
            normalize=self.normalize_opts,
        )

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

    def run(self, ctx: StepContext, folder: Path) -> StepResult:
        dc = ctx.cfg.dedup
        parts = ctx.parts(self.reads)
        nparts = max(1, len(parts))
        spec = self.signature_spec(ctx.cfg)
        sig_paths = [str(folder / "signatures" / Path(p).name) for p in parts]
        results = reference.reused_signatures(ctx, parts, sig_paths) or \
            ctx.run([delayed(near_dedup.signature_part)(p, s, spec) for p, s in zip(parts, sig_paths)],
                    "near_dedup: signatures")
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
            removed = removal.near_removed_in_memory(ctx, labels, edge_files, sig_paths, parts, spec)
            if len(removed):
                write_table_atomic(pa.Table.from_pandas(removed, preserve_index=False), folder / "removed" / "part.0.parquet")
        else:
            removed = removal.near_removed_distributed(ctx, labels, edge_files, sig_paths, nparts)
            ctx.write_partitions(removed, folder / "removed", "near_dedup: keepers per cluster (Dask shuffle)")
        outputs = removal.finish_near(ctx, folder, self.reads, stats)
        removal.attach_texts(ctx, folder, self.reads)
        return StepResult(stats, outputs)
