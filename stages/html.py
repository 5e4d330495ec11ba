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
import os
import re
import zlib
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Union

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


# codecs Python has that no web page is in: they "decode" ASCII markup into other text (UTF-7's +...-,
# escapes) or are no charset at all; a page declaring one is decided by detection
_NOT_CHARSETS = {"utf-7", "unicode-escape", "raw-unicode-escape", "punycode", "idna", "undefined", "palmos"}
_WIDE = {"utf-16": 2, "utf-16-le": 2, "utf-16-be": 2, "utf-32": 4, "utf-32-le": 4, "utf-32-be": 4}


def _codec(name: str) -> Optional[str]:
    """The Python text codec of a charset name; None for unknown names and for codecs that are no
    charset (rot13, base64, zlib: `bytes.decode` refuses them; utf-7, unicode_escape ...)."""
    try:
        info = codecs.lookup(name)
    except (LookupError, ValueError, TypeError):
        return None
    if not getattr(info, "_is_text_encoding", True) or info.name in _NOT_CHARSETS:
        return None
    return info.name


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


def _utf32(body: bytes) -> Optional[str]:
    """UTF-32 without a byte-order mark, told by its zero bytes (ASCII markup: three of four bytes are 0)."""
    head = body[:META_SCAN_BYTES]
    quarter = len(head) // 4
    if quarter < 16:
        return None
    zeros = [head[k::4].count(0) for k in range(4)]
    if min(zeros[1:]) > 0.3 * quarter and zeros[0] < 0.05 * quarter:
        return "utf-32-le"
    if min(zeros[:3]) > 0.3 * quarter and zeros[3] < 0.05 * quarter:
        return "utf-32-be"
    return None


def _wide_codec(codec: str, body: bytes) -> Optional[str]:
    """A declared UTF-16 / UTF-32 is believed only when the bytes bear it out: a byte-order mark, or the
    zero bytes of ASCII markup in that width (then their order tells the byte order). UTF-16 decodes any
    even-length body "strictly", so a UTF-8 page declared UTF-16 would read as CJK-looking garbage."""
    if body.startswith((codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE)) and _WIDE[codec] == 4:
        return "utf-32"
    if body.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) and _WIDE[codec] == 2:
        return "utf-16"
    return _utf16(body) if _WIDE[codec] == 2 else _utf32(body)


MIN_UTF8_EVIDENCE = 4  # non-ASCII bytes in a body that is valid UTF-8: then UTF-8 it is, whatever is declared
_ASCII = bytes(range(128))


def _valid_utf8(body: bytes) -> Optional[str]:
    """The body as UTF-8 when it is valid UTF-8 holding non-ASCII characters: bytes of another charset
    almost never are (GBK, Big5, Shift_JIS, cp1252 with accents all break UTF-8's rules within a few
    characters), while a UTF-8 page declared as one of them would decode into mojibake."""
    if len(body.translate(None, _ASCII)) < MIN_UTF8_EVIDENCE:  # what is left without the ASCII bytes
        return None
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return None


# terminal escape sequences (a log or console capture saved as a page): CSI (ESC [ ... final byte), OSC
# (ESC ] ... BEL or ESC \\), and the two-byte ESC sequences; removed from the decoded text
_TERMINAL_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][0-9A-Za-z]|\x1b[@-_=>]")


def strip_terminal_escapes(text: str) -> str:
    """`text` without ANSI terminal escape sequences (colours, titles, cursor moves)."""
    return _TERMINAL_ESCAPES.sub("", text) if "\x1b" in text else text


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


def _try(body: bytes, codec: str) -> Optional[str]:
    """The body decoded strictly with `codec`, terminal escapes removed; None when it does not decode."""
    try:
        return strip_terminal_escapes(body.decode(codec))
    except (UnicodeError, LookupError):  # LookupError: a codec that is no text encoding
        return None


