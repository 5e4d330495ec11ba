import numpy as np
import pytest
import pyarrow as pa

from corpusmill.stages.pack import pack_batch, pack_tails
from corpusmill.stages.tokenize import TOKEN_SCHEMA


def _tokens(docs, uids=None):
    uids = uids or list(range(len(docs)))
    return pa.Table.from_pydict({"uid": uids, "n_tokens": [len(d) for d in docs], "input_ids": docs}, schema=TOKEN_SCHEMA)


def test_concat_windows_are_exact_and_lossless():
    rng = np.random.default_rng(0)
    docs = [list(rng.integers(3, 100, rng.integers(1, 20))) + [2] for _ in range(30)]
    window = 9
    res, tail = pack_batch(_tokens(docs), window)
    flat = np.concatenate(docs)
    ids = res.kept.column("input_ids").combine_chunks().flatten().to_numpy()
    assert len(ids) % window == 0 and len(tail) < window
    assert np.array_equal(np.concatenate([ids, tail]), flat)
    assert res.stats["windows"] == len(flat) // window and res.stats["tokens_in"] == len(flat)


def test_documents_packed_in_uid_order_and_splits_counted():
    res, tail = pack_batch(_tokens([[5, 5, 2], [7, 2]], uids=[9, 4]), 4)
    assert res.kept.column("input_ids").to_pylist() == [[7, 2, 5, 5]] and tail.tolist() == [2]
    assert res.stats["docs_split"] == 1


def test_tails_drop_or_pad():
    tails = [np.array([1, 2, 3], np.int32), np.array([4, 5], np.int32), np.array([6], np.int32)]
    table, stats = pack_tails(tails, 4, "drop", pad_id=0)
    assert table.column("input_ids").to_pylist() == [[1, 2, 3, 4]] and stats["tokens_dropped"] == 2
    table, stats = pack_tails(tails, 4, "pad", pad_id=0)
    assert table.column("input_ids").to_pylist() == [[1, 2, 3, 4], [5, 6, 0, 0]]
    assert table.column("n_pad").to_pylist() == [0, 2] and stats["pad_tokens"] == 2 and stats["tokens_dropped"] == 0


def test_pad_mode_one_document_per_sample():
    res, tail = pack_batch(_tokens([[5, 6, 2], [7, 8, 9, 10, 11, 2]]), 4, mode="pad", pad_id=0)
    assert res.kept.column("input_ids").to_pylist() == [[5, 6, 2, 0], [7, 8, 9, 10]] and len(tail) == 0
    assert res.kept.column("n_pad").to_pylist() == [1, 0]
    assert res.stats["docs_truncated"] == 1 and res.stats["tokens_dropped"] == 2 and res.stats["pad_tokens"] == 1


def test_best_fit_packs_whole_documents_and_splits_only_long_ones():
    from corpusmill.stages.pack import best_fit_bins

    assert sorted(map(sorted, best_fit_bins(np.array([5, 4, 3, 3, 1]), 8))) == [[0, 2], [1, 3, 4]]
    rng = np.random.default_rng(1)
    docs = [list(rng.integers(3, 99, rng.integers(1, 12))) + [2] for _ in range(200)] + [list(range(3, 40)) + [2]]
    window = 16
    res, _ = pack_batch(_tokens(docs), window, mode="best_fit", pad_id=0)
    rows = res.kept.column("input_ids").to_pylist()
    n_pad = res.kept.column("n_pad").to_pylist()
    content = [tuple(r[: window - p]) for r, p in zip(rows, n_pad)]
    assert all(all(x == 0 for x in r[window - p:]) for r, p in zip(rows, n_pad))
    # every short document sits whole, contiguous, inside one window; only the long one is split
    flat_windows = [" " + " ".join(map(str, c)) + " " for c in content]
    for d in docs[:-1]:
        needle = " " + " ".join(map(str, d)) + " "
        assert any(needle in w for w in flat_windows)
    assert res.stats["docs_split"] == 1 and res.stats["tokens_dropped"] == 0
    assert sum(len(c) for c in content) == sum(len(d) for d in docs)
    concat, _ = pack_batch(_tokens(docs), window)
    assert concat.stats["docs_split"] > 10 * res.stats["docs_split"]


# ---- the seeded document order across the corpus ---------------------------------------------

def _write_parts(tmp_path, docs, uids, cuts, name):
    """The documents written as tokenized Arrow IPC parts, cut at `cuts` (a partitioning)."""
    from corpusmill.stages.base import write_table_atomic

    folder = tmp_path / name
    paths, bounds = [], [0, *cuts, len(docs)]
    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        path = folder / f"part-{i:05d}.arrow"
        write_table_atomic(_tokens(docs[a:b], uids[a:b]), path)
        paths.append(str(path))
    return paths


def _pack_shuffled(parts, window, mode, seed=0, group_tokens=1 << 24, remainder="drop", out=None):
    """The windows (rows) and the summed stats of the shuffled pack, as the pack step wires it."""
    from corpusmill.stages.base import merge_stats, read_table
    from corpusmill.stages.pack import document_index, document_order, pack_group, plan_groups

    order = document_order([document_index(p, seed) for p in parts])
    rows, stats = [], {}
    for i, g in enumerate(plan_groups(order, window, mode, group_tokens)):
        path = out / f"w-{i:05d}.arrow"
        merge_stats(stats, pack_group(parts, g, window, mode, remainder, 0, str(path)))
        if path.exists():
            t = read_table(path)
            rows += [(tuple(r), p) for r, p in zip(t.column("input_ids").to_pylist(), t.column("n_pad").to_pylist())]
    return rows, stats, order


