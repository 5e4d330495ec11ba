"""A Llama-style decoder in MindSpore: RMSNorm, rotary embeddings, SwiGLU, causal attention.

Parameters are always fp32 (the master copy the optimizer updates); matrix products run in the
compute dtype (fp16 or bf16 for mixed precision), while norms, the attention softmax and the loss
are computed in fp32 whatever the compute dtype. Kept in an importable module because MindSpore
compiles graphs from source it can import.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common.initializer import Normal, initializer


@dataclass
class ModelShape:
    vocab_size: int
    seq_length: int
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 0

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if (self.hidden_size // self.num_heads) % 2:
            raise ValueError("head dimension must be even for rotary embeddings")
        if not self.intermediate_size:
            self.intermediate_size = int(math.ceil(self.hidden_size * 8 / 3 / 32) * 32)


class Linear(nn.Cell):
    """y = x W^T with W kept in fp32 and the product computed in `compute_dtype` (W is cast per use,
    so its gradient arrives in fp32). Same parameter name and shape as nn.Dense without bias."""

    def __init__(self, in_dim: int, out_dim: int, weight_init, compute_dtype=ms.float32):
        super().__init__()
        self.weight = Parameter(initializer(weight_init, (out_dim, in_dim), ms.float32), name="weight")
        self.compute_dtype = compute_dtype
        self.out_dim = out_dim
        self.matmul = ops.MatMul(transpose_b=True)

    def construct(self, x):
        lead = x.shape[:-1]
        flat = ops.reshape(x.astype(self.compute_dtype), (-1, x.shape[-1]))
        y = self.matmul(flat, self.weight.astype(self.compute_dtype))
        return ops.reshape(y, lead + (self.out_dim,))


class RMSNorm(nn.Cell):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = Parameter(initializer("ones", (dim,), ms.float32), name="weight")
        self.eps = eps

    def construct(self, x):
        x32 = x.astype(ms.float32)
        normed = x32 * ops.rsqrt(ops.mean(x32 * x32, -1, keep_dims=True) + self.eps)
        return (normed * self.weight).astype(x.dtype)


def rotary_tables(seq_length: int, head_dim: int, base: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    inv = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    angles = np.outer(np.arange(seq_length, dtype=np.float64), inv)
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


class Attention(nn.Cell):
    def __init__(self, shape: ModelShape, compute_dtype=ms.float32):
        super().__init__()
        h = shape.hidden_size
        self.heads = shape.num_heads
        self.head_dim = h // shape.num_heads
        init = Normal(0.02)
        self.wq = Linear(h, h, init, compute_dtype)
        self.wk = Linear(h, h, init, compute_dtype)
        self.wv = Linear(h, h, init, compute_dtype)
        self.wo = Linear(h, h, Normal(0.02 / math.sqrt(2 * shape.num_layers)), compute_dtype)
        cos, sin = rotary_tables(shape.seq_length, self.head_dim)
        self.cos = Tensor(cos)
        self.sin = Tensor(sin)
        mask = np.triu(np.full((shape.seq_length, shape.seq_length), -1e9, dtype=np.float32), k=1)
        self.mask = Tensor(mask)
        self.scale = 1.0 / math.sqrt(self.head_dim)

    def _split(self, x, b, s):
        return ops.transpose(ops.reshape(x, (b, s, self.heads, self.head_dim)), (0, 2, 1, 3))

    def _rotate(self, x, s):
        half = self.head_dim // 2
        x1 = x[..., :half]
        x2 = x[..., half:]
        rotated = ops.concat((-x2, x1), -1)
        return x * self.cos[:s].astype(x.dtype) + rotated * self.sin[:s].astype(x.dtype)

    def construct(self, x, doc_mask=None):
        b, s, h = x.shape
        q = self._rotate(self._split(self.wq(x), b, s), s)
        k = self._rotate(self._split(self.wk(x), b, s), s)
        v = self._split(self.wv(x), b, s)
        scores = ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))).astype(ms.float32) * self.scale
        scores = scores + self.mask[:s, :s]
        if doc_mask is not None:  # (b, 1, s, s): packed documents do not see each other
            scores = scores + doc_mask
        probs = ops.softmax(scores, -1).astype(v.dtype)
        out = ops.transpose(ops.matmul(probs, v), (0, 2, 1, 3))
        return self.wo(ops.reshape(out, (b, s, h)))


class SwiGLU(nn.Cell):
    def __init__(self, shape: ModelShape, compute_dtype=ms.float32):
        super().__init__()
        h, i = shape.hidden_size, shape.intermediate_size
        self.w1 = Linear(h, i, Normal(0.02), compute_dtype)
        self.w3 = Linear(h, i, Normal(0.02), compute_dtype)
        self.w2 = Linear(i, h, Normal(0.02 / math.sqrt(2 * shape.num_layers)), compute_dtype)

    def construct(self, x):
        return self.w2(ops.silu(self.w1(x)) * self.w3(x))


class Block(nn.Cell):
    def __init__(self, shape: ModelShape, compute_dtype=ms.float32):
        super().__init__()
        self.attn_norm = RMSNorm(shape.hidden_size)
        self.attn = Attention(shape, compute_dtype)
        self.mlp_norm = RMSNorm(shape.hidden_size)
        self.mlp = SwiGLU(shape, compute_dtype)

    def construct(self, x, doc_mask=None):
        x = x + self.attn(self.attn_norm(x), doc_mask)
        return x + self.mlp(self.mlp_norm(x))


def document_mask(actual_seq_len, s: int):
    """An additive (b, 1, s, s) mask that keeps attention inside each packed document: position i
    belongs to document k when k of the sample's cumulative document ends (mindformers'
    actual_seq_len, padded with s) are at or before it. Rotary embeddings are relative, so a
    document's attention is then the same wherever in the window it starts."""
    pos = ops.arange(s).astype(ms.int32)
    doc = (ops.expand_dims(actual_seq_len.astype(ms.int32), 1) <= ops.reshape(pos, (1, s, 1))).astype(ms.int32).sum(-1)
    same = ops.expand_dims(doc, 2) == ops.expand_dims(doc, 1)
    return ops.expand_dims((1.0 - same.astype(ms.float32)) * -1e9, 1)


