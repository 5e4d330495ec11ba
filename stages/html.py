"""Web pages to documents: WARC response records and HTML files, decoded with the right charset,
their main text extracted with paragraph breaks kept.

- Reading WARC: FastWARC (`fastwarc`), response records with an HTML content type; the URL
  (WARC-Target-URI), crawl date (WARC-Date) and the record's byte offset in the file are kept.
- Charset, in this order: the HTTP Content-Type header, a byte-order mark, the page's own
  `<meta charset>` / `<meta http-equiv>` (first 4 KB), else detection (Resiliparse's
  `detect_encoding`, uchardet). GB2312 and GBK are decoded as GB18030 (their superset), Big5 as
  CP950 then Big5-HKSCS. A body that does not decode strictly with the chosen charset (nor with the
  detected one), or decodes only into control and replacement characters (`not_text`: random
  bytes, a compressed body without its Content-Encoding, a page mangled by an earlier decoder),
  raises `UndecodablePage` and the reader quarantines it (`undecodable_html`, file, record offset).
- Main text: Resiliparse's `extract_plain_text(main_content=True)`. Measured against trafilatura on
  150 real Sphinx pages (bench/README.md): 19x the speed, fewer navigation lines left, paragraphs as
  blank-line-separated blocks instead of the source's hard-wrapped lines (see bench/html_bench.py).
"""
from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from typing import Iterator, Optional

_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]{1,40})""", re.IGNORECASE)
_HEADER_CHARSET = re.compile(r"""charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]{1,40})""", re.IGNORECASE)
_SUPERSETS = {"gb2312": ["gb18030"], "gbk": ["gb18030"], "x-gbk": ["gb18030"], "gb18030": ["gb18030"],
              "big5": ["cp950", "big5hkscs"], "big5-hkscs": ["big5hkscs"], "cp950": ["cp950", "big5hkscs"],
              "iso-8859-1": ["cp1252"], "latin1": ["cp1252"], "us-ascii": ["utf-8", "cp1252"],
              "ascii": ["utf-8", "cp1252"]}
HTML_TYPES = ("text/html", "application/xhtml+xml")
META_SCAN_BYTES = 4096


class UndecodablePage(ValueError):
    """The page's bytes are not text in any charset it declares or that detection finds."""


def _codec(name: str) -> Optional[str]:
    try:
        return codecs.lookup(name).name
    except LookupError:
        return None


def _candidates(name: str) -> list[str]:
    """Python codecs to try for a declared charset name: its superset(s) first."""
    low = name.strip().lower()
    out = _SUPERSETS.get(low) or _SUPERSETS.get(_codec(low) or "") or []
    base = _codec(low)
    return [c for c in [*out, base] if c]


def header_charset(content_type: Optional[str]) -> Optional[str]:
    """The charset parameter of an HTTP Content-Type header value."""
    if not content_type:
        return None
    m = _HEADER_CHARSET.search(content_type)
    return m.group(1) if m else None


def meta_charset(body: bytes) -> Optional[str]:
    """The charset a page declares in a <meta> tag within its first 4 KB."""
    m = _META_CHARSET.search(body[:META_SCAN_BYTES])
    return m.group(1).decode("ascii") if m else None


# Characters no text holds: C0 controls but tab, newlines and form feed, DEL, C1 controls, U+FFFD (a
# decoder already gave up on these bytes once), non-characters. A body that decodes "strictly" into many
# of them is not text in that charset: random bytes are ~24% of them as Latin-1, a gzip body sent without
# its Content-Encoding ~25%, UTF-16 read as cp1252 ~50%; real pages (python3.11-doc, Chinese law pages in
# UTF-8 / GBK / Big5) hold none.
_NOT_TEXT = re.compile("[\x00-\x08\x0e-\x1f\x7f-\x9f\ufffd\ufffe\uffff]")
MAX_NOT_TEXT_SHARE = 0.01  # of a decoded page's characters...
MIN_NOT_TEXT_CHARS = 8  # ...and at least this many: a stray control character or U+FFFD is kept


NOT_TEXT_WINDOW = 16384  # characters checked at a page's start, middle and end: the check costs a bounded time


