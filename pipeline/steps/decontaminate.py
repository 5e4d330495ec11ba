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
    config_reads = ("filter",)  # audit_text_chars, hashed by the filter step upstream
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


def check_eval_set(path: str, fields: list[str]) -> Optional[str]:
    """What is wrong with an evaluation set file, as one line (None: it can be used): missing,
    unreadable, not UTF-8, a line that is no JSON object, no item at all, or no item with any of
    `fields` (the set would silently remove nothing). The preflight reads it before any work."""
    import json

    items = with_fields = 0
    try:
        with open(path, encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    item = json.loads(line)
                except ValueError as e:
                    return f"line {line_no} is not JSON ({e})"
                if not isinstance(item, dict):
                    return f"line {line_no} is not a JSON object (a {type(item).__name__})"
                items += 1
                with_fields += any(item.get(k) is not None for k in fields)
    except FileNotFoundError:
        return "does not exist"
    except IsADirectoryError:
        return "is a folder, not a JSONL file"
    except UnicodeDecodeError as e:
        return f"is not UTF-8 text (byte {e.start} of a line cannot be decoded)"
    except OSError as e:
        return f"cannot be read: {e.strerror or e}"
    if not items:
        return "holds no evaluation item (an empty file)"
    if not with_fields:
        return f"none of its {items} items has any of the fields {list(fields)} (decontaminate.sets[].fields)"
    return None


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
