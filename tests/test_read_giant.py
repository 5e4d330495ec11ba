"""input.max_record_mb is enforced at read, in every format, without holding the giant record (issue 39):
a JSONL line (plain, .gz, .zst) longer than the bound, a .txt / .html file larger than it and a Parquet text
value longer than it are quarantined as record_too_large with their size, file and line; the rest of the file
is read, the ledger balances, and changing the bound reads again."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from corpusmill.stages import read
from tests.conftest import LENGTH_ONLY_FILTER

MIB = 1 << 20
NORMAL = "The river runs past the old mill and the children walk along its banks before school. "


def _records(n: int = 20, giant_at: int = 7, giant_bytes: int = 3 * MIB) -> bytes:
    lines = []
    for i in range(n):
        if i == giant_at:
            lines.append(json.dumps({"id": "giant", "text": "g" * giant_bytes}).encode())
        lines.append(json.dumps({"id": f"d{i}", "text": NORMAL + f"number {i}"}).encode())
    return b"\n".join(lines) + b"\n"


def _compress(kind: str, data: bytes) -> bytes:
    if kind == "jsonl.gz":
        return gzip.compress(data, compresslevel=1)
    if kind == "jsonl.zst":
        return zstandard.ZstdCompressor().compress(data)
    return data


def _read(paths: list[Path], tmp_path: Path, block_size: int = 1 << 40, **opts) -> tuple[list, list, dict]:
    from corpusmill.stages.base import merge_stats

    files = read.expand_inputs([str(p) for p in paths])
    units, to_count = read.plan_units(files, block_size, 1 << 40)
    running: dict = {}
    for seg in to_count:
        seg.first_line = running.get(seg.file_index, 0) + 1
        running[seg.file_index] = running.get(seg.file_index, 0) + read.count_block_lines(seg.path, seg.start, seg.end)
    out = tmp_path / "out"
    out.mkdir(parents=True, exist_ok=True)
    results = [read.read_unit(u, read.ReadOptions(**opts), str(out)) for u in units]
    docs = [r for res in results for p in res["parts"] for r in pq.read_table(out / p).to_pylist()]
    stats: dict = {}
    for r in results:
        merge_stats(stats, r["stats"])
    return docs, [q for r in results for q in r["quarantine"]], stats


@pytest.mark.parametrize("kind", ["jsonl", "jsonl.gz", "jsonl.zst"])
def test_a_jsonl_line_longer_than_the_bound_is_quarantined_with_its_size_and_line_and_the_rest_read(tmp_path, kind):
    path = tmp_path / f"giant.{kind}"
    path.write_bytes(_compress(kind, _records(giant_bytes=3 * MIB)))
    docs, quarantine, stats = _read([path], tmp_path, max_record_bytes=MIB)
    assert sorted(d["id"] for d in docs) == sorted(f"d{i}" for i in range(20))
    [row] = quarantine
    giant_size = len(json.dumps({"id": "giant", "text": "g" * 3 * MIB}))
    assert (row["code"], row["line"], row["bytes"]) == ("record_too_large", 8, giant_size)
    assert f"{giant_size:,} bytes" in row["reason"] and "input.max_record_mb (1 MiB" in row["reason"]
    assert row["snippet"].startswith('{"id": "giant", "text": "ggg') and len(row["snippet"]) <= read.SNIPPET_CHARS
    assert stats["docs_in"] == 21 and stats["docs_out"] == 20 and stats["quarantine_reasons"] == {"record_too_large": 1}
    assert [d["uid"] & 0xFFFFFFFF for d in docs if d["id"] == "d7"] == [9]  # line numbers go on past it


def test_a_giant_line_across_block_boundaries_is_counted_once_and_later_lines_keep_their_numbers(tmp_path):
    path = tmp_path / "split.jsonl"
    path.write_bytes(_records(giant_bytes=3 * MIB))
    docs, quarantine, _ = _read([path], tmp_path, block_size=MIB // 2, max_record_bytes=MIB)
    assert [q["line"] for q in quarantine] == [8]
    lines = {d["id"]: d["uid"] & 0xFFFFFFFF for d in docs}
    assert lines == {f"d{i}": i + 1 + (i >= 7) for i in range(20)}


def test_the_same_line_under_a_raised_bound_is_a_document(tmp_path):
    path = tmp_path / "giant.jsonl.gz"
    path.write_bytes(_compress("jsonl.gz", _records(giant_bytes=3 * MIB)))
    docs, quarantine, _ = _read([path], tmp_path, max_record_bytes=4 * MIB)
    assert not quarantine and len(docs) == 21


def test_a_giant_line_that_a_truncated_stream_cuts_off_is_lost_input_with_its_size(tmp_path):
    data = _records(n=5, giant_at=4, giant_bytes=3 * MIB)
    cut = data.index(b'{"id": "giant"') + 2 * MIB  # the stream ends inside the giant line
    path = tmp_path / "cut.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(data)[: len(zstandard.ZstdCompressor().compress(data[:cut]))])
    docs, quarantine, stats = _read([path], tmp_path, max_record_bytes=MIB)
    assert [d["id"] for d in docs] == [f"d{i}" for i in range(4)]
    [row] = quarantine
    assert row["lost_input"] and row["partial_bytes"] > MIB and len(row["snippet"]) <= read.SNIPPET_CHARS


@pytest.mark.parametrize("suffix", [".txt", ".html"])
def test_a_txt_or_html_file_larger_than_the_bound_is_quarantined_before_it_is_read(tmp_path, suffix):
    (tmp_path / "in").mkdir()
    big = tmp_path / "in" / f"big{suffix}"
    big.write_bytes(b"<html><body><p>" + b"long page " * 300_000 + b"</p></body></html>")
    (tmp_path / "in" / f"small{suffix}").write_bytes(b"<html><body><p>" + NORMAL.encode() * 3 + b"</p></body></html>")
    docs, quarantine, stats = _read([tmp_path / "in"], tmp_path, max_record_bytes=MIB)
    assert [d["id"] for d in docs] == [str(tmp_path / "in" / f"small{suffix}")]
    [row] = quarantine
    assert row["code"] == "record_too_large" and row["bytes"] == big.stat().st_size and row["file"] == str(big)
    assert stats["docs_in"] == 2 and stats["quarantined"] == 1


def test_a_parquet_text_value_longer_than_the_bound_quarantines_that_row_only(tmp_path):
    path = tmp_path / "t.parquet"
    texts = [NORMAL + str(i) for i in range(10)]
    texts[3] = "p" * (2 * MIB)
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(10)], "text": texts}), path)
    docs, quarantine, stats = _read([path], tmp_path, max_record_bytes=MIB)
    assert sorted(d["id"] for d in docs) == sorted(f"r{i}" for i in range(10) if i != 3)
    [row] = quarantine
    assert (row["code"], row["line"], row["bytes"]) == ("record_too_large", 4, 2 * MIB)
    assert row["snippet"].startswith("ppp")


def test_reading_a_64_mib_line_holds_a_bounded_amount_of_memory(tmp_path):
    """The line is passed over in pieces: the reader's peak memory grows by far less than the line."""
    data = _records(n=4, giant_at=2, giant_bytes=64 * MIB)
    for kind in ("jsonl", "jsonl.gz", "jsonl.zst"):
        (tmp_path / f"g.{kind}").write_bytes(_compress(kind, data))
    del data
    script = textwrap.dedent(f"""
        import json, resource, sys
        from corpusmill.stages import read
        grown = {{}}
        for kind in ("jsonl", "jsonl.gz", "jsonl.zst"):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            units, _ = read.plan_units([{str(tmp_path)!r} + "/g." + kind], 1 << 40, 1 << 40)
            r = read.read_unit(units[0], read.ReadOptions(max_record_bytes=1 << 20), {str(tmp_path)!r} + "/out-" + kind)
            assert r["stats"]["quarantine_reasons"] == {{"record_too_large": 1}}, r["stats"]
            grown[kind] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
        print(json.dumps(grown))
    """)
    for kind in ("jsonl", "jsonl.gz", "jsonl.zst"):
        (tmp_path / f"out-{kind}").mkdir()
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    grown = json.loads(out.stdout)
    assert all(v < 48 * MIB for v in grown.values()), grown  # the line is 64 MiB; a whole copy would be > 64 MiB


