"""Labelled REAL revision pairs, and corpusmill's near-duplicate recall on them per relation and language.

    python bench/revision_pairs.py build OUT [--data ../shared/data] [--debs DIR]
    python bench/revision_pairs.py measure OUT [--run NAME] [-- corpusmill dedup options...]
    python bench/revision_pairs.py table OUT

`build` writes OUT/docs/docs.jsonl ({"id","text","source"}) and OUT/pairs.jsonl, one labelled pair a
line: ids a and b, `relation`, `lang` (en, zh, or mixed for Chinese prose carrying English commands)
and `jaccard`, the character 5-gram Jaccard of the two documents after the normalisation the dedup
stage applies (NFKC etc., then lowercase, punctuation and whitespace dropped; `stages.shingles` with
`unit="char"`). Nothing is generated; every document is real versioned text:

- law_revision (zh): two dated versions of one PRC law or regulation (kept/lawrefbook_laws.tar.xz;
  files `NAME(YYYY-MM-DD).md`, or `NAME.md` beside them), paired by NAME;
- law_vs_amendment (zh): a law beside its amendment act (`NAME修正案...`): related, not a copy;
- manual_release (en / mixed): one section of the Debian Edu manual in bullseye (11) and in bookworm
  (12), English and Simplified Chinese, paired by the section's anchor id or its title with the
  release names taken out (Debian package debian-edu-doc-en / -zh-cn, fetched by `apt-get download`
  into --debs unless it already holds them);
- translation (mixed): the same section in English and in Chinese (same release): not a duplicate;
  untranslated_copy (en) when the Chinese manual kept the section in English;
- reuse_cut / reuse_light / reuse_heavy / reuse_non (en): the Clough-Stevenson text-reuse corpus, a
  short answer beside the Wikipedia text it was written from, labelled by its authors.

`measure` runs `corpusmill dedup` on OUT/docs (the options after `--`) and reports, per relation and
language, recall of pairs with Jaccard >= 0.8 (a pair is caught when both documents end in one
cluster: one removed pointing, through duplicate_of, at the other's keeper) and merges of pairs
below 0.5. Outputs stay under OUT (keep it outside the repository or in a gitignored folder).
"""
from __future__ import annotations

import argparse
import csv
import itertools
import json
import re
import shutil
import subprocess
import sys
import tarfile
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from corpusmill.stages.normalize import normalize_array  # noqa: E402
from corpusmill.stages.shingles import ShingleSpec, shingle_hashes  # noqa: E402

DEBS = ("debian-edu-doc-en", "debian-edu-doc-zh-cn")
MIN_CHARS = 300
RELEASE_WORDS = re.compile(r"\b(bullseye|bookworm|buster|trixie|1[0-3])\b", re.I)


# ---------------------------------------------------------------- laws
def law_docs(archive: Path, scratch: Path) -> tuple[list[dict], list[tuple[str, str, str]]]:
    root = scratch / "lawrefbook"
    if not root.exists():
        with tarfile.open(archive) as tf:
            tf.extractall(scratch)
    docs, by_name = [], {}
    for f in sorted(root.rglob("*.md")):
        if f.name.startswith("_index") or "模版" in f.name:
            continue
        m = re.match(r"^(.*?)(?:\((\d{4}-\d{2}-\d{2})\))?\.md$", f.name)
        name, date = m.group(1), m.group(2) or "undated"
        text = f.read_text(encoding="utf-8", errors="replace")
        if len(text) < MIN_CHARS:
            continue
        doc_id = f"law/{f.parent.name}/{name}@{date}"
        docs.append({"id": doc_id, "text": text, "source": "law"})
        by_name.setdefault(name, []).append(doc_id)
    pairs = []
    for name, ids in by_name.items():
        for a, b in itertools.combinations(sorted(ids), 2):
            pairs.append((a, b, "law_revision"))
        base = re.sub(r"修正案.*$", "", name)
        if base != name and base in by_name:
            for a in ids:
                pairs.append((a, sorted(by_name[base])[-1], "law_vs_amendment"))
    return docs, pairs