class DecoderLM(nn.Cell):
    """Returns the mean next-token cross-entropy of a batch of `seq_length + 1` id windows; with
    `actual_seq_len` (the shards' compressed EOD metadata), attention stays within each document."""

    def __init__(self, shape: ModelShape, ignore_id: int = -1, compute_dtype=ms.float32):
        super().__init__()
        self.shape = shape
        self.compute_dtype = compute_dtype
        self.embed = nn.Embedding(shape.vocab_size, shape.hidden_size, embedding_table=Normal(0.02))
        self.blocks = nn.CellList([Block(shape, compute_dtype) for _ in range(shape.num_layers)])
        self.norm = RMSNorm(shape.hidden_size)
        self.head = Linear(shape.hidden_size, shape.vocab_size, Normal(0.02), compute_dtype)
        self.ignore_id = ignore_id

    def logits(self, input_ids, actual_seq_len=None):
        """Next-token logits (b, seq_length, vocab) of the first seq_length ids of each window."""
        tokens = input_ids[:, :-1]
        doc_mask = None if actual_seq_len is None else document_mask(actual_seq_len, tokens.shape[1])
        x = self.embed(tokens).astype(self.compute_dtype)  # the residual stream runs in the compute dtype
        for block in self.blocks:
            x = block(x, doc_mask)
        return self.head(self.norm(x)).astype(ms.float32)

    def construct(self, input_ids, actual_seq_len=None):
        labels = input_ids[:, 1:]
        logits = self.logits(input_ids, actual_seq_len)
        b, s, v = logits.shape
        flat_labels = ops.reshape(labels, (-1,))
        losses = ops.cross_entropy(ops.reshape(logits, (b * s, v)), flat_labels.astype(ms.int32), reduction="none")
        weights = (flat_labels != self.ignore_id).astype(ms.float32)
        return (losses * weights).sum() / ops.maximum(weights.sum(), 1.0)
