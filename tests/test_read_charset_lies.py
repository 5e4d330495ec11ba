"""Declared charsets that lie and pages with terminal escapes (issue 39): a declaration the bytes disprove is
not believed (UTF-16/32 without a BOM or wide zero bytes, a legacy charset on valid UTF-8, names that are no
charset), and a console log saved as a page is kept without its escape sequences."""
from __future__ import annotations

import json

import numpy as np
import pytest

from corpusmill.stages import html
from tests.conftest import Warc, http_response, read_file

ZH = "这是一个关于河流与石头的中文段落，孩子们每天早上沿着河岸走去学校。"
EN = "The river runs past the old mill, and the children walk along its banks before school. "


def _page(meta: str = "", paragraphs: int = 12) -> str:
    body = "".join(f"<p>{ZH} {EN} paragraph {i}.</p>" for i in range(paragraphs))
    return f"<html><head>{meta}<title>河流</title></head><body><article>{body}</article></body></html>"


@pytest.mark.parametrize("declared", ["utf-16", "UTF-16LE", "utf-16be", "utf-32", "utf-32-le"])
def test_a_utf8_page_declared_utf16_or_utf32_is_read_as_utf8_not_as_cjk_garbage(declared):
    body = _page().encode("utf-8")
    text, codec, where = html.decode_page(body, declared)
    assert (codec, where) == ("utf-8", "detected") and text == _page()


@pytest.mark.parametrize("declared", ["gbk", "gb2312", "big5", "shift_jis", "euc-kr", "iso-8859-1", "windows-1251", "koi8-r"])
def test_a_utf8_page_declared_in_a_legacy_charset_is_read_as_utf8(declared):
    text, codec, _ = html.decode_page(_page().encode("utf-8"), declared)
    assert codec == "utf-8" and ZH in text


def test_legacy_pages_that_declare_their_own_charset_still_decode_with_it():
    gbk = _page('<meta charset="gbk">').encode("gbk")
    assert html.decode_page(gbk, "gbk")[1:] == ("gb18030", "header")
    assert html.decode_page(gbk)[1:] == ("gb18030", "meta")
    latin = ("<html><body>" + "<p>Café crème, déjà vu, naïve façade.</p>" * 20 + "</body></html>").encode("cp1252")
    assert html.decode_page(latin, "iso-8859-1")[1:] == ("cp1252", "header")
    ascii_only = _page().encode("utf-8").decode("ascii", "ignore").encode("ascii")
    assert html.decode_page(ascii_only, "gbk")[1:] == ("gb18030", "header")  # no evidence against it


@pytest.mark.parametrize("encoding, declared", [("utf-16-le", "utf-16"), ("utf-16-le", "utf-16-be"),
                                                ("utf-16-be", "utf-16"), ("utf-32-le", "utf-32"), ("utf-32-be", "utf-32")])
def test_wide_pages_without_a_bom_are_read_in_the_byte_order_their_zero_bytes_show(encoding, declared):
    body = _page().encode(encoding)
    text, codec, where = html.decode_page(body, declared)
    assert (text, codec, where) == (_page(), encoding, "header")


@pytest.mark.parametrize("declared", ["rot13", "base64", "zlib", "hex", "utf-7", "unicode_escape", "punycode", "idna",
                                      "undefined", "x-user-defined", "bogus\u00e9"])
def test_names_that_are_no_charset_leave_the_choice_to_detection(declared):
    body = (_page() + "<p>a+b-c \\u0041 xn--abc</p>").encode("utf-8")
    text, codec, where = html.decode_page(body, declared)
    assert (codec, where) == ("utf-8", "detected") and "a+b-c \\u0041" in text


@pytest.mark.parametrize("declared", [None, "utf-16", "utf-32", "utf-16-le", "rot13"])
def test_random_bytes_are_still_no_page_whatever_wide_or_odd_charset_is_declared(declared):
    noise = np.random.default_rng(7).integers(0, 256, 4000, dtype=np.uint8).tobytes()
    with pytest.raises(html.UndecodablePage):
        html.decode_page(b"<html><body>" + noise, declared)


def test_a_page_declaring_a_charset_that_is_no_text_encoding_is_a_document_in_a_warc(tmp_path):
    """Before: `charset=rot13` raised LookupError out of the reader, failing the whole read task."""
    warc = Warc()
    warc.add("https://lie.example/rot13", http_response(_page().encode(), ctype="text/html; charset=rot13"))
    warc.add("https://lie.example/utf16", http_response(_page().encode(), ctype="text/html; charset=utf-16"))
    path = tmp_path / "lies.warc.gz"
    path.write_bytes(warc.bytes())
    docs, quarantine, _ = read_file(path, tmp_path)
    assert not quarantine and len(docs) == 2
    for d in docs.values():
        assert ZH in d["text"] and json.loads(d["meta"])["encoding"] == "utf-8"


def _console_page() -> bytes:
    lines = []
    for i in range(300):
        colour = f"\x1b[{31 + i % 7}m" if i % 2 else "\x1b[1;32m"
        lines.append(f"{colour}[build {i:03d}]\x1b[0m compiling module {i} of the river project: ok")
    return ("<html><head><title>build log</title></head><body><pre>\x1b]0;build log\x07" + "\n".join(lines)
            + "\x1b[2K\x1b(B</pre></body></html>").encode("utf-8")


def test_a_console_log_page_with_ansi_escapes_is_kept_without_them(tmp_path):
    body = _console_page()
    share = body.count(b"\x1b") / len(body)
    assert share > 0.02  # 3% of its characters are ESC: more than the not-text check allows
    text, codec, _ = html.decode_page(body, "utf-8")
    assert codec == "utf-8" and "\x1b" not in text and "[build 007] compiling module 7" in text
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "log.html").write_bytes(body)
    docs, quarantine, _ = read_file(tmp_path / "in" / "log.html", tmp_path)
    assert not quarantine
    [doc] = docs.values()
    assert "\x1b" not in doc["text"] and "compiling module 299 of the river project: ok" in doc["text"]


def test_stripping_escapes_leaves_text_without_them_unchanged():
    text = _page() + " [31m no escape here; ESC-less brackets [0m stay"
    assert html.strip_terminal_escapes(text) is text
