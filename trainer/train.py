"""The training loop: reads one rank's shards, trains the decoder, logs one JSON line per step.

`fit` is the loop alone (data, one optimizer step, timings); what happens around a step - the JSON
line, the log lines, fp16 overflow reports, the flat-loss warning, the profiler window, checkpoints,
summary.json - is one callback each, with MindSpore's hook names (`on_train_step_end`, ...)."""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, TextIO

import numpy as np

from corpusmill.stages.base import write_json_atomic, write_text_atomic

from corpusmill.stages.base import ConfigError

from . import checkpoint
from .memory import compiles
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
    """Everything a training run or an lr-find run sets up: model, optimizer, step function, data.
    Each part is one method, called in the order below: MindSpore's context before the model, the
    seed right before the parameters are drawn, the data last."""

    def __init__(self, shards_dir: str, tcfg: Any, lrs: np.ndarray, log: Callable[[str], None]):
        self.manifest = load_manifest(shards_dir)
        self.seq_length, self.vocab_size = check_model_fits(self.manifest, tcfg.model.seq_length, tcfg.model.vocab_size)
        dtype = self._start_mindspore(tcfg.precision)
        self.rank, self.world = self._join_ranks(tcfg.rank, log)
        self.files, self.sharding = rank_files(self.manifest, shards_dir, self.rank)
        self.documents = has_document_ends(self.manifest)
        self._build_model(tcfg, dtype)
        self.precision = tcfg.precision
        self.scaler = self._loss_scaler(tcfg, log)
        self._recompute(tcfg.recompute, log)
        self.optimizer = self._build_optimizer(tcfg.weight_decay, lrs, log)
        self._lrs = lrs
        self._build_gradients(tcfg.grad_clip, tcfg.grad_accumulation, compiles(tcfg), log)
        self._open_data(shards_dir, tcfg, log)

    @staticmethod
    def _start_mindspore(precision: str) -> Any:
        """The compute dtype, checked before any work (bf16 on CPU is refused here), and the context."""
        import mindspore as ms

        device = os.environ.get("CORPUSMILL_DEVICE", "CPU")
        dtype = compute_dtype(precision, device)
        ms.set_context(mode=ms.PYNATIVE_MODE, device_target=device)
        return dtype

    def _join_ranks(self, rank: int, log: Callable[[str], None]) -> tuple[int, int]:
        """(rank, world size): the configured rank alone, or the launcher's when msrun started several."""
        if not launched_distributed():
            return rank, 1
        from mindspore.communication import get_group_size, get_rank, init

        init()
        rank, world = get_rank(), get_group_size()
        if world != self.manifest["ranks"]:
            raise ShardMismatch(f"{world} processes were launched but the shards were written for "
                                f"{self.manifest['ranks']} data-parallel ranks")
        log(f"train: data parallel, rank {rank} of {world}: gradients all-reduced (mean)")
        return rank, world

    def _build_model(self, tcfg: Any, dtype: Any) -> None:
        """The decoder, its parameters drawn from `tcfg.seed`; only a dedicated pad id is masked out of
        the loss (a pad borrowed from <unk> is a real token)."""
        import mindspore as ms

        from .model import DecoderLM, ModelShape

        ms.set_seed(tcfg.seed)
        self.shape = ModelShape(vocab_size=self.vocab_size, seq_length=self.seq_length, hidden_size=tcfg.model.hidden_size,
                                num_layers=tcfg.model.num_layers, num_heads=tcfg.model.num_heads,
                                intermediate_size=tcfg.model.intermediate_size or 0)
        tok = self.manifest["tokenizer"]
        self.pad_is_real_token = tok.get("pad_source") not in ("tokenizer", "config")
        self.net = DecoderLM(self.shape, ignore_id=-1 if self.pad_is_real_token else tok["pad_id"], compute_dtype=dtype)

    @staticmethod
    def _loss_scaler(tcfg: Any, log: Callable[[str], None]) -> Optional[DynamicLossScaler]:
        """fp16 only: a dynamic loss scale, so small gradients do not underflow."""
        if tcfg.precision != "fp16":
            return None
        log(f"train: fp16 matrix products with dynamic loss scaling (initial scale {tcfg.loss_scale:g}, doubled after "
            f"{tcfg.loss_scale_window} finite steps, halved and the step skipped on overflow); norms, softmax and "
            "loss in fp32, fp32 master weights")
        return DynamicLossScaler(tcfg.loss_scale, tcfg.loss_scale_window)

    def _recompute(self, recompute: bool, log: Callable[[str], None]) -> None:
        if recompute:
            for block in self.net.blocks:
                block.recompute()
            log(f"train: recomputing the activations of all {len(self.net.blocks)} layers in the backward pass")

    def _build_optimizer(self, weight_decay: float, lrs: np.ndarray, log: Callable[[str], None]) -> Any:
        """AdamW over the schedule `lrs`, with weight decay on the weight matrices only."""
        from mindspore import Tensor, nn

        params = self.net.trainable_params()
        decay = [p for p in params if len(p.shape) >= 2]
        no_decay = [p for p in params if len(p.shape) < 2]
        log(f"train: weight decay {weight_decay} on {len(decay)} weight matrices "
            f"({', '.join(sorted({p.name.split('.')[-2] if '.' in p.name else p.name for p in decay}))}); "
            f"none on {len(no_decay)} norm/bias parameters")
        return nn.AdamWeightDecay(
            [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            learning_rate=Tensor(lrs), beta1=0.9, beta2=0.95, eps=1e-8)

    def _build_gradients(self, clip: float, accumulate: int, compile_graph: bool, log: Callable[[str], None]) -> None:
        """The gradient function of the scaled loss, and the all-reduce when several ranks train. Compiled,
        the forward and backward pass run as one graph: op-by-op dispatch cost about 2 s a step on CPU
        even for the tiny demo model, the graph about 0.3 s (the same losses)."""
        import mindspore as ms
        from mindspore import nn

        net = self.net

        if self.documents:  # (input_ids, actual_seq_len): attention within each packed document
            def scaled_loss(batch, loss_scale):
                return net(batch[0], batch[1]) * loss_scale
        else:
            def scaled_loss(batch, loss_scale):
                return net(batch) * loss_scale

        self._grad_fn = ms.value_and_grad(scaled_loss, None, self.optimizer.parameters)
        if compile_graph:
            self._grad_fn = ms.jit(self._grad_fn)
            log("train: the loss and its gradient run as one compiled graph (compiled at the first step; "
                "train.compile: false runs op by op)")
        self._clip, self._accumulate = clip, accumulate
        self._reduce = nn.DistributedGradReducer(self.optimizer.parameters, mean=True, degree=self.world) \
            if self.world > 1 else None

    def _open_data(self, shards_dir: str, tcfg: Any, log: Callable[[str], None]) -> None:
        """This rank's batches, repeated; reader threads measured once when `auto`."""
        workers = tcfg.num_parallel_workers
        self.worker_rates: dict = {}
        if workers == "auto":
            workers, self.worker_rates = choose_workers(self.files, self.sharding, tcfg.batch_size,
                                                        str(Path(shards_dir) / "manifest.json"), log=log)
        self.num_parallel_workers = int(workers)
        data = rank_dataset(self.files, self.sharding, tcfg.batch_size, self.num_parallel_workers, tcfg.shuffle, tcfg.seed)
        if self.documents:
            data = document_dataset(self.files, self.sharding, tcfg.batch_size, self.num_parallel_workers, tcfg.shuffle,
                                    tcfg.seed)
            log(f"train: the shards carry {ACTUAL_SEQ_LEN} (shard.eod_metadata): attention stays within each packed "
                "document")
        if data.get_dataset_size() == 0:
            raise ValueError(f"rank {tcfg.rank} has fewer samples ({self.manifest['samples_per_rank']}) than one batch "
                             f"({tcfg.batch_size})")
        self.batches = data.repeat().create_tuple_iterator(num_epochs=1)

    def next_batch(self) -> Any:
        """The next micro-batch: input_ids, or (input_ids, actual_seq_len) when the shards carry it."""
        row = next(self.batches)
        return tuple(row) if self.documents else row[0]

    def _accumulated_gradients(self, micro_batches: list, loss_scale: float) -> tuple[Any, tuple]:
        """(loss, mean gradient) over the micro-batches, unscaled; summed in fp32 buffers, then averaged."""
        import mindspore as ms
        from mindspore import Tensor

        scale_t = Tensor(loss_scale, ms.float32)
        total_loss, acc = None, None
        for batch in micro_batches:
            loss, grads = self._grad_fn(batch, scale_t)
            grads = tuple(g.astype(ms.float32) for g in grads)
            acc = grads if acc is None else tuple(a + g for a, g in zip(acc, grads))
            total_loss = loss if total_loss is None else total_loss + loss
        grads = tuple(g / (self._accumulate * loss_scale) for g in acc)
        if self._reduce is not None:  # every rank applies the same mean gradient, so parameters stay identical
            grads = self._reduce(grads)
        return total_loss / (self._accumulate * loss_scale), grads

    def step(self, micro_batches: list) -> tuple[Any, Any, bool]:
        """One optimizer step; returns (loss, grad norm, overflowed). An overflowed fp16 step is skipped."""
        from mindspore import ops

        loss, grads = self._accumulated_gradients(micro_batches, self.scaler.scale if self.scaler else 1.0)
        norm = ops.sqrt(sum(ops.sum(ops.square(g)) for g in grads))
        if self.scaler is not None:
            finite = bool(ops.isfinite(norm).asnumpy()) and bool(ops.isfinite(loss).asnumpy())
            self.scaler.update(finite)  # all ranks see the same reduced norm, so they skip together
            if not finite:
                return loss, norm, True
        clip_scale = self._clip / ops.maximum(norm, self._clip)
        self.optimizer(tuple((g * clip_scale).astype(p.dtype) for g, p in zip(grads, self.optimizer.parameters)))
        return loss, norm, False

    def current_lr(self) -> float:
        """The rate the next applied step uses: the optimizer's own step indexes the schedule, and a
        skipped fp16 step does not advance it."""
        applied = int(np.asarray(self.optimizer.global_step.asnumpy()).reshape(-1)[0])
        return float(self._lrs[min(applied, len(self._lrs) - 1)])


ACTUAL_SEQ_LEN = "actual_seq_len"  # stages.shard.ACTUAL_SEQ_LEN: the shards' compressed EOD metadata


def has_document_ends(manifest: dict) -> bool:
    """Whether the shards carry each sample's document ends (shard.eod_metadata)."""
    return ACTUAL_SEQ_LEN in (manifest.get("columns") or {})


def document_dataset(files: list[str], sharding: dict, batch_size: int, num_parallel_workers: int, shuffle: bool,
                     seed: int) -> Any:
    """`rank_dataset` with the actual_seq_len column beside input_ids (the same files, order and seed)."""
    import mindspore.dataset as ds

    ds.config.set_seed(seed)
    data = ds.MindDataset(files, columns_list=["input_ids", ACTUAL_SEQ_LEN], shuffle=shuffle,
                          num_parallel_workers=num_parallel_workers, **sharding)
    return data.batch(batch_size, drop_remainder=True)


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


@dataclass
class TrainRun:
    """What the loop hands its callbacks (MindSpore's `cb_params`): the run's fixed facts, the step
    just taken and what it measured, and the state callbacks share (losses, warnings, summary)."""

    session: _Session
    tcfg: Any
    out: Path
    log: Callable[[str], None]
    warmup: int
    start_step: int
    end: int
    resumed: bool
    losses: list[float]
    tokens_per_step: int
    warnings: list[str] = field(default_factory=list)
    val_loss: Optional[float] = None  # the validation loss measured after this step (Validation), else None
    val_losses: list = field(default_factory=list)  # [step, validation loss] of every evaluation
    validation: Optional[dict] = None  # summary.json's `validation`, set at the end by Validation
    step: int = 0  # 0-based index of the step being taken
    micro: list = field(default_factory=list)
    lr: float = 0.0
    loss_scale: Optional[float] = None  # the scale this step ran at (fp16)
    loss: float = float("nan")
    grad_norm: float = float("nan")
    overflow: bool = False
    data_wait_s: float = 0.0
    compute_s: float = 0.0
    step_s: float = 0.0
    data_wait_total: float = 0.0
    compute_total: float = 0.0
    t_start: float = 0.0
    profile_dir: Optional[Path] = None
    summary: dict = field(default_factory=dict)


class Callback:
    """A hook into the training loop, in MindSpore's shape (`mindspore.train.Callback`)."""

    def on_train_begin(self, run: TrainRun) -> None:
        pass

    def on_train_step_begin(self, run: TrainRun) -> None:
        pass

    def on_train_step_end(self, run: TrainRun) -> None:
        pass

    def on_train_end(self, run: TrainRun) -> None:
        pass


def fit(run: TrainRun, callbacks: list[Callback]) -> None:
    """The loop: per step, the micro-batches, one optimizer step, what it took; the callbacks do the rest."""
    session, accumulate = run.session, run.tcfg.grad_accumulation
    run.t_start = time.perf_counter()
    for cb in callbacks:
        cb.on_train_begin(run)
    for step in range(run.start_step, run.end):
        run.step = step
        for cb in callbacks:
            cb.on_train_step_begin(run)
        t0 = time.perf_counter()
        run.micro = [session.next_batch() for _ in range(accumulate)]
        t1 = time.perf_counter()
        run.loss_scale = session.scaler.scale if session.scaler else None
        run.lr = session.current_lr()
        loss, norm, run.overflow = session.step(run.micro)
        run.loss, run.grad_norm = float(loss.asnumpy()), float(norm.asnumpy())
        t2 = time.perf_counter()
        run.data_wait_s, run.compute_s, run.step_s = t1 - t0, t2 - t1, t2 - t0
        run.data_wait_total += run.data_wait_s
        run.compute_total += run.compute_s
        run.losses.append(run.loss)
        for cb in callbacks:
            cb.on_train_step_end(run)
    for cb in callbacks:
        cb.on_train_end(run)


class Validation(Callback):
    """The loss on held-out validation shards (their own manifest, one rank: every rank evaluates all
    of it) every `eval_every` steps and after the last: the mean over the same first `eval_batches`
    batches each time, forward only."""

    def __init__(self, validation_dir: str, log: Callable[[str], None], verify: bool = True):
        self.dir = validation_dir
        self.manifest = check_shards(validation_dir, verify, log)
        self.every = 1
        self.batches: list = []

    def on_train_begin(self, run: TrainRun) -> None:
        import mindspore.dataset as ds

        session, tcfg = run.session, run.tcfg
        check_model_fits(self.manifest, session.seq_length, session.vocab_size)
        self.every = tcfg.eval_every or max(1, tcfg.steps // 10)
        files = [os.path.join(self.dir, e["path"]) for e in self.manifest["files"]]
        batch = max(1, min(tcfg.batch_size, self.manifest["total_samples"]))
        columns = ["input_ids"] + ([ACTUAL_SEQ_LEN] if has_document_ends(self.manifest) else [])
        data = ds.MindDataset(files, columns_list=columns, shuffle=False, num_parallel_workers=1)
        data = data.batch(batch, drop_remainder=True).take(tcfg.eval_batches)
        self.batches = [tuple(b) for b in data.create_tuple_iterator(num_epochs=1)]  # held once: the same ones each time
        run.log(f"train: validation loss every {self.every} steps on {len(self.batches)} batches of {batch} held-out "
                f"samples ({self.manifest['total_samples']} in {self.dir})")

    def loss(self, run: TrainRun) -> float:
        values = [float(run.session.net(*b).asnumpy()) for b in self.batches]
        return float(np.mean(values)) if values else float("nan")

    def on_train_step_end(self, run: TrainRun) -> None:
        done = run.step + 1
        run.val_loss = None
        if done % self.every == 0 or done in (run.tcfg.steps, run.end):
            run.val_loss = self.loss(run)
            run.val_losses.append([done, run.val_loss])
            run.log(f"  step {done:>5}/{run.tcfg.steps}  validation loss {run.val_loss:.4f}")

    def on_train_end(self, run: TrainRun) -> None:
        vals = [v for _, v in run.val_losses]
        run.validation = {"shards": os.path.abspath(self.dir), "samples": self.manifest["total_samples"],
                          "every": self.every, "batches": len(self.batches), "losses": run.val_losses,
                          "first_loss": vals[0] if vals else None, "last_loss": vals[-1] if vals else None}


class FirstBatchCheck(Callback):
    """The guide's checks for a loss that will not fall, on the first batch of a fresh run."""

    def on_train_step_end(self, run: TrainRun) -> None:
        if run.step == run.start_step and not run.resumed:
            first = run.micro[0][0] if isinstance(run.micro[0], tuple) else run.micro[0]
            run.warnings += _diagnose_first_batch(first.asnumpy(), run.session, run.tcfg, run.warmup, run.log)


class MetricsLog(Callback):
    """One JSON line per step into metrics.jsonl, flushed at once (a killed run keeps every step)."""

    def __init__(self, metrics: TextIO):
        self.metrics = metrics

    def on_train_step_end(self, run: TrainRun) -> None:
        record = {"step": run.step + 1, "loss": run.loss if math.isfinite(run.loss) else None, "lr": run.lr,
                  "grad_norm": run.grad_norm if math.isfinite(run.grad_norm) else None,
                  "tokens_per_s": run.tokens_per_step / max(run.step_s, 1e-9), "data_wait_s": run.data_wait_s,
                  "compute_s": run.compute_s}
        if run.session.scaler is not None:
            record.update(loss_scale=run.loss_scale, overflow=run.overflow)
        if run.val_loss is not None:
            record["val_loss"] = run.val_loss
        self.metrics.write(json.dumps(record) + "\n")
        self.metrics.flush()


class OverflowReport(Callback):
    """A skipped fp16 step is one line; a loss that stays non-finite ends the run."""

    def on_train_step_end(self, run: TrainRun) -> None:
        scaler = run.session.scaler
        if run.overflow:
            run.log(f"  step {run.step + 1:>5}/{run.tcfg.steps}  fp16 gradient overflow at loss scale "
                    f"{run.loss_scale:g}: step skipped, scale now {scaler.scale:g} ({scaler.overflow_steps} skipped "
                    "so far)")
            if scaler.stuck:
                raise FloatingPointError(f"fp16 overflow even at loss scale {scaler.scale:g} at step {run.step + 1}: "
                                         "the forward pass overflows; lower the learning rate or use fp32/bf16")
        elif not math.isfinite(run.loss):
            raise FloatingPointError(f"loss became {run.loss} at step {run.step + 1}")


class StepLog(Callback):
    """The first step, every tenth and the last as one line each."""

    def on_train_step_end(self, run: TrainRun) -> None:
        step = run.step
        if not run.overflow and (step == 0 or (step + 1) % 10 == 0 or step + 1 == run.tcfg.steps):
            run.log(f"  step {step + 1:>5}/{run.tcfg.steps}  loss {run.loss:.4f}  lr {run.lr:.2e}  "
                    f"grad_norm {run.grad_norm:.3f}  {run.tokens_per_step / max(run.step_s, 1e-9):.0f} tok/s")


class FlatLossCheck(Callback):
    """Once, a while after warmup: a warning when the loss has not fallen since warmup ended."""

    def __init__(self) -> None:
        self.checked = False

    def on_train_step_end(self, run: TrainRun) -> None:
        if self.checked or run.step + 1 - run.warmup < max(20, run.tcfg.steps // 10):
            return
        self.checked = True
        early, late = _finite_mean(run.losses[run.warmup:run.warmup + 10]), _finite_mean(run.losses[-10:])
        if late > 0.99 * early:
            w = (f"loss is flat after warmup ({early:.3f} -> {late:.3f}); check: the learning rate "
                 f"({run.tcfg.lr:g}; try `corpusmill train lr-find`), the label shift, the pad id (masked: "
                 f"{not run.session.pad_is_real_token}), and that the shards hold real text (`corpusmill shards inspect`)")
            run.warnings.append(w)
            run.log(f"train: WARNING: {w}")


class ProfilerWindow(Callback):
    """`train.profile_steps: [first, last]`: a mindspore.Profiler over those steps, into OUT/profile."""

    def __init__(self) -> None:
        self.profiler = None

    def on_train_step_begin(self, run: TrainRun) -> None:
        window = run.tcfg.profile_steps
        if window and run.step + 1 == window[0]:
            import mindspore as ms

            run.profile_dir = run.out / "profile"
            self.profiler = ms.Profiler(output_path=str(run.profile_dir))
            run.log(f"train: profiling steps {window[0]}-{window[1]} into {run.profile_dir}")

    def on_train_step_end(self, run: TrainRun) -> None:
        if self.profiler is not None and (run.step + 1 == run.tcfg.profile_steps[1] or run.step + 1 == run.end):
            self.profiler.stop()
            self.profiler.analyse()
            self.profiler = None


class Checkpointer(Callback):
    """Every `checkpoint_every` steps, the last planned step and the last of this process: an atomic
    checkpoint with what resuming needs (samples consumed, the micro-batch size, losses, the scaler)."""

    def on_train_step_end(self, run: TrainRun) -> None:
        tcfg, done = run.tcfg, run.step + 1
        if tcfg.checkpoint_every and (done % tcfg.checkpoint_every == 0 or done in (tcfg.steps, run.end)):
            scaler = run.session.scaler
            checkpoint.save(run.session.optimizer, run.out, done,
                            {"batches": done * tcfg.grad_accumulation, "micro_batch_size": tcfg.batch_size,
                             "losses": run.losses, "loss_scaler": scaler.state() if scaler else None},
                            keep=tcfg.keep_checkpoints)


class SummaryWriter(Callback):
    """At the end, summary.json: the losses' start and end, throughput, time waiting for data, and
    every setting the run ended with."""

    def __init__(self, shards_dir: str):
        self.shards_dir = shards_dir

    def on_train_end(self, run: TrainRun) -> None:
        session, tcfg, losses = run.session, run.tcfg, run.losses
        wall = time.perf_counter() - run.t_start
        finite = [x for x in losses if math.isfinite(x)]  # fp16 steps that overflowed in the forward pass have no loss
        tokens = run.tokens_per_step * (len(losses) - run.start_step)
        run.summary = {
            "steps": len(losses),
            "planned_steps": tcfg.steps,
            "resumed_at_step": run.start_step,
            "rank": session.rank,
            "world_size": session.world,
            "first_loss": finite[0],
            "last_loss": finite[-1],
            "loss_start_mean": float(np.mean(finite[: max(1, len(finite) // 10)])),
            "loss_end_mean": float(np.mean(finite[-max(1, len(finite) // 10):])),
            "tokens": tokens,
            "tokens_per_s": tokens / max(wall, 1e-9),
            "wall_s": wall,
            "data_wait_s": run.data_wait_total,
            "compute_s": run.compute_total,
            "data_wait_share": run.data_wait_total / max(wall, 1e-9),
            "num_parallel_workers": session.num_parallel_workers,
            "num_parallel_workers_rates": session.worker_rates,
            "grad_accumulation": tcfg.grad_accumulation,
            "precision": tcfg.precision,
            "overflow_steps": session.scaler.overflow_steps if session.scaler else 0,
            "final_loss_scale": session.scaler.scale if session.scaler else None,
            "recompute": tcfg.recompute,
            "profile_dir": str(run.profile_dir) if run.profile_dir else None,
            "warmup_steps": run.warmup,
            "warnings": run.warnings,
            "model": session.shape.__dict__,
            "shards": os.path.abspath(self.shards_dir),
        }
        if run.validation is not None:
            run.summary["validation"] = run.validation
        write_json_atomic(run.out / "summary.json", run.summary)


def _resume(session: _Session, out: Path, tcfg: Any, metrics_path: Path, log: Callable[[str], None]) -> tuple[int, list[float]]:
    """(step, losses so far) of the newest checkpoint, loaded into the optimizer (and the loss scaler);
    the data iterator skips exactly the samples it consumed and metrics.jsonl loses later steps."""
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
    return start_step, losses


def train(shards_dir: str, out_dir: str, tcfg: Any, log: Callable[[str], None] = print, resume: bool = False,
          stop_after: Optional[int] = None, verify: bool = True, validation_dir: Optional[str] = None) -> dict[str, Any]:
    """Train for `tcfg.steps` optimizer steps on rank `tcfg.rank`'s share; with `resume`, continue
    from the newest checkpoint in OUT/checkpoints at the exact next batch. `stop_after` ends this
    process after that many steps (a time-boxed job; resume it later). The shards are checked
    against their manifest first (sizes, sha256, tokenizer, indexes); `verify=False` checks only the
    manifest and that the files are there. With `validation_dir` (held-out shards with their own
    manifest), the validation loss is measured every `tcfg.eval_every` steps (metrics.jsonl `val_loss`,
    summary.json `validation`)."""
    check_shards(shards_dir, verify, log)  # before MindSpore: damaged shards are refused in seconds
    validation = Validation(validation_dir, log, verify) if validation_dir else None
    tcfg = _fit_memory(shards_dir, tcfg, log)
    warmup = tcfg.warmup_steps if tcfg.warmup_steps is not None else max(1, round(0.02 * tcfg.steps))
    session = _Session(shards_dir, tcfg, lr_schedule(tcfg.steps, tcfg.lr, warmup, tcfg.min_lr_ratio), log)
    out = Path(out_dir) / f"rank-{session.rank}" if session.world > 1 else Path(out_dir)  # one folder per process
    out.mkdir(parents=True, exist_ok=True)
    shape = session.shape
    log(f"train: rank {session.rank}, {len(session.files)} files ({session.manifest.get('layout', 'per_rank')} layout), "
        f"{session.manifest['samples_per_rank']} samples, model {shape.num_layers}x{shape.hidden_size} vocab "
        f"{session.vocab_size} seq {session.seq_length}, {tcfg.steps} steps x {tcfg.grad_accumulation} micro-batches")
    metrics_path = out / "metrics.jsonl"
    start_step, losses = _resume(session, out, tcfg, metrics_path, log) if resume else (0, [])
    run = TrainRun(session, tcfg, out, log, warmup, start_step,
                   end=tcfg.steps if stop_after is None else min(tcfg.steps, start_step + stop_after), resumed=resume,
                   losses=losses, tokens_per_step=tcfg.batch_size * tcfg.grad_accumulation * session.seq_length)
    # appended to, never through a link planted in the output folder (O_NOFOLLOW: refused instead)
    metrics_fd = os.open(metrics_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    with os.fdopen(metrics_fd, "a", encoding="utf-8") as metrics:
        fit(run, [FirstBatchCheck(), *([validation] if validation else []), MetricsLog(metrics), OverflowReport(),
                  StepLog(), FlatLossCheck(), ProfilerWindow(), Checkpointer(), SummaryWriter(shards_dir)])
    return run.summary


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
        micro = [session.next_batch() for _ in range(tcfg.grad_accumulation)]
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
