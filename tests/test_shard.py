import numpy as np
import pyarrow.parquet as pq
import pytest

from stages.pack import windows_table
from stages.shard import ShardError, load_windows, plan_shards, positions, read_back, write_mindrecord


def test_plan_gives_every_rank_the_same_count():
    plan = plan_shards(103, ranks=4, files_per_rank=3)
    assert plan.per_rank == 25 and plan.dropped == 3 and plan.used == 100
    sizes = np.diff(plan.file_bounds)
    assert len(sizes) == 12 and sizes.min() >= 8 and sizes.reshape(4, 3).sum(axis=1).tolist() == [25] * 4
    with pytest.raises(ShardError, match="at least one sample"):
        plan_shards(5, ranks=4, files_per_rank=2)


def test_positions_are_a_seeded_permutation():
    inv = positions(1000, seed=3)
    assert sorted(inv.tolist()) == list(range(1000))
    assert np.array_equal(inv, positions(1000, seed=3)) and not np.array_equal(inv, positions(1000, seed=4))


def test_write_and_read_back_through_minddataset(tmp_path):
    import mindspore.dataset as ds

    window = 17
    flat = np.arange(40 * window, dtype=np.int32)
    pq.write_table(windows_table(flat, window), tmp_path / "part.parquet")
    pos = np.arange(40, dtype=np.int64)[::-1].copy()
    part = load_windows(str(tmp_path / "part.parquet"), pos, used=30).set_index("pos")
    stats = write_mindrecord(part, str(tmp_path / "f.mindrecord0"), window, write_batch=7)
    assert stats["samples"] == 30 and stats["tokens"] == 30 * window and len(stats["sha256"]) == 64
    rows = [r[0] for r in ds.MindDataset([str(tmp_path / "f.mindrecord0")], shuffle=False).create_tuple_iterator(output_numpy=True)]
    # written in position order: position p holds window 39 - p
    assert [int(r[0]) for r in rows] == [(39 - p) * window for p in range(30)]
    assert all(r.dtype == np.int32 and r.shape == (window,) for r in rows)
    assert read_back(str(tmp_path / "f.mindrecord0"), window)[0] == 30
