"""The exact regex-piece cache (stages.pretoken_cache) for byte-level BPE tokenizer.json against the
tokenizer's own encoder: the same cut points as its pre-tokenizer and the same ids, for the GPT-2,
Llama-3 and Qwen2 pre-tokenizers (Qwen2 with its NFC normalizer), on made-up hard text, the Python
standard library's sources and, when present, the real corpus; added tokens in the text, a tiny
cache and long pieces stay exact; tokenizers it cannot reproduce are declined with the reason."""
import json
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from corpusmill.stages import pretoken_cache, tokenize
from tests.corpora import en_doc, zh_doc

CORPUS = Path("/work/corpus")
SPECIALS = ["<s>", "</s>", "<pad>", "<|im_start|>"]


def _stdlib_texts() -> list[str]:
    """Real English with code, numbers and punctuation on every machine: the stdlib's own sources."""
    root = Path(json.__file__).parent.parent
    files = sorted(root.glob("*.py"))[:120]
    return [f.read_text(encoding="utf-8", errors="replace") for f in files]


def _tricky() -> list[str]:
    """Text built for every branch of the three regexes: contractions in both cases (and U+017F),
    whitespace runs of every kind before letters, digits, punctuation and line breaks, digit runs
    longer than three, CR LF, Unicode spaces and separators, combining marks, emoji, scripts without
    spaces, characters the classes disagree on in other engines."""
    rng = random.Random(11)
    atoms = ["'s", "'S", "'t", "'re", "'RE", "'Ve", "'m", "'ll", "'LL", "'d", "'D", "'\u017f", "'x", "'", "''", "don't",
             " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\r", "\u3000", "\xa0", "\u2028", "\u2029", "\x85",
             "\x0b", "\x0c", "\x1c", "\u200b", "2024", "1234567", "3.14", "٢٣", "Ⅻ", "½", "1,000", "😀", "👍🏽", "🇫🇷",
             "e\u0301", "中文没有空格。", "「引号」", "，", "ひらがな", "한국어", "Ελληνικά", "العربية", "ǅ", "word", "Word",
             "WORD", "x", "!!!", "...", "$", "(", ")", "-->", "_", "http://a.b/c?d=e", "snake_case", "\x00", "\U000e0041"]
    texts = ["", " ", "  ", "\n", "\t", "a", " a", "a ", "  x", "x  ", "\n\n\n", " \n", "'", "'s", "a'", "12345"]
    texts += ["".join(rng.choice(atoms) for _ in range(rng.randint(1, 50))) for _ in range(1500)]
    texts += [" " * 300 + "end", "a" * 3000, "1" * 500, "中华人民共和国" * 200, "\n".join(["    indented();"] * 50)]
    return texts


def _train_texts() -> list[str]:
    rng = random.Random(3)
    return [en_doc(rng) for _ in range(300)] + [zh_doc(rng) for _ in range(300)] + _stdlib_texts() + _tricky()[:500]


def _split(pattern: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pretoken_cache.PATTERNS[pattern]), behavior="isolated"),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def _make(pre: pre_tokenizers.PreTokenizer, normalizer=None, vocab: int = 3000) -> Tokenizer:  # noqa: ANN001
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_train_texts(), trainer=trainer)
    return Tokenizer.from_str(tok.to_str())  # as loaded from a tokenizer.json


KINDS = {"gpt2": lambda: _make(pre_tokenizers.ByteLevel(add_prefix_space=False)),
         "llama3": lambda: _make(_split("llama3")),
         "qwen2": lambda: _make(_split("qwen2"), normalizers.NFC())}


@pytest.fixture(scope="module", params=sorted(KINDS))
def kind(request):
    return request.param, KINDS[request.param]()


