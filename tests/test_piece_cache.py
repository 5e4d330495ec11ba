"""The exact piece-cache encoder (stages.piece_cache) against plain SentencePiece: the same ids on
made-up hard text and on real corpus documents, for the kept Chinese models and Mistral's; the
models it declines say why; and the per-part check (tokenizer.verify_sample) stops a run whose fast
ids differ."""
import base64
import json
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as model_pb2

from corpusmill.stages import piece_cache, tokenize
from corpusmill.stages import tokenizer_kinds as kinds
from tests.conftest import SHARED_DATA

KEPT = SHARED_DATA / "kept" / "tokenizers"
CORPUS = Path("/work/corpus")


def _mistral(names: tuple) -> list:
    try:
        import mistral_common
    except ImportError:
        return []
    data = Path(mistral_common.__file__).parent / "data"
    return [str(data / n) for n in names if (data / n).is_file()]


MODELS = ([str(KEPT / n) for n in ("chinese-llama-2_tokenizer.model", "internlm-7b_V7_sft.model") if (KEPT / n).is_file()]
          + _mistral(("tokenizer.model.v1", "mistral_instruct_tokenizer_241114.model.v7")))


def _tricky(sp: spm.SentencePieceProcessor) -> list[str]:
    """Text built to hit every edge of the cut rule: whitespace runs of every kind at both ends,
    digits, emoji, characters only byte fallback covers, the model's own user symbols glued to words,
    a literal U+2581, and runs far longer than a cached piece."""
    rng = random.Random(7)
    users = [sp.IdToPiece(i) for i in range(sp.GetPieceSize()) if sp.IsUnused(i) is False and
             sp.IdToPiece(i).startswith(("[REF", "<eo", "[/REF", "<TOKENS"))][:6]
    atoms = ["the", "The", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u3000", "\xa0", "2024", "3.14159",
             "0x1F", "1,000,000", "😀", "👩‍💻", "🇫🇷", "龘", "𠀀𠀁", "\U000E0041", "\x00", "\u200b", "e\u0301", "▁", "▁▁x",
             "中文没有空格分词。", "数据清洗，", "「引号」", "，", "。", "http://example.com/a?b=c", "snake_case", "CamelCase",
             "don't", "'s", "--", "...", "<s>", "</s>", "<unk>", *users]
    texts = ["", " ", "  ", "\n", "\t", "a", " a", "a ", "  leading", "trailing  ", "▁", " ▁ ", "x▁y", "<0x41>"]
    texts += ["".join(rng.choice(atoms) for _ in range(rng.randint(1, 60))) for _ in range(300)]
    texts += [u + "x" for u in users] + ["x" + u + " y" for u in users] + [" " + u for u in users]
    texts += [base64.b64encode(rng.randbytes(150_000)).decode(),  # a 200 KB line with no space
              "中华人民共和国" * 5000, " " * 5000 + "end", "a" * 3000, "\n".join(["    indented code();"] * 300),
              "1234567890" * 500, "😀" * 2000]
    return texts


def _plain(sp: spm.SentencePieceProcessor, texts: list[str]) -> list[list[int]]:
    return [list(x) for x in sp.encode(texts, num_threads=1)]


def _fast(enc: piece_cache.PieceCache, texts: list[str], batch: int = 64) -> list[list[int]]:
    out = []
    for i in range(0, len(texts), batch):
        lengths, values = enc.encode_flat(texts[i:i + batch])
        out += [x.tolist() for x in np.split(values, np.cumsum(lengths)[:-1])] if len(lengths) else []
    return out


@pytest.fixture(scope="module", params=MODELS or [pytest.param(None, marks=pytest.mark.skip("no models"))],
                ids=lambda p: Path(p).name if p else "none")
def model(request):
    sp = spm.SentencePieceProcessor(model_file=request.param)
    enc, why = piece_cache.build(sp, request.param)
    assert enc is not None, why
    return request.param, sp, enc


