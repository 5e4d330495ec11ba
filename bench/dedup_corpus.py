"""Build a labelled near-duplicate benchmark corpus from real English and Chinese text.

    python bench/dedup_corpus.py CORPUS_DIR OUT_DIR [--docs 100000] [--near 0.06] [--exact 0.01] [--long]

CORPUS_DIR is the output of ../shared/data/build_corpus.sh. Real documents are cut at paragraph
boundaries into pieces of 0.6-8 KB (`--long`: 2-16 KB, mean about 3.4 KB, from the long-document
sources only: man pages, package and language documentation, manuals, books, laws; no dictionary
entries, fortunes or poems, so a speed figure is not flattered by short documents; a source may
give half of a language's pieces, and Chinese is 30 % unless --zh-share says otherwise; /work/corpus
holds about 83k such pieces, so --docs 100000 gives about 76k base documents). Pieces that are
already near each other (true Jaccard >= 0.5, found with corpusmill itself at a low threshold) are
dropped, so the only duplicates left are the
planted ones. Then copies are planted: near copies edited by word/character substitutions,
insertions, deletions and added boilerplate, their true Jaccard to the source computed exactly from
shingle sets in the space corpusmill's threshold is on (`jaccard`: character 5-grams after dedup's
normalisation; `jaccard_word5`: word 5-grams, the space of the peers' default shingles), spread
over roughly 0.5-1.0; and verbatim exact copies.

Writes OUT_DIR/data/*.jsonl ({"id", "text", "source"}) and OUT_DIR/truth.jsonl: one line per planted
copy {"copy", "source", "jaccard", "jaccard_word5", "kind": near|exact, "lang"}.
"""
from __future__ import annotations

import argparse
import json
import re
import os
import random
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from corpusmill.stages.normalize import normalize_array  # noqa: E402
from corpusmill.stages.shingles import ShingleSpec, shingle_hashes  # noqa: E402

BOILERPLATE_EN = ["Share this article on social media.", "All rights reserved. Terms of use apply.",
                  "Click here to subscribe to our newsletter for weekly updates."]
BOILERPLATE_ZH = ["版权所有，转载请注明出处。", "欢迎关注我们的公众号获取更多资讯。", "本文仅代表作者观点，不代表本站立场。"]


SHORT_SOURCES = ("dict-", "fortunes", "chinese-poetry")  # left out with --long: entries of a few hundred bytes


