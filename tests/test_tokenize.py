import random
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from corpusmill.stages import tokenize
from corpusmill.stages.tokenize import (TokenizerError, check_tokenizer, load_tokenizer, tokenize_batch, train_tokenizer,
                             write_training_sample)
from tests.conftest import SHARED_DATA

ZH = "数据清洗是预训练中最容易被低估的环节。去重分为精确去重和近似去重两类。中文没有空格分词。"
EN = "Data preparation decides more of a model's quality than most architecture tweaks. Packing joins documents."


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    rng = random.Random(0)
    texts = ["\n".join(rng.choice([ZH, EN, ZH[::-1], EN.upper()]) for _ in range(4)) for _ in range(300)]
    write_training_sample(texts, d / "sample.txt")
    return train_tokenizer(d / "sample.txt", d / "tok", vocab_size=400, model_type="bpe", character_coverage=0.9995,
                           byte_fallback=True, seed=0, num_threads=2)


def test_trained_tokenizer_round_trips_and_has_specials(small_model):
    sample = [ZH + "\n" + EN, "tabs\tand  double spaces\nkeep", "未见过的字：龘"]
    r = check_tokenizer(small_model, add_bos=False, add_eos=True, pad_id=None, model_vocab_size=None, sample_texts=sample)
    assert (r.unk_id, r.bos_id, r.eos_id, r.pad_id, r.pad_source) == (0, 1, 2, 3, "tokenizer")
    assert r.roundtrip_mismatch_rate == 0.0 and r.unk_rate == 0.0  # byte fallback covers unseen characters


def test_vocab_checks(small_model):
    with pytest.raises(TokenizerError, match="larger than the model's vocab_size"):
        check_tokenizer(small_model, add_bos=False, add_eos=True, pad_id=None, model_vocab_size=100, sample_texts=[])
    r = check_tokenizer(small_model, add_bos=False, add_eos=True, pad_id=None, model_vocab_size=512, sample_texts=[])
    assert r.unused_embedding_rows == 512 - r.vocab_size and "never be trained" in r.warnings[0]
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        check_tokenizer(small_model, add_bos=False, add_eos=True, pad_id=10**6, model_vocab_size=None, sample_texts=[])


def test_tokenize_batch_appends_eos_as_int32_lists(small_model):
    df = pd.DataFrame({"uid": [5, 6], "text": [ZH, EN]})
    r = tokenize_batch(df, small_model, add_bos=True, add_eos=True, batch_docs=1)
    t = r.kept
    assert str(t.schema.field("input_ids").type) == "list<item: int32>"
    ids = t.column("input_ids").to_pylist()
    assert all(x[0] == 1 and x[-1] == 2 for x in ids)
    assert t.column("n_tokens").to_pylist() == [len(x) for x in ids] and r.stats["tokens"] == sum(map(len, ids))


@pytest.mark.skipif(not (SHARED_DATA / "kept" / "tokenizers").is_dir(), reason="../shared/data/kept/tokenizers absent")
@pytest.mark.parametrize("name,vocab", [("chinese-llama-2_tokenizer.model", 55296), ("internlm-7b_V7_sft.model", 103168)])
def test_real_chinese_tokenizers_get_a_pad_id(name, vocab):
    path = str(SHARED_DATA / "kept" / "tokenizers" / name)
    r = check_tokenizer(path, add_bos=True, add_eos=True, pad_id=None, model_vocab_size=None, sample_texts=[ZH, EN])
    assert r.vocab_size == vocab and (r.unk_id, r.bos_id, r.eos_id) == (0, 1, 2)
    assert r.pad_id == 0 and r.pad_source.startswith("unk")
    assert r.unk_rate < 0.01


def _mistral_models():
    try:
        import mistral_common
    except ImportError:
        return []
    data = Path(mistral_common.__file__).parent / "data"
    return sorted(str(p) for p in data.glob("*.model*") if ".model" in p.name)


@pytest.mark.parametrize("path", _mistral_models() or [pytest.param(None, marks=pytest.mark.skip("mistral-common absent"))])
def test_mistral_tokenizers_get_a_pad_and_pass_the_checks(path):
    r = check_tokenizer(path, add_bos=True, add_eos=True, pad_id=None, model_vocab_size=32768, sample_texts=[ZH, EN])
    assert r.vocab_size in (32000, 32768) and (r.unk_id, r.bos_id, r.eos_id) == (0, 1, 2)
    assert r.pad_id == 0 and r.pad_source.startswith("unk") and r.unused_embedding_rows == 32768 - r.vocab_size
    with pytest.raises(TokenizerError, match="larger than the model's vocab_size"):
        check_tokenizer(path, add_bos=True, add_eos=True, pad_id=None, model_vocab_size=30000, sample_texts=[])