def test_same_ids_as_sentencepiece_on_hard_text(model):
    path, sp, enc = model
    texts = _tricky(sp)
    assert _fast(enc, texts) == _plain(sp, texts)
    # a tiny cache (pieces over 4 characters uncached, cleared past 50 pieces) gives the same ids too
    small = piece_cache.PieceCache(sp, enc_proto(path), max_key=4, max_pieces=50)
    assert _fast(small, texts, batch=7) == _plain(sp, texts)
    assert small.stats["cache_clears"] > 0 and small.stats["long_pieces"] > 0
    # and the batch's own BOS/EOS placement is the plain encoder's
    lengths, values = enc.encode_flat(texts[:20], 1, 2)
    want = [[1, *x, 2] for x in _plain(sp, texts[:20])]
    assert [x.tolist() for x in np.split(values, np.cumsum(lengths)[:-1])] == want


def enc_proto(path: str) -> model_pb2.ModelProto:
    proto = model_pb2.ModelProto()
    proto.ParseFromString(Path(path).read_bytes())
    return proto


def test_identity_normalization_is_sentencepieces(model):
    """The identity normalizer done over code points here gives sp.normalize's text exactly."""
    _, sp, enc = model
    if not enc.plain_normalizer:
        pytest.skip("this model normalizes through sp.normalize itself")
    texts = _tricky(sp)[:200]
    cps, starts = enc._points(texts)
    got = [cps[a:b].tobytes().decode("utf-32-le") for a, b in zip(starts[:-1], starts[1:])]
    assert got == sp.normalize(texts)


def _corpus_sample(max_bytes: int) -> list[str]:
    """The first documents of every English and Chinese file of the real corpus (Gutenberg books
    and dictionaries, manuals, laws, poetry), cut to `max_bytes` per file."""
    texts = []
    for f in sorted((CORPUS / "en").glob("*.jsonl")) + sorted((CORPUS / "zh").glob("*.jsonl")):
        n = 0
        with open(f, encoding="utf-8") as fh:
            for line in fh:
                text = json.loads(line)["text"]
                texts.append(text[:max_bytes])
                n += len(text[:max_bytes].encode())
                if n > max_bytes:
                    break
    return texts


@pytest.mark.skipif(not (CORPUS / "en").is_dir() or not (CORPUS / "zh").is_dir(), reason="/work/corpus absent")
def test_same_ids_on_real_corpus_documents(model):
    _, sp, enc = model
    texts = _corpus_sample(40_000)
    assert len(texts) > 100
    fast, plain = _fast(enc, texts, batch=256), _plain(sp, texts)
    same = sum(a == b for a, b in zip(fast, plain))
    assert same == len(texts)


def _variant(tmp_path: Path, name: str, change) -> str:
    proto = enc_proto(MODELS[0])
    change(proto)
    out = tmp_path / f"{name}.model"
    out.write_bytes(proto.SerializeToString())
    return str(out)


def _no_byte_fallback(p: model_pb2.ModelProto) -> None:
    p.trainer_spec.byte_fallback = False
    for piece in p.pieces:
        if piece.type == 6:  # BYTE pieces must go with byte fallback: keep their ids as control pieces
            piece.type = 3


VARIANTS = {
    "remove_extra_whitespaces": lambda p: setattr(p.normalizer_spec, "remove_extra_whitespaces", True),
    "no_dummy_prefix": lambda p: setattr(p.normalizer_spec, "add_dummy_prefix", False),
    "whitespace_suffix": lambda p: setattr(p.trainer_spec, "treat_whitespace_as_suffix", True),
    "no_byte_fallback": _no_byte_fallback,
}


@pytest.mark.skipif(not MODELS, reason="no SentencePiece models")
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_other_normalizer_and_trainer_settings_stay_exact(tmp_path, name):
    """The real vocabulary under other settings: SentencePiece's own normalize() (whitespace removal),
    no dummy prefix, whitespace as suffix, and no byte fallback (a run of unknown characters is one <unk>)."""
    path = _variant(tmp_path, name, VARIANTS[name])
    sp = spm.SentencePieceProcessor(model_file=path)
    enc, why = piece_cache.build(sp, path)
    assert enc is not None, why
    texts = _tricky(sp)[:-7] + ["龘𠀀𠀁 \U000E0041\U000E0042 x龘", "  a  b  ", "\U000E0041" * 30]
    assert _fast(enc, texts) == _plain(sp, texts)


