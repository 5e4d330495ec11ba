"""Learned quality selection (issue 33): real fastText models trained from text these tests make (and from
the real corpus when it is here), applied by the filter step through `corpusmill run`. No mocks of fastText."""
from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from corpusmill.pipeline.config import ConfigError, parse_config
from corpusmill.stages import classifier as clf

fasttext = pytest.importorskip("fasttext")

PROSE_EN = ("the old river ran past the mill where the miller's daughter sat reading a letter from her brother who "
            "had gone to sea and she wondered whether he would come home before winter because the harvest was late "
            "and her father was tired").split()
ENTRY_EN = ("n. adj. v. pl. syn. see also -f --force --verbose usage option obs. var. abbr. def. OPTIONS SYNOPSIS "
            "[FILE] 1. 2. 3. (noun) (verb) <arg> =").split()
PROSE_ZH = "春天的早晨河边的柳树发了新芽村里的孩子们跑到田野里去看燕子他们的母亲在家里做饭父亲已经下地干活了"
ENTRY_ZH = "【名】【动】【形】释义：参见；同“”。条第款项一二三四五六七八九十选项用法：—－"


def prose_en(rng: random.Random) -> str:
    words = [rng.choice(PROSE_EN) for _ in range(rng.randint(40, 120))]
    return " ".join(words).capitalize() + ".\n" + " ".join(rng.choice(PROSE_EN) for _ in range(30)) + "."


def entry_en(rng: random.Random) -> str:
    return "\n".join(f"{rng.choice(PROSE_EN)} {rng.choice(ENTRY_EN)} {rng.choice(ENTRY_EN)} {rng.choice(PROSE_EN)}"
                     for _ in range(rng.randint(5, 15)))


def prose_zh(rng: random.Random) -> str:
    return "".join(rng.choice(PROSE_ZH) for _ in range(rng.randint(60, 160))) + "。"


def entry_zh(rng: random.Random) -> str:
    return "\n".join(rng.choice(ENTRY_ZH) + rng.choice(PROSE_ZH) + rng.choice(ENTRY_ZH) + rng.choice(ENTRY_ZH)
                     for _ in range(rng.randint(5, 15)))


def write_jsonl(path: Path, texts: list[str], source: str = "made") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": t, "source": source}, ensure_ascii=False) + "\n" for t in texts),
                    encoding="utf-8")
    return path


SMALL = {"dim": 16, "bucket": 20000, "epoch": 10, "min_count": 1}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """A zh+en model trained on made-up prose against made-up dictionary entries and option lists."""
    root = tmp_path_factory.mktemp("clf")
    rng = random.Random(3)
    write_jsonl(root / "pos" / "a.jsonl", [prose_en(rng) for _ in range(150)] + [prose_zh(rng) for _ in range(150)])
    neg = write_jsonl(root / "neg.jsonl", [entry_en(rng) for _ in range(150)] + [entry_zh(rng) for _ in range(150)])
    (root / "pos" / "b.txt").write_text(prose_en(rng), encoding="utf-8")  # a .txt file is one document
    result = clf.train([str(root / "pos")], [str(neg)], str(root / "m.bin"), seed=1, **SMALL)
    return {"root": root, "model": root / "m.bin", "result": result}


def test_prepared_text_makes_each_cjk_character_a_token_and_is_one_line():
    s = clf.prepare_text("中文句子，好的。\nHello  World\t\r\nend ", max_chars=None)
    assert s == "中 文 句 子 ， 好 的 。 Hello World end"
    assert clf.prepare_text("abcdef", max_chars=3) == "abc"
    assert clf.prepare_text("ÄB 中", lowercase=True, cjk_spaces=False) == "äb 中"


