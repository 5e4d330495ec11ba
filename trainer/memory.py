"""How much memory a training step needs, from the real shapes, and the batch size that fits.

The kernel kills a training process that outgrows the machine without a word, so `train` checks
before the first step and `doctor` prints the same estimate. The terms (bytes):

- logits: batch x seq x vocab in fp32. MindSpore's PyNative autograd keeps several buffers of this
  size alive at the peak: the head's output, its fp32 cast, the flattened view, log-softmax, the
  loss's gradient back through each of them. LOGIT_COPIES is measured on this trainer.
- activations per layer: what the backward pass keeps of each block (norm inputs, q/k/v and their
  rotations, attention scores and probabilities of batch x heads x seq x seq, the SwiGLU products).
  With recompute, only each block's input is kept, and one block's activations at a time.
- parameters (fp32 master copy), their gradients and the copies the step makes of them (cast,
  accumulation, clipping), AdamW's two fp32 moments, and fp16 casts of the weights when fp16.
- the runtime itself (Python, MindSpore, the dataset pipeline).

A compiled step (`train.compile`, mindspore.jit) runs several times faster but its graph keeps more
alive at the peak: more logits-sized buffers, and about 13.5 score-sized buffers in every layer at
once instead of one layer's transients, so long sequences cost far more; its factors are separate.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from corpusmill.stages.base import ConfigError

GiB = 2 ** 30
# Fitted to the peak RSS of `train` on MindSpore 2.10 CPU (PyNative), model 2 x 64 unless said, seq
# 2048, and rounded up (measured GiB, estimate in brackets): batch 1 vocab 4,000: 1.77 (1.89); batch 4
# vocab 4,000: 5.48 (5.69); batch 8 vocab 4,000: 10.53 (10.77); batch 1 vocab 55,296: 7.91 (8.32); batch 2
# vocab 55,296: 14.49 (15.85); 8 layers batch 2 vocab 4,000: 3.86 (4.48), with recompute 3.00 (3.14).
# tests/test_train_memory.py checks a real run stays below the estimate and above half of it.
# Compiled step (mindspore.jit), fitted the same way (measured GiB, estimate in brackets): seq 2048 batch 1
# vocab 55,296: 10.72 (11.8); batch 4 vocab 4,000: 9.37 (10.2); batch 1 vocab 4,000: 2.83 (3.2); 8 layers
# batch 2 vocab 4,000: 15.30 (15.6); seq 128 batch 16 vocab 60,000: 10.28 (10.9).
COMPILED_LOGIT_COPIES = 22
COMPILED_SCORE_KEPT = 13.5  # per layer, all layers at once
COMPILED_RUNTIME_BYTES = int(0.8 * GiB)  # the compiled graph and its compiler on top of RUNTIME_BYTES' parts
LOGIT_COPIES = 16          # fp32 buffers of batch x seq x vocab alive at the peak (forward + gradient)
SCORE_KEPT = 1.5           # fp32 batch x heads x seq x seq buffers each layer keeps for the backward pass
SCORE_TRANSIENT = 9        # ... alive at once while one layer's attention is differentiated
RECOMPUTE_EXTRA = 1.5      # ... more when that layer's forward is run again first (recompute)
HIDDEN_COPIES = 20         # buffers of batch x seq x hidden per layer (norms, q/k/v, rotations, residuals)
INTERMEDIATE_COPIES = 4    # buffers of batch x seq x intermediate per layer (w1, silu, w3, product)
GRADIENT_COPIES = 4        # fp32 copies of the parameters in the step: gradients, cast, sum, clipped
RUNTIME_BYTES = int(0.6 * GiB)  # Python, MindSpore, the dataset pipeline, the kernels' workspace
FIT_SHARE = 0.85           # of the available memory a run may plan to use (page cache, other processes)
DEFAULT_SAMPLES_PER_STEP = 8


class TrainMemoryError(ConfigError):
    """The training settings need more memory than the machine has available."""


@dataclass
class MemoryEstimate:
    parts: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def describe(self) -> str:
        """One line: the total and each term in GiB, largest first."""
        terms = ", ".join(f"{name} {value / GiB:.2f}" for name, value in
                          sorted(self.parts.items(), key=lambda kv: -kv[1]))
        return f"about {self.total / GiB:.1f} GiB ({terms} GiB)"


def parameter_count(vocab_size: int, hidden_size: int, num_layers: int, intermediate_size: int) -> int:
    """Embedding and head (untied), per block 4 h^2 attention + 3 h i SwiGLU + 2 norms, the final norm."""
    per_block = 4 * hidden_size * hidden_size + 3 * hidden_size * intermediate_size + 2 * hidden_size
    return 2 * vocab_size * hidden_size + num_layers * per_block + hidden_size


def intermediate_of(hidden_size: int, intermediate_size: Optional[int]) -> int:
    return intermediate_size or int(math.ceil(hidden_size * 8 / 3 / 32) * 32)


def estimate(*, vocab_size: int, seq_length: int, hidden_size: int, num_layers: int, num_heads: int,
             intermediate_size: Optional[int], batch_size: int, grad_accumulation: int = 1,
             precision: str = "fp32", recompute: bool = False, compiled: bool = False) -> MemoryEstimate:
    """Peak memory of one training process for these shapes (seq_length: tokens the model sees);
    `compiled`: the step runs as one graph (see `compiles`)."""
    inter = intermediate_of(hidden_size, intermediate_size)
    b, s = batch_size, seq_length
    act_bytes = 2 if precision in ("fp16", "bf16") else 4
    score = b * num_heads * s * s * 4
    per_layer = b * s * (HIDDEN_COPIES * hidden_size + INTERMEDIATE_COPIES * inter) * act_bytes + SCORE_KEPT * score
    if compiled:
        per_layer += (COMPILED_SCORE_KEPT - SCORE_KEPT) * score
        activations = num_layers * per_layer
    elif recompute:  # each block's input is kept; one block's activations exist at a time, rebuilt in backward
        activations = num_layers * b * s * hidden_size * act_bytes + per_layer + (SCORE_TRANSIENT + RECOMPUTE_EXTRA) * score
    else:
        activations = num_layers * per_layer + SCORE_TRANSIENT * score
    activations = int(activations)
    params = parameter_count(vocab_size, hidden_size, num_layers, inter)
    parts = {
        "logits and their gradient": (COMPILED_LOGIT_COPIES if compiled else LOGIT_COPIES) * b * s * vocab_size * 4,
        f"activations ({num_layers} layers{', recomputed' if recompute else ''})": activations,
        "parameters": 4 * params,
        "gradients": GRADIENT_COPIES * 4 * params + (4 * params if grad_accumulation > 1 else 0),
        "optimizer moments": 8 * params,
        "runtime": COMPILED_RUNTIME_BYTES if compiled else RUNTIME_BYTES,
    }
    if precision in ("fp16", "bf16"):
        parts["half-precision weight copies"] = 2 * params
    return MemoryEstimate(parts)


def available_memory() -> Optional[int]:
    """MemAvailable from /proc/meminfo (what can be allocated without swapping), None when unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def compiles(tcfg: Any) -> bool:
    """Whether the step runs as one compiled graph: `train.compile`, except with recompute, which runs
    op by op (a compiled graph kept every layer's activations anyway: 17.2 GiB against 15.3 without
    recompute, 8 layers at seq 2048, where op by op with recompute needed 3.0)."""
    return bool(tcfg.compile) and not tcfg.recompute


