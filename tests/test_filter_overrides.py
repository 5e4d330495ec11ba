"""filter.overrides (other settings for some sources or languages, the first matching override decides)
and the garbled rule that counts characters in short texts: kernels directly, then real Dask runs."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from corpusmill.pipeline.config import ConfigError, FilterConfig, load_config, parse_config
from corpusmill.pipeline.runner import Pipeline
from corpusmill.pipeline.steps.filter import override_plan, score_options
from corpusmill.stages.filters import filter_batch
from corpusmill.stages.quality import decide, rule_table, score_texts
from tests.conftest import SHARED_DATA, write_jsonl

POEM = "建鄴懷古\n楊乘\n故城故壘滿江濆，盡是干戈舊苦辛。\n見此即須知帝力，生來便作太平人。"
# dictionary entries in the style of WordNet: well under Gopher's 50 words, no line ending in punctuation
ENTRIES = [
    "lantern\n  n 1: a light with a transparent case that protects the flame",
    "harbor\n  n 1: a sheltered port where the ships take on and discharge cargo",
    "quiver\n  v 1: to shake with fast and tremulous movements",
    "meadow\n  n 1: a field where grass is grown to be made into hay for the winter",
    "anchor\n  n 1: a heavy device that keeps a vessel from moving with the tide",
    "pebble\n  n 1: a small smooth rounded rock of the kind found on beaches",
]
PROSE = ("The river ran past the old mill and the children of the village would sit on the stone wall to watch "
         "the water turn the great wheel. In the evening their parents came to take them home, and the miller, "
         "who had known every one of them since they were born, waved to them from his door.")
ZH_NOTES = ["今日天气晴朗，适合出门散步。", "会议改到下午三点，请准时参加。", "图书馆周末照常开放。"]


def _docs(texts: list[str], sources: list[str]) -> pd.DataFrame:
    return pd.DataFrame({"uid": range(len(texts)), "id": [f"d{i}" for i in range(len(texts))], "text": texts,
                         "source": sources, "meta": None})


def _run_filter(fc: FilterConfig, df: pd.DataFrame, **kw):
    return filter_batch(df, rule_table(fc), keep_scripts=fc.scripts.keep, min_script_share=fc.scripts.min_share,
                        score_options=score_options(fc), overrides=override_plan(fc), **kw)


# ---- the garbled rule ------------------------------------------------------------------------

def test_one_private_use_character_does_not_remove_a_short_poem_but_garbled_text_goes():
    poem = POEM[:20] + "\ue012" + POEM[21:]  # one character of the poem stored in the private-use area
    lost = POEM.replace("故", "\ufffd").replace("辛", "\ufffd")  # three characters lost to U+FFFD
    mojibake = POEM[:30] + "锟斤拷" + POEM[30:]  # one classic mojibake sequence counts 3
    texts = [poem, POEM[:20] + "\ue012\ue013" + POEM[22:], lost, mojibake, "\ufffd" * 40 + PROSE]
    scores = score_texts(pa.array(texts))
    assert scores["garbled_chars"].tolist() == [1, 2, 3, 3, 40]
    assert (scores["garbled_share"] > 0.01).all()  # every one of them fails the share alone
    reason, _, threshold = decide(scores, rule_table(FilterConfig()))
    assert reason.tolist() == [None, None, "garbled", "garbled", "garbled"]
    share_only, _, _ = decide(scores, rule_table(FilterConfig(chinese={"max_garbled_chars": None})))
    assert share_only.tolist() == ["garbled"] * 5
    # a long text is judged by its share: three garbled characters in some 2,000 are not garbled text
    long_text = score_texts(pa.array(["\ufffd" * 3 + " ".join([PROSE] * 7)]))
    assert long_text.loc[0, "garbled_chars"] == 3 and decide(long_text, rule_table(FilterConfig()))[0][0] != "garbled"


@pytest.mark.skipif(not (SHARED_DATA / "kept" / "chinese_poetry.tar.xz").is_file(),
                    reason="needs ../shared/data/kept/chinese_poetry.tar.xz (real chinese-poetry archive)")
def test_real_poems_with_private_use_characters_are_kept_and_their_misdecoded_copies_removed():
    """Every real poem of the chinese-poetry archive that holds a private-use or replacement character
    (rare characters of the source fonts) is kept; the same poems read with the wrong encoding are not."""
    import re
    import sys
    import tarfile

    sys.path.insert(0, str(SHARED_DATA / "tools"))
    from textutil import poetry_docs

    odd = re.compile("[\ue000-\uf8ff\ufffd]")
    poems = []
    with tarfile.open(SHARED_DATA / "kept" / "chinese_poetry.tar.xz") as tar:
        for m in tar:
            if m.isfile() and m.name.endswith(".json") and "/error/" not in m.name and not m.name.endswith("表面结构字.json"):
                poems += [t for t in poetry_docs(tar.extractfile(m).read()) if odd.search(t)]
    assert len(poems) > 50
    scores = score_texts(pa.array(poems))
    short = scores["nonspace_chars"].to_numpy() < 100
    assert short.sum() > 20 and (scores["garbled_share"].to_numpy()[short] > 0.01).sum() > 20
    old = decide(scores, rule_table(FilterConfig(chinese={"max_garbled_chars": None})))[0]
    new = decide(scores, rule_table(FilterConfig()))[0]
    assert (old == "garbled").sum() > 20 and not (new == "garbled").any()
    misread = [p.encode("gb18030", "replace").decode("utf-8", "replace") for p in poems]
    assert (decide(score_texts(pa.array(misread)), rule_table(FilterConfig()))[0] == "garbled").all()


# ---- overrides in the kernel -----------------------------------------------------------------

def test_source_override_keeps_its_short_entries_and_not_another_sources():
    fc = parse_config({"filter": {"overrides": [
        {"name": "dictionaries", "match": {"source": "debian:dict-*"},
         "settings": {"gopher_quality.min_words": 5, "c4.min_terminal_line_share": None}}]}}).filter
    texts = ENTRIES + ENTRIES + [PROSE]
    sources = ["debian:dict-wn=1:3.0"] * len(ENTRIES) + ["notes"] * len(ENTRIES) + ["debian:dict-wn=1:3.0"]
    r = _run_filter(fc, _docs(texts, sources))
    kept = r.kept.set_index("id")["source"]
    assert (kept == "debian:dict-wn=1:3.0").sum() == len(ENTRIES) + 1 and "notes" not in kept.values
    removed = r.removed.to_pandas() if isinstance(r.removed, pa.Table) else r.removed
    assert set(removed["source"]) == {"notes"} and set(removed["reason"]) == {"gopher_few_words"}
    assert removed["override"].isna().all() and (removed["threshold"] == 50).all()
    assert r.stats["by_override"] == {"dictionaries": {"in": len(ENTRIES) + 1, "out": len(ENTRIES) + 1}}
    # the same documents with no override: every entry goes, from both sources
    plain = filter_batch(_docs(texts, sources), rule_table(FilterConfig()))
    assert plain.kept["id"].tolist() == [f"d{len(texts) - 1}"] and "by_override" not in plain.stats
    assert isinstance(plain.removed, pd.DataFrame) and "override" not in plain.removed


def test_removed_rows_name_the_override_and_the_threshold_it_used():
    fc = parse_config({"filter": {"overrides": [
        {"name": "dictionaries", "match": {"source": "dict"},
         "settings": {"gopher_quality": {"min_words": 12}, "c4": {"min_terminal_line_share": None}}}]}}).filter
    r = _run_filter(fc, _docs(ENTRIES, ["dict"] * len(ENTRIES)))
    removed = r.removed.to_pandas()
    words = score_texts(pa.array(ENTRIES))["words"].to_numpy()
    assert sorted(removed["id"]) == [f"d{i}" for i in np.flatnonzero(words < 12)]
    assert (removed["override"] == "dictionaries").all() and (removed["threshold"] == 12).all()
    assert r.stats["removed_by_override"] == {"dictionaries": {"gopher_few_words": int((words < 12).sum())}}


def test_language_override_and_first_match_wins():
    fc = parse_config({"filter": {"overrides": [
        {"name": "notes-strict", "match": {"source": "notes", "language": "zh"}, "settings": {"length.min_chars": 1000}},
        {"name": "short-chinese", "match": {"language": "zh"},
         "settings": {"length.min_chars": 5, "gopher_quality.min_cjk_chars": 5}}]}}).filter
    texts = ZH_NOTES + ZH_NOTES + ENTRIES[:2]
    sources = ["memo"] * 3 + ["notes"] * 3 + ["memo"] * 2
    r = _run_filter(fc, _docs(texts, sources))
    assert r.kept["id"].tolist() == ["d0", "d1", "d2"]  # short Chinese of memo: the language override
    removed = r.removed.to_pandas().set_index("id")
    assert removed.loc[["d3", "d4", "d5"], "override"].tolist() == ["notes-strict"] * 3  # first match, not the second
    assert (removed.loc[["d3", "d4", "d5"], "threshold"] == 1000).all()
    assert removed.loc[["d6", "d7"], "override"].isna().all()  # English entries: no override matches
    assert r.stats["by_override"] == {"notes-strict": {"in": 3, "out": 0}, "short-chinese": {"in": 3, "out": 3}}


def test_script_override_matches_the_script_holding_most_letters():
    fc = parse_config({"filter": {"overrides": [
        {"match": {"script": "cyrillic"}, "settings": {"gopher_quality.min_words": 3, "gopher_quality.min_stop_words": 0}}]}}).filter
    texts = ["Москва стоит на реке, и в ней живут люди и кошки.", "London stands on a river, and people live there."]
    r = _run_filter(fc, _docs(texts, ["x", "x"]))
    assert r.kept["id"].tolist() == ["d0"] and r.stats["by_override"] == {"script=cyrillic": {"in": 1, "out": 1}}


def test_scoring_setting_in_an_override_rescores_only_its_documents(tmp_path):
    """c4.short_line_chars changes a score, not a threshold: the override's documents are scored with it."""
    verse = "\n".join(["the wind is cold tonight", "and the hills are white", "we wait for the morning light",
                       "to wake the sleeping town", "a lamp burns in the window", "the river sings below",
                       "an owl calls from the wood", "the stars are thin and far", "my coat is old and worn",
                       "the road runs to the sea", "a dog barks at the gate", "and then the bells begin", PROSE])
    fc = parse_config({"filter": {"overrides": [
        {"name": "verse", "match": {"source": "verse"}, "settings": {"c4.short_line_chars": 10}}]}}).filter
    plan = override_plan(fc)
    assert plan[0]["score_options"]["short_line_chars"] == 10
    r = _run_filter(fc, _docs([verse, verse], ["verse", "prose"]), scores_path=str(tmp_path / "s.parquet"))
    stored = pq.read_table(tmp_path / "s.parquet").to_pandas()
    assert stored.loc[0, "short_line_share"] == 0 and stored.loc[1, "short_line_share"] > 0.67
    assert r.kept["id"].tolist() == ["d0"] and r.removed.to_pandas()["reason"].tolist() == ["short_lines"]
    again = _run_filter(fc, _docs([verse, verse], ["verse", "prose"]), scores_path=str(tmp_path / "s.parquet"),
                        reuse_scores=True)
    assert again.kept["id"].tolist() == ["d0"]


