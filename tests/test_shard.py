import numpy as np
import pytest

from corpusmill.stages.base import write_table_atomic
from corpusmill.stages.pack import windows_table
from corpusmill.stages.shard import (
    MINDRECORD_NAME, ShardError, count_samples, count_windows, file_name, gather_positions, plan_shards, positions,
    read_back, write_mindrecord,
)


def test_plan_gives_every_rank_the_same_count():
    plan = plan_shards(103, ranks=4, files_per_rank=3)
    assert plan.per_rank == 25 and plan.dropped == 3 and plan.used == 100
    sizes = np.diff(plan.file_bounds)
    assert len(sizes) == 12 and sizes.min() >= 8 and sizes.reshape(4, 3).sum(axis=1).tolist() == [25] * 4
    with pytest.raises(ShardError, match="at least one sample"):
        plan_shards(5, ranks=4, files_per_rank=2)


def test_a_sample_cap_gives_a_rank_more_files_and_their_names_sort_in_file_order():
    plan = plan_shards(1_000_003, ranks=3, files_per_rank=2, max_samples_per_file=3000)
    assert plan.per_rank == 333_334 and plan.files_per_rank == 112  # ceil(333,334 / 3,000)
    sizes = np.diff(plan.file_bounds)
    assert sizes.max() <= 3000 and sizes.min() >= 2976 and sizes.sum() == plan.used
    assert plan_shards(1000, ranks=2, files_per_rank=4, max_samples_per_file=3000).files_per_rank == 4  # under the cap
    names = [file_name("per_rank", *plan.file_of(i), plan.files_per_rank, plan.ranks) for i in range(plan.files)]
    assert names == sorted(names) and names[111] == "rank-0000/corpus-r0000-f111.mindrecord"
    assert names[5] == "rank-0000/corpus-r0000-f005.mindrecord"
    assert file_name("per_rank", 1, 5, 4, 2) == "rank-0001/corpus-r0001-f05.mindrecord"  # as before, up to 100
    with pytest.raises(ShardError, match="2000 files per rank, more than 1024: raise shard.max_samples_per_file"):
        plan_shards(2_000_000, ranks=1, files_per_rank=1, max_samples_per_file=1000, max_files_per_rank=1024)


def test_positions_are_a_seeded_permutation():
    inv = positions(1000, seed=3)
    assert sorted(inv.tolist()) == list(range(1000))
    assert np.array_equal(inv, positions(1000, seed=3)) and not np.array_equal(inv, positions(1000, seed=4))


def _pack_parts(tmp_path, sizes: list[int], window: int) -> list[str]:
    """Packed parts holding windows 0, 1, 2, ... in order; window g is ids g*window .. g*window+window-1."""
    paths, start = [], 0
    for i, n in enumerate(sizes):
        path = tmp_path / f"part-{i:05d}.arrow"
        write_table_atomic(windows_table(np.arange(start * window, (start + n) * window, dtype=np.int32), window), path)
        paths.append(str(path))
        start += n
    return paths


def _slices(inv, sizes):
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    return [inv[bounds[i]:bounds[i + 1]] for i in range(len(sizes))]


