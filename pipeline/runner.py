"""Executes a plan over a run directory: resume, completion markers, the hash chain, the ledger, the
report and the hand-off to training. It knows nothing of what a step does (`pipeline/plan.py` decides
the steps and their order, `pipeline/steps/` holds them).

Each step writes into its own folder and a `_DONE.json` marker last; `resume=True` skips a step whose
marker carries the same link of the hash chain, and an unfinished step keeps the tasks an earlier try
finished with that link (`StepContext.run_parts`): only the missing ones run. The ledger is checked by the code itself: input =
kept + filtered + duplicates + quarantined, per step and overall, before the first step that does
not pass documents on.
"""
from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from corpusmill.stages.base import write_json_atomic, write_text_atomic

from . import __version__
from .composition import build_composition
from .config import Config
from .engine import dask_client, progress_listener, release_after_every_task, release_memory
from .ledger import build_ledger, project_full_run
from .plan import build_plan
from .progress import RunProgress, utc_now
from .report import write_report
from .rundir import CONFIG_FILE, LEDGER_FILE, STAGE_DIRS, VALIDATION_SHARDS, RunDir  # noqa: F401 - STAGE_DIRS: the run directory's names
from .step import PipelineError, Step, StepContext, StepResult

Log = Callable[[str], None]


def _free_bytes(path: Path) -> Optional[int]:
    """Free bytes on the disk holding `path` (or its nearest existing parent); None when unknown."""
    import shutil

    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def free_space(path: Path) -> str:
    """Free space at `path`, for error messages."""
    free = _free_bytes(path)
    return "unknown" if free is None else f"{free / 2**20:,.0f} MiB"


def disk_nearly_full(path: Path, min_free: int = 64 << 20) -> bool:
    free = _free_bytes(path)
    return free is not None and free < min_free


