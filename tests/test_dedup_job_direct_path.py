"""The dedup job's direct path, kernel by kernel and without a cluster: the
read step signs each part while it is in memory, the exact hash folds whitespace in one compiled
loop, and the export drops the found duplicates as it writes kept/. Each must give exactly what the
slower path it replaces gives (the removed set and the ledger depend on it)."""
from __future__ import annotations

import json
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from corpusmill.pipeline.config import Config
from corpusmill.pipeline.steps.dedup import signatures
from corpusmill.pipeline.steps.dedup.removal import _group_counts
from corpusmill.pipeline.steps.export import export_kept_part
from corpusmill.stages import exact_dedup, near_dedup, quality, read
from corpusmill.stages.composition import group_counts
from corpusmill.stages.normalize import fold_whitespace_array

SPACES = [" ", "  ", "\n", "\n\n\n", "\t", "\u3000", "\u00a0", "\u2009", "\u1680", "\u205f", "\u202f", "\u2028",
          "\x0b", "\x85", "\u200b"]
LETTERS = ["a", "Wort", "中文", "é", "ｶ", "한", "—", "!"]


def _fuzz_texts(n: int, seed: int = 7) -> list:
    rng = random.Random(seed)
    return [None, ""] + ["".join(rng.choice(SPACES if rng.random() < 0.5 else LETTERS) for _ in range(rng.randint(0, 16)))
                         for _ in range(n)]


def test_compiled_fold_gives_the_bytes_of_the_regex_passes():
    texts = pa.array(_fuzz_texts(5_000), pa.string())
    assert exact_dedup.fold_whitespace(texts).equals(fold_whitespace_array(texts).cast(pa.large_string()))
    assert exact_dedup.hash_texts(exact_dedup.fold_whitespace(texts))[0].tolist() == \
        exact_dedup.hash_texts(fold_whitespace_array(texts))[0].tolist()


def _script_language_by_definition(text: str, share: float) -> str:
    """The reader's language column, one code point at a time from the class table."""
    q = quality
    cls = q._class_tables()[0]
    counts = np.bincount([cls[ord(c)] for c in text], minlength=q.N_CLASSES)
    letters = max(int(counts[q.C_HAN:q.C_OTHER_LETTER + 1].sum()), 1)
    if (counts[q.C_HAN] + counts[q.C_KANA] + counts[q.C_HANGUL]) / letters >= share:
        return "zh"
    return "en" if counts[q.C_LATIN] / letters >= 0.5 else "other"


def test_script_language_from_the_arrow_buffer_matches_the_reader_column():
    texts = [t or "" for t in _fuzz_texts(3_000, seed=3)] + ["plain English words", "中文和English混合的文本", "日本語のかな"]
    for share in (0.3, 0.05):
        assert quality.script_language(pa.array(texts, pa.string()), share).tolist() == \
            [_script_language_by_definition(t, share) for t in texts]
        assert quality.script_language(texts, share).tolist() == quality.script_language(pa.array(texts), share).tolist()


def _corpus(tmp_path):
    rows = []
    for i in range(60):
        base = f"document {i % 20} about deduplication, with a few words to shingle " * 3
        rows.append(json.dumps({"id": f"d{i}", "text": base if i % 3 else base.upper() + "\u3000 tail", "lang": i % 2}))
    rows.insert(5, "{not json")  # quarantined with its file, line and reason, never signed
    rows.insert(9, json.dumps({"id": "no-text"}))
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    units, _ = read.plan_units([str(path)], 64 << 20, 32 << 20)
    return units, read.ReadOptions("text", "id", "source", 32 << 20)


def test_read_and_sign_writes_the_read_parts_and_their_signatures(tmp_path):
    units, opts = _corpus(tmp_path)
    cfg = Config()
    spec = signatures.read_spec(cfg, cfg.normalize.model_dump())
    assert spec is not None and spec.exact and spec.minhash is not None
    plain, signed = tmp_path / "plain", tmp_path / "signed"
    plain.mkdir()
    signed.mkdir()
    expected = read.read_unit(units[0], opts, str(plain))
    result = near_dedup.read_and_sign_unit(units[0], opts, str(signed), spec)
    assert result["stats"] == {**expected["stats"], "task_seconds": result["stats"]["task_seconds"]}
    assert [(q["line"], q["code"]) for q in result["quarantine"]] == [(6, "invalid_json"), (10, "missing_text")]
    assert result["files"] == expected["parts"] + [f"signatures/{p}" for p in expected["parts"]]
    for part in expected["parts"]:
        assert pq.read_table(signed / part).equals(pq.read_table(plain / part))  # the same read parts
        # the signatures made in memory are those the signature pass makes from the written part
        again = tmp_path / f"again-{part}"
        near_dedup.signature_part(str(plain / part), str(again), spec)
        assert pq.read_table(signed / "signatures" / part).equals(pq.read_table(again))


def test_deferred_counts_group_like_the_removal_pass():
    rng = np.random.default_rng(1)
    n = 5_000
    src = [rng.choice(["web", "wiki", None, "书"]) for _ in range(n)]
    lang = [rng.choice(["en", "zh", None, "other"]) for _ in range(n)]
    chars = rng.integers(0, 500, n)
    table = pa.table({"source": pa.array(src, pa.string()), "language": pa.array(lang, pa.string()),
                      "raw_chars": pa.array(chars)})
    assert json.dumps(_group_counts(table)) == json.dumps(group_counts(src, lang, chars=chars))


def test_export_drops_the_found_duplicates_as_it_writes(tmp_path):
    units, opts = _corpus(tmp_path)
    (tmp_path / "parts").mkdir()
    part = str(tmp_path / "parts" / read.read_unit(units[0], opts, str(tmp_path / "parts"))["parts"][0])
    table = pq.read_table(part)
    drop = np.sort(table.column("uid").to_numpy()[[1, 4, 7]])
    filtered = tmp_path / "filtered" / "part-00000-000.parquet"
    filtered.parent.mkdir()
    pq.write_table(table.filter(pa.array(~np.isin(table.column("uid").to_numpy(), drop))), filtered)
    for fmt in ("jsonl", "parquet"):
        (tmp_path / f"a-{fmt}").mkdir()
        (tmp_path / f"b-{fmt}").mkdir()
        types = {"lang": "int64"} if fmt == "parquet" else None
        rows, texts = export_kept_part(part, str(tmp_path / f"a-{fmt}"), fmt, "text", "id", None, types, drop, None)
        assert rows == table.num_rows - 3 and sorted(texts) == drop.tolist()
        export_kept_part(str(filtered), str(tmp_path / f"b-{fmt}"), fmt, "text", "id", None, types)
        a, b = (tmp_path / d / f"part-00000-000.{fmt}" for d in (f"a-{fmt}", f"b-{fmt}"))
        if fmt == "jsonl":
            assert a.read_text(encoding="utf-8") == b.read_text(encoding="utf-8")
        else:
            assert pq.read_table(a).equals(pq.read_table(b))
