"""A run ends in a result or one clear line: empty results, full disks, SIGTERM, bad flags, planted
links in a run directory, and ports. Real Dask, real subprocesses of the `corpusmill` command."""
from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from corpusmill.pipeline.cli import main
from corpusmill.pipeline.config import ClusterConfig, parse_config
from corpusmill.pipeline.engine import dask_client as engine_client
from corpusmill.pipeline.runner import Pipeline, PipelineError
from tests.conftest import LENGTH_ONLY_FILTER, write_jsonl
from tests.servers import wait_until

WORDS = ("data model token corpus shard rank train window quality filter python river bread stone light garden "
         "winter music number letter paper signal memory").split()
CLI = [sys.executable, "-m", "corpusmill.pipeline.cli"]


def _doc(rng: random.Random, n: int = 40) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _progress(out: Path) -> dict:
    try:
        return json.loads((out / "progress.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _temporary_files(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*") if ".tmp" in p.name]


# ---- dedup keeps every field ------------------------------------------------------------------
def _records_with_changing_fields() -> list[dict]:
    rng = random.Random(3)
    recs = [{"id": "plain", "text": _doc(rng)}]  # the first row of the part has no extra field at all
    recs.append({"id": "dated", "text": _doc(rng), "date": "2024-05-01", "url": "https://example.org/a", "n": 3})
    recs.append({"id": "typed", "text": _doc(rng), "lang": "zh", "n": "three", "tags": ["a", 1], "nested": {"k": [1, 2]}})
    recs.append({"id": "bool", "text": _doc(rng), "flag": True, "score": 1, "big": 10**30})
    recs.append({"id": "float", "text": _doc(rng), "score": 0.5, "flag": None, "exact": 1234567890123456789})
    recs.append({"id": "mixed", "text": _doc(rng), "exact": 0.25})  # a double would lose the int above 2**53
    recs.append({"id": "copy", "text": recs[1]["text"], "other": "dropped with the duplicate"})
    return recs


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_dedup_export_keeps_every_field_of_every_document_even_when_its_type_changes(tmp_path, dask_client, fmt):
    recs = _records_with_changing_fields()
    write_jsonl(tmp_path / "in.jsonl", recs)
    cfg = parse_config({"input": {"paths": [str(tmp_path / "in.jsonl")]}})
    Pipeline(cfg, tmp_path / "out", client=dask_client, log=lambda m: None, job="dedup", export_format=fmt).run()
    kept_dir = tmp_path / "out" / "kept"
    if fmt == "jsonl":
        kept = [json.loads(line) for f in sorted(kept_dir.glob("*.jsonl")) for line in f.read_text().splitlines()]
        by_id = {r["id"]: r for r in kept}
        for rec in recs[:-1]:  # exactly as the input had every value (the copy is removed as a duplicate)
            assert {k: v for k, v in by_id[rec["id"]].items() if k != "source"} == rec
    else:
        table = pq.read_table(kept_dir)
        by_id = {r["id"]: r for r in table.to_pylist()}
        types = json.loads((kept_dir / "_fields.json").read_text())
        # one type per column over all documents; a field whose type changes is kept as JSON text
        assert types["date"] == "string" and types["score"] == "double" and types["flag"] == "bool"
        assert types["n"] == types["tags"] == types["nested"] == types["big"] == types["exact"] == "json"
        assert json.loads(by_id["float"]["exact"]) == 1234567890123456789
        assert by_id["dated"]["date"] == "2024-05-01" and by_id["dated"]["url"] == "https://example.org/a"
        assert json.loads(by_id["dated"]["n"]) == 3 and json.loads(by_id["typed"]["n"]) == "three"
        assert json.loads(by_id["typed"]["nested"]) == {"k": [1, 2]}
        assert json.loads(by_id["bool"]["big"]) == 10**30 and by_id["bool"]["flag"] is True
        assert by_id["float"]["score"] == 0.5 and by_id["bool"]["score"] == 1.0
        assert by_id["plain"]["date"] is None
    assert set(by_id) == {r["id"] for r in recs[:-1]}
    assert "other" not in next(iter(by_id.values()))  # no field invented from a removed document


# ---- empty results ----------------------------------------------------------------------------
def test_dedup_where_no_record_survives_read_writes_an_empty_valid_kept_set(tmp_path, dask_client):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"{not json\n" + b'{"text": 5}\n' + b"[1, 2]\n")
    cfg = parse_config({"input": {"paths": [str(bad)]}})
    result = Pipeline(cfg, tmp_path / "out", client=dask_client, log=lambda m: None, job="dedup").run()
    assert result.ledger["input"] == result.ledger["quarantined"] == 3 and result.ledger["kept"] == 0
    table = pq.read_table(tmp_path / "out" / "kept")
    assert table.num_rows == 0 and {"id", "text", "source"} <= set(table.column_names)
    assert _progress(tmp_path / "out")["state"] == "succeeded"