def test_every_file_gets_its_positions_in_order_from_the_memory_mapped_parts(tmp_path):
    window, sizes = 3, [10, 13]
    parts = _pack_parts(tmp_path, sizes, window)
    assert [count_windows(p) for p in parts] == sizes
    plan = plan_shards(23, ranks=2, files_per_rank=2)  # 22 used, 1 dropped
    inv = positions(23, seed=1)
    seen = []
    for f in range(4):
        got = gather_positions(parts, _slices(inv, sizes), plan.file_bounds[f], plan.file_bounds[f + 1], plan.used, 23, window)
        assert got.pos.tolist() == list(range(plan.file_bounds[f], plan.file_bounds[f + 1]))
        assert all(inv[row[0] // window] == p for row, p in zip(got.ids, got.pos))  # window g sits at position inv[g]
        seen.extend(row[0] // window for row in got.ids)
    assert sorted(seen) == sorted(g for g in range(23) if inv[g] < 22)


def test_pad_remainder_repeats_the_first_shuffled_windows(tmp_path):
    plan = plan_shards(103, ranks=4, files_per_rank=3, remainder="pad")
    assert plan.per_rank == 26 and plan.repeated == 1 and plan.dropped == 0 and plan.used == 104
    with pytest.raises(ShardError, match="more than once"):
        plan_shards(2, ranks=5, files_per_rank=1, remainder="pad")
    window, sizes = 5, [4, 6]
    parts = _pack_parts(tmp_path, sizes, window)
    inv = np.array([3, 0, 9, 1, 7, 2, 8, 4, 6, 5], dtype=np.int64)
    got = gather_positions(parts, _slices(inv, sizes), 0, 12, used=12, total=10, window=window)
    assert got.pos.tolist() == list(range(12))
    # positions 10 and 11 repeat positions 0 and 1 (windows 1 and 3)
    assert np.array_equal(got.ids[10], got.ids[0]) and np.array_equal(got.ids[11], got.ids[1])
    assert got.ids[0][0] == 1 * window and got.ids[1][0] == 3 * window
    with pytest.raises(ShardError, match="have no window"):
        gather_positions(parts, _slices(inv, sizes), 0, 11, used=10, total=10, window=window)


def test_write_and_read_back_through_minddataset(tmp_path):
    import mindspore.dataset as ds

    window = 17
    parts = _pack_parts(tmp_path, [40], window)
    inv = np.arange(40, dtype=np.int64)[::-1].copy()
    part = gather_positions(parts, [inv], 0, 30, used=30, total=40, window=window)
    stats = write_mindrecord(part, str(tmp_path / "f.mindrecord0"), window, write_batch=7, verify="full")
    assert stats["samples"] == 30 and stats["tokens"] == 30 * window and len(stats["sha256"]) == 64
    rows = [r[0] for r in ds.MindDataset([str(tmp_path / "f.mindrecord0")], shuffle=False).create_tuple_iterator(output_numpy=True)]
    # written in position order: position p holds window 39 - p
    assert [int(r[0]) for r in rows] == [(39 - p) * window for p in range(30)]
    assert all(r.dtype == np.int32 and r.shape == (window,) for r in rows)
    assert read_back(str(tmp_path / "f.mindrecord0"), window)[0] == 30 == count_samples(str(tmp_path / "f.mindrecord0"))


def test_file_names_per_layout_are_what_mindformers_collects():
    assert file_name("per_rank", 1, 0, 2, 4) == "rank-0001/corpus-r0001-f00.mindrecord"
    names = [file_name("global", r, f, 3, 4) for r in range(4) for f in range(3)]
    assert names[0] == "corpus.mindrecord00" and names[-1] == "corpus.mindrecord11" and len(set(names)) == 12
    assert all(MINDRECORD_NAME.search(n) for n in names)
    assert not MINDRECORD_NAME.search("corpus.mindrecord00.db")


def test_a_written_file_and_its_index_name_each_other_and_a_renamed_file_is_caught(tmp_path):
    """The pairing check reads what FileWriter really writes (header `shard_addresses`, the index's
    SHARD_NAME and row count) without MindSpore; a file renamed apart from its .db is named."""
    import os

    from corpusmill.stages.manifest import pairing_problems, read_header

    window = 9
    parts = _pack_parts(tmp_path, [12], window)
    part = gather_positions(parts, [np.arange(12, dtype=np.int64)], 0, 12, used=12, total=12, window=window)
    path = str(tmp_path / "a.mindrecord")
    write_mindrecord(part, path, window, write_batch=5)
    assert read_header(path)["shard_addresses"] == ["a.mindrecord"]
    assert pairing_problems(path, "a.mindrecord", 12) == []
    assert pairing_problems(path, "a.mindrecord", 11) == ["a.mindrecord: 12 samples in its index, manifest says 11"]
    for suffix in ("", ".db"):
        os.rename(path + suffix, str(tmp_path / "b.mindrecord") + suffix)
    problems = pairing_problems(str(tmp_path / "b.mindrecord"), "b.mindrecord", 12)
    assert any("header names" in p for p in problems) and any("written for a.mindrecord" in p for p in problems)


def test_a_file_written_a_chunk_at_a_time_has_the_bytes_of_one_written_at_once(tmp_path, monkeypatch):
    """gather_and_write finds each file's rows once (`file_rows`) and gathers them a chunk at a time:
    with chunks of 2 rows and of the whole file, every file of a plan has the same sha256 and samples."""
    from corpusmill.stages import shard

    window, sizes = 9, [7, 11, 5]
    parts = _pack_parts(tmp_path, sizes, window)
    plan = plan_shards(sum(sizes), ranks=2, files_per_rank=2)
    written = {}
    for label, chunk_bytes in (("small", 2 * 4 * window), ("whole", 1 << 30)):
        monkeypatch.setattr(shard, "SHARD_CHUNK_BYTES", chunk_bytes)
        written[label] = [shard.gather_and_write(parts, sizes, 5, plan.file_bounds[f], plan.file_bounds[f + 1], plan.used,
                                                 str(tmp_path / label / f"f{f}.mindrecord"), window, 1, False, "full")
                          for f in range(plan.files)]
    for small, whole in zip(written["small"], written["whole"]):
        assert small["sha256"] == whole["sha256"] and small["samples"] == whole["samples"] > 0
    assert sum(w["samples"] for w in written["small"]) == plan.used


def test_one_array_keeps_a_single_chunk_without_copying_it():
    import pyarrow as pa

    from corpusmill.stages.base import one_array

    single = pa.chunked_array([pa.array(np.arange(1000, dtype=np.int32))])
    assert one_array(single).buffers()[1].address == single.chunk(0).buffers()[1].address  # the same memory
    several = pa.chunked_array([pa.array([1, 2]), pa.array([3])])
    assert one_array(several).to_pylist() == [1, 2, 3]
    plain = pa.array(["a", None])
    assert one_array(plain) is plain
