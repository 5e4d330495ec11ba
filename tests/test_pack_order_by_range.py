"""The range-partitioned pack order against the whole order in one process: for every
group the same documents, segments and codes, the same packed bytes, and the same count of split
documents, with and without a validation split, with buckets smaller and larger than a group. No
Dask: the kernels are what the pack step's tasks run."""
from __future__ import annotations

import filecmp
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from corpusmill.stages import mixing, pack
from corpusmill.stages.base import write_table_atomic

WINDOW, GROUP_TOKENS, SEED = 8, 40, 3


def _parts(root: Path) -> list[str]:
    """Three tokenized parts (Arrow IPC, as the tokenize step writes them): documents of 0-30 ids
    (a few empty), two sources and two languages, ids that name their document and position."""
    rng = np.random.default_rng(5)
    paths, uid = [], 0
    for i in range(3):
        n = 120
        lengths = rng.integers(1, 31, n)
        lengths[::37] = 0
        uids = np.arange(uid, uid + n, dtype=np.int64) + (i << 32)
        uid += n
        ids = [np.arange(k, dtype=np.int32) + int(u % 1000) * 100 for u, k in zip(uids, lengths)]
        table = pa.table({"uid": uids, "n_tokens": lengths.astype(np.int64),
                          "input_ids": pa.array(ids, pa.list_(pa.int32())),
                          "source": [["web", "books"][int(u) % 2] for u in uids],
                          "language": [["en", "zh"][int(u) % 3 == 0] for u in uids],
                          "doc_hash": rng.integers(0, 2**63, n).astype(np.uint64)})
        path = root / f"part-{i:05d}.arrow"
        write_table_atomic(table, path)
        paths.append(str(path))
    return paths


def _whole_order(parts: list[str], share: float, name: str):
    """What the pack step did before: every part's index in one process, sorted, cut by plan_groups."""
    index = [pack.document_index(p, SEED) for p in parts]
    pairs, codes = pack.global_codes(index)
    masks = [mixing.validation_mask(x["doc_hash"], share, 0) for x in index]
    if name == "train":
        masks = [~m for m in masks]
    order = pack.document_order([pack.subset(x, m) for x, m in zip(index, masks)], [c[m] for c, m in zip(codes, masks)])
    return pairs, order, pack.plan_groups(order, WINDOW, "concat", GROUP_TOKENS)


@pytest.mark.parametrize("bits", [10, 2])  # buckets far smaller than a group, and far larger
@pytest.mark.parametrize("share", [0.0, 0.3])
def test_range_partitioned_order_packs_the_same_groups_and_bytes_as_the_whole_order(tmp_path, monkeypatch, bits, share):
    monkeypatch.setattr(pack, "ORDER_BITS", bits)
    monkeypatch.setattr(pack, "ORDER_BUCKETS", 1 << bits)
    parts = _parts(tmp_path)
    found = [pack.order_index_part(p, SEED, str(tmp_path / f"order-{i}"), share, 0) for i, p in enumerate(parts)]
    for name in (["train", "validation"] if share else ["train"]):
        pairs, order, groups = _whole_order(parts, share, name)
        assert sorted({tuple(g) for x in found for g in x["groups"]}) == pairs
        where = {g: i for i, g in enumerate(pairs)}
        remaps = [np.asarray([where[tuple(g)] for g in x["groups"]], np.int32) for x in found]
        files = [x["sets"][name]["path"] for x in found]
        docs = sum(x["sets"][name]["docs"] for x in found)
        tokens = sum(x["sets"][name]["tokens"] for x in found)
        assert int(docs.sum()) == len(order.length) and int(tokens.sum()) == int(order.length.sum())
        plans = pack.plan_ranges(tokens, WINDOW, GROUP_TOKENS)
        assert len(plans) == len(groups) > 10
        split = 0
        for i, (plan, want) in enumerate(zip(plans, groups)):
            got, n = pack.range_group(files, remaps, plan, WINDOW)
            split += n
            for field in ("part", "row", "offset", "count", "length", "code"):
                assert np.array_equal(getattr(got, field), getattr(want, field)), (name, i, field)
            a, b = tmp_path / f"{name}-whole-{i}.arrow", tmp_path / f"{name}-range-{i}.arrow"
            stats_whole = pack.pack_group(parts, want, WINDOW, "concat", "drop", 0, str(a))
            stats_range = pack.pack_range(parts, files, remaps, plan, WINDOW, "drop", 0, str(b))
            assert stats_range.pop("docs_split") == n and stats_range == stats_whole
            assert a.exists() == b.exists() and (not a.exists() or filecmp.cmp(a, b, shallow=False))
        assert split == pack.concat_stats(order.length, WINDOW)["docs_split"]
