"""`num_parallel_workers: auto`: measure MindDataset read rates for candidate worker counts at
start-up, pick the fastest (clamped to the CPU count, which MindSpore enforces), and cache the
choice per shard set and machine so later runs skip the measurement."""
from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from pathlib import Path
from typing import Callable

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "corpusmill" / "num_parallel_workers.json"


def candidates(cpus: int) -> list[int]:
    out, n = [], 1
    while n < cpus:
        out.append(n)
        n *= 2
    return sorted(set(out + [cpus]))


def cache_key(manifest_path: str, batch_size: int) -> str:
    digest = hashlib.sha256(Path(manifest_path).read_bytes()).hexdigest()[:16]
    return f"{digest}:{batch_size}:{platform.node()}:{os.cpu_count()}"


def measure(files: list[str], sharding: dict, batch_size: int, workers: int, batches: int = 40) -> float:
    """Batches per second read through MindDataset with `workers` reader threads."""
    import mindspore.dataset as ds

    data = ds.MindDataset(files, columns_list=["input_ids"], shuffle=True, num_parallel_workers=workers, **sharding)
    data = data.batch(batch_size, drop_remainder=True)
    n = min(batches, data.get_dataset_size())
    it = data.create_tuple_iterator(output_numpy=True, num_epochs=1)
    next(it)  # pipeline start-up is not reading speed
    start = time.perf_counter()
    for _ in range(max(1, n - 1)):
        try:
            next(it)
        except StopIteration:
            break
    return max(1, n - 1) / max(time.perf_counter() - start, 1e-9)


def choose(files: list[str], sharding: dict, batch_size: int, manifest_path: str,
           log: Callable[[str], None] = print, cache: Path = CACHE) -> tuple[int, dict]:
    """(chosen count, {count: batches/s}) from the cache or a fresh measurement."""
    key = cache_key(manifest_path, batch_size)
    known = json.loads(cache.read_text()) if cache.is_file() else {}
    if key in known:
        log(f"train: num_parallel_workers {known[key]['chosen']} (cached for this shard set and machine: "
            f"{known[key]['rates']} batches/s)")
        return int(known[key]["chosen"]), {int(k): v for k, v in known[key]["rates"].items()}
    rates = {n: round(measure(files, sharding, batch_size, n), 1) for n in candidates(os.cpu_count() or 1)}
    best = max(rates.values())
    chosen = min(n for n, r in rates.items() if r >= 0.95 * best)  # fewest threads within 5% of the best
    log(f"train: num_parallel_workers auto -> {chosen} (measured batches/s: {rates})")
    known[key] = {"chosen": chosen, "rates": rates}
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(f".tmp-{os.getpid()}")  # data-parallel ranks may write at once
    tmp.write_text(json.dumps(known, indent=1))
    os.replace(tmp, cache)
    return chosen, rates
