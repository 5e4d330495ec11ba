import gzip
import os
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from corpusmill.stages import read
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
    from corpusmill.stages.base import merge_stats

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


@pytest.mark.parametrize("block_size", [37, 100, 1000])
def test_block_split_reads_every_line_once_with_true_line_numbers(tmp_path, block_size):
    recs = [{"text": f"doc {i} " + "x" * (i % 13)} for i in range(120)]
    path = write_jsonl(tmp_path / "big.jsonl", recs, {50: b"broken\n"})
    whole, q1, _ = _read_all([path], tmp_path / "a")
    split, q2, _ = _read_all([path], tmp_path / "b", block_size=block_size, part_size=200)
    key = lambda d: d["uid"]  # noqa: E731
    assert sorted(whole, key=key) == sorted(split, key=key)
    assert [q["line"] for q in q1] == [q["line"] for q in q2] == [51]


def test_sample_is_the_same_documents_however_the_input_is_split(tmp_path):
    """`--sample` keeps a document by a seeded hash of its uid alone: the same documents on every run,
    whatever the block and part sizes; another seed draws another sample of about the same size."""
    recs = [{"text": f"doc {i}"} for i in range(2000)]
    path = write_jsonl(tmp_path / "big.jsonl", recs)
    whole, _, s1 = _read_all([path], tmp_path / "a", sample=0.5, sample_seed=3)
    split, _, s2 = _read_all([path], tmp_path / "b", block_size=997, part_size=4096, sample=0.5, sample_seed=3)
    other, _, _ = _read_all([path], tmp_path / "c", sample=0.5, sample_seed=4)
    uids = sorted(d["uid"] for d in whole)
    assert uids == sorted(d["uid"] for d in split) and 800 < len(uids) < 1200
    assert s1["not_sampled"] == s2["not_sampled"] == 2000 - len(uids)
    assert sorted(d["uid"] for d in other) != uids and 800 < len(other) < 1200


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


# ---- issue 13: a record never stops a job; nothing is lost without a word ----------------------

def _lines(n, prefix="r"):
    return b"".join(json.dumps({"id": f"{prefix}{i}", "text": f"record {i} of the head"}).encode() + b"\n" for i in range(n))


