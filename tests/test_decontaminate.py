"""Decontamination kernels: word n-grams for Latin text, character n-grams for CJK text, against a
small evaluation set in real benchmark shapes (an MMLU-like English item, a C-Eval-like Chinese one)."""
from __future__ import annotations

import json

import pandas as pd

from corpusmill.stages.decontaminate import decontaminate_batch, eval_index

EN_Q = "Which of the following statements best describes the role of the mitochondria in eukaryotic cells during respiration"
ZH_Q = "下列关于中华人民共和国宪法修改程序的说法中，正确的是由全国人民代表大会常务委员会或者五分之一以上的全国人民代表大会代表提议"


def _eval(tmp_path):
    path = tmp_path / "eval.jsonl"
    items = [{"id": "mmlu-7", "question": EN_Q, "answer": "B"}, {"id": "ceval-3", "question": ZH_Q, "answer": "C"},
             {"id": "short", "question": "Too short.", "answer": "A"}]
    path.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in items), encoding="utf-8")
    return eval_index([("bench", str(path))], ["question", "answer"], "id", 13, 25)


def test_long_shared_ngrams_remove_documents_in_both_scripts_and_name_the_item(tmp_path):
    hashes, items, labels, info = _eval(tmp_path)
    assert info["items"] == 3 and info["items_too_short"] == 1
    words = EN_Q.split()
    docs = pd.DataFrame({
        "uid": [1, 2, 3, 4, 5], "id": ["en-copy", "en-12", "zh-copy", "zh-24", "clean"], "source": ["s"] * 5,
        "text": [
            "Intro text. " + EN_Q.upper().replace(" the ", ", the ") + "? More text follows here.",  # case, punctuation
            "Notes: " + " ".join(words[:12]) + " and then something else entirely.",  # 12 words: below 13
            "题目：" + ZH_Q[:30].replace("，", " ， ") + "……以下略",  # 30 CJK characters, spacing changed
            "摘录" + ZH_Q[:24] + "。",  # 24 characters: below 25
            "An ordinary document about gardens and rivers in winter.",
        ]})
    out = decontaminate_batch(docs, hashes, items, labels, 13, 25)
    removed = out.removed.to_pandas()
    assert dict(zip(removed["id"], removed["eval_item"])) == {"en-copy": "bench:mmlu-7", "zh-copy": "bench:ceval-3"}
    assert set(removed["reason"]) == {"decontaminated"}
    assert out.kept["id"].tolist() == ["en-12", "zh-24", "clean"]
    assert out.stats["removed"] == {"decontaminated": 2} and out.stats["by_eval_set"] == {"bench": 2}