def estimate_args(tcfg: Any, seq_length: int, vocab_size: int, recompute: Optional[bool] = None) -> dict[str, Any]:
    """The estimate's arguments for `tcfg` (with `recompute` overriding the config's)."""
    m = tcfg.model
    recompute = tcfg.recompute if recompute is None else recompute
    return {"vocab_size": vocab_size, "seq_length": seq_length, "hidden_size": m.hidden_size,
            "num_layers": m.num_layers, "num_heads": m.num_heads, "intermediate_size": m.intermediate_size,
            "precision": tcfg.precision, "recompute": recompute,
            "compiled": compiles(tcfg.model_copy(update={"recompute": recompute}))}


def largest_fitting_batch(tcfg: Any, seq_length: int, vocab_size: int, budget: int, recompute: bool,
                          upper: int = DEFAULT_SAMPLES_PER_STEP) -> int:
    """The largest power of two up to `upper` whose estimate fits `budget` bytes; 0 when not even 1."""
    b = 1 << int(math.log2(max(1, upper)))
    while b >= 1:
        if estimate(**estimate_args(tcfg, seq_length, vocab_size, recompute), batch_size=b,
                    grad_accumulation=2).total <= budget:
            return b
        b //= 2
    return 0


def plan(tcfg: Any, seq_length: int, vocab_size: int, log: Callable[[str], None] = print,
         available: Optional[int] = None) -> Any:
    """The train config to run with: a batch size chosen when none was given (8 samples per optimizer
    step as micro-batches of the largest power of two that fits, the rest by gradient accumulation),
    and refused before any step when the settings cannot fit the available memory. `seq_length` is
    the model's (the shards' sample length minus one)."""
    available = available_memory() if available is None else available
    budget = int(available * FIT_SHARE) if available is not None else None
    if tcfg.batch_size is None:
        batch = DEFAULT_SAMPLES_PER_STEP
        if budget is not None:
            batch = largest_fitting_batch(tcfg, seq_length, vocab_size, budget, tcfg.recompute) or 1
        accumulate = tcfg.grad_accumulation * max(1, DEFAULT_SAMPLES_PER_STEP // batch)
        if batch < DEFAULT_SAMPLES_PER_STEP:
            log(f"train: batch size {batch} x {accumulate} accumulated micro-batches chosen to fit "
                f"{available / GiB:.1f} GiB available (set train.batch_size / --batch-size to choose)")
        tcfg = tcfg.model_copy(update={"batch_size": batch, "grad_accumulation": accumulate})
    est = estimate(**estimate_args(tcfg, seq_length, vocab_size), batch_size=tcfg.batch_size,
                   grad_accumulation=tcfg.grad_accumulation)
    where = f" of {available / GiB:.1f} GiB available" if available is not None else ""
    log(f"train: memory estimate {est.describe()}{where}")
    if budget is not None and est.total > budget:
        raise TrainMemoryError(f"training needs {est.describe()} but {available / GiB:.1f} GiB is available: "
                               + advice(tcfg, seq_length, vocab_size, budget))
    return tcfg


def advice(tcfg: Any, seq_length: int, vocab_size: int, budget: int) -> str:
    """The settings to lower, with values that fit `budget` where one exists."""
    samples = tcfg.batch_size * tcfg.grad_accumulation
    tips = []
    fit = largest_fitting_batch(tcfg, seq_length, vocab_size, budget, tcfg.recompute, upper=tcfg.batch_size - 1) \
        if tcfg.batch_size > 1 else 0
    if fit:
        tips.append(f"lower the batch size to {fit} with gradient accumulation {math.ceil(samples / fit)} "
                    f"(--batch-size {fit} --grad-accumulation {math.ceil(samples / fit)}) for the same samples per step")
    else:
        tips.append("lower the batch size (train.batch_size / --batch-size, with --grad-accumulation to keep the "
                    "samples per step)")
    if not tcfg.recompute:
        saved = estimate(**estimate_args(tcfg, seq_length, vocab_size, True), batch_size=tcfg.batch_size,
                         grad_accumulation=tcfg.grad_accumulation)
        tips.append(f"set train.recompute: true ({saved.total / GiB:.1f} GiB at this batch size)")
    if compiles(tcfg):
        op_by_op = estimate(**estimate_args(tcfg.model_copy(update={"compile": False}), seq_length, vocab_size),
                            batch_size=tcfg.batch_size, grad_accumulation=tcfg.grad_accumulation)
        tips.append(f"set train.compile: false ({op_by_op.total / GiB:.1f} GiB, slower steps)")
    seq = seq_length
    while seq > 64 and estimate(**estimate_args(tcfg, seq, vocab_size), batch_size=1,
                                grad_accumulation=tcfg.grad_accumulation).total > budget:
        seq //= 2
    tips.append(f"or pack shorter samples (pack.seq_length, now {seq_length}"
                + (f"; {seq} fits at batch size 1)" if seq < seq_length else ")"))
    return "; ".join(tips)