def not_text(text: str) -> Optional[str]:
    """Why a decoded page is not text (too many control / replacement characters), or None. A long
    page is judged on three windows (start, middle, end; Python's regex scans ~40 MB/s, which over
    whole pages would add a third to the extraction's time)."""
    w = NOT_TEXT_WINDOW
    if len(text) > 3 * w:
        mid = (len(text) - w) // 2
        text = text[:w] + text[mid:mid + w] + text[-w:]
    n = len(_NOT_TEXT.findall(text))
    if n >= MIN_NOT_TEXT_CHARS and n > MAX_NOT_TEXT_SHARE * len(text):
        return f"{n:,} of {len(text):,} characters ({n / len(text):.0%}) are control or replacement characters"
    return None


def _utf16(body: bytes) -> Optional[str]:
    """UTF-16 without a byte-order mark, told by its zero bytes (ASCII markup: every other byte is 0)."""
    head = body[:META_SCAN_BYTES]
    half = len(head) // 2
    if half < 16:
        return None
    even, odd = head[0::2].count(0), head[1::2].count(0)
    if odd > 0.3 * half and even < 0.05 * half:
        return "utf-16-le"
    if even > 0.3 * half and odd < 0.05 * half:
        return "utf-16-be"
    return None


def decode_page(body: bytes, declared: Optional[str] = None) -> tuple[str, str, str]:
    """(text, codec used, where the charset came from: header | bom | meta | detected).

    A charset is taken when the body decodes strictly with it *and* the result is text (`not_text`):
    a declared charset that fails either way leaves the choice to detection (UTF-16 without a BOM
    first, then Resiliparse's); when no candidate gives text, UndecodablePage says why."""
    tried: list[str] = []
    garbled: Optional[tuple[str, str]] = None  # the first codec that decoded, and why its text is not text
    for source, name in (("header", declared), ("bom", _bom(body)), ("meta", meta_charset(body))):
        if not name:
            continue
        for codec in _candidates(name):
            if codec in tried:
                continue
            tried.append(codec)
            try:
                text = body.decode(codec)
            except UnicodeDecodeError:
                continue
            problem = not_text(text)
            if problem is None:
                return text, codec, source
            garbled = garbled or (codec, problem)
        break  # a declared charset that fails: detection decides, not a weaker declaration
    from resiliparse.parse.encoding import detect_encoding

    detected = detect_encoding(body)
    last: Optional[UnicodeDecodeError] = None
    guess = _utf16(body)
    for codec in ([guess] if guess else []) + _candidates(detected or "utf-8") + ["utf-8"]:
        if codec in tried:
            continue
        tried.append(codec)
        try:
            text = body.decode(codec)
        except UnicodeDecodeError as e:
            last = e
            continue
        problem = not_text(text)
        if problem is None:
            return text, codec, "detected"
        garbled = garbled or (codec, problem)
    why = f"declared {declared or meta_charset(body) or 'none'}, detected {detected or 'nothing'}"
    hint = " (gzip data: a Content-Encoding header missing?)" if body[:2] == b"\x1f\x8b" else ""
    if garbled is not None:
        raise UndecodablePage(f"not text in any charset tried ({' / '.join(tried)}; {why}): as {garbled[0]}, "
                              f"{garbled[1]}{hint}")
    where = f" at byte {last.start}" if last is not None else ""
    raise UndecodablePage(f"not decodable as {' / '.join(tried)} ({why}){where}{hint}")


def _bom(body: bytes) -> Optional[str]:
    if body.startswith(codecs.BOM_UTF8):
        return "utf-8-sig"
    if body.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return "utf-16"
    return None


MAX_MAIN_CONTENT_DEPTH = 400  # Resiliparse's main-content pass is quadratic in nesting: 10,000 divs took 20 s
# tags that are always closed (an unclosed <p> or <li> would count as nesting)
_CONTAINERS = ("div", "section", "article", "table", "span", "blockquote", "font", "center")
_CONTAINER_TAG = re.compile(r"<(/?)(?:" + "|".join(_CONTAINERS) + r")\b", re.IGNORECASE)