def decode_page(body: bytes, declared: Optional[str] = None) -> tuple[str, str, str]:
    """(text, codec used, where the charset came from: header | bom | meta | detected).

    A charset is taken when the body decodes strictly with it *and* the result is text (`not_text`,
    after removing terminal escape sequences): a declared charset that fails either way leaves the
    choice to detection (UTF-16 without a BOM first, then Resiliparse's); when no candidate gives text,
    UndecodablePage says why. Declarations the bytes disprove are not believed: UTF-16 / UTF-32 without
    a BOM or the zero bytes of wide ASCII markup, and any other charset on a body that is valid UTF-8
    with non-ASCII characters (then UTF-8 decides, as detected)."""
    tried: list[str] = []
    garbled: Optional[tuple[str, str]] = None  # the first codec that decoded, and why its text is not text
    for source, name in (("header", declared), ("bom", _bom(body)), ("meta", meta_charset(body))):
        if not name:
            continue
        candidates = _candidates(name)
        if source != "bom" and candidates:
            wide = [c for c in candidates if c in _WIDE]
            if wide:
                fits = _wide_codec(wide[0], body)
                candidates = [fits] if fits else []  # the bytes do not bear it out: detection decides
            elif "utf-8" not in candidates and "utf-8-sig" not in candidates:
                text = _valid_utf8(body)
                if text is not None and not_text(strip_terminal_escapes(text)) is None:
                    return strip_terminal_escapes(text), "utf-8", "detected"
        for codec in candidates:
            if codec in tried:
                continue
            tried.append(codec)
            text = _try(body, codec)
            if text is None:
                continue
            problem = not_text(text)
            if problem is None:
                return text, codec, source
            garbled = garbled or (codec, problem)
        break  # a declared charset that fails: detection decides, not a weaker declaration
    from resiliparse.parse.encoding import detect_encoding

    detected = detect_encoding(body)
    last: Optional[UnicodeDecodeError] = None
    guess = _utf16(body) or _utf32(body)
    for codec in ([guess] if guess else []) + _candidates(detected or "utf-8") + ["utf-8"]:
        if codec in tried:
            continue
        tried.append(codec)
        try:
            text = strip_terminal_escapes(body.decode(codec))
        except UnicodeDecodeError as e:
            last = e
            continue
        except (UnicodeError, LookupError):
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
    if body.startswith((codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE)):  # before UTF-16: FF FE 00 00 starts both
        return "utf-32"
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



# ---- WARC: read record by record, each gzip member decoded and checked, damage resynchronised ------------

@dataclass
class WarcPage:
    """One response record of a WARC file with an HTML body (or, with `problem`, one that cannot be read:
    (reason code, reason), its `body` then only the record's first bytes for the quarantine excerpt)."""

    offset: int  # byte offset of the record (.warc.gz: of the gzip member it starts in)
    url: Optional[str]
    date: Optional[str]
    record_id: Optional[str]
    charset: Optional[str]  # from the HTTP Content-Type header
    body: bytes  # as stored (content_encoding not yet undone)
    content_encoding: str = ""
    problem: Optional[tuple[str, str]] = None
    size: int = 0  # the record's declared block length (WARC Content-Length)


@dataclass
class WarcDamage:
    """A byte span of a WARC file that holds no readable record: [offset, end) of the file, why, and
    whether reading resumed after it (`end` < file size) or the file ends there."""

    code: str  # corrupt_stream | truncated_stream
    offset: int
    end: int
    detail: str
    partial: bytes = b""  # the first decoded bytes of a record cut off by the damage (an excerpt)
    partial_bytes: int = 0  # how many decoded bytes of that record were read


class WarcDamageError(ValueError):
    """`iter_warc` met a damaged span (the reader itself goes on past it, see `iter_warc_records`)."""


WARC_READ = 1 << 20  # file bytes read at a time
MAX_INFLATE = 4 << 20  # decompressed bytes taken from one zlib call: a small member may hold a lot
INFLATE_FEED = 256 << 10  # compressed bytes given to one call
MAX_WARC_HEADER_BYTES = 1 << 20  # a record's WARC header block (real ones are < 2 KB)
# an HTTP response's header block: a 40 KB cookie or CSP header and 20,000 header lines are ordinary
# enough in crawls to be read (FastWARC stopped the whole file at 32 KB); beyond this the record is
# quarantined (invalid_http) and its body skipped by its length
MAX_HTTP_HEADER_BYTES = 4 << 20
_VERSION_LINE = re.compile(rb"WARC/1\.[01]\r?\n")
_VERSION_AT_LINE = re.compile(rb"(?:^|\n)(WARC/1\.[01]\r?\n)")
_GZIP_MAGIC = b"\x1f\x8b\x08"
_RECORD_TYPES = ("warcinfo", "response", "resource", "request", "metadata", "revisit", "conversion", "continuation")
EXCERPT_BYTES = 4096


