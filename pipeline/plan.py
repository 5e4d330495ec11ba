"""The plan: which steps a job runs, in which order, each reading which step's parts. The one place
that knows the order; the runner only executes a plan (docs/ARCHITECTURE.md, "The plan")."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .config import Config
from .step import DeclaredConfig, Step
from .steps.dedup.exact import ExactDedupStep
from .steps.dedup.near import NearDedupStep
from .steps.dedup.paragraph import ParagraphDedupStep
from .steps.dedup.reference import DedupIndexStep, ReferenceDedupStep
from .steps.dedup.signatures import read_spec
from .steps.decontaminate import DecontaminateStep
from .steps.export import ExportStep
from .steps.filter import FilterStep, NormalizeStep
from .steps.pii import PiiStep
from .steps.read import ReadStep
from .steps.shard import ShardStep
from .steps.tokenize import PackStep, TokenizeStep

JOBS = ("run", "dedup")


@dataclass
class Plan:
    job: str
    steps: list[Step]
    train: bool  # hand the shards to training when the steps are done

    def names(self) -> list[str]:
        """Every step in order, training included (progress.json lists them up front)."""
        return [s.name for s in self.steps] + (["train"] if self.train else [])

    def links(self, cfg: Config) -> dict[str, str]:
        """Each step's link of the resume hash chain: its config sections and what `hash_extra` adds
        (by default the link before it, so a change upstream reruns everything after it)."""
        links: dict[str, str] = {}
        previous: Optional[str] = None
        for step in self.steps:
            if not step.resumable:
                continue
            previous = cfg.section_hash(*step.config_sections, extra=step.hash_extra(DeclaredConfig(cfg, step), previous),
                                        ignore=step.hash_ignores)
            links[step.name] = previous
        return links


def build_plan(cfg: Config, job: str) -> Plan:
    """run: read, normalize, filter, pii (when enabled), dedup (exact, near, paragraph when enabled),
    decontaminate (when sets are named), tokenize, pack, shard (then training when enabled); pack is
    left out when shard.format is megatron (whole documents only).
    dedup: read, dedup, export (the original text is kept; dedup normalises only for hashing)."""
    if job not in JOBS:
        raise ValueError(f"unknown job {job!r}")
    # a dedup job signs each part as it reads it (its first dedup step takes those signatures)
    steps: list[Step] = [ReadStep(read_spec(cfg, cfg.normalize.model_dump()) if job == "dedup" else None)]
    if job == "run":
        steps += [NormalizeStep(reads="read"), FilterStep(reads="normalize")]
        if cfg.pii.enabled:
            steps.append(PiiStep(reads="filter"))
    normalize_opts = cfg.normalize.model_dump() if job == "dedup" else None
    if cfg.dedup.reference:
        steps.append(ReferenceDedupStep(reads=steps[-1].name, normalize_opts=normalize_opts))
    exact_reads = steps[-1].name if cfg.dedup.exact else None
    near = cfg.dedup.minhash.enabled or cfg.dedup.simhash.enabled
    # a dedup job without an index writes the kept text once: its dedup steps only find, and the
    # export drops what they found from exact dedup's input parts as it writes kept/
    to_export = job == "dedup" and cfg.dedup.exact and not cfg.dedup.write_index
    if cfg.dedup.exact:  # followed by near dedup, exact only finds: near's one removal pass drops both
        steps.append(ExactDedupStep(reads=steps[-1].name, normalize_opts=normalize_opts, defer_removal=near or to_export))
    near_reads = None
    if near:
        near_reads = exact_reads or steps[-1].name  # the parts its documents are in
        steps.append(NearDedupStep(reads=steps[-1].name, normalize_opts=normalize_opts, parts_from=exact_reads,
                                   defer_removal=to_export))
    if job == "run" and cfg.dedup.paragraph.enabled:  # the documents near dedup kept lose their repeated paragraphs
        steps.append(ParagraphDedupStep(reads=steps[-1].name))
    if job == "run" and cfg.decontaminate.sets:
        steps.append(DecontaminateStep(reads=steps[-1].name))
    last_documents = steps[-1].name
    if cfg.dedup.write_index:
        steps.append(DedupIndexStep(reads=last_documents, exact_reads=exact_reads, near_reads=near_reads,
                                    normalize_opts=normalize_opts))
    if job == "dedup":
        return Plan(job, steps + [ExportStep(reads=last_documents, parts_from=exact_reads if to_export else None)], train=False)
    if cfg.shard.format == "megatron":  # whole documents: Megatron's loader packs at train time
        steps += [TokenizeStep(reads=last_documents), ShardStep(reads="tokenize")]
    else:
        steps += [TokenizeStep(reads=last_documents), PackStep(reads="tokenize"), ShardStep(reads="pack")]
    return Plan(job, steps, train=cfg.train.enabled)
