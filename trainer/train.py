"""The training loop: reads one rank's shards, trains the decoder, logs one JSON line per step."""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from stages.base import write_json_atomic, write_text_atomic

from pipeline.config import ConfigError

from . import checkpoint
from .data import ShardMismatch, check_model_fits, check_shards, load_manifest, rank_dataset, rank_files
from .precision import DynamicLossScaler, compute_dtype
from .workers import choose as choose_workers


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


class _Session:
    """Everything a training run or an lr-find run sets up: model, optimizer, step function, data."""

    def __init__(self, shards_dir: str, tcfg: Any, lrs: np.ndarray, log: Callable[[str], None]):
        import mindspore as ms
        from mindspore import Tensor, nn, ops

        from .model import DecoderLM, ModelShape

        self.manifest = load_manifest(shards_dir)
        self.seq_length, self.vocab_size = check_model_fits(self.manifest, tcfg.model.seq_length, tcfg.model.vocab_size)
        device = os.environ.get("CORPUSMILL_DEVICE", "CPU")
        dtype = compute_dtype(tcfg.precision, device)  # before any work: bf16 on CPU is refused here
        ms.set_context(mode=ms.PYNATIVE_MODE, device_target=device)
        self.rank, self.world = tcfg.rank, 1
        if launched_distributed():
            from mindspore.communication import get_group_size, get_rank, init

            init()
            self.rank, self.world = get_rank(), get_group_size()
            if self.world != self.manifest["ranks"]:
                raise ShardMismatch(f"{self.world} processes were launched but the shards were written for "
                                    f"{self.manifest['ranks']} data-parallel ranks")
            log(f"train: data parallel, rank {self.rank} of {self.world}: gradients all-reduced (mean)")
        self.files, self.sharding = rank_files(self.manifest, shards_dir, self.rank)
        ms.set_seed(tcfg.seed)
        self.shape = ModelShape(vocab_size=self.vocab_size, seq_length=self.seq_length, hidden_size=tcfg.model.hidden_size,
                                num_layers=tcfg.model.num_layers, num_heads=tcfg.model.num_heads,
                                intermediate_size=tcfg.model.intermediate_size or 0)
        tok = self.manifest["tokenizer"]
        # only a dedicated pad id is masked out of the loss; a pad borrowed from <unk> is a real token
        self.pad_is_real_token = tok.get("pad_source") not in ("tokenizer", "config")
        self.net = DecoderLM(self.shape, ignore_id=-1 if self.pad_is_real_token else tok["pad_id"], compute_dtype=dtype)
        self.precision = tcfg.precision
        self.scaler = DynamicLossScaler(tcfg.loss_scale, tcfg.loss_scale_window) if tcfg.precision == "fp16" else None
        if self.scaler:
            log(f"train: fp16 matrix products with dynamic loss scaling (initial scale {tcfg.loss_scale:g}, doubled after "
                f"{tcfg.loss_scale_window} finite steps, halved and the step skipped on overflow); norms, softmax and "
                "loss in fp32, fp32 master weights")
        if tcfg.recompute:
            for block in self.net.blocks:
                block.recompute()
            log(f"train: recomputing the activations of all {len(self.net.blocks)} layers in the backward pass")
        params = self.net.trainable_params()
        decay = [p for p in params if len(p.shape) >= 2]
        no_decay = [p for p in params if len(p.shape) < 2]
        log(f"train: weight decay {tcfg.weight_decay} on {len(decay)} weight matrices "
            f"({', '.join(sorted({p.name.split('.')[-2] if '.' in p.name else p.name for p in decay}))}); "
            f"none on {len(no_decay)} norm/bias parameters")
        self.optimizer = nn.AdamWeightDecay(
            [{"params": decay, "weight_decay": tcfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            learning_rate=Tensor(lrs), beta1=0.9, beta2=0.95, eps=1e-8)
        net = self.net

        def scaled_loss(batch, loss_scale):
            return net(batch) * loss_scale

        grad_fn = ms.value_and_grad(scaled_loss, None, self.optimizer.parameters)
        clip, accumulate = tcfg.grad_clip, tcfg.grad_accumulation
        reduce = nn.DistributedGradReducer(self.optimizer.parameters, mean=True, degree=self.world) \
            if self.world > 1 else None

        def step(micro_batches):
            """One optimizer step; returns (loss, grad norm, overflowed). An overflowed fp16 step is skipped."""
            loss_scale = self.scaler.scale if self.scaler else 1.0
            scale_t = Tensor(loss_scale, ms.float32)
            total_loss, acc = None, None
            for batch in micro_batches:  # gradients summed in fp32 buffers, then averaged
                loss, grads = grad_fn(batch, scale_t)
                grads = tuple(g.astype(ms.float32) for g in grads)
                acc = grads if acc is None else tuple(a + g for a, g in zip(acc, grads))
                total_loss = loss if total_loss is None else total_loss + loss
            grads = tuple(g / (accumulate * loss_scale) for g in acc)
            if reduce is not None:  # every rank applies the same mean gradient, so parameters stay identical
                grads = reduce(grads)
            norm = ops.sqrt(sum(ops.sum(ops.square(g)) for g in grads))
            loss = total_loss / (accumulate * loss_scale)
            if self.scaler is not None:
                finite = bool(ops.isfinite(norm).asnumpy()) and bool(ops.isfinite(loss).asnumpy())
                self.scaler.update(finite)  # all ranks see the same reduced norm, so they skip together
                if not finite:
                    return loss, norm, True
            clip_scale = clip / ops.maximum(norm, clip)
            self.optimizer(tuple((g * clip_scale).astype(p.dtype) for g, p in zip(grads, self.optimizer.parameters)))
            return loss, norm, False

        self.step = step

        def current_lr() -> float:
            """The rate the next applied step uses: the optimizer's own step indexes the schedule, and a
            skipped fp16 step does not advance it."""
            applied = int(np.asarray(self.optimizer.global_step.asnumpy()).reshape(-1)[0])
            return float(lrs[min(applied, len(lrs) - 1)])

        self.current_lr = current_lr
        workers = tcfg.num_parallel_workers
        self.worker_rates: dict = {}
        if workers == "auto":
            workers, self.worker_rates = choose_workers(self.files, self.sharding, tcfg.batch_size,
                                                         str(Path(shards_dir) / "manifest.json"), log=log)
        self.num_parallel_workers = int(workers)
        data = rank_dataset(self.files, self.sharding, tcfg.batch_size, self.num_parallel_workers, tcfg.shuffle, tcfg.seed)
        if data.get_dataset_size() == 0:
            raise ValueError(f"rank {tcfg.rank} has fewer samples ({self.manifest['samples_per_rank']}) than one batch "
                             f"({tcfg.batch_size})")
        self.batches = data.repeat().create_tuple_iterator(num_epochs=1)


def _finite_mean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(np.mean(finite)) if finite else float("nan")


def launched_distributed() -> bool:
    """Started by msrun (or another launcher that sets MindSpore's cluster variables) with >1 workers."""
    return int(os.environ.get("MS_WORKER_NUM", os.environ.get("RANK_SIZE", "1")) or 1) > 1


def _diagnose_first_batch(batch: np.ndarray, session: _Session, tcfg: Any, warmup: int, log: Callable[[str], None]) -> list[str]:
    """The guide's checks for a loss that will not fall, on the first batch and the config."""
    warnings = []
    tokens, labels = batch[:, :-1], batch[:, 1:]
    same = float((tokens == labels).mean())
    log(f"train: label shift checked on the first batch: labels are input_ids[1:] ({same:.1%} of positions repeat "
        "the previous token)")
    if same > 0.5:
        warnings.append(f"{same:.0%} of label positions equal their input token: degenerate windows (padding?) or "
                        "labels that are not shifted by one")
    if session.pad_is_real_token and session.manifest.get("pack_mode", "concat") != "concat":
        warnings.append("the pad id is borrowed from <unk>, a real token: padding cannot be excluded from the loss; "
                        "give tokenizer.pad_id a dedicated id")
    if tcfg.lr < 1e-6:
        warnings.append(f"learning rate {tcfg.lr:g} is tiny: the loss will barely move")
    share = warmup / max(1, tcfg.steps)
    if not 0.01 <= share <= 0.03 and tcfg.steps >= 100:
        warnings.append(f"warmup is {share:.1%} of the steps; the guide recommends 1-3%")
    if tcfg.grad_accumulation > 8:
        warnings.append(f"gradient accumulation of {tcfg.grad_accumulation} micro-batches: consider a larger batch or "
                        "more data-parallel ranks (stale, noisy steps)")
    for w in warnings:
        log(f"train: WARNING: {w}")
    return warnings


def _fit_memory(shards_dir: str, tcfg: Any, log: Callable[[str], None]) -> Any:
    """The batch size chosen (when not given) and the memory estimate checked before MindSpore starts."""
    from .memory import plan

    seq_length, vocab_size = check_model_fits(load_manifest(shards_dir), tcfg.model.seq_length, tcfg.model.vocab_size)
    return plan(tcfg, seq_length, vocab_size, log)


def train(shards_dir: str, out_dir: str, tcfg: Any, log: Callable[[str], None] = print, resume: bool = False,
          stop_after: Optional[int] = None, verify: bool = True) -> dict[str, Any]:
    """Train for `tcfg.steps` optimizer steps on rank `tcfg.rank`'s share; with `resume`, continue
    from the newest checkpoint in OUT/checkpoints at the exact next batch. `stop_after` ends this
    process after that many steps (a time-boxed job; resume it later). The shards are checked
    against their manifest first (sizes, sha256, tokenizer, indexes); `verify=False` checks only the
    manifest and that the files are there."""
    check_shards(shards_dir, verify, log)  # before MindSpore: damaged shards are refused in seconds
    tcfg = _fit_memory(shards_dir, tcfg, log)
    warmup = tcfg.warmup_steps if tcfg.warmup_steps is not None else max(1, round(0.02 * tcfg.steps))
    lrs = lr_schedule(tcfg.steps, tcfg.lr, warmup, tcfg.min_lr_ratio)
    session = _Session(shards_dir, tcfg, lrs, log)
    out = Path(out_dir) / f"rank-{session.rank}" if session.world > 1 else Path(out_dir)  # one folder per process
    out.mkdir(parents=True, exist_ok=True)
    shape, seq_length = session.shape, session.seq_length
    log(f"train: rank {session.rank}, {len(session.files)} files ({session.manifest.get('layout', 'per_rank')} layout), "
        f"{session.manifest['samples_per_rank']} samples, model {shape.num_layers}x{shape.hidden_size} vocab "
        f"{session.vocab_size} seq {seq_length}, {tcfg.steps} steps x {tcfg.grad_accumulation} micro-batches")
    metrics_path = out / "metrics.jsonl"
    start_step, losses, warnings = 0, [], []
    totals = {"data_wait_s": 0.0, "compute_s": 0.0}
    if resume:
        folder = checkpoint.latest(out)
        if folder is None:
            raise FileNotFoundError(f"--resume: no checkpoint in {out / 'checkpoints'}")
        state = checkpoint.load(session.optimizer, folder)
        start_step, losses = state["step"], state["losses"]
        if session.scaler is not None and state.get("loss_scaler"):
            session.scaler = DynamicLossScaler.from_state(state["loss_scaler"])
        # the same seeded sample order: skip exactly the samples consumed, whatever micro-batch size the
        # memory plan picks now (it depends on the memory free at each start)
        consumed = state["batches"] * state.get("micro_batch_size", tcfg.batch_size)
        if consumed % tcfg.batch_size:
            raise ConfigError(f"--resume: the checkpoint consumed {consumed} samples in micro-batches of "
                              f"{state['micro_batch_size']}; resume with --batch-size {state['micro_batch_size']}")
        for _ in range(consumed // tcfg.batch_size):
            next(session.batches)
        kept = [line for line in metrics_path.read_text().splitlines() if json.loads(line)["step"] <= start_step] \
            if metrics_path.is_file() else []
        write_text_atomic(metrics_path, "".join(line + "\n" for line in kept))
        log(f"train: resumed from {folder} at step {start_step} (sample {consumed})")
    tokens_per_step = tcfg.batch_size * tcfg.grad_accumulation * seq_length
    flat_checked = False
    profiler, profile_dir = None, None
    t_start = time.perf_counter()
    # appended to, never through a link planted in the output folder (O_NOFOLLOW: refused instead)
    metrics_fd = os.open(metrics_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    with os.fdopen(metrics_fd, "a", encoding="utf-8") as metrics:
        end = tcfg.steps if stop_after is None else min(tcfg.steps, start_step + stop_after)
        for step in range(start_step, end):
            if tcfg.profile_steps and step + 1 == tcfg.profile_steps[0]:
                import mindspore as ms

                profile_dir = out / "profile"
                profiler = ms.Profiler(output_path=str(profile_dir))
                log(f"train: profiling steps {tcfg.profile_steps[0]}-{tcfg.profile_steps[1]} into {profile_dir}")
            t0 = time.perf_counter()
            micro = [next(session.batches)[0] for _ in range(tcfg.grad_accumulation)]
            t1 = time.perf_counter()
            if step == start_step and not resume:
                warnings += _diagnose_first_batch(micro[0].asnumpy(), session, tcfg, warmup, log)
            scale_used = session.scaler.scale if session.scaler else None
            lr_now = session.current_lr()
            loss, norm, overflow = session.step(micro)
            loss_value, norm_value = float(loss.asnumpy()), float(norm.asnumpy())
            t2 = time.perf_counter()
            record = {"step": step + 1, "loss": loss_value if math.isfinite(loss_value) else None, "lr": lr_now,
                      "grad_norm": norm_value if math.isfinite(norm_value) else None,
                      "tokens_per_s": tokens_per_step / max(t2 - t0, 1e-9), "data_wait_s": t1 - t0, "compute_s": t2 - t1}
            if session.scaler is not None:
                record.update(loss_scale=scale_used, overflow=overflow)
            totals["data_wait_s"] += record["data_wait_s"]
            totals["compute_s"] += record["compute_s"]
            losses.append(loss_value)
            metrics.write(json.dumps(record) + "\n")
            metrics.flush()
            if overflow:
                log(f"  step {step + 1:>5}/{tcfg.steps}  fp16 gradient overflow at loss scale {scale_used:g}: step "
                    f"skipped, scale now {session.scaler.scale:g} ({session.scaler.overflow_steps} skipped so far)")
                if session.scaler.stuck:
                    raise FloatingPointError(f"fp16 overflow even at loss scale {session.scaler.scale:g} at step "
                                             f"{step + 1}: the forward pass overflows; lower the learning rate or use "
                                             "fp32/bf16")
            elif not math.isfinite(loss_value):
                raise FloatingPointError(f"loss became {loss_value} at step {step + 1}")
            if not overflow and (step == 0 or (step + 1) % 10 == 0 or step + 1 == tcfg.steps):
                log(f"  step {step + 1:>5}/{tcfg.steps}  loss {loss_value:.4f}  lr {lr_now:.2e}  "
                    f"grad_norm {record['grad_norm']:.3f}  {record['tokens_per_s']:.0f} tok/s")
            after = step + 1 - warmup
            if not flat_checked and after >= max(20, tcfg.steps // 10):
                flat_checked = True
                early, late = _finite_mean(losses[warmup:warmup + 10]), _finite_mean(losses[-10:])
                if late > 0.99 * early:
                    w = (f"loss is flat after warmup ({early:.3f} -> {late:.3f}); check: the learning rate "
                         f"({tcfg.lr:g}; try `corpusmill train lr-find`), the label shift, the pad id (masked: "
                         f"{not session.pad_is_real_token}), and that the shards hold real text (`corpusmill shards inspect`)")
                    warnings.append(w)
                    log(f"train: WARNING: {w}")
            if profiler is not None and (step + 1 == tcfg.profile_steps[1] or step + 1 == end):
                profiler.stop()
                profiler.analyse()
                profiler = None
            if tcfg.checkpoint_every and ((step + 1) % tcfg.checkpoint_every == 0 or step + 1 in (tcfg.steps, end)):
                checkpoint.save(session.optimizer, out, step + 1,
                                {"batches": (step + 1) * tcfg.grad_accumulation, "micro_batch_size": tcfg.batch_size,
                                 "losses": losses,
                                 "loss_scaler": session.scaler.state() if session.scaler else None},
                                keep=tcfg.keep_checkpoints)
    wall = time.perf_counter() - t_start
    finite = [x for x in losses if math.isfinite(x)]  # fp16 steps that overflowed in the forward pass have no loss
    head = float(np.mean(finite[: max(1, len(finite) // 10)]))
    tail = float(np.mean(finite[-max(1, len(finite) // 10):]))
    summary = {
        "steps": len(losses),
        "planned_steps": tcfg.steps,
        "resumed_at_step": start_step,
        "rank": session.rank,
        "world_size": session.world,
        "first_loss": finite[0],
        "last_loss": finite[-1],
        "loss_start_mean": head,
        "loss_end_mean": tail,
        "tokens": tokens_per_step * (len(losses) - start_step),
        "tokens_per_s": tokens_per_step * (len(losses) - start_step) / max(wall, 1e-9),
        "wall_s": wall,
        "data_wait_s": totals["data_wait_s"],
        "compute_s": totals["compute_s"],
        "data_wait_share": totals["data_wait_s"] / max(wall, 1e-9),
        "num_parallel_workers": session.num_parallel_workers,
        "num_parallel_workers_rates": session.worker_rates,
        "grad_accumulation": tcfg.grad_accumulation,
        "precision": tcfg.precision,
        "overflow_steps": session.scaler.overflow_steps if session.scaler else 0,
        "final_loss_scale": session.scaler.scale if session.scaler else None,
        "recompute": tcfg.recompute,
        "profile_dir": str(profile_dir) if profile_dir else None,
        "warmup_steps": warmup,
        "warnings": warnings,
        "model": shape.__dict__,
        "shards": os.path.abspath(shards_dir),
    }
    write_json_atomic(out / "summary.json", summary)
    return summary


def lr_find(shards_dir: str, tcfg: Any, steps: int = 60, low: float = 1e-5, high: float = 1.0,
            log: Callable[[str], None] = print, verify: bool = True) -> dict[str, Any]:
    """A learning-rate range test: the rate grows exponentially from `low` to `high` over `steps`
    steps (no warmup, no decay); the loss is smoothed (EMA 0.8). Reports the largest rate at which
    the smoothed loss still falls steadily (over each of the 3 steps before it) and a rate 25% below."""
    check_shards(shards_dir, verify, log)
    tcfg = _fit_memory(shards_dir, tcfg, log)
    lrs = (low * (high / low) ** (np.arange(steps) / max(1, steps - 1))).astype(np.float32)
    session = _Session(shards_dir, tcfg, lrs, log)
    raw, smooth, used, avg = [], [], [], None
    for i in range(steps):
        micro = [next(session.batches)[0] for _ in range(tcfg.grad_accumulation)]
        lr_now = session.current_lr()
        loss_t, _, overflow = session.step(micro)
        if overflow:  # a skipped fp16 step says nothing about this learning rate
            continue
        loss = float(loss_t.asnumpy())
        raw.append(loss)
        used.append(lr_now)
        avg = loss if avg is None else 0.8 * avg + 0.2 * loss
        smooth.append(avg)
        if not math.isfinite(loss) or (i > 5 and avg > 4 * min(smooth)):
            break
    best = int(np.argmin(smooth))
    k = best
    while k >= 3 and not all(smooth[j] < smooth[j - 1] for j in range(k - 2, k + 1)):
        k -= 1
    largest = used[k]
    result = {"largest_falling_lr": largest, "suggested_lr": 0.75 * largest, "steps_run": len(raw),
              "lrs": used, "losses": raw, "smoothed": smooth}
    log(f"lr-find: the loss still falls steadily up to lr {largest:.3g} (smoothed loss {smooth[k]:.3f}, lowest "
        f"{smooth[best]:.3f} at {used[best]:.3g}); suggested lr {0.75 * largest:.3g}")
    return result