try:  # ISA-L's inflate (python-isal, when installed): 2.2x zlib's speed on WARC members, the same API
    from isal import isal_zlib as _fast_zlib

    _ZLIB_ERRORS: tuple = (zlib.error, _fast_zlib.error)
except ImportError:  # pragma: no cover - the standard library's zlib
    _fast_zlib = zlib
    _ZLIB_ERRORS = (zlib.error,)


def _inflater() -> Any:
    """A decoder of one gzip member."""
    return _fast_zlib.decompressobj(31)


class _Damaged(Exception):
    """Corrupt gzip data in the member that starts at file offset `offset`."""

    def __init__(self, offset: int, detail: str):
        super().__init__(detail)
        self.offset, self.detail = offset, detail


class _WarcBytes:
    """The (decompressed) bytes of a .warc / .warc.gz read forward in bounded pieces. Positions are
    stream positions (decompressed bytes, counted on across a resynchronisation); `file_offset` maps
    one to the file: itself for .warc, the start of the gzip member holding it for .warc.gz. A
    member's bytes count as checked (`verified`) once it ended with a good CRC; corrupt gzip data
    raises _Damaged, and `resync` starts again at the next gzip member that decodes."""

    def __init__(self, f: Any, gz: bool):
        self.f, self.gz = f, gz
        self.buf = bytearray()
        self.pos = 0  # unread bytes are buf[pos:]
        self.base = 0  # stream position of buf[0]
        self.raw = b""  # file bytes read; raw[raw_i:] not yet given to the decoder
        self.raw_i = 0
        self.raw_off = 0  # file offset of raw[0]
        self.d: Any = None
        self.in_member = False
        self.member_start = 0
        self.members: list[tuple[int, int]] = []  # (stream position where a member's bytes begin, file offset)
        self.verified = 0  # stream position up to which every member ended with its checksum
        self.truncated = False  # the file ended inside a gzip member
        self.full = False  # the last zlib call stopped at MAX_INFLATE (more output may be pending)
        self.at_eof = False

    # -- positions
    def tell(self) -> int:
        return self.base + self.pos

    def end(self) -> int:
        return self.base + len(self.buf)

    def available(self) -> int:
        return len(self.buf) - self.pos

    def file_offset(self, stream_pos: int) -> int:
        if not self.gz:
            return stream_pos
        best = self.members[0][1] if self.members else self.raw_off + self.raw_i
        for start, off in self.members:
            if start > stream_pos:
                break
            best = off
        return best

    def _prune(self) -> None:
        if self.pos > (1 << 20) and self.pos * 2 > len(self.buf):
            del self.buf[:self.pos]
            self.base += self.pos
            self.pos = 0
        if len(self.members) > 64:  # members far behind the read position (a record spans few)
            del self.members[:32]

    # -- reading
    def fill(self) -> bool:
        """More bytes into the buffer (or a member's end checked); False at the end of the file."""
        if self.at_eof:
            return False
        if not self.gz:
            data = self.f.read(WARC_READ)
            if not data:
                self.at_eof = True
                return False
            self._prune()
            self.buf += data
            return True
        while True:
            if self.raw_i >= len(self.raw) and not (self.in_member and self.full):
                self.raw_off += len(self.raw)
                self.raw, self.raw_i = self.f.read(WARC_READ), 0
                if not self.raw:
                    self.at_eof = True
                    self.truncated = self.in_member
                    return False
            if not self.in_member:
                while self.raw_i < len(self.raw) and self.raw[self.raw_i] == 0:  # zero padding after a member
                    self.raw_i += 1
                if self.raw_i >= len(self.raw):
                    continue
                self.d = _inflater()
                self.in_member, self.member_start = True, self.raw_off + self.raw_i
                self._prune()
                self.members.append((self.end(), self.member_start))
            # small pieces: at a member's end zlib copies what it was given past it (unused_data)
            given = memoryview(self.raw)[self.raw_i:self.raw_i + INFLATE_FEED]
            try:
                out = self.d.decompress(given, MAX_INFLATE)
            except _ZLIB_ERRORS as e:
                raise _Damaged(self.member_start, f"corrupt gzip data in the member at byte {self.member_start:,}: {e}") \
                    from None
            self.full = len(out) >= MAX_INFLATE
            rest = self.d.unused_data if self.d.eof else self.d.unconsumed_tail
            self.raw_i += len(given) - len(rest)
            if out:
                self._prune()
                self.buf += out
            if self.d.eof:
                self.in_member, self.full = False, False
                self.verified = self.end()
                return True
            if out:
                return True

    def ensure(self, n: int) -> bool:
        """At least n unread bytes buffered (False: the file ends before)."""
        while self.available() < n:
            if not self.fill():
                return False
        return True

    def take(self, n: int) -> bytes:
        out = bytes(self.buf[self.pos:self.pos + n])
        self.pos += len(out)
        return out

    def skip(self, n: int) -> int:
        """Pass over n bytes without holding them; returns how many there were."""
        done = 0
        while done < n:
            if not self.available() and not self.fill():
                break
            k = min(n - done, self.available())
            self.pos += k
            done += k
            if self.pos == len(self.buf):
                self.base += len(self.buf)
                self.buf.clear()
                self.pos = 0
        return done

    def find(self, pattern: bytes, limit: int) -> int:
        """Offset (from the read position) of `pattern` within the next `limit` bytes, reading on as
        needed; -1 when it is not there (or the file ends first)."""
        scanned = 0
        while True:
            i = self.buf.find(pattern, self.pos + max(0, scanned - len(pattern)), self.pos + limit)
            if i >= 0:
                return i - self.pos
            scanned = self.available()
            if scanned >= limit or not self.fill():
                return -1

    def skip_blank(self) -> bool:
        """Pass over the CR/LF between records; False at the end of the file."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in (10, 13):
                self.pos += 1
            if self.pos < len(self.buf):
                return True
            if not self.fill():
                return False

    def scan_record(self) -> bool:
        """Read on to the next line that starts a WARC record (`WARC/1.0` / `WARC/1.1`), dropping what
        comes before it; False when the file ends first."""
        while True:
            m = _VERSION_AT_LINE.search(self.buf, self.pos)
            if m:
                self.pos = m.start(1)
                return True
            keep = max(self.pos, len(self.buf) - 12)  # a version line may be cut at the buffer's end
            self.pos = keep
            if not self.fill():
                self.pos = len(self.buf)
                return False

    def settle(self, end: int) -> None:
        """.warc.gz: read on until the member holding the record that ends at `end` has ended, its CRC
        checked (raises _Damaged when it fails), unless that member holds more (several records a member)."""
        while self.gz and self.in_member and self.verified < end and self.end() <= end + 4:
            if not self.fill():
                return

    def resync(self, after: int) -> Optional[int]:
        """The file offset of the next gzip member from `after` on whose start decodes (None: none
        left); the buffer is emptied, reading goes on there."""
        self.base += len(self.buf)
        self.buf.clear()
        self.pos = 0
        self.in_member, self.full, self.raw, self.raw_i = False, False, b"", 0
        off = after
        while True:
            self.f.seek(off)
            chunk = self.f.read(WARC_READ)
            if len(chunk) < len(_GZIP_MAGIC):
                self.at_eof, self.raw_off = True, off + len(chunk)
                return None
            i = chunk.find(_GZIP_MAGIC)
            while i >= 0:
                if self._decodes(off + i):
                    self.f.seek(off + i)
                    self.raw_off, self.at_eof = off + i, False
                    return off + i
                i = chunk.find(_GZIP_MAGIC, i + 1)
            off += len(chunk) - (len(_GZIP_MAGIC) - 1)

    def _decodes(self, at: int) -> bool:
        self.f.seek(at)
        head = self.f.read(64 << 10)
        try:
            _inflater().decompress(head, 64 << 10)
            return True
        except _ZLIB_ERRORS:
            return False


def _header_fields(block: bytes) -> dict[str, str]:
    """Header lines (after the first) as {lowercased name: value}: the first of a repeated name,
    folded continuation lines joined with a space."""
    out: dict[str, str] = {}
    last = None
    for line in block.split(b"\n")[1:]:
        line = line.rstrip(b"\r")
        if not line:
            continue
        if line[:1] in (b" ", b"\t") and last is not None:
            if last in out and out[last] is not None:
                out[last] = (out[last] + " " + line.strip().decode("latin-1")).strip()
            continue
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        key = name.strip().decode("latin-1").lower()
        if key in out:
            last = None  # a repeated header: the first is kept, its continuations too
            continue
        out[key] = value.strip().decode("latin-1")
        last = key
    return out


def _http_status(block: bytes) -> Optional[int]:
    parts = block.split(b"\n", 1)[0].split()
    if len(parts) >= 2 and parts[0].startswith(b"HTTP/") and parts[1].isdigit() and len(parts[1]) == 3:
        return int(parts[1])
    return None


def iter_warc_records(path: str, skipped: dict[str, int], max_record_bytes: Optional[int] = None
                      ) -> Iterator[Union[WarcPage, WarcDamage]]:
    """The HTML response records of a .warc / .warc.gz file in file order, and the damaged spans between
    them. Every other record is counted in `skipped` by kind (request, metadata, not_html,
    http_status_3xx ...). A .warc.gz is decoded member by member and a record is given only once the
    member holding it ended with a good CRC (several records in one member: as they are decoded).
    Corrupt gzip data, bytes that are not a WARC record, or a record header that cannot be read is one
    WarcDamage(corrupt_stream) from the damaged record's offset to the next record that reads (the next
    gzip member that decodes, the next `WARC/1.x` line); a file cut off is WarcDamage(truncated_stream).
    A record whose block is larger than `max_record_bytes` is skipped unread (WarcPage with problem
    record_too_large) and so is one whose HTTP headers do not end within MAX_HTTP_HEADER_BYTES (invalid_http)."""
    gz = path.lower().endswith(".gz")
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        yield from _warc_records(_WarcBytes(f, gz), size, skipped, max_record_bytes)


def iter_warc(path: str, skipped: dict[str, int]) -> Iterator[WarcPage]:
    """The readable HTML pages of an intact WARC file (benchmarks, tools); WarcDamageError at the first
    damaged span (the reader uses `iter_warc_records`, which goes on past it)."""
    for item in iter_warc_records(path, skipped):
        if isinstance(item, WarcDamage):
            raise WarcDamageError(f"{item.detail} (bytes {item.offset:,}-{item.end:,})")
        if item.problem is None:
            yield item


def _block_end(src: _WarcBytes, limit: int) -> tuple[int, int]:
    """(where a header block ends, the length of its blank line) within the next `limit` bytes: the first
    CRLF CRLF or LF LF; (-1, 0) when neither is there."""
    i = src.find(b"\r\n\r\n", limit)
    j = src.find(b"\n\n", i if i >= 0 else limit)
    if j >= 0 and (i < 0 or j < i):
        return j, 2
    return (i, 4) if i >= 0 else (-1, 0)


def _response_head(src: _WarcBytes, page: WarcPage, block: int, warc_type: str
                   ) -> Optional[tuple[int, dict[str, str], Optional[str]]]:
    """A response record's HTTP head, read ahead in the buffer: (its length, its headers, the skipped
    kind when it is no HTML page (http_status_3xx, not_html) or None); `page.problem` set when the
    headers do not end within MAX_HTTP_HEADER_BYTES; None when the file ends inside them."""
    if not warc_type.strip().lower().startswith("application/http"):
        return 0, {}, "not_html"  # no HTTP headers: no content type
    limit = min(block, MAX_HTTP_HEADER_BYTES)
    end, sep = _block_end(src, limit)
    if end < 0 or end + sep > block:
        if src.available() < limit:
            return None
        page.body = bytes(src.buf[src.pos:src.pos + EXCERPT_BYTES])
        page.problem = ("invalid_http", f"the HTTP headers of the record at byte offset {page.offset:,} ({page.url}) "
                        f"do not end within {limit:,} bytes")
        return 0, {}, None
    raw_head = bytes(src.buf[src.pos:src.pos + end])
    status = _http_status(raw_head)
    http = _header_fields(raw_head)
    if status is not None and not 200 <= status < 300:
        return end + sep, http, f"http_status_{status // 100}xx"
    if not any(t in http.get("content-type", "").lower() for t in HTML_TYPES):
        return end + sep, http, "not_html"
    return end + sep, http, None


def _warc_records(src: _WarcBytes, size: int, skipped: dict[str, int], max_record: Optional[int]
                  ) -> Iterator[Union[WarcPage, WarcDamage]]:
    lost: Optional[WarcDamage] = None  # the damaged span being passed over
    record: Optional[int] = None  # file offset of the record being read
    scanning = False  # after damage: passing over bytes up to the next record
    cut = False  # a truncated_stream row was given

    def open_span(offset: int, detail: str, partial: bytes = b"", partial_bytes: int = 0) -> None:
        nonlocal lost
        if lost is None:
            lost = WarcDamage("corrupt_stream", offset, offset, detail, partial[:EXCERPT_BYTES], partial_bytes)

    def cut_off(what: str, got: int, declared: Optional[int], head: bytes) -> WarcDamage:
        nonlocal lost, cut
        at = record if record is not None else src.file_offset(src.tell())
        start = lost.offset if lost is not None else at
        lost, cut = None, True
        of = f" of its {declared:,}" if declared is not None else ""
        return WarcDamage("truncated_stream", start, size, f"the record at byte offset {at:,} ends after {got:,}{of} "
                          f"{what} (file cut off)", head[:EXCERPT_BYTES], got)

    while True:
        record = None
        try:
            if scanning:
                found = src.scan_record()
                scanning = False
                if not found:
                    break
            if not src.skip_blank():
                break
            src.ensure(12)
            here = src.file_offset(src.tell())
            if not _VERSION_LINE.match(src.buf, src.pos):
                open_span(here, f"bytes at offset {here:,} are not a WARC record")
                scanning = True
                src.pos += 1
                continue
            record = here
            n, sep = _block_end(src, MAX_WARC_HEADER_BYTES)
            if n < 0:
                if src.at_eof and src.available() < MAX_WARC_HEADER_BYTES:
                    head = src.take(src.available())
                    yield cut_off("header bytes", len(head), None, head)
                    break
                open_span(here, f"the WARC record header at byte offset {here:,} does not end within "
                          f"{MAX_WARC_HEADER_BYTES:,} bytes")
                scanning, record = True, None
                src.pos += 1
                continue
            header = src.take(n + sep)
            fields = _header_fields(header)
            length = fields.get("content-length", "").strip()
            if not length.isdigit():
                open_span(here, f"the WARC record at byte offset {here:,} has no valid Content-Length "
                          f"({length[:40]!r})", header)
                scanning, record = True, None
                continue
            if lost is not None:  # the damaged span ends where this record begins
                lost.end = here
                yield lost
                lost = None
            block = int(length)
            rtype = fields.get("warc-type", "").strip().lower()
            rtype = rtype if rtype in _RECORD_TYPES else "unknown"
            if rtype != "response":
                got = src.skip(block)
                if got < block:
                    yield cut_off("bytes", got, block, header)
                    break
                skipped[rtype] = skipped.get(rtype, 0) + 1
                continue
            page = WarcPage(here, fields.get("warc-target-uri"), fields.get("warc-date"), fields.get("warc-record-id"),
                            None, b"", size=block)
            head = _response_head(src, page, block, fields.get("content-type", ""))
            if head is None:  # the file ends inside the headers
                got = src.available()
                yield cut_off("bytes", got, block, src.take(got))
                break
            head_len, http, skip_as = head
            if skip_as is None and page.problem is None and max_record is not None and block > max_record:
                page.body = bytes(src.buf[src.pos + head_len:src.pos + head_len + EXCERPT_BYTES])
                page.problem = ("record_too_large", f"the record at byte offset {here:,} ({page.url}) is {block:,} "
                                f"bytes, larger than input.max_record_mb ({max_record:,} bytes); its body was not read")
            if skip_as is not None or page.problem is not None:
                got = src.skip(block)
                if got < block:
                    yield cut_off("bytes", got, block, page.body or header)
                    break
                src.settle(src.tell())
                if skip_as is not None:
                    skipped[skip_as] = skipped.get(skip_as, 0) + 1
                else:
                    yield page
                continue
            if not src.ensure(block):
                got = src.available()
                yield cut_off("bytes", got, block, src.take(min(got, EXCERPT_BYTES)))
                break
            src.pos += head_len
            page.body = src.take(block - head_len)
            src.settle(src.tell())
            page.charset = header_charset(http.get("content-type", ""))
            page.content_encoding = http.get("content-encoding", "")
            record = None
            yield page
        except _Damaged as e:
            if lost is None:
                open_span(min(record, e.offset) if record is not None else e.offset, e.detail)
            if src.resync(e.offset + 1) is None:
                break
            scanning = True
    if lost is not None:
        lost.end = size
        yield lost
    elif src.truncated and not cut:
        at = src.file_offset(src.tell())
        yield WarcDamage("truncated_stream", size, size, f"the file ends inside its gzip member at byte offset {at:,}, "
                         f"after the last record, read whole, whose checksum is cut off (file cut off)")
