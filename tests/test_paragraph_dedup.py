"""Paragraph-level dedup: the kernel on Chinese and English pages (a shared ICP / copyright footer
goes from all but the first page, a paragraph of one document and short lines stay, an emptied
document is removed with its reason), the hash-range passes agree with the in-memory kernel, and
one real pipeline run (LocalCluster) whose ledger adds up and whose second run reuses the step."""
from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from corpusmill.pipeline.config import parse_config
from corpusmill.pipeline.plan import build_plan
from corpusmill.stages import paragraph_dedup as kernel
from tests.conftest import LENGTH_ONLY_FILTER, write_jsonl

ICP = "京ICP备12345678号-1 版权所有 © 2024 某某网络科技有限公司 保留所有权利"
COPYRIGHT = "Copyright (c) 2024 Example Media Group. All rights reserved. Terms of use apply."
ZH_WORDS = "天气 城市 河流 学校 老师 学生 书本 音乐 电影 朋友 工作 生活 历史 文化 科技 发展".split()
EN_WORDS = "river stone bread garden winter music paper signal memory letter number light window".split()


def _zh(rng: random.Random, n: int = 30) -> str:
    return "".join(rng.choice(ZH_WORDS) for _ in range(n)) + "。"


def _en(rng: random.Random, n: int = 30) -> str:
    return " ".join(rng.choice(EN_WORDS) for _ in range(n)) + "."


def _table(texts: list[str], sources: list[str] | None = None, first_uid: int = 100) -> pa.Table:
    n = len(texts)
    return pa.table({"uid": pa.array(range(first_uid, first_uid + n), pa.int64()), "id": [f"d{i}" for i in range(n)],
                     "text": texts, "source": sources or ["web"] * n, "language": ["zh"] * n})


def test_a_shared_footer_goes_from_every_page_but_the_first_in_chinese_and_english():
    rng = random.Random(1)
    zh = [f"{_zh(rng)}\n\n{ICP}\n联系我们 | 关于我们" for _ in range(5)]
    en = [f"{_en(rng)}\n{COPYRIGHT.upper() if i else COPYRIGHT}\nHome | About" for i in range(3)]  # case differs
    table = _table(zh + en, ["forum"] * 5 + ["news"] * 3)
    result, examples = kernel.dedup_table(table, min_chars=20, min_docs=2, min_doc_chars_left=20, examples=5)
    kept = result.kept.to_pylist()
    assert [r["id"] for r in kept] == [f"d{i}" for i in range(8)]  # nobody emptied: each keeps its own body
    assert ICP in kept[0]["text"] and all(ICP not in r["text"] for r in kept[1:5])
    assert COPYRIGHT in kept[5]["text"] and all(COPYRIGHT.upper() not in r["text"] for r in kept[6:])
    # the bodies (in one document each) and the short navigation lines (under 20 non-space characters) stay
    assert all(r["text"].startswith(t.split("\n")[0]) and r["text"].endswith(t.split("\n")[-1]) for r, t in zip(kept, zh + en))
    assert kept[1]["text"] == zh[1].replace(f"{ICP}\n", "")  # the line goes, the blank line before it stays one
    assert [r["paragraphs_removed"] for r in kept] == [0, 1, 1, 1, 1, 0, 1, 1]
    assert [r["paragraph_chars_removed"] for r in kept] == [0] + [len(ICP) + 1] * 4 + [0] + [len(COPYRIGHT) + 1] * 2
    s = result.stats
    assert (s["paragraphs_removed"], s["docs_touched"], s["docs_emptied"], s["repeated_paragraphs"]) == (6, 6, 0, 2)
    assert s["by_source"]["forum"]["paragraphs_removed"] == 4 and s["by_source"]["news"]["chars_removed"] == 2 * (len(COPYRIGHT) + 1)
    assert s["chars_removed"] == 4 * (len(ICP) + 1) + 2 * (len(COPYRIGHT) + 1)
    assert [(e["documents"], e["removed"], e["text"]) for e in examples] == [(5, 4, ICP), (3, 2, COPYRIGHT.upper())]


def test_whitespace_and_case_are_folded_for_comparison_but_the_original_text_is_removed():
    assert kernel.paragraph_hash("  Foo\u3000BAR \t baz  ") == kernel.paragraph_hash("foo bar baz")
    assert kernel.paragraph_hash("foo bar baz") != kernel.paragraph_hash("foo barbaz")
    tricky = ["A\u00a0B\u3000\u3000C\t\r\nD  E", "\u212a\u0130\u1e9e\u023a \u03a3\u039f\u03a3", "", "\n\n x \n"]
    import pyarrow.compute as pc

    arrow = pc.utf8_lower(pc.replace_substring_regex(pa.array(tricky), r"[\t\x0b\x0c\r\x1c-\x1f\x85\p{Z}]+", " "))
    assert kernel.normalise(pa.array(tricky)).to_pylist() == arrow.to_pylist()  # the compiled pass is Arrow's lower
    split = kernel.split(pa.array(["标题\n\n京ICP备12345678号 全角　空格\r\nabc"]), 5)
    assert split.per_doc.tolist() == [4] and split.chars.tolist() == [2, 0, 18, 3]
    assert split.eligible.tolist() == [False, False, True, False]  # characters, not words: CJK counts one each


