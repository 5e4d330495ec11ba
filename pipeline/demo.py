"""The demo corpus, built locally with no download.

English: the docstrings and help topics of the running Python installation. Chinese and English:
paragraphs this project wrote, composed into documents. Planted on top, so that every stage visibly
removes something: exact duplicates (verbatim, and copies that only become exact after
normalisation), near duplicates (words or characters edited throughout, each copy's true character
5-gram Jaccard to its original recorded, all above the default threshold), junk documents, and
malformed lines.
Formats: JSONL, gzip JSONL, zstd JSONL, Parquet and plain-text files.
"""
from __future__ import annotations

import gzip
import importlib
import inspect
import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

STDLIB_MODULES = (
    "abc argparse ast asyncio base64 bisect calendar cmd codecs collections concurrent.futures configparser "
    "contextlib copy csv dataclasses datetime decimal difflib dis email email.message enum fileinput fnmatch "
    "fractions ftplib functools getopt gettext glob gzip hashlib heapq hmac html html.parser http.client "
    "http.server imaplib inspect io ipaddress itertools json logging lzma mailbox math mimetypes "
    "multiprocessing numbers operator optparse os pathlib pickle pkgutil platform plistlib poplib pprint queue "
    "random re sched secrets selectors shelve shlex shutil smtplib socket socketserver sqlite3 ssl statistics "
    "string struct subprocess tarfile tempfile textwrap threading timeit tokenize trace traceback types typing "
    "unittest urllib.parse urllib.request uuid warnings wave weakref xml.dom.minidom xml.etree.ElementTree "
    "zipfile zipimport"
).split()

ZH_PARAGRAPHS = [
    "数据清洗是大模型预训练中最容易被低估的环节。原始语料里常常混杂着重复的网页、乱码、广告和导航栏，如果不加处理就直接送进训练，模型会花大量算力去记忆这些噪声。",
    "去重分为精确去重和近似去重两类。精确去重比较文本的哈希值，速度很快；近似去重则借助最小哈希和局部敏感哈希，找出只改动了几个字的转载文章。",
    "中文没有空格分词，因此在计算文本指纹时，通常使用字符级的滑动窗口，而不是按空格切分的单词。这样两篇只差一个词的文章，指纹依然非常接近。",
    "分词器的词表大小必须与模型的嵌入层一致。如果词表比嵌入层大，训练时会出现越界的编号；如果词表更小，就有一部分嵌入向量永远得不到训练。",
    "序列打包把多篇文档用结束符连接起来，再切成固定长度的窗口。这样做几乎不浪费填充位置，但需要在每篇文档末尾加上结束符，方便之后重建注意力掩码。",
    "在数据并行训练中，每个进程读取自己的一份数据。如果各个进程的样本数不相等，最后一个批次时有的进程已经结束，有的还在等待，整个集群就会卡住。",
    "春天的江南总是下着细雨。河边的柳树抽出新芽，石桥上撑着油纸伞的行人慢慢走过，远处的茶园里传来采茶人的歌声。",
    "秋天到了，北方的天空格外高远。田野里的玉米已经收割完毕，农民们把金黄的谷穗晒在院子里，孩子们在落叶堆里追逐嬉戏。",
    "做红烧肉要先把五花肉切成方块，用冷水焯去血沫。锅里放少许油和冰糖，小火炒出糖色，再放入肉块翻炒均匀，加入酱油、料酒和热水，慢炖一个小时。",
    "唐诗是中国古典文学的高峰之一。李白的诗豪放飘逸，杜甫的诗沉郁顿挫，王维的诗则充满画意，被后人称为诗中有画，画中有诗。",
    "长城东起山海关，西至嘉峪关，绵延数千公里。它并不是一次建成的，而是历经多个朝代不断修筑和加固，凝聚了无数劳动者的血汗。",
    "学习一门编程语言，最好的办法是动手写代码。先从简单的小程序开始，遇到错误时仔细阅读报错信息，再查阅官方文档，进步会比只看书快得多。",
    "昇思是一个全场景的深度学习框架，支持在昇腾处理器、图形处理器和中央处理器上训练模型。同一份训练脚本，只需更换设备参数就能在不同硬件上运行。",
    "好的实验记录应当写清楚数据版本、配置文件、随机种子和硬件环境。几个月后回头再看，才能知道某一次损失曲线的变化究竟是由什么引起的。",
    "图书馆的阅览室里很安静，只能听见翻书的声音。窗外的银杏树叶子变黄了，阳光透过玻璃照在长桌上，几位老人正在认真地读报。",
    "在正式训练之前，先用百分之一的数据把整个流程跑通。这样可以尽早发现路径错误、显存不足和数据格式问题，而不是在训练了几天之后才发现。",
    "混合精度训练使用半精度保存激活值和梯度，以节省显存并提高速度，但归一化层和注意力的归一化指数函数仍应使用单精度计算，以免数值溢出。",
    "黄河发源于青藏高原，流经九个省区，最后注入渤海。它孕育了古老的中华文明，也因为泥沙含量高、河道多次改道而被称为一条难以驯服的河流。",
]

