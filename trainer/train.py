"""The training loop: reads one rank's shards, trains the decoder, logs one JSON line per step."""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .data import check_model_fits, load_manifest, rank_dataset, rank_files


def lr_schedule(steps: int, peak: float, warmup: int, min_ratio: float) -> np.ndarray:
    """Linear warmup then cosine decay to `min_ratio * peak`."""
    lrs = np.empty(steps, dtype=np.float32)
    for s in range(steps):
        if s < warmup:
            lrs[s] = peak * (s + 1) / warmup
        else:
            progress = (s - warmup) / max(1, steps - warmup)
            lrs[s] = peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))
    return lrs


def train(shards_dir: str, out_dir: str, tcfg: Any, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train for `tcfg.steps` steps on rank `tcfg.rank`'s shards; returns the summary."""
    import mindspore as ms
    from mindspore import Tensor, nn, ops

    from .model import DecoderLM, ModelShape

    manifest = load_manifest(shards_dir)
    seq_length, vocab_size = check_model_fits(manifest, tcfg.model.seq_length, tcfg.model.vocab_size)
    files, sharding = rank_files(manifest, shards_dir, tcfg.rank)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    ms.set_context(mode=ms.PYNATIVE_MODE, device_target=os.environ.get("CORPUSMILL_DEVICE", "CPU"))
    ms.set_seed(tcfg.seed)
    shape = ModelShape(
        vocab_size=vocab_size,
        seq_length=seq_length,
        hidden_size=tcfg.model.hidden_size,
        num_layers=tcfg.model.num_layers,
        num_heads=tcfg.model.num_heads,
        intermediate_size=tcfg.model.intermediate_size or 0,
    )
    tok = manifest["tokenizer"]
    # only a dedicated pad id is masked out of the loss; a pad borrowed from <unk> is not
    ignore_id = tok["pad_id"] if tok.get("pad_source") in ("tokenizer", "config") else -1
    net = DecoderLM(shape, ignore_id=ignore_id)

    warmup = tcfg.warmup_steps if tcfg.warmup_steps is not None else max(1, round(0.02 * tcfg.steps))
    lrs = lr_schedule(tcfg.steps, tcfg.lr, warmup, tcfg.min_lr_ratio)
    params = net.trainable_params()
    decay = [p for p in params if len(p.shape) >= 2]
    no_decay = [p for p in params if len(p.shape) < 2]
    log(f"train: {len(decay)} weight matrices decay (wd={tcfg.weight_decay}); {len(no_decay)} norm/bias params do not")
    optimizer = nn.AdamWeightDecay(
        [{"params": decay, "weight_decay": tcfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        learning_rate=Tensor(lrs),
        beta1=0.9,
        beta2=0.95,
        eps=1e-8,
    )
    grad_fn = ms.value_and_grad(net, None, optimizer.parameters)
    clip = tcfg.grad_clip

    def train_step(batch):
        loss, grads = grad_fn(batch)
        norm = ops.sqrt(sum(ops.sum(ops.square(g.astype(ms.float32))) for g in grads))
        scale = clip / ops.maximum(norm, clip)
        grads = tuple(g * scale.astype(g.dtype) for g in grads)
        optimizer(grads)
        return loss, norm

    data = rank_dataset(files, sharding, tcfg.batch_size, tcfg.num_parallel_workers, tcfg.shuffle, tcfg.seed)
    per_epoch = data.get_dataset_size()
    if per_epoch == 0:
        raise ValueError(
            f"rank {tcfg.rank} has fewer samples ({manifest['samples_per_rank']}) than one batch ({tcfg.batch_size})"
        )
    batches = data.repeat().create_tuple_iterator(num_epochs=1)
    log(
        f"train: rank {tcfg.rank}, {len(files)} files ({manifest.get('layout', 'per_rank')} layout), "
        f"{manifest['samples_per_rank']} samples, "
        f"model {shape.num_layers}x{shape.hidden_size} vocab {vocab_size} seq {seq_length}, {tcfg.steps} steps"
    )
    metrics_path = out / "metrics.jsonl"
    tokens_per_step = tcfg.batch_size * seq_length
    totals = {"data_wait_s": 0.0, "compute_s": 0.0}
    losses = []
    t_start = time.perf_counter()
    with open(metrics_path, "w", encoding="utf-8") as metrics:
        for step in range(tcfg.steps):
            t0 = time.perf_counter()
            (batch,) = next(batches)
            t1 = time.perf_counter()
            loss, norm = train_step(batch)
            loss_value = float(loss.asnumpy())
            t2 = time.perf_counter()
            record = {
                "step": step + 1,
                "loss": loss_value,
                "lr": float(lrs[step]),
                "grad_norm": float(norm.asnumpy()),
                "tokens_per_s": tokens_per_step / max(t2 - t0, 1e-9),
                "data_wait_s": t1 - t0,
                "compute_s": t2 - t1,
            }
            totals["data_wait_s"] += record["data_wait_s"]
            totals["compute_s"] += record["compute_s"]
            losses.append(loss_value)
            metrics.write(json.dumps(record) + "\n")
            metrics.flush()
            if not math.isfinite(loss_value):
                raise FloatingPointError(f"loss became {loss_value} at step {step + 1}")
            if step == 0 or (step + 1) % 10 == 0 or step + 1 == tcfg.steps:
                log(f"  step {step + 1:>5}/{tcfg.steps}  loss {loss_value:.4f}  lr {lrs[step]:.2e}  "
                    f"grad_norm {record['grad_norm']:.3f}  {record['tokens_per_s']:.0f} tok/s")
    wall = time.perf_counter() - t_start
    head = float(np.mean(losses[: max(1, len(losses) // 10)]))
    tail = float(np.mean(losses[-max(1, len(losses) // 10):]))
    summary = {
        "steps": tcfg.steps,
        "rank": tcfg.rank,
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "loss_start_mean": head,
        "loss_end_mean": tail,
        "tokens": tokens_per_step * tcfg.steps,
        "wall_s": wall,
        "data_wait_s": totals["data_wait_s"],
        "compute_s": totals["compute_s"],
        "data_wait_share": totals["data_wait_s"] / max(wall, 1e-9),
        "num_parallel_workers": tcfg.num_parallel_workers,
        "warmup_steps": warmup,
        "model": shape.__dict__,
        "shards": os.path.abspath(shards_dir),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return summary
