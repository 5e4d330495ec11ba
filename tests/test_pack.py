import numpy as np
import pyarrow as pa

from stages.pack import pack_batch, pack_tails
from stages.tokenize import TOKEN_SCHEMA


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