def _plain(tok: Tokenizer, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


def _fast(enc: pretoken_cache.HFPieceCache, texts: list[str], batch: int = 64) -> list[list[int]]:
    out: list[list[int]] = []
    for i in range(0, len(texts), batch):
        out += [a.tolist() for a in enc.encode(texts[i:i + batch])]
    return out


def test_cut_points_are_the_pre_tokenizers_own(kind):
    """The compiled scanner ends every piece where the tokenizer's own pre-tokenizer (Oniguruma) ends
    its match, on every tricky text and the stdlib sources (offsets of `pre_tokenize_str`)."""
    name, tok = kind
    enc, why = pretoken_cache.build(tok)
    assert enc is not None, why
    assert enc.pattern == name
    split = (pre_tokenizers.Split(Regex(pretoken_cache.PATTERNS[name]), behavior="isolated") if name != "gpt2" else
             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    texts = [t for t in _tricky() + _stdlib_texts() if t]
    cps, doc_starts = pretoken_cache.text_points(texts)
    enc.classes.ensure(cps)
    starts, doc_seg = pretoken_cache.regex_cuts(cps, doc_starts, enc.classes.cls, enc.fold, enc.kind, enc.join_table,
                                                enc.join_bits, False, enc.guard_table, enc.guard_bits)  # the regex's alone
    for d, text in enumerate(texts):
        mine = (starts[doc_seg[d]:doc_seg[d + 1] + 1] - starts[doc_seg[d]]).tolist()
        theirs = [0] + [b for _, (_, b) in split.pre_tokenize_str(text)]  # offsets in characters of the text
        assert mine == theirs, (name, text[:80])


def test_ids_equal_the_plain_encoder(kind):
    """Every text gives the plain encoder's ids: tricky text, stdlib sources, texts holding added tokens
    (encoded whole by the plain encoder, counted), in one batch with ordinary ones."""
    name, tok = kind
    enc, _ = pretoken_cache.build(tok)
    texts = _tricky() + _stdlib_texts() + ["say <s>hi</s> now", "<|im_start|>user", "x<pad>"]
    assert _fast(enc, texts) == _plain(tok, texts)
    assert enc.stats["plain_docs"] >= 3 and enc.hit_rate() > 0.3
    again = _fast(enc, texts[::-1], batch=500)  # a warm cache, other batches
    assert again == _plain(tok, texts[::-1])


def test_a_tiny_cache_and_short_keys_stay_exact(kind):
    """With room for 40 pieces the cache is cleared many times, with 3-character keys most pieces are
    encoded uncached each time: the ids do not change."""
    _, tok = kind
    spec = json.loads(tok.to_str())
    enc = pretoken_cache.HFPieceCache(tok, spec, pretoken_cache.pattern_of(spec["pre_tokenizer"])[0],
                                         max_key=3, max_pieces=40)
    texts = _tricky()[:400]
    assert _fast(enc, texts, batch=16) == _plain(tok, texts)
    assert enc.stats["cache_clears"] > 0 and enc.stats["long_pieces"] > 0


@pytest.mark.skipif(not (CORPUS / "en").is_dir() or not (CORPUS / "zh").is_dir(), reason="/work/corpus absent")
def test_real_corpus_documents(kind):
    """Every 400th document of every file of the real corpus (English and Chinese)."""
    _, tok = kind
    enc, _ = pretoken_cache.build(tok)
    texts = []
    for f in sorted((CORPUS / "en").glob("*.jsonl")) + sorted((CORPUS / "zh").glob("*.jsonl")):
        with open(f, encoding="utf-8") as fh:
            texts += [json.loads(line)["text"] for i, line in enumerate(fh) if i % 400 == 0]
    assert len(texts) > 1000
    assert _fast(enc, texts, batch=256) == _plain(tok, texts)


def test_tokenizers_it_cannot_reproduce_are_declined_with_the_reason():
    byte_level = json.loads(KINDS["gpt2"]().to_str())

    def variant(**change) -> Tokenizer:
        spec = json.loads(json.dumps(byte_level))
        for path, value in change.items():
            node = spec
            *head, last = path.split("__")
            for k in head:
                node = node[k]
            node[last] = value
        return Tokenizer.from_str(json.dumps(spec))

    other_regex = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"\p{L}+|\s+|."}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    cases = {
        "adds a prefix space": variant(pre_tokenizer__add_prefix_space=True),
        "does not split": variant(pre_tokenizer__use_regex=False),
        "has no compiled scanner": variant(pre_tokenizer=other_regex),
        "not byte-level": variant(pre_tokenizer={"type": "Whitespace"}),
        "dropout": variant(model__dropout=0.1),
    }
    for why, tok in cases.items():
        enc, reason = pretoken_cache.build(tok)
        assert enc is None and why in reason, (why, reason)


def test_tokenize_part_reports_the_fast_path_and_catches_a_difference(tmp_path):
    """The part kernel of the tokenize step with a tokenizer.json: the fast path writes the plain path's
    table, says so in its stats and re-encodes its sample; wrong cached ids stop it naming the document;
    a declined tokenizer runs the plain encoder and says why."""
    tok = KINDS["llama3"]()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    spec = tokenize.spec_of("hf")
    texts = _tricky()[:300]
    df = pd.DataFrame({"uid": np.arange(5000, 5000 + len(texts)), "text": texts})
    plain = tokenize.tokenize_batch(df, str(path), add_bos=True, add_eos=True, batch_docs=32, spec=spec, bos_id=0, eos_id=1)
    fast = tokenize.tokenize_batch(df, str(path), add_bos=True, add_eos=True, batch_docs=32, spec=spec, bos_id=0,
                                   eos_id=1, fast_encode=True, verify_sample=len(texts))
    assert fast.kept.equals(plain.kept)
    assert fast.stats["encoder"] == "piece_cache" and plain.stats["encoder"] == "plain"
    assert fast.stats["verified_docs"] > 0 and fast.stats["fast_cache"]["lookups"] > 0
    enc, _ = tokenize._load(str(path), spec).fast_encoder()
    try:
        enc.p_ids[:enc.n_ids] += 1
        with pytest.raises(tokenize.FastEncodeMismatch, match=r"document uid 5\d\d\d differ from the plain encoder's"):
            tokenize.tokenize_batch(df, str(path), add_bos=False, add_eos=True, batch_docs=32, spec=spec, bos_id=0,
                                    eos_id=1, fast_encode=True, verify_sample=len(texts))
    finally:
        enc._clear()
    declined = tmp_path / "prefix" / "tokenizer.json"
    declined.parent.mkdir()
    spec_json = json.loads(tok.to_str())
    spec_json["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    declined.write_text(json.dumps(spec_json), encoding="utf-8")
    res = tokenize.tokenize_batch(df, str(declined), add_bos=False, add_eos=True, batch_docs=32, spec=spec, bos_id=0,
                                  eos_id=1, fast_encode=True, verify_sample=8)
    assert res.stats["encoder"] == "plain" and "prefix space" in res.stats["fast_declined"]


def _byte_decoder() -> dict:
    """GPT-2's byte-level alphabet back to bytes (the characters a ByteLevel vocabulary is written in)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, n = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def _tiktoken_file(tmp_path: Path) -> Path:
    """A plain .tiktoken file (base64 token, rank) from the Llama-3-style vocabulary trained here: the
    format Llama-3 and GLM-4 ship, read with Llama-3's split pattern by default."""
    import base64

    dec = _byte_decoder()
    vocab = json.loads(KINDS["llama3"]().to_str())["model"]["vocab"]
    ranked = sorted((i, bytes(dec[c] for c in tok)) for tok, i in vocab.items() if tok not in SPECIALS)
    path = tmp_path / "tokenizer.tiktoken"
    path.write_text("".join(f"{base64.b64encode(b).decode()} {r}\n" for r, (_, b) in enumerate(ranked)))
    return path


def _tiktoken_texts() -> list[str]:
    texts = _tricky() + _stdlib_texts()
    for lang in ("en", "zh"):
        for f in sorted((CORPUS / lang).glob("*.jsonl")) if (CORPUS / lang).is_dir() else []:
            with open(f, encoding="utf-8") as fh:
                texts += [json.loads(line)["text"] for i, line in enumerate(fh) if i % 500 == 0]
    return texts


def test_tiktoken_with_llama3s_pattern_equals_plain(tmp_path):
    """A plain .tiktoken file (Llama-3's pattern): the same ids as tiktoken's `encode_to_numpy` (its
    classes asked of tiktoken's regex engine) on tricky text, stdlib sources and, when present, the
    real corpus; a pattern the scanner does not know is declined with the reason."""
    from corpusmill.stages import tokenizer_kinds as kinds

    path = _tiktoken_file(tmp_path)
    tok = kinds.load(str(path), kinds.TokenizerSpec("tiktoken"))
    enc, why = tok.fast_encoder()
    assert enc is not None and enc.pattern == "llama3", why
    texts = _tiktoken_texts()
    assert _fast(enc, texts) == [a.tolist() for a in tok.encode(texts)]
    assert enc.hit_rate() > 0.3
    other = kinds.load(str(path), kinds.TokenizerSpec("tiktoken", pattern=r"\p{L}+|\p{N}+|\s+|."))
    fast, reason = other.fast_encoder()
    assert fast is None and "has no compiled scanner" in reason


def test_mistral_tekken_equals_plain():
    """Mistral's tekken file as mistral-common ships it (its own pattern: upper/lower letter classes,
    single digits, '/' after punctuation): the ids of `encode_to_numpy`, the specials' id offset kept."""
    mistral_common = pytest.importorskip("mistral_common")
    from corpusmill.stages import tokenizer_kinds as kinds

    tekken = Path(mistral_common.__file__).parent / "data" / "tekken_240911.json"
    if not tekken.is_file():
        pytest.skip("no tekken file in mistral-common")
    tok = kinds.load(str(tekken), kinds.TokenizerSpec("tiktoken"))
    enc, why = tok.fast_encoder()
    assert enc is not None and enc.pattern == "tekken" and tok.offset > 0, why
    texts = _tiktoken_texts()
    assert _fast(enc, texts) == [a.tolist() for a in tok.encode(texts)]


def test_cuts_inside_pieces_only_where_the_model_allows_them():
    """Chinese has no spaces, so a regex piece is a whole clause; inside it the cache also cuts between
    characters no token joins (most pieces then repeat). That holds for BPE whose piece is the BPE of
    its parts. With `ignore_merges` (Llama-3: a piece found whole in the vocabulary is one token) a
    cut never leaves alone a part that is a token its merges do not reach (the guard: each such token
    placed between characters nothing joins keeps its piece whole); with a byte alphabet with gaps
    there are no cuts inside pieces. The ids are exact every time."""
    tok = KINDS["qwen2"]()
    rng = random.Random(5)
    texts = [zh_doc(rng) for _ in range(200)] + _tricky()[:300]
    on, _ = pretoken_cache.build(tok)
    assert on.subcut and not on.guard
    assert _fast(on, texts) == _plain(tok, texts)
    spec = json.loads(tok.to_str())
    spec["model"]["ignore_merges"] = True
    strict = Tokenizer.from_str(json.dumps(spec))
    # tokens no merge reaches, as vocabularies converted from other tools hold: whole, each is one
    # token; inside a longer piece its characters are merged as usual
    words = ["国家", "中国", "人民", "社会主义", "发展"]
    enc_bytes = {b: c for c, b in pretoken_cache.byte_decoder().items()}
    vocab = spec["model"]["vocab"]
    for w in words:
        vocab.setdefault("".join(enc_bytes[b] for b in w.encode()), max(vocab.values()) + 1)
    strict = Tokenizer.from_str(json.dumps(spec))
    guarded, _ = pretoken_cache.build(strict)
    assert guarded.subcut and set(words) <= set(guarded.guard)
    planted = [f"{p}{w}{q}" for w in words for p in ("", "。", "！", "的") for q in ("", "。", "了")]
    assert _fast(guarded, texts + planted) == _plain(strict, texts + planted)
    assert [strict.encode(w).ids for w in words] == [[vocab[k]] for k in
                                                      ("".join(enc_bytes[b] for b in w.encode()) for w in words)]
    unguarded = pretoken_cache.HFPieceCache(strict, json.loads(strict.to_str()), "qwen2")
    unguarded.guard_table, unguarded.guard_bits = pretoken_cache._key_table(pretoken_cache._text_keys([]))
    assert _fast(unguarded, planted) != _plain(strict, planted)  # what the guard prevents
    spec["model"]["ignore_merges"] = False
    gap = next(t for t in spec["model"]["vocab"] if len(t) == 1 and t.isalpha())
    del spec["model"]["vocab"][gap]
    spec["model"]["merges"] = [m for m in spec["model"]["merges"]
                               if gap not in (m if isinstance(m, str) else "".join(m))]
    holed = Tokenizer.from_str(json.dumps(spec))
    off, _ = pretoken_cache.build(holed)
    assert not off.subcut


def test_the_cheaper_encoder_is_chosen_per_process_and_the_ids_do_not_change(tmp_path):
    """EncoderChoice: the cache for the first parts, then whichever costs less per character (the plain
    encoder only when a tenth cheaper), every 8th part back to the cache; the cache's first part and
    its check samples are not counted. A part encoded plain has its sample re-encoded by the cache and
    compared, so a wrong cache still stops the run."""
    from corpusmill.stages.piece_cache import EncoderChoice

    choice = EncoderChoice()
    big = EncoderChoice.MIN_CHARS
    picks = []
    for _ in range(16):
        mode = choice.choose()
        picks.append(mode)
        choice.record(mode, big, 3.0 if mode == "fast" else 1.0)  # the cache costs 3x here
        choice.record("plain" if mode == "fast" else "fast", big, 0.1 if mode == "plain" else 1.0, whole_part=False)
    assert picks[:3] == ["fast"] * 3 and picks[3:7] == ["plain"] * 4 and picks[7] == "fast" and picks[8] == "plain"
    cheap = EncoderChoice()
    for _ in range(10):
        mode = cheap.choose()
        cheap.record(mode, big, 1.0 if mode == "fast" else 3.0)
        cheap.record("plain", big, 3.0, whole_part=False)
        assert mode == "fast"

    tok = KINDS["gpt2"]()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    spec = tokenize.spec_of("hf")
    texts = _tricky()[:300]
    df = pd.DataFrame({"uid": np.arange(7000, 7000 + len(texts)), "text": texts})
    plain = tokenize.tokenize_batch(df, str(path), add_bos=False, add_eos=True, batch_docs=64, spec=spec, bos_id=0, eos_id=1)
    enc, _ = tokenize._load(str(path), spec).fast_encoder()
    enc.choice.parts, enc.choice.cost = 10, {"fast": 1.0, "plain": 0.1}  # plain measured cheaper in this process
    chosen = tokenize.tokenize_batch(df, str(path), add_bos=False, add_eos=True, batch_docs=64, spec=spec, bos_id=0,
                                     eos_id=1, fast_encode=True, verify_sample=len(texts))
    assert chosen.kept.equals(plain.kept) and chosen.stats["encoder"] == "plain"
    assert chosen.stats["encoder_parts"] == {"plain": 1} and chosen.stats["verified_docs"] > 0
    enc.p_ids[:enc.n_ids] += 1
    try:
        enc.choice.parts = 10
        with pytest.raises(tokenize.FastEncodeMismatch):
            tokenize.tokenize_batch(df, str(path), add_bos=False, add_eos=True, batch_docs=64, spec=spec, bos_id=0,
                                    eos_id=1, fast_encode=True, verify_sample=len(texts))
    finally:
        enc._clear()


@pytest.mark.parametrize("normalizer, content, text", [
    (normalizers.Lowercase(), "A", "say a word"),  # found as "a" in the lowercased text
    (normalizers.NFKC(), "\ufb01", "the fine print"),  # the ligature is "fi" after NFKC
    (normalizers.NFC(), "e\u0301", "caf\u00e9 au lait"),  # composed by NFC
])
def test_an_added_token_found_by_its_normalized_content_sends_the_document_plain(normalizer, content, text):
    """`tokenizers` matches a `normalized` added token by its normalized content in the normalized text
    (found by an adversarial fuzz of this module): such a document is encoded whole by the plain encoder."""
    tok = _make(_split("qwen2"), normalizer, vocab=600)
    tok.add_tokens([content])
    enc, why = pretoken_cache.build(tok)
    assert enc is not None, why
    texts = [text, "nothing to see", text.upper()]
    assert _fast(enc, texts) == _plain(tok, texts)
    assert enc.stats["plain_docs"] >= 1


def test_truncation_and_padding_in_the_file_never_cut_a_document(tmp_path):
    """A tokenizer.json saved with truncation and padding on: the tokenize step encodes whole documents,
    unpadded, with the plain encoder and the fast one alike; the fast path declines a tokenizer object
    that still truncates (its pieces would be cut)."""
    from corpusmill.stages import tokenizer_kinds as kinds

    tok = KINDS["gpt2"]()
    tok.enable_truncation(max_length=4)
    tok.enable_padding(length=64)
    enc, why = pretoken_cache.build(tok)
    assert enc is None and "truncates or pads" in why
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    loaded = kinds.load(str(path), kinds.TokenizerSpec("hf"))
    texts = _tricky()[:200]
    whole = KINDS["gpt2"]()  # the same vocabulary without the settings
    want = _plain(whole, texts)
    assert [a.tolist() for a in loaded.encode(texts)] == want
    fast, why = loaded.fast_encoder()
    assert fast is not None, why
    assert _fast(fast, texts) == want


def test_tiktoken_cuts_inside_pieces_never_leave_an_unreachable_token_alone(tmp_path):
    """tiktoken takes a piece found whole in its ranks as one token; a rank its merges cannot reach
    (a three-character word whose two-character halves have no rank) placed where the piece would be
    cut around it keeps its piece whole, so the ids stay tiktoken's; without the guard they differ."""
    import base64

    from corpusmill.stages import tokenizer_kinds as kinds

    path = _tiktoken_file(tmp_path)
    lines = path.read_text().splitlines()
    ranks = {base64.b64decode(line.split()[0]) for line in lines}
    words = [w for w in ("中国人", "共和国", "社会主", "发展中", "国家的") if w.encode() not in ranks
             and w[:2].encode() not in ranks and w[1:].encode() not in ranks]
    assert len(words) >= 3
    extra = [f"{base64.b64encode(w.encode()).decode()} {len(lines) + i}" for i, w in enumerate(words)]
    path.write_text("\n".join(lines + extra) + "\n")
    tok = kinds.load(str(path), kinds.TokenizerSpec("tiktoken"))
    enc, why = tok.fast_encoder()
    assert enc is not None and enc.subcut and set(words) <= set(enc.guard), why
    planted = [f"{p}{w}{q}" for w in words for p in ("", "。", "「", " ") for q in ("", "。", "」")]
    texts = planted + _tiktoken_texts()[:800]
    assert _fast(enc, texts) == [a.tolist() for a in tok.encode(texts)]
    assert [a.tolist() for a in tok.encode(words)] == [[len(lines) + i] for i in range(len(words))]
    unguarded = pretoken_cache.TiktokenPieceCache(tok.enc, tok.offset, "llama3")
    unguarded.guard_table, unguarded.guard_bits = pretoken_cache._key_table(pretoken_cache._text_keys([]))
    assert _fast(unguarded, planted) != [a.tolist() for a in tok.encode(planted)]
