"""Hostile WARC files, written byte by byte (WARC/1.0 headers, HTTP responses, each record its own gzip
member): every record ends a document, a quarantine row or inside a lost-input row that names its bytes,
and reading goes on past the damage (issue 39)."""
from __future__ import annotations

import gzip
import io
import json
import random
from pathlib import Path

import pytest

from corpusmill.stages import html
from tests.conftest import Warc, http_response, page_html, read_file, warc_record  # noqa: F401 - the shared WARC writer

def assert_accounted(docs: dict, quarantine: list, stats: dict, warc: Warc, path: Path) -> None:
    """Every page record of `warc` is a document, a quarantine row (by offset) or inside a lost-input span;
    the lost spans together with the records read cover the file; docs_in = docs_out + quarantined."""
    assert stats["docs_in"] == stats["docs_out"] + stats["quarantined"]
    assert stats["docs_out"] == len(docs)
    offsets = warc.offsets()
    spans = [(q["record_offset"], q["end_offset"]) for q in quarantine if q.get("lost_input")]
    rows = {q["record_offset"] for q in quarantine if not q.get("lost_input")}
    for (url, _), at in zip(warc.members, offsets):
        inside = any(a <= at < b for a, b in spans)
        assert (url in docs) + (at in rows) + inside == 1, (url, at, spans)
    size = path.stat().st_size
    for a, b in spans:
        assert 0 <= a <= b <= size
    lost = [q for q in quarantine if q.get("lost_input")]
    assert all(q["documents"] == 0 and q["lost_bytes"] == q["end_offset"] - q["record_offset"] for q in lost)


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("cut", [20, 150, 400])
def test_a_last_member_cut_short_is_one_truncated_row_naming_the_lost_record(tmp_path, cut):
    warc = Warc()
    for i in range(5):
        warc.page(i)
    path = write(tmp_path / "cut.warc.gz", warc.bytes()[:-cut])
    docs, quarantine, stats = read_file(path, tmp_path)
    assert set(docs) == {f"https://site.example/{i}" for i in range(4)}
    [row] = quarantine
    assert row["code"] == "truncated_stream" and row["lost_input"] and row["documents"] == 0
    assert row["record_offset"] == warc.offsets()[4] and row["end_offset"] == path.stat().st_size
    assert f"byte offset {warc.offsets()[4]:,}" in row["reason"] and "file cut off" in row["reason"]
    assert stats["lost_input"]["files"] == 1 and stats["lost_input"]["bytes"] == row["lost_bytes"] > 0
    assert_accounted(docs, quarantine, stats, warc, path)


def test_a_file_cut_inside_the_last_gzip_trailer_keeps_the_record_and_says_its_checksum_is_missing(tmp_path):
    warc = Warc()
    for i in range(3):
        warc.page(i)
    path = write(tmp_path / "trailer.warc.gz", warc.bytes()[:-4])  # the CRC/length trailer is 8 bytes
    docs, quarantine, stats = read_file(path, tmp_path)
    assert len(docs) == 3
    [row] = quarantine
    assert row["code"] == "truncated_stream" and row["lost_bytes"] == 0 and "ends inside its gzip member" in row["reason"]


@pytest.mark.parametrize("gz", [True, False])
def test_a_40_kb_header_and_20000_header_lines_are_read_and_so_are_the_records_after_them(tmp_path, gz):
    warc = Warc(gz)
    warc.page(0)
    warc.page(1, extra=[("Set-Cookie", "session=" + "c" * 40_000), ("Content-Security-Policy", "default-src " + "x" * 9000)])
    warc.page(2, extra=[(f"X-Header-{k}", f"value {k}") for k in range(20_000)])
    warc.page(3)
    path = write(tmp_path / ("big-headers.warc" + (".gz" if gz else "")), warc.bytes())
    docs, quarantine, stats = read_file(path, tmp_path)
    assert quarantine == [] and set(docs) == {f"https://site.example/{i}" for i in range(4)}
    assert "marker2" in docs["https://site.example/2"]["text"]
    assert_accounted(docs, quarantine, stats, warc, path)


def test_http_headers_that_never_end_quarantine_their_record_only(tmp_path):
    warc = Warc()
    warc.page(0)
    endless = b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: %s\r\n" % (k, b"y" * 200) for k in range(25_000))  # 5 MiB
    warc.add("https://site.example/endless", endless + b"no blank line ever")
    warc.page(2)
    path = write(tmp_path / "endless.warc.gz", warc.bytes())
    docs, quarantine, stats = read_file(path, tmp_path)
    assert set(docs) == {"https://site.example/0", "https://site.example/2"}
    [row] = quarantine
    assert row["code"] == "invalid_http" and row["record_offset"] == warc.offsets()[1] and row.get("documents", 1) == 1
    assert stats["quarantine_reasons"] == {"invalid_http": 1}
    assert_accounted(docs, quarantine, stats, warc, path)