EN_PARAGRAPHS = [
    "Data preparation decides more of a language model's quality than most architecture tweaks. A corpus full of repeated pages, boilerplate and broken encodings teaches the model to memorise noise.",
    "Exact deduplication compares hashes of normalised text and is cheap. Near-duplicate detection uses MinHash signatures and locality-sensitive hashing to find documents that differ by a few words.",
    "A tokenizer's vocabulary must fit the model's embedding table. Ids past the last row crash or silently corrupt training, and unused rows waste parameters that never receive a gradient.",
    "Packing joins documents with an end-of-sequence token and cuts the stream into fixed windows, so almost no position is spent on padding and every document boundary can be recovered later.",
    "In data-parallel training each rank reads its own share of the data. If the shares differ in size, one rank finishes its epoch early and the collective at the end of the step waits forever.",
    "The river was high after a week of rain, and the ferry did not run. We walked upstream to the old stone bridge, where a man was selling roasted chestnuts from a cart.",
    "To bake a simple loaf, mix flour, water, salt and a little yeast, knead until the dough is smooth, and let it rise until doubled before shaping and baking it in a hot oven.",
    "Good experiment notes record the data version, the configuration, the random seeds and the hardware. Months later they are the only way to explain why one loss curve differs from another.",
    "Before the full run, push one percent of the data through the whole pipeline. Path mistakes, memory limits and format errors then surface in minutes instead of after days of training.",
    "Mixed precision keeps activations and gradients in half precision to save memory, while normalisation layers and the attention softmax stay in single precision to avoid overflow.",
]

JUNK = ["ok", "Click here!", "。。。", "!!!!!!", "   ", "", "1 2 3", "登录", "Home | About | Contact", "……"]


def _stdlib_docs() -> list[tuple[str, str]]:
    docs: list[tuple[str, str]] = []
    for name in STDLIB_MODULES:
        try:
            mod = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module missing from this Python build is simply skipped
            continue
        module_doc = inspect.getdoc(mod)
        if module_doc and len(module_doc) >= 200:
            docs.append((f"python:{name}", module_doc))
        for attr, obj in sorted(vars(mod).items()):
            if attr.startswith("_") or getattr(obj, "__module__", None) != mod.__name__:
                continue
            if inspect.isclass(obj) or inspect.isfunction(obj):
                doc = inspect.getdoc(obj)
                if doc and len(doc) >= 200:
                    docs.append((f"python:{name}.{attr}", doc))
    try:
        from pydoc_data.topics import topics

        docs += [(f"python-help:{k}", v) for k, v in sorted(topics.items()) if len(v) >= 200]
    except ImportError:
        pass
    return docs


def _compose(rng: random.Random, paragraphs: list[str], n_docs: int, prefix: str, sep: str) -> list[tuple[str, str]]:
    docs = []
    for i in range(n_docs):
        k = rng.randint(3, 6)
        docs.append((f"{prefix}-{i:04d}", sep.join(rng.sample(paragraphs, k))))
    return docs


