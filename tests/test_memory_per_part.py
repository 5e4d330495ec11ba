"""What keeps a worker's and the driver's memory flat as the corpus grows: work that was
done in one place for the whole corpus is done a part at a time, with the same results, and a
worker gives back what each task freed, shuffle tasks included (real LocalCluster, real files)."""
from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from corpusmill.pipeline.config import parse_config
from corpusmill.pipeline.engine import _malloc_trim, release_after_every_task
from corpusmill.pipeline.rundir import RunDir
from corpusmill.pipeline.step import StepContext
from corpusmill.pipeline.steps.dedup.removal import _group_counts, passed_on
from corpusmill.pipeline.steps.filter import boilerplate_lines
from corpusmill.stages.base import in_sorted
from corpusmill.stages.boilerplate import count_lines_part

BANNERS = ["Project Gutenberg License", "返回目录 下一章", "Skip to main content", "版权所有 翻印必究"]


def _parts(folder: Path, n_parts: int, seed: int = 3) -> list[str]:
    """Parts whose documents share banner lines at different rates per source, some lines only in one part."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for p in range(n_parts):
        texts, sources = [], []
        for i in range(rng.randint(20, 60)):
            src = rng.choice(["web", "书", "wiki"])
            lines = [f"body line {p}-{i}-{k} {rng.random():.6f}" for k in range(rng.randint(1, 5))]
            for b in BANNERS:
                if rng.random() < (0.9 if src == "web" else 0.2):
                    lines.insert(rng.randint(0, len(lines)), b)
            if p % 3 == 0:
                lines.append(f"part {p} footer line")  # frequent within this part only
            texts.append("\n".join(lines))
            sources.append(src)
        path = folder / f"part-{p:05d}.parquet"
        pq.write_table(pa.table({"text": texts, "source": sources}), path)
        paths.append(str(path))
    return paths


def test_boilerplate_lines_summed_per_bucket_equal_one_count_of_the_whole_corpus(tmp_path, dask_client):
    parts = _parts(tmp_path / "parts", 13)  # 3 buckets of line hashes
    cfg = parse_config({"filter": {"boilerplate_lines": {"min_docs": 3, "min_doc_share": 0.1}}})
    ctx = StepContext(cfg, RunDir(tmp_path / "run"), dask_client, print, {}, {}, {})
    (tmp_path / "cache").mkdir()
    drop, stats = boilerplate_lines(ctx, parts, tmp_path / "cache", reuse=False)

    whole = pd.concat([count_lines_part(p, cfg.filter.boilerplate_lines.min_width) for p in parts])
    summed = whole.groupby(["source", "hash"], as_index=False)["docs"].sum()
    docs_of = (-summed[summed["hash"] == 0].set_index("source")["docs"]).to_dict()
    lines = summed[summed["hash"] != 0]
    need = np.maximum(3, 0.1 * lines["source"].map(docs_of).to_numpy())
    chosen = lines[lines["docs"].to_numpy() >= need]
    want = {s: set(g["hash"].tolist()) for s, g in chosen.groupby("source")}
    assert drop == want
    assert stats["distinct_lines"] == len(chosen) > len(BANNERS)  # the banners of several sources, the footers
    assert not (tmp_path / "cache" / "line_counts").exists()  # the per-part count files are gone


def test_deferred_counts_over_parts_equal_one_count_of_all_rows(tmp_path, step_context):
    rng = np.random.default_rng(5)
    files, tables, uid0 = [], [], 0
    for p in range(5):
        n = int(rng.integers(0, 400))  # an empty part too, when it comes
        t = pa.table({"uid": pa.array(np.arange(uid0, uid0 + n, dtype=np.int64)),
                      "source": pa.array([rng.choice(["web", "书", None]) for _ in range(n)], pa.string()),
                      "language": pa.array([rng.choice(["en", "zh", None]) for _ in range(n)], pa.string()),
                      "raw_chars": pa.array(rng.integers(0, 900, n))})
        uid0 += n
        files.append(str(tmp_path / f"sig-{p}.parquet"))
        pq.write_table(t, files[-1])
        tables.append(t)
    drop = np.sort(rng.choice(uid0, size=uid0 // 3, replace=False)).astype(np.int64)
    ctx = step_context
    got = passed_on(ctx, files, drop)

    whole = pa.concat_tables(tables)
    keep = ~in_sorted(whole.column("uid").to_numpy(), drop)
    assert got["docs_in"] == uid0 and got["docs_out"] == int(keep.sum()) and got["removed"] == {"exact": len(drop)}
    # the same groups, sums and order (json.dumps keeps the order) as one table counted at once
    assert json.dumps(got["by_group"]) == json.dumps(_group_counts(whole.filter(pa.array(keep))))
    assert passed_on(ctx, [], drop)["by_group"] == {}


def _fragment_and_free() -> dict:
    """Fill the heap with 1 KB blocks (glibc's, not Python's small-object arenas), free all but every
    hundredth: the survivors pin the heap's top, so only `malloc_trim` can give the holes back."""
    import psutil

    rss = psutil.Process().memory_info().rss
    blocks = [bytes(1024) + i.to_bytes(8, "little") for i in range(300_000)]
    survivors = blocks[::100]
    del blocks
    after_free = psutil.Process().memory_info().rss
    _fragment_and_free.survivors = survivors  # stays alive in the worker after the task
    return {"before": rss, "after_free": after_free}


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


@pytest.mark.skipif(_malloc_trim() is None, reason="the C library has no malloc_trim")
def test_a_worker_gives_back_what_a_task_freed_as_soon_as_the_task_ends():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0", scheduler_kwargs={"dashboard": False}) as cluster, \
            Client(cluster) as client:
        untrimmed = client.submit(_fragment_and_free, pure=False).result()
        kept = next(iter(client.run(_rss).values()))
        release_after_every_task(client)
        trimmed = client.submit(_fragment_and_free, pure=False).result()
        given_back = next(iter(client.run(_rss).values()))
    held = 300 << 20  # about 300 MB of blocks were freed in each task
    assert untrimmed["after_free"] - untrimmed["before"] > held // 2  # freed, but glibc kept it
    assert kept - untrimmed["before"] > held // 2  # and still kept after the task ended
    assert trimmed["after_free"] - given_back > held // 2  # with the plugin: given back when the task ended
