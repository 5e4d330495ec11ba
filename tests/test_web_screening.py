"""Issue 18: personal data, blocked words, language ID, Chinese script conversion, WARC/HTML input.

Kernels are tested directly on small data; one real Dask run goes from a WARC file (a real Debian
Sphinx page, and real Chinese laws from ../shared/data/kept in a law portal's page chrome, encoded as
GBK and Big5, packed by warcio here) and a JSONL file through every new step."""
from __future__ import annotations

import datetime as dt
import functools
import glob
import html as _html
import io
import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from corpusmill.stages import blocklist, html, langid, pii
from corpusmill.stages.normalize import normalize_batch

from tests.conftest import LENGTH_ONLY_FILTER, SHARED_DATA, write_jsonl


def _id_number(first17: str) -> str:
    """An 18-character resident ID number with its correct GB 11643 check digit."""
    total = sum(int(d) * w for d, w in zip(first17, (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)))
    return first17 + "10X98765432"[total % 11]


GOOD_ID = _id_number("11010519491231002")  # ends in X
GOOD_ID2 = _id_number("44030419900307123")
WRONG_CHECK = GOOD_ID2[:-1] + str((int(GOOD_ID2[-1]) + 1) % 10 if GOOD_ID2[-1].isdigit() else 0)
NO_SUCH_DAY = _id_number("44030419900230123")  # 30 February, check digit right
FUTURE = _id_number("44030420991231123")  # born in 2099


def _frame(texts: list[str]) -> pd.DataFrame:
    return pd.DataFrame({"uid": np.arange(len(texts), dtype=np.int64), "id": [f"d{i}" for i in range(len(texts))],
                         "text": texts, "source": "s", "meta": None})


def _found(text: str) -> list[tuple[str, str]]:
    return [(kind, text[s:e]) for s, e, kind in pii.find_pii(text)]


# ---- personal data -------------------------------------------------------------------------------

def test_resident_id_numbers_need_the_check_digit_and_a_real_birth_date():
    assert pii.id_number_valid(GOOD_ID) and pii.id_number_valid(GOOD_ID.lower())
    for bad in (WRONG_CHECK, NO_SUCH_DAY, FUTURE):
        assert not pii.id_number_valid(bad), bad
    assert _found(f"身份证号{GOOD_ID}，另一个{GOOD_ID2}。") == [("id_number", GOOD_ID), ("id_number", GOOD_ID2)]
    assert _found(f"身份证号{WRONG_CHECK}，{NO_SUCH_DAY} {FUTURE}") == []


def test_first_generation_15_digit_id_numbers_need_a_province_and_a_real_birth_date():
    old = "110105491231002"  # Beijing Chaoyang, born 1949-12-31, sequence 002
    assert pii.id_number_valid(old) and pii.id15_valid("440304900228123") and pii.id15_valid("650102600229001")
    for bad in ("440304900230123",  # 30 February
                "440304901301123",  # month 13
                "650102000229001",  # 29 February 1900: no leap day (1900 is not a leap year)
                "990105491231002",  # no province 99
                "123456789012345"):  # month 78
        assert not pii.id_number_valid(bad), bad
    assert _found(f"旧身份证号{old}，新号{GOOD_ID}。") == [("id_number", old), ("id_number", GOOD_ID)]
    assert _found(f"ratio 0.{old} and {old}1 and 4{old}") == []  # a decimal fraction, 16 digits
    rng = np.random.default_rng(0)
    numbers = rng.integers(10**14, 10**15, 20000)
    assert np.mean([pii.id15_valid(str(x)) for x in numbers]) < 0.02  # ~1.4% of random numbers pass


def test_numbers_that_only_look_like_personal_data_are_left_alone():
    lookalikes = [
        "订单号 202406151234567890 已发货",  # 18 digits, no valid birth date / check
        "random 738291046582910374 number",  # random 18 digits
        "时间戳 1718438400 和 1718438400123",  # Unix seconds and milliseconds
        "tracking 4111111111111112",  # Visa prefix, Luhn fails
        "invoice 9988776655443322 paid",  # Luhn holds? no issuer prefix 99
        "version 1.2.3 and 3.14159, build 2024.06.15",
        "private 192.168.1.20, 10.0.0.1, 127.0.0.1, 172.16.5.4, ::1, fe80::1, 2001:db8::7",
        "date 2024-06-15 12:30:45, std::vector<int>, a:b:c",
        "ISBN 978-7-111-54742-6, 12345678",
        "12.2.1.1.\xa0邮件列表的行为准则",  # section numbers of a DocBook manual
        "参见 第\xa01.3.2.3\xa0节 “发送修复和补丁”",
        "see section 4.2.1.3 and version 2.6.32.1 of the kernel",
        "values in the range (-32768000, +32768000).",  # a signed number, not a +country phone
        "%a:: and a:: and ::1:25 in a netstat listing",
        "<img src=logo@2x.png> and icon@3x.jpg",
    ]
    for text in lookalikes:
        assert _found(text) == [], text


def test_bank_cards_need_an_issuer_prefix_and_the_luhn_check():
    assert pii.luhn_valid("4111111111111111") and not pii.luhn_valid("4111111111111112")
    assert pii.bank_card_valid("6222 0212 3456 7894") is pii.luhn_valid("6222021234567894")
    valid_unionpay = next(f"622202123456789{d}" for d in "0123456789" if pii.luhn_valid(f"622202123456789{d}"))
    assert _found(f"卡号{valid_unionpay}，visa 4111-1111-1111-1111") == [
        ("bank_card", valid_unionpay), ("bank_card", "4111-1111-1111-1111")]