def test_a_corrupted_middle_member_is_one_lost_span_and_every_record_after_it_is_read(tmp_path):
    warc = Warc()
    for i in range(6):
        warc.page(i)
    data = bytearray(warc.bytes())
    at = warc.offsets()[2]
    data[at + 30:at + 90] = bytes(random.Random(3).randrange(256) for _ in range(60))
    path = write(tmp_path / "middle.warc.gz", bytes(data))
    docs, quarantine, stats = read_file(path, tmp_path)
    assert set(docs) == {f"https://site.example/{i}" for i in (0, 1, 3, 4, 5)}
    [row] = quarantine
    assert row["code"] == "corrupt_stream" and row["record_offset"] == at and row["end_offset"] == warc.offsets()[3]
    assert "reading resumed at the record at byte" in row["reason"]
    assert_accounted(docs, quarantine, stats, warc, path)


def test_a_member_that_decodes_but_fails_its_checksum_is_never_a_document(tmp_path):
    warc = Warc()
    for i in range(4):
        warc.page(i)
    url, raw = warc.members[1]
    stored = gzip.compress(gzip.decompress(raw), compresslevel=0)  # stored blocks: a flipped byte still decodes
    warc.members[1] = (url, stored)
    data = bytearray(warc.bytes())
    body_at = warc.offsets()[1] + stored.index(b"marker1")
    data[body_at] ^= 0x20  # 'm' -> 'M': the page would read, with the wrong text
    path = write(tmp_path / "crc.warc.gz", bytes(data))
    docs, quarantine, stats = read_file(path, tmp_path)
    assert set(docs) == {f"https://site.example/{i}" for i in (0, 2, 3)}
    [row] = quarantine
    assert row["code"] == "corrupt_stream" and row["record_offset"] == warc.offsets()[1]
    assert_accounted(docs, quarantine, stats, warc, path)


def test_garbage_between_members_is_a_lost_span_of_its_own_bytes(tmp_path):
    warc = Warc()
    for i in range(4):
        warc.page(i)
    garbage = bytes(random.Random(5).randrange(256) for _ in range(3000)).replace(b"\x1f\x8b", b"")
    cut = warc.offsets()[2]
    data = warc.bytes()
    path = write(tmp_path / "garbage.warc.gz", data[:cut] + garbage + data[cut:])
    docs, quarantine, stats = read_file(path, tmp_path)
    assert len(docs) == 4
    [row] = quarantine
    assert (row["record_offset"], row["end_offset"]) == (cut, cut + len(garbage)) and row["code"] == "corrupt_stream"


def test_a_plain_warc_resyncs_after_garbage_and_a_record_without_a_length(tmp_path):
    warc = Warc(gz=False)
    warc.page(0)
    warc.members.append(("garbage", b"\x00\xff not a record at all \r\n" * 40))
    broken = warc_record("https://site.example/broken", http_response(page_html(9))).replace(b"Content-Length: ",
                                                                                                b"Content-Length: x")
    warc.members.append(("https://site.example/broken", broken))
    warc.page(3)
    warc.page(4)
    path = write(tmp_path / "plain.warc", warc.bytes())
    docs, quarantine, stats = read_file(path, tmp_path)
    assert set(docs) == {"https://site.example/0", "https://site.example/3", "https://site.example/4"}
    [row] = quarantine  # the garbage and the record it runs into are one span
    assert row["record_offset"] == warc.offsets()[1] and row["end_offset"] == warc.offsets()[3]
    assert_accounted(docs, quarantine, stats, warc, path)


def test_a_plain_warc_cut_in_a_body_is_one_truncated_row(tmp_path):
    warc = Warc(gz=False)
    for i in range(3):
        warc.page(i)
    path = write(tmp_path / "cut.warc", warc.bytes()[:-300])
    docs, quarantine, stats = read_file(path, tmp_path)
    assert len(docs) == 2
    [row] = quarantine
    assert row["code"] == "truncated_stream" and row["record_offset"] == warc.offsets()[2]
    assert_accounted(docs, quarantine, stats, warc, path)


def test_a_record_larger_than_max_record_is_quarantined_unread_and_the_rest_is_read(tmp_path):
    warc = Warc()
    warc.page(0)
    giant = b"<html><body><p>" + b"giant text " * 300_000 + b"</p></body></html>"  # 3.3 MB
    warc.add("https://site.example/giant", http_response(giant))
    warc.add("https://site.example/video", http_response(b"\x00" * 3_000_000, ctype="video/mp4"))
    warc.page(3)
    path = write(tmp_path / "giant.warc.gz", warc.bytes())
    docs, quarantine, stats = read_file(path, tmp_path, max_record_bytes=1 << 20)
    assert set(docs) == {"https://site.example/0", "https://site.example/3"}
    [row] = quarantine  # the video is not a page: skipped as not_html, never quarantined
    assert row["code"] == "record_too_large" and row["bytes"] > 3_000_000 and row["record_offset"] == warc.offsets()[1]
    assert "input.max_record_mb" in row["reason"] and row["snippet"].startswith("<html><body><p>giant text")
    assert stats["warc_records_skipped"] == {"not_html": 1}
    docs, quarantine, _ = read_file(path, tmp_path / "raised", max_record_bytes=8 << 20)
    assert "https://site.example/giant" in docs and not quarantine