def first_line(e: BaseException) -> str:
    """The line of an error that says what went wrong (MindSpore puts it under a banner, after `[ERROR]`)."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    said = next((line for line in lines if line.startswith("[ERROR]")), lines[0] if lines else type(e).__name__)
    return said[:300]


def os_error_message(stage: str, e: OSError, folder: Path) -> str:
    """One line for an OS error in a step: what failed, the path, and the free space there."""
    path = e.filename or folder
    what = e.strerror or first_line(e)
    code = f" [{errno.errorcode[e.errno]}]" if e.errno in errno.errorcode else ""
    if "://" in os.fsdecode(path):  # an object (stages/storage.py): no local disk to report on
        return f"stage {stage}: {what}{code}: {os.fsdecode(path)}"
    return f"stage {stage}: {what}{code}: {path} ({free_space(Path(os.fsdecode(path)))} free there)"


@dataclass
class RunResult:
    out: Path
    ledger: dict
    stages: dict
    train: Optional[dict] = None
    skipped: list = field(default_factory=list)


def work_dir(out: str, work: Optional[str | Path] = None) -> Path:
    """The local run directory of a run whose results go to object storage (`--out s3://...`): `work`
    when given, else a cache folder named after the URL ($CORPUSMILL_CACHE/runs/...), so that
    `--resume` with the same URL finds the steps an earlier run finished."""
    from corpusmill.stages import storage

    return Path(work) if work else storage.cache_dir("runs", out)


class Pipeline:
    """One run of a job's plan into `out`: a local run directory, or an object-storage URL, whose
    run directory is then local (`work`, default `work_dir`) and whose results are published to
    the URL when the run ends (`rundir.publish`)."""

    def __init__(self, cfg: Config, out: str | Path, *, resume: bool = False, client=None, log: Log = print,
                 job: str = "run", export_format: str = "parquet", work: Optional[str | Path] = None):
        from corpusmill.stages import storage

        self.plan = build_plan(cfg, job)
        self.publish_url = str(out) if storage.is_url(str(out)) else None
        out = work_dir(str(out), work) if self.publish_url else out
        self.cfg, self.out, self.resume, self.log = cfg, Path(out), resume, log
        self.job, self.export_format = job, export_format
        self.rundir = RunDir(self.out)
        self.client_arg = client
        self.results: dict[str, StepResult] = {}
        self.progress: Optional[RunProgress] = None

    def planned_stages(self) -> list[str]:
        """The steps this run will go through, in order."""
        return self.plan.names()

    # ---- the results so far, as the ledger and report read them ------------------------------
    @property
    def stats(self) -> dict[str, dict]:
        return {name: r.stats for name, r in self.results.items()}

    def _outputs(self) -> dict[str, dict]:
        return {name: r.outputs_json() for name, r in self.results.items() if r.outputs}

    def _seconds(self) -> dict[str, float]:
        return {name: r.seconds for name, r in self.results.items()}

    def _document_steps(self) -> dict[str, str]:
        """The document steps run so far, in order, each with what its removals count as."""
        return {s.name: s.removes for s in self.plan.steps if s.counts_documents and s.name in self.results}

    # ---- running ----------------------------------------------------------------------------
    def run(self) -> RunResult:
        self.out.mkdir(parents=True, exist_ok=True)
        self.progress = RunProgress(self.out, self.job, self.planned_stages())
        token = progress_listener.set(self.progress.tasks)
        try:
            try:
                result = self._run()
            except OSError as e:  # outside a step body: the run directory's own files
                raise PipelineError(os_error_message(self.progress.doc.get("stage") or "setup", e, self.out)) from None
        except KeyboardInterrupt:
            self.progress.finished(error="interrupted", interrupted=True)
            raise
        except BaseException as e:
            self.progress.finished(error=f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)
            raise
        finally:
            progress_listener.reset(token)
        self.progress.finished()
        return result

    def _run(self) -> RunResult:
        if self.publish_url:
            from corpusmill.stages import storage

            storage.check_writable(self.publish_url)  # a missing bucket or a denied write: before any work
            self.log(f"run directory {self.out} (local work); results are published to {self.publish_url} at the end")
        write_text_atomic(self.rundir.file(CONFIG_FILE), self.cfg.to_yaml())
        started = time.perf_counter()
        self._preflight()
        links = self.plan.links(self.cfg)  # expands the inputs: a missing one stops here, before the cluster starts
        with dask_client(self.cfg.cluster, self.client_arg, self.log) as client:
            release_after_every_task(client)
            ctx = StepContext(self.cfg, self.rundir, client, self.log, {s.name: s for s in self.plan.steps}, links,
                              self.results, export_format=self.export_format)
            self.n_workers = ctx.n_workers
            ledger_checked = False
            for step in self.plan.steps:
                if not step.counts_documents and not ledger_checked:
                    doc_steps = self._document_steps()
                    build_ledger(self.stats, doc_steps)  # checked before the long work after it
                    ledger_checked = True
                    if self.job == "run" and not self.stats[list(doc_steps)[-1]]["docs_out"]:
                        self._finish_empty(started)
                self._execute(step, ctx, links.get(step.name))
        ledger = self._final_ledger(started)
        train_summary = self._train(started, ledger) if self.plan.train else None
        write_json_atomic(self.rundir.file(LEDGER_FILE), ledger)
        write_report(self.out, ledger, self.stats, self._outputs(), self._seconds(), train_summary)
        self._publish()
        return RunResult(self.out, ledger, self.stats, train_summary, [n for n, r in self.results.items() if r.skipped])

    def _execute(self, step: Step, ctx: StepContext, link: Optional[str]) -> None:
        """Run one step into a fresh folder, unless its marker says it is done with this link (a step
        that is not resumable has no folder or marker of its own and runs every time)."""
        if step.resumable and self.resume and self._reuse(step, link):
            return
        if step.name in ("pack", "shard") and self.cfg.mix.sources and "tokenize" in self.results:
            self._check_mix_plan()
        folder = self.out
        if step.resumable and self.resume:
            folder, kept = self.rundir.resume_folder(step.name, link or "")
            if kept:
                self.log(f"[{step.name}] resuming: {kept} task(s) finished in an earlier try are kept")
        elif step.resumable:
            folder = self.rundir.fresh_folder(step.name)
        ctx.begin(step, folder if step.resumable else None, link)
        self._progress("stage_started", step.name)
        started = time.perf_counter()
        try:
            result = step.execute(ctx, folder)
        except OSError as e:
            raise PipelineError(os_error_message(step.name, e, folder)) from None
        except (PipelineError, KeyboardInterrupt):
            raise
        except Exception as e:
            # MindSpore's writer and Arrow wrap a full disk in their own errors: name it when it is the cause
            if disk_nearly_full(folder):
                raise PipelineError(f"stage {step.name}: no space left on device: {folder} ({free_space(folder)} free "
                                    f"there); the step failed with {type(e).__name__}: {first_line(e)}") from None
            raise
        result.seconds = time.perf_counter() - started
        self.results[step.name] = result
        if step.resumable:
            self.rundir.write_marker(step.name, {
                "stage": step.name,
                "config_hash": link,
                "stats": result.stats,
                "outputs": result.outputs_json(),
                "seconds": result.seconds,
                "finished_utc": utc_now(),
            })
        self._progress("stage_finished", step.name, result.seconds)
        if step.resumable:
            self.log(f"[{step.name}] {step.summary(result.stats)} in {result.seconds:.1f}s")
        # what the step freed but the allocators kept, in the driver and on every worker (a step's Dask
        # shuffles and its driver-side merges are not tasks that `run_tasks` follows with a release)
        release_memory()
        ctx.on_every_worker(release_memory)

    def _check_mix_plan(self) -> None:
        """The mixture's plan against the memory and disk it will take, from the tokenize step's real
        counts (the preflight could only bound them by the input): one line naming the rule instead of
        an allocation failure in the plan; the steps done so far are kept (--resume after lowering it)."""
        from corpusmill.trainer.memory import available_memory

        from .doctor import mix_plan_problem

        problem = mix_plan_problem(self.cfg, self.stats["tokenize"], available_memory(), _free_bytes(self.out))
        if problem:
            raise PipelineError(problem)

    def _reuse(self, step: Step, link: Optional[str]) -> bool:
        """Take the step's result from its marker when an earlier run finished it with this link."""
        marker = self.rundir.marker(step.name)
        if marker is None or marker.get("config_hash") != link:
            return False
        result = StepResult(marker["stats"], marker.get("outputs", marker.get("extra", {})), marker.get("seconds", 0.0),
                            skipped=True)
        self.results[step.name] = result
        self._progress("stage_finished", step.name, result.seconds, skipped=True)
        self.log(f"[{step.name}] done in an earlier run (config unchanged): {step.summary(result.stats)}; skipped")
        return True

    def _publish(self) -> None:
        """`--out URL`: the results uploaded, each checked, the manifest last (rundir.publish)."""
        if self.publish_url:
            from .rundir import publish

            self._progress("stage_started", "publish")
            t0 = time.perf_counter()
            publish(self.out, self.publish_url, self.job, self.log)
            self._progress("stage_finished", "publish", time.perf_counter() - t0)

    def _progress(self, event: str, *args, **kwargs) -> None:
        if self.progress is not None:
            getattr(self.progress, event)(*args, **kwargs)

    def _train(self, started: float, ledger: dict) -> dict:
        """Hand the shards to the training loop (in this process: a fork after MindSpore deadlocks)."""
        from corpusmill.trainer.train import train

        self.log("[train] starting")
        self._progress("stage_started", "train")
        t0 = time.perf_counter()
        validation = self.rundir.file(VALIDATION_SHARDS)
        summary = train(str(self.rundir.folder("shard")), str(self.out / "train"), self.cfg.train, log=self.log,
                        validation_dir=str(validation) if validation.is_dir() else None)
        self._progress("stage_finished", "train", time.perf_counter() - t0)
        ledger["run"]["wall_s"] = time.perf_counter() - started
        return summary

    # ---- the ledger -------------------------------------------------------------------------
    def _final_ledger(self, started: float) -> dict:
        ledger = build_ledger(self.stats, self._document_steps())
        ledger["run"] = {
            "corpusmill_version": __version__,
            "finished_utc": utc_now(),
            "wall_s": time.perf_counter() - started,
            "seconds_per_stage": self._seconds(),
            "resumed_stages": [n for n, r in self.results.items() if r.skipped],
        }
        found = build_composition(self.rundir, self.stats, self._document_steps())
        if found:
            ledger["composition"] = found
        if self.cfg.input.sample < 1.0:
            ledger["sample"] = project_full_run(ledger, self.stats, self.cfg.input.sample, self.cfg.input.sample_seed,
                                                n_workers=self.n_workers)
        return ledger

    def _finish_empty(self, started: float) -> None:
        """No document survived the document steps: the ledger and report still tell where every
        input document went, and the run stops with one clear message instead of sharding nothing."""
        ledger = self._final_ledger(started)
        write_json_atomic(self.rundir.file(LEDGER_FILE), ledger)
        write_report(self.out, ledger, self.stats, self._outputs(), self._seconds(), None)
        self._publish()
        raise PipelineError(
            f"nothing to tokenize and shard: of {ledger['input']:,} input documents {ledger['filtered']:,} were "
            f"filtered, {ledger['duplicates']:,} were duplicates and {ledger['quarantined']:,} were quarantined "
            f"(see {self.out / 'report.md'})")

    def _preflight(self) -> None:
        """`corpusmill doctor`'s checks for this config (all but mindspore.run_check, which the doctor
        runs in a child process): warnings are logged, any error stops the run before work starts."""
        from .doctor import ERROR, OK, WARNING, run_checks

        checks = run_checks(self.cfg, str(self.out), mindspore=False, steps=set(self.plan.names()))
        plan = next((c for c in checks if c.name == "memory"), None)
        if plan is not None:  # the resource plan, printed before any work (pipeline/resources.py)
            self.log("resource plan: " + plan.detail)
        for c in checks:  # what a repeating mixture rule may cost at most, before any work
            if c.name == "mixture" and c.status == OK:
                self.log("mixture bound: " + c.detail)
        for c in checks:
            if c.status == WARNING:
                self.log(f"  preflight warning: {c.name}: {c.detail} (fix: {c.fix})")
        failed = [c for c in checks if c.status == ERROR]
        if failed:
            raise PipelineError("preflight checks failed (see `corpusmill doctor`):\n" +
                                "\n".join(f"  {c.name}: {c.detail}\n    fix: {c.fix}" for c in failed))
