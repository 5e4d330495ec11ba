"""The resource plan: partitions, peak memory per worker and in the driver, and disk, worked out from
the input's file sizes and the config before any work starts.

`corpusmill doctor --config` prints it and every run logs it in its preflight; a plan whose peak in
one worker does not fit that worker's memory limit is refused before the cluster does any work,
naming the setting to change (`input.part_size_mb`, `cluster.n_workers` / `cluster.memory_limit`,
`cluster.threads_per_worker`, `dedup.components_memory_mb`). The factors were measured (peak RSS of
every process, sampled per step, at 4 and 16 MB partitions on the 78 MB real subset, and at 32 MB
partitions on 0.1 to 5 GB on both engines: bench/README.md, "Resource plan" and "Flat memory");
they are upper bounds of what was seen, not averages. A worker's RSS does not fall back between
steps (the allocator keeps what it freed), so a step's fixed part includes what the steps before it
left. The shard step writes its files in helper processes of the worker (`pipeline.isolated`), one
per worker thread: they run beside what the worker kept after the earlier steps gave their memory
back (`FLOOR_SHARE`), so the step is planned as that floor plus its helpers. Dask's memory limit
measures the worker process alone; the plan counts the helpers with it, as the machine holds both.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Optional

MiB, GiB = 2**20, 2**30

WORKER_BASE = 230 * MiB  # a worker process after reading: Python, pandas, pyarrow, dask, distributed
# a MindRecord writer helper process: a fresh interpreter with numpy, pyarrow and MindSpore's writer
# and reader, and the mapped parts it gathers from (peak 523 MB at 0.5 GB with its chunk and commit)
SHARD_HELPER = 520 * MiB
SHARD_COMMIT_BYTES_PER_SAMPLE = 1400  # FileWriter.commit builds the file's index in memory: 1.3 KB a sample measured
# what a worker keeps between steps after it gave memory back, as a share of its largest earlier
# step above WORKER_BASE: 0.27 at 0.5 GB, 0.52 at 5 GB measured (Dask's own bookkeeping, a fragmented heap)
FLOOR_SHARE = 0.6
# bytes in a worker per byte of the partition's text (Arrow text, pandas copies, scores, outputs)
DOCUMENT_STEP_FACTOR = 6.0  # read, normalize, filter
SIGNATURE_FACTOR = 6.0  # near-dup shingling + signatures of one partition
TOKENIZE_FACTOR = 8.0  # a 2 MB slice: text, ids, offsets, the Arrow output
# what a step holds besides its partition, the same at 4 and 16 MB partitions (bench/README.md)
# the scoring tables, the broadcast boilerplate line hashes, the line-count groupby; and the heap a
# worker keeps growing over its tasks (cause not found): 540 MiB covered 8 partitions per worker,
# 85 (5 GB at 32 MB partitions, two workers) peaked at 1,212 MB in all
FILTER_FIXED = 800 * MiB
SIGNATURE_FIXED = 420 * MiB  # permutations, compiled shingling, the candidate and verification frames
TOKENIZE_FIXED = 240 * MiB  # the tokenizer library and model, and what the dedup steps left in the worker
DRIVER_BASE = 490 * MiB  # the driver: the CLI, the Dask client, a LocalCluster's scheduler and nanny threads
TOKENS_PER_TEXT_BYTE = 0.4  # upper end over the real corpus's English and Chinese with the shipped tokenizers
PACK_BYTES_PER_GROUP_ID = 24  # a pack group's ids gathered, its windows, the output table, mapped parts
SHARD_BYTES_PER_ID_HELD = 3  # a chunk of windows as int32, its labels copy, and MindRecord's own page buffer
DOC_ORDER_BYTES = 40  # the driver's pack order: uid, key, length and part per document (pad, best_fit, mix)
ORDER_DRIVER_BYTES = 8 * MiB  # concat's range-partitioned order: per-bucket totals of every part, whatever the corpus
EDGE_BYTES_PER_DOC = 64  # near-duplicate edges (16 bytes each) per document, generously: most have none
TEXT_BYTES_PER_DOC = 2500  # for counting documents from file sizes when nothing better is known
STAGE_BYTES_PER_INPUT_BYTE = 3.0  # disk: the document steps' zstd Parquet, the token and pack parts
SHARD_BYTES_PER_INPUT_BYTE = 1.3  # disk: the MindRecord files
FIT_SHARE = 0.8  # Dask pauses a worker at 80% of its limit (and kills it at 95%): a plan must stay under


@dataclass
class Peak:
    """The largest memory one process needs during one step (the shard step's: a worker with its
    writer helpers), and the setting that moves it."""

    step: str
    bytes: int
    setting: str


@dataclass
class ResourcePlan:
    input_bytes: int
    text_bytes: int  # after the sample
    partitions: int
    part_bytes: int
    workers: int
    worker_limit: Optional[int]  # bytes per worker process; None when unknown
    peaks: list[Peak] = field(default_factory=list)  # per worker process (with its helpers in the shard step)
    driver: list[Peak] = field(default_factory=list)  # in the driver (this process)
    disk_bytes: int = 0

    def worst(self) -> Peak:
        return max(self.peaks, key=lambda p: p.bytes)

    def fits(self) -> bool:
        return self.worker_limit is None or self.worst().bytes <= FIT_SHARE * self.worker_limit

    def lines(self) -> list[str]:
        limit = f"{_gib(self.worker_limit)} limit each" if self.worker_limit else "limit unknown"
        out = [f"{_mib(self.input_bytes)} of input ({_mib(self.text_bytes)} after the sample) -> about "
               f"{self.partitions} partitions of {_mib(self.part_bytes)}; {self.workers} worker processes, {limit}",
               "peak per worker: " + ", ".join(f"{p.step} {_gib(p.bytes)}" for p in self.peaks),
               "peak in the driver: " + ", ".join(f"{p.step} {_gib(p.bytes)}" for p in self.driver),
               f"disk: about {_gib(self.disk_bytes)} for the run directory"]
        return out

    def refusal(self) -> Optional[str]:
        """None when the plan fits; else what does not fit and which setting to change."""
        if self.fits():
            return None
        p = self.worst()
        where = "one worker and its MindRecord writer helpers" if p.step == "shard" else "one worker"
        return (f"the {p.step} step needs about {_gib(p.bytes)} in {where}, more than {int(FIT_SHARE * 100)}% of "
                f"its {_gib(self.worker_limit)} memory limit (Dask pauses the worker there and kills it at 95%): "
                f"lower {p.setting}")


def plan_resources(cfg: Any, input_bytes: int, *, workers: Optional[int] = None,
                   worker_limit: Optional[int] = None, total_memory: Optional[int] = None) -> ResourcePlan:
    """The plan for `input_bytes` of input under `cfg`. For a LocalCluster the workers and their
    limit come from the config (`memory_limit: auto` splits `total_memory`); for a cluster at an
    address the caller passes what its scheduler reports."""
    cpus = os.cpu_count() or 1
    if workers is None:
        workers = cfg.cluster.n_workers or cpus
    if worker_limit is None and not cfg.cluster.address:
        worker_limit = local_worker_limit(cfg.cluster.memory_limit, workers, total_memory)
    text = int(input_bytes * cfg.input.sample)
    part = int(cfg.input.part_size_mb * MiB)
    partitions = max(1, math.ceil(text / part))
    part = min(part, max(text, 1))  # a small corpus is one small partition
    threads = cfg.cluster.threads_per_worker
    tokens = int(text * TOKENS_PER_TEXT_BYTE)
    from corpusmill.stages.shard import SHARD_CHUNK_BYTES, capped_files_per_rank

    from .steps.tokenize import PACK_GROUP_TOKENS, TOKENIZE_SLICE_MB

    peaks = [Peak("read/normalize/filter", WORKER_BASE + FILTER_FIXED + threads * int(part * DOCUMENT_STEP_FACTOR),
                  "input.part_size_mb (or cluster.threads_per_worker)")]
    if cfg.dedup.minhash.enabled or cfg.dedup.simhash.enabled:
        peaks.append(Peak("near_dedup signatures", WORKER_BASE + SIGNATURE_FIXED + threads * int(part * SIGNATURE_FACTOR),
                          "input.part_size_mb"))
    model = os.path.getsize(cfg.tokenizer.model) if cfg.tokenizer.model and os.path.isfile(cfg.tokenizer.model) else 0
    peaks.append(Peak("tokenize", WORKER_BASE + TOKENIZE_FIXED + threads * int(TOKENIZE_SLICE_MB * MiB * TOKENIZE_FACTOR + 3 * model),
                      "cluster.threads_per_worker"))
    group = min(PACK_GROUP_TOKENS, max(tokens, 1))
    peaks.append(Peak("pack", WORKER_BASE + threads * group * PACK_BYTES_PER_GROUP_ID, "cluster.threads_per_worker"))
    windows = tokens // (cfg.pack.seq_length + 1) + 1
    per_rank = max(1, windows // max(1, cfg.shard.ranks))
    # the writer opens more files rather than hold more in one
    files_per_rank = capped_files_per_rank(per_rank, cfg.shard.files_per_rank, cfg.shard.max_samples_per_file)
    files = cfg.shard.ranks * files_per_rank
    per_file = -(-per_rank // files_per_rank)
    held = min(SHARD_CHUNK_BYTES, 4 * tokens // files)  # a file is gathered and written a chunk at a time
    carried = max(peaks, key=lambda p: p.bytes)  # the worker's floor beside its helpers comes from this step
    floor = WORKER_BASE + int(FLOOR_SHARE * (carried.bytes - WORKER_BASE))
    helper = SHARD_HELPER + SHARD_BYTES_PER_ID_HELD * held + SHARD_COMMIT_BYTES_PER_SAMPLE * per_file + 16 * windows
    lever = carried.setting.split(" (")[0]
    setting = f"{lever} (it sets what the {carried.step} step leaves in the worker)"
    if lever != "cluster.threads_per_worker":
        setting += ", cluster.threads_per_worker"
    setting += " or shard.max_samples_per_file"
    peaks.append(Peak("shard", floor + threads * helper, setting))
    docs = max(1, text // TEXT_BYTES_PER_DOC)
    if cfg.pack.shuffle_documents and (cfg.pack.mode != "concat" or cfg.mix.sources):
        # pad, best_fit and a mixture order the whole corpus in the driver; concat is range-partitioned
        driver = [Peak("pack order", DRIVER_BASE + docs * DOC_ORDER_BYTES, "input.sample (a smaller run)")]
    else:
        driver = [Peak("pack order", DRIVER_BASE + ORDER_DRIVER_BYTES, "pack.mode")]
    if cfg.dedup.minhash.enabled or cfg.dedup.simhash.enabled:
        edges = min(cfg.dedup.components_memory_mb * MiB, docs * EDGE_BYTES_PER_DOC)  # above the budget: on Dask
        driver.append(Peak("near-dup components", DRIVER_BASE + 3 * edges, "dedup.components_memory_mb"))
    if not cfg.tokenizer.model:
        driver.append(Peak("tokenizer training", DRIVER_BASE + cfg.tokenizer.train.max_sample_mb * MiB * 4,
                           "tokenizer.train.max_sample_mb"))
    disk = int(text * (STAGE_BYTES_PER_INPUT_BYTE + SHARD_BYTES_PER_INPUT_BYTE))
    plan = ResourcePlan(input_bytes, text, partitions, part, workers, worker_limit, peaks, driver, disk)
    if not cfg.cluster.address:  # on a LocalCluster, fewer workers get more memory each
        for p in plan.peaks:
            p.setting += ", or set fewer cluster.n_workers or a larger cluster.memory_limit"
    return plan


def local_worker_limit(memory_limit: str, workers: int, total_memory: Optional[int] = None) -> Optional[int]:
    """Bytes per LocalCluster worker as Dask will set it: 'auto' splits the machine's memory."""
    from dask.utils import parse_bytes

    if memory_limit in ("auto", None):
        if total_memory is None:
            from distributed.system import MEMORY_LIMIT as total_memory
        return int(total_memory // max(1, workers))
    if str(memory_limit) in ("0", "None"):
        return None
    return int(parse_bytes(memory_limit))


def cluster_workers(address: str, timeout: float = 5) -> tuple[int, Optional[int]]:
    """(workers, the smallest worker memory limit) a running scheduler reports."""
    from distributed import Client

    with Client(address, timeout=timeout) as client:
        workers = client.scheduler_info().get("workers", {})
    limits = [w.get("memory_limit") for w in workers.values() if w.get("memory_limit")]
    return len(workers), (min(limits) if limits else None)


def _mib(n: int) -> str:
    return f"{n / MiB:,.0f} MiB"


def _gib(n: Optional[int]) -> str:
    return "?" if n is None else f"{n / GiB:.2f} GiB"
