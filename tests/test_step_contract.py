"""The step contract: what a step may read of the config is what it declares, and what it declares
is reflected in the resume chain (pipeline/step.py: config_sections, config_reads, DeclaredConfig)."""
from __future__ import annotations

import pickle

import pytest

from corpusmill.pipeline.config import parse_config
from corpusmill.pipeline.plan import build_plan
from corpusmill.pipeline.step import (SECTIONS, DeclaredConfig, DocumentStep, Step, UndeclaredConfigRead,
                                     UndeclaredStepRead)

# every optional step on: pii, reference dedup + index, paragraph dedup, decontamination, a mixture
FULL = {"pii": {"enabled": True}, "dedup": {"write_index": True, "reference": ["/nonexistent/index"],
                                            "paragraph": {"enabled": True}},
        "decontaminate": {"sets": [{"name": "eval", "path": "/nonexistent/eval.jsonl"}]},
        "split": {"validation": 0.1}, "mix": {"sources": [{"match": {"source": "a"}, "weight": 1.0}]}}


class _Toy(DocumentStep):
    name = "toy"
    config_sections = ("pack",)
    config_reads = ("tokenizer",)


def test_a_step_reads_what_it_declares_and_nothing_else():
    cfg = parse_config({"pack": {"seq_length": 64}})
    view = DeclaredConfig(cfg, _Toy())
    assert view.pack.seq_length == 64 and view.tokenizer is cfg.tokenizer
    assert view.section_hash("pack") == cfg.section_hash("pack")
    with pytest.raises(UndeclaredConfigRead, match="step toy read config section 'shard'"):
        _ = view.shard
    with pytest.raises(UndeclaredConfigRead, match="'dedup'"):
        view.section_hash("pack", "dedup")
    with pytest.raises(AttributeError):
        view.pack = None
    again = pickle.loads(pickle.dumps(view))  # a task given the view keeps its limits on the worker
    assert again.pack.seq_length == 64
    with pytest.raises(UndeclaredConfigRead):
        _ = again.mix
    assert DeclaredConfig(view, _Toy())._cfg is cfg  # a view of a view is the same view


@pytest.mark.parametrize("job", ["run", "dedup"])
def test_every_declared_read_is_hashed_upstream_or_in_the_steps_own_link(job):
    """A section a step reads but does not hash whole must be hashed whole by an earlier step of the
    chain (a change to it reruns that step and so this one), or the step adds its part in hash_extra."""
    for over in ({}, FULL, {"shard": {"format": "megatron"}, "tokenizer": {"add_eos": True}, "train": {"enabled": False}}):
        plan = build_plan(parse_config(over), job)
        hashed: set[str] = set()
        for step in plan.steps:
            assert set(step.config_sections) | set(step.config_reads) <= SECTIONS, step.name
            own_extra = type(step).hash_extra is not Step.hash_extra
            for section in step.config_reads:
                if step.resumable and section not in hashed:
                    assert own_extra, (f"{job}: step {step.name} reads {section!r}, which no step before it hashes, "
                                       f"and has no hash_extra of its own")
            if step.resumable:
                hashed |= set(step.config_sections)
                if getattr(step, "normalize_opts", None) is not None:  # a dedup job's steps hash the normalisation given them
                    hashed.add("normalize")


class _Reader(Step):
    name = "pack"
    uses = ("filter",)


def test_a_step_reads_the_results_of_the_steps_it_declares_and_no_other(step_context):
    ctx = step_context
    for name in ("tokenize", "filter", "exact_dedup"):
        ctx.rundir.folder(name).mkdir(parents=True)
    step = _Reader(reads="tokenize")
    ctx.begin(step, None, None)
    assert ctx.parts("tokenize") == [] and ctx.parts("filter") == []  # what it reads, what it uses
    assert ctx.folder("pack") == ctx.rundir.folder("pack")  # its own
    for read in (lambda: ctx.parts("exact_dedup"), lambda: ctx.removed_files("exact_dedup"),
                 lambda: ctx.folder("exact_dedup"), lambda: ctx.stats("exact_dedup"), lambda: ctx.link("exact_dedup")):
        with pytest.raises(UndeclaredStepRead, match="step pack read the results of step exact_dedup"):
            read()


def test_steps_reach_other_steps_folders_only_through_the_context():
    """ctx.folder / ctx.removed_files check the declaration; the run directory's own methods do not."""
    import re
    from pathlib import Path

    steps = Path(__file__).resolve().parents[1] / "pipeline" / "steps"
    found = [f"{f.name}:{i}" for f in steps.rglob("*.py") for i, line in enumerate(f.read_text().splitlines(), 1)
             if re.search(r"rundir\.(folder|removed_files|parts)\(", line)]
    assert found == []
