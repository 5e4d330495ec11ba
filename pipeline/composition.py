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
import pyarrow as pa
import pyarrow.parquet as pq

from corpusmill.stages.composition import UNKNOWN, flatten

from .ledger import DUPLICATES, LedgerError
from .rundir import RunDir

EARLIER_RUN = "(an earlier run)"  # the group keeping a document removed by dedup.reference


class _Groups:
    """(source, language) of the uids the removed rows name, found by streaming the read step's parts
    one at a time: the driver holds only the uids it looks up (removed rows and the ids they
    duplicate) with two small integer codes each, never a column of the whole corpus."""

    def __init__(self, rundir: RunDir, uids: np.ndarray):
        self.keys = np.unique(uids.astype(np.int64, copy=False))
        self.names: list[str] = [UNKNOWN]  # code -> name; code 0 is UNKNOWN (a uid the read step does not hold)
        codes: dict[str, int] = {UNKNOWN: 0}
        self.src = np.zeros(len(self.keys), np.int32)
        self.lang = np.zeros(len(self.keys), np.int32)
        parts = rundir.parts("read") if len(self.keys) else []
        for path in parts:
            names = pq.read_schema(path).names
            columns = ["uid", "source"] + (["language"] if "language" in names else [])
            table = pq.read_table(path, columns=columns)
            uid = table.column("uid").to_numpy()
            pos = np.searchsorted(self.keys, uid).clip(max=len(self.keys) - 1)
            hit = self.keys[pos] == uid
            if not hit.any():
                continue
            at = pos[hit]
            self.src[at] = self._codes(table.column("source").filter(pa.array(hit)), codes)
            if "language" in columns:
                self.lang[at] = self._codes(table.column("language").filter(pa.array(hit)), codes)

    def _codes(self, column: pa.ChunkedArray, codes: dict[str, int]) -> np.ndarray:
        encoded = column.fill_null(UNKNOWN).combine_chunks().dictionary_encode()
        remap = np.empty(len(encoded.dictionary), np.int32)
        for i, name in enumerate(encoded.dictionary.to_pylist()):
            if name not in codes:
                codes[name] = len(self.names)
                self.names.append(name)
            remap[i] = codes[name]
        return remap[encoded.indices.to_numpy(zero_copy_only=False)] if len(remap) else np.zeros(0, np.int32)

    def codes(self, uids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Codes (into `names`) of the source and language of these uids (0, UNKNOWN, for a uid the
        read step does not hold: an earlier run's)."""
        if not len(self.keys):
            return np.zeros(len(uids), np.int32), np.zeros(len(uids), np.int32)
        pos = np.searchsorted(self.keys, uids).clip(max=len(self.keys) - 1)
        hit = self.keys[pos] == uids
        return np.where(hit, self.src[pos], 0), np.where(hit, self.lang[pos], 0)


def _removed_uids(files: list[str]) -> np.ndarray:
    """The uids a step's removed rows name: theirs, and the ids they duplicate."""
    names = pq.read_schema(files[0]).names
    table = pq.read_table(files, columns=["uid"] + (["duplicate_of"] if "duplicate_of" in names else []))
    uids = [table.column("uid").to_numpy()]
    if "duplicate_of" in names:
        dup_of = table.column("duplicate_of").drop_null().to_numpy(zero_copy_only=False)
        uids.append(dup_of[~np.isnan(dup_of)] if dup_of.dtype.kind == "f" else dup_of)
    return np.concatenate(uids).astype(np.int64)


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
        if index is None and step != "read" and rundir.removed_files(step) and stats.get(step, {}).get("removed"):
            # one pass over the read step's parts for every removed uid of every step
            wanted = [_removed_uids(rundir.removed_files(st)) for st in doc_steps
                      if st != "read" and rundir.removed_files(st) and stats.get(st, {}).get("removed")]
            index = _Groups(rundir, np.concatenate(wanted))
        s = stats.get(step, {})
        passed = flatten(s.get("by_group", {}))
        if step != "read":
            before = {k: v["docs"] for k, v in flatten(stats[previous].get("by_group", {})).items()}
            for key in set(before) | set(passed):
                out = passed.get(key, {})
                entry(key)["steps"][step] = {"docs": out.get("docs", 0), "chars": out.get("chars", 0)}
            files = rundir.removed_files(step)
            if files and s.get("removed"):
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


def _removed_rows(step: str, kind: str, files: list[str], index: _Groups, entry, cross: dict) -> None:
    """Count one step's removed rows by group and reason; duplicates also by the keeper's group. The
    rows are counted one file at a time (the driver holds one part's removed rows, not the corpus's)
    as integer codes (group, reason), never as Python strings per row; reasons are numbered in the
    order they are first met, so the counts come out in the order one pass over all rows gives."""
    reasons: dict[str, int] = {}
    counts: dict[int, int] = {}
    n_names = len(index.names) + 2
    for f in files:
        names = pq.read_schema(f).names
        columns = ["uid", "reason"] + (["duplicate_of"] if "duplicate_of" in names else [])
        table = pq.read_table(f, columns=columns)
        src, lang = index.codes(table.column("uid").to_numpy())
        encoded = table.column("reason").fill_null("?").combine_chunks().dictionary_encode()
        local = np.array([reasons.setdefault(str(r), len(reasons)) for r in encoded.dictionary.to_pylist()], np.int64)
        reason = local[encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)] if len(local) else np.zeros(0, np.int64)
        group = src.astype(np.int64) * n_names + lang
        values, n = np.unique(group * MAX_REASONS + reason, return_counts=True)
        for k, c in zip(values.tolist(), n.tolist()):
            counts[k] = counts.get(k, 0) + c
        if kind == DUPLICATES and "duplicate_of" in columns:
            _cross_rows(step, table, src, lang, [r for r, _ in sorted(reasons.items(), key=lambda kv: kv[1])],
                        reason, index, entry, cross)
    label = sorted(reasons, key=reasons.get)
    for key, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):  # most frequent first (ties by key)
        sl, r = divmod(key, MAX_REASONS)
        s, lg = divmod(sl, n_names)
        entry((index.names[s], index.names[lg]))["removed"].setdefault(step, {})[label[r]] = n


