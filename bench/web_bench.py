"""Issue 18 benchmark, side by side in one process: WARC reading (FastWARC vs warcio), main-text
extraction (Resiliparse vs trafilatura) on the same WARC of real Debian documentation pages, and
the screening kernels (language ID, personal data, blocked words, OpenCC) on documents of the real
corpus.

    .venv/bin/pip install -e .[test,bench]     # warcio, trafilatura (comparison only)
    .venv/bin/python bench/web_bench.py [--pages 300] [--docs 20000] [--corpus /tmp/i14/corpus]

Pages come from the python3.11-doc and debian-edu-doc-zh-cn packages (apt's cache or the shared corpus
builder's downloads); the zh pages are also re-encoded to GBK and Big5, as crawls hold them.
"""
from __future__ import annotations

import argparse
import glob
import io
import json
import random
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

NAVIGATION = ("Navigation", "Show Source", "Report a Bug", "Previous topic", "Next topic", "Quick search",
              "Table of Contents", "This Page")


def debian_pages(n: int, seed: int = 0) -> list[tuple[str, bytes, str]]:
    """(url, body, content type) of n real pages: python3.11-doc HTML, plus the debian-edu zh-cn manual as
    UTF-8, GBK and Big5."""
    debs = sorted(glob.glob("/var/cache/apt/archives/python3.11-doc_*.deb") + glob.glob("/tmp/i14/debs/python3.11-doc_*.deb"))
    if not debs:
        sys.exit("python3.11-doc .deb not found (apt-get download python3.11-doc)")
    tar = subprocess.run(["dpkg-deb", "--fsys-tarfile", debs[0]], capture_output=True, check=True).stdout
    pages = []
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        members = [m for m in t.getmembers() if m.name.endswith(".html") and m.isfile()]
        for m in random.Random(seed).sample(members, min(n, len(members))):
            pages.append(("https://docs.python.org/3.11/" + m.name.split("/html/", 1)[-1], t.extractfile(m).read(),
                          "text/html; charset=utf-8"))
    zh_debs = sorted(glob.glob("/tmp/i14/debs/debian-edu-doc-zh-cn_*.deb"))
    if zh_debs:
        import opencc

        tar = subprocess.run(["dpkg-deb", "--fsys-tarfile", zh_debs[0]], capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(tar)) as t:
            for m in t.getmembers():
                if m.name.endswith("-manual.html"):
                    s = t.extractfile(m).read().decode("utf-8")
                    pages.append((f"https://edu.example/{m.name}", s.encode(), "text/html; charset=utf-8"))
                    pages.append((f"https://edu.example/gbk/{m.name}", s.replace("charset=UTF-8", "charset=GBK")
                                  .encode("gbk", "xmlcharrefreplace"), "text/html"))
                    big5 = opencc.OpenCC("s2t.json").convert(s).replace("charset=UTF-8", "charset=Big5")
                    pages.append((f"https://edu.example/big5/{m.name}", big5.encode("big5", "xmlcharrefreplace"), "text/html"))
    return pages


def write_warc(path: Path, pages: list[tuple[str, bytes, str]]) -> None:
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    with open(path, "wb") as f:
        w = WARCWriter(f, gzip=True)
        for url, body, ctype in pages:
            headers = StatusAndHeaders("200 OK", [("Content-Type", ctype)], protocol="HTTP/1.1")
            w.write_record(w.create_warc_record(url, "response", payload=io.BytesIO(body), http_headers=headers))


