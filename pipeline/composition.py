"""The corpus by source and language, step by step: the `composition` section of ledger.json.

The kernels count what each step passes on per (source, language) (`by_group` in its stats:
documents and characters; tokens at tokenize; tokens and samples at pack and shard). This module
adds what only the removed rows tell - which reason removed how many documents of each group, and
for a duplicate which group keeps the copy (a duplicate across sources) - by looking each removed
uid and each `duplicate_of` up in the read step's (uid, source, language) columns, and checks that
every group balances: documents read = kept + removed at each step.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from corpusmill.stages.composition import UNKNOWN, flatten

from .ledger import DUPLICATES, LedgerError
from .rundir import RunDir

EARLIER_RUN = "(an earlier run)"  # the group keeping a document removed by dedup.reference


def _index(rundir: RunDir) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The read step's documents sorted by uid: (uids, sources, languages)."""
    parts = rundir.parts("read")
    if not parts:
        return np.empty(0, np.int64), np.empty(0, object), np.empty(0, object)
    names = pq.read_schema(parts[0]).names
    columns = ["uid", "source"] + (["language"] if "language" in names else [])
    table = pa.concat_tables([pq.read_table(p, columns=columns) for p in parts])
    uid = table.column("uid").to_numpy()
    order = np.argsort(uid, kind="stable")
    src = np.asarray(table.column("source").fill_null(UNKNOWN).to_pylist(), dtype=object)[order]
    lang = (np.asarray(table.column("language").fill_null(UNKNOWN).to_pylist(), dtype=object)[order]
            if "language" in columns else np.full(len(uid), UNKNOWN, dtype=object))
    return uid[order], src, lang


