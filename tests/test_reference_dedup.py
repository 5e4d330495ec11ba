"""Dedup against earlier runs: a corpus deduplicated as two runs (the second referencing the first's
index) loses the same documents as one run over both, and the first run is left untouched."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from corpusmill.pipeline.step import PipelineError
from tests.corpora import dedup_run, reference_halves


def _removed(out: Path) -> dict[str, tuple]:
    rows = {}
    for f in sorted((out / "removed").glob("*.parquet")):
        for r in pq.read_table(f, columns=["id", "reason", "duplicate_of"]).to_pylist():
            rows[r["id"]] = (r["reason"], r["duplicate_of"])
    return rows


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(folder)).encode() + p.read_bytes() + str(p.stat().st_mtime_ns).encode())
    return h.hexdigest()


def test_two_runs_with_a_reference_remove_what_one_run_over_both_removes(tmp_path, dask_client):
    a, b = reference_halves(tmp_path / "corpus")
    first = dedup_run([a], tmp_path / "first", dask_client, write_index=True)
    before = _digest(first)
    second = dedup_run([b], tmp_path / "second", dask_client, reference=[str(first)])
    both = dedup_run([a, b], tmp_path / "both", dask_client)
    assert _digest(first) == before  # the earlier run is only read
    one_run, two_runs = _removed(both), {**_removed(first), **_removed(second)}
    assert set(one_run) == set(two_runs)
    earlier = {k: v for k, v in _removed(second).items() if v[0].endswith("_earlier_run")}
    assert {k for k, v in earlier.items() if v[0] == "exact_earlier_run"} == {f"b-exact{i}" for i in range(0, 16, 4)}
    assert {k for k, v in earlier.items() if v[0] == "near_earlier_run"} == {f"b-near{i}" for i in range(1, 16, 4)}
    assert earlier["b-near5"][1] == f"{first}::a5" and earlier["b-exact0"][1] == f"{first}::a0"
    assert _removed(second)["b-dup40"][0] == "exact"  # duplicates within the new run: its own dedup


def test_a_reference_without_an_index_is_one_clear_error(tmp_path, dask_client):
    a, _ = reference_halves(tmp_path / "corpus")
    with pytest.raises(PipelineError, match="no dedup index"):
        dedup_run([a], tmp_path / "out", dask_client, reference=[str(tmp_path / "missing")])
