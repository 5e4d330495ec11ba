"""An exact fast path for SentencePiece BPE encoding: each text is cut where no BPE merge can cross,
each distinct piece is encoded once by SentencePiece itself, and the cached ids are concatenated.

Why it is exact (sentencepiece 0.2, `bpe_model.cc` and `sentencepiece_processor.cc`):

- Encoding is `BPE(normalize(text))`. The text is normalized here by the model's own processor
  (`SentencePieceProcessor.normalize`: dummy prefix, extra whitespace, whitespace escaping, the
  normalization rule, all by SentencePiece), so nothing of the normalizer is re-implemented.
- BPE starts from one symbol per character (a user-defined symbol, frozen, is one symbol) and only
  ever merges two adjacent symbols whose concatenation is a piece of the vocabulary (NORMAL,
  USER_DEFINED or UNUSED). So a symbol can never span two adjacent characters `a b` unless the
  bigram `ab` occurs inside some such piece. Between characters whose bigram occurs in no piece no
  merge is even proposed, so the merges on either side never interact (their order within a side is
  unchanged: score, then leftmost), and the ids of the text are the ids of the two sides end to end.
  With the whitespace rule of Llama-style models (`split_by_whitespace`) the bigram "x▁" (x not ▁) is
  in no piece, so every whitespace-led word is such a side; the bigram test also finds boundaries
  inside Chinese text (characters that no piece joins), where there are no spaces.
- Byte fallback turns an unknown symbol (one character) into its UTF-8 bytes: local. Without byte
  fallback the processor joins a run of unknown symbols into one <unk>, so a cut is also required
  to have a known character on one side.
- UNUSED pieces are resegmented through a table that the whole text fills (the last pair proposed
  for that piece wins), which is not local: such models are declined, as are unigram models (their
  Viterbi search has no such boundaries) and any model whose proto cannot be read.

Each piece is encoded by a copy of the model whose normalizer does nothing (identity, no dummy
prefix, no whitespace removal): the same vocabulary, scores, user symbols and byte fallback, fed the
already normalized piece. The cache is per process, bounded (`max_pieces` entries, keys of at most
`max_key` characters; a longer piece is encoded every time, uncached, which is still exact), and
cleared whole when full. The tokenize step re-encodes a seeded sample of every part with the plain
encoder (`tokenizer.verify_sample`) and fails on any difference.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Optional

import numba as nb
import numpy as np

MAX_KEY = 48  # characters of the longest cached piece: longer ones are encoded each time, uncached
MAX_PIECES = 1 << 18  # cached pieces per process (about 40 MB); the cache is cleared whole past it
_EMPTY = np.uint64(1 << 63)  # an empty slot of the bigram table (bigram keys are below 2^42)
_NORMAL, _USER_DEFINED, _UNUSED = 1, 4, 5  # ModelProto.SentencePiece.Type values merges can produce


@nb.njit(inline="always")
def _slot(key, shift):
    return (key * np.uint64(0x9E3779B97F4A7C15)) >> shift


@nb.njit(cache=True, nogil=True)
def _fill_table(keys: np.ndarray, bits: int) -> np.ndarray:
    """An open-addressing set of uint64 `keys` (linear probing, 2^bits slots)."""
    table = np.full(1 << bits, np.uint64(1 << 63), dtype=np.uint64)
    mask = np.uint64((1 << bits) - 1)
    shift = np.uint64(64 - bits)
    for k in keys:
        s = _slot(k, shift)
        while table[s] != np.uint64(1 << 63) and table[s] != k:
            s = (s + np.uint64(1)) & mask
        table[s] = k
    return table


@nb.njit(inline="always")
def _hash(cps, a, b):
    h = np.uint64(0xCBF29CE484222325)
    for i in range(a, b):
        h = (h ^ np.uint64(cps[i])) * np.uint64(0x100000001B3)
    return h ^ (h >> np.uint64(29))


@nb.njit(cache=True, nogil=True)
def _identity_points(raw: np.ndarray, raw_starts: np.ndarray, space: int, prefix: bool, suffix: bool) -> tuple:
    """The identity normalizer over code points: a space becomes `space` (U+2581), and a non-empty
    text gets one before it (`prefix`, the dummy prefix) or after it (`suffix`, with
    treat_whitespace_as_suffix)."""
    n_docs = raw_starts.size - 1
    extra = 1 if (prefix or suffix) else 0
    out = np.empty(raw.size + extra * n_docs, dtype=np.uint32)
    starts = np.empty(n_docs + 1, dtype=np.int64)
    o = 0
    for d in range(n_docs):
        starts[d] = o
        a, b = raw_starts[d], raw_starts[d + 1]
        if a == b:
            continue
        if prefix:
            out[o] = space
            o += 1
        for i in range(a, b):
            c = raw[i]
            out[o] = space if c == 32 else c
            o += 1
        if suffix:
            out[o] = space
            o += 1
    starts[n_docs] = o
    return out[:o], starts


@nb.njit(cache=True, nogil=True)
def _rehash(k_hash: np.ndarray, n_pieces: int, size: int) -> np.ndarray:
    slots = np.full(size, -1, dtype=np.int64)
    mask = np.uint64(size - 1)
    for j in range(n_pieces):
        s = k_hash[j] & mask
        while slots[s] >= 0:
            s = (s + np.uint64(1)) & mask
        slots[s] = j
    return slots


@nb.njit(cache=True, nogil=True)
def _bigram_cuts(cps, doc_starts, table, bits, known, byte_fallback):
    """Cut the documents (code points `cps`, starts `doc_starts`) between every two characters whose
    bigram is in no piece (`table`) and, without byte fallback, one of which is a known character.
    Returns (segment starts with the end appended, first segment of each document with the count
    appended)."""
    n_docs = doc_starts.size - 1
    starts = np.empty(cps.size + 1, dtype=np.int64)
    doc_seg = np.empty(n_docs + 1, dtype=np.int64)
    bmask = np.uint64((1 << bits) - 1)
    bshift = np.uint64(64 - bits)
    k = 0
    for d in range(n_docs):
        a, b = doc_starts[d], doc_starts[d + 1]
        doc_seg[d] = k
        if a == b:
            continue
        starts[k] = a
        k += 1
        for i in range(a + 1, b):
            x, y = np.uint64(cps[i - 1]), np.uint64(cps[i])
            key = (x << np.uint64(21)) | y
            s = _slot(key, bshift)
            found = False
            while table[s] != np.uint64(1 << 63):
                if table[s] == key:
                    found = True
                    break
                s = (s + np.uint64(1)) & bmask
            if found:
                continue
            if not byte_fallback and not (known[cps[i - 1]] or known[cps[i]]):
                continue
            starts[k] = i
            k += 1
    doc_seg[n_docs] = k
    starts[k] = cps.size
    return starts[: k + 1], doc_seg


@nb.njit(cache=True, nogil=True)
def look_up(cps, starts, max_key, slots, k_hash, k_start, k_len, keys, n_pieces, n_keys):
    """Look every segment (`starts`, the end appended) of at most `max_key` code points up in the
    piece cache, adding the new ones (their ids are filled in by the caller). Returns (piece index of
    each segment or -1 for a longer one, the first segment of each new piece, hits, and the cache
    arrays and counts, grown when needed)."""
    k = starts.size - 1
    idx = np.empty(k, dtype=np.int64)
    new_seg = np.empty(k, dtype=np.int64)
    n_new = 0
    hits = 0
    mask = np.uint64(slots.size - 1)
    for g in range(k):
        a, b = starts[g], starts[g + 1]
        if b - a > max_key:
            idx[g] = -1
            continue
        h = _hash(cps, a, b)
        s = h & mask
        j = -1
        while True:
            c = slots[s]
            if c < 0:
                break
            if k_hash[c] == h and k_len[c] == b - a:
                st = k_start[c]
                same = True
                for t in range(b - a):
                    if keys[st + t] != cps[a + t]:
                        same = False
                        break
                if same:
                    j = c
                    break
            s = (s + np.uint64(1)) & mask
        if j < 0:
            if 2 * (n_pieces + 1) > slots.size:  # keep the table at most half full
                k_hash2 = np.empty(2 * k_hash.size, dtype=np.uint64)
                k_hash2[:n_pieces] = k_hash[:n_pieces]
                k_start2 = np.empty(2 * k_start.size, dtype=np.int64)
                k_start2[:n_pieces] = k_start[:n_pieces]
                k_len2 = np.empty(2 * k_len.size, dtype=np.int32)
                k_len2[:n_pieces] = k_len[:n_pieces]
                k_hash, k_start, k_len = k_hash2, k_start2, k_len2
                slots = _rehash(k_hash, n_pieces, 2 * slots.size)
                mask = np.uint64(slots.size - 1)
                s = h & mask
                while slots[s] >= 0:
                    s = (s + np.uint64(1)) & mask
            if n_keys + (b - a) > keys.size:
                keys2 = np.empty(2 * keys.size + (b - a), dtype=np.uint32)
                keys2[:n_keys] = keys[:n_keys]
                keys = keys2
            j = n_pieces
            slots[s] = j
            k_hash[j] = h
            k_start[j] = n_keys
            k_len[j] = b - a
            keys[n_keys:n_keys + (b - a)] = cps[a:b]
            n_keys += b - a
            n_pieces += 1
            new_seg[n_new] = g
            n_new += 1
        else:
            hits += 1
        idx[g] = j
    return idx, new_seg[:n_new], hits, slots, k_hash, k_start, k_len, keys, n_pieces, n_keys


@nb.njit(cache=True, nogil=True)
def _gather(idx: np.ndarray, doc_seg: np.ndarray, p_start: np.ndarray, p_len: np.ndarray, p_ids: np.ndarray,
            bos: int, eos: int) -> tuple:
    """(lengths, ids end to end) of each document: its segments' cached ids, with `bos`/`eos` when >= 0."""
    n_docs = doc_seg.size - 1
    total = 0
    for s in range(idx.size):
        total += p_len[idx[s]]
    extra = (1 if bos >= 0 else 0) + (1 if eos >= 0 else 0)
    out = np.empty(total + extra * n_docs, dtype=np.int32)
    lengths = np.empty(n_docs, dtype=np.int32)
    o = 0
    for d in range(n_docs):
        first = o
        if bos >= 0:
            out[o] = bos
            o += 1
        for s in range(doc_seg[d], doc_seg[d + 1]):
            j = idx[s]
            st = p_start[j]
            for t in range(p_len[j]):
                out[o] = p_ids[st + t]
                o += 1
        if eos >= 0:
            out[o] = eos
            o += 1
        lengths[d] = o - first
    return lengths, out