def test_non_warc_bytes_named_warc_gz_are_one_lost_span_over_the_whole_file(tmp_path):
    path = write(tmp_path / "noise.warc.gz", bytes(random.Random(1).randrange(256) for _ in range(20_000)))
    docs, quarantine, stats = read_file(path, tmp_path)
    assert not docs
    [row] = quarantine
    assert row["code"] == "corrupt_stream" and (row["record_offset"], row["end_offset"]) == (0, 20_000)
    assert stats["lost_input"]["bytes"] == 20_000


def test_several_records_in_one_gzip_member_and_a_whole_file_member_read_every_record(tmp_path):
    warc = Warc(gz=False)
    for i in range(5):
        warc.page(i)
    plain = warc.bytes()
    half = warc.offsets()[2]
    path = write(tmp_path / "two.warc.gz", gzip.compress(plain[:half]) + gzip.compress(plain[half:]))
    docs, quarantine, _ = read_file(path, tmp_path)
    assert len(docs) == 5 and not quarantine
    offsets = {json.loads(d["meta"])["record_offset"] for d in docs.values()}
    assert offsets == {0, len(gzip.compress(plain[:half]))}  # the member each record starts in


# ---- intact files read exactly as FastWARC read them --------------------------------------------------

def _fastwarc_pages(path: Path) -> tuple[list[tuple], dict]:
    """The reference: what FastWARC's ArchiveIterator gives for the same intact file (the reader before issue 39)."""
    from fastwarc.warc import ArchiveIterator, WarcRecordType

    pages, skipped = [], {}
    with open(path, "rb") as f:
        for rec in ArchiveIterator(f, parse_http=True, auto_decode="none"):
            if rec.record_type != WarcRecordType.response:
                key = str(rec.record_type).rsplit(".", 1)[-1]
                skipped[key] = skipped.get(key, 0) + 1
                continue
            h = rec.http_headers
            ctype = h.get("Content-Type", "") if h is not None else ""
            status = getattr(h, "status_code", None) if h is not None else None
            if status is not None and not 200 <= status < 300:
                skipped[f"http_status_{status // 100}xx"] = skipped.get(f"http_status_{status // 100}xx", 0) + 1
                continue
            if not any(t in ctype.lower() for t in html.HTML_TYPES):
                skipped["not_html"] = skipped.get("not_html", 0) + 1
                continue
            pages.append((rec.stream_pos, rec.headers.get("WARC-Target-URI"), rec.headers.get("WARC-Date"),
                          rec.headers.get("WARC-Record-ID"), html.header_charset(ctype), rec.reader.read(),
                          h.get("Content-Encoding", "") if h is not None else ""))
    return pages, skipped


@pytest.mark.parametrize("gz", [True, False])
def test_intact_warcs_written_by_warcio_read_exactly_as_fastwarc_read_them(tmp_path, gz):
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    path = tmp_path / ("real.warc" + (".gz" if gz else ""))
    with open(path, "wb") as f:
        w = WARCWriter(f, gzip=gz)
        w.write_record(w.create_warcinfo_record(path.name, {"software": "corpusmill test"}))
        for i in range(40):
            url = f"https://real.example/{i}"
            kind = i % 8
            body = page_html(i, words=20 + 30 * i)
            ctype, status = "text/html; charset=utf-8", "200 OK"
            if kind == 1:
                ctype = "image/png"
            elif kind == 2:
                status = "301 Moved Permanently"
            elif kind == 3:
                ctype, body = "text/html; charset=gbk", page_html(i).replace(b"river", "河流".encode("gbk"))
            elif kind == 4:
                ctype = "application/xhtml+xml"
            headers = StatusAndHeaders(status, [("Content-Type", ctype), ("Set-Cookie", "a=" + "b" * (i * 700))],
                                       protocol="HTTP/1.1")
            req = StatusAndHeaders("GET / HTTP/1.1", [("Host", "real.example")], is_http_request=True)
            w.write_record(w.create_warc_record(url, "request", payload=io.BytesIO(b""), http_headers=req))
            w.write_record(w.create_warc_record(url, "response", payload=io.BytesIO(body), http_headers=headers))
            if kind == 5:
                w.write_record(w.create_warc_record(url, "metadata", payload=io.BytesIO(b"fetchTimeMs: 12"),
                                                    warc_content_type="application/warc-fields"))
            if kind == 6:
                w.write_record(w.create_warc_record(url, "resource", payload=io.BytesIO(body),
                                                    warc_content_type="text/html"))
    want, want_skipped = _fastwarc_pages(path)
    skipped: dict = {}
    got = [(p.offset, p.url, p.date, p.record_id, p.charset, p.body, p.content_encoding)
           for p in html.iter_warc(str(path), skipped)]
    assert got == want and skipped == want_skipped
    assert len(got) == 30 and want_skipped["request"] == 40