def _corpus(n=300, seed=3):
    rng = np.random.default_rng(seed)
    docs = [list(rng.integers(3, 1000, rng.integers(1, 40))) + [2] for _ in range(n)]
    return docs, list(range(100, 100 + n))


@pytest.mark.parametrize("mode", ["concat", "pad", "best_fit"])
def test_shuffled_windows_are_the_same_whatever_the_partitioning(tmp_path, mode):
    docs, uids = _corpus()
    window = 17
    one = _write_parts(tmp_path, docs, uids, [], "one")
    many = _write_parts(tmp_path, docs, uids, [1, 2, 40, 41, 150, 299], "many")
    (tmp_path / "o1").mkdir(), (tmp_path / "o2").mkdir(), (tmp_path / "o3").mkdir()
    a, sa, _ = _pack_shuffled(one, window, mode, group_tokens=4 * window, out=tmp_path / "o1")
    b, sb, _ = _pack_shuffled(many, window, mode, group_tokens=4 * window, out=tmp_path / "o2")
    assert a == b and sa == sb and len(a) > 20
    if mode != "best_fit":  # concat and pad windows do not depend on the task size either
        c, sc, _ = _pack_shuffled(many, window, mode, group_tokens=1 << 20, out=tmp_path / "o3")
        assert c == a and sc["windows"] == sa["windows"]


def test_shuffled_concat_is_one_lossless_stream_in_seeded_order(tmp_path):
    from corpusmill.stages.pack import concat_stats, order_keys

    docs, uids = _corpus()
    window = 13
    parts = _write_parts(tmp_path, docs, uids, [77, 200], "p")
    (tmp_path / "o").mkdir()
    rows, stats, order = _pack_shuffled(parts, window, "concat", seed=5, group_tokens=3 * window, out=tmp_path / "o")
    by_key = np.argsort(order_keys(np.array(uids), 5), kind="stable")
    assert not np.array_equal(by_key, np.arange(len(docs)))  # a real permutation, not the uid order
    stream = np.concatenate([docs[i] for i in by_key])
    body = np.array([r for r, _ in rows]).reshape(-1)
    assert np.array_equal(body, stream[: len(body)])  # the windows are the seeded stream, cut every `window` ids
    assert stats["windows"] == len(stream) // window == len(rows)
    assert stats["tokens_dropped"] == len(stream) - len(body) and stats["ids"] == len(stream)
    # the counts over the stream equal pack_batch's over one partition holding the documents in that order
    reference, tail = pack_batch(_tokens([docs[i] for i in by_key]), window)
    assert concat_stats(order.length, window) == {k: reference.stats[k] for k in ("docs_in", "tokens_in", "docs_split")}
    assert len(tail) == stats["tokens_dropped"]


def test_shuffled_concat_pads_only_the_last_window(tmp_path):
    docs, uids = _corpus(50)
    window = 11
    parts = _write_parts(tmp_path, docs, uids, [20], "p")
    (tmp_path / "o").mkdir()
    rows, stats, order = _pack_shuffled(parts, window, "concat", group_tokens=2 * window, remainder="pad", out=tmp_path / "o")
    total = int(order.length.sum())
    assert [p for _, p in rows[:-1]] == [0] * (len(rows) - 1) and rows[-1][1] == stats["pad_tokens"] == -total % window
    assert stats["tokens_dropped"] == 0 and len(rows) == -(-total // window)


def test_seed_decides_the_order_and_the_same_seed_repeats_it(tmp_path):
    docs, uids = _corpus(100)
    parts = _write_parts(tmp_path, docs, uids, [50], "p")
    for d in ("a", "b", "c"):
        (tmp_path / d).mkdir()
    a, _, _ = _pack_shuffled(parts, 8, "pad", seed=1, out=tmp_path / "a")
    b, _, _ = _pack_shuffled(parts, 8, "pad", seed=1, out=tmp_path / "b")
    c, _, _ = _pack_shuffled(parts, 8, "pad", seed=2, out=tmp_path / "c")
    assert a == b and a != c and sorted(a) == sorted(c)


def test_shuffled_pad_mode_counts_truncation_from_whole_lengths(tmp_path):
    docs = [[5, 6, 2], list(range(3, 30)) + [2], [7, 2]]
    parts = _write_parts(tmp_path, docs, [1, 2, 3], [1], "p")
    (tmp_path / "o").mkdir()
    rows, stats, _ = _pack_shuffled(parts, 4, "pad", out=tmp_path / "o")
    assert stats["tokens_in"] == 3 + 28 + 2 and stats["docs_truncated"] == 1 and stats["tokens_dropped"] == 24
    assert stats["windows"] == 3 and stats["pad_tokens"] == 1 + 2
    assert sorted(r for r, _ in rows) == sorted([(5, 6, 2, 0), (3, 4, 5, 6), (7, 2, 0, 0)])


def test_best_fit_groups_mix_documents_from_every_part(tmp_path):
    # parts hold one "source" each (ids 100.. vs 500..); in corpus order best_fit packs a part alone
    docs = [[100 + i, 2] for i in range(40)] + [[500 + i, 2] for i in range(40)]
    parts = _write_parts(tmp_path, docs, list(range(80)), [40], "p")
    (tmp_path / "o").mkdir()
    rows, stats, _ = _pack_shuffled(parts, 8, "best_fit", out=tmp_path / "o")
    mixed = sum(1 for r, _ in rows if any(100 <= x < 140 for x in r) and any(500 <= x < 540 for x in r))
    assert mixed > len(rows) // 2 and stats["tokens_in"] == 160 and stats["docs_split"] == 0