def _fullwidth(text: str) -> str:
    """A copy that NFKC and whitespace folding turn back into `text` (an exact duplicate after normalisation)."""
    wide = "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" and c.isalnum() else c for c in text)
    return wide.replace("\n", "  \r\n") + "   "


def _near_copy(text: str, rng: random.Random, jaccard_of, low: float, high: float) -> tuple[str, float]:
    """A copy edited in character space, as bench/dedup_corpus.py plants them: substitutions,
    insertions and deletions of words (Latin text) or characters (CJK text) spread through the
    document, drawn again with fewer edits until the true character 5-gram Jaccard to the original
    (the space dedup's threshold is on) lies in [low, high]. Returns the copy and that Jaccard."""
    cjk = sum("\u4e00" <= c <= "\u9fff" for c in text) > len(text) // 3
    units = list(text) if cjk else text.split(" ")
    strength = rng.uniform(0.01, 0.04)
    fallback: tuple[str, float] = (text, 1.0)  # too similar rather than too far: it must stay a duplicate
    for _ in range(12):
        edited = units[:]
        for _ in range(max(1, int(len(units) * strength))):
            i = rng.randrange(len(edited))
            op = rng.random()
            if op < 0.5:
                edited[i] = rng.choice(units)
            elif op < 0.75:
                edited.insert(i, rng.choice(units))
            elif len(edited) > 1:
                del edited[i]
        copy = ("" if cjk else " ").join(edited)
        j = jaccard_of(text, copy)
        if low <= j <= high:
            return copy, j
        if j > high and j < fallback[1]:
            fallback = (copy, j)
        strength *= 0.7 if j < low else 1.4
    return fallback


def _char_jaccard():
    """The true Jaccard of two texts' shingle sets as near dedup computes it (normalised, then the
    configured default shingling: character 5-grams for every script)."""
    from corpusmill.stages.normalize import normalize_array
    from corpusmill.stages.shingles import ShingleSpec, shingle_hashes

    from .config import Config

    dc = Config().dedup
    spec = ShingleSpec(dc.minhash.word_ngram, dc.minhash.char_ngram, dc.shingling.lowercase,
                       dc.shingling.strip_punctuation, dc.shingling.cjk_share, dc.shingling.unit)

    def jaccard(a: str, b: str) -> float:
        hashes, offsets = shingle_hashes(normalize_array(pa.array([a, b], pa.string())), spec)
        sa, sb = set(hashes[offsets[0]:offsets[1]].tolist()), set(hashes[offsets[1]:offsets[2]].tolist())
        return len(sa & sb) / max(1, len(sa | sb))

    return jaccard, dc.minhash.threshold