def _zst(data: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(data)


@pytest.mark.parametrize("field_name", ["text", "id", "lang"])
def test_lone_surrogate_in_any_field_is_quarantined_as_invalid_unicode(tmp_path, field_name):
    """json.loads accepts "\\ud800" but Arrow cannot store it: the record is quarantined (text, id or any
    other field alike) and the quarantine row itself stays writable as UTF-8 JSON."""
    good = {"id": "ok", "text": "fine text", "lang": "en"}
    bad = dict(good, id="bad")
    bad[field_name] = "before \ud800 after"
    path = tmp_path / "s.jsonl"
    path.write_bytes(json.dumps(good).encode() + b"\n" + json.dumps(bad).encode() + b"\n")  # ensure_ascii: \ud800 escape
    docs, quarantine, stats = _read_all([path], tmp_path)
    assert [d["id"] for d in docs] == ["ok"]
    assert [(q["line"], q["code"]) for q in quarantine] == [(2, "invalid_unicode")]
    assert f"'{field_name}'" in quarantine[0]["reason"]
    json.dumps(quarantine, ensure_ascii=False).encode("utf-8")  # no lone surrogate reaches the quarantine file
    assert stats["docs_in"] == 2 and stats["docs_out"] == 1


def test_surrogate_in_a_field_name_is_quarantined(tmp_path):
    path = tmp_path / "k.jsonl"
    path.write_bytes(b'{"text": "t", "\\udc80key": 1}\n')
    docs, quarantine, _ = _read_all([path], tmp_path)
    assert not docs and quarantine[0]["code"] == "invalid_unicode"
    json.dumps(quarantine, ensure_ascii=False).encode("utf-8")


def test_valid_surrogate_pair_escape_is_text_not_quarantined(tmp_path):
    path = tmp_path / "e.jsonl"
    path.write_bytes(b'{"text": "smile \\ud83d\\ude00", "id": "p"}\n')
    docs, quarantine, _ = _read_all([path], tmp_path)
    assert not quarantine and docs[0]["text"] == "smile \U0001F600"


def test_json_nested_tens_of_thousands_deep_is_quarantined_as_too_deep(tmp_path):
    path = tmp_path / "deep.jsonl"
    deep_list = b'{"text": "t", "x": ' + b"[" * 50000 + b"]" * 50000 + b"}\n"
    moderately_deep = b'{"text": "t", "x": ' + b'{"a": ' * 300 + b"1" + b"}" * 300 + b"}\n"
    shallow = b'{"text": "kept", "x": ' + b"[" * 20 + b"]" * 20 + b"}\n"
    path.write_bytes(deep_list + moderately_deep + shallow)
    docs, quarantine, _ = _read_all([path], tmp_path)
    assert [d["text"] for d in docs] == ["kept"]
    assert [(q["line"], q["code"]) for q in quarantine] == [(1, "too_deep"), (2, "too_deep")]


def test_integer_of_thousands_of_digits_is_quarantined_and_a_long_one_kept(tmp_path):
    """Beyond Python's 4300-digit limit json.loads raises ValueError: quarantined (invalid_number).
    A 3000-digit integer parses and is kept exactly in meta."""
    path = tmp_path / "big.jsonl"
    path.write_bytes(b'{"text": "t1", "n": ' + b"7" * 5000 + b"}\n" + b'{"text": "t2", "n": ' + b"9" * 3000 + b"}\n"
                     + b'{"text": "t3", "id": ' + b"8" * 3000 + b"}\n")
    docs, quarantine, _ = _read_all([path], tmp_path)
    assert [(q["line"], q["code"]) for q in quarantine] == [(1, "invalid_number")]
    assert "4300" in quarantine[0]["reason"]
    assert json.loads(docs[0]["meta"])["n"] == int("9" * 3000) and docs[1]["id"] == "8" * 3000


def test_file_name_that_is_not_utf8_is_read_and_written_escaped(tmp_path):
    """A name with byte 0xE9 (Latin-1) is listed with a surrogate escape, opened, and shown as \\xe9
    in ids, sources and quarantine rows (Parquet and JSON need valid UTF-8)."""
    folder = tmp_path / "in"
    folder.mkdir()
    for suffix, data in ((b".jsonl", b'{"text": "plain"}\nbroken\n'), (b".jsonl.gz", gzip.compress(b'{"text": "gz"}\n')),
                         (b".txt", b"a text file")):
        with open(os.path.join(os.fsencode(folder), b"caf\xe9" + suffix), "wb") as f:
            f.write(data)
    with open(os.path.join(os.fsencode(folder), b"caf\xe9.parquet"), "wb") as f:
        pq.write_table(pa.table({"text": ["pq"]}), f)
    files = read.expand_inputs([str(folder)])
    assert len(files) == 4 and all("\udce9" in f for f in files)
    docs, quarantine, _ = _read_all([folder], tmp_path)
    assert sorted(d["text"] for d in docs) == ["a text file", "gz", "plain", "pq"]
    assert {d["source"] for d in docs} == {"caf\\xe9"}
    assert any(d["id"] == f"{folder}/caf\\xe9.jsonl:1" for d in docs)
    assert quarantine[0]["file"] == f"{folder}/caf\\xe9.jsonl" and quarantine[0]["code"] == "invalid_json"
    assert read.display_path(files[0]).encode("utf-8")


def _corrupt_parquet(path, rows=30, group=10, bad_group=1):
    table = pa.table({"text": [f"parquet doc {i}" for i in range(rows)], "id": [f"p{i}" for i in range(rows)]})
    pq.write_table(table, path, row_group_size=group, compression="none")
    off = pq.ParquetFile(path).metadata.row_group(bad_group).column(0).data_page_offset
    data = bytearray(path.read_bytes())
    data[off:off + 16] = b"\xff" * 16  # the footer still reads; this data page header does not
    path.write_bytes(bytes(data))


def test_corrupt_parquet_data_page_quarantines_its_row_group_with_row_count(tmp_path):
    path = tmp_path / "c.parquet"
    _corrupt_parquet(path)
    docs, quarantine, stats = _read_all([path], tmp_path)
    assert sorted(int(d["id"][1:]) for d in docs) == list(range(10)) + list(range(20, 30))
    [q] = quarantine
    assert (q["code"], q["line"], q["rows"], q["documents"], q["row_group"]) == ("unreadable_row_group", 11, 10, 10, 1)
    assert stats["docs_in"] == 30 and stats["quarantined"] == 10 and stats["docs_out"] == 20
    assert stats["quarantine_reasons"] == {"unreadable_row_group": 10} and stats["lost_input"]["files"] == 0


def test_parquet_without_a_readable_footer_is_lost_input_not_a_document(tmp_path):
    (tmp_path / "x.parquet").write_bytes(b"PAR1 this is not parquet")
    docs, quarantine, stats = _read_all([tmp_path / "x.parquet"], tmp_path)
    assert not docs and quarantine[0]["code"] == "unreadable_file" and quarantine[0]["lost_input"]
    assert stats["docs_in"] == 0 and stats["lost_input"] == {"files": 1, "bytes": 24, "partial_bytes": 0}


def test_garbage_in_jsonl_zst_is_one_lost_input_row(tmp_path):
    path = tmp_path / "g.jsonl.zst"
    path.write_bytes(b"this is not zstd at all\n" * 100)
    docs, quarantine, stats = _read_all([path], tmp_path)
    assert not docs and len(quarantine) == 1
    q = quarantine[0]
    assert q["code"] == "corrupt_stream" and q["after_line"] == 0 and q["lost_bytes"] == 2400 and q["lost_input"]
    assert "not a zstd file" in q["reason"] and stats["docs_in"] == 0


def test_gzip_bytes_in_jsonl_zst_say_it_is_gzip(tmp_path):
    path = tmp_path / "mislabelled.jsonl.zst"
    path.write_bytes(gzip.compress(_lines(50)))
    docs, quarantine, stats = _read_all([path], tmp_path)
    assert not docs and [q["code"] for q in quarantine] == ["corrupt_stream"]
    assert "gzip-compressed" in quarantine[0]["reason"] and stats["lost_input"]["files"] == 1


def test_truncated_jsonl_zst_keeps_its_head_and_reports_one_lost_input_row(tmp_path):
    """Before: zstandard's stream reader ended quietly and 687 of 1000 records vanished with exit 0."""
    frames = b"".join(_zst(_lines(1000)[i:i + 4000]) for i in range(0, len(_lines(1000)), 4000))  # many frames
    path = tmp_path / "t.jsonl.zst"
    path.write_bytes(frames[: len(frames) * 2 // 3])
    docs, quarantine, stats = _read_all([path], tmp_path)
    n = len(docs)
    assert n > 500 and [d["id"] for d in docs] == [f"r{i}" for i in range(n)]  # every record before the damage
    [q] = quarantine
    assert q["code"] == "truncated_stream" and q["after_line"] == n and q["line"] == n + 1 and q["lost_input"]
    assert f"after line {n}" in q["reason"]
    next_line = _lines(1000).split(b"\n")[n]  # the record cut by the damage: its decoded head is the snippet
    assert q["partial_bytes"] == len(q["snippet"].encode()) and next_line.startswith(q["snippet"].encode())
    assert stats["docs_in"] == n and stats["quarantined"] == 0 and stats["lost_input"]["files"] == 1


def test_gz_of_zero_bytes_is_damage_but_zero_padding_after_a_member_is_not(tmp_path):
    """A preallocated file never written (all zeros) is not an empty corpus; gzip's own padding is fine."""
    (tmp_path / "zeros.jsonl.gz").write_bytes(bytes(4096))
    (tmp_path / "padded.jsonl.gz").write_bytes(gzip.compress(_lines(3)) + bytes(512))
    docs, quarantine, _ = _read_all([tmp_path], tmp_path / "o")
    assert [d["id"] for d in docs] == ["r0", "r1", "r2"]
    assert [(q["file"].rsplit("/", 1)[1], q["code"]) for q in quarantine] == [("zeros.jsonl.gz", "corrupt_stream")]
    assert "not a gzip file" in quarantine[0]["reason"] and quarantine[0]["lost_bytes"] == 4096


def test_multi_frame_zst_is_read_to_the_end(tmp_path):
    data = _lines(300)
    path = tmp_path / "m.jsonl.zst"
    path.write_bytes(_zst(data[:5000]) + _zst(data[5000:]))
    docs, quarantine, _ = _read_all([path], tmp_path)
    assert len(docs) == 300 and not quarantine


def test_truncated_gz_keeps_its_head_and_the_ledger_shows_lost_input_not_one_document(tmp_path):
    """Before: 165 lost records counted as 1 document. Now the head is read, the rest is one lost-input
    row with the bytes, and the ledger counts no document for it."""
    from corpusmill.pipeline.ledger import build_ledger

    good = gzip.compress(_lines(2000))
    path = tmp_path / "x.jsonl.gz"
    path.write_bytes(good[: len(good) // 2])
    docs, quarantine, stats = _read_all([path], tmp_path)
    n = len(docs)
    assert 0 < n < 2000 and [d["id"] for d in docs] == [f"r{i}" for i in range(n)]
    [q] = quarantine
    assert (q["code"], q["after_line"], q["documents"]) == ("truncated_stream", n, 0)
    assert q["partial_bytes"] > 0 and q["snippet"]
    stats["removed"] = stats.pop("quarantine_reasons")
    ledger = build_ledger({"read": stats}, {"read": "quarantined"})
    assert ledger["input"] == n and ledger["quarantined"] == 0 and ledger["kept"] == n
    assert ledger["lost_input"] == {"files": 1, "bytes": 0, "partial_bytes": q["partial_bytes"]}


def test_corrupt_gz_member_keeps_every_record_before_the_damage(tmp_path):
    """A second gzip member whose header is damaged: all of the first member is read (across many
    64 KiB chunks), and the lost bytes are the damaged member's, found to within 256 bytes."""
    first = gzip.compress(_lines(30000))
    second = bytearray(gzip.compress(_lines(1000, "s")))
    second[2] = 7  # compression method must be 8 (deflate)
    path = tmp_path / "c.jsonl.gz"
    path.write_bytes(first + bytes(second))
    docs, quarantine, stats = _read_all([path], tmp_path)
    assert len(first) > 2 * read.STREAM_CHUNK
    assert [d["id"] for d in docs] == [f"r{i}" for i in range(30000)]
    [q] = quarantine
    assert (q["code"], q["after_line"], q["line"]) == ("corrupt_stream", 30000, 30001)
    assert len(second) <= q["lost_bytes"] < len(second) + 256 and "not a gzip file" not in q["reason"]
    assert stats["lost_input"]["files"] == 1 and stats["docs_in"] == 30000


def test_gzip_damage_that_still_decodes_is_caught_by_its_checksum(tmp_path):
    """Deflate has no check until the member's end: zeroed bytes decode to garbage lines, which are
    quarantined as the malformed records they are, and the CRC failure ends the file as lost input."""
    good = bytearray(gzip.compress(_lines(5000), compresslevel=1))
    mid = len(good) // 2
    good[mid:mid + 64] = bytes(64)
    path = tmp_path / "z.jsonl.gz"
    path.write_bytes(bytes(good))
    docs, quarantine, stats = _read_all([path], tmp_path)
    n_head = next(i for i, d in enumerate(docs + [None]) if d is None or d["id"] != f"r{i}")
    assert n_head > 2000  # the head before the damage is intact
    assert quarantine[-1]["code"] == "corrupt_stream" and quarantine[-1]["lost_input"]
    assert stats["docs_in"] == len(docs) + len(quarantine) - 1


def test_utf8_bom_is_read_not_quarantined(tmp_path):
    (tmp_path / "b.jsonl").write_bytes(b"\xef\xbb\xbf" + b'{"id": "first", "text": "after a BOM"}\n{"text": "second"}\n')
    (tmp_path / "b.txt").write_bytes(b"\xef\xbb\xbfwhole file")
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(b"\xef\xbb\xbf" + b'{"text": "gz after BOM"}\n'))
    docs, quarantine, _ = _read_all([tmp_path], tmp_path / "o")
    assert not quarantine
    assert sorted(d["text"] for d in docs) == ["after a BOM", "gz after BOM", "second", "whole file"]


def test_on_error_fail_stops_at_the_first_bad_record_with_its_message(tmp_path):
    path = tmp_path / "f.jsonl"
    path.write_bytes(b'{"text": "ok"}\n{"text": "bad \\ud800"}\n{"broken\n')
    with pytest.raises(read.InputError) as err:
        _read_all([path], tmp_path, on_error="fail")
    msg = str(err.value)
    assert f"{path} line 2:" in msg and "invalid_unicode" in msg and "lone surrogate" in msg and "on_error" in msg
    _, quarantine, _ = _read_all([path], tmp_path / "q")  # the default quarantines, with the same reason
    assert quarantine[0]["reason"] in msg


def test_on_error_fail_also_stops_at_a_damaged_stream(tmp_path):
    good = gzip.compress(_lines(500))
    (tmp_path / "x.jsonl.gz").write_bytes(good[:-100])
    with pytest.raises(read.InputError, match="truncated_stream"):
        _read_all([tmp_path / "x.jsonl.gz"], tmp_path, on_error="fail")


def test_input_where_every_record_is_bad_reads_zero_documents(tmp_path):
    (tmp_path / "bad.jsonl").write_bytes(b"nope\n[1]\n{\"text\": 3}\n")
    (tmp_path / "bad.jsonl.zst").write_bytes(b"garbage")
    docs, quarantine, stats = _read_all([tmp_path], tmp_path / "o")
    assert docs == [] and stats["docs_out"] == 0 and stats["docs_in"] == 3 and len(quarantine) == 4


def test_symlink_loop_reads_each_file_once_and_ends(tmp_path):
    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    write_jsonl(root / "a.jsonl", [{"text": "a"}])
    write_jsonl(root / "sub" / "b.jsonl", [{"text": "b"}])
    os.symlink("..", root / "sub" / "loop")  # sub/loop -> corpus
    os.symlink(".", root / "self")
    os.symlink("a.jsonl", root / "alias.jsonl")
    os.link(root / "a.jsonl", root / "hard.jsonl")
    expected = [str(root / "a.jsonl"), str(root / "sub" / "b.jsonl")]
    assert read.expand_inputs([str(root)]) == expected
    assert read.expand_inputs([str(root / "**" / "*.jsonl")]) == expected
    every_way = [str(root), str(root / "sub"), str(root / "**" / "*.jsonl"), str(root / "alias.jsonl")]
    assert read.expand_inputs(every_way) == expected


def test_links_to_folders_inside_an_input_folder_are_followed(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    write_jsonl(tmp_path / "elsewhere" / "x.jsonl", [{"text": "x"}])
    (tmp_path / "corpus").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "corpus" / "linked")
    assert read.expand_inputs([str(tmp_path / "corpus")]) == [str(tmp_path / "corpus" / "linked" / "x.jsonl")]


def test_glob_keeps_the_files_glob_found_before(tmp_path):
    """Uids follow file order: for ordinary folders the new walker must list what glob.glob listed."""
    import glob as globmod

    for rel in ("a.jsonl", "sub/b.jsonl", "sub/deeper/c.jsonl.gz", ".hidden/d.jsonl", "sub/.e.jsonl", "x.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"")
    for pattern in ("**/*.jsonl", "**/*", "sub/*", "*/*.jsonl*", "**"):
        full = str(tmp_path / pattern)
        old = sorted(os.path.normpath(p) for p in globmod.glob(full, recursive=True)
                     if os.path.isfile(p) and read.file_kind(p))
        assert read.expand_inputs([full]) == old, pattern


_AS_NOBODY = """
import os, sys
sys.path.insert(0, {repo!r})
from corpusmill.stages import read
os.setgid(65534); os.setuid(65534)
try:
    read.expand_inputs([{target!r}])
except read.InputError as e:
    print("InputError:", e)
else:
    print("no error")
"""


@pytest.mark.parametrize("what", ["folder", "file"])
def test_unreadable_sub_folder_or_file_is_an_error_before_work(what):
    """Path.rglob skipped a sub-folder it could not list (789 records gone, exit 0). Root reads
    everything, so the check runs as uid 65534 in a child process."""
    import shutil
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    top = Path(tempfile.mkdtemp(prefix="cm-perm-"))
    try:
        top.chmod(0o755)
        write_jsonl(top / "corpus" / "ok.jsonl", [{"text": "readable"}])
        write_jsonl(top / "corpus" / "secret" / "hidden.jsonl", [{"text": "not readable"}])
        for p in (top / "corpus", top / "corpus" / "ok.jsonl"):
            p.chmod(0o755)
        locked = top / "corpus" / "secret" if what == "folder" else top / "corpus" / "ok.jsonl"
        (top / "corpus" / "secret").chmod(0o755)
        (top / "corpus" / "secret" / "hidden.jsonl").chmod(0o644)
        locked.chmod(0o700 if what == "folder" else 0o600)
        repo = str(Path(__file__).resolve().parents[1])
        code = _AS_NOBODY.format(repo=repo, target=str(top / "corpus"))
        if os.geteuid() == 0:
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        else:  # not root: chmod alone denies the read
            out = subprocess.run([sys.executable, "-c", code.replace("os.setgid(65534); os.setuid(65534)", "")],
                                 capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert f"InputError: cannot read input {what} {locked}: Permission denied" in out.stdout
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_fifo_named_like_an_input_is_refused_not_opened(tmp_path):
    os.mkfifo(tmp_path / "pipe.jsonl")
    with pytest.raises(read.InputError, match="not a regular file"):
        read.expand_inputs([str(tmp_path)])


def test_broken_link_named_like_an_input_is_an_error(tmp_path):
    os.symlink(tmp_path / "gone.jsonl", tmp_path / "link.jsonl")
    with pytest.raises(read.InputError, match="broken symbolic link"):
        read.expand_inputs([str(tmp_path)])


def test_pipeline_read_stage_finishes_with_zero_documents_when_every_record_is_bad(tmp_path, dask_client):
    """Before: a traceback after `read`. The read stage itself completes (marker, quarantine file,
    0 documents out) and the job goes on from there."""
    from corpusmill.pipeline.config import parse_config
    from corpusmill.pipeline.runner import Pipeline, PipelineError

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "bad.jsonl").write_bytes(b"nope\n[1]\n{\"text\": 3}\n{\"text\": \"\\udc00\"}\n")
    (tmp_path / "in" / "bad.jsonl.zst").write_bytes(b"garbage")
    cfg = parse_config({"input": {"paths": [str(tmp_path / "in")]}, "dedup": {"minhash": {"enabled": False}}})
    logs: list[str] = []
    try:
        Pipeline(cfg, tmp_path / "out", client=dask_client, log=logs.append, job="dedup").run()
    except PipelineError:
        pass  # what later stages make of an empty input is theirs to say, as one clear error
    marker = json.loads((tmp_path / "out" / "00-read" / "_DONE.json").read_text(encoding="utf-8"))
    assert marker["stats"]["docs_in"] == 4 and marker["stats"]["docs_out"] == 0 and marker["stats"]["quarantined"] == 4
    assert marker["stats"]["lost_input"]["files"] == 1
    rows = (tmp_path / "out" / "00-read" / "quarantine.jsonl").read_text(encoding="utf-8").split("\n")
    assert len([r for r in rows if r]) == 5
    assert any("no document survived reading" in line for line in logs)


def test_cli_on_error_fail_is_one_line_and_exit_2(tmp_path, dask_client, capsys):
    from corpusmill.pipeline.cli import main

    (tmp_path / "in").mkdir()
    deep = b'{"text": "deep", "x": ' + b"[" * 30000 + b"]" * 30000 + b"}\n"
    (tmp_path / "in" / "a.jsonl").write_bytes(b'{"text": "good one"}\n' + deep)
    cfg = tmp_path / "strict.yaml"
    cfg.write_text("input:\n  on_error: fail\n", encoding="utf-8")
    code = main(["dedup", str(tmp_path / "in"), "--out", str(tmp_path / "out"), "--config", str(cfg),
                 "--scheduler", dask_client.scheduler.address, "--methods", "exact"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1] == (f"corpusmill: error: {tmp_path / 'in' / 'a.jsonl'} line 2: JSON nested too deep to read [too_deep] "
                       "(input.on_error is fail; set it to quarantine to go on past such input)")
    assert "Traceback" not in "\n".join(err)


def test_corrupt_zst_frame_keeps_the_frames_before_it(tmp_path):
    data = _lines(600)
    frames = [_zst(data[i:i + 6000]) for i in range(0, len(data), 6000)]
    broken = bytearray(frames[2])
    broken[0] ^= 0xFF  # the third frame's magic number
    path = tmp_path / "f.jsonl.zst"
    path.write_bytes(frames[0] + frames[1] + bytes(broken) + b"".join(frames[3:]))
    docs, quarantine, _ = _read_all([path], tmp_path)
    kept = data[:12000].count(b"\n")  # the lines wholly inside the first two frames
    assert [d["id"] for d in docs] == [f"r{i}" for i in range(kept)]
    [q] = quarantine
    assert q["code"] == "corrupt_stream" and q["after_line"] == kept and q["partial_bytes"] > 0
    damaged = len(path.read_bytes()) - len(frames[0]) - len(frames[1])
    assert damaged <= q["lost_bytes"] < damaged + 256  # found to within 256 bytes


def test_invalid_utf8_in_a_parquet_string_column_quarantines_that_row_only(tmp_path):
    """Arrow does not check UTF-8 when it reads Parquet; Python does when it converts a value."""
    values = [b"good row", b"bad \xff row", b"another good row"]
    offsets = pa.array([0, 8, 16, 32], pa.int32()).buffers()[1]
    text = pa.Array.from_buffers(pa.string(), 3, [None, offsets, pa.py_buffer(b"".join(values))])
    pq.write_table(pa.table({"text": text, "id": ["a", "b", "c"]}), tmp_path / "u.parquet")
    docs, quarantine, stats = _read_all([tmp_path / "u.parquet"], tmp_path)
    assert [d["id"] for d in docs] == ["a", "c"]
    assert [(q["line"], q["code"]) for q in quarantine] == [(2, "invalid_utf8")] and "'text'" in quarantine[0]["reason"]
    assert stats["docs_in"] == 3