# ---------------------------------------------------------------- Debian Edu manuals
class _Text(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"):
            self.skip += 1
        elif tag in ("p", "div", "br", "li", "pre", "tr", "h1", "h2", "h3", "h4", "h5", "dt", "dd"):
            self.out.append("\n")

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self.skip -= 1

    def handle_data(self, data):
        if not self.skip:
            self.out.append(data)


def html_text(fragment: str) -> str:
    p = _Text()
    p.feed(fragment)
    text = "".join(p.out)
    return re.sub(r"\n\s*\n+", "\n\n", re.sub(r"[ \t]+", " ", text)).strip()


HEAD = re.compile(r'<h([234]) class="title"[^>]*>(.*?)</h\1>', re.S)


def manual_sections(path: Path) -> dict[str, str]:
    """{section key: text} of one single-page manual, cut at every h2/h3/h4 heading."""
    raw = path.read_text(encoding="utf-8", errors="replace")
    heads = list(HEAD.finditer(raw))
    out: dict[str, str] = {}
    for i, m in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(raw)
        anchor = re.search(r'<a id="([^"]+)"', m.group(2))
        title = html_text(m.group(2))
        key = anchor.group(1) if anchor and not re.fullmatch(r"idm\d+", anchor.group(1)) else None
        if key is None:  # generated anchors differ between builds: use the title without numbers/releases
            key = "title:" + RELEASE_WORDS.sub("", re.sub(r"^[\d.]+\s*", "", title)).strip().lower()
        text = html_text(raw[m.start():end])
        if len(text) >= MIN_CHARS and key not in out:
            out[key] = text
    return out


def manual_docs(debroot: Path) -> tuple[list[dict], list[tuple[str, str, str]]]:
    docs, pairs, secs = [], [], {}
    for lang, pkg in (("en", "debian-edu-doc-en"), ("zh", "debian-edu-doc-zh-cn")):
        for release in ("bullseye", "bookworm"):
            f = debroot / "usr/share/doc" / pkg / f"debian-edu-{release}-manual.html"
            secs[lang, release] = manual_sections(f)
            for key, text in secs[lang, release].items():
                docs.append({"id": f"edu/{lang}/{release}/{key}", "text": text, "source": f"debian-edu-{lang}"})
    for lang in ("en", "zh"):
        for key in sorted(set(secs[lang, "bullseye"]) & set(secs[lang, "bookworm"])):
            pairs.append((f"edu/{lang}/bullseye/{key}", f"edu/{lang}/bookworm/{key}", "manual_release"))
    for release in ("bullseye", "bookworm"):
        for key in sorted(set(secs["en", release]) & set(secs["zh", release])):
            pairs.append((f"edu/en/{release}/{key}", f"edu/zh/{release}/{key}", "translation"))
    return docs, pairs


def fetch_debs(debs: Path) -> Path:
    debroot = debs / "root"
    if (debroot / "usr/share/doc/debian-edu-doc-zh-cn").exists():
        return debroot
    debs.mkdir(parents=True, exist_ok=True)
    if not all(list(debs.glob(f"{p}_*.deb")) for p in DEBS):
        subprocess.run(["apt-get", "download", "-q", *DEBS], cwd=debs, check=True)
    for p in DEBS:
        subprocess.run(["dpkg-deb", "-x", str(sorted(debs.glob(f"{p}_*.deb"))[-1]), str(debroot)], check=True)
    return debroot


# ---------------------------------------------------------------- Clough & Stevenson
def clough_docs(archive: Path, scratch: Path) -> tuple[list[dict], list[tuple[str, str, str]]]:
    root = scratch / "clough_stevenson"
    if not root.exists():
        with tarfile.open(archive) as tf:
            tf.extractall(scratch)
    docs, pairs = [], []
    for f in sorted(root.glob("*.txt")):
        docs.append({"id": f"clough/{f.stem}", "text": f.read_text(encoding="utf-8", errors="replace"), "source": "clough"})
    with open(root / "file_information.csv", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            if row["Category"] in ("cut", "light", "heavy", "non"):
                pairs.append((f"clough/{Path(row['File']).stem}", f"clough/orig_task{row['Task']}", f"reuse_{row['Category']}"))
    return docs, pairs


# ---------------------------------------------------------------- similarity
def char_spec() -> ShingleSpec:
    return ShingleSpec(char_ngram=5, unit="char")


def shingle_sets(texts: list[str]) -> list[np.ndarray]:
    arr = normalize_array(pa.array(texts, pa.string()))
    hashes, offsets = shingle_hashes(arr, char_spec())
    return [np.unique(hashes[offsets[i]:offsets[i + 1]]) for i in range(len(texts))]


def jaccard(x: np.ndarray, y: np.ndarray) -> float:
    if len(x) == 0 and len(y) == 0:
        return 1.0
    inter = len(np.intersect1d(x, y, assume_unique=True))
    return inter / (len(x) + len(y) - inter)


def cjk_share(text: str) -> float:
    n = sum(1 for c in text if not c.isspace())
    return sum(1 for c in text if "\u4e00" <= c <= "\u9fff") / max(1, n)


def latin_share(text: str) -> float:
    n = sum(1 for c in text if not c.isspace())
    return sum(1 for c in text if c.isascii() and c.isalpha()) / max(1, n)


def language(a: str, b: str) -> str:
    """en, zh, or mixed (Chinese text with at least a fifth of its characters Latin letters)."""
    shares = [(cjk_share(t), latin_share(t)) for t in (a, b)]
    if all(c < 0.05 for c, _ in shares):
        return "en"
    if any(c >= 0.05 for c, _ in shares) and any(c < 0.05 for c, _ in shares):
        return "mixed"
    return "mixed" if max(latin for _, latin in shares) >= 0.2 else "zh"


def build(args) -> int:
    out: Path = args.out
    scratch = out / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    kept = args.data / "kept"
    docs, pairs = [], []
    for d, p in (law_docs(kept / "lawrefbook_laws.tar.xz", scratch),
                 manual_docs(fetch_debs(args.debs or scratch / "debs")),
                 clough_docs(kept / "clough_stevenson.tar.xz", scratch)):
        docs += d
        pairs += p
    text_of = {d["id"]: d["text"] for d in docs}
    assert len(text_of) == len(docs), "document ids must be unique"
    ids = sorted({x for a, b, _ in pairs for x in (a, b)})
    sets = dict(zip(ids, shingle_sets([text_of[i] for i in ids])))
    (out / "docs").mkdir(exist_ok=True)
    with open(out / "docs" / "docs.jsonl", "w", encoding="utf-8") as fh:
        for d in docs:
            fh.write(json.dumps(d, ensure_ascii=False) + "\n")
    rows = []
    for a, b, rel in pairs:
        lang = language(text_of[a], text_of[b])
        if rel == "translation" and lang == "en":  # a section the Chinese manual left in English
            rel = "untranslated_copy"
        rows.append({"a": a, "b": b, "relation": rel, "lang": lang,
                     "jaccard": round(jaccard(sets[a], sets[b]), 4),
                     "chars_a": len(text_of[a]), "chars_b": len(text_of[b])})
    with open(out / "pairs.jsonl", "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"{len(docs)} documents, {len(rows)} pairs -> {out}")
    print(summary_table(rows))
    return 0


def summary_table(rows: list[dict]) -> str:
    lines = ["| relation | lang | pairs | J>=0.9 | 0.8-0.9 | 0.5-0.8 | <0.5 |", "|---|---|---:|---:|---:|---:|---:|"]
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["relation"], r["lang"]), []).append(r["jaccard"])
    for (rel, lang), js in sorted(groups.items()):
        j = np.array(js)
        lines.append(f"| {rel} | {lang} | {len(j)} | {(j >= 0.9).sum()} | {((j >= 0.8) & (j < 0.9)).sum()} | "
                     f"{((j >= 0.5) & (j < 0.8)).sum()} | {(j < 0.5).sum()} |")
    return "\n".join(lines)


# ---------------------------------------------------------------- measure
def clusters(run: Path) -> dict[str, str]:
    """{id: keeper id} following duplicate_of chains (a removed keeper's own keeper)."""
    files = sorted((run / "removed").glob("*.parquet"))
    if not files:
        return {}
    t = pq.read_table(files, columns=["id", "duplicate_of"]).to_pandas()
    parent = dict(zip(t["id"], t["duplicate_of"]))

    def root(x: str) -> str:
        seen = 0
        while x in parent and seen < 1000:
            x, seen = parent[x], seen + 1
        return x

    return {x: root(x) for x in parent}


def keeper_distance(out: Path, run: Path, threshold: float = 0.8) -> dict:
    """How far each near-removed document is from the document it is said to duplicate: the true
    character 5-gram Jaccard of every (removed, final keeper) pair, recomputed here from the texts,
    not read from the run. `removed_below_threshold` counts removed documents under the threshold to
    their keeper (a chain of near pairs merging documents that are not near: the keeper guard's target)."""
    files = sorted((run / "removed").glob("*.parquet"))
    if not files:
        return {"near_removed": 0, "removed_below_threshold": 0}
    t = pq.read_table(files, columns=["id", "reason"]).to_pandas()
    t = t[t["reason"] != "exact"]
    root = clusters(run)
    text_of = {}
    with open(out / "docs" / "docs.jsonl", encoding="utf-8") as fh:
        for line in fh:
            d = json.loads(line)
            text_of[d["id"]] = d["text"]
    ids = t["id"].tolist()
    keepers = [root.get(i, i) for i in ids]
    sa, sb = shingle_sets([text_of[i] for i in ids]), shingle_sets([text_of[k] for k in keepers])
    j = np.array([jaccard(x, y) for x, y in zip(sa, sb)])
    below = j < threshold
    return {"near_removed": int(len(ids)), "removed_below_threshold": int(below.sum()),
            "min_jaccard_to_keeper": round(float(j.min()), 4) if len(j) else None,
            "below_examples": [{"id": i, "keeper": k, "jaccard": round(float(x), 4)}
                               for i, k, x in sorted(zip(ids, keepers, j), key=lambda r: r[2]) if x < threshold][:5]}


def measure(args) -> int:
    out: Path = args.out
    rows = [json.loads(x) for x in (out / "pairs.jsonl").read_text(encoding="utf-8").splitlines()]
    run = out / "runs" / args.run
    run.parent.mkdir(parents=True, exist_ok=True)
    if run.exists():
        shutil.rmtree(run)
    exe = HERE.parent / ".venv" / "bin" / "corpusmill"
    cmd = [str(exe), "dedup", str(out / "docs"), "--out", str(run), *args.options]
    with open(str(run) + ".log", "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc:
        print(f"corpusmill dedup failed ({rc}); see {run}.log", file=sys.stderr)
        return 1
    root = clusters(run)
    keeper = lambda x: root.get(x, x)  # noqa: E731
    result = {"run": args.run, "options": args.options, "by_group": {}}
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["relation"], r["lang"]), []).append(r)
    missed = []
    for (rel, lang), rs in sorted(groups.items()):
        hi = [keeper(r["a"]) == keeper(r["b"]) for r in rs if r["jaccard"] >= 0.8]
        lo = [keeper(r["a"]) == keeper(r["b"]) for r in rs if r["jaccard"] < 0.5]
        missed += [r for r in rs if r["jaccard"] >= 0.8 and keeper(r["a"]) != keeper(r["b"])]
        result["by_group"][f"{rel}/{lang}"] = {"pairs_ge_0.8": len(hi), "caught": int(sum(hi)),
                                               "recall": round(float(np.mean(hi)), 4) if hi else None,
                                               "pairs_lt_0.5": len(lo), "false_merges": int(sum(lo))}
    for lang in ("en", "zh", "mixed"):
        hi = [keeper(r["a"]) == keeper(r["b"]) for r in rows if r["jaccard"] >= 0.8 and r["lang"] == lang]
        result[f"recall_{lang}"] = round(float(np.mean(hi)), 4) if hi else None
        hi9 = [keeper(r["a"]) == keeper(r["b"]) for r in rows if r["jaccard"] >= 0.9 and r["lang"] == lang]
        result[f"recall09_{lang}"] = round(float(np.mean(hi9)), 4) if hi9 else None  # SimHash's own target is at J >= 0.9
    result["false_merges"] = sum(keeper(r["a"]) == keeper(r["b"]) for r in rows if r["jaccard"] < 0.5)
    result.update(keeper_distance(out, run))
    result["missed"] = [{k: r[k] for k in ("a", "b", "relation", "lang", "jaccard")} for r in missed]
    with open(out / "results.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(result, ensure_ascii=False) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "missed"}, ensure_ascii=False, indent=1))
    print(f"missed {len(missed)}: " + ", ".join(f"{m['a']} ~ {m['b']} ({m['jaccard']})" for m in missed[:10]))
    return 0


def table(args) -> int:
    """Every measured run side by side: recall of pairs with J >= 0.8 and merges below 0.5, per relation/language."""
    runs = [json.loads(x) for x in (args.out / "results.jsonl").read_text(encoding="utf-8").splitlines()]
    latest = {r["run"]: r for r in runs}
    names = list(latest)
    lines = ["| relation / lang | pairs J>=0.8 | " + " | ".join(names) + " |", "|---|---:|" + "---:|" * len(names)]
    groups = sorted({g for r in latest.values() for g in r["by_group"]})
    for g in groups:
        first = next(r["by_group"][g] for r in latest.values() if g in r["by_group"])
        if not first["pairs_ge_0.8"]:
            continue
        cells = [str(latest[n]["by_group"].get(g, {}).get("recall", "-")) for n in names]
        lines.append(f"| {g} | {first['pairs_ge_0.8']} | " + " | ".join(cells) + " |")
    for lang in ("en", "zh", "mixed"):
        lines.append(f"| **all {lang}** | | " + " | ".join(str(latest[n].get(f"recall_{lang}")) for n in names) + " |")
    for lang in ("en", "zh", "mixed"):
        lines.append(f"| all {lang}, J >= 0.9 | | " + " | ".join(str(latest[n].get(f"recall09_{lang}", "-")) for n in names) + " |")
    lines.append("| near-removed documents | | " + " | ".join(str(latest[n].get("near_removed", "-")) for n in names) + " |")
    lines.append("| of them below 0.8 to their keeper | | " + " | ".join(str(latest[n].get("removed_below_threshold", "-")) for n in names) + " |")
    n_low = sum(v["pairs_lt_0.5"] for v in next(iter(latest.values()))["by_group"].values())
    lines.append(f"| false merges (of {n_low} pairs J<0.5) | | " + " | ".join(str(latest[n]["false_merges"]) for n in names) + " |")
    print("\n".join(lines))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("out", type=Path)
    b.add_argument("--data", type=Path, default=HERE.parent.parent / "shared" / "data")
    b.add_argument("--debs", type=Path, default=None, help="folder for the Debian Edu .debs (default OUT/scratch/debs)")
    m = sub.add_parser("measure")
    m.add_argument("out", type=Path)
    m.add_argument("--run", default="default")
    t = sub.add_parser("table", help="print every measured run side by side")
    t.add_argument("out", type=Path)
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = ap.parse_args(argv[:cut])
    args.options = argv[cut + 1:]  # corpusmill dedup options
    return {"build": build, "measure": measure, "table": table}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