def test_an_override_decides_with_exactly_the_merged_settings():
    fc = parse_config({"filter": {"gopher_quality": {"min_words": 40}, "overrides": [
        {"name": "o", "match": {"source": "s*"}, "settings": {"gopher_quality": {"max_mean_word_length": 12},
                                                            "chinese.max_garbled_chars": None}}]}}).filter
    merged = parse_config({"filter": {"gopher_quality": {"min_words": 40, "max_mean_word_length": 12},
                                      "chinese": {"max_garbled_chars": None}}}).filter
    plan = override_plan(fc)
    assert plan[0]["rules"] == rule_table(merged) and plan[0]["score_options"] is None
    assert {r["reason"] for r in plan[0]["changed_rules"]} == {"gopher_long_words", "garbled"}


# ---- config ------------------------------------------------------------------------------------

def test_override_yaml_reads_naturally_and_round_trips(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("filter:\n  overrides:\n"
                    "    - name: dictionaries\n      match: {source: 'debian:dict-*'}\n"
                    "      settings:\n        gopher_quality.min_words: 5\n        c4: {min_terminal_line_share: null}\n"
                    "    - match: {source: [lawrefbook, 'laws-*'], language: zh}\n"
                    "      settings: {gopher_repetition: {cjk_threshold_scale: 3}}\n")
    cfg = load_config(path)
    a, b = cfg.filter.overrides
    assert a.settings.changed() == {"gopher_quality": {"min_words": 5}, "c4": {"min_terminal_line_share": None}}
    assert b.label() == "source=lawrefbook|laws-*,language=zh" and b.match.source == ["lawrefbook", "laws-*"]
    assert cfg.filter.for_override(a).gopher_quality.min_words == 5 and cfg.filter.gopher_quality.min_words == 50
    # the resolved config.yaml keeps only what an override sets, so it reads back as the same override
    dumped = yaml.safe_load(cfg.to_yaml())["filter"]["overrides"]
    assert dumped[0]["settings"] == {"gopher_quality": {"min_words": 5}, "c4": {"min_terminal_line_share": None}}
    assert parse_config(yaml.safe_load(cfg.to_yaml())).section_hash("filter") == cfg.section_hash("filter")


@pytest.mark.parametrize("override, message", [
    ({"match": {"source": "x"}, "settings": {"gopher_quality.min_wrds": 5}},
     "unknown key 'filter.overrides.0.settings.gopher_quality.min_wrds'; allowed here: enabled, min_words"),
    ({"match": {"source": "x"}, "settings": {"boilerplate_lines": {"min_docs": 5}}},
     "unknown key 'filter.overrides.0.settings.boilerplate_lines'; allowed here: length, gopher_quality"),
    ({"match": {"sorce": "x"}, "settings": {"length.min_chars": 5}},
     "unknown key 'filter.overrides.0.match.sorce'; allowed here: source, language, script"),
    ({"match": {"source": "x"}, "settings": {"length.min_chars": 5}, "when": 1},
     "unknown key 'filter.overrides.0.when'; allowed here: name, match, settings"),
    ({"match": {}, "settings": {"length.min_chars": 5}}, "needs at least one of source, language, script"),
    ({"match": {"language": "fr"}, "settings": {"length.min_chars": 5}}, "'filter.overrides.0.match.language.0'"),
    ({"match": {"source": "x"}, "settings": {}}, "change nothing"),
    ({"match": {"source": "x"}, "settings": {"length.min_chars": -1}},
     "'filter.overrides.0.settings.length.min_chars': Input should be greater than or equal to 0"),
    ({"match": {"source": "x"}, "settings": {"length.min_chars": 5, "length": {"min_chars": 6}}}, "given twice"),
])
def test_a_wrong_override_is_a_config_error_naming_the_key(tmp_path, override, message):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"filter": {"overrides": [override]}}))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert message in str(err.value) and str(path) in str(err.value)