def test_an_emptied_document_is_removed_with_its_reason_and_names_the_keeper():
    rng = random.Random(2)
    body = [_zh(rng) for _ in range(3)]
    texts = [f"{body[0]}\n{ICP}", f"{body[1]}\n{ICP}", f"首页\n{ICP}\n  ", f"{body[2]}"]
    result, _ = kernel.dedup_table(_table(texts), min_chars=20, min_doc_chars_left=20)
    assert [r["id"] for r in result.kept.to_pylist()] == ["d0", "d1", "d3"]
    row = result.removed.iloc[0]
    assert (row["id"], row["reason"], row["duplicate_of"], row["duplicate_of_id"], row["cluster_size"]) == \
        ("d2", kernel.REASON, 100, "d0", 3)
    assert row["score"] == 2 and row["threshold"] == 20 and row["text"] == texts[2]  # 2 characters left, the whole text
    assert result.stats["removed"] == {kernel.REASON: 1} and result.stats["docs_in"] == 4 and result.stats["docs_out"] == 3


def test_a_paragraph_is_removed_only_in_min_docs_documents_and_the_keeper_is_never_emptied():
    texts = [f"{ICP}\n{COPYRIGHT}", f"{ICP}\nsomething else entirely, long enough", f"{COPYRIGHT}\n{ICP}"]
    # d0 keeps both footers for the corpus: never removed whole, although all its text recurs elsewhere
    result, _ = kernel.dedup_table(_table(texts), min_docs=2, min_doc_chars_left=1000)
    assert [r["id"] for r in result.kept.to_pylist()] == ["d0"] and result.kept.column("text")[0].as_py() == texts[0]
    assert set(result.removed["id"]) == {"d1", "d2"}
    result, _ = kernel.dedup_table(_table(texts), min_docs=4)  # in three documents: below min_docs, nothing goes
    assert result.kept.column("text").to_pylist() == texts and result.stats["paragraphs_removed"] == 0
    result, _ = kernel.dedup_table(_table(texts), min_docs=3)  # only the ICP line is in three
    assert result.kept.column("text").to_pylist()[1:] == ["something else entirely, long enough", COPYRIGHT]


def test_the_hash_range_passes_give_what_the_in_memory_kernel_gives(tmp_path):
    """Parts on disk, several buckets and ranges: the same kept texts and removed rows."""
    rng = random.Random(3)
    lines = [_en(rng, 6) for _ in range(40)]
    texts = ["\n".join(rng.sample(lines, 5)) for _ in range(120)]
    whole = _table(texts)
    want, _ = kernel.dedup_table(whole, min_chars=10, min_docs=3, min_doc_chars_left=30)
    parts = []
    for k, (a, b) in enumerate([(0, 50), (50, 51), (51, 120)]):
        parts.append(str(tmp_path / f"part-{k}.parquet"))
        pq.write_table(whole.slice(a, b - a), parts[-1])
    bits = 4
    files = [str(tmp_path / f"{k}.npy") for k in range(len(parts))]
    cuts = np.array([kernel.pairs_to_file(p, 10, bits, f)["cuts"] for p, f in zip(parts, files)])
    ranges = [(0, 3), (3, 4), (4, 16)]
    outs = [str(tmp_path / f"r{j}.npy") for j in range(len(ranges))]
    found = [kernel.repeated_in_buckets(files, cuts[:, [a, b]], 3, o, 0) for (a, b), o in zip(ranges, outs)]
    part_cuts = np.array([r["part_cuts"] for r in found])
    got_text, got_removed = [], []
    for i, p in enumerate(parts):
        result, _ = kernel.remove_part(pq.read_table(p), outs, part_cuts[:, [i, i + 1]], 10, 30, 2000, None)
        got_text += result.kept.column("text").to_pylist()
        got_removed += result.removed["uid"].tolist()
    assert got_text == want.kept.column("text").to_pylist() and got_removed == want.removed["uid"].tolist()
    assert sum(r["repeated"] for r in found) == want.stats["repeated_paragraphs"] > 0


