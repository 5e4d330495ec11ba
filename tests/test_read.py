import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from stages import read
from tests.conftest import write_jsonl


def _read_all(paths, tmp_path, block_size=64 << 20, part_size=32 << 20, **opts):
    files = read.expand_inputs([str(p) for p in paths])
    units, to_count = read.plan_units(files, block_size, part_size)
    running = {}
    for seg in to_count:
        seg.first_line = running.get(seg.file_index, 0) + 1
        running[seg.file_index] = running.get(seg.file_index, 0) + read.count_block_lines(seg.path, seg.start, seg.end)
    out = tmp_path / "out"
    out.mkdir(parents=True, exist_ok=True)
    results = [read.read_unit(u, read.ReadOptions(part_size=part_size, **opts), str(out)) for u in units]
    docs = pq.read_table(str(out)).to_pylist() if any(out.glob("*.parquet")) else []
    quarantine = [q for r in results for q in r["quarantine"]]
    stats = {}
    from stages.base import merge_stats

    for r in results:
        merge_stats(stats, r["stats"])
    return docs, quarantine, stats


def test_jsonl_malformed_lines_are_quarantined_with_file_line_reason(tmp_path):
    recs = [{"id": f"d{i}", "text": f"document number {i}", "source": "s", "lang": "en"} for i in range(6)]
    raw = {
        1: b'{"text": "unterminated\n',
        2: b'{"text": "caf\xe9"}\n',
        3: b'{"body": "no text field"}\n',
        4: b'{"text": ["not", "a", "string"]}\n',
        5: b"[1, 2]\n",
    }
    path = write_jsonl(tmp_path / "a.jsonl", recs, raw)
    with open(path, "ab") as f:
        f.write(b"\n   \n")  # blank lines: no documents
    docs, quarantine, stats = _read_all([path], tmp_path)
    assert len(docs) == 6 and stats["docs_in"] == 11 and stats["quarantined"] == 5 and stats["blank_lines"] == 2
    by_line = {q["line"]: q for q in quarantine}
    assert set(by_line) == {2, 4, 6, 8, 10}
    assert by_line[2]["code"] == "invalid_json" and "invalid JSON" in by_line[2]["reason"]
    assert by_line[4]["code"] == "invalid_utf8" and "byte" in by_line[4]["reason"]
    assert by_line[6]["code"] == "missing_text"
    assert by_line[8]["code"] == "text_not_string" and "list" in by_line[8]["reason"]
    assert by_line[10]["code"] == "not_an_object"
    assert all(q["file"] == str(path) for q in quarantine)
    first = docs[0]
    assert first["id"] == "d0" and first["source"] == "s" and json.loads(first["meta"]) == {"lang": "en"}
    assert first["uid"] == (0 << 32) | 1
    assert len({d["uid"] for d in docs} | {q["uid"] for q in quarantine}) == 11


def test_id_and_source_fall_back_to_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "corpus.jsonl", [{"text": "alpha"}, {"text": "beta", "id": 7}])
    docs, _, _ = _read_all([path], tmp_path)
    assert docs[0]["id"] == f"{path}:1" and docs[0]["source"] == "corpus"
    assert docs[1]["id"] == "7"


def test_compressed_parquet_and_txt_inputs(tmp_path):
    recs = [{"id": f"z{i}", "text": f"第{i}篇文档"} for i in range(3)]
    with gzip.open(tmp_path / "a.jsonl.gz", "wb") as f:
        f.writelines(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in recs)
    with open(tmp_path / "b.jsonl.zst", "wb") as raw, zstandard.ZstdCompressor().stream_writer(raw) as f:
        f.write(b"".join(json.dumps(r).encode() + b"\n" for r in recs) + b"not json\n")
    pq.write_table(pa.table({"text": ["p0", None, "p2"], "id": ["px", "py", "pz"], "year": [1, 2, 3]}), tmp_path / "c.parquet")
    (tmp_path / "d.txt").write_text("a whole file is one document\nwith two lines", encoding="utf-8")
    (tmp_path / "e.txt").write_bytes(b"\xff\xfe bad")
    (tmp_path / "ignored.csv").write_text("x")
    docs, quarantine, stats = _read_all([tmp_path], tmp_path / "o")
    assert stats["files"] == 5
    assert sorted(d["text"] for d in docs if d["id"].startswith("z")) == sorted([r["text"] for r in recs] * 2)
    assert {d["id"] for d in docs if d["source"] == "c"} == {"px", "pz"}
    assert json.loads(next(d for d in docs if d["id"] == "px")["meta"]) == {"year": 1}
    assert any(d["text"].endswith("with two lines") for d in docs)
    reasons = sorted((q["file"].rsplit("/", 1)[1], q["line"], q["code"]) for q in quarantine)
    assert reasons == [("b.jsonl.zst", 4, "invalid_json"), ("c.parquet", 2, "text_not_string"), ("e.txt", None, "invalid_utf8")]
    assert stats["docs_in"] == len(docs) + len(quarantine)


def test_corrupt_gzip_is_quarantined_not_fatal(tmp_path):
    good = gzip.compress(b"".join(json.dumps({"text": f"line {i}"}).encode() + b"\n" for i in range(2000)))
    (tmp_path / "x.jsonl.gz").write_bytes(good[: len(good) // 2])
    docs, quarantine, stats = _read_all([tmp_path / "x.jsonl.gz"], tmp_path)
    assert quarantine and quarantine[-1]["code"] == "unreadable_file"
    assert stats["docs_in"] == len(docs) + len(quarantine)


@pytest.mark.parametrize("block_size", [37, 100, 1000])
def test_block_split_reads_every_line_once_with_true_line_numbers(tmp_path, block_size):
    recs = [{"text": f"doc {i} " + "x" * (i % 13)} for i in range(120)]
    path = write_jsonl(tmp_path / "big.jsonl", recs, {50: b"broken\n"})
    whole, q1, _ = _read_all([path], tmp_path / "a")
    split, q2, _ = _read_all([path], tmp_path / "b", block_size=block_size, part_size=200)
    key = lambda d: d["uid"]  # noqa: E731
    assert sorted(whole, key=key) == sorted(split, key=key)
    assert [q["line"] for q in q1] == [q["line"] for q in q2] == [51]


def test_expand_inputs_errors(tmp_path):
    with pytest.raises(read.InputError, match="does not exist"):
        read.expand_inputs([str(tmp_path / "missing.jsonl")])
    with pytest.raises(read.InputError, match="matches no"):
        read.expand_inputs([str(tmp_path / "*.jsonl")])
    (tmp_path / "x.csv").write_text("a")
    with pytest.raises(read.InputError, match="unsupported"):
        read.expand_inputs([str(tmp_path / "x.csv")])
    with pytest.raises(read.InputError, match="empty"):
        read.expand_inputs([])
