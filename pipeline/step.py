"""The step contract: what a step declares, what it is given, and what it returns.

A step is one module in `pipeline/steps/` and one line in `pipeline/plan.py`. It declares its name,
the step whose parts it reads, the config sections that form its link of the resume hash chain,
whether it counts documents (then the ledger checks it), the counters its stats must hold and the
outputs later steps may read. The runner calls `Step.execute` with a `StepContext`, which gives the
step exactly what it may use: the config, the run directory, the Dask client behind `map_parts`,
`run` and `compute` (all of which report progress), a log, and the finished results of earlier
steps, read-only. Kernels (`stages/`) never see any of this: a step wires them over partitions.
See docs/architecture.md.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, ClassVar, Mapping, Optional

import numpy as np
import pyarrow.parquet as pq
from dask import delayed
from pydantic import BaseModel

from corpusmill.stages.base import merge_stats, write_table_atomic

from .config import Config
from .engine import follow, run_tasks
from .executor import run_batch_part
from .ledger import FILTERED
from .rundir import TASKS, RunDir, file_stamp, read_task_marker

Log = Callable[[str], None]

TEXT_PER_PARQUET_BYTE = 3  # zstd Parquet of text is about a third of the text's size


class PipelineError(RuntimeError):
    """A run could not complete; the message says which step and why, in words a user can act on."""


@dataclass
class StepResult:
    """What a finished step leaves for the ledger, the report and later steps."""

    stats: dict[str, Any]
    outputs: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    skipped: bool = False  # finished in an earlier run with the same config hash

    def outputs_json(self) -> dict[str, Any]:
        """The outputs as the marker and the report keep them (dataclasses as dicts)."""
        return {k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for k, v in self.outputs.items()}


class Step:
    """One step of a run. Subclasses set the class attributes and implement `run`."""

    name: ClassVar[str]
    config_sections: ClassVar[tuple[str, ...]] = ()  # the sections hashed into this step's link
    # the other sections it reads: what of them changes its result joins the link through `hash_extra`;
    # a section in neither is refused (`DeclaredConfig`), so no read can hide from resume
    config_reads: ClassVar[tuple[str, ...]] = ()
    uses: ClassVar[tuple[str, ...]] = ()  # other steps whose parts, folders, stats or outputs it reads, when planned
    hash_ignores: ClassVar[tuple[tuple[str, str], ...]] = ()  # (section, key) of those a later step owns alone
    counts_documents: ClassVar[bool] = False  # True: docs_in == docs_out + removed, checked by the ledger
    counters: ClassVar[tuple[str, ...]] = ()  # keys its stats always hold (the ledger, report and service read them)
    outputs: ClassVar[dict[str, type]] = {}  # what later steps and the report may read, by name and type
    resumable: ClassVar[bool] = True  # False: no folder of its own, runs every time (the dedup export)
    names_keepers: ClassVar[bool] = False  # True: its removed rows name a document of this run each duplicates

    def __init__(self, reads: Optional[str] = None):
        self.reads = reads  # the step whose parts this one reads (decided by the plan)

    def reads_steps(self) -> set[str]:
        """Every step whose results this one may read: the one it reads, those it `uses`, and any the
        plan gave it by name (a subclass adds those); `StepContext` refuses the others."""
        return {s for s in (self.reads, *self.uses) if s}

    def hash_extra(self, cfg: Config, previous: Optional[str]) -> Any:
        """What besides its config sections makes this step's result differ: by default the link of
        the step before it, so a change upstream reruns everything downstream."""
        return previous

    def run(self, ctx: "StepContext", folder: Path) -> StepResult:
        raise NotImplementedError

    def summary(self, stats: dict[str, Any]) -> str:
        """One line for the log when the step ends (or is skipped on resume)."""
        return ", ".join(f"{k} {stats[k]}" for k in self.counters if k in stats)

    def execute(self, ctx: "StepContext", folder: Path) -> StepResult:
        """`run`, or nothing when the step it reads passed on no document; then the contract is checked."""
        if self.counts_documents and self.reads and not ctx.stats(self.reads).get("docs_out", 0):
            ctx.log(f"  no documents left after {self.reads}: nothing to do")
            result = StepResult({"docs_in": 0, "docs_out": 0, "removed": {}})
        else:
            result = self.run(ctx, folder)
        if self.counts_documents:
            result.stats.setdefault("removed", {})  # a step that removed nothing may not say so
        missing = [k for k in self.counters if k not in result.stats]
        unknown = sorted(set(result.outputs) - set(self.outputs))
        if missing or unknown:
            raise PipelineError(f"step {self.name} broke its contract: counters missing {missing}, "
                                f"undeclared outputs {unknown}")
        return result


class UndeclaredConfigRead(PipelineError):
    """A step read a config section it does not declare: its result could change without its link."""


class UndeclaredStepRead(PipelineError):
    """A step read the results of a step it does not declare (`reads`, `uses`, or a name the plan gave it)."""


SECTIONS = frozenset(name for name, f in Config.model_fields.items()
                     if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel))


class DeclaredConfig:
    """The config as one step sees it (`ctx.cfg`, and `cfg` in `hash_extra`): the sections it declares
    in `config_sections` and `config_reads`, read through; any other section raises. Why: resume reuses
    a step's folder when its link is unchanged, and the link is built from what the step declares, so a
    read it does not declare is a setting whose change would silently reuse a stale result."""

    __slots__ = ("_cfg", "_step", "_allowed")

    def __init__(self, cfg: Config, step: "Step") -> None:
        cfg = cfg._cfg if isinstance(cfg, DeclaredConfig) else cfg
        object.__setattr__(self, "_cfg", cfg)
        object.__setattr__(self, "_step", step.name)
        object.__setattr__(self, "_allowed", frozenset(step.config_sections) | frozenset(step.config_reads))

    def _check(self, section: str) -> None:
        if section in SECTIONS and section not in self._allowed:
            raise UndeclaredConfigRead(
                f"step {self._step} read config section {section!r}, which it does not declare: add it to the "
                f"step's config_sections (hashed whole) or config_reads (and what changes its result to hash_extra)")

    def __getattr__(self, name: str) -> Any:
        self._check(name)
        return getattr(self._cfg, name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a step's view of the config is read-only")

    def section_hash(self, *names: str, **kwargs: Any) -> str:
        for n in names:
            self._check(n)
        return self._cfg.section_hash(*names, **kwargs)

    def __reduce__(self) -> tuple:  # a task that takes the view gets the same view on the worker
        return (_declared_again, (self._cfg, self._step, tuple(sorted(self._allowed))))


def _declared_again(cfg: Config, step: str, allowed: tuple[str, ...]) -> DeclaredConfig:
    view = object.__new__(DeclaredConfig)
    object.__setattr__(view, "_cfg", cfg)
    object.__setattr__(view, "_step", step)
    object.__setattr__(view, "_allowed", frozenset(allowed))
    return view


DOCUMENT_COUNTERS = ("docs_in", "docs_out", "removed")


def docs_summary(s: dict) -> str:
    removed = s.get("removed") or {}
    detail = ", ".join(f"{k} {v}" for k, v in sorted(removed.items()))
    return f"{s.get('docs_in', 0)} docs in -> {s.get('docs_out', 0)} out" + (f" (removed: {detail})" if detail else "")


class DocumentStep(Step):
    """A step that passes documents on: its counts enter the ledger, its removals as `removes`."""

    counts_documents = True
    counters = DOCUMENT_COUNTERS
    removes: ClassVar[str] = FILTERED  # or ledger.DUPLICATES, ledger.QUARANTINED

    def summary(self, stats: dict[str, Any]) -> str:
        return docs_summary(stats)


class StepContext:
    """What a step may use. Earlier steps' results are read-only; the client is reached only through
    `map_parts`, `run`, `persist`, `compute`, `write_partitions` (which report progress to the log and
    progress.json), `broadcast` and `on_every_worker`."""

    def __init__(self, cfg: Config, rundir: RunDir, client: Any, log: Log, steps: Mapping[str, Step],
                 links: Mapping[str, str], results: Mapping[str, StepResult], export_format: str = "parquet"):
        self.cfg, self.rundir, self.client, self.log = cfg, rundir, client, log
        self.export_format = export_format
        self._steps = steps
        self._links = MappingProxyType(dict(links))
        self._results = results
        self.n_workers = max(1, len(client.scheduler_info().get("workers", {})))
        self._step: Optional[Step] = None  # the running step (begin): what it may read
        self._task_folder: Optional[Path] = None  # the running step's folder and link: where `run_parts` commits
        self._task_link = ""

    def begin(self, step: Step, folder: Optional[Path], link: Optional[str]) -> None:
        """The runner names the step about to run: it sees the config sections it declares
        (`DeclaredConfig`), and its finished tasks are committed under its folder with its link (None:
        a step without a folder of its own, whose tasks are not kept)."""
        self.cfg = DeclaredConfig(self.cfg, step)
        self._step = step
        self._task_folder, self._task_link = folder, link or ""

    def _may_read(self, step: str) -> None:
        me = self._step
        if me is None or step == me.name or step in me.reads_steps():
            return
        raise UndeclaredStepRead(f"step {me.name} read the results of step {step}, which it does not declare: add it "
                                 f"to the step's `uses` (or pass its name from the plan)")

    # ---- earlier steps ----------------------------------------------------------------------
    def link(self, step: str) -> str:
        """The resume hash of a step of this plan (what its marker must carry to be reused)."""
        self._may_read(step)
        return self._links[step]

    def stats(self, step: str) -> Mapping[str, Any]:
        self._may_read(step)
        return MappingProxyType(self._result(step).stats)

    def output(self, step: str, name: str) -> Any:
        """An output a finished step declared, as its declared type (a dataclass is rebuilt from the
        marker's JSON when the step was resumed)."""
        self._may_read(step)
        kind = self._steps[step].outputs[name]
        value = self._result(step).outputs.get(name)
        if dataclasses.is_dataclass(kind) and isinstance(value, dict):
            return kind(**value)
        return value

    def _result(self, step: str) -> StepResult:
        if step not in self._results:
            raise PipelineError(f"a step asked for the result of {step!r}, which has not run in this plan")
        return self._results[step]

    def parts(self, step: str) -> list[str]:
        self._may_read(step)
        return self.rundir.parts(step)

    def folder(self, step: str) -> Path:
        """The folder of this step or of one it declares reading (the run directory names it)."""
        self._may_read(step)
        return self.rundir.folder(step)

    def removed_files(self, step: str) -> list[str]:
        """The removed-row files of this step or of one it declares reading."""
        self._may_read(step)
        return self.rundir.removed_files(step)

    def keeper_rows(self) -> list[str]:
        """The removed-row files of this plan's steps whose rows name, in `duplicate_of`, the document
        of this run each removed one duplicates (exact and near dedup): the clusters rehydration counts."""
        return [f for name, step in self._steps.items() if step.names_keepers for f in self.rundir.removed_files(name)]

    # ---- the cluster --------------------------------------------------------------------------
    def run(self, tasks: list, label: str) -> list:
        """Compute delayed tasks in order, with a progress line."""
        return run_tasks(self.client, tasks, label)

    def run_parts(self, tasks: list[tuple[str, Any, Optional[list[str]]]], label: str, fingerprint: str = "") -> list:
        """`run` for tasks that each write their own files into the step's folder: (key, delayed task,
        the files it writes, relative to the folder, or None when its result lists them as `files`).
        A finished task commits a marker (`_tasks/KEY.json`: the step's link, `fingerprint`, its files
        and its result) after its files, on the worker, so a run killed halfway keeps what finished and
        its resume runs only the rest. `fingerprint` names what else the files depend on (the
        tokenizer model's hash). A result that does not survive JSON unchanged is not committed."""
        folder = self._task_folder
        if folder is None:
            return self.run([task for _, task, _ in tasks], label)
        done: dict[int, Any] = {}
        todo: list[tuple[int, Any]] = []
        for i, (key, task, files) in enumerate(tasks):
            marker = folder / TASKS / f"{key}.json"
            found = read_task_marker(marker) if marker.is_file() else None
            if found and found["link"] == self._task_link and found.get("fingerprint") == fingerprint:
                done[i] = found["result"]
            else:
                todo.append((i, delayed(_commit)(task, str(folder), str(marker), self._task_link, fingerprint, files)))
        if done:
            self.log(f"  {label}: {len(done)} of {len(tasks)} tasks finished in an earlier try; running {len(todo)}")
        for (i, _), result in zip(todo, self.run([t for _, t in todo], label) if todo else []):
            done[i] = result
        return [done[i] for i in range(len(tasks))]

    def persist(self, collection: Any, label: str) -> Any:
        """Materialise a Dask collection (a shuffle, a groupby, a merge) on the workers, with a
        progress line over its output partitions (and its heartbeat while none finishes) that also
        reaches progress.json. Returns the persisted collection."""
        from distributed import futures_of

        persisted = self.client.persist(collection)
        follow(self.client, futures_of(persisted), label)
        return persisted

    def compute(self, collections: Any, label: str) -> Any:
        """`persist` with progress, then the results in the driver (a list for a list)."""
        single = not isinstance(collections, (list, tuple))
        persisted = self.persist([collections] if single else list(collections), label)
        results = self.client.compute(persisted, sync=True)
        return results[0] if single else results

    def on_every_worker(self, fn: Callable[[], Any]) -> dict:
        """`fn()` once in every worker process (a warm-up), {worker address: result}."""
        return self.client.run(fn)

    def broadcast(self, value: Any) -> Any:
        """`value` on every worker once (a sorted uid array, a set of line hashes), for tasks to share."""
        return self.client.scatter(value, broadcast=True, hash=False)

    def write_partitions(self, frame: Any, folder: Path, label: str) -> None:
        """Each partition of a Dask DataFrame as `folder/part.N.parquet` through the atomic writer (not
        Dask's own, which opens files by path and would follow a planted link); every part has the
        frame's schema, empty ones included."""
        import pyarrow as pa

        schema = pa.Schema.from_pandas(frame._meta, preserve_index=False)
        tasks = [delayed(_write_partition)(part, schema, str(Path(folder) / f"part.{i}.parquet"))
                 for i, part in enumerate(frame.to_delayed())]
        self.run(tasks, label)

    def map_parts(self, step: str, folder: Path, fn: Callable, kwargs: dict, reader: str = "pandas",
                  split_mb: Optional[float] = None, suffix: str = ".parquet", columns: Optional[list[str]] = None,
                  label: Optional[str] = None, fingerprint: str = "", balance_text: bool = False) -> tuple[dict, list]:
        """Map a batch kernel over the parts of `step` into `folder`, one resumable task per output
        (see `run_parts`). With `split_mb`, a part is cut into row slices of about that much text
        (estimated from its Parquet size), so a slow kernel spreads evenly over the workers; slice
        outputs are named so that they sort in the parts' order. `balance_text`: cut at equal text
        bytes (`text_slices`, the lengths read first) rather than equal rows; a step that turns it on
        puts it in its link, since the slices, and so the task keys, differ."""
        parts = self.parts(step)
        slices = [1] * len(parts)
        if split_mb:
            slices = [max(1, min(64, math.ceil(os.path.getsize(p) * TEXT_PER_PARQUET_BYTE / (split_mb * 2**20))))
                      for p in parts]
        balanced: dict[int, list[int]] = {}
        if balance_text:  # the lengths are read on the workers: a driver reading every part's text grew with the corpus
            cut = [i for i, k in enumerate(slices) if k > 1]
            found = self.run([delayed(text_slices)(parts[i], split_mb) for i in cut], f"{label or folder.name}: slice plan")
            balanced = dict(zip(cut, found))
        tasks = []
        for j, (p, k) in enumerate(zip(parts, slices)):
            if j in balanced:
                bounds = balanced[j]
                k = len(bounds) - 1
            elif k > 1:
                bounds = np.linspace(0, pq.ParquetFile(p).metadata.num_rows, k + 1).astype(int)
            if k == 1:
                name = Path(p).stem + suffix
                tasks.append((name, delayed(run_batch_part)(fn, p, str(folder), reader, kwargs, suffix=suffix,
                                                            columns=columns), None))
                continue
            stem = Path(p).stem
            for i in range(k):
                name = f"{stem}-s{i:02d}{suffix}"
                tasks.append((name, delayed(run_batch_part)(fn, p, str(folder), reader, kwargs,
                                                            (int(bounds[i]), int(bounds[i + 1])), name,
                                                            columns=columns), None))
        results = self.run_parts(tasks, label or folder.name, fingerprint)
        total: dict = {}
        for r in results:
            merge_stats(total, r["stats"])
        return total, results


def text_slices(path: str, split_mb: float) -> list[int]:
    """Row bounds cutting a Parquet part into slices of about `split_mb` MiB of text each, at equal
    text bytes: documents differ in size a thousandfold, and equal-row slices of a real corpus held
    0.24 to 5.7 MB each, leaving one worker with most of the text at the end. Reads only the text
    column's lengths (no Python strings)."""
    import pyarrow.compute as pc

    pieces = [pc.fill_null(pc.binary_length(batch.column(0)), 0).to_numpy(zero_copy_only=False).astype(np.int64)
              for batch in pq.ParquetFile(path).iter_batches(batch_size=4096, columns=["text"])]  # a batch at a time
    ends = np.cumsum(np.concatenate(pieces) if pieces else np.zeros(0, np.int64))
    total = int(ends[-1]) if len(ends) else 0
    k = max(1, min(64, math.ceil(total / (split_mb * 2**20))))
    cuts = np.searchsorted(ends, total * np.arange(1, k, dtype=np.float64) / k, side="left") + 1
    return sorted({0, len(ends), *np.minimum(cuts, len(ends)).tolist()})


def _commit(result: Any, folder: str, marker: str, link: str, fingerprint: str, files: Optional[list[str]]) -> Any:
    """A finished task's marker, written after its files (see `StepContext.run_parts`)."""
    import json

    files = list(files if files is not None else result.get("files", []))
    try:
        if json.loads(json.dumps(result)) != result:  # tuples, numpy numbers, int keys: not kept, the task reruns
            return result
    except (TypeError, ValueError):
        return result
    if all(os.path.isfile(os.path.join(folder, f)) for f in files):
        from corpusmill.stages.base import write_json_atomic

        stamps = [file_stamp(os.path.join(folder, f)) for f in files]
        write_json_atomic(Path(marker), {"link": link, "fingerprint": fingerprint, "files": files, "stamps": stamps,
                                         "result": result}, indent=None)
    return result


def _write_partition(df: Any, schema: Any, path: str) -> None:
    import pyarrow as pa

    write_table_atomic(pa.Table.from_pandas(df, schema=schema, preserve_index=False), Path(path))
