"""Fuzzing the reader: over 10,000 malformed and odd records in every input format, through the real
`run` and `dedup` commands (in-process CLI on a real Dask LocalCluster).

Every good record (known id) must end kept, filtered or a duplicate exactly once; every bad one must
be one quarantine row; damaged streams keep their head and leave one lost-input row; the ledger
balances. A seeded generator writes the 10k records (fast, reproducible); hypothesis drives a
smaller property test of the same contract on single JSONL files.
"""
from __future__ import annotations

import gzip
import json
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corpusmill.pipeline.cli import main as cli_main
from corpusmill.stages import read
from tests.conftest import LENGTH_ONLY_FILTER, Warc

WORDS = ("river stone bread light garden winter music paper signal memory corpus window letter number model "
         "token quality filter python train shard rank data").split()
ODD = ["\u0301", "\u200b", "\u200f", "\u2028", "\u2029", "\x00", "\x07", "\ufeff", "\U0001F600",
       "\U0001F469\u200d\U0001F52C", "中文", "العربية", "தமிழ்", "𝔘𝔫𝔦", "\u00e9", "e\u0301", "\t", "\r", "\\", "\"",
       "</script>", "\ufffd", "\U0010FFFD"]


@dataclass
class Truth:
    good: dict = field(default_factory=dict)  # id -> text (every good record, by its unique id)
    bad: dict = field(default_factory=dict)  # (file as written in quarantine, line) -> expected code
    bad_documents: int = 0  # quarantined documents (a corrupt row group counts its rows)
    lost: dict = field(default_factory=dict)  # file -> (kind, id prefix, records written) for damaged files
    duplicates: int = 0
    web: dict = field(default_factory=dict)  # url -> a word only its page holds (WARC pages read past a damaged member)
    web_lost: set = field(default_factory=set)  # urls of the records inside the damaged member


