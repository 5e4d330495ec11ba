"""Every file a run will need is loaded and checked before any work: a broken tokenizer (a truncated
tokenizer.json, one with an empty vocabulary, a SentencePiece file given as `kind: hf` or `tiktoken`)
and a missing or malformed evaluation set stop `corpusmill run` in the preflight with exit 2 and one
line naming the config key and the user's file (not the run's copy OUT/05-tokenize/...), before the
read step has made its folder. The tokenizers are made here (trained on a few lines, then damaged)."""
from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest

from corpusmill.stages.tokenize import train_hf_tokenizer, train_tokenizer, write_training_sample
from tests.conftest import write_jsonl
from tests.servers import BIN

ZH = "数据清洗是预训练中最容易被低估的环节。去重分为精确去重和近似去重两类。"
EN = "Data preparation decides more of a model's quality than most architecture tweaks. Packing joins documents."


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("preflight")
    rng = random.Random(0)
    texts = ["\n".join(rng.choice([ZH, EN, ZH[::-1], EN.upper()]) for _ in range(4)) for _ in range(200)]
    write_training_sample(texts, d / "sample.txt")
    sp = Path(train_tokenizer(d / "sample.txt", d / "sp", vocab_size=400, model_type="bpe", character_coverage=0.9995,
                              byte_fallback=True, seed=0, num_threads=1))
    good = d / "good" / "tokenizer.json"
    good.parent.mkdir()
    train_hf_tokenizer(d / "sample.txt", good, vocab_size=600, seed=0)
    raw = good.read_bytes()
    (d / "truncated.json").write_bytes(raw[: len(raw) // 2])
    doc = json.loads(raw)
    doc["model"]["vocab"], doc["model"]["merges"], doc["added_tokens"] = {}, [], []
    (d / "empty-vocab.json").write_text(json.dumps(doc))
    write_jsonl(d / "eval-bad.jsonl", [{"question": "q", "answer": "a"}], raw_lines={0: b"{not json\n"})
    write_jsonl(d / "corpus" / "a.jsonl", [{"id": f"d{i}", "text": t} for i, t in enumerate(texts)])
    return {"dir": d, "sp": sp, "good": good, "truncated": d / "truncated.json", "empty": d / "empty-vocab.json",
            "corpus": d / "corpus", "eval_bad": d / "eval-bad.jsonl"}


CASES = {
    "truncated tokenizer.json": ("tokenizer: {{model: '{truncated}'}}", "truncated", "tokenizer.model"),
    "empty vocabulary": ("tokenizer: {{model: '{empty}'}}", "empty", "tokenizer.model"),
    "sentencepiece given as hf": ("tokenizer: {{model: '{sp}', kind: hf}}", "sp", "tokenizer.model"),
    "sentencepiece given as tiktoken": ("tokenizer: {{model: '{sp}', kind: tiktoken}}", "sp", "tokenizer.model"),
    "missing evaluation set": ("decontaminate: {{sets: [{{name: ev, path: '{dir}/no-such-eval.jsonl'}}]}}", None,
                               "decontaminate.sets[0].path"),
    "evaluation set that is not JSONL": ("decontaminate: {{sets: [{{name: ev, path: '{eval_bad}'}}]}}", "eval_bad",
                                         "decontaminate.sets[0].path"),
}


def _refusal(files: dict, case: str) -> tuple[str, Path]:
    """The preflight's message for a case, from a Pipeline run in this process (no cluster: it stops first)."""
    from corpusmill.pipeline.config import load_config
    from corpusmill.pipeline.runner import Pipeline
    from corpusmill.pipeline.step import PipelineError

    name = case.replace(" ", "-").replace(".", "")
    cfg = files["dir"] / f"{name}.yaml"
    cfg.write_text(f"input: {{paths: ['{files['corpus']}']}}\n" + CASES[case][0].format(**{k: str(v) for k, v in files.items()}))
    out = files["dir"] / f"out-{name}"
    with pytest.raises(PipelineError) as e:
        Pipeline(load_config(cfg), out, log=lambda m: None).run()
    return str(e.value), out


@pytest.mark.parametrize("case", list(CASES))
def test_a_broken_file_stops_the_run_in_the_preflight_naming_it(files, case):
    _, named, key = CASES[case]
    message, out = _refusal(files, case)
    assert message.startswith("preflight checks failed") and "Traceback" not in message, message
    problem = [line for line in message.splitlines() if key in line and not line.strip().startswith("fix:")]
    assert len(problem) == 1, message  # one line, naming the config key ...
    wanted = str(files[named]) if named else str(files["dir"] / "no-such-eval.jsonl")
    assert wanted in problem[0] and "05-tokenize" not in message, message  # ... and the user's own file
    assert not (out / "00-read").exists() and not list(out.glob("0*"))  # no step started


def test_the_cli_exits_2_with_the_preflight_line(files):
    cfg = files["dir"] / "cli.yaml"
    cfg.write_text(f"input: {{paths: ['{files['corpus']}']}}\ntokenizer: {{model: '{files['truncated']}'}}\n")
    proc = subprocess.run([str(BIN / "corpusmill"), "run", str(cfg), "--out", str(files["dir"] / "out-cli")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"tokenizer.model {files['truncated']} is not a Hugging Face tokenizer.json" in proc.stderr, proc.stderr
    assert not (files["dir"] / "out-cli" / "00-read").exists()


def test_a_good_tokenizer_passes_the_preflight(files):
    from corpusmill.pipeline.config import parse_config
    from corpusmill.pipeline.doctor import OK, check_tokenizer

    for path, kind in ((files["good"].parent, None), (files["sp"], "sentencepiece")):
        cfg = parse_config({"input": {"paths": [str(files["corpus"])]}, "tokenizer": {"model": str(path), "kind": kind}})
        (check,) = check_tokenizer(cfg)
        assert check.status == OK and str(path) in check.detail, check.detail
