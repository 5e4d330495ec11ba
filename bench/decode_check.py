"""Issue 18: does the "not text" rule of stages/html.decode_page leave real pages alone? Every HTML page
of the python3.11-doc package and the first 3,000 of opencv-doc (both in the machine image's apt
cache) is decoded; the script counts pages quarantined, pages holding any control / replacement
character, and the worst share (the rule quarantines above 1% and 8 characters).

    .venv/bin/python bench/decode_check.py
"""
from __future__ import annotations

import glob
import io
import subprocess
import tarfile
import time
from typing import Iterator

from corpusmill.stages.html import _NOT_TEXT, UndecodablePage, decode_page


def deb_pages(pattern: str, limit: int) -> Iterator[tuple[str, bytes]]:
    debs = sorted(glob.glob(pattern))
    if not debs:
        return
    tar = subprocess.run(["dpkg-deb", "--fsys-tarfile", debs[0]], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        members = [m for m in t.getmembers() if m.name.endswith((".html", ".htm")) and m.isfile()][:limit]
        for m in members:
            yield m.name, t.extractfile(m).read()


def main() -> None:
    n = with_any = 0
    worst = (0.0, 0, "")
    undecodable = []
    started = time.perf_counter()
    for pattern in ("/var/cache/apt/archives/python3.11-doc_*.deb", "/var/cache/apt/archives/opencv-doc_*.deb"):
        for name, body in deb_pages(pattern, 3000):
            n += 1
            try:
                text, _, _ = decode_page(body)
            except UndecodablePage as e:
                undecodable.append((name, str(e)[:200]))
                continue
            k = len(_NOT_TEXT.findall(text))
            with_any += k > 0
            if k / max(1, len(text)) > worst[0]:
                worst = (k / len(text), k, name)
    print(f"{n:,} real pages in {time.perf_counter() - started:.1f} s: {len(undecodable)} undecodable, {with_any} with any "
          f"control / replacement character, worst share {worst[0]:.6f} ({worst[1]} characters, {worst[2]})")
    for u in undecodable[:10]:
        print("  ", *u)


if __name__ == "__main__":
    main()