@dataclass
class Settings:
    """The model settings the fast path was judged on (reported in the step's stats)."""

    model_type: str
    normalizer: str
    add_dummy_prefix: bool
    remove_extra_whitespaces: bool
    split_by_whitespace: bool
    treat_whitespace_as_suffix: bool
    split_digits: bool
    byte_fallback: bool
    user_symbols: int
    unused_pieces: int


def model_settings(proto) -> Settings:  # noqa: ANN001 - a sentencepiece_model_pb2.ModelProto
    """What the proto says about the normalizer and the trainer."""
    t, n = proto.trainer_spec, proto.normalizer_spec
    types = [p.type for p in proto.pieces]
    model_type = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}.get(t.model_type, str(t.model_type))
    return Settings(model_type, n.name or ("identity" if not n.precompiled_charsmap else "custom"), n.add_dummy_prefix,
                    n.remove_extra_whitespaces, t.split_by_whitespace, t.treat_whitespace_as_suffix, t.split_digits,
                    t.byte_fallback, types.count(_USER_DEFINED), types.count(_UNUSED))


class EncoderChoice:
    """Which encoder costs less CPU per character in this process, the piece cache or the plain one.
    The cache's cost is measured on whole parts it encoded (after the first, which pays for loading
    the compiled loops and filling an empty cache), the plain encoder's on whole parts and on the
    check sample of the cache's parts (`tokenize.verify_fast`). Both give the same ids, so the choice
    only moves time: a cache that rarely hits (Chinese clauses a tokenizer keeps whole, under a
    tokenizer as fast as tiktoken) gives way to the plain encoder instead of slowing the step. The
    plain encoder must cost a tenth less to be taken, and every EXPLORE-th part still goes to the
    cache, so a corpus whose text changes (English parts after Chinese ones) can win it back."""

    WARMUP = 3  # parts always encoded by the cache first
    EXPLORE = 8
    MIN_CHARS = 1 << 14  # a measurement over fewer characters is noise

    def __init__(self) -> None:
        self.cost: dict[str, float] = {}
        self.parts = 0
        self.fast_parts = 0

    def choose(self) -> str:
        self.parts += 1
        fast, plain = self.cost.get("fast"), self.cost.get("plain")
        if self.parts <= self.WARMUP or self.parts % self.EXPLORE == 0 or fast is None or plain is None:
            return "fast"
        return "plain" if plain < 0.9 * fast else "fast"

    def record(self, mode: str, chars: int, seconds: float, whole_part: bool = True) -> None:
        """A measurement of `mode` over `chars` characters; the cache's only over whole parts it
        encoded (a check sample meets a cache that the plain parts did not warm), not its first."""
        if mode == "fast":
            if not whole_part:
                return
            self.fast_parts += 1
            if self.fast_parts == 1:
                return
        if chars < self.MIN_CHARS or seconds <= 0:
            return
        rate = seconds / chars
        old = self.cost.get(mode)
        self.cost[mode] = rate if old is None else 0.5 * (old + rate)


