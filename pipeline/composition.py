"""The corpus by source and language, step by step: the `composition` section of ledger.json.

The kernels count what each step passes on per (source, language) (`by_group` in its stats:
documents and characters; tokens at tokenize; tokens and samples at pack and shard). This module
adds what only the removed rows tell - which reason removed how many documents of each group, and
for a duplicate which group keeps the copy (a duplicate across sources) - by looking each removed
uid and each `duplicate_of` up in the read step's (uid, source, language) columns, and checks that
every group balances: documents read = kept + removed at each step.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from corpusmill.stages.base import in_sorted, one_array, read_table
from corpusmill.stages.composition import UNKNOWN, flatten

from .ledger import DUPLICATES, LedgerError
from .rundir import RunDir

EARLIER_RUN = "(an earlier run)"  # the group keeping a document removed by dedup.reference


class _Groups:
    """(source, language) codes of uids, from the read step's (uid, source, language) columns. The
    removed rows of a step whose removed files are named like the read step's parts (a document
    step: filter, pii, decontaminate) are looked up in their own part, one part at a time; an index
    is built (one streaming pass over the read parts) only for the uids that cannot be: dedup's
    shuffled removed rows, the ids duplicates point to, and a uid missing from its own part. So the
    driver's memory grows with the duplicates, not with the filtered documents."""

    SPECIAL = (UNKNOWN, EARLIER_RUN, "-")  # codes 0, 1, 2: a uid the read step does not hold, and a keeper of an earlier run

    def __init__(self, rundir: RunDir):
        self.names: list[str] = list(self.SPECIAL)
        self._code: dict[str, int] = {name: i for i, name in enumerate(self.names)}
        self.parts = {Path(p).stem: p for p in rundir.parts("read")}
        self.keys = np.empty(0, np.int64)
        self.src = np.empty(0, np.int32)
        self.lang = np.empty(0, np.int32)
        self._cached: tuple[Optional[str], Any] = (None, None)

    def own_part(self, files: list[str]) -> bool:
        """Every removed file is named like a read part: its rows are looked up there."""
        return bool(files) and all(Path(f).stem in self.parts for f in files)

    def _table(self, path: str, uid_only: bool = False) -> pa.Table:
        names = pq.read_schema(path).names
        columns = ["uid"] if uid_only else ["uid", "source"] + (["language"] if "language" in names else [])
        return read_table(path, columns=columns)

    def missing_from_own_part(self, file: str, uids: np.ndarray) -> np.ndarray:
        """The uids of a removed file that its own read part does not hold (none, for a document step)."""
        own = np.sort(self._table(self.parts[Path(file).stem], uid_only=True).column("uid").to_numpy())
        return uids[~in_sorted(uids, own)]

    def index(self, uids: np.ndarray) -> None:
        """Codes for these uids, found by streaming every read part once."""
        self.keys = np.unique(uids.astype(np.int64, copy=False))
        self.src = np.zeros(len(self.keys), np.int32)
        self.lang = np.zeros(len(self.keys), np.int32)
        for path in self.parts.values() if len(self.keys) else []:
            table = self._table(path)
            uid = table.column("uid").to_numpy()
            pos = np.searchsorted(self.keys, uid).clip(max=len(self.keys) - 1)
            hit = self.keys[pos] == uid
            if hit.any():
                at = pos[hit]
                self.src[at], self.lang[at] = self._table_codes(table.filter(pa.array(hit)))

    def _table_codes(self, table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
        src = self._codes(table.column("source"))
        lang = self._codes(table.column("language")) if "language" in table.column_names else np.zeros(len(src), np.int32)
        return src, lang

    def _codes(self, column: pa.ChunkedArray) -> np.ndarray:
        encoded = one_array(column.fill_null(UNKNOWN)).dictionary_encode()
        remap = np.empty(len(encoded.dictionary), np.int32)
        for i, name in enumerate(encoded.dictionary.to_pylist()):
            if name not in self._code:
                if len(self.names) >= MAX_NAMES:
                    raise LedgerError(f"more than {MAX_NAMES} distinct sources and languages: the composition cannot count them")
                self._code[name] = len(self.names)
                self.names.append(name)
            remap[i] = self._code[name]
        return remap[encoded.indices.to_numpy(zero_copy_only=False)] if len(remap) else np.zeros(0, np.int32)

    def codes(self, uids: np.ndarray, file: Optional[str] = None) -> tuple[np.ndarray, np.ndarray]:
        """Codes (into `names`) of the source and language of these uids: from `file`'s own read part
        when given, else (and for a uid that part lacks) from the index; 0, UNKNOWN, for a uid the read
        step does not hold (an earlier run's)."""
        src, lang = np.zeros(len(uids), np.int32), np.zeros(len(uids), np.int32)
        todo = np.ones(len(uids), bool)
        if file is not None:
            stem = Path(file).stem
            if self._cached[0] != stem:
                table = self._table(self.parts[stem])
                order = np.argsort(table.column("uid").to_numpy(), kind="stable")
                keys = table.column("uid").to_numpy()[order]
                s, g = self._table_codes(table)
                self._cached = (stem, (keys, s[order], g[order]))
            keys, s, g = self._cached[1]
            if len(keys):
                pos = np.searchsorted(keys, uids).clip(max=len(keys) - 1)
                hit = keys[pos] == uids
                src[hit], lang[hit] = s[pos[hit]], g[pos[hit]]
                todo &= ~hit
        if todo.any() and len(self.keys):
            pos = np.searchsorted(self.keys, uids[todo]).clip(max=len(self.keys) - 1)
            hit = self.keys[pos] == uids[todo]
            src[todo] = np.where(hit, self.src[pos], 0)
            lang[todo] = np.where(hit, self.lang[pos], 0)
        return src, lang


MAX_NAMES = 1 << 20  # distinct source and language names the codes can hold


def _removed_uids(files: list[str], groups: _Groups, own_part: bool) -> np.ndarray:
    """The uids of a step's removed rows that need the index: theirs (only those missing from their
    own read part when the files are named like the read parts), and the ids they duplicate."""
    uids = []
    for f in files:
        names = pq.read_schema(f).names
        table = read_table(f, columns=["uid"] + (["duplicate_of"] if "duplicate_of" in names else []))
        uid = table.column("uid").to_numpy()
        uids.append(groups.missing_from_own_part(f, uid) if own_part else uid)
        if "duplicate_of" in names:
            dup_of = table.column("duplicate_of").drop_null().to_numpy(zero_copy_only=False)
            uids.append(dup_of[~np.isnan(dup_of)] if dup_of.dtype.kind == "f" else dup_of)
    return np.concatenate(uids).astype(np.int64) if uids else np.empty(0, np.int64)


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
            # one pass over the read step's parts for the uids that cannot be looked up in their own part
            index = _Groups(rundir)
            with_rows = [st for st in doc_steps if st != "read" and rundir.removed_files(st) and stats.get(st, {}).get("removed")]
            own = {st: index.own_part(rundir.removed_files(st)) for st in with_rows}
            index.index(np.concatenate([_removed_uids(rundir.removed_files(st), index, own[st]) for st in with_rows]))
        s = stats.get(step, {})
        passed = flatten(s.get("by_group", {}))
        if step != "read":
            before = {k: v["docs"] for k, v in flatten(stats[previous].get("by_group", {})).items()}
            for key in set(before) | set(passed):
                out = passed.get(key, {})
                entry(key)["steps"][step] = {"docs": out.get("docs", 0), "chars": out.get("chars", 0)}
            files = rundir.removed_files(step)
            if files and s.get("removed"):
                _removed_rows(step, kind, files, index, entry, cross, own[step])
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


def _removed_rows(step: str, kind: str, files: list[str], index: _Groups, entry, cross: dict, own_part: bool) -> None:
    """Count one step's removed rows by group and reason; duplicates also by the keeper's group. The
    rows are counted one file at a time (the driver holds one part's removed rows, not the corpus's)
    as integer codes (group, reason), never as Python strings per row; reasons are numbered in the
    order they are first met, so the counts come out in the order one pass over all rows gives."""
    reasons: dict[str, int] = {}
    counts: dict[int, int] = {}
    n_names = MAX_NAMES
    for f in files:
        names = pq.read_schema(f).names
        columns = ["uid", "reason"] + (["duplicate_of"] if "duplicate_of" in names else [])
        table = read_table(f, columns=columns)
        src, lang = index.codes(table.column("uid").to_numpy(), f if own_part else None)
        encoded = one_array(table.column("reason").fill_null("?")).dictionary_encode()
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
    dup_of = table.column("duplicate_of").to_numpy(zero_copy_only=False)
    has = ~np.isnan(dup_of) if dup_of.dtype.kind == "f" else np.ones(len(dup_of), bool)
    ksrc, klang = index.codes(np.where(has, dup_of, -1).astype(np.int64))
    # kept by an earlier run (dedup.reference): the keeper's group is named apart
    earlier = np.asarray([r.endswith("_earlier_run") for r in reasons], bool)[reason] if reasons else has & False
    gone, dash = index.SPECIAL.index(EARLIER_RUN), index.SPECIAL.index("-")
    ksrc = np.where(has & ~earlier, ksrc, np.where(earlier, gone, 0)).astype(np.int64)
    klang = np.where(has & ~earlier, klang, np.where(earlier, dash, 0)).astype(np.int64)
    other = np.flatnonzero((ksrc != src) | (klang != lang))
    label = index.names
    quads = np.stack([src[other].astype(np.int64), lang[other], ksrc[other], klang[other]], axis=1)
    values, first, counts = np.unique(quads, axis=0, return_index=True, return_counts=True)
    for i in np.argsort(first, kind="stable"):  # in the rows' order, as the pairs are first met
        (s, lg, ks, kl), n = values[i].tolist(), int(counts[i])
        pair = (step, label[s], label[lg], label[ks], label[kl])
        cross[pair] = cross.get(pair, 0) + n
        entry((label[s], label[lg]))["duplicates_kept_elsewhere"] += n