def test_two_overrides_with_one_name_are_refused():
    with pytest.raises(ConfigError, match="both named 'source=x'"):
        parse_config({"filter": {"overrides": [{"match": {"source": "x"}, "settings": {"length.min_chars": 1}},
                                               {"match": {"source": "x"}, "settings": {"length.min_chars": 2}}]}})


# ---- real Dask runs --------------------------------------------------------------------------

def _corpus(root: Path) -> Path:
    """Two sources with the same short dictionary entries, a source of short Chinese notes, and prose."""
    write_jsonl(root / "corpus" / "dicts.jsonl",
                [{"id": f"wn{i}", "text": t, "source": "debian:dict-wn"} for i, t in enumerate(ENTRIES)]
                + [{"id": f"other{i}", "text": t, "source": "glossary"} for i, t in enumerate(ENTRIES)])
    write_jsonl(root / "corpus" / "notes.jsonl", [{"id": f"zh{i}", "text": t, "source": "memo"} for i, t in enumerate(ZH_NOTES)])
    prose = [PROSE.replace("river", w) + f" {w} again." for w in ("stream", "canal", "brook", "creek", "channel", "bay")]
    write_jsonl(root / "corpus" / "prose.jsonl", [{"id": f"p{i}", "text": t, "source": "books"} for i, t in enumerate(prose)])
    return root / "corpus"