def test_paragraph_dedup_is_off_by_default_and_leaves_resume_hashes_alone():
    cfg = parse_config({})
    assert "paragraph_dedup" not in [s.name for s in build_plan(cfg, "run").steps]
    payload = {"dedup": cfg.dedup.model_dump(mode="json"), "_extra": None}
    for key in ("reference", "write_index", "paragraph"):  # the keys hashed only when set
        payload["dedup"].pop(key)
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()
    assert cfg.section_hash("dedup") == hashlib.sha256(blob).hexdigest()[:16]
    on = parse_config({"dedup": {"paragraph": {"enabled": True}}, "decontaminate": {"sets": [{"name": "x", "path": "x.jsonl"}]}})
    names = [s.name for s in build_plan(on, "run").steps]
    assert names.index("near_dedup") + 1 == names.index("paragraph_dedup") == names.index("decontaminate") - 1
    assert "paragraph_dedup" not in [s.name for s in build_plan(on, "dedup").steps]


# ---- one real run ------------------------------------------------------------------------------

def _corpus(root: Path) -> None:
    rng = random.Random(4)
    forum = [{"id": f"f{i}", "text": f"{_zh(rng, 40)}\n\n{ICP}\n返回顶部", "source": "forum"} for i in range(12)]
    forum.append({"id": "f-footer-only", "text": f"返回顶部\n{ICP}", "source": "forum"})
    news = [{"id": f"n{i}", "text": f"{_en(rng, 40)}\n\n{COPYRIGHT}\n\n{_en(rng, 20)}", "source": "news"} for i in range(8)]
    news.append({"id": "n-with-icp", "text": f"{_en(rng, 40)}\n{ICP}", "source": "news"})  # across sources
    write_jsonl(root / "forum.jsonl", forum)
    write_jsonl(root / "news.jsonl", news)


@pytest.fixture(scope="module")
def run(tmp_path_factory, dask_client):
    from corpusmill.pipeline.runner import Pipeline

    root = tmp_path_factory.mktemp("paragraph")
    _corpus(root / "corpus")
    cfg = parse_config({
        "input": {"paths": [str(root / "corpus")], "part_size_mb": 0.002},  # several parts: the hash ranges span them
        "filter": {"length": {"min_chars": 10}, **LENGTH_ONLY_FILTER, "boilerplate_lines": {"enabled": False}},
        "dedup": {"paragraph": {"enabled": True, "examples": 3}},
        "tokenizer": {"train": {"vocab_size": 500}}, "pack": {"seq_length": 32}, "shard": {"ranks": 1},
    })
    first = Pipeline(cfg, root / "out", client=dask_client, log=lambda m: None).run()
    second = Pipeline(cfg, root / "out", client=dask_client, log=lambda m: None, resume=True).run()
    return root / "out", first, second


def test_a_run_removes_repeated_paragraphs_and_its_ledger_adds_up(run):
    out, first, _ = run
    s = first.stages["paragraph_dedup"]
    assert len(list((out / "04a-paragraph_dedup").glob("part-*.parquet"))) > 2 and s["hash_ranges"] > 1
    assert s["docs_in"] == 22 and s["removed"] == {kernel.REASON: 1} and s["docs_out"] == 21
    assert s["paragraphs_removed"] == 11 + 7 + 1 and s["docs_touched"] == 19 and s["repeated_paragraphs"] == 2
    assert s["by_source"]["forum"]["docs_emptied"] == 1 and s["by_source"]["news"]["paragraphs_removed"] == 8
    ledger = json.loads((out / "ledger.json").read_text())
    assert ledger["balanced"] and ledger["stages"]["paragraph_dedup"]["removed"] == {kernel.REASON: 1}
    assert ledger["input"] == ledger["kept"] + ledger["filtered"] + ledger["duplicates"] + ledger["quarantined"]
    assert ledger["duplicates"] == 1
    removed = pq.read_table(sorted((out / "04a-paragraph_dedup" / "removed").glob("*.parquet"))).to_pylist()
    assert [(r["id"], r["reason"], r["duplicate_of_id"]) for r in removed] == [("f-footer-only", kernel.REASON, "f0")]
    kept = pq.read_table(sorted((out / "04a-paragraph_dedup").glob("part-*.parquet"))).to_pylist()
    holding = [r["id"] for r in kept if ICP in r["text"]]
    assert holding == ["f0"] and sum(COPYRIGHT in r["text"] for r in kept) == 1
    assert sum(r["paragraph_chars_removed"] for r in kept) == s["chars_removed"] > 0
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "## Repeated paragraphs" in report and f"| 14 | 13 | f0 | {ICP} |" in report


def test_a_second_run_reuses_the_step(run):
    _, first, second = run
    assert "paragraph_dedup" in second.skipped and "near_dedup" in second.skipped
    assert second.stages["paragraph_dedup"]["paragraphs_removed"] == first.stages["paragraph_dedup"]["paragraphs_removed"]