class Corpus:
    """Writes good and bad records with a seeded generator and remembers which is which."""

    def __init__(self, root: Path, seed: int = 13):
        self.root, self.rng, self.truth = root, random.Random(seed), Truth()
        self.n = 0
        self.texts: list[str] = []

    # ---- good records: odd but valid -------------------------------------------------------
    def good_text(self) -> str:
        rng = self.rng
        words = [rng.choice(WORDS) for _ in range(rng.randint(8, 40))]
        for _ in range(rng.randint(0, 4)):
            words.insert(rng.randrange(len(words) + 1), rng.choice(ODD))
        return " ".join(words) + f" n{self.n}"

    def good_record(self) -> tuple[str, dict]:
        rng = self.rng
        self.n += 1
        doc_id = f"g{self.n}"
        if self.texts and rng.random() < 0.04:  # an exact duplicate of an earlier good text
            text = rng.choice(self.texts)
            self.truth.duplicates += 1
        else:
            text = self.good_text()
            self.texts.append(text)
        rec: dict = {"id": doc_id, "text": text}
        extra = rng.random()
        if extra < 0.2:
            rec["lang"] = rng.choice(["en", 3, None, ["en", "zh"], {"code": "en"}, 1.5, True])
        elif extra < 0.25:
            rec["n"] = int("9" * rng.randint(20, 400))  # beyond int64, within Python's digit limit
        elif extra < 0.3:
            rec["tree"] = json.loads("[" * 30 + "1" + "]" * 30)
        elif extra < 0.35:
            rec["source"] = rng.choice(["web", 7, None, "ß源"])
        self.truth.good[doc_id] = text
        return doc_id, rec

    def good_line(self) -> bytes:
        _, rec = self.good_record()
        rng = self.rng
        line = json.dumps(rec, ensure_ascii=rng.random() < 0.5).encode()
        r = rng.random()
        if r < 0.05:
            line = read._BOM + line  # a BOM at a line start is read
        elif r < 0.1:
            line += b"\r"  # CRLF line ends
        elif r < 0.12:
            line = b"  " + line + b"\t"
        return line + b"\n"

    # ---- bad records --------------------------------------------------------------------------
    def bad_line(self) -> tuple[bytes, str]:
        rng = self.rng
        k = rng.randrange(14)
        text = self.good_text()
        if k == 0:
            line = json.dumps({"id": "x", "text": text}).encode()
            return line[: rng.randint(1, len(line) - 1)], "invalid_json"
        if k == 1:
            return rng.choice([b"{'text': 'single quotes'}", b"{text: 1}", b'{"text": "a" "b"}', b'{"text": "x"} trailing',
                               b'{"text": "raw \x00 nul"}', b'{"text": "tab\tinside"}', b"\xef\xbb\xbf\xef\xbb\xbf{}",
                               b'{"text": "x",}', b"}", b'{"text": "a"}\x00']), "invalid_json"
        if k == 2:
            bad = rng.choice([b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe4\xb8", b"\x80abc", b"\xf8\x88\x80\x80\x80"])
            return b'{"text": "' + text.encode("ascii", "ignore")[:20] + bad + b'"}', "invalid_utf8"
        if k == 3:
            return rng.choice([b"[1, 2]", b'"a string"', b"42", b"null", b"true", b"[]", b"1e999"]), "not_an_object"
        if k == 4:
            return json.dumps({"body": text, "id": "m"}).encode(), "missing_text"
        if k == 5:
            value = rng.choice([5, None, ["a"], {"t": text}, True, 1.5])
            return json.dumps({"text": value}).encode(), "text_not_string"
        if k in (6, 7, 8):
            where = rng.choice(["text", "id", "source", "lang", "key", "nested"])
            sur = rng.choice(["\ud800", "\udfff", "\udc80", "a\ud83d"])
            rec: dict = {"id": "s", "text": text}
            if where == "key":
                rec[sur + "k"] = 1
            elif where == "nested":
                rec["meta"] = {"deep": [1, {"x": sur}]}
            else:
                rec[where] = (rec.get(where) or "") + sur
            return json.dumps(rec).encode(), "invalid_unicode"
        if k == 9:
            depth = rng.choice([201, 500, 999, 1500, 5000]) if rng.random() < 0.97 else 50000
            opener, closer = rng.choice([("[", "]"), ('{"a":', "}")])
            return (b'{"text": "deep", "x": ' + (opener * depth).encode() + b"1" + (closer * depth).encode() + b"}",
                    "too_deep")
        if k == 10 and rng.random() < 0.3:
            return b'{"text": "big", "n": ' + b"7" * rng.randint(4301, 6000) + b"}", "invalid_number"
        if k == 11:
            ctrl = rng.choice([c for c in range(32) if c != 10])
            return b'{"text": "ok' + bytes([ctrl]) + b'"}', "invalid_json"  # a raw control character in a string
        if k == 12:
            return b"\xef\xbb\xbf[1]", "not_an_object"  # the BOM is read, the value is not an object
        return bytes(rng.randrange(32, 127) for _ in range(rng.randint(1, 60))).replace(b"\n", b" ") + b"{", "invalid_json"

    # ---- files ------------------------------------------------------------------------------------
    def mixed_lines(self, path: Path, n: int, bad_share: float, first_line: int = 1) -> bytes:
        shown = read.display_path(str(path))
        out = []
        line_no = first_line - 1
        for _ in range(n):
            if self.rng.random() < 0.01:
                out.append(b"\n")  # blank lines hold no record
                line_no += 1
            line_no += 1
            if self.rng.random() < bad_share:
                raw, code = self.bad_line()
                self.truth.bad[(shown, line_no)] = code
                self.truth.bad_documents += 1
                out.append(raw + b"\n")
            else:
                out.append(self.good_line())
        return b"".join(out)

    def damaged(self, path: Path, kind: str, n: int, prefix: str) -> None:
        lines = [json.dumps({"id": f"{prefix}{i}", "text": self.good_text() + f" {prefix}{i}"}).encode() + b"\n"
                 for i in range(n)]
        if kind == "gz":
            blob = gzip.compress(b"".join(lines))
        else:  # small frames, so that the part before the cut decodes
            blob = b"".join(zstandard.ZstdCompressor().compress(b"".join(lines[i:i + 50])) for i in range(0, n, 50))
        path.write_bytes(blob[: len(blob) * 2 // 3])
        self.truth.lost[read.display_path(str(path))] = ("truncated_stream", prefix, n)

    def build(self) -> Truth:
        root = self.root
        (root / "deep" / "er").mkdir(parents=True)
        _, first = self.good_record()
        plain = read._BOM + json.dumps(first).encode() + b"\n"  # a BOM at the file start is read
        body = plain + self.mixed_lines(root / "plain.jsonl", 2400, 0.8, first_line=2)
        giant_line = body.count(b"\n") + 1  # one record of 1.5 MiB, over input.max_record_mb, across read blocks
        self.truth.bad[(read.display_path(str(root / "plain.jsonl")), giant_line)] = "record_too_large"
        self.truth.bad_documents += 1
        body += json.dumps({"id": "giant", "text": "x" * (3 << 19)}).encode() + b"\n"
        body += self.mixed_lines(root / "plain.jsonl", 2400, 0.8, first_line=giant_line + 1)
        (root / "plain.jsonl").write_bytes(body)
        name = os.path.join(os.fsencode(root), b"caf\xe9-latin1.jsonl")
        with open(name, "wb") as f:
            f.write(self.mixed_lines(Path(os.fsdecode(name)), 1200, 0.8))
        gz_path = root / "deep" / "mix.jsonl.gz"
        head = self.mixed_lines(gz_path, 1500, 0.8)
        rest = self.mixed_lines(gz_path, 1500, 0.8, first_line=head.count(b"\n") + 1)
        gz_path.write_bytes(gzip.compress(head) + gzip.compress(rest))  # two members
        zst_path = root / "deep" / "er" / "mix.jsonl.zst"
        data = self.mixed_lines(zst_path, 4000, 0.8)
        zst_path.write_bytes(b"".join(zstandard.ZstdCompressor().compress(data[i:i + 50000])
                                      for i in range(0, len(data), 50000)))  # many frames
        self.damaged(root / "trunc.jsonl.zst", "zst", 600, "t")
        self.damaged(root / "deep" / "trunc.jsonl.gz", "gz", 600, "u")
        garbage = root / "garbage.jsonl.zst"
        garbage.write_bytes(bytes(self.rng.randrange(256) for _ in range(5000)))
        self.truth.lost[str(garbage)] = ("corrupt_stream", None, 0)
        mislabelled = root / "gzip-inside.jsonl.zst"
        mislabelled.write_bytes(gzip.compress(b'{"text": "never read"}\n' * 50))
        self.truth.lost[str(mislabelled)] = ("corrupt_stream", None, 0)
        self.parquet_files()
        self.txt_files()
        self.warc_file(root / "crawl" / "pages.warc.gz")
        os.symlink(root / "plain.jsonl", root / "deep" / "alias.jsonl")  # the same file: read once
        os.symlink(root, root / "deep" / "er" / "loop")  # a folder loop: the walk ends
        return self.truth

    def parquet_files(self) -> None:
        root, rng = self.root, self.rng
        rows = []
        for i in range(400):
            if rng.random() < 0.15:
                rows.append({"id": f"pbad{i}", "text": None, "year": i})
                self.truth.bad[(str(root / "table.parquet"), i + 1)] = "text_not_string"
                self.truth.bad_documents += 1
            else:
                doc_id, rec = self.good_record()
                rows.append({"id": doc_id, "text": rec["text"], "year": i})
        pq.write_table(pa.Table.from_pylist(rows), root / "table.parquet", row_group_size=100)
        # a row group whose data page is corrupt: its rows are quarantined as one row
        broken = root / "broken-page.parquet"
        ids = [f"rg{i}" for i in range(300)]
        pq.write_table(pa.table({"text": [f"row group text {i} " + " ".join(WORDS) for i in range(300)], "id": ids}), broken,
                       row_group_size=100, compression="none")
        off = pq.ParquetFile(broken).metadata.row_group(1).column(0).data_page_offset
        blob = bytearray(broken.read_bytes())
        blob[off:off + 16] = b"\xff" * 16
        broken.write_bytes(bytes(blob))
        for i in (0, 2):
            for j in range(100):
                self.truth.good[ids[i * 100 + j]] = f"row group text {i * 100 + j} " + " ".join(WORDS)
        self.truth.bad[(str(broken), 101)] = "unreadable_row_group"
        self.truth.bad_documents += 100
        pq.write_table(pa.table({"text": list(range(150)), "id": [f"int{i}" for i in range(150)]}),
                       root / "int-text.parquet")
        pq.write_table(pa.table({"body": ["no text column"] * 120}), root / "no-text.parquet")
        for i in range(150):
            self.truth.bad[(str(root / "int-text.parquet"), i + 1)] = "text_not_string"
        for i in range(120):
            self.truth.bad[(str(root / "no-text.parquet"), i + 1)] = "missing_text"
        self.truth.bad_documents += 270
        (root / "footer-gone.parquet").write_bytes(b"PAR1" + bytes(self.rng.randrange(256) for _ in range(3000)))
        self.truth.lost[str(root / "footer-gone.parquet")] = ("unreadable_file", None, 0)

    def warc_file(self, path: Path) -> None:
        """40 pages, each record its own gzip member; one member in the middle is corrupted: its page
        is inside one lost-input row and the 39 others are read."""
        warc = Warc()
        for i in range(40):
            warc.page(i)
        data = bytearray(warc.bytes())
        at = warc.offsets()[17]
        data[at + 30:at + 90] = bytes(self.rng.randrange(256) for _ in range(60))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes(data))
        self.truth.web = {url: f"marker{i}" for i, (url, _) in enumerate(warc.members)}
        self.truth.web_lost = {warc.members[17][0]}
        self.truth.lost[str(path)] = ("corrupt_stream", None, 0)

    def txt_files(self) -> None:
        for i in range(40):
            path = self.root / "txt" / f"doc{i:02d}.txt"
            path.parent.mkdir(exist_ok=True)
            if i % 8 == 7:
                path.write_bytes(b"caf\xe9 latin-1 bytes")
                self.truth.bad[(str(path), None)] = "invalid_utf8"
                self.truth.bad_documents += 1
                continue
            text = self.good_text() + f" txt{i}"
            path.write_bytes((read._BOM if i % 3 == 0 else b"") + text.encode("utf-8"))
            self.truth.good[str(path)] = text


def _config(corpus: Path) -> dict:
    return {
        "input": {"paths": [str(corpus)], "part_size_mb": 1, "block_size_mb": 0.4,  # plain.jsonl: 4+ blocks
                  "max_record_mb": 1},
        "filter": {"length": {"min_chars": 10}, "boilerplate_lines": {"enabled": False}, **LENGTH_ONLY_FILTER},
        "dedup": {"minhash": {"enabled": False}},  # bounded runtime: MinHash sees only what read passed on
        "tokenizer": {"train": {"vocab_size": 600}},
        "pack": {"seq_length": 32},
        "shard": {"ranks": 2, "files_per_rank": 1},
        "train": {"enabled": False},
    }


def _rows(folder: Path, columns: list[str]) -> list[dict]:
    files = sorted(folder.glob("*.parquet")) if folder.is_dir() else []
    return [r for f in files for r in pq.read_table(f, columns=columns).to_pylist()]


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory, dask_client):
    root = tmp_path_factory.mktemp("fuzz")
    truth = Corpus(root / "corpus").build()
    cfg_path = root / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(_config(root / "corpus")), encoding="utf-8")
    address = dask_client.scheduler.address
    codes = {
        "run": cli_main(["run", str(cfg_path), "--out", str(root / "run"), "--scheduler", address]),
        "dedup": cli_main(["dedup", str(root / "corpus"), "--out", str(root / "dedup"), "--config", str(cfg_path),
                           "--scheduler", address, "--format", "jsonl", "--methods", "exact"]),  # MinHash: 12-20 s, no reading
    }
    return {"root": root, "truth": truth, "codes": codes}


def test_fuzz_corpus_holds_over_ten_thousand_bad_records_in_every_format(fuzzed):
    truth = fuzzed["truth"]
    assert len(truth.bad) >= 10_000 and truth.bad_documents >= 10_000
    kinds = {read.file_kind(f) for f, _ in truth.bad} | {read.file_kind(f) for f in truth.lost}
    assert kinds == {"jsonl", "jsonl.gz", "jsonl.zst", "parquet", "txt", "warc.gz"}
    assert "record_too_large" in truth.bad.values() and len(truth.web) == 40
    assert len(truth.good) > 2000


@pytest.mark.parametrize("job", ["run", "dedup"])
def test_fuzz_every_bad_record_is_quarantined_once_and_damaged_files_keep_their_head(fuzzed, job):
    out, truth = fuzzed["root"] / job, fuzzed["truth"]
    assert fuzzed["codes"][job] == 0
    text = (out / "00-read" / "quarantine.jsonl").read_text(encoding="utf-8")
    rows = [json.loads(line) for line in text.split("\n") if line]  # not splitlines(): U+2028 is text
    records = [r for r in rows if not r.get("lost_input")]
    lost = [r for r in rows if r.get("lost_input")]
    got = {(r["file"], r["line"]): r["code"] for r in records}
    assert len(got) == len(records)  # no record twice
    assert got == truth.bad
    assert {r["file"]: r["code"] for r in lost} == {f: v[0] for f, v in truth.lost.items()}
    docs = _rows(out / "00-read", ["id"])
    ids = [d["id"] for d in docs]
    for f, (_code, prefix, n) in truth.lost.items():
        row = next(r for r in lost if r["file"] == f)
        if prefix:  # a truncated stream: its first records are read, in order, up to the line named
            head = [i for i in ids if i.startswith(prefix) and i[len(prefix):].isdigit()]
            assert head == [f"{prefix}{k}" for k in range(len(head))] and 0 < len(head) < n
            assert row["after_line"] == len(head) and f"after line {len(head)}" in row["reason"]
        elif read.file_kind(f).startswith("warc"):  # one damaged member: one lost span, the pages after it read
            assert row["documents"] == 0 and 0 < row["lost_bytes"] < os.path.getsize(f)
        else:
            assert row["after_line"] == 0 and row["documents"] == 0


def _stage_outcomes(out: Path, job: str) -> tuple[list[str], list[str]]:
    """(ids kept by the last document stage, ids removed by any stage)."""
    stages = ["01-normalize", "02-filter", "03-exact_dedup", "04-near_dedup"] if job == "run" else \
        ["03-exact_dedup", "04-near_dedup"]
    if job == "dedup":  # its dedup steps only find: the export writes the kept documents (kept/, JSONL here)
        kept = [json.loads(line)["id"] for f in sorted((out / "kept").glob("*.jsonl"))
                for line in f.read_text(encoding="utf-8").split("\n") if line]
    else:
        last = [s for s in stages if (out / s).is_dir()][-1]
        kept = [r["id"] for r in _rows(out / last, ["id"])]
    removed = [r["id"] for s in stages for r in _rows(out / s / "removed", ["id"])]
    return kept, removed


@pytest.mark.parametrize("job", ["run", "dedup"])
def test_fuzz_every_good_record_ends_kept_filtered_or_duplicate_exactly_once(fuzzed, job):
    out, truth = fuzzed["root"] / job, fuzzed["truth"]
    assert fuzzed["codes"][job] == 0
    kept, removed = _stage_outcomes(out, job)
    outcomes = kept + removed
    seen = {i for i in outcomes if i in truth.good}
    assert seen == set(truth.good), sorted(set(truth.good) - seen)[:10]
    assert len([i for i in outcomes if i in truth.good]) == len(truth.good)  # exactly once
    damaged_heads = {v[1] for v in truth.lost.values() if v[1]}
    strays = [i for i in outcomes if i not in truth.good and i not in truth.web
              and not (i[:1] in damaged_heads and i[1:].isdigit())]
    assert not strays, strays[:10]  # no bad record became a document
    pages = [i for i in outcomes if i in truth.web]
    assert sorted(pages) == sorted(set(truth.web) - truth.web_lost)  # each page read past the damage, once
    read_docs = {r["id"]: r for r in _rows(out / "00-read", ["id", "text"])}
    assert all(read_docs[i]["text"] == truth.good[i] for i in truth.good)  # BOMs, NULs, odd Unicode kept as written
    assert all(truth.web[u] in read_docs[u]["text"] for u in pages)  # each page's own main text


@pytest.mark.parametrize("job", ["run", "dedup"])
def test_fuzz_ledger_balances_and_shows_lost_input_apart(fuzzed, job):
    out, truth = fuzzed["root"] / job, fuzzed["truth"]
    assert fuzzed["codes"][job] == 0
    ledger = json.loads((out / "ledger.json").read_text(encoding="utf-8"))
    assert ledger["balanced"]
    assert ledger["input"] == ledger["kept"] + ledger["filtered"] + ledger["duplicates"] + ledger["quarantined"]
    assert ledger["quarantined"] == truth.bad_documents
    assert ledger["lost_input"]["files"] == len(truth.lost) and ledger["lost_input"]["bytes"] > 0
    assert ledger["duplicates"] >= truth.duplicates
    report = (out / "report.md").read_text(encoding="utf-8") if (out / "report.md").exists() else ""
    assert not report or "Lost input" in report


# ---- a property test on single files: hypothesis picks the records ----------------------------------

_any_char = st.characters() | st.characters(categories=["Cs"])  # lone surrogates too
_any_text = st.text(_any_char, max_size=30)
_json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30), st.floats(allow_nan=True), _any_text,
                          st.sampled_from(["\ud800", "x\udfff", "\x00", "\ufeff"]))