def test_a_trained_model_loads_in_stock_fasttext_and_scores_are_its_predict(trained):
    h = trained["result"].holdout
    assert h["auc"] > 0.95 and h["precision"] > 0.9 and h["recall"] > 0.9, h
    assert trained["result"].train_docs["positive"] == 271  # 301 documents, a tenth held out
    model = fasttext.load_model(str(trained["model"]))  # stock fastText's own loader
    assert sorted(model.get_labels()) == ["__label__hq", "__label__lq"]
    rng = random.Random(99)
    texts = [prose_en(rng), entry_en(rng), prose_zh(rng), entry_zh(rng), "", "x\n\ny"]
    ours = clf.score_texts(clf.load(str(trained["model"])), texts, "__label__hq")
    for text, score in zip(texts, ours):
        labels, probs = model.predict(clf.prepare_text(text), k=-1)
        assert score == pytest.approx(float(probs[list(labels).index("__label__hq")]), abs=0, rel=1e-12)
    assert ours[0] > 0.5 > ours[1] and ours[2] > 0.5 > ours[3]
    info = clf.inspect_model(str(trained["model"]))
    assert info.supervised and not info.quantized and info.dim == 16


def test_the_same_sources_and_seed_train_the_same_model(trained, tmp_path):
    again = clf.train([str(trained["root"] / "pos")], [str(trained["root"] / "neg.jsonl")], str(tmp_path / "m.bin"),
                      seed=1, **SMALL)
    assert (tmp_path / "m.bin").read_bytes() == trained["model"].read_bytes()
    assert again.holdout == trained["result"].holdout


def test_unusable_model_files_and_labels_are_one_line_each(trained, tmp_path):
    good = trained["model"].read_bytes()
    (tmp_path / "cut.bin").write_bytes(good[:-64])
    (tmp_path / "head.bin").write_bytes(good[:200])
    (tmp_path / "text.bin").write_text("__label__hq hello\n")
    (tmp_path / "empty.bin").write_bytes(b"")
    cases = {"missing.bin": "no such model file", "cut.bin": "truncated", "head.bin": "truncated",
             "text.bin": "not a fastText model", "empty.bin": "not a fastText model"}
    for name, says in cases.items():
        problem = clf.check_model(str(tmp_path / name), "__label__hq")
        assert problem and says in problem and "\n" not in problem, (name, problem)
    assert "has no label __label__good" in clf.check_model(str(trained["model"]), "__label__good")
    assert clf.check_model(str(trained["model"]), "__label__hq") is None
    model = fasttext.load_model(str(trained["model"]))
    model.quantize()
    model.save_model(str(tmp_path / "q.ftz"))
    assert clf.check_model(str(tmp_path / "q.ftz"), "__label__hq") is None  # a quantized model is usable too
    cfg = parse_config({"filter": {"classifiers": [{"name": "a", "model": str(tmp_path / "cut.bin")},
                                                   {"name": "b", "model": str(trained["model"]), "label": "__label__x"},
                                                   {"name": "c", "model": str(trained["model"])}]}})
    from corpusmill.stages.classifier import check_classifier_models

    problems = check_classifier_models(cfg)
    assert [p.split(" ")[0] for p in problems] == ["filter.classifiers.0.model", "filter.classifiers.1.model"]


