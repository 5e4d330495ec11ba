"""The quality-rule extension point (stages/quality_rules.py): a rule family added by one module
scores documents with its own columns, decides after the built-in rules, is validated in the
config, stored with the other scores, and explained in the report; as an installed package's entry
point it works in a whole `corpusmill run`."""
import json
import os
import subprocess
import sys
import textwrap

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from corpusmill.pipeline.config import Config, FilterConfig
from corpusmill.pipeline.steps.filter import override_plan, score_options
from corpusmill.stages import quality_rules
from corpusmill.stages.filters import filter_batch
from corpusmill.stages.quality import describe_rules, rule_table
from tests.conftest import LENGTH_ONLY_FILTER
from tests.corpora import build_corpus, e2e_config

BASE = {"length": {"min_chars": 10, "min_words": 3, "max_chars": 300}, **LENGTH_ONLY_FILTER}

# the worked example of docs/contributing.md: pages written in capitals
TOY_RULE = '''
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict

from corpusmill.stages.quality_rules import QualityRule, register_rule


class ShoutingSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_share: float = 0.5  # of the ASCII letters, upper case
    min_letters: int = 20  # shorter texts (titles, acronyms) are not judged


def score(texts):
    letters = pc.count_substring_regex(texts, "[A-Za-z]").to_numpy(zero_copy_only=False)
    upper = pc.count_substring_regex(texts, "[A-Z]").to_numpy(zero_copy_only=False)
    return {"ascii_letters": letters, "upper_letter_share": upper / letters.clip(min=1)}


def rules(s):
    return [("shouting", "upper_letter_share", "max", s.max_share, "non_zh", ("ascii_letters", s.min_letters))]


register_rule(QualityRule("shouting", ShoutingSettings, score, rules,
                          {"shouting": "more than filter.rules.shouting.max_share of the letters in capitals"}))
'''
PROSE = ("The river ran past the old mill and the children of the village would sit on the stone wall to watch "
         "the water turn the great wheel, and their parents came to take them home in the evening.")


@pytest.fixture
def shouting():
    exec(compile(TOY_RULE, "toy_shouting_rule", "exec"), {})  # what importing the module does
    yield
    quality_rules._RULES.pop("shouting", None)


def _filter(fc: FilterConfig, texts: list[str], **kw):
    df = pd.DataFrame({"uid": range(len(texts)), "id": [f"d{i}" for i in range(len(texts))], "text": texts,
                       "source": "s", "meta": None})
    return filter_batch(df, rule_table(fc), keep_scripts=fc.scripts.keep, min_script_share=fc.scripts.min_share,
                        score_options=score_options(fc), overrides=override_plan(fc),
                        rule_scores=list(fc.rules), **kw)


def test_a_registered_rule_is_validated_scored_stored_and_decides_after_the_builtin_rules(shouting, tmp_path):
    fc = Config.model_validate({"filter": {**BASE, "rules": {"shouting": {"max_share": 0.6}}}}).filter
    assert fc.rules == {"shouting": {"max_share": 0.6, "min_letters": 20}}  # completed with the defaults
    assert rule_table(fc)[-1] == ("shouting", "upper_letter_share", "max", 0.6, "non_zh", ("ascii_letters", 20))
    texts = [PROSE, PROSE.upper(), "NASA AND ESA", PROSE.upper() * 2]
    stored = tmp_path / "scores.parquet"
    result = _filter(fc, texts, scores_path=str(stored))
    assert result.kept["id"].tolist() == ["d0", "d2"]
    removed = result.removed.set_index("id")
    assert removed.loc["d1", "reason"] == "shouting" and removed.loc["d1", "threshold"] == 0.6
    assert removed.loc["d1", "score"] > 0.95
    assert removed.loc["d3", "reason"] == "too_many_chars"  # a built-in rule that fails first keeps its reason
    assert "upper_letter_share" in pq.read_schema(stored).names
    looser = FilterConfig.model_validate({**BASE, "rules": {"shouting": {"max_share": 1.0}}})
    again = _filter(looser, texts, scores_path=str(stored), reuse_scores=True)  # a threshold change: scores reused
    assert again.kept["id"].tolist() == ["d0", "d1", "d2"]
    assert "capitals" in describe_rules()["shouting"]
    assert rule_table(FilterConfig()) == rule_table(FilterConfig.model_validate({}))  # off unless named


def test_the_config_refuses_an_unknown_rule_or_setting(shouting):
    with pytest.raises(ValueError, match="no quality rule named 'shoutin'.*registered: shouting"):
        Config.model_validate({"filter": {"rules": {"shoutin": {}}}})
    with pytest.raises(ValueError, match="filter.rules.shouting"):
        Config.model_validate({"filter": {"rules": {"shouting": {"max_shar": 0.3}}}})
    assert Config().section_hash("filter") == Config.model_validate({"filter": {"rules": {}}}).section_hash("filter")


@pytest.mark.slow
def test_an_installed_rule_and_format_work_in_a_whole_run(tmp_path):
    """Both extension points as a package of their own would bring them (entry points, here on
    PYTHONPATH): the run's Dask workers read the .tsv file and score the rule; the ledger counts
    the rule's removals and the report explains them."""
    site = tmp_path / "site"
    info = site / "toy_ext-0.1.dist-info"
    info.mkdir(parents=True)
    (site / "toy_shouting.py").write_text(textwrap.dedent(TOY_RULE))
    (site / "toy_tsv.py").write_text(textwrap.dedent('''
        from corpusmill.stages.read import Record, records_format, register_format

        def parse(data, path):
            for n, line in enumerate(data.decode().splitlines(), 1):
                doc_id, _, text = line.partition("\\t")
                yield Record(n, text, id=doc_id, source="tsv")

        register_format(records_format("tsv", (".tsv",), parse))
    '''))
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-ext\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[corpusmill.quality_rules]\nshouting = toy_shouting\n\n"
                                           "[corpusmill.input_formats]\ntsv = toy_tsv\n")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    build_corpus(corpus)
    (corpus / "loud.tsv").write_text("".join(f"loud{i}\t{PROSE.upper()} {i}\n" for i in range(3)) +
                                     "".join(f"calm{i}\t{PROSE} {i}\n" for i in range(2)))
    cfg = e2e_config(corpus, cluster={"n_workers": 1}, filter={"rules": {"shouting": {}}},
                     shard={"ranks": 1, "files_per_rank": 1})
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "corpusmill.pipeline.cli", "run", str(tmp_path / "run.yaml"),
                           "--out", str(out), "--no-train"], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    removed = pq.read_table(str(out / "02-filter" / "removed")).to_pandas()
    shouted = removed[removed["reason"] == "shouting"]
    assert sorted(shouted["id"]) == ["loud0", "loud1", "loud2"]
    kept = pq.read_table(str(out / "02-filter"), columns=["id"]).column("id").to_pylist()
    assert {"calm0", "calm1"} <= set(kept)
    ledger = json.loads((out / "ledger.json").read_text())
    assert "shouting" in json.dumps(ledger)
    assert "capitals" in (out / "report.md").read_text()
