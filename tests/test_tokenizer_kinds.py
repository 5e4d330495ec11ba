"""Every tokenizer kind against the library called directly, offline: Mistral's tekken files that
mistral-common ships (tiktoken format), a tokenizer.json trained here, SentencePiece models."""
from __future__ import annotations

import base64
import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from corpusmill.stages import tokenize
from corpusmill.stages import tokenizer_kinds as kinds
from tests.conftest import SHARED_DATA

MISTRAL_DATA = Path(__import__("mistral_common").__file__).parent / "data"
TEKKEN = MISTRAL_DATA / "tekken_240911.json"
ZH = "数据清洗是预训练中最容易被低估的环节。去重分为精确去重和近似去重两类。"
EN = "Data preparation decides more of a model's quality than most architecture tweaks.\n\tIndented line, 42 items."
TEXTS = [ZH, EN, ZH + "\n" + EN, "emoji 🙂 and rare 龘 chars", "", "  spaces  ", "<s> is text here, not BOS"]


def _corpus(n: int = 200) -> list[str]:
    rng = random.Random(0)
    return ["\n".join(rng.choice([ZH, EN, ZH[::-1], EN.upper()]) for _ in range(3)) for _ in range(n)]


def _ids(batch: tokenize.BatchResult) -> list[list[int]]:
    return batch.kept.column("input_ids").to_pylist()


def _docs(texts: list[str]) -> pa.Table:
    return pa.table({"uid": np.arange(len(texts), dtype=np.int64), "text": texts})


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("hf")
    tokenize.write_training_sample(_corpus(), d / "sample.txt")
    tokenize.train_hf_tokenizer(d / "sample.txt", d / "tokenizer.json", vocab_size=600, seed=0,
                                user_symbols=("<|im_start|>",))
    return d


def test_tekken_file_gives_mistral_commons_ids(tmp_path):
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    ref = Tekkenizer.from_file(str(TEKKEN))
    assert kinds.detect_kind(str(TEKKEN)) == "tiktoken"
    report = tokenize.check_tokenizer(str(TEKKEN), add_bos=True, add_eos=True, pad_id=None, model_vocab_size=131072,
                                      sample_texts=[t for t in TEXTS if t])
    assert (report.kind, report.vocab_size, report.bos_id, report.eos_id, report.unk_id) == ("tiktoken", ref.n_words, 1, 2, 0)
    assert report.pad_id == 11 and report.tokens["pad"] == "<pad>"  # tekken's own <pad>
    assert report.roundtrip_mismatch_rate == 0 and report.unused_embedding_rows == 0
    got = _ids(tokenize.tokenize_batch(_docs(TEXTS), str(TEKKEN), True, True, 3, spec=report.spec(),
                                       bos_id=report.bos_id, eos_id=report.eos_id))
    assert got == [ref.encode(t, bos=True, eos=True) for t in TEXTS]


def test_plain_tiktoken_file_matches_tiktoken_encoding(tmp_path):
    import tiktoken

    doc = json.loads(TEKKEN.read_text(encoding="utf-8"))
    ranks = {base64.b64decode(v["token_bytes"]): v["rank"] for v in doc["vocab"][:30000]}
    path = tmp_path / "small.tiktoken"
    path.write_text("".join(f"{base64.b64encode(b).decode()} {r}\n" for b, r in ranks.items()))
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"]
    assert kinds.detect_kind(str(path)) == "tiktoken"
    spec = tokenize.spec_of("tiktoken", None, specials)
    report = tokenize.check_tokenizer(str(path), add_bos=True, add_eos=True, pad_id=None, model_vocab_size=None,
                                      sample_texts=TEXTS[:4], spec=spec)
    assert (report.vocab_size, report.bos_id, report.eos_id, report.pad_id, report.unk_id) == (30003, 30000, 30001, 30002, -1)
    direct = tiktoken.Encoding("direct", pat_str=kinds.DEFAULT_TIKTOKEN_PATTERN, mergeable_ranks=ranks, special_tokens={})
    got = _ids(tokenize.tokenize_batch(_docs(TEXTS), str(path), False, True, 2, spec=spec, bos_id=30000, eos_id=30001))
    assert got == [direct.encode_ordinary(t) + [30001] for t in TEXTS]
    assert report.roundtrip_mismatch_rate == 0