def test_phones_emails_and_public_ips_are_found():
    text = ("请拨打13812345678或+86 139-1234-5678，邮件 zhang.san@example.com.cn；"
            "London +44 20 7946 0958, NY (212) 555-0123, 北京 010-12345678. "
            "Servers 8.8.8.8 and 2001:4860:4860::8888, not 192.168.0.1.")
    assert _found(text) == [("phone", "13812345678"), ("phone", "+86 139-1234-5678"),
                            ("email", "zhang.san@example.com.cn"), ("phone", "+44 20 7946 0958"),
                            ("phone", "(212) 555-0123"), ("phone", "010-12345678"), ("ip", "8.8.8.8"),
                            ("ip", "2001:4860:4860::8888")]


def test_pii_batch_replaces_drops_or_counts_per_kind_and_masks_examples():
    texts = [f"邮箱 a.b@example.org 电话 13912345678 身份证 {GOOD_ID}",
             "only an address 8.8.4.4 here",
             "nothing personal at all, order 202406151234567890"]
    actions = {"email": "replace", "phone": "count", "id_number": "drop", "bank_card": "replace", "ip": "replace"}
    res = pii.pii_batch(_frame(texts), actions, pii.DEFAULT_TOKENS)
    assert res.stats["removed"] == {"pii": 1} and res.stats["docs_out"] == 2
    assert res.kept["text"].tolist() == ["only an address <IP> here", texts[2]]
    assert res.stats["pii_matches"] == {"email": 1, "id_number": 1, "bank_card": 0, "phone": 1, "ip": 1}
    removed = res.removed.iloc[0]
    assert removed["reason"] == "pii" and removed["score"] == 1
    # the audit row and the examples never carry the personal data itself
    assert GOOD_ID not in removed["text"] and "13912345678" not in removed["text"] and "<ID_NUMBER>" in removed["text"]
    shown = json.dumps(res.stats["pii_examples"], ensure_ascii=False)
    for raw in (GOOD_ID, "13912345678", "a.b@example.org", "8.8.4.4"):
        assert raw not in shown
    assert "139******78" in shown and "a**@example.org" in shown
    counted = pii.pii_batch(_frame(texts), dict.fromkeys(pii.KINDS, "count"), pii.DEFAULT_TOKENS)
    assert counted.kept["text"].tolist() == texts and counted.stats["pii_matches"]["id_number"] == 1
    off = pii.pii_batch(_frame(texts), dict.fromkeys(pii.KINDS, "off"), pii.DEFAULT_TOKENS)
    assert off.stats["docs_scanned"] == 0 and off.kept["text"].tolist() == texts


def test_a_birth_date_of_today_is_valid_and_tomorrow_is_not():
    today = dt.date(2024, 6, 15)
    assert pii.id_number_valid(_id_number("11010520240615123"), today=today)
    assert not pii.id_number_valid(_id_number("11010520240616123"), today=today)


# ---- blocked words --------------------------------------------------------------------------------

def test_blocked_words_match_english_on_word_boundaries_and_chinese_as_substrings(tmp_path):
    listing = tmp_path / "blocked.txt"
    listing.write_text("# a comment\nass\n赌博\nBad Word\n\n", encoding="utf-8")
    terms, sha = blocklist.load_terms(listing)
    assert terms == ["ass", "赌博", "bad word"] and len(sha) == 64
    texts = ["A class to assess the passage.", "You ass! ASS.", "网上赌博和线下赌博", "a bad word, BAD WORD.", ""]
    scores = blocklist.score_blocked(texts, terms)
    assert scores["blocked_words"].tolist() == [0, 2, 2, 2, 0]
    assert scores["blocked_words_per_1k"][1] == pytest.approx(2 * 1000 / len(texts[1]))


# ---- language, script conversion --------------------------------------------------------------------

