"""Issue 18: the language model moved into the read step. Side by side in one process, on the real
corpus (one core, no Dask, so the two runs are comparable):

1. read speed: `stages.read.read_unit` over the same files with the script heuristic (the default)
   and with the fastText model (filter.language.enabled), documents/s of each and their ratio;
2. what the move changes: the read step identifies each document's normalised start; the filter
   used to identify after normalisation *and* after removing boilerplate lines (which needs the
   whole corpus, so the reader cannot). Here the filter's old input is rebuilt (normalize kernel,
   boilerplate lines counted over the corpus with the default settings, lines stripped) and the
   model run on it; the script counts the documents whose language, or whose keep/drop decision
   under `keep: [zh, en]` with a min_score, differs between the two;
3. the groups: the script heuristic's zh / en / other against the model's codes.

    .venv/bin/python bench/langid_read_bench.py [--corpus /tmp/eq/corpus] [--out /tmp/wt18-bench]
"""
from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from corpusmill.pipeline.config import Config
from corpusmill.stages import boilerplate, langid, read
from corpusmill.stages.normalize import normalize_batch


def read_all(files: list[str], out: Path, language: dict | None) -> tuple[float, int, list[str]]:
    """Seconds, documents and parts of reading every file into `out` (as the read step's tasks do)."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    units, to_count = read.plan_units(files, 64 << 20, 32 << 20)
    running: dict[int, int] = {}
    for seg in to_count:
        seg.first_line = running.get(seg.file_index, 0) + 1
        running[seg.file_index] = running.get(seg.file_index, 0) + read.count_block_lines(seg.path, seg.start, seg.end)
    opts = read.ReadOptions(language=language)
    started, docs = time.perf_counter(), 0
    for u in units:
        docs += read.read_unit(u, opts, str(out))["stats"]["docs_out"]
    return time.perf_counter() - started, docs, sorted(str(p) for p in out.glob("part-*.parquet"))


def filter_input(parts: list[str], cfg: Config) -> tuple[list[str], list[str]]:
    """The texts the filter step used to identify: normalised, then the corpus's boilerplate lines removed."""
    bc = cfg.filter.boilerplate_lines
    frames = [normalize_batch(pq.read_table(p).to_pandas(), **cfg.normalize.model_dump()).kept for p in parts]
    normalised = [pa.Table.from_pandas(f[["text", "source"]], preserve_index=False) for f in frames]
    tmp = [Path(parts[0]).parent / f"norm-{i}.parquet" for i in range(len(parts))]
    for t, path in zip(normalised, tmp):
        pq.write_table(t, path)
    counted = pd.concat([boilerplate.count_lines_part(str(p), bc.min_width) for p in tmp], ignore_index=True)
    totals = counted.groupby(["source", "hash"])["docs"].sum().reset_index()
    per_source = totals[totals["docs"] < 0]
    source_docs = (-per_source["docs"]).groupby(per_source["source"]).sum()
    frequent = totals[(totals["docs"] >= bc.min_docs) & (totals["hash"] != 0)]
    need = np.maximum(bc.min_docs, bc.min_doc_share * frequent["source"].map(source_docs).to_numpy(dtype=float))
    chosen = frequent[frequent["docs"].to_numpy() >= need]
    drop = {str(s): set(g["hash"].tolist()) for s, g in chosen.groupby("source")}
    texts, sources = [], []
    for f in frames:
        stripped, _ = boilerplate.strip_lines(f["text"].tolist(), f["source"].tolist(), drop)
        texts += stripped
        sources += f["source"].tolist()
    return texts, sources


