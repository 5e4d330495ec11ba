"""pii: personal data found after the filter and replaced, counted, or its documents dropped (reason
`pii`); counts per kind reach the ledger and the report, with masked examples (stages/pii.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from corpusmill.stages import pii

from ..step import DocumentStep, StepContext, StepResult


class PiiStep(DocumentStep):
    name = "pii"
    config_sections = ("pii",)
    counters = ("docs_in", "docs_out", "removed", "pii_matches", "pii_docs")
    outputs = {"examples": dict}

    def run(self, ctx: StepContext, folder: Path) -> StepResult:
        pc = ctx.cfg.pii
        kwargs = {"actions": pc.actions(), "tokens": pc.tokens(), "examples": pc.examples,
                  "audit_text_chars": pc.audit_text_chars}
        stats, results = ctx.map_parts(self.reads, folder, pii.pii_batch, kwargs, split_mb=64)
        examples: dict[str, list[dict[str, Any]]] = {}
        for r in results:  # merged stats keep one part's list: gather every part's, then cut
            for kind, items in (r["stats"].get("pii_examples") or {}).items():
                examples.setdefault(kind, []).extend(items)
        stats.pop("pii_examples", None)
        stats["actions"] = pc.actions()
        found = ", ".join(f"{k} {v}" for k, v in stats.get("pii_matches", {}).items() if v)
        ctx.log(f"  pii: {found or 'nothing found'}")
        return StepResult(stats, {"examples": {k: v[:pc.examples] for k, v in examples.items()}})
