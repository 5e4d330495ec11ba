"""The input-format extension point (stages/read.py's registry): a new format is one module that
calls `register_format`, in-tree or from an installed package's entry point, and its records are
counted, sampled, bounded and quarantined like the built-in formats'."""
import json
import os
import subprocess
import sys
import textwrap

import pyarrow.parquet as pq
import pytest

from corpusmill.stages import read
from tests.conftest import write_jsonl

# the worked example of docs/contributing.md: tab-separated `id<TAB>text` lines
TOY_READER = '''
from corpusmill.stages.read import BadRecord, Record, records_format, register_format


def parse(data, path):
    for n, line in enumerate(data.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        if line == "RAISE":
            raise RuntimeError("the parser gave up")
        doc_id, tab, text = line.partition("\\t")
        if not tab:
            yield BadRecord(n, "no_tab", "expected id<TAB>text", line.encode())
            continue
        yield Record(n, text.replace("\\\\n", "\\n"), id=doc_id)


register_format(records_format("tsv", (".tsv",), parse))
'''


@pytest.fixture
def toy_format():
    namespace: dict = {}
    exec(compile(TOY_READER, "toy_tsv_reader", "exec"), namespace)  # what importing the module does
    yield
    for suffix in [s for s, f in read._FORMATS.items() if f.name == "tsv"]:
        del read._FORMATS[suffix]


def _read(paths, tmp_path, **opts):
    files = read.expand_inputs([str(p) for p in paths])
    units, _ = read.plan_units(files, 64 << 20, 32 << 20)
    out = tmp_path / "parts"
    out.mkdir()
    results = [read.read_unit(u, read.ReadOptions(**opts), str(out)) for u in units]
    docs = pq.read_table(str(out)).to_pylist() if any(out.glob("*.parquet")) else []
    return docs, [q for r in results for q in r["quarantine"]], [r["stats"] for r in results]


def test_a_registered_format_reads_beside_the_builtin_ones_and_every_record_is_accounted_for(tmp_path, toy_format):
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.tsv").write_text("d1\tfirst document\n\nno tab here\nd2\tsecond\\nline\n" + "d3\t" + "x" * 3000 + "\n")
    (src / "b.TSV").write_text("e1\tkept before the failure\nRAISE\ne2\tnever reached\n")
    write_jsonl(src / "c.jsonl", [{"text": "a json document"}])
    assert ".tsv" in read.suffixes() and read.file_kind(str(src / "b.TSV")) == "tsv"
    docs, quarantine, stats = _read([src], tmp_path, max_record_bytes=2000)
    by_id = {d["id"]: d for d in docs}
    assert by_id["d1"]["text"] == "first document" and by_id["d2"]["text"] == "second\nline"
    assert by_id["d1"]["source"] == "a" and by_id["e1"]["source"] == "b"
    assert set(by_id) == {"d1", "d2", "e1", str(src / "c.jsonl") + ":1"}
    codes = {(os.path.basename(q["file"]), q["line"], q["code"]) for q in quarantine}
    assert codes == {("a.tsv", 3, "no_tab"), ("a.tsv", 5, "record_too_large"), ("b.TSV", 2, "reader_error")}
    lost = next(q for q in quarantine if q["code"] == "reader_error")
    assert lost["lost_input"] and "RuntimeError: the parser gave up" in lost["reason"]
    docs_in = sum(s["docs_in"] for s in stats)
    assert docs_in == len(docs) + sum(s["quarantined"] for s in stats) == 6  # the lost rest is no document
    assert len({d["uid"] for d in docs}) == len(docs)


def test_a_format_cannot_take_a_suffix_another_reads():
    with pytest.raises(ValueError, match="already read by jsonl"):
        read.register_format(read.records_format("other", (".jsonl",), lambda data, path: iter(())))
    with pytest.raises(ValueError, match="must start with"):
        read.register_format(read.InputFormat("bad", ("tsv",), lambda *a: None))


@pytest.mark.slow
def test_an_installed_packages_entry_point_adds_a_format_to_a_dedup_job(tmp_path):
    """A package that is not part of corpusmill, installed beside it (here: on PYTHONPATH, with its
    dist-info): the job's processes find its entry point and read its files."""
    site = tmp_path / "site"
    (site / "toy_tsv-0.1.dist-info").mkdir(parents=True)
    (site / "toy_tsv.py").write_text(textwrap.dedent(TOY_READER))
    (site / "toy_tsv-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-tsv\nVersion: 0.1\n")
    (site / "toy_tsv-0.1.dist-info" / "entry_points.txt").write_text("[corpusmill.input_formats]\ntsv = toy_tsv\n")
    data = tmp_path / "in"
    data.mkdir()
    body = "the same page of text, long enough to count as a document for dedup"
    (data / "pages.tsv").write_text(f"p1\t{body}\np2\t{body}\np3\tanother page entirely, about something else\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "corpusmill.pipeline.cli", "dedup", str(data), "--out", str(out),
                           "--methods", "exact", "--format", "jsonl"], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    kept = [json.loads(line) for f in sorted((out / "kept").glob("*.jsonl")) for line in open(f)]
    assert sorted(d["id"] for d in kept) == ["p1", "p3"]