OVERRIDES = [{"name": "dictionaries", "match": {"source": "debian:dict-*"},
              "settings": {"gopher_quality.min_words": 5, "c4.min_terminal_line_share": None}},
             {"name": "short-chinese", "match": {"language": "zh"},
              "settings": {"length.min_chars": 5, "gopher_quality.min_cjk_chars": 5}}]


@pytest.fixture(scope="module")
def override_run(tmp_path_factory, dask_client):
    root = tmp_path_factory.mktemp("overrides")
    cfg = parse_config({"input": {"paths": [str(_corpus(root))], "part_size_mb": 0.001},
                        "filter": {"overrides": OVERRIDES}, "dedup": {"minhash": {"enabled": False}},
                        "tokenizer": {"train": {"vocab_size": 600}}, "pack": {"seq_length": 16}})
    result = Pipeline(cfg, root / "out", client=dask_client, log=lambda m: None).run()
    return {"out": root / "out", "result": result}


def _removed(out: Path) -> pd.DataFrame:
    return pq.read_table(str(out / "02-filter" / "removed")).to_pandas().set_index("id")


def _kept_ids(out: Path) -> set:
    return {i for p in sorted((out / "02-filter").glob("part-*.parquet")) for i in pq.read_table(p, columns=["id"]).column("id").to_pylist()}