def pieces(corpus: Path, lang: str, rng: random.Random, want: int, long: bool = False):
    """Real text cut into 0.6-8 KB pieces at paragraph boundaries (`long`: 2-16 KB, the tail of a
    document a piece of its own when it has 2 KB, from the long-document sources only)."""
    files = sorted((corpus / lang).glob("*.jsonl"))
    if long:
        files = [f for f in files if not f.stem.startswith(SHORT_SOURCES)]
    lo, hi, cap = (2000, 6000, 16000) if long else (600, 5000, 8000)
    rng.shuffle(files)
    out = []
    per_file = max(1, want // (2 if long else 3))  # no single source may dominate
    for f in files:
        taken = 0
        with open(f, encoding="utf-8") as fh:
            for line in fh:
                text = json.loads(line)["text"].replace("\r\n", "\n")
                buf = ""
                for para in re.split(r"\n\s*\n", text):
                    buf = f"{buf}\n\n{para}" if buf else para
                    size = len(buf.encode())
                    if size >= rng.randint(lo, hi):
                        if size <= cap:
                            out.append((f.stem, buf))
                            taken += 1
                        buf = ""
                if long and lo <= len(buf.encode()) <= cap:  # the document's tail
                    out.append((f.stem, buf))
                    taken += 1
                if taken >= per_file:
                    break
    rng.shuffle(out)
    return out[:want]


def shingle_sets(texts: list[str], spec: ShingleSpec = ShingleSpec(unit="char")) -> list[set]:
    """Shingle sets after the normalisation `corpusmill dedup` applies; by default in the space its
    threshold is on (character 5-grams of every script)."""
    hashes, offsets = shingle_hashes(normalize_array(pa.array(texts, pa.string())), spec)
    return [set(hashes[offsets[i]:offsets[i + 1]].tolist()) for i in range(len(texts))]


def jaccard(a: set, b: set) -> float:
    return len(a & b) / max(1, len(a | b))


def edit(text: str, lang: str, strength: float, rng: random.Random) -> str:
    """A copy with about `strength` of its units changed by substitution, insertion or deletion,
    sometimes with boilerplate added."""
    units = text.split(" ") if lang == "en" else list(text)
    n = max(1, int(len(units) * strength))
    pool = units[:] or ["x"]
    for _ in range(n):
        op = rng.random()
        i = rng.randrange(len(units)) if units else 0
        if op < 0.5 and units:
            units[i] = rng.choice(pool)
        elif op < 0.75:
            units.insert(i, rng.choice(pool))
        elif units:
            del units[i]
    out = (" " if lang == "en" else "").join(units)
    if rng.random() < 0.3:
        extra = rng.choice(BOILERPLATE_EN if lang == "en" else BOILERPLATE_ZH)
        out = f"{extra}\n\n{out}" if rng.random() < 0.5 else f"{out}\n\n{extra}"
    return out


def drop_near_pairs(docs: list[tuple[str, str, str]], work: Path) -> list[tuple[str, str, str]]:
    """Remove base pieces that are near duplicates of each other (corpusmill dedup at threshold 0.5)."""
    from corpusmill.pipeline.config import parse_config
    from corpusmill.pipeline.runner import Pipeline

    src = work / "base"
    src.mkdir(parents=True, exist_ok=True)
    with open(src / "base.jsonl", "w", encoding="utf-8") as f:
        for doc_id, source, text in docs:
            f.write(json.dumps({"id": doc_id, "text": text, "source": source}, ensure_ascii=False) + "\n")
    cfg = parse_config({"input": {"paths": [str(src)]},
                        # 32 x 4 bands: a pair at 0.5 is a candidate with p 0.87, at 0.6 with 0.99 (fewer
                        # candidates than the recall-tuned 64 x 2 at 0.5, which char 5-grams would flood)
                        "dedup": {"minhash": {"threshold": 0.5, "bands": 32, "rows": 4}}, "cluster": {"n_workers": 2}})
    Pipeline(cfg, work / "base-dedup", log=lambda m: None, job="dedup").run()
    import pyarrow.parquet as pq

    removed = set(pq.read_table(str(work / "base-dedup" / "removed"), columns=["id"]).column("id").to_pylist())
    return [d for d in docs if d[0] not in removed]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("corpus", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--docs", type=int, default=100_000, help="base documents before planting")
    ap.add_argument("--near", type=float, default=0.06, help="share of base documents given a near copy")
    ap.add_argument("--exact", type=float, default=0.01, help="share of base documents given an exact copy")
    ap.add_argument("--zh-share", type=float, default=None, help="share of Chinese pieces (0.4; 0.3 with --long)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--files", type=int, default=8, help="JSONL files to write")
    ap.add_argument("--long", action="store_true", help="long documents only (2-16 KB pieces of the long-document sources)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    if args.zh_share is None:
        args.zh_share = 0.3 if args.long else 0.4
    n_zh = int(args.docs * args.zh_share * 1.1)
    n_en = int(args.docs * 1.1) - n_zh
    base = [(f"{lang}-{i}", src, text) for lang, n in (("en", n_en), ("zh", n_zh))
            for i, (src, text) in enumerate(pieces(args.corpus, lang, rng, n, args.long))]
    print(f"{len(base)} real pieces; removing those already near each other", flush=True)
    base = drop_near_pairs(base, args.out / ".work")
    rng.shuffle(base)
    base = base[: args.docs]
    print(f"{len(base)} base documents", flush=True)
    docs = [{"id": d, "text": t, "source": s} for d, s, t in base]
    truth = []
    chosen = rng.sample(range(len(base)), int(len(base) * (args.near + args.exact)))
    n_near = int(len(base) * args.near)
    near_src = chosen[:n_near]
    copies = []
    for k, i in enumerate(near_src):
        doc_id, source, text = base[i]
        lang = doc_id.split("-")[0]
        strength = rng.uniform(0.0, 0.07)  # spreads true Jaccard over roughly 0.5-1.0 (J ~ (1-5s)/(1+5s))
        copies.append((f"{doc_id}~near{k}", source, edit(text, lang, strength, rng), doc_id, lang))
    sets_src = shingle_sets([base[i][2] for i in near_src])
    sets_copy = shingle_sets([c[2] for c in copies])
    word_src = shingle_sets([base[i][2] for i in near_src], ShingleSpec(unit="word"))
    word_copy = shingle_sets([c[2] for c in copies], ShingleSpec(unit="word"))
    for (cid, source, text, sid, lang), a, b, wa, wb in zip(copies, sets_src, sets_copy, word_src, word_copy):
        docs.append({"id": cid, "text": text, "source": source})
        truth.append({"copy": cid, "source": sid, "jaccard": round(jaccard(a, b), 4), "kind": "near", "lang": lang,
                      "jaccard_word5": round(jaccard(wa, wb), 4)})
    for k, i in enumerate(chosen[n_near:]):
        doc_id, source, text = base[i]
        docs.append({"id": f"{doc_id}~exact{k}", "text": text, "source": source})
        truth.append({"copy": f"{doc_id}~exact{k}", "source": doc_id, "jaccard": 1.0, "kind": "exact",
                      "lang": doc_id.split("-")[0]})
    rng.shuffle(docs)
    data = args.out / "data"
    data.mkdir(parents=True, exist_ok=True)
    for old in data.glob("*.jsonl"):
        old.unlink()
    per = (len(docs) + args.files - 1) // args.files
    for f in range(args.files):
        with open(data / f"part-{f:02d}.jsonl", "w", encoding="utf-8") as fh:
            for d in docs[f * per:(f + 1) * per]:
                fh.write(json.dumps(d, ensure_ascii=False) + "\n")
    with open(args.out / "truth.jsonl", "w", encoding="utf-8") as fh:
        for t in truth:
            fh.write(json.dumps(t) + "\n")
    size = sum(os.path.getsize(p) for p in data.glob("*.jsonl"))
    js = np.array([t["jaccard"] for t in truth if t["kind"] == "near"])
    print(f"wrote {len(docs)} documents ({size / 1e6:.0f} MB) to {data}; {len(truth)} planted copies; "
          f"near-copy Jaccard quartiles {np.percentile(js, [25, 50, 75]).round(3).tolist()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