def build_demo_corpus(out_dir: str | Path, seed: int = 0) -> dict[str, Any]:
    """Write the demo corpus under `out_dir`; returns what was planted (and where)."""
    from corpusmill.stages.normalize import normalize_array

    rng = random.Random(seed)
    jaccard, threshold = _char_jaccard()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    en = _stdlib_docs() + _compose(rng, EN_PARAGRAPHS, 150, "en-essay", "\n\n")
    zh = _compose(rng, ZH_PARAGRAPHS, 400, "zh-essay", "\n")
    # drop copies the sources already contain, so the only duplicates are the planted ones
    for docs in (en, zh):
        normed = normalize_array(pa.array([t for _, t in docs])).to_pylist()
        seen, unique = set(), []
        for (doc_id, text), key in zip(docs, normed):
            if key not in seen:
                seen.add(key)
                unique.append((doc_id, text))
        docs[:] = unique
    planted: dict[str, Any] = {"exact_duplicates": [], "near_duplicates": [], "junk": [], "malformed": []}

    def records(docs: list[tuple[str, str]], source: str) -> list[dict]:
        return [{"id": i, "text": t, "source": source} for i, t in docs]

    en_rec, zh_rec = records(en, "python-docs"), records(zh, "zh-essays")
    for recs, n_copies in ((en_rec, 40), (zh_rec, 30)):
        originals = rng.sample(recs, n_copies)
        for k, orig in enumerate(originals):
            text = orig["text"] if k % 2 == 0 else _fullwidth(orig["text"])
            copy_id = f"{orig['id']}#copy{k}"
            recs.append({"id": copy_id, "text": text, "source": orig["source"]})
            planted["exact_duplicates"].append({"id": copy_id, "duplicate_of": orig["id"]})
        # near copies of documents none of whose lines recur elsewhere: the filter strips lines that recur
        # in many documents of a source (the composed essays' paragraphs), which would change both texts
        # before dedup sees them. English: the Python docs; Chinese: one-line mixes of sentences.
        if recs is zh_rec:
            sentences = [x + "。" for para in ZH_PARAGRAPHS for x in para.split("。") if x]
            bases = [{"id": f"zh-mix-{k:03d}", "text": "".join(rng.sample(sentences, 10)), "source": "zh-essays"}
                     for k in range(n_copies // 2)]
            recs.extend(bases)
        else:
            bases = rng.sample([r for r in recs[: len(recs) - n_copies] if r["id"].startswith("python:")], n_copies // 2)
        for k, orig in enumerate(bases):
            near_id = f"{orig['id']}#near{k}"
            text, j = _near_copy(orig["text"], rng, jaccard, threshold + 0.05, 0.97)
            recs.append({"id": near_id, "text": text, "source": orig["source"]})
            planted["near_duplicates"].append({"id": near_id, "near": orig["id"], "jaccard": round(j, 4)})
    for k, junk in enumerate(JUNK):
        rec = {"id": f"junk-{k}", "text": junk, "source": "junk"}
        (zh_rec if k % 2 else en_rec).append(rec)
        planted["junk"].append(rec["id"])
    rng.shuffle(en_rec)
    rng.shuffle(zh_rec)

    # English: plain JSONL with malformed lines mixed in
    bad_lines = [
        b'{"id": "bad-json", "text": "an unterminated string\n',
        b'{"id": "bad-utf8", "text": "caf\xe9 au lait"}\n',
        b'{"id": "no-text", "body": "the text is under another key"}\n',
        b'{"id": "number-text", "text": 12345}\n',
        b'["a", "list", "not", "an", "object"]\n',
    ]
    with open(out / "en.jsonl", "wb") as f:
        for i, rec in enumerate(en_rec):
            f.write(json.dumps(rec, ensure_ascii=False).encode() + b"\n")
            if i % 97 == 0 and bad_lines:
                line = bad_lines.pop()
                f.write(line)
                planted["malformed"].append(line.decode("utf-8", "replace").strip()[:60])
            if i == 10:
                f.write(b"\n")  # a blank line: no document, skipped and counted
    half = len(zh_rec) // 2
    with gzip.open(out / "zh.jsonl.gz", "wb") as f:
        for rec in zh_rec[:half]:
            f.write(json.dumps(rec, ensure_ascii=False).encode() + b"\n")
    import zstandard

    with open(out / "zh-more.jsonl.zst", "wb") as raw, zstandard.ZstdCompressor().stream_writer(raw) as f:
        for rec in zh_rec[half:-40]:
            f.write(json.dumps(rec, ensure_ascii=False).encode() + b"\n")
    pq.write_table(pa.Table.from_pylist(zh_rec[-40:]), out / "zh-extra.parquet")
    notes = out / "notes"  # plain-text files: one document each, named by their path
    notes.mkdir(exist_ok=True)
    for k, (_, text) in enumerate(_compose(rng, ZH_PARAGRAPHS + EN_PARAGRAPHS, 8, "note", "\n\n")):
        (notes / f"note-{k:02d}.txt").write_text(text, encoding="utf-8")
    (notes / "latin1.txt").write_bytes("Grüße aus Köln, ein Text in Latin-1.".encode("latin-1"))
    planted["malformed"].append("notes/latin1.txt")
    summary = {k: len(v) for k, v in planted.items()}
    (out / "PLANTED.json").write_text(json.dumps({"counts": summary, **planted}, indent=1, ensure_ascii=False), encoding="utf-8")
    return {"counts": summary, **planted}