def nesting_depth(html: str) -> int:
    """The deepest nesting of always-closed container tags (an estimate from the tags, no parse;
    about a tenth of the extraction's time)."""
    marks = _CONTAINER_TAG.findall(html)
    if len(marks) <= MAX_MAIN_CONTENT_DEPTH:
        return len(marks)
    import numpy as np

    steps = np.fromiter((-1 if m else 1 for m in marks), dtype=np.int64, count=len(marks))
    return int(np.cumsum(steps).max(initial=0))


def extract_main_text(html: str) -> str:
    """The page's main text (navigation, headers, footers, scripts left out), one block per paragraph
    separated by a blank line. A page nested deeper than MAX_MAIN_CONTENT_DEPTH (no real page is; a
    hostile one would hold a worker for minutes) gets the plain text of its body instead."""
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.html import HTMLTree

    main = nesting_depth(html) <= MAX_MAIN_CONTENT_DEPTH
    text = extract_plain_text(HTMLTree.parse(html), main_content=main, alt_texts=False, links=False,
                              list_bullets=True, preserve_formatting=True, comments=False)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


@dataclass
class WarcPage:
    """One response record of a WARC file with an HTML body."""

    offset: int  # byte offset of the record in the (compressed) file
    url: Optional[str]
    date: Optional[str]
    record_id: Optional[str]
    charset: Optional[str]  # from the HTTP Content-Type header
    body: bytes  # as stored (content_encoding not yet undone)
    content_encoding: str = ""


class TruncatedWarc(ValueError):
    """A record ends before its declared length: the file was cut off there."""

    def __init__(self, offset: int, message: str):
        super().__init__(message)
        self.offset = offset


def _content_decode(body: bytes, encoding: str) -> bytes:
    """The body without its HTTP Content-Encoding (gzip, deflate, br); ValueError when it cannot be."""
    import zlib

    enc = encoding.strip().lower()
    if enc in ("", "identity"):
        return body
    try:
        if enc in ("gzip", "x-gzip"):
            return zlib.decompress(body, wbits=47)
        if enc == "deflate":
            try:
                return zlib.decompress(body)
            except zlib.error:
                return zlib.decompress(body, wbits=-15)
        if enc == "br":
            import brotli

            return brotli.decompress(body)
    except Exception as e:  # noqa: BLE001 - any codec error: the page cannot be read
        raise ValueError(f"Content-Encoding {encoding} cannot be decoded: {e}") from None
    raise ValueError(f"unsupported Content-Encoding {encoding}")


def iter_warc(path: str, skipped: dict[str, int]) -> Iterator[WarcPage]:
    """The HTML response records of a .warc / .warc.gz file, in file order; every other record is
    counted in `skipped` by kind (request, metadata, not_html, http_status_3xx ...). A record
    shorter than its declared length raises TruncatedWarc (a cut-off file)."""
    from fastwarc.warc import ArchiveIterator, WarcRecordType

    with open(path, "rb") as f:
        for rec in ArchiveIterator(f, parse_http=True, auto_decode="none"):
            if rec.record_type != WarcRecordType.response:
                key = str(rec.record_type).rsplit(".", 1)[-1]  # warcinfo, request, metadata ...
                skipped[key] = skipped.get(key, 0) + 1
                continue
            http = rec.http_headers
            ctype = http.get("Content-Type", "") if http is not None else ""
            status = getattr(http, "status_code", None) if http is not None else None
            if status is not None and not 200 <= status < 300:
                key = f"http_status_{status // 100}xx"
                skipped[key] = skipped.get(key, 0) + 1
                continue
            if not any(t in ctype.lower() for t in HTML_TYPES):
                skipped["not_html"] = skipped.get("not_html", 0) + 1
                continue
            h = rec.headers
            body = rec.reader.read()
            if len(body) < rec.content_length:
                raise TruncatedWarc(rec.stream_pos, f"the record at byte offset {rec.stream_pos} ends after "
                                    f"{len(body):,} of its {rec.content_length:,} bytes (file cut off)")
            page = WarcPage(rec.stream_pos, h.get("WARC-Target-URI"), h.get("WARC-Date"), h.get("WARC-Record-ID"),
                            header_charset(ctype), body)
            page.content_encoding = http.get("Content-Encoding", "") if http is not None else ""
            yield page