_json_values = st.recursive(_json_scalars, lambda inner: st.lists(inner, max_size=3) |
                            st.dictionaries(st.text(_any_char, max_size=5), inner,
                                            max_size=3), max_leaves=8)
_records = st.one_of(
    st.fixed_dictionaries({"text": _any_text},
                          optional={"id": _json_values, "source": _json_values, "other": _json_values}),
    _json_values,
)


def _has_lone_surrogate(value) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


@settings(max_examples=150, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                                      HealthCheck.too_slow])
@given(records=st.lists(_records, min_size=1, max_size=8), ensure_ascii=st.booleans(),
       kind=st.sampled_from(["jsonl", "jsonl.gz", "jsonl.zst"]))
def test_any_json_line_is_a_document_or_one_quarantine_row(tmp_path_factory, records, ensure_ascii, kind):
    """Whatever JSON a line holds, reading never raises: it is a document (when it is an object with a
    string text and no lone surrogate) or exactly one quarantine row, and both are valid UTF-8."""
    folder = tmp_path_factory.mktemp("prop")
    data = b"".join(json.dumps(r, ensure_ascii=ensure_ascii).encode("utf-8", "surrogatepass") + b"\n" for r in records)
    path = folder / f"p.{kind}"
    path.write_bytes(gzip.compress(data) if kind == "jsonl.gz" else zstandard.ZstdCompressor().compress(data)
                     if kind == "jsonl.zst" else data)
    (folder / "out").mkdir()
    [unit], _ = read.plan_units([str(path)], 1 << 30, 1 << 30)
    result = read.read_unit(unit, read.ReadOptions(), str(folder / "out"))
    docs = [r for f in sorted((folder / "out").glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    lines = {d["uid"] for d in docs}
    quarantined = {q["uid"] for q in result["quarantine"]}
    assert not lines & quarantined and len(lines) + len(quarantined) == len(records)
    json.dumps(result["quarantine"], ensure_ascii=False).encode("utf-8")
    for uid, rec in enumerate(records, start=1):
        usable = isinstance(rec, dict) and isinstance(rec.get("text"), str) and not _has_lone_surrogate(rec)
        assert (uid in lines) == usable, (rec, result["quarantine"])
        if usable:
            assert next(d for d in docs if d["uid"] == uid)["text"] == rec["text"]