def test_dask_run_keeps_the_dictionary_sources_short_entries_and_removes_the_same_from_another(override_run):
    kept, removed = _kept_ids(override_run["out"]), _removed(override_run["out"])
    assert {f"wn{i}" for i in range(len(ENTRIES))} <= kept
    other = removed.loc[[f"other{i}" for i in range(len(ENTRIES))]]
    assert (other["reason"] == "gopher_few_words").all() and other["override"].isna().all()
    assert (other["threshold"] == 50).all()
    stats = override_run["result"].stages["filter"]
    assert stats["by_override"]["dictionaries"] == {"in": len(ENTRIES), "out": len(ENTRIES)}


def test_dask_run_language_override_keeps_short_chinese_notes(override_run):
    kept = _kept_ids(override_run["out"])
    assert {f"zh{i}" for i in range(len(ZH_NOTES))} <= kept
    assert override_run["result"].stages["filter"]["by_override"]["short-chinese"] == {"in": 3, "out": 3}


def test_report_shows_each_override_and_the_rules_it_changed(override_run):
    report = (override_run["out"] / "report.md").read_text(encoding="utf-8")
    assert "### Filter overrides" in report
    assert "| dictionaries | source debian:dict-* | 6 | 6 | 0 |" in report
    assert "| dictionaries | gopher_few_words | `words` | >= 50 | >= 5 | non-zh | 0 |" in report
    assert "| dictionaries | few_terminal_lines | `terminal_line_share` | >= 0.12 | off | non-zh | 0 |" in report
    marker = json.loads((override_run["out"] / "02-filter" / "_DONE.json").read_text())
    assert [o["name"] for o in marker["outputs"]["overrides"]] == ["dictionaries", "short-chinese"]


def test_changed_override_threshold_reuses_scores_and_reruns_only_the_decision(override_run, dask_client, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(override_run["out"], out)
    as_run = yaml.safe_load((out / "config.yaml").read_text())
    as_run["filter"]["overrides"][0]["settings"]["gopher_quality"]["min_words"] = 12
    result = Pipeline(parse_config(as_run), out, resume=True, client=dask_client, log=lambda m: None).run()
    assert result.skipped == ["read", "normalize"] and result.stages["filter"]["scores_reused"] is True
    words = score_texts(pa.array(ENTRIES))["words"].to_numpy()
    removed = _removed(out)
    short = [f"wn{i}" for i in np.flatnonzero(words < 12)]
    assert short and (removed.loc[short, "override"] == "dictionaries").all() and (removed.loc[short, "threshold"] == 12).all()
    assert {f"wn{i}" for i in np.flatnonzero(words >= 12)} <= _kept_ids(out)


def test_a_poem_the_language_model_calls_japanese_keeps_the_character_rules():
    """The model labels some Tang poems ja (or wuu / yue): rules scoped to CJK text still judge them by
    characters; judged as word text (a label like en) the same poem fails a word rule."""
    scores = score_texts(pa.array([POEM]))
    rules = rule_table(FilterConfig())
    for code in ("zh", "ja", "wuu", "yue"):
        scores["lang"] = code
        assert decide(scores, rules)[0][0] is None, code
    scores["lang"] = "en"
    assert str(decide(scores, rules)[0][0]).startswith("gopher_")