@pytest.mark.skipif(not MODELS, reason="no SentencePiece models")
def test_models_the_fast_path_cannot_reproduce_are_declined(tmp_path):
    unigram = _variant(tmp_path, "unigram", lambda p: setattr(p.trainer_spec, "model_type", 1))
    enc, why = piece_cache.build(spm.SentencePieceProcessor(model_file=unigram), unigram)
    assert enc is None and "unigram" in why

    def unused(p: model_pb2.ModelProto) -> None:
        p.pieces[1000].type = 5

    path = _variant(tmp_path, "unused", unused)
    enc, why = piece_cache.build(spm.SentencePieceProcessor(model_file=path), path)
    assert enc is None and "UNUSED" in why


@pytest.mark.skipif(not MODELS, reason="no SentencePiece models")
def test_tokenize_part_fast_equals_plain_and_verify_sample_catches_a_difference():
    """The part kernel the tokenize step maps: the fast path writes the plain path's table and says
    so in its stats; a cache holding wrong ids (poisoned through its own arrays) is caught by the
    plain re-encoding of the sample, naming the document."""
    path = MODELS[0]
    texts = _tricky(spm.SentencePieceProcessor(model_file=path))[:150]
    df = pd.DataFrame({"uid": np.arange(1000, 1000 + len(texts)), "text": texts})
    plain = tokenize.tokenize_batch(df, path, add_bos=True, add_eos=True, batch_docs=32)
    fast = tokenize.tokenize_batch(df, path, add_bos=True, add_eos=True, batch_docs=32, fast_encode=True,
                                   verify_sample=40)
    assert fast.kept.equals(plain.kept)
    assert fast.stats["encoder"] == "piece_cache" and plain.stats["encoder"] == "plain"
    assert 0 < fast.stats["verified_docs"] <= 40 and fast.stats["fast_cache"]["lookups"] > 0
    enc, _ = kinds.load(path, kinds.TokenizerSpec("sentencepiece")).fast_encoder()
    try:
        enc.p_ids[:enc.n_ids] += 1  # every cached piece now maps to the next id
        with pytest.raises(tokenize.FastEncodeMismatch, match=r"document uid 10\d\d differ"):
            tokenize.tokenize_batch(df, path, add_bos=False, add_eos=True, batch_docs=32, fast_encode=True,
                                    verify_sample=len(texts))
        unchecked = tokenize.tokenize_batch(df, path, add_bos=False, add_eos=True, batch_docs=32, fast_encode=True,
                                            verify_sample=0)
        assert unchecked.stats["verified_docs"] == 0  # with the check off nothing stops the wrong ids
    finally:
        enc._clear()
    again = tokenize.tokenize_batch(df, path, add_bos=True, add_eos=True, batch_docs=32, fast_encode=True,
                                    verify_sample=len(texts))
    assert again.kept.equals(plain.kept) and again.stats["verified_docs"] == len(texts)  # 14k characters: all


@pytest.mark.skipif(not MODELS, reason="no SentencePiece models")
def test_verify_sample_of_a_part_of_books_checks_the_start_of_one_and_stays_within_its_budget():
    """Documents longer than the verify budget are not re-encoded whole (plain SentencePiece would cost
    several times the fast path); when every document is, the start of one is encoded both ways."""
    path = MODELS[0]
    rng = np.random.default_rng(3)
    words = np.array("river stone bread light garden winter music paper 河流 石头 面包".split())
    books = [" ".join(rng.choice(words, 60_000)) for _ in range(3)]  # ~300k characters each
    df = pd.DataFrame({"uid": np.arange(7, 10), "text": books})
    plain = tokenize.tokenize_batch(df, path, add_bos=True, add_eos=False, batch_docs=8)
    fast = tokenize.tokenize_batch(df, path, add_bos=True, add_eos=False, batch_docs=8, fast_encode=True,
                                   verify_sample=32)
    assert fast.kept.equals(plain.kept) and fast.stats["verified_docs"] == 1
    enc, _ = kinds.load(path, kinds.TokenizerSpec("sentencepiece")).fast_encoder()
    try:
        enc.p_ids[:enc.n_ids] += 1
        with pytest.raises(tokenize.FastEncodeMismatch, match=r"its first [\d,]+ characters"):
            tokenize.tokenize_batch(df, path, add_bos=True, add_eos=False, batch_docs=8, fast_encode=True,
                                    verify_sample=32)
    finally:
        enc._clear()