def filter_seconds(part: str, cfg: Config) -> None:
    """The filter kernel on one normalised part with the language model on: reusing the read step's
    columns against identifying again (what it did before)."""
    from corpusmill.pipeline.steps.filter import score_options
    from corpusmill.stages.filters import filter_batch
    from corpusmill.stages.quality import rule_table

    df = normalize_batch(pq.read_table(part).to_pandas(), **cfg.normalize.model_dump()).kept
    kw = {"rules": rule_table(cfg.filter), "score_options": score_options(cfg.filter),
          "language": {"max_chars": cfg.filter.language.max_chars, "keep": ["zh", "en"], "min_score": 0.0}}
    t0 = time.perf_counter()
    a = filter_batch(df, **kw)
    t1 = time.perf_counter()
    b = filter_batch(df.drop(columns=["language_score"]), **kw)
    t2 = time.perf_counter()
    print(f"filter kernel, one part of {len(df):,} documents: {t1 - t0:.1f} s reusing the read step's language, "
          f"{t2 - t1:.1f} s identifying again; kept {a.stats['docs_out']:,} / {b.stats['docs_out']:,}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default="/tmp/eq/corpus")
    ap.add_argument("--out", default="/tmp/wt18-bench")
    ap.add_argument("--reuse", action="store_true", help="skip the read timings, use the parts of a previous run")
    args = ap.parse_args()
    cfg = Config()
    files = read.expand_inputs([args.corpus])
    mb = sum(Path(f).stat().st_size for f in files) / 2**20
    langid._model()  # loaded once per worker process in a run: not part of either timing
    model = {"max_chars": cfg.filter.language.max_chars, "normalize": cfg.normalize.model_dump(mode="json")}
    out = Path(args.out)
    if args.reuse:
        parts = sorted(str(p) for p in (out / "model").glob("part-*.parquet"))
        script_parts = sorted(str(p) for p in (out / "script").glob("part-*.parquet"))
        n = sum(pq.read_metadata(p).num_rows for p in parts)
    else:
        t_script, n, _ = read_all(files, out / "script", None)
        t_model, n2, parts = read_all(files, out / "model", model)
        t_script2, _, script_parts = read_all(files, out / "script", None)  # again: the machine is noisy
        t_script = min(t_script, t_script2)
        assert n == n2
        print(f"read {len(files)} files, {mb:.0f} MB, {n:,} documents (one core)")
        print(f"  script heuristic: {t_script:6.1f} s  {n / t_script:8,.0f} docs/s  {mb / t_script:5.1f} MB/s")
        print(f"  fastText model  : {t_model:6.1f} s  {n / t_model:8,.0f} docs/s  {mb / t_model:5.1f} MB/s  "
              f"({t_model / t_script:.2f}x the time)")
    filter_seconds(parts[0], cfg)

    table = pa.concat_tables([pq.read_table(p, columns=["uid", "source", "language", "language_score"]) for p in parts])
    script = pa.concat_tables([pq.read_table(p, columns=["uid", "language"]) for p in script_parts])
    assert table.column("uid").to_pylist() == script.column("uid").to_pylist()
    at_read = np.asarray(table.column("language").to_pylist(), dtype=object)
    p_read = table.column("language_score").to_numpy()
    t0 = time.perf_counter()
    texts, _ = filter_input(parts, cfg)
    codes, probs = langid.identify(texts, cfg.filter.language.max_chars)
    t_filter = time.perf_counter() - t0
    differ = at_read != codes
    result = {"documents": n, "language_differs": int(differ.sum()),
              "examples": [(str(a), str(b)) for a, b in zip(at_read[differ][:10], codes[differ][:10])],
              "filter_input_seconds": round(t_filter, 1)}
    for min_score in (0.0, 0.5, 0.8):
        keep_read = np.isin(at_read, ["zh", "en"]) & (p_read >= min_score)
        keep_filter = np.isin(codes, ["zh", "en"]) & (probs >= min_score)
        result[f"decision_differs_keep_zh_en_min_{min_score}"] = int((keep_read != keep_filter).sum())
        result[f"dropped_at_read_min_{min_score}"] = int((~keep_read).sum())
    heuristic = np.asarray(script.column("language").to_pylist(), dtype=object)
    result["script_vs_model"] = pd.crosstab(pd.Series(heuristic, name="script"), pd.Series(at_read, name="model")) \
        .loc[:, lambda x: x.sum() >= 5].to_dict()
    result["model_codes"] = pd.Series(at_read).value_counts().head(15).to_dict()
    print(json.dumps(result, indent=1, ensure_ascii=False, default=int))


if __name__ == "__main__":
    main()