class CachedEncoder:
    """A bounded per-process cache of piece -> ids over compiled cutting: a subclass cuts texts into
    pieces no merge crosses (`_segments`) and encodes a new piece with its tokenizer (`_encode_pieces`);
    texts a subclass cannot cut go to the plain encoder (`_plain`) in the same batch (`_encode_flat`)."""

    def __init__(self, max_key: int, max_pieces: int) -> None:
        self.max_key, self.max_pieces = max_key, max_pieces
        self.stats = {"lookups": 0, "hits": 0, "pieces_encoded": 0, "long_pieces": 0, "cache_clears": 0,
                      "plain_docs": 0}
        self.choice = EncoderChoice()
        self._clear()

    def _segments(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(code points of the texts as the tokenizer sees them, segment starts with the end appended,
        first segment of each text with the count appended)."""
        raise NotImplementedError

    def _encode_pieces(self, pieces: list[str]) -> list:
        """The ids (a list each) of pieces, by the tokenizer itself."""
        raise NotImplementedError

    def _plain(self, texts: list[str]) -> list:
        """The ids (a list each) of whole texts by the plain encoder (texts the cutting does not cover)."""
        raise NotImplementedError

    def _clear(self) -> None:
        """An empty cache (also when it passed `max_pieces`: cleared whole, the simplest bound)."""
        self.slots = np.full(1 << 12, -1, dtype=np.int64)
        self.k_hash = np.zeros(1 << 11, dtype=np.uint64)
        self.k_start = np.zeros(1 << 11, dtype=np.int64)
        self.k_len = np.zeros(1 << 11, dtype=np.int32)
        self.keys = np.zeros(1 << 14, dtype=np.uint32)
        self.n_keys = 0
        self.n_pieces = 0
        self.p_start = np.zeros(1 << 11, dtype=np.int64)
        self.p_len = np.zeros(1 << 11, dtype=np.int32)
        self.p_ids = np.zeros(1 << 14, dtype=np.int32)
        self.n_ids = 0

    def _store(self, first: int, encoded: list) -> None:
        """The ids of pieces `first`, `first + 1`, ... (one list each) into the id arrays."""
        lens = np.fromiter(map(len, encoded), dtype=np.int32, count=len(encoded))
        flat = np.fromiter(chain.from_iterable(encoded), dtype=np.int32, count=int(lens.sum()))
        end = first + len(encoded)
        if end > self.p_start.size:
            size = max(end, 2 * self.p_start.size)
            self.p_start, self.p_len = np.resize(self.p_start, size), np.resize(self.p_len, size)
        if self.n_ids + flat.size > self.p_ids.size:
            self.p_ids = np.resize(self.p_ids, max(self.n_ids + flat.size, 2 * self.p_ids.size))
        self.p_len[first:end] = lens
        self.p_start[first:end] = self.n_ids + np.cumsum(lens) - lens
        self.p_ids[self.n_ids:self.n_ids + flat.size] = flat
        self.n_ids += flat.size

    def encode_flat(self, texts: list[str], bos_id: int = -1, eos_id: int = -1) -> tuple[np.ndarray, np.ndarray]:
        """(lengths int32, ids int32 end to end) of `texts`, identical to the plain encoder's, with
        `bos_id` / `eos_id` around each text when >= 0."""
        return self._encode_flat(texts, texts, [], bos_id, eos_id)

    def _encode_flat(self, texts: list[str], raw: list[str], bypass: list[int], bos_id: int,
                     eos_id: int) -> tuple[np.ndarray, np.ndarray]:
        """`encode_flat` of `texts` as the cutting sees them (normalized), the texts `bypass` names
        encoded from `raw` by the plain encoder."""
        if not texts:
            return np.empty(0, dtype=np.int32), np.empty(0, dtype=np.int32)
        if bypass:
            return self._mixed(texts, raw, bypass, bos_id, eos_id)
        if self.n_pieces > self.max_pieces:
            self._clear()
            self.stats["cache_clears"] += 1
        cps, starts, doc_seg = self._segments(texts)
        first = self.n_pieces
        (idx, new_seg, hits, self.slots, self.k_hash, self.k_start, self.k_len, self.keys,
         self.n_pieces, self.n_keys) = look_up(cps, starts, self.max_key, self.slots, self.k_hash, self.k_start,
                                               self.k_len, self.keys, self.n_pieces, self.n_keys)
        self.stats["lookups"] += idx.size
        self.stats["hits"] += hits
        text = _Text(cps, starts)
        if new_seg.size:
            self._store(first, self._encode_pieces(list(map(text.piece, new_seg.tolist()))))
            self.stats["pieces_encoded"] += int(new_seg.size)
        long = np.flatnonzero(idx < 0)
        kept_ids = self.n_ids
        if long.size:  # uncached: their ids go after the cached ones for this batch only
            idx[long] = np.arange(self.n_pieces, self.n_pieces + long.size)
            self._store(self.n_pieces, self._encode_pieces(list(map(text.piece, long.tolist()))))
            self.stats["long_pieces"] += int(long.size)
        lengths, values = _gather(idx, doc_seg, self.p_start, self.p_len, self.p_ids, bos_id, eos_id)
        self.n_ids = kept_ids
        return lengths, values

    def _mixed(self, texts: list[str], raw: list[str], bypass: list[int], bos_id: int,
               eos_id: int) -> tuple[np.ndarray, np.ndarray]:
        """`_encode_flat` of a batch some of whose texts go to the plain encoder, in the batch's order."""
        plain_set = set(bypass)
        cached = [i for i in range(len(texts)) if i not in plain_set]
        self.stats["plain_docs"] += len(bypass)
        per_doc: list = [None] * len(texts)
        if cached:
            lengths, values = self._encode_flat([texts[i] for i in cached], [], [], bos_id, eos_id)
            for i, part in zip(cached, np.split(values, np.cumsum(lengths)[:-1])):
                per_doc[i] = part
        extra = [bos_id] if bos_id >= 0 else []
        tail = [eos_id] if eos_id >= 0 else []
        for i, ids in zip(bypass, self._plain([raw[i] for i in bypass])):
            per_doc[i] = np.asarray(extra + list(ids) + tail, dtype=np.int32)
        lengths = np.fromiter(map(len, per_doc), dtype=np.int32, count=len(per_doc))
        return lengths, np.concatenate(per_doc).astype(np.int32, copy=False)

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """Ids of each text (int32), no BOS/EOS."""
        lengths, values = self.encode_flat(texts)
        return np.split(values, np.cumsum(lengths)[:-1]) if len(texts) else []

    def hit_rate(self) -> float:
        """Share of piece look-ups the cache answered."""
        return self.stats["hits"] / max(1, self.stats["lookups"])


def text_points(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The texts as one uint32 code point array, and each text's start (the end appended)."""
    starts = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)), out=starts[1:])
    return np.frombuffer("".join(texts).encode("utf-32-le"), dtype=np.uint32), starts


