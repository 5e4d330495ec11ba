"""decontaminate: documents sharing a long n-gram with a user's evaluation items are removed
(`stages.decontaminate`): the items' n-gram hashes are made once in the driver, broadcast, and every
part is scanned vectorised."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Optional

from corpusmill.stages import decontaminate

from ..config import Config
from ..step import DocumentStep, PipelineError, StepContext, StepResult


class DecontaminateStep(DocumentStep):
    name = "decontaminate"
    config_sections = ("decontaminate",)
    outputs = {"eval_sets": dict}

    def hash_extra(self, cfg: Config, previous: Optional[str]) -> Any:
        """The evaluation files themselves (size and mtime): a changed set reruns the step."""
        stamps = []
        for s in cfg.decontaminate.sets:
            stamps.append([s.path, os.path.getsize(s.path), os.stat(s.path).st_mtime_ns] if os.path.isfile(s.path)
                          else [s.path, None])
        return [previous, stamps]

    def run(self, ctx: StepContext, folder: Path) -> StepResult:
        dc = ctx.cfg.decontaminate
        started = time.perf_counter()
        missing = [s.path for s in dc.sets if not os.path.isfile(s.path)]
        if missing:
            raise PipelineError(f"decontaminate: evaluation set file(s) not found: {', '.join(missing)}")
        if len({tuple(s.fields) for s in dc.sets}) > 1 or len({s.id_field for s in dc.sets}) > 1:
            index = [decontaminate.eval_index([(s.name, s.path)], s.fields, s.id_field, dc.word_ngram, dc.cjk_ngram,
                                              dc.lowercase) for s in dc.sets]
            hashes, items, labels, info = _merge(index)
        else:
            try:
                hashes, items, labels, info = decontaminate.eval_index(
                    [(s.name, s.path) for s in dc.sets], dc.sets[0].fields, dc.sets[0].id_field, dc.word_ngram,
                    dc.cjk_ngram, dc.lowercase)
            except ValueError as e:
                raise PipelineError(f"decontaminate: an evaluation set is not JSONL: {e}") from None
        ctx.log(f"  decontaminate: {info['items']} evaluation items -> {info['ngrams']} distinct n-grams "
                f"({dc.word_ngram} words / {dc.cjk_ngram} CJK characters); {info['items_too_short']} items too short "
                "to hold one")
        kwargs = {"eval_hashes": ctx.broadcast(hashes), "eval_item": ctx.broadcast(items), "labels": ctx.broadcast(labels),
                  "word_n": dc.word_ngram, "cjk_n": dc.cjk_ngram, "lowercase": dc.lowercase,
                  "audit_text_chars": ctx.cfg.filter.audit_text_chars}
        index_s = time.perf_counter() - started
        stats, _ = ctx.map_parts(self.reads, folder, decontaminate.decontaminate_batch, kwargs, split_mb=8)
        stats.update(eval_items=info["items"], eval_ngrams=info["ngrams"], eval_items_too_short=info["items_too_short"],
                     index_s=round(index_s, 3))
        return StepResult(stats, {"eval_sets": {s.name: s.path for s in dc.sets}})


def _merge(index: list[tuple]) -> tuple:
    """Several sets' indexes (each with its own fields) as one: labels concatenated, items renumbered."""
    import numpy as np

    hashes, items, labels = [], [], []
    info = {"items": 0, "ngrams": 0, "items_too_short": 0}
    for h, it, lab, st in index:
        hashes.append(h)
        items.append(it + len(labels))
        labels += lab
        for k in info:
            info[k] += st[k]
    h, it = np.concatenate(hashes), np.concatenate(items)
    order = np.argsort(h, kind="stable")
    h, it = h[order], it[order]
    first = np.r_[True, h[1:] != h[:-1]] if len(h) else np.empty(0, bool)
    return h[first], it[first], labels, info