MAX_REASONS = 1 << 16  # a step's distinct removal reasons (rules, methods): far fewer


def _cross_rows(step: str, table: pa.Table, src: np.ndarray, lang: np.ndarray, reasons: list[str], reason: np.ndarray,
                index: _Groups, entry, cross: dict) -> None:
    """Duplicates of one file counted by the keeper's group where it is not the removed one's."""
    n_names = len(index.names) + 2
    dup_of = table.column("duplicate_of").to_numpy(zero_copy_only=False)
    has = ~np.isnan(dup_of) if dup_of.dtype.kind == "f" else np.ones(len(dup_of), bool)
    ksrc, klang = index.codes(np.where(has, dup_of, -1).astype(np.int64))
    # kept by an earlier run (dedup.reference): the keeper's group is named apart
    earlier = np.asarray([r.endswith("_earlier_run") for r in reasons], bool)[reason] if reasons else has & False
    gone, dash = len(index.names), len(index.names) + 1  # codes of EARLIER_RUN and "-"
    ksrc = np.where(has & ~earlier, ksrc, np.where(earlier, gone, 0)).astype(np.int64)
    klang = np.where(has & ~earlier, klang, np.where(earlier, dash, 0)).astype(np.int64)
    other = np.flatnonzero((ksrc != src) | (klang != lang))
    label = [*index.names, EARLIER_RUN, "-"]
    key = ((src[other].astype(np.int64) * n_names + lang[other]) * n_names + ksrc[other]) * n_names + klang[other]
    values, first, counts = np.unique(key, return_index=True, return_counts=True)
    for i in np.argsort(first, kind="stable"):  # in the rows' order, as the pairs are first met
        k, n = int(values[i]), int(counts[i])
        rest, kl = divmod(k, n_names)
        rest, ks = divmod(rest, n_names)
        s, lg = divmod(rest, n_names)
        pair = (step, label[s], label[lg], label[ks], label[kl])
        cross[pair] = cross.get(pair, 0) + n
        entry((label[s], label[lg]))["duplicates_kept_elsewhere"] += n
