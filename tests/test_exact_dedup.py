import dask.dataframe as dd
import numpy as np
import pandas as pd

from corpusmill.pipeline.steps.dedup.exact import find_duplicates
from corpusmill.stages.exact_dedup import drop_uids_batch, hash_batch


def test_lowest_uid_kept_with_duplicate_of_and_cluster_size(dask_client):
    texts = {10: "alpha", 3: "beta", 7: "alpha", 1: "gamma", 12: "alpha", 5: "beta", 9: "delta"}
    df = pd.DataFrame({"uid": list(texts), "id": [f"id{u}" for u in texts], "text": list(texts.values()), "source": "s"})
    parts = [hash_batch(df.iloc[i::3]) for i in range(3)]  # copies spread over partitions
    hashes = dd.from_pandas(pd.concat(parts), npartitions=3)
    dups = find_duplicates(hashes).compute().sort_values("uid")
    assert dups["uid"].tolist() == [5, 10, 12]
    assert dups["duplicate_of"].tolist() == [3, 7, 7]
    assert dups["duplicate_of_id"].tolist() == ["id3", "id7", "id7"]
    assert dups["cluster_size"].tolist() == [2, 3, 3]
    assert set(dups["reason"]) == {"exact"}


def test_drop_uids_batch():
    df = pd.DataFrame({"uid": [1, 2, 3, 4], "text": list("abcd")})
    r = drop_uids_batch(df, np.array([2, 4, 99], dtype=np.int64))
    assert r.kept["uid"].tolist() == [1, 3] and r.stats["removed"] == {"exact": 2}
    assert drop_uids_batch(df, np.empty(0, np.int64)).kept["uid"].tolist() == [1, 2, 3, 4]
