"""`dedup --against` an earlier run whose dedup index files are damaged: each damage (a file cut in
half, deleted, replaced by garbage of the same size, an extra file in the exact hashes' folder, an
index written before checksums were recorded with a cut file) stops the run in the preflight with one
line naming the file and what is wrong, before the read step starts; the intact index passes."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from corpusmill.pipeline.config import parse_config
from corpusmill.pipeline.runner import Pipeline
from corpusmill.pipeline.step import PipelineError
from tests.corpora import dedup_run, reference_halves

INDEX = "04b-dedup_index"


@pytest.fixture(scope="module")
def first(tmp_path_factory, dask_client) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("refdamage")
    a, b = reference_halves(d / "corpus")
    return dedup_run([a], d / "first", dask_client, write_index=True), b


def _cut(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _garbage(p: Path) -> None:
    p.write_bytes(os.urandom(p.stat().st_size))  # the same size: only the checksum tells


def _old_index(run: Path) -> None:
    index = json.loads((run / INDEX / "index.json").read_text())
    index.pop("files")
    (run / INDEX / "index.json").write_text(json.dumps(index))


def _first_exact(run: Path) -> Path:
    return sorted((run / INDEX / "exact").glob("*.parquet"))[0]


def _signature(run: Path) -> Path:
    return run / json.loads((run / INDEX / "index.json").read_text())["near"]["signatures"][0]


def _text(run: Path) -> Path:
    return run / json.loads((run / INDEX / "index.json").read_text())["near"]["texts"][0]


DAMAGES = {
    "exact hashes cut in half": (lambda r: _cut(_first_exact(r)), _first_exact, "bytes"),
    "exact hashes deleted": (lambda r: _first_exact(r).unlink(), _first_exact, "missing"),
    "keepers replaced by garbage": (lambda r: _garbage(r / INDEX / "keepers.parquet"),
                                    lambda r: r / INDEX / "keepers.parquet", "checksum"),
    "signatures cut in half": (lambda r: _cut(_signature(r)), _signature, "bytes"),
    "texts replaced by garbage": (lambda r: _garbage(_text(r)), _text, "checksum"),
    "a foreign file among the exact hashes": (lambda r: shutil.copy(_first_exact(r), r / INDEX / "exact" / "zz.parquet"),
                                              lambda r: r / INDEX / "exact" / "zz.parquet", "not written by that run"),
    "index.json replaced by garbage": (lambda r: (r / INDEX / "index.json").write_bytes(b"\x00garbage{"),
                                       lambda r: r / INDEX / "index.json", "cannot be read"),
    "an older index (no checksums) with signatures cut": (lambda r: (_old_index(r), _cut(_signature(r))), _signature,
                                                          "not a readable Parquet file"),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_reference_index_is_one_line_before_any_work(first, tmp_path, damage):
    run, b = first
    copy = tmp_path / "first"
    shutil.copytree(run, copy)
    named = DAMAGES[damage][1](copy)  # the file, found before it is damaged
    DAMAGES[damage][0](copy)
    cfg = parse_config({"input": {"paths": [str(b)]}, "dedup": {"minhash": {"threshold": 0.7}, "reference": [str(copy)]}})
    out = tmp_path / "second"
    with pytest.raises(PipelineError) as e:
        Pipeline(cfg, out, log=lambda m: None, job="dedup").run()  # no cluster: the preflight stops it first
    lines = [x for x in str(e.value).splitlines() if "dedup.reference[0]" in x]
    assert len(lines) == 1 and str(named) in lines[0] and DAMAGES[damage][2] in lines[0], str(e.value)
    assert "Traceback" not in str(e.value) and not (out / "00-read").exists()


def test_the_intact_index_records_every_file_it_names_and_passes(first):
    from corpusmill.pipeline.steps.dedup.reference import verify_reference

    run, _ = first
    index = json.loads((run / INDEX / "index.json").read_text())
    named = {*index["near"]["signatures"], *index["near"]["texts"], f"{INDEX}/keepers.parquet",
             *(str(p.relative_to(run)) for p in (run / INDEX / "exact").glob("*.parquet"))}
    assert set(index["files"]) == named and all(v["bytes"] == (run / k).stat().st_size for k, v in index["files"].items())
    problems, summary = verify_reference(str(run))
    assert problems == [] and f"{len(named)} files match" in summary