def test_pipeline_refuses_a_too_large_vocabulary_before_tokenizing(tmp_path, dask_client, small_model):
    from corpusmill.pipeline.config import parse_config
    from corpusmill.pipeline.runner import Pipeline, PipelineError
    from tests.conftest import LENGTH_ONLY_FILTER, write_jsonl

    vocab = load_tokenizer(small_model).GetPieceSize()
    write_jsonl(tmp_path / "c" / "a.jsonl", [{"text": EN + f" {i}"} for i in range(20)])
    cfg = parse_config({"input": {"paths": [str(tmp_path / "c")]}, "tokenizer": {"model": small_model},
                        "filter": LENGTH_ONLY_FILTER, "train": {"model": {"vocab_size": vocab - 1}},
                        "pack": {"seq_length": 16}})
    with pytest.raises(PipelineError, match="larger than the model's vocab_size"):
        Pipeline(cfg, tmp_path / "out", client=dask_client, log=lambda m: None).run()
    assert not list((tmp_path / "out" / "05-tokenize").glob("part-*"))


def _trained_on(model: str) -> list[str]:
    from sentencepiece import sentencepiece_model_pb2 as model_pb2

    proto = model_pb2.ModelProto()
    proto.ParseFromString(Path(model).read_bytes())
    return list(proto.trainer_spec.input)


_TRAIN_IN_A_NEW_PROCESS = """
import sys
from pathlib import Path
from corpusmill.stages import tokenize
tokenize.TRAINER_LINES = 400
for seed, folder in zip(sys.argv[2::2], sys.argv[3::2]):
    (Path(sys.argv[1]) / folder).mkdir()
    tokenize.train_tokenizer(Path(sys.argv[1]) / "sample.txt", Path(sys.argv[1]) / folder / "tok", vocab_size=300,
                             model_type="unigram", character_coverage=1.0, byte_fallback=False, seed=int(seed),
                             num_threads=1)
"""


def test_a_sample_longer_than_the_trainer_reads_gives_the_same_tokenizer_for_the_same_seed(tmp_path):
    # SentencePiece samples a longer input with a generator seeded once per process, by nothing we can
    # set: only separate processes show whether the seeded cut replaced it
    rng = random.Random(1)
    words = [ZH[i:i + 3] for i in range(0, len(ZH), 3)] + EN.split()
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 12))) for _ in range(1500)]
    lines[::50] = ["x" * (tokenize.MAX_SENTENCE_BYTES + 1)] * len(lines[::50])  # lines the trainer skips count for nothing
    assert write_training_sample(lines, tmp_path / "sample.txt") == 1500
    root = Path(__file__).resolve().parents[1]
    for args in (["0", "a", "1", "c"], ["0", "b"]):
        subprocess.run([sys.executable, "-c", _TRAIN_IN_A_NEW_PROCESS, str(tmp_path), *args], cwd=root, check=True,
                       timeout=300)
    first = (tmp_path / "a" / "tok.model").read_bytes()
    assert (tmp_path / "b" / "tok.model").read_bytes() == first
    assert (tmp_path / "c" / "tok.model").read_bytes() != first
    assert _trained_on(str(tmp_path / "a" / "tok.model")) == ["sample.txt.seeded"]
    assert not (tmp_path / "sample.txt.seeded").exists()


def test_a_sample_the_trainer_reads_whole_is_given_to_it_unchanged(small_model):
    assert _trained_on(small_model) == ["sample.txt"]


def test_tokenize_slices_hold_equal_text_not_equal_rows(tmp_path):
    """Documents a thousandfold apart in size: equal-row slices would give one slice most of the
    text (one worker the whole tail); text_slices cuts at equal bytes and covers every row once."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from corpusmill.pipeline.step import text_slices

    texts = ["x" * 50] * 3000 + ["y" * 40_000] * 100  # 150 KB of short documents, then 4 MB of long ones
    pq.write_table(pa.table({"text": texts}), tmp_path / "p.parquet", row_group_size=1000)
    bounds = text_slices(str(tmp_path / "p.parquet"), 1.0)
    assert bounds[0] == 0 and bounds[-1] == len(texts) and bounds == sorted(set(bounds))
    sizes = [sum(map(len, texts[a:b])) for a, b in zip(bounds[:-1], bounds[1:])]
    assert len(sizes) == 4 and max(sizes) - min(sizes) <= 2 * 40_000, sizes  # each cut within a document of equal