def _lookup(index: tuple[np.ndarray, np.ndarray, np.ndarray], uids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Source and language of these uids (UNKNOWN for a uid the read step does not hold: an earlier run's)."""
    keys, src, lang = index
    if not len(keys):
        unknown = np.full(len(uids), UNKNOWN, dtype=object)
        return unknown, unknown.copy()
    pos = np.searchsorted(keys, uids).clip(max=len(keys) - 1)
    hit = keys[pos] == uids
    return np.where(hit, src[pos], UNKNOWN), np.where(hit, lang[pos], UNKNOWN)


def build_composition(rundir: RunDir, stats: dict[str, dict], doc_steps: dict[str, str]) -> Optional[dict[str, Any]]:
    """The ledger's `composition`: per (source, language) the documents and characters read, what
    each document step passed on and removed (by reason), duplicates kept in another group, tokens,
    and tokens and samples after packing and in the shards; and every pair of groups between which
    documents were removed as duplicates. None when the read step counted no groups (an older run)."""
    if "by_group" not in stats.get("read", {}):
        return None
    groups: dict[tuple[str, str], dict[str, Any]] = {}

    def entry(key: tuple[str, str]) -> dict[str, Any]:
        return groups.setdefault(key, {"source": key[0], "language": key[1], "documents": 0, "chars": 0, "steps": {},
                                       "removed": {}, "duplicates_kept_elsewhere": 0})

    for key, c in flatten(stats["read"]["by_group"]).items():
        entry(key).update(documents=c.get("docs", 0), chars=c.get("chars", 0))
    index = None
    cross: dict[tuple, int] = {}
    previous = "read"
    for step, kind in doc_steps.items():
        s = stats.get(step, {})
        passed = flatten(s.get("by_group", {}))
        if step != "read":
            before = {k: v["docs"] for k, v in flatten(stats[previous].get("by_group", {})).items()}
            for key in set(before) | set(passed):
                out = passed.get(key, {})
                entry(key)["steps"][step] = {"docs": out.get("docs", 0), "chars": out.get("chars", 0)}
            files = rundir.removed_files(step)
            if files and s.get("removed"):
                index = index if index is not None else _index(rundir)
                _removed_rows(step, kind, files, index, entry, cross)
            for key in set(before) | set(passed):  # every group balances at every step
                gone = sum(entry(key)["removed"].get(step, {}).values())
                if before.get(key, 0) != passed.get(key, {}).get("docs", 0) + gone:
                    entry(key)["removed"].setdefault(step, {})
                    missing = before.get(key, 0) - passed.get(key, {}).get("docs", 0) - gone
                    if missing < 0:
                        raise LedgerError(f"the ledger by source and language does not add up at {step} for "
                                          f"{key[0]}/{key[1]}: {before.get(key, 0)} in, "
                                          f"{passed.get(key, {}).get('docs', 0)} out, {gone} removed")
                    entry(key)["removed"][step]["(no audit row)"] = missing
        else:
            for key, c in passed.items():
                entry(key)["steps"]["read"] = {"docs": c.get("docs", 0), "chars": c.get("chars", 0)}
        previous = step
    held_out = {"packed_validation": (stats.get("pack") or {}).get("validation") or {},
                "shards_validation": (stats.get("shard") or {}).get("validation") or {}}
    for step, label in (("tokenize", "tokenized"), ("pack", "packed"), ("shard", "shards"),
                        ("packed_validation", "packed_validation"), ("shards_validation", "shards_validation")):
        found = held_out[step] if step in held_out else stats.get(step, {})
        for key, c in flatten(found.get("by_group", {})).items():
            entry(key)[label] = {k: int(v) for k, v in c.items() if k in ("docs", "chars", "tokens", "samples")}
    rows = sorted(groups.values(), key=lambda g: (-g["documents"], g["source"], g["language"]))
    return {
        "steps": [st for st in doc_steps if st != "read"],
        "groups": rows,
        "cross_source_duplicates": [
            {"step": st, "removed_source": a, "removed_language": al, "kept_source": b, "kept_language": bl, "documents": n}
            for (st, a, al, b, bl), n in sorted(cross.items(), key=lambda kv: -kv[1])],
        "note": "samples: a sample counts for the (source, language) holding most of its ids; tokens after packing "
                "leave out the ids of a dropped last window; the shards' count repeats or drops windows for equal ranks",
    }


def _removed_rows(step: str, kind: str, files: list[str], index: tuple, entry, cross: dict) -> None:
    """Count one step's removed rows by group and reason; duplicates also by the keeper's group."""
    names = pq.read_schema(files[0]).names
    columns = ["uid", "reason"] + (["duplicate_of"] if "duplicate_of" in names else [])
    table = pq.read_table(files, columns=columns)
    uids = table.column("uid").to_numpy()
    src, lang = _lookup(index, uids)
    reason = np.asarray(table.column("reason").fill_null("?").to_pylist(), dtype=object)
    counted = pd.DataFrame({"s": src, "l": lang, "r": reason}).value_counts()
    for (s, lg, r), n in counted.items():
        entry((str(s), str(lg)))["removed"].setdefault(step, {})[str(r)] = int(n)
    if kind != DUPLICATES or "duplicate_of" not in columns:
        return
    dup_of = table.column("duplicate_of").to_numpy(zero_copy_only=False)
    has = ~np.isnan(dup_of) if dup_of.dtype.kind == "f" else np.ones(len(dup_of), bool)
    ksrc, klang = _lookup(index, np.where(has, dup_of, -1).astype(np.int64))
    earlier = np.char.endswith(reason.astype(str), "_earlier_run")  # kept by an earlier run (dedup.reference)
    ksrc = np.where(has & ~earlier, ksrc, np.where(earlier, EARLIER_RUN, UNKNOWN))
    klang = np.where(has & ~earlier, klang, np.where(earlier, "-", UNKNOWN))
    other = (ksrc != src) | (klang != lang)
    for i in np.flatnonzero(other):
        pair = (step, str(src[i]), str(lang[i]), str(ksrc[i]), str(klang[i]))
        cross[pair] = cross.get(pair, 0) + 1
        entry((str(src[i]), str(lang[i])))["duplicates_kept_elsewhere"] += 1