def test_language_model_ships_in_the_package_and_never_touches_the_network():
    path = langid.model_path()
    assert path.name == "lid.176.ftz" and "site-packages" in str(path) and path.stat().st_size > 500_000
    code = ("import socket\n"
            "def refuse(*a, **k): raise OSError('network used')\n"
            "socket.socket.connect = refuse; socket.create_connection = refuse; socket.getaddrinfo = refuse\n"
            "from corpusmill.stages.langid import identify\n"
            "codes, probs = identify(['这是一个用来测试语言识别的中文句子。', 'This sentence is written in English.', "
            "'Dieser Satz ist auf Deutsch geschrieben.', '12345'])\n"
            "print(list(codes), [round(float(p), 2) for p in probs])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("['zh', 'en', 'de', 'und']")


def test_opencc_converts_traditional_to_simplified_and_counts_documents():
    df = _frame(["這個國家的學生們說話", "already simplified 这个", "plain english"])
    res = normalize_batch(df, chinese_convert="t2s")
    assert res.kept["text"].tolist()[0] == "这个国家的学生们说话"
    assert res.stats["docs_converted"] == 1 and res.stats["chinese_convert"] == "t2s"


# ---- real HTML, WARC ---------------------------------------------------------------------------------

def _deb_html(pattern: str, member: str) -> str:
    """One HTML file out of a Debian documentation package in apt's cache (or the shared corpus builder's
    downloads); the test is skipped when the package is not on this machine."""
    debs = sorted(glob.glob(f"/var/cache/apt/archives/{pattern}") + glob.glob(f"/tmp/i14/debs/{pattern}"))
    if not debs:
        pytest.skip(f"no {pattern} here (../shared/data/build_corpus.sh or apt-get download fetches it)")
    tar = subprocess.run(["dpkg-deb", "--fsys-tarfile", debs[0]], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        return t.extractfile(member).read().decode("utf-8")


@pytest.fixture(scope="module")
def en_page() -> str:
    """A real Sphinx page (python3.11-doc is in the machine image's apt cache)."""
    return _deb_html("python3.11-doc_*.deb", "./usr/share/doc/python3.11/html/library/fractions.html")


EN_BODY = "The fractions module provides support for rational number arithmetic."
EN_NAVIGATION = ("Navigation", "Show Source", "Report a Bug", "Previous topic", "Next topic", "Quick search")


def test_extraction_keeps_the_body_and_paragraphs_and_drops_the_navigation(en_page):
    text = html.extract_main_text(en_page)
    assert EN_BODY in text and "limit_denominator" in text
    for nav in EN_NAVIGATION:
        assert nav in en_page and nav not in text, nav
    assert "\n\nA Fraction instance can be constructed" in text  # paragraphs stay apart


# Chinese pages: two real laws (LawRefBook, ../shared/data/kept) in the chrome of a law portal, one page
# laid out with <div id/class> blocks, one with HTML5 <header>/<nav>/<aside>/<footer>.
LAW_ARCHIVE = SHARED_DATA / "kept" / "lawrefbook_laws.tar.xz"
LAWS = ("上海口岸服务条例(2020-05-14).md", "上海市专利保护条例.md")  # the 2nd and 4th file of the archive
LAW_SENTENCES = ("第一条 为了规范口岸开放，提高口岸通关效率，保障口岸安全畅通，促进对外开放和经济社会发展，"
                 "根据国家有关法律、行政法规的规定，结合本市实际，制定本条例。",
                 "第一条 为了保护发明创造专利权，保障专利权人的合法权益，促进技术创新，维护市场经济秩序，"
                 "根据《中华人民共和国专利法》、《中华人民共和国专利法实施细则》和其他有关法律、行政法规，"
                 "结合本市实际情况，制定本条例。")
LAW_NAV = ("首页", "法律", "行政法规", "地方性法规", "司法解释", "部门规章", "法规检索")
LAW_CHROME = ("法规参考网", "搜索法规", "部门规章", "司法解释", "法规检索", "热门法规", "中华人民共和国民法典",
              "最新修订", "本站公告：系统维护通知", "关于我们", "网站地图", "版权所有", "沪ICP备12345678号-2",
              "沪公网安备 31010102003456号", "分享到", "上一篇：上海市港口条例", "下一篇", "广告")


def _law_files(archive: Path, names: tuple[str, ...], max_members: int = 200) -> list[str]:
    """The named law files, read from the start of the .tar.xz stream (they are among its first files:
    nothing else of the 58 MB is decompressed)."""
    found: dict[str, str] = {}
    with tarfile.open(archive, "r:xz") as tar:
        for i, member in enumerate(tar):
            name = member.name.rsplit("/", 1)[-1]
            if name in names:
                found[name] = tar.extractfile(member).read().decode("utf-8")
                if len(found) == len(names):
                    return [found[n] for n in names]
            if i >= max_members:
                break
    raise AssertionError(f"{sorted(set(names) - set(found))} not among the first {max_members} files of {archive}")


def _law_blocks(markdown: str) -> tuple[str, list[tuple[str, str]]]:
    """(title, [(tag, text)]) of a LawRefBook file: its adoption notes and articles as <p>, its
    '## ' chapter headings as <h2>, in order."""
    head, _, body = markdown.partition("<!-- INFO END -->")
    title, _, notes = head.partition("\n")
    blocks = [b.strip() for b in f"{notes}\n\n{body}".split("\n\n")]
    return title.lstrip("# ").strip(), [("h2", b[3:].strip()) if b.startswith("## ") else ("p", b) for b in blocks if b]


def _law_page(title: str, blocks: list[tuple[str, str]], layout: str) -> str:
    """A law portal's page around the law: header with logo and search box, menu, breadcrumb, share
    and previous/next links, a sidebar, a footer with copyright and ICP licence, a script; UTF-8 <meta>."""
    e = _html.escape
    content = "\n".join(f"<{tag}>{e(text)}</{tag}>" for tag, text in blocks)
    menu = "".join(f'<li><a href="/c/{i}">{n}</a></li>' for i, n in enumerate(LAW_NAV))
    side = ('<h3>热门法规</h3><ul><li><a href="/l/1">中华人民共和国民法典</a></li>'
            '<li><a href="/l/2">中华人民共和国劳动合同法</a></li></ul>'
            '<h3>最新修订</h3><p><a href="/n/7">本站公告：系统维护通知</a></p>')
    foot = ('<a href="/about">关于我们</a> | <a href="/contact">联系方式</a> | <a href="/sitemap">网站地图</a>'
            '<p>版权所有 &copy; 2024 法规参考网</p><p><a href="https://beian.miit.gov.cn/">沪ICP备12345678号-2</a> '
            '<img src="/img/ga.png" alt="">沪公网安备 31010102003456号</p>')
    share = '<div class="share">分享到：<a href="#wx">微信</a> <a href="#wb">微博</a></div>'
    pager = ('<div class="pager"><a href="/l/41">上一篇：上海市港口条例</a> '
             '<a href="/l/43">下一篇：上海市航道条例</a></div>')
    head = (f'<!DOCTYPE html>\n<html lang="zh-CN"><head><meta charset="utf-8">\n<title>{e(title)} - 法规参考网</title>\n'
            '<link rel="stylesheet" href="/static/site.css"><script>var slot = "广告";</script></head>\n<body>\n')
    if layout == "divs":
        return (head + '<div id="header" class="header"><div class="logo"><a href="/">法规参考网</a></div>'
                '<form class="search" action="/search"><input name="q" placeholder="搜索法规"><button>搜索</button>'
                f'</form></div>\n<div id="nav" class="nav"><ul class="menu">{menu}</ul></div>\n'
                '<div class="breadcrumb"><a href="/">首页</a> &gt; <a href="/c/3">地方性法规</a> &gt; 上海</div>\n'
                f'<div id="main" class="container"><div class="content">\n<h1>{e(title)}</h1>\n{content}\n'
                f'{share}{pager}</div>\n<div id="sidebar" class="sidebar">{side}</div></div>\n'
                f'<div id="footer" class="footer">{foot}</div>\n</body></html>')
    return (head + '<header><a class="logo" href="/">法规参考网</a><form role="search" action="/search">'
            f'<input name="q" placeholder="搜索法规"></form><nav><ul>{menu}</ul></nav></header>\n'
            f'<main><article>\n<h1>{e(title)}</h1>\n{content}\n</article>\n<aside>{share}{pager}{side}</aside></main>\n'
            f'<footer>{foot}</footer>\n</body></html>')


@functools.lru_cache(maxsize=1)
def _s2tw():
    import opencc

    return opencc.OpenCC("s2tw.json")


def _traditional(text: str) -> str:
    """Taiwan's traditional characters (OpenCC s2tw): the ones Big5 holds (plain s2t writes 爲 and 啓,
    which Big5 does not)."""
    return _s2tw().convert(text)


def _encoded(page: str) -> dict[str, bytes]:
    """The page as UTF-8, GBK and (in traditional characters) Big5 bytes, each declaring its charset in
    <meta>; strict: a character the charset lacks fails here instead of becoming an entity."""
    return {"utf-8": page.encode("utf-8"),
            "gbk": page.replace('charset="utf-8"', 'charset="gbk"').encode("gbk"),
            "big5": _traditional(page).replace('charset="utf-8"', 'charset="big5"').encode("big5")}


@pytest.fixture(scope="module")
def law_pages() -> list[dict]:
    """Per law: the page (UTF-8 text and its three encodings) and the text blocks extraction must give.
    Only paragraphs that GBK and Big5 (after s2tw) can encode go into the page."""
    if not LAW_ARCHIVE.is_file():
        pytest.skip(f"needs {LAW_ARCHIVE} (real LawRefBook laws)")

    def encodable(text: str) -> bool:
        try:
            text.encode("gbk"), _traditional(text).encode("big5")
            return True
        except UnicodeEncodeError:
            return False

    pages = []
    for markdown, layout in zip(_law_files(LAW_ARCHIVE, LAWS), ("divs", "html5")):
        title, blocks = _law_blocks(markdown)
        usable = [(tag, text) for tag, text in blocks if encodable(text)]
        assert len(usable) >= 0.9 * len(blocks) > 30
        page = _law_page(title, usable, layout)
        # extraction collapses runs of spaces ("第一章  总则"); ideographic spaces stay
        expected = [title] + [re.sub(" +", " ", text) for _, text in usable]
        pages.append({"title": title, "html": page, "bytes": _encoded(page), "blocks": expected})
    return pages


@pytest.fixture(scope="module")
def law_warc(law_pages, tmp_path_factory) -> dict[str, tuple[str, dict]]:
    """{url: (text, meta)} of the six law pages (2 laws x UTF-8/GBK/Big5) packed into a WARC by warcio and
    read back by the reader. The charset comes from the HTTP header for UTF-8 and the first Big5 page,
    from the <meta> tag for GBK and the second Big5 page."""
    from corpusmill.stages import read

    root = tmp_path_factory.mktemp("laws")
    headers = {"utf-8": "text/html; charset=utf-8", "gbk": "text/html", "big5": "text/html; charset=big5"}
    records = [(f"https://law.example/{i}/{enc}.html", body,
                "text/html" if (i, enc) == (1, "big5") else headers[enc])
               for i, page in enumerate(law_pages) for enc, body in page["bytes"].items()]
    _warc(root / "in" / "laws.warc.gz", records)
    units, _ = read.plan_units(read.expand_inputs([str(root / "in")]), 64 << 20, 32 << 20)
    result = read.read_unit(units[0], read.ReadOptions(), str(root / "out"))
    assert result["stats"]["docs_in"] == 6 and not result["quarantine"]
    rows = [r for part in result["parts"] for r in pq.read_table(str(root / "out" / part)).to_pylist()]
    return {r["id"]: (r["text"], json.loads(r["meta"])) for r in rows}


def test_chinese_law_pages_keep_every_paragraph_apart_and_drop_the_site_chrome(law_pages, law_warc):
    for i, page in enumerate(law_pages):
        text, meta = law_warc[f"https://law.example/{i}/utf-8.html"]
        assert (meta["encoding"], meta["encoding_from"]) == ("utf-8", "header")
        assert LAW_SENTENCES[i] in text and f"{LAW_SENTENCES[i]}\n\n第二条 " in text  # known article, own paragraph
        assert text.split("\n\n") == page["blocks"]  # the title and every paragraph, in order, nothing else
        for chrome in LAW_CHROME:
            assert chrome in page["html"] and chrome not in text, (i, chrome)


def test_gbk_and_big5_law_pages_in_a_warc_decode_to_the_same_text_as_utf8(law_pages, law_warc):
    from opencc import OpenCC

    t2s = OpenCC("t2s.json")
    for i in range(len(law_pages)):
        utf8, _ = law_warc[f"https://law.example/{i}/utf-8.html"]
        gbk, gbk_meta = law_warc[f"https://law.example/{i}/gbk.html"]
        big5, big5_meta = law_warc[f"https://law.example/{i}/big5.html"]
        assert (gbk_meta["encoding"], gbk_meta["encoding_from"]) == ("gb18030", "meta") and gbk == utf8
        assert big5_meta["encoding"] == "cp950" and big5_meta["encoding_from"] == ("header", "meta")[i]
        assert big5 == _traditional(utf8) and big5 != utf8 and t2s.convert(big5) == utf8


def test_gbk_and_big5_pages_decode_by_header_meta_or_detection(law_pages):
    page = law_pages[0]
    utf8_text = html.extract_main_text(page["html"])
    gbk = page["bytes"]["gbk"]
    text, codec, where = html.decode_page(gbk)
    assert (codec, where) == ("gb18030", "meta") and html.extract_main_text(text) == utf8_text
    assert html.decode_page(gbk, "gb2312")[1:] == ("gb18030", "header")
    big5 = page["bytes"]["big5"].replace(b'<meta charset="big5">', b"")
    text, codec, where = html.decode_page(big5)  # no header, no meta: detected
    assert where == "detected" and codec in ("cp950", "big5hkscs")
    assert html.extract_main_text(text) == _traditional(utf8_text)
    with pytest.raises(html.UndecodablePage, match="declared gbk"):
        html.decode_page(b"<html>\x81\xff\xfe\x81\xff" * 50, "gbk")


ZH_DEB_BODY = "Debian Edu 又名 Skolelinux 是一个基于 Debian 的 Linux 发行版"


def test_a_real_chinese_manual_page_is_extracted_and_decodes_alike_in_gbk():
    """Optional extra (skips where the Debian Edu Chinese manual was not downloaded): a real generated
    Chinese page, not one built by this test."""
    zh = _deb_html("debian-edu-doc-zh-cn_*.deb", "./usr/share/doc/debian-edu-doc-zh-cn/debian-edu-bookworm-manual.html")
    text = html.extract_main_text(zh)
    assert ZH_DEB_BODY in text and "\n\n" in text
    gbk = zh.replace("charset=UTF-8", "charset=GBK").encode("gbk", "xmlcharrefreplace")
    decoded, codec, where = html.decode_page(gbk)
    assert (codec, where) == ("gb18030", "meta") and html.extract_main_text(decoded) == text


def _warc(path: Path, records: list[tuple[str, bytes, str]]) -> Path:
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        w = WARCWriter(f, gzip=str(path).endswith(".gz"))
        w.write_record(w.create_warcinfo_record(path.name, {"software": "corpusmill test"}))
        for url, body, ctype in records:
            headers = StatusAndHeaders("200 OK", [("Content-Type", ctype)], protocol="HTTP/1.1")
            w.write_record(w.create_warc_record(url, "response", payload=io.BytesIO(body), http_headers=headers))
    return path


@pytest.fixture(scope="module")
def web_run(en_page, law_pages, tmp_path_factory, dask_client):
    from corpusmill.pipeline.config import parse_config
    from corpusmill.pipeline.runner import Pipeline

    root = tmp_path_factory.mktemp("web")
    _warc(root / "in" / "crawl.warc.gz", [
        ("https://docs.example/fractions.html", en_page.encode(), "text/html; charset=utf-8"),
        ("https://edu.example/gbk.html", law_pages[0]["bytes"]["gbk"], "text/html"),
        ("https://edu.example/big5.html", law_pages[1]["bytes"]["big5"], "text/html; charset=big5"),
        ("https://bad.example/", b"<html><body>" + b"\x81\xff" * 400, "text/html; charset=gbk"),
    ])
    prose = "The river runs past the old mill, and the children walk along its banks before school. "
    write_jsonl(root / "in" / "notes.jsonl", [
        {"id": "contact", "text": prose * 3 + "Mail jane@example.com or call 13812345678."},
        {"id": "idcard", "text": prose * 3 + f"ID {GOOD_ID}."},
        {"id": "spam", "text": prose + "casino casino casino jackpot casino"},
        {"id": "german", "text": "Der Fluss fließt an der alten Mühle vorbei, und die Kinder gehen am Ufer entlang. " * 3},
        {"id": "lookalike", "text": prose * 3 + f"Order 202406151234567890, id {WRONG_CHECK}."},
    ])
    (root / "blocked.txt").write_text("casino\n赌博\n", encoding="utf-8")
    cfg = parse_config({"input": {"paths": [str(root / "in")]},
                        "normalize": {"chinese_convert": "t2s"},
                        "filter": {**LENGTH_ONLY_FILTER, "boilerplate_lines": {"enabled": False},
                                   "blocked_words": {"file": str(root / "blocked.txt"), "max_per_1000_chars": 5},
                                   "language": {"enabled": True, "keep": ["zh", "en"], "min_score": 0.5}},
                        "pii": {"enabled": True, "id_number": {"action": "drop", "token": "<ID_NUMBER>"}},
                        "dedup": {"exact": False, "minhash": {"enabled": False}},
                        "tokenizer": {"train": {"vocab_size": 1500, "character_coverage": 0.995}}, "pack": {"seq_length": 16}})
    result = Pipeline(cfg, root / "out", client=dask_client, log=lambda m: None).run()
    return {"out": root / "out", "result": result}


def _parts(folder: Path) -> pd.DataFrame:
    """A step's kept documents (its part files, not its removed/ rows)."""
    return pd.concat([pq.read_table(p).to_pandas() for p in sorted(folder.glob("part-*.parquet"))], ignore_index=True)


def _texts(folder: Path) -> dict[str, str]:
    parts = _parts(folder)
    return dict(zip(parts["id"], parts["text"]))


def test_web_run_reads_the_warc_and_every_record_is_counted_once(web_run):
    out, ledger = web_run["out"], web_run["result"].ledger
    assert ledger["balanced"] and ledger["input"] == 4 + 5 and ledger["quarantined"] == 1
    quarantine = [json.loads(x) for x in (out / "00-read" / "quarantine.jsonl").read_text().splitlines()]
    assert quarantine[0]["code"] == "undecodable_html" and quarantine[0]["record_offset"] > 0
    assert "https://bad.example/" in quarantine[0]["reason"]
    read = _parts(out / "00-read").set_index("id")
    meta = {i: json.loads(m) for i, m in read["meta"].items() if isinstance(m, str)}
    assert meta["https://edu.example/gbk.html"]["encoding"] == "gb18030"
    assert meta["https://edu.example/gbk.html"]["encoding_from"] == "meta"
    assert meta["https://edu.example/big5.html"]["encoding"] == "cp950"
    assert meta["https://docs.example/fractions.html"]["crawl_date"].startswith("20")
    assert EN_BODY in read.loc["https://docs.example/fractions.html", "text"]


def test_web_run_converts_big5_to_simplified_and_filters_by_language_and_blocked_words(web_run):
    out = web_run["out"]
    kept = _texts(out / "02b-pii")
    assert LAW_SENTENCES[1] in kept["https://edu.example/big5.html"]  # traditional page, simplified by OpenCC
    assert web_run["result"].stages["normalize"]["docs_converted"] >= 1
    removed = pq.read_table(str(out / "02-filter" / "removed")).to_pandas().set_index("id")
    assert removed.loc["german", "reason"] == "language" and removed.loc["spam", "reason"] == "blocked_words"
    assert web_run["result"].ledger["blocked_words"]["terms"] == 2
    assert len(web_run["result"].ledger["blocked_words"]["sha256"]) == 64
    assert web_run["result"].stages["filter"]["by_lang"]["zh"]["in"] == 2  # the model's language, not the scripts'


def test_web_run_replaces_or_drops_personal_data_and_reports_it_masked(web_run):
    out, ledger = web_run["out"], web_run["result"].ledger
    kept = _texts(out / "02b-pii")
    assert "Mail <EMAIL> or call <PHONE>." in kept["contact"]
    assert "idcard" not in kept and f"id {WRONG_CHECK}" in kept["lookalike"]
    assert ledger["pii"]["docs_dropped"] == 1 and ledger["pii"]["matches"]["id_number"] == 1
    assert ledger["stages"]["pii"]["removed"] == {"pii": 1}
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "## Personal data (step pii)" in report and "| id_number | drop | 1 | 1 |" in report
    assert "**Blocked words**" in report and "OpenCC `t2s`" in report
    assert GOOD_ID not in report and "13812345678" not in report and "jane@example.com" not in report


def test_matches_on_several_lines_are_replaced_in_place_and_other_lines_kept():
    text = "first line\nmail x@example.com\n\nthird 8.8.8.8 and 10.0.0.1\nlast line, (212) 555-0123"
    res = pii.pii_batch(_frame([text, "untouched\ntext"]), dict.fromkeys(pii.KINDS, "replace"), pii.DEFAULT_TOKENS)
    assert res.kept["text"].tolist() == ["first line\nmail <EMAIL>\n\nthird <IP> and 10.0.0.1\nlast line, <PHONE>",
                                         "untouched\ntext"]
    assert res.stats["docs_changed"] == 1 and res.stats["pii_docs"] == {k: 1 if k in ("email", "ip", "phone") else 0
                                                                        for k in pii.KINDS}


def test_a_missing_or_empty_blocked_list_and_a_bad_language_code_stop_with_one_line(tmp_path):
    from corpusmill.pipeline.config import ConfigError, FilterConfig, parse_config
    from corpusmill.pipeline.step import PipelineError
    from corpusmill.pipeline.steps.filter import blocked_list

    with pytest.raises(PipelineError, match="cannot use .*nothing.txt: No such file"):
        blocked_list(FilterConfig(blocked_words={"file": str(tmp_path / "nothing.txt")}))
    (tmp_path / "empty.txt").write_text("# only a comment\n\n", encoding="utf-8")
    with pytest.raises(PipelineError, match="holds no term"):
        blocked_list(FilterConfig(blocked_words={"file": str(tmp_path / "empty.txt")}))
    with pytest.raises(ConfigError, match="filter.language.keep"):
        parse_config({"filter": {"language": {"keep": ["Chinese"]}}})


def test_html_files_are_read_as_documents_and_an_undecodable_one_is_quarantined(law_pages, tmp_path):
    from corpusmill.stages import read

    folder = tmp_path / "pages"
    folder.mkdir()
    (folder / "a.html").write_bytes(law_pages[0]["bytes"]["gbk"].replace(b'charset="gbk"', b'charset="gb2312"'))
    (folder / "b.htm").write_bytes(b'<html><head><meta charset="gbk"></head><body>' + b"\x81\xff" * 300 + b"</body></html>")
    files = read.expand_inputs([str(folder)])
    units, _ = read.plan_units(files, 64 << 20, 32 << 20)
    result = read.read_unit(units[0], read.ReadOptions(), str(tmp_path / "out"))
    assert result["stats"]["docs_in"] == 2 and result["stats"]["quarantine_reasons"] == {"undecodable_html": 1}
    assert result["quarantine"][0]["file"].endswith("b.htm") and "declared gbk" in result["quarantine"][0]["reason"]
    doc = pq.read_table(str(tmp_path / "out" / result["parts"][0])).to_pylist()[0]
    assert LAW_SENTENCES[0] in doc["text"] and json.loads(doc["meta"]) == {"encoding": "gb18030", "encoding_from": "meta"}


def test_doctor_checks_the_language_model_the_blocked_list_and_opencc_offline(tmp_path):
    from corpusmill.pipeline.config import parse_config
    from corpusmill.pipeline.doctor import ERROR, OK, check_screening

    cfg = parse_config({"normalize": {"chinese_convert": "s2t"},
                        "filter": {"language": {"enabled": True}, "blocked_words": {"file": str(tmp_path / "none.txt")}}})
    checks = {c.name: c for c in check_screening(cfg)}
    assert checks["language model"].status == OK and "lid.176.ftz" in checks["language model"].detail
    assert checks["opencc"].status == OK
    assert checks["blocked words"].status == ERROR and "none.txt" in checks["blocked words"].detail


def test_a_hostile_deeply_nested_page_is_extracted_in_linear_time():
    import time

    page = "<html><body><nav>menu</nav>" + "<DiV>" * 20000 + "deep text" + "</div>" * 20000 + "</body></html>"
    assert html.nesting_depth(page) == 20000
    started = time.perf_counter()
    assert "deep text" in html.extract_main_text(page)  # main-content mode would take minutes here
    assert time.perf_counter() - started < 10


# ---- the model's language is the language column from the read step on ----------------------------------

RIVER = {"en": "The river runs past the old mill, and the children walk along its banks before school every morning.",
         "zh": "河水流过古老的磨坊，孩子们每天早上上学前沿着河岸散步，老人们在树下下棋。",
         "ja": "川は古い水車小屋のそばを流れ、子どもたちは毎朝学校へ行く前に川岸を歩きます。",
         "fr": "La rivière passe devant le vieux moulin, et les enfants marchent le long de ses rives avant l'école.",
         "de": "Der Fluss fließt an der alten Mühle vorbei, und die Kinder gehen vor der Schule am Ufer entlang."}
MODEL_READ = {"max_chars": 2000, "normalize": {"nfkc": True, "keep_cjk_punctuation": True, "strip_control": True,
                                               "fold_whitespace": True, "fullwidth_ascii": True, "html_entities": True,
                                               "chinese_convert": None}}


def _read_rows(folder: Path, opts) -> tuple[dict, dict]:
    from corpusmill.stages import read

    units, _ = read.plan_units(read.expand_inputs([str(folder)]), 64 << 20, 32 << 20)
    out = folder.parent / f"out-{opts.language is not None}"
    result = read.read_unit(units[0], opts, str(out))
    rows = [r for part in result["parts"] for r in pq.read_table(str(out / part)).to_pylist()]
    return {r["id"]: r for r in rows}, result["stats"]["by_group"]


def test_the_reader_writes_the_models_language_and_score_and_the_scripts_without_the_model(tmp_path):
    from corpusmill.stages import read

    entities = "".join(f"&#{ord(c)};" for c in RIVER["ja"])  # the model sees what the filter saw: normalised text
    fullwidth = "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in RIVER["en"])
    write_jsonl(tmp_path / "in" / "river.jsonl", [{"id": k, "text": v} for k, v in RIVER.items()]
                + [{"id": "ja-entities", "text": entities}, {"id": "en-fullwidth", "text": fullwidth}])
    rows, groups = _read_rows(tmp_path / "in", read.ReadOptions(language=MODEL_READ))
    assert {k: rows[k]["language"] for k in RIVER} == {k: k for k in RIVER}
    assert rows["ja-entities"]["language"] == "ja" and rows["en-fullwidth"]["language"] == "en"
    assert langid.identify([entities, fullwidth])[0].tolist() != ["ja", "en"]  # raw text: not what the filter saw
    assert min(r["language_score"] for r in rows.values()) > 0.5
    assert groups["river"]["en"]["docs"] == 2 and groups["river"]["ja"]["docs"] == 2 and groups["river"]["fr"]["docs"] == 1
    rows, groups = _read_rows(tmp_path / "in", read.ReadOptions())  # no model: zh / en / other by script
    assert {k: rows[k]["language"] for k in RIVER} == {"en": "en", "zh": "zh", "ja": "zh", "fr": "en", "de": "en"}
    assert all(r["language_score"] is None for r in rows.values()) and set(groups["river"]) == {"zh", "en", "other"}


def test_the_filter_decides_on_the_read_steps_language_instead_of_identifying_again():
    from corpusmill.stages.filters import filter_batch

    df = _frame([RIVER["en"] * 3] * 3)
    df["language"], df["language_score"] = ["fr", "en", "en"], [0.99, 0.3, 0.9]
    language = {"max_chars": 2000, "keep": ["en"], "min_score": 0.5}
    result = filter_batch(df, rules=[], language=language)
    assert result.removed["id"].tolist() == ["d0", "d1"] and set(result.removed["reason"]) == {"language"}
    assert result.stats["by_lang"] == {"fr": {"in": 1, "out": 0}, "en": {"in": 2, "out": 1}}
    again = filter_batch(df.drop(columns=["language_score"]), rules=[], language=language)  # no read-step score
    assert again.stats["docs_out"] == 3 and again.stats["by_lang"] == {"en": {"in": 3, "out": 3}}


def test_the_read_step_is_read_again_when_what_the_model_sees_changes(tmp_path):
    from corpusmill.pipeline.config import parse_config
    from corpusmill.pipeline.steps.read import ReadStep

    write_jsonl(tmp_path / "in" / "a.jsonl", [{"id": "a", "text": RIVER["en"]}])

    def link(**sections) -> str:
        cfg = parse_config({"input": {"paths": [str(tmp_path / "in")]}, **sections})
        return cfg.section_hash(*ReadStep.config_sections, extra=ReadStep().hash_extra(cfg, None))

    off, on = link(), link(filter={"language": {"enabled": True}})
    assert off != on
    assert link(filter={"language": {"enabled": True, "keep": ["zh"], "min_score": 0.9}}) == on  # these only decide
    assert link(filter={"language": {"enabled": True, "max_chars": 500}}) != on
    assert link(filter={"language": {"enabled": True}}, normalize={"chinese_convert": "t2s"}) != on
    assert link(normalize={"chinese_convert": "t2s"}) == off  # without the model the reader normalises nothing
    assert link(filter={"scripts": {"cjk_share": 0.5}}) != off  # the script heuristic's threshold
    assert link(filter={"language": {"enabled": True}, "scripts": {"cjk_share": 0.5}}) == on


def test_mix_rules_name_the_codes_the_language_column_holds():
    from corpusmill.pipeline.config import ConfigError, parse_config

    mix = {"pack": {"shuffle_documents": True}}
    rule = lambda lang: {"mix": {"sources": [{"match": {"language": lang}, "weight": 1.0}]}}  # noqa: E731
    parse_config({**mix, **rule(["zh", "other"])})
    parse_config({**mix, **rule(["ja", "fr"]), "filter": {"language": {"enabled": True}}})
    with pytest.raises(ConfigError, match="ja never matches.*zh, en or other"):
        parse_config({**mix, **rule("ja")})
    with pytest.raises(ConfigError, match="other never matches.*ISO 639-1"):
        parse_config({**mix, **rule("other"), "filter": {"language": {"enabled": True}}})


def test_web_run_groups_the_corpus_by_the_models_language_from_the_read_step_on(web_run):
    out, ledger = web_run["out"], web_run["result"].ledger
    read = _parts(out / "00-read").set_index("id")
    assert read.loc["german", "language"] == "de" and read.loc["german", "language_score"] > 0.5
    assert read.loc["https://edu.example/big5.html", "language"] == "zh"
    groups = {(g["source"], g["language"]): g for g in ledger["composition"]["groups"]}
    assert groups[("notes", "de")]["documents"] == 1 and groups[("notes", "de")]["removed"]["filter"] == {"language": 1}
    assert {lg for _, lg in groups} == {"en", "zh", "de"}  # the model's codes: no `other`
    by_lang = web_run["result"].stages["filter"]["by_lang"]  # the filter's languages are the column's
    for lang, counts in by_lang.items():
        assert counts["in"] == sum(g["steps"]["normalize"]["docs"] for (_, lg), g in groups.items() if lg == lang)
    assert "notes / de" in (out / "report.md").read_text(encoding="utf-8")


# ---- records that are not text -------------------------------------------------------------------------

def test_random_bytes_are_not_a_page_in_any_charset():
    rng = np.random.default_rng(0)
    for size in (200, 3000):
        noise = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        for declared in (None, "x-bogus", "utf-8", "iso-8859-1", "windows-1251", "koi8-r", "gbk", "big5", "shift_jis"):
            with pytest.raises(html.UndecodablePage):
                html.decode_page(b"<html><body>" + noise, declared)


def test_real_pages_encoded_wrongly_are_quarantined_with_file_and_offset_and_right_ones_decode(
        law_pages, en_page, tmp_path):
    import gzip

    from corpusmill.stages import read

    page = law_pages[0]
    noise = np.random.default_rng(1).integers(0, 256, 6000, dtype=np.uint8).tobytes()
    records = [
        ("https://ok.example/gbk", page["bytes"]["gbk"], "text/html"),
        ("https://ok.example/big5", page["bytes"]["big5"].replace(b'<meta charset="big5">', b""), "text/html"),
        ("https://ok.example/utf16", page["html"].replace('<meta charset="utf-8">', "").encode("utf-16-le"), "text/html"),
        ("https://bad.example/noise", b"<html><body>" + noise, "text/html; charset=iso-8859-1"),
        ("https://bad.example/gzip", gzip.compress(page["bytes"]["utf-8"]), "text/html; charset=utf-8"),
        ("https://bad.example/mangled", page["bytes"]["gbk"].decode("utf-8", "replace").encode(), "text/html; charset=utf-8"),
        ("https://bad.example/ebcdic", en_page.encode("cp500", "replace"), "text/html"),
    ]
    _warc(tmp_path / "in" / "crawl.warc.gz", records)
    units, _ = read.plan_units(read.expand_inputs([str(tmp_path / "in")]), 64 << 20, 32 << 20)
    result = read.read_unit(units[0], read.ReadOptions(), str(tmp_path / "out"))
    assert result["stats"]["docs_in"] == 7 and result["stats"]["quarantine_reasons"] == {"undecodable_html": 4}
    bad = {q["reason"].split("(", 1)[1].split(")", 1)[0]: q for q in result["quarantine"]}
    assert set(bad) == {u for u, _, _ in records if "bad." in u}
    for q in bad.values():
        assert q["file"].endswith("crawl.warc.gz") and q["record_offset"] > 0 and q["line"] >= 4
    assert "control or replacement characters" in bad["https://bad.example/noise"]["reason"]
    assert "control or replacement characters" in bad["https://bad.example/mangled"]["reason"]
    assert "control or replacement characters" in bad["https://bad.example/ebcdic"]["reason"]
    assert "Content-Encoding header missing" in bad["https://bad.example/gzip"]["reason"]
    rows = {r["id"]: r for part in result["parts"] for r in pq.read_table(str(tmp_path / "out" / part)).to_pylist()}
    assert LAW_SENTENCES[0] in rows["https://ok.example/gbk"]["text"]
    assert json.loads(rows["https://ok.example/utf16"]["meta"])["encoding"] == "utf-16-le"
    assert rows["https://ok.example/utf16"]["text"] == rows["https://ok.example/gbk"]["text"]
    assert json.loads(rows["https://ok.example/big5"]["meta"])["encoding_from"] == "detected"
