import numpy as np
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
