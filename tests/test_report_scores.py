"""The HTML report's score histograms read a seeded sample of the scores a part at a time."""
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from corpusmill.pipeline import report_html


def _one_frame_sample(paths, columns, cap):
    """The sample as first defined: every part's sampled rows as a frame, concatenated."""
    total = sum(pq.ParquetFile(p).metadata.num_rows for p in paths)
    rate = min(1.0, cap / total)
    rng = np.random.default_rng(0)
    frames = []
    for p in paths:
        t = pq.read_table(p, columns=[c for c in columns if c in pq.read_schema(p).names])
        if rate < 1.0:
            t = t.filter(rng.random(t.num_rows) < rate)
        frames.append(t.to_pandas())
    return pd.concat(frames, ignore_index=True)


def test_the_sample_is_the_one_frame_sample_column_by_column(tmp_path, monkeypatch):
    rng = np.random.default_rng(7)
    paths = []
    for i, n in enumerate([500, 0, 1200, 800]):
        cols = {"lang": pa.array(rng.choice(["zh", "en", None], n).tolist(), pa.string()),
                "words": pa.array(rng.integers(0, 900, n)),
                "dup_5gram": pa.array(np.where(rng.random(n) < 0.1, np.nan, rng.random(n)))}
        if i != 2:  # a part written before this score existed
            cols["mean_word_length"] = pa.array(rng.random(n) * 9)
        paths.append(tmp_path / f"part-{i:05d}.parquet")
        pq.write_table(pa.table(cols), paths[-1])
    columns = ["lang", "words", "dup_5gram", "mean_word_length", "never_written"]
    for cap in (10_000, 700):  # everything, then a sample
        monkeypatch.setattr(report_html, "MAX_SCORE_ROWS", cap)
        got = report_html._read_scores(str(tmp_path), columns)
        want = _one_frame_sample(paths, columns, cap)
        assert len(got["zh"]) == len(want) and (cap > 2500 or len(want) < 2500)
        assert np.array_equal(got["zh"], (want["lang"] == "zh").to_numpy())
        for c in ("words", "dup_5gram", "mean_word_length"):
            assert np.array_equal(got[c], want[c].to_numpy(dtype=float), equal_nan=True), c
        assert "never_written" not in got
