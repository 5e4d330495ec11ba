"""The ledger's composition finds each removed row's (source, language), and its keeper's, by
streaming the read step's parts (issue 19: no column of the whole corpus in the driver): counted
against a plain dictionary lookup of the same tiny run directory. No Dask."""
from __future__ import annotations

from collections import Counter

import pytest

import pyarrow as pa
import pyarrow.parquet as pq

from corpusmill.pipeline.composition import EARLIER_RUN, build_composition
from corpusmill.pipeline.ledger import DUPLICATES, FILTERED, QUARANTINED
from corpusmill.pipeline.rundir import RunDir
from corpusmill.stages.composition import UNKNOWN, group_counts


@pytest.mark.parametrize("named_like_read_parts", [False, True])
def test_removed_rows_are_counted_by_their_group_and_their_keepers_group(tmp_path, monkeypatch, named_like_read_parts):
    """With the filter's removed files named like the read parts (as a document step writes them),
    its rows are looked up in their own part: the index holds the duplicates' uids and their keepers' only."""
    from corpusmill.pipeline import composition

    indexed = []
    index = composition._Groups.index
    monkeypatch.setattr(composition._Groups, "index", lambda self, uids: (indexed.append(len(uids)), index(self, uids)))
    rd = RunDir(tmp_path)
    docs = {}  # uid -> (source, language), over three read parts (uids carry the file in their high bits)
    for i in range(3):
        uids = [(i << 32) + j for j in range(40)]
        src = [None if j == 7 else ["web", "books", "law"][(j + i) % 3] for j in range(40)]
        lang = [["en", "zh"][j % 2] for j in range(40)]
        rd.folder("read").mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"uid": pa.array(uids, pa.int64()), "source": src, "language": lang}),
                       rd.folder("read") / f"part-{i:05d}.parquet")
        docs.update({u: (s if s is not None else UNKNOWN, g) for u, s, g in zip(uids, src, lang)})
    every = sorted(docs)
    filtered = every[::5]
    left = [u for u in every if u not in set(filtered)]
    dups = left[1::4]
    keeper = {u: left[(k * 7) % len(left)] for k, u in enumerate(dups)}
    keeper[dups[0]] = 999 << 32  # a uid the read step does not hold
    earlier = dups[1]  # removed as a copy of an earlier run's document
    for step, rows in (("filter", [(u, "gopher_few_words" if u % 2 else "short_lines", None) for u in filtered]),
                       ("exact_dedup", [(u, "exact_earlier_run" if u == earlier else "exact", keeper[u]) for u in dups])):
        folder = rd.folder(step) / "removed"
        folder.mkdir(parents=True)
        by_file = {"part.0": rows}
        if step == "filter" and named_like_read_parts:
            by_file = {f"part-{i:05d}": [r for r in rows if r[0] >> 32 == i] for i in range(3)}
        for name, file_rows in by_file.items():
            uid, reason, dup_of = zip(*file_rows)
            pq.write_table(pa.table({"uid": pa.array(uid, pa.int64()), "reason": list(reason),
                                     "duplicate_of": pa.array(dup_of, pa.int64())}), folder / f"{name}.parquet")

    def by_group(uids):
        return group_counts([docs[u][0] for u in uids], [docs[u][1] for u in uids], chars=[1] * len(uids))

    kept = [u for u in left if u not in set(dups)]
    stats = {"read": {"by_group": by_group(every)},
             "filter": {"by_group": by_group(left), "removed": {"gopher_few_words": 1}},
             "exact_dedup": {"by_group": by_group(kept), "removed": {"exact": 1}}}
    comp = build_composition(rd, stats, {"read": QUARANTINED, "filter": FILTERED, "exact_dedup": DUPLICATES})

    want_removed = Counter()
    for step, uids, reason in (("filter", filtered, lambda u: "gopher_few_words" if u % 2 else "short_lines"),
                               ("exact_dedup", dups, lambda u: "exact_earlier_run" if u == earlier else "exact")):
        want_removed.update((docs[u], step, reason(u)) for u in uids)
    got_removed = Counter({((g["source"], g["language"]), step, r): n for g in comp["groups"]
                           for step, reasons in g["removed"].items() for r, n in reasons.items()})
    assert got_removed == want_removed

    def keeper_group(u):
        if u == earlier:
            return (EARLIER_RUN, "-")
        return docs.get(keeper[u], (UNKNOWN, UNKNOWN))

    want_cross = Counter((docs[u], keeper_group(u)) for u in dups if keeper_group(u) != docs[u])
    got_cross = Counter({((c["removed_source"], c["removed_language"]), (c["kept_source"], c["kept_language"])):
                         c["documents"] for c in comp["cross_source_duplicates"]})
    assert got_cross == want_cross and len(want_cross) > 3
    assert {(g["source"], g["language"]): g["duplicates_kept_elsewhere"] for g in comp["groups"]
            if g["duplicates_kept_elsewhere"]} == dict(Counter(docs[u] for u in dups if keeper_group(u) != docs[u]))
    assert indexed == [2 * len(dups) if named_like_read_parts else len(filtered) + 2 * len(dups)]