def test_the_read_step_is_read_again_when_max_record_mb_changes(tmp_path):
    from corpusmill.pipeline.config import parse_config
    from corpusmill.pipeline.steps.read import ReadStep

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text(json.dumps({"text": NORMAL}) + "\n")

    def link(**input_opts) -> str:
        cfg = parse_config({"input": {"paths": [str(tmp_path / "in")], **input_opts}})
        return cfg.section_hash(*ReadStep.config_sections, extra=ReadStep().hash_extra(cfg, None))

    assert link() == link(max_record_mb=16) != link(max_record_mb=64)


def test_a_run_with_a_giant_record_quarantines_it_and_the_ledger_balances(tmp_path, dask_client):
    from corpusmill.pipeline.config import parse_config
    from corpusmill.pipeline.runner import Pipeline

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "giant.jsonl").write_bytes(_records(giant_bytes=3 * MIB))
    cfg = parse_config({"input": {"paths": [str(tmp_path / "in")], "max_record_mb": 1},
                        "filter": {**LENGTH_ONLY_FILTER, "boilerplate_lines": {"enabled": False}},
                        "dedup": {"minhash": {"enabled": False}}})
    result = Pipeline(cfg, tmp_path / "out", client=dask_client, log=lambda m: None, job="dedup").run()
    ledger = result.ledger
    assert ledger["balanced"] and ledger["input"] == 21 and ledger["quarantined"] == 1
    assert ledger["stages"]["read"]["removed"] == {"record_too_large": 1}
    [row] = [json.loads(x) for x in (tmp_path / "out" / "00-read" / "quarantine.jsonl").read_text().splitlines()]
    assert row["code"] == "record_too_large" and row["line"] == 8