def test_run_where_every_document_is_filtered_stops_with_one_message_and_a_balanced_ledger(tmp_path, dask_client):
    write_jsonl(tmp_path / "short.jsonl", [{"id": f"s{i}", "text": "tiny"} for i in range(20)])
    cfg = parse_config({"input": {"paths": [str(tmp_path / "short.jsonl")]},
                        "filter": {"length": {"min_chars": 50}, **LENGTH_ONLY_FILTER}})
    out = tmp_path / "out"
    with pytest.raises(PipelineError, match="nothing to tokenize and shard: of 20 input documents 20 were filtered"):
        Pipeline(cfg, out, client=dask_client, log=lambda m: None).run()
    ledger = json.loads((out / "ledger.json").read_text())
    assert ledger["balanced"] and ledger["filtered"] == 20 and ledger["kept"] == 0
    assert (out / "report.md").is_file() and _progress(out)["state"] == "failed"


# ---- command-line values ----------------------------------------------------------------------
@pytest.mark.parametrize("argv, flag", [
    (["dedup", "IN", "--out", "OUT", "--threshold", "1.5"], "--threshold"),
    (["dedup", "IN", "--out", "OUT", "--sample", "0"], "--sample"),
    (["train", "--shards", "OUT", "--steps", "0"], "--steps"),
    (["train", "--shards", "OUT", "--batch-size", "0"], "--batch-size"),
    (["train", "--shards", "OUT", "--lr", "-1"], "--lr"),
])
def test_out_of_range_flag_is_one_line_naming_the_flag(tmp_path, capsys, argv, flag):
    (tmp_path / "in.jsonl").write_text('{"text": "x"}\n')
    argv = [a.replace("IN", str(tmp_path / "in.jsonl")).replace("OUT", str(tmp_path / "out")) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"corpusmill: error: {flag}: ") and "Traceback" not in err and err.count("\n") == 1


# ---- links planted in a run directory -----------------------------------------------------------
def test_links_planted_in_a_run_directory_are_replaced_never_written_through(tmp_path, dask_client):
    rng = random.Random(5)
    write_jsonl(tmp_path / "in.jsonl", [{"id": f"d{i}", "text": _doc(rng)} for i in range(30)])
    outside = tmp_path / "outside"
    outside.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    for name in ("config.yaml", "report.md", "report.html", "ledger.json", "progress.json"):
        (outside / name).write_text("precious")
        (out / name).symlink_to(outside / name)
    cfg = parse_config({"input": {"paths": [str(tmp_path / "in.jsonl")]}})
    Pipeline(cfg, out, client=dask_client, log=lambda m: None, job="dedup", resume=True).run()
    for name in ("config.yaml", "report.md", "report.html", "ledger.json", "progress.json"):
        assert (outside / name).read_text() == "precious", name
        assert not (out / name).is_symlink() and (out / name).stat().st_size > 0, name


# ---- ports --------------------------------------------------------------------------------------
def test_embedded_cluster_binds_loopback_free_ports_even_with_8787_taken():
    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", 8787))
        holder.listen()
    except OSError:
        pass  # something else holds it already: the point stands
    try:
        logs: list[str] = []
        with engine_client(ClusterConfig(n_workers=1, dashboard=True), log=logs.append) as client:
            assert client.scheduler.address.startswith("tcp://127.0.0.1:")
            link = client.dashboard_link
            assert link.startswith("http://127.0.0.1:") and ":8787/" not in link
            assert any(link in line for line in logs)  # the link is printed
    finally:
        holder.close()


# ---- a full disk, SIGTERM: the real command ---------------------------------------------------
def _write_compressible_corpus(path: Path, n: int = 8000) -> None:
    """Small on disk (zstd), large once tokenized: the preflight disk estimate passes on a small
    file system and a later stage then runs out of space."""
    import zstandard

    rng = random.Random(1)
    with open(path, "wb") as raw, zstandard.ZstdCompressor(level=3).stream_writer(raw) as f:
        for i in range(n):
            f.write((json.dumps({"id": f"d{i}", "text": _doc(rng, 60)}) + "\n").encode())


def _corpus_config(tmp_path: Path) -> Path:
    corpus = tmp_path / "corpus.jsonl.zst"
    _write_compressible_corpus(corpus)
    cfg = {"input": {"paths": [str(corpus)]}, "filter": LENGTH_ONLY_FILTER,
           "tokenizer": {"train": {"vocab_size": 400}}, "pack": {"seq_length": 64}, "cluster": {"n_workers": 2}}
    path = tmp_path / "run.yaml"
    path.write_text(json.dumps(cfg))
    return path


def _du(path: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


@pytest.fixture
def small_filesystem(tmp_path):
    """Mount a tmpfs of a given size (root only; skipped where mounting is not allowed)."""
    mounted: list[Path] = []

    def mount(size_bytes: int) -> Path:
        point = tmp_path / f"fs-{len(mounted)}"
        point.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes // 1024}k", "tmpfs", str(point)],
                              capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.decode().strip()})")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