class PieceCache(CachedEncoder):
    """The fast encoder of one SentencePiece BPE model (build it with `build`, which may decline)."""

    def __init__(self, sp, proto, max_key: int = MAX_KEY, max_pieces: int = MAX_PIECES) -> None:  # noqa: ANN001
        import sentencepiece as spm

        self.sp = sp
        self.settings = model_settings(proto)
        oracle = type(proto)()
        oracle.CopyFrom(proto)
        norm = oracle.normalizer_spec
        norm.name = "identity"
        norm.precompiled_charsmap = b""
        norm.normalization_rule_tsv = ""
        norm.add_dummy_prefix = False
        norm.remove_extra_whitespaces = False
        self.oracle = spm.SentencePieceProcessor(model_proto=oracle.SerializeToString())
        bigrams, known = set(), np.zeros(0x110000, dtype=np.bool_)
        for p in proto.pieces:
            if p.type not in (_NORMAL, _USER_DEFINED, _UNUSED):
                continue
            s = p.piece
            if len(s) == 1:
                known[ord(s)] = True
            for a, b in zip(s, s[1:]):
                bigrams.add((ord(a) << 21) | ord(b))
        keys = np.fromiter(bigrams, dtype=np.uint64, count=len(bigrams))
        self.bits = max(4, int(np.ceil(np.log2(max(1, 2 * len(keys))))) + 1)
        self.table = _fill_table(keys, self.bits)
        self.known = known
        self.bigrams = len(keys)
        st = self.settings
        # the identity normalizer without whitespace removal is a space -> U+2581 map and the dummy
        # prefix: done here over code points; any other normalizer is SentencePiece's own normalize()
        self.plain_normalizer = (st.normalizer == "identity" and not proto.normalizer_spec.precompiled_charsmap
                                 and not proto.normalizer_spec.normalization_rule_tsv
                                 and not st.remove_extra_whitespaces and proto.normalizer_spec.escape_whitespaces)
        super().__init__(max_key, max_pieces)

    def _points(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The normalized texts as one uint32 code point array, and each text's start (end appended)."""
        if self.plain_normalizer:
            raw, raw_starts = text_points(texts)
            dummy = self.settings.add_dummy_prefix
            suffix = self.settings.treat_whitespace_as_suffix
            return _identity_points(raw, raw_starts, 0x2581, dummy and not suffix, dummy and suffix)
        return text_points(self.sp.normalize(texts))

    def _segments(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        cps, doc_starts = self._points(texts)
        starts, doc_seg = _bigram_cuts(cps, doc_starts, self.table, self.bits, self.known, self.settings.byte_fallback)
        return cps, starts, doc_seg

    def _encode_pieces(self, pieces: list[str]) -> list:
        return self.oracle.encode(pieces, num_threads=1)


class _Text:
    """Pieces of the normalized code points as strings (only new and long pieces are ever made)."""

    def __init__(self, cps: np.ndarray, starts: np.ndarray) -> None:
        self.cps, self.starts = cps, starts

    def piece(self, g: int) -> str:
        return self.cps[self.starts[g]:self.starts[g + 1]].tobytes().decode("utf-32-le")


def build(sp, path: str, max_key: int = MAX_KEY, max_pieces: int = MAX_PIECES) -> tuple[Optional[PieceCache], str]:  # noqa: ANN001
    """(the fast encoder, "") for a model the fast path reproduces exactly, else (None, why not)."""
    from sentencepiece import sentencepiece_model_pb2 as model_pb2

    proto = model_pb2.ModelProto()
    try:
        with open(path, "rb") as f:
            proto.ParseFromString(f.read())
    except Exception as e:  # noqa: BLE001 - protobuf raises DecodeError, OSError
        return None, f"the model proto cannot be read ({str(e)[:100]})"
    s = model_settings(proto)
    if s.model_type != "bpe":
        return None, (f"a {s.model_type} model: only BPE merges have provable cut points (a unigram model's "
                      "Viterbi search spans the whole text)")
    if s.unused_pieces:
        return None, (f"the model has {s.unused_pieces} UNUSED pieces, whose resegmentation depends on the whole "
                      "text")
    if not hasattr(sp, "normalize"):
        return None, "this sentencepiece has no normalize() (0.2 or later is needed)"
    return PieceCache(sp, proto, max_key, max_pieces), ""