def test_trained_tokenizer_json_matches_the_library(hf_dir):
    from tokenizers import Tokenizer

    assert kinds.detect_kind(str(hf_dir)) == "hf"  # a folder, as Hugging Face users have it
    report = tokenize.check_tokenizer(str(hf_dir), add_bos=False, add_eos=True, pad_id=None, model_vocab_size=None,
                                      sample_texts=TEXTS)
    lib = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    assert report.vocab_size == lib.get_vocab_size(with_added_tokens=True)  # added tokens counted
    assert (report.bos_id, report.eos_id, report.pad_id, report.unk_id) == (0, 1, 2, -1)
    assert report.special_sources["eos"] == "tokenizer" and report.roundtrip_mismatch_rate == 0  # byte-level: no unknowns
    texts = _corpus(40) + TEXTS
    got = _ids(tokenize.tokenize_batch(_docs(texts), str(hf_dir / "tokenizer.json"), True, True, 7, spec=report.spec(),
                                       bos_id=0, eos_id=1))
    assert got == [[0, *e.ids, 1] for e in lib.encode_batch(texts, add_special_tokens=False)]
    assert lib.token_to_id("<|im_start|>") == 3 and lib.encode("a<|im_start|>b", add_special_tokens=False).ids.count(3) == 1


def test_hf_training_is_repeatable(hf_dir, tmp_path):
    tokenize.train_hf_tokenizer(hf_dir / "sample.txt", tmp_path / "tokenizer.json", vocab_size=600, seed=0,
                                user_symbols=("<|im_start|>",))
    assert (tmp_path / "tokenizer.json").read_bytes() == (hf_dir / "tokenizer.json").read_bytes()


def test_specials_by_string_and_refusals(hf_dir):
    r = tokenize.check_tokenizer(str(hf_dir), add_bos=False, add_eos=True, pad_id=None, model_vocab_size=None,
                                 sample_texts=[], tokens={"eos": "<|im_start|>", "pad": "</s>"})
    assert (r.eos_id, r.pad_id, r.special_sources["eos"], r.pad_source) == (3, 1, "config", "config")
    with pytest.raises(tokenize.TokenizerError, match="not a single token"):
        tokenize.check_tokenizer(str(hf_dir), add_bos=False, add_eos=True, pad_id=None, model_vocab_size=None,
                                 sample_texts=[], tokens={"eos": "<|nope|>"})
    with pytest.raises(tokenize.TokenizerError, match="larger than the model's vocab_size"):
        tokenize.check_tokenizer(str(hf_dir), add_bos=False, add_eos=True, pad_id=None, model_vocab_size=300,
                                 sample_texts=[])


@pytest.mark.parametrize("model", [MISTRAL_DATA / "tokenizer.model.v1", SHARED_DATA / "kept/tokenizers/chinese-llama-2_tokenizer.model"])
def test_sentencepiece_through_the_interface_equals_sentencepiece(model):
    import sentencepiece as spm

    if not model.is_file():
        pytest.skip(f"{model} is not here")
    sp = spm.SentencePieceProcessor(model_file=str(model))
    assert kinds.detect_kind(str(model)) == "sentencepiece"
    texts = _corpus(30) + TEXTS
    native = _ids(tokenize.tokenize_batch(_docs(texts), str(model), True, True, 8))
    assert native == [[sp.bos_id(), *x, sp.eos_id()] for x in sp.encode(texts)]
    # an EOS named by string takes the general path (ids placed around the encoded text): the same ids
    tok = kinds.load(str(model))
    lengths, values = tok.encode_flat(texts, -1, 5)
    assert np.split(values, np.cumsum(lengths)[:-1])[3].tolist() == sp.encode(texts[3]) + [5]


def test_detect_kind_refuses_an_empty_folder(tmp_path):
    with pytest.raises(kinds.TokenizerFormatError, match="without tokenizer.json"):
        kinds.detect_kind(str(tmp_path))