@pytest.mark.slow
def test_full_disk_in_tokenize_and_in_shard_is_one_line_with_stage_path_and_free_space(tmp_path, dask_client,
                                                                                      small_filesystem):
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    config = _corpus_config(tmp_path)
    from corpusmill.pipeline.config import load_config

    reference = tmp_path / "reference"
    Pipeline(load_config(config), reference, client=dask_client, log=lambda m: None).run()
    before_tokenize = sum(_du(reference / d) for d in ("00-read", "01-normalize", "02-filter", "02-filter.scores",
                                                       "03-exact_dedup", "04-near_dedup"))
    tokenize, pack = _du(reference / "05-tokenize"), _du(reference / "06-pack")
    cases = {"tokenize": before_tokenize + tokenize // 2, "shard": before_tokenize + tokenize + pack + _du(reference / "shards") // 2}
    for stage, size in cases.items():
        out = small_filesystem(size + (1 << 20)) / "run"
        done = subprocess.run([*CLI, "run", str(config), "--out", str(out)], capture_output=True, text=True,
                              timeout=900)
        last = done.stderr.strip().splitlines()[-1]
        assert done.returncode == 2, done.stderr[-2000:]
        assert "Traceback" not in done.stderr
        assert last.startswith(f"corpusmill: error: stage {stage}: ") and "no space left on device" in last.lower(), last
        assert str(out) in last and "MiB free there" in last, last
        assert _progress(out)["state"] == "failed" and _progress(out)["stages"][stage]["state"] == "failed"
        assert _temporary_files(out.parent) == []


def test_sigterm_records_interrupted_and_exits_143(tmp_path):
    config = _corpus_config(tmp_path)
    out = tmp_path / "run"
    proc = subprocess.Popen([*CLI, "run", str(config), "--out", str(out)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_until(lambda: _progress(out).get("state") == "running" and _progress(out).get("stage"), 300,
                   "the run to start its first stage")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, err[-2000:]
    assert "stopped by SIGTERM; rerun with --resume" in err and "Traceback" not in err
    progress = _progress(out)
    assert progress["state"] == "interrupted" and progress["error"] == "interrupted"



def test_stage_writers_replace_a_planted_link_instead_of_writing_through_it(tmp_path, step_context):
    """Parts, Dask frames and JSONL written inside stage folders go through one descriptor-based
    writer: a link planted at the name is replaced and its target never changes."""
    import dask.dataframe as dd
    import pandas as pd
    import pyarrow as pa

    from corpusmill.stages.base import atomic_file, write_table_atomic

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    folder = tmp_path / "stage"
    (folder / "removed").mkdir(parents=True)
    for name in ("part-00000.parquet", "part-00000.arrow", "quarantine.jsonl", "removed/part.0.parquet"):
        (folder / name).symlink_to(victim)
    table = pa.table({"uid": [1, 2], "text": ["a", "b"]})
    write_table_atomic(table, folder / "part-00000.parquet")
    write_table_atomic(table, folder / "part-00000.arrow")
    with atomic_file(folder / "quarantine.jsonl") as f:
        f.write(b'{"line": 1}\n')
    frame = dd.from_pandas(pd.DataFrame({"uid": [1, 2, 3], "score": [0.5, 0.25, 1.0]}), npartitions=2)
    step_context.write_partitions(frame, folder / "removed", "removed rows")
    assert victim.read_text() == "precious"
    assert not any(p.is_symlink() for p in folder.rglob("*"))
    assert pq.read_table(folder / "removed").num_rows == 3 and pq.read_table(folder / "part-00000.parquet") == table
    assert not [p for p in folder.rglob("*") if ".tmp" in p.name]


def test_resume_never_walks_a_stage_folder_linked_out_of_the_run(tmp_path):
    """A planted link in place of a step's folder: resume refuses it like a fresh start, and the
    files it points at stay."""
    import pytest

    from corpusmill.pipeline.rundir import STAGE_DIRS, RunDir

    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    run = tmp_path / "run"
    run.mkdir()
    (run / STAGE_DIRS["tokenize"]).symlink_to(outside, target_is_directory=True)
    with pytest.raises(OSError):
        RunDir(run).resume_folder("tokenize", "somelink")
    assert (outside / "keep.txt").read_text() == "mine"


def test_a_dedup_job_whose_folders_look_like_hive_partitions_reads_its_own_parts(tmp_path, dask_client):
    """`a=b` in the run directory's path is a folder name, not a Parquet partition key: lists of a run's
    part files are read without partition discovery (a `year=2024/` output folder is ordinary)."""
    docs = [{"id": f"d{i}", "text": f"document number {i % 10} about rivers and stones " * 8} for i in range(40)]
    write_jsonl(tmp_path / "in" / "a.jsonl", docs)
    out = tmp_path / "year=2024" / "lang=zh" / "dedup"
    rc = main(["dedup", str(tmp_path / "in"), "--out", str(out), "--methods", "exact,minhash",
               "--scheduler", dask_client.scheduler.address])
    assert rc == 0
    ledger = json.loads((out / "ledger.json").read_text(encoding="utf-8"))
    assert ledger["balanced"] and ledger["kept"] == 10 and ledger["duplicates"] == 30