def timed(fn, repeat: int = 1):
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def bench_warc(pages: list, tmp: Path) -> dict:
    from corpusmill.stages import html

    path = tmp / "bench.warc.gz"
    write_warc(path, pages)

    def fastwarc_read():
        return [p for p in html.iter_warc(str(path), {})]

    def warcio_read():
        from warcio.archiveiterator import ArchiveIterator

        out = []
        with open(path, "rb") as f:
            for rec in ArchiveIterator(f):
                if rec.rec_type == "response":
                    out.append(rec.content_stream().read())
        return out

    t_fast, records = timed(fastwarc_read, 3)
    t_warcio, _ = timed(warcio_read, 3)
    decoded = [html.decode_page(r.body, r.charset)[0] for r in records]
    mb = sum(len(r.body) for r in records) / 2**20

    def resiliparse_all():
        return [html.extract_main_text(d) for d in decoded]

    def trafilatura_all():
        import trafilatura

        return [trafilatura.extract(d, include_comments=False, include_tables=True, deduplicate=False) or "" for d in decoded]

    t_res, res = timed(resiliparse_all)
    t_tra, tra = timed(trafilatura_all)
    t_dec, _ = timed(lambda: [html.decode_page(r.body, r.charset) for r in records])

    def quality(texts):
        en = [t for (u, _, _), t in zip(pages, texts) if "python.org" in u]
        return {"nav_strings_left": sum(sum(n in t for n in NAVIGATION) for t in en),
                "empty": sum(not t.strip() for t in texts), "chars": sum(map(len, texts)),
                "paragraph_breaks_per_doc": round(float(np.mean([t.count("\n\n") for t in texts])), 1),
                "lines_per_paragraph": round(float(np.mean([t.count("\n") + 1 for t in texts]) /
                                                   max(1.0, float(np.mean([t.count("\n\n") + 1 for t in texts])))), 2)}

    return {"records": len(records), "warc_gz_mb": round(path.stat().st_size / 2**20, 2), "html_mb": round(mb, 2),
            "read_fastwarc_docs_s": round(len(records) / t_fast), "read_warcio_docs_s": round(len(records) / t_warcio),
            "decode_docs_s": round(len(records) / t_dec),
            "resiliparse_docs_s": round(len(records) / t_res, 1), "resiliparse_mb_s": round(mb / t_res, 2),
            "trafilatura_docs_s": round(len(records) / t_tra, 1), "trafilatura_mb_s": round(mb / t_tra, 2),
            "speed_ratio": round(t_tra / t_res, 1),
            "resiliparse_quality": quality(res), "trafilatura_quality": quality(tra)}


def corpus_sample(root: Path, n: int, seed: int = 0) -> list[str]:
    """n documents, half English, half Chinese, taken evenly from every file of the corpus."""
    texts = []
    for lang in ("en", "zh"):
        files = sorted((root / lang).glob("*.jsonl"))
        per = n // 2 // len(files) + 1
        for f in files:
            with open(f, encoding="utf-8") as fh:
                for i, line in enumerate(fh):
                    if i >= per:
                        break
                    texts.append(json.loads(line)["text"])
    random.Random(seed).shuffle(texts)
    return texts[:n]


def bench_screening(texts: list[str]) -> dict:
    from corpusmill.stages import blocklist, langid, pii
    from corpusmill.stages.normalize import convert_chinese

    n, mb = len(texts), sum(len(t.encode()) for t in texts) / 2**20
    df = pd.DataFrame({"uid": np.arange(n, dtype=np.int64), "id": [str(i) for i in range(n)], "text": texts,
                       "source": "s", "meta": None})
    langid.identify(texts[:10])  # load the model once
    t_lang, (codes, _) = timed(lambda: langid.identify(texts))
    actions = dict.fromkeys(pii.KINDS, "replace")
    t_pii, res = timed(lambda: pii.pii_batch(df, actions, pii.DEFAULT_TOKENS))
    # the same documents, each with personal data planted: every one goes through the Python validators
    dense = df.copy()
    dense["text"] = [t + " 联系 13812345678 / jane@example.com / 8.8.8.8 / 11010519491231002X" for t in texts]
    t_dense, _ = timed(lambda: pii.pii_batch(dense, actions, pii.DEFAULT_TOKENS))
    words = sorted({w.lower() for t in texts[:2000] for w in t.split() if w.isalpha() and len(w) > 4})
    terms = random.Random(1).sample(words, min(1000, len(words))) + [t[i:i + 2] for t in texts[:200] for i in range(0, 10, 5)
                                                                      if len(t) > 12 and "\u4e00" <= t[i] <= "\u9fff"]
    t_block, _ = timed(lambda: blocklist.score_blocked(texts, terms))
    arr = pa.array(texts, pa.string())
    t_cc, (_, converted) = timed(lambda: convert_chinese(arr, "t2s"))
    langs = pd.Series(codes).value_counts().head(5).to_dict()
    return {"docs": n, "mb": round(mb, 1), "langid_docs_s": round(n / t_lang), "langid_top": langs,
            "pii_docs_s": round(n / t_pii), "pii_mb_s": round(mb / t_pii, 1), "pii_scanned_share": round(res.stats["docs_scanned"] / n, 3),
            "pii_found": res.stats["pii_matches"], "pii_dense_docs_s": round(n / t_dense),
            "blocked_terms": len(terms), "blocked_docs_s": round(n / t_block), "opencc_docs_s": round(n / t_cc),
            "opencc_converted": converted}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", type=int, default=300)
    ap.add_argument("--docs", type=int, default=20000)
    ap.add_argument("--corpus", default="/tmp/i14/corpus")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = {"warc": bench_warc(debian_pages(args.pages), Path(tmp))}
    out["screening"] = bench_screening(corpus_sample(Path(args.corpus), args.docs))
    print(json.dumps(out, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
