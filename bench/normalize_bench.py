"""The normalize step's kernel, side by side in one process on real text: the compiled path
(`clean_and_fold`, NFKC only where `_needs_nfkc` says it may change a text) against the passes it
replaced (six RE2 passes, NFKC's Python round trip for every non-ASCII text), rounds alternating
A B B A. Every text must come out the same; the figure is CPU seconds.

    python bench/normalize_bench.py PARTS_GLOB [--rounds 2]

PARTS_GLOB: Parquet parts with a `text` column, e.g. a run's '00-read/part-*.parquet'.
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import time

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from corpusmill.stages import normalize as N
from corpusmill.stages.base import one_array


@contextlib.contextmanager
def regex_passes():
    """normalize_array as it was: the RE2 passes, and NFKC tried on every non-ASCII text."""
    fold, needs = N.clean_and_fold, N._needs_nfkc
    N.clean_and_fold = N.clean_and_fold_regex
    N._needs_nfkc = lambda arr, keep: pc.invert(pc.fill_null(pc.string_is_ascii(arr), True)).to_numpy(zero_copy_only=False)
    try:
        yield
    finally:
        N.clean_and_fold, N._needs_nfkc = fold, needs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("parts")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    arrays = [one_array(pq.read_table(p, columns=["text"]).column("text")) for p in sorted(glob.glob(args.parts))]
    mb = sum(pc.sum(pc.binary_length(a)).as_py() or 0 for a in arrays) / 1e6
    N.normalize_array(arrays[0][:10])  # compile (or load) the loops and tables outside the timing
    seconds: dict[str, list[float]] = {"regex passes": [], "compiled": []}
    outputs: dict[str, list] = {}
    for r in range(args.rounds):
        for name in (["regex passes", "compiled"] if r % 2 == 0 else ["compiled", "regex passes"]):
            ctx = regex_passes() if name == "regex passes" else contextlib.nullcontext()
            with ctx:
                started = time.process_time()
                out = [N.normalize_array(a) for a in arrays]
                seconds[name].append(time.process_time() - started)
            outputs.setdefault(name, out)
    same = all(a.equals(b) for a, b in zip(outputs["regex passes"], outputs["compiled"]))
    old, new = np.median(seconds["regex passes"]), np.median(seconds["compiled"])
    print(f"{len(arrays)} parts, {sum(len(a) for a in arrays):,} texts, {mb:,.1f} MB; identical output: {same}")
    print(f"regex passes {old:.2f} CPU s ({mb / old:.1f} MB/s), compiled {new:.2f} CPU s ({mb / new:.1f} MB/s): "
          f"{old / new:.2f}x (medians of {args.rounds})")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
