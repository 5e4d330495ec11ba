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


def test_histograms_count_every_document_not_the_sample(tmp_path, monkeypatch):
    """The sample only places the bins: the counts and the caption's fail share cover every row of
    every part, so they match numpy over the concatenated scores whatever MAX_SCORE_ROWS is."""
    rng = np.random.default_rng(3)
    frames = []
    for i, n in enumerate([900, 0, 1500, 700]):
        frame = pd.DataFrame({"lang": rng.choice(["zh", "en", None], n),
                              "words": rng.integers(0, 900, n).astype(float),
                              "dup_5gram": np.where(rng.random(n) < 0.1, np.nan, rng.random(n))})
        if i == 2:  # a part written before this score existed
            frame = frame.drop(columns=["dup_5gram"])
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), tmp_path / f"part-{i:05d}.parquet")
        frames.append(frame)
    every = pd.concat(frames, ignore_index=True)
    rules = {"words": [{"reason": "few_words", "kind": "min", "threshold": 50.0, "applies_to": "non_zh", "guard": None}],
             "dup_5gram": [{"reason": "dup_5gram", "kind": "max", "threshold": 0.6, "applies_to": "all",
                            "guard": ["words", 100]}]}
    bins = {"words": np.linspace(20, 800, 50), "dup_5gram": np.linspace(0, 1, 50)}
    monkeypatch.setattr(report_html, "MAX_SCORE_ROWS", 300)
    got = report_html.histogram_counts(str(tmp_path), bins, rules)
    zh = (every["lang"] == "zh").to_numpy()
    for column, b in bins.items():
        values = every[column].to_numpy(dtype=float)
        finite = np.isfinite(values)
        for row, mask in enumerate((~zh, zh)):
            want = np.histogram(np.clip(values[mask & finite], b[0], b[-1]), bins=b)[0]
            assert np.array_equal(got[column]["counts"][row], want), column
    assert got["words"]["counts"].sum() == len(every)  # every document, not 300
    applies = ~zh
    assert got["words"]["applies"][0] == applies.sum()
    assert got["words"]["fails"][0] == (applies & (every["words"] < 50)).sum()
    guarded = np.isfinite(every["dup_5gram"]) & (every["words"] >= 100)
    assert got["dup_5gram"]["applies"][0] == guarded.sum()
    assert got["dup_5gram"]["fails"][0] == (guarded & (every["dup_5gram"] > 0.6)).sum()


def test_score_plots_draw_one_figure_per_scored_column(tmp_path, monkeypatch):
    rng = np.random.default_rng(5)
    n = 2000
    pq.write_table(pa.table({"lang": rng.choice(["zh", "en"], n).tolist(), "words": rng.integers(0, 900, n).astype(float)}),
                   tmp_path / "part-00000.parquet")
    monkeypatch.setattr(report_html, "MAX_SCORE_ROWS", 100)
    rule = {"reason": "few_words", "column": "words", "kind": "min", "threshold": 50.0, "applies_to": "all", "guard": None}
    absent = {**rule, "reason": "never", "column": "never_written"}
    plots = report_html.score_plots({"filter": {"rules": [rule, absent], "scores_dir": str(tmp_path)}})
    assert len(plots) == 1
    caption, png = plots[0]
    words = pq.read_table(tmp_path / "part-00000.parquet").column("words").to_numpy()
    assert caption == f"few_words: keeps ≥ 50 (all); {(words < 50).mean():.1%} fail"
    assert png and len(png) > 1000