def test_quality_train_command_prints_held_out_metrics_and_refuses_an_empty_side(trained, tmp_path, capsys):
    from corpusmill.pipeline.quality_cli import main

    out = tmp_path / "cli.bin"
    assert main(["train", "--positive", str(trained["root"] / "pos"), "--negative", str(trained["root"] / "neg.jsonl"),
                 "--out", str(out), "--dim", "8", "--bucket", "5000", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["holdout"]["auc"] > 0.9 and out.is_file()
    (tmp_path / "empty").mkdir()
    write_jsonl(tmp_path / "blank.jsonl", ["   ", ""])
    for negative in (tmp_path / "empty", tmp_path / "blank.jsonl", tmp_path / "nowhere"):
        assert main(["train", "--positive", str(trained["root"] / "pos"), "--negative", str(negative),
                     "--out", str(tmp_path / "x.bin")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("corpusmill: error:") and "\n" not in err and "Traceback" not in err, err
    assert not (tmp_path / "x.bin").exists()


@pytest.mark.parametrize("bad, key", [
    ({"min_score": 2}, "filter.classifiers.0.min_score"),
    ({"keep_top_fraction": 0}, "filter.classifiers.0.keep_top_fraction"),
    ({"buckets": [{"name": "hi", "min": 0.5}, {"name": "mid", "min": 0.2, "max": 0.6}]}, "filter.classifiers.0.buckets"),
    ({"min_score": 0.5, "keep_top_fraction": 0.5}, "filter.classifiers.0"),
    ({"match": {"language": []}}, "filter.classifiers.0.match"),
])
def test_bad_classifier_values_are_refused_naming_the_key(bad, key):
    with pytest.raises(ConfigError) as e:
        parse_config({"filter": {"classifiers": [{"name": "q", "model": "m.bin", **bad}]}})
    assert f"'{key}'" in str(e.value)


def test_keep_top_fraction_threshold_is_exact_whatever_the_partitioning():
    rng = np.random.default_rng(5)
    scores = np.concatenate([rng.random(5000), np.full(300, 1.00001), np.full(40, 0.25), [np.nan] * 10])
    for fraction in (0.5, 0.1, 0.03, 1.0, 1e-4):
        expect = np.sort(scores[~np.isnan(scores)])[::-1][int(np.ceil(fraction * 5340)) - 1]
        for pieces in (1, 7, 64):
            parts = np.array_split(rng.permutation(scores), pieces)
            hist = sum(clf.histogram(p) for p in parts)
            b, need = clf.top_fraction_bin(hist, fraction)
            gathered = np.concatenate([clf.scores_in_bin(p, b) for p in parts])
            assert clf.threshold_in_bin(gathered, need) == expect


def test_combining_classifiers_all_any_and_mean():
    a = np.array([0.9, 0.2, 0.9, 0.2, np.nan])
    b = np.array([0.8, 0.8, 0.1, 0.1, np.nan])
    rules = [{"name": "a", "column": "ca", "threshold": 0.5}, {"name": "b", "column": "cb", "threshold": 0.5}]
    none = np.zeros(5, bool)
    every = clf.decide({"ca": a, "cb": b}, rules, {"mode": "all"}, none)
    assert every.reason.tolist() == [None, "classifier:a", "classifier:b", "classifier:a", None]
    either = clf.decide({"ca": a, "cb": b}, rules, {"mode": "any"}, none)
    assert either.reason.tolist() == [None, None, None, "classifier:a", None]
    cols = clf.decision_columns({"ca": a, "cb": b}, ["ca", "cb"])
    mean = clf.decide(cols, rules, {"mode": "mean", "threshold": 0.5,
                                    "buckets": [{"name": "hi", "min": 0.5}, {"name": "lo", "min": 0, "max": 0.5}]}, none)
    assert mean.reason.tolist() == [None, None, None, "classifier:mean", None]
    assert mean.bucket.tolist() == ["hi", "hi", "hi", "lo", None]
    already = clf.decide({"ca": a, "cb": b}, rules, {"mode": "all"}, np.array([0, 1, 0, 0, 0], bool))
    assert already.reason[1] is None  # a document a heuristic rule removed keeps that reason


REAL = Path("/work/corpus")


def test_a_model_trained_on_the_real_corpus_tells_books_and_laws_from_dictionary_and_man_pages(tmp_path):
    need = [REAL / "en" / "gutenberg.jsonl", REAL / "zh" / "lawrefbook.jsonl", REAL / "en" / "dict-gcide.jsonl",
            REAL / "en" / "manpages.jsonl", REAL / "zh" / "manpages-zh.jsonl"]
    if not all(p.is_file() for p in need):
        pytest.skip("the real corpus is not at /work/corpus (../shared/data/build_corpus.sh builds it)")
    result = clf.train([str(need[0]), str(need[1])], [str(need[2]), str(need[3]), str(need[4])], str(tmp_path / "r.bin"),
                       max_docs=400, max_chars=3000, seed=0, dim=16, bucket=50000)
    assert result.holdout["auc"] > 0.95 and result.holdout["positives"] >= 30, result.holdout


# ---- through `corpusmill run` --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def e2e(trained, tmp_path_factory, dask_client):
    """One small run with a zh model (min_score) and an en model (keep_top_fraction, buckets)."""
    from corpusmill.pipeline.runner import Pipeline
    from tests.conftest import LENGTH_ONLY_FILTER

    root = tmp_path_factory.mktemp("clf-run")
    rng = random.Random(11)
    docs = [(f(rng), s) for _ in range(40) for f, s in ((prose_en, "books-en"), (entry_en, "dict-en"),
                                                         (prose_zh, "books-zh"), (entry_zh, "dict-zh"))]
    corpus = root / "corpus"
    corpus.mkdir()
    for k in range(4):
        rows = docs[k::4]
        write_jsonl(corpus / f"{k}.jsonl", [t for t, _ in rows], rows[0][1])
    model = str(trained["model"])
    filt = {"length": {"min_chars": 10}, **LENGTH_ONLY_FILTER, "boilerplate_lines": {"enabled": False},
            "classifiers": [{"name": "zh", "model": model, "match": {"language": "zh"}, "min_score": 0.5},
                            {"name": "en", "model": model, "match": {"language": "en"}, "keep_top_fraction": 0.3,
                             "buckets": [{"name": "high", "min": 0.5}, {"name": "low", "min": 0, "max": 0.5}]}]}
    cfg = {"input": {"paths": [str(corpus)], "part_size_mb": 0.004}, "filter": filt,
           "dedup": {"exact": False, "minhash": {"enabled": False}},
           "tokenizer": {"train": {"vocab_size": 600}}, "pack": {"seq_length": 32},
           "shard": {"ranks": 1, "files_per_rank": 1}}
    result = Pipeline(parse_config(cfg), root / "out", client=dask_client, log=lambda m: None).run()
    return {"root": root, "out": root / "out", "cfg": cfg, "result": result, "model": model, "docs": docs}


def _scores(out: Path) -> pd.DataFrame:
    files = sorted((out / "02-filter.classifier-scores").glob("part-*.parquet"))
    return pd.concat([pq.read_table(f).to_pandas() for f in files]).set_index("uid").sort_index()


def test_a_run_scores_every_document_as_fasttext_predicts_and_keeps_the_top_fraction(e2e):
    out = e2e["out"]
    stats = e2e["result"].stages["filter"]
    assert len(list((out / "01-normalize").glob("part-*.parquet"))) > 2  # several parts
    normal = pd.concat([pq.read_table(f).to_pandas() for f in sorted((out / "01-normalize").glob("part-*.parquet"))])
    normal = normal.set_index("uid").sort_index()
    scores = _scores(out)
    model = fasttext.load_model(e2e["model"])
    for uid, row in normal.iterrows():
        labels, probs = model.predict(clf.prepare_text(row["text"]), k=-1)
        want = float(probs[list(labels).index("__label__hq")])
        col = "classifier_zh" if row["language"] == "zh" else "classifier_en"
        other = "classifier_en" if col == "classifier_zh" else "classifier_zh"
        assert scores.loc[uid, col] == want and np.isnan(scores.loc[uid, other])
    removed = pq.read_table(str(out / "02-filter" / "removed")).to_pandas()
    gone_en = removed[removed["reason"] == "classifier:en"]
    en = scores["classifier_en"].dropna()
    kept_en = len(en) - len(gone_en)
    assert kept_en == int(np.ceil(0.3 * len(en)))  # no ties among these scores
    threshold = stats["classifiers"]["quantiles"]["classifier_en"]["threshold"]
    assert (gone_en["score"] < threshold).all() and (gone_en["threshold"] == threshold).all()
    gone_zh = removed[removed["reason"] == "classifier:zh"]
    assert np.array_equal(np.sort(gone_zh["uid"]), np.sort(scores.index[scores["classifier_zh"] < 0.5]))
    assert (gone_zh["score"].to_numpy() == scores.loc[gone_zh["uid"], "classifier_zh"].to_numpy()).all()
    by_source = stats["classifiers"]["by_source"]
    assert by_source["classifier_zh"]["dict-zh"]["kept"] < by_source["classifier_zh"]["books-zh"]["kept"]
    buckets = stats["classifiers"]["buckets"]
    assert sum(v["docs"] for b in buckets.values() for v in b.values()) == stats["docs_out"]
    report = (out / "report.md").read_text()
    assert "classifier:en" in report and "Quality classifiers" in report
    assert "Quality classifiers" in (out / "report.html").read_text()


def test_a_changed_threshold_reuses_the_stored_scores_and_a_changed_model_rescores(e2e, dask_client, tmp_path):
    import shutil

    from corpusmill.pipeline.runner import Pipeline

    out = tmp_path / "out"
    shutil.copytree(e2e["out"], out)
    before = _scores(out)
    cfg = json.loads(json.dumps(e2e["cfg"]))
    cfg["filter"]["classifiers"][1]["keep_top_fraction"] = 0.6
    result = Pipeline(parse_config(cfg), out, resume=True, client=dask_client, log=lambda m: None).run()
    assert "filter" not in result.skipped and result.stages["filter"]["classifiers"]["scores_reused"] is True
    assert _scores(out).equals(before)
    removed = pq.read_table(str(out / "02-filter" / "removed")).to_pandas()
    assert (removed["reason"] == "classifier:en").sum() == len(before["classifier_en"].dropna()) - \
        int(np.ceil(0.6 * len(before["classifier_en"].dropna())))
    retrained = tmp_path / "other.bin"
    clf.train([str(e2e["root"] / "corpus" / "0.jsonl")], [str(e2e["root"] / "corpus" / "1.jsonl")], str(retrained),
              seed=2, **SMALL)
    cfg["filter"]["classifiers"][0]["model"] = str(retrained)
    result = Pipeline(parse_config(cfg), out, resume=True, client=dask_client, log=lambda m: None).run()
    assert result.stages["filter"]["classifiers"]["scores_reused"] is False


def test_a_run_whose_model_is_damaged_stops_with_one_line_before_scoring(e2e, dask_client, tmp_path):
    from corpusmill.pipeline.runner import Pipeline
    from corpusmill.pipeline.step import PipelineError

    cut = tmp_path / "cut.bin"
    cut.write_bytes(Path(e2e["model"]).read_bytes()[:5000])
    cfg = json.loads(json.dumps(e2e["cfg"]))
    cfg["filter"]["classifiers"][0]["model"] = str(cut)
    with pytest.raises(PipelineError) as e:
        Pipeline(parse_config(cfg), tmp_path / "out", client=dask_client, log=lambda m: None).run()
    # the preflight (corpusmill doctor's checks) stops it: one line per problem, naming the key
    line = next(x for x in str(e.value).splitlines() if "filter.classifiers.0.model" in x)
    assert "truncated" in line and "Traceback" not in str(e.value)
    assert not (tmp_path / "out" / "02-filter.classifier-scores").exists()  # before any scoring


def test_mix_weights_quality_buckets_and_the_shards_follow_the_weights(trained, dask_client, tmp_path):
    """Buckets as Nemotron-CC weights them: quality_bucket written by the filter, passed on through exact dedup,
    matched by mix.sources[].match.quality_bucket; the shards' tokens (counted by the shard step per source, and
    here the model puts each source in one bucket) follow the weights 3:1."""
    from corpusmill.pipeline.runner import Pipeline
    from corpusmill.stages.classifier import check_classifier_models
    from tests.conftest import LENGTH_ONLY_FILTER

    rng = random.Random(21)
    corpus = tmp_path / "corpus"
    for k in range(2):
        write_jsonl(corpus / f"books{k}.jsonl", [prose_en(rng) for _ in range(30)], "books")
        write_jsonl(corpus / f"dict{k}.jsonl", [entry_en(rng) for _ in range(60)], "dict")
    buckets = [{"name": "high", "min": 0.5}, {"name": "low", "min": 0, "max": 0.5}]
    cfg = {"input": {"paths": [str(corpus)], "part_size_mb": 0.004},
           "filter": {"length": {"min_chars": 10}, **LENGTH_ONLY_FILTER, "boilerplate_lines": {"enabled": False},
                      "classifiers": [{"name": "q", "model": str(trained["model"]), "buckets": buckets}]},
           "dedup": {"exact": True, "minhash": {"enabled": False}},
           "mix": {"sources": [{"match": {"quality_bucket": "high"}, "weight": 3},
                               {"match": {"quality_bucket": ["low"]}, "weight": 1}], "rest": "drop"},
           "tokenizer": {"train": {"vocab_size": 600}}, "pack": {"seq_length": 32},
           "shard": {"ranks": 1, "files_per_rank": 1}}
    wrong = json.loads(json.dumps(cfg))
    wrong["mix"]["sources"][1]["match"]["quality_bucket"] = "medium"
    problems = check_classifier_models(parse_config(wrong))
    assert problems == ["mix.sources.1.match.quality_bucket: 'medium' is not a bucket of filter.classifiers "
                        "(its buckets: high, low)"]
    out = tmp_path / "out"
    Pipeline(parse_config(cfg), out, client=dask_client, log=lambda m: None).run()
    kept = pd.concat([pq.read_table(f).to_pandas() for f in sorted((out / "02-filter").glob("part-*.parquet"))])
    assert {s: set(g) for s, g in kept.groupby("source")["quality_bucket"]} == {"books": {"high"}, "dict": {"low"}}
    deduped = sorted(out.glob("03*dedup*/part-*.parquet"))
    assert deduped and all("quality_bucket" in pq.read_schema(f).names for f in deduped)
    ledger = json.loads((out / "ledger.json").read_text())
    shards = {g["source"]: g["shards"]["tokens"] for g in ledger["composition"]["groups"] if "shards" in g}
    assert shards["books"] / (shards["books"] + shards["dict"]) == pytest.approx(0.75, abs=0.03), shards
    delivered = ledger["mix"]["quality_buckets"]
    assert set(delivered) == {"high", "low"} and delivered["high"]["share_delivered"] == pytest.approx(0.75, abs=0.02)
    assert delivered["high"]["documents"] == (kept["source"] == "books").sum()
    assert "Quality buckets in the training shards" in (out / "report.md").read_text()


def test_scores_are_the_same_on_a_real_scheduler_and_worker_whatever_the_partitioning(trained, tmp_path):
    """`dask scheduler` + `dask worker` processes on loopback (free ports): one part or three, the scores a worker
    stores are fastText's predict of the prepared text, bit for bit."""
    import socket
    import subprocess
    import sys
    import time

    import pyarrow as pa

    from corpusmill.stages.base import write_table_atomic

    rng = random.Random(7)
    texts = [f(rng) for _ in range(30) for f in (prose_en, entry_en, prose_zh, entry_zh)]
    table = pa.table({"uid": pa.array(range(len(texts)), pa.int64()), "text": texts,
                      "source": ["s"] * len(texts), "language": ["zh" if i % 4 > 1 else "en" for i in range(len(texts))]})
    layouts = {"one": [table], "three": [table.slice(0, 7), table.slice(7, 50), table.slice(57)]}
    spec = [{"name": "q", "model": str(trained["model"]), "sha256": None, "label": "__label__hq", "match": None,
             "max_chars": 20000, "lowercase": False, "cjk_spaces": True}]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    bin_dir = Path(sys.executable).parent
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    procs = [subprocess.Popen([str(bin_dir / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--dashboard-address", "127.0.0.1:0"], **quiet)]
    try:
        from distributed import Client

        deadline = time.monotonic() + 120
        while True:  # the scheduler's port answers
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "the dask scheduler did not start"
            time.sleep(0.2)
        procs.append(subprocess.Popen([str(bin_dir / "dask"), "worker", f"tcp://127.0.0.1:{port}", "--nworkers", "1",
                                       "--nthreads", "1", "--no-dashboard"], **quiet))
        stored = {}
        with Client(f"tcp://127.0.0.1:{port}", timeout="60s") as client:
            client.wait_for_workers(1, timeout=120)
            for name, pieces in layouts.items():
                parts = []
                for k, piece in enumerate(pieces):
                    write_table_atomic(piece, tmp_path / name / f"part-{k}.parquet")
                    parts.append((str(tmp_path / name / f"part-{k}.parquet"), str(tmp_path / name / f"scores-{k}.parquet")))
                client.gather([client.submit(clf.score_part, p, o, spec, [], pure=False) for p, o in parts])
                stored[name] = pd.concat([pq.read_table(o).to_pandas() for _, o in parts]).set_index("uid").sort_index()
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
    assert stored["one"].equals(stored["three"])
    model = fasttext.load_model(str(trained["model"]))
    for uid, text in enumerate(texts):
        labels, probs = model.predict(clf.prepare_text(text), k=-1)
        assert stored["one"].loc[uid, "classifier_q"] == float(probs[list(labels).index("__label__hq")])
