"""Damaged shard sets: each kind of damage is named by `corpusmill shards verify` and refused by
`corpusmill train` in one line, before any training; an undamaged set verifies and trains.

One real shard set (a tiny pipeline run, 2 ranks) is built per module; every case damages a copy.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import pytest

from corpusmill.pipeline.cli import main
from corpusmill.pipeline.config import parse_config
from corpusmill.pipeline.runner import Pipeline
from tests.corpora import build_corpus, e2e_config

F0 = "rank-0000/corpus-r0000-f00.mindrecord"
F1 = "rank-0001/corpus-r0001-f00.mindrecord"


def _foreign_tokenizer() -> bytes:
    """A real SentencePiece model that is not the one the shards were tokenized with."""
    import io

    import sentencepiece as spm

    model = io.BytesIO()
    lines = [f"line {i} of some other text about rivers and stones {i * 7}" for i in range(300)]
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, vocab_size=100,
                                   minloglevel=2, hard_vocab_limit=False)
    return model.getvalue()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory, dask_client):
    root = tmp_path_factory.mktemp("damage")
    build_corpus(root / "corpus")
    cfg = parse_config(e2e_config(root / "corpus", shard={"ranks": 2, "files_per_rank": 1}))
    Pipeline(cfg, root / "out", client=dask_client, log=lambda m: None).run()
    (root / "train.yaml").write_text(cfg.to_yaml(), encoding="utf-8")
    (root / "foreign.model").write_bytes(_foreign_tokenizer())
    return root


# --- damage helpers: each takes the copied shard folder ---------------------------------------

def _manifest(d: Path) -> dict:
    return json.loads((d / "manifest.json").read_text())


def _edit(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def damage(d: Path) -> None:
        m = _manifest(d)
        change(m)
        (d / "manifest.json").write_text(json.dumps(m, indent=1))
    return damage


def _flip(rel: str, at: float) -> Callable[[Path], None]:
    def damage(d: Path) -> None:
        f = d / rel
        data = bytearray(f.read_bytes())
        data[int(len(data) * at)] ^= 0x5A
        f.write_bytes(bytes(data))
    return damage


def _swap(d: Path) -> None:
    a, b = d / F0, d / F1
    tmp = d / "swap.tmp"
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)


def _swap_and_forge(d: Path) -> None:
    """Files swapped and the manifest's checksums swapped with them: only the header/index pairing tells."""
    _swap(d)
    m = _manifest(d)
    m["files"][0]["sha256"], m["files"][1]["sha256"] = m["files"][1]["sha256"], m["files"][0]["sha256"]
    (d / "manifest.json").write_text(json.dumps(m, indent=1))


def _replace_tokenizer(forge_sha: bool) -> Callable[[Path], None]:
    def damage(d: Path) -> None:
        foreign = (d.parent.parent / "foreign.model").read_bytes()  # put there by _damaged
        (d / "tokenizer.model").write_bytes(foreign)
        if forge_sha:
            import hashlib

            _edit(lambda m: m["tokenizer"].update(sha256=hashlib.sha256(foreign).hexdigest()))(d)
    return damage


def _path_outside(absolute: bool) -> Callable[[Path], None]:
    """The entry points at an identical copy outside the folder: only the path check can tell."""
    def damage(d: Path) -> None:
        outside = d.parent / f"outside-{d.name}"
        outside.mkdir()
        for suffix in ("", ".db"):
            shutil.copyfile(d / (F0 + suffix), outside / ("corpus-r0000-f00.mindrecord" + suffix))
        target = str(outside / "corpus-r0000-f00.mindrecord") if absolute else f"../{outside.name}/corpus-r0000-f00.mindrecord"
        _edit(lambda m: m["files"][0].update(path=target))(d)
    return damage


def _symlink_out(d: Path) -> None:
    outside = d.parent / f"outside-{d.name}"
    outside.mkdir()
    shutil.move(str(d / F0), outside / "corpus-r0000-f00.mindrecord")
    (d / F0).symlink_to(outside / "corpus-r0000-f00.mindrecord")


def _truncate(d: Path) -> None:
    f = d / F0
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _all_lengths(m: dict) -> None:
    """seq_length 32 -> 16 everywhere the manifest says it, consistently: only the samples tell."""
    m.update(seq_length=16, sample_length=17)
    m["columns"]["input_ids"]["shape"] = [17]
    for e in m["files"]:
        e["tokens"] = e["samples"] * 17 - e["pad_tokens"]


def _row_counts(m: dict) -> None:
    """One sample fewer per file, with every total adjusted: only the files' own indexes tell."""
    for e in m["files"]:
        e["samples"] -= 1
        e["tokens"] -= m["sample_length"]
    m["samples_per_rank"] -= 1
    m["total_samples"] -= m["ranks"]


def _ranks_swapped(m: dict) -> None:
    m["files"][0]["rank"], m["files"][1]["rank"] = m["files"][1]["rank"], m["files"][0]["rank"]


def _manifest_out(d: Path) -> None:
    outside = d.parent / "manifest-elsewhere.json"
    shutil.move(str(d / "manifest.json"), outside)
    (d / "manifest.json").symlink_to(outside)


def _surrogate_path(d: Path) -> None:
    text = (d / "manifest.json").read_text()
    (d / "manifest.json").write_text(text.replace(F0, "rank-0000/\\udcff.mindrecord", 1))


def _write(text: str) -> Callable[[Path], None]:
    return lambda d: (d / "manifest.json").write_text(text)


# name: (damage, what `shards verify` says, what `train` says)
DAMAGE = {
    "tokenizer_replaced": (_replace_tokenizer(False), "tokenizer tokenizer.model: sha256 differs", None),
    "tokenizer_replaced_and_its_sha256_forged": (_replace_tokenizer(True), "pieces but the manifest says vocab_size 1500", None),
    "tokenizer_bit_flipped": (_flip("tokenizer.model", 0.5), "tokenizer tokenizer.model: sha256 differs", None),
    "tokenizer_deleted": (lambda d: (d / "tokenizer.model").unlink(), "tokenizer tokenizer.model: missing", None),
    "tokenizer_path_outside": (_edit(lambda m: m["tokenizer"].update(path="../tokenizer.model")),
                               "tokenizer.path \"../tokenizer.model\" climbs out of the folder", None),
    "manifest_tokenizer_sha256_edited": (_edit(lambda m: m["tokenizer"].update(sha256="0" * 64)),
                                         "differs from the manifest's tokenizer.sha256", None),
    "eos_id_edited": (_edit(lambda m: m["tokenizer"].update(eos_id=5)), "tokenizer.eos_id is 5 but the tokenizer's own eos", None),
    "pad_id_edited": (_edit(lambda m: m["tokenizer"].update(pad_id=7)), "tokenizer.pad_id is 7 but the tokenizer's own pad", None),
    "bos_id_edited": (_edit(lambda m: m["tokenizer"].update(bos_id=4)), "tokenizer.bos_id is 4 but the tokenizer's own bos", None),
    "vocab_size_edited": (_edit(lambda m: m.update(vocab_size=1400)), "vocab_size 1400 differs from tokenizer.vocab_size 1500", None),
    "vocab_size_edited_in_both_places": (_edit(lambda m: (m.update(vocab_size=1400), m["tokenizer"].update(vocab_size=1400))),
                                         "has 1500 pieces but the manifest says vocab_size 1400", None),
    "special_id_outside_vocabulary": (_edit(lambda m: m["tokenizer"].update(eos_id=99999)),
                                      "tokenizer.eos_id 99999 is outside the vocabulary", None),
    "seq_length_edited": (_edit(lambda m: m.update(seq_length=64)), "sample_length 33 is not seq_length 64 + 1", None),
    "seq_length_edited_consistently_everywhere": (_edit(_all_lengths), "samples of shape (33,) int32, expected (17,)",
                                                  "holds samples of 33 ids, the manifest says sample_length 17"),
    "ranks_edited": (_edit(lambda m: m.update(ranks=3)), "ranks 3 x files_per_rank 1 = 3 files, but the manifest lists 2", None),
    "ranks_edited_absurdly": (_edit(lambda m: m.update(ranks=10 ** 15)), "files, but the manifest lists 2", None),
    "two_files_ranks_swapped": (_edit(_ranks_swapped), f"{F0}: listed for rank 1 but its name says rank 0", None),
    "file_entry_absolute_path": (_path_outside(True), "is an absolute path", None),
    "file_entry_dotdot_path": (_path_outside(False), "climbs out of the folder with '..'", None),
    "mindrecord_symlinked_outside": (_symlink_out, f"{F0}: resolves to", None),
    "two_mindrecords_swapped_without_db": (_swap, f"{F0}: sha256 differs", None),
    "two_mindrecords_swapped_with_checksums_forged": (_swap_and_forge, f"{F0}: its MindRecord header names", None),
    "db_deleted": (lambda d: (d / (F1 + ".db")).unlink(), f"{F1}: missing corpus-r0001-f00.mindrecord.db", None),
    "db_bit_flipped": (_flip(F1 + ".db", 0.3), f"{F1}.db: sha256 differs", None),
    "data_byte_flipped": (_flip(F0, 0.999), f"{F0}: sha256 differs", None),
    "mindrecord_truncated": (_truncate, f"{F0}: sha256 differs from the manifest (file altered or truncated", None),
    "mindrecord_missing": (lambda d: (d / F0).unlink(), f"{F0}: missing corpus-r0000-f00.mindrecord", None),
    "extra_unlisted_mindrecord": (lambda d: shutil.copyfile(d / F1, d / "rank-0001" / "stray.mindrecord"),
                                  "stray.mindrecord: a MindRecord file the manifest does not list", None),
    "row_count_edited": (_edit(lambda m: m["files"][0].update(samples=250)),
                         "rank 0: its files list 250 samples, samples_per_rank says 252", None),
    "row_counts_edited_consistently": (_edit(_row_counts), f"{F0}: 252 samples in its index, manifest says 251", None),
    "manifest_not_json": (_write('{"format": "corpusmill-shards/1", "files": ['), "is not valid JSON", None),
    "manifest_nested_too_deep": (_write("[" * 200_000), "is not valid JSON", None),
    "manifest_not_an_object": (_write("[1, 2]"), "is list, not a JSON object", None),
    "manifest_missing_keys": (_edit(lambda m: (m.pop("ranks"), m.pop("sample_length"))),
                              "misses key(s) sample_length, ranks", None),
    "manifest_wrong_types": (_edit(lambda m: (m.update(ranks="2"), m["files"][0].update(samples=[252]))),
                             'manifest.ranks is "2", expected an integer', None),
    "manifest_symlinked_outside": (_manifest_out, "manifest.json resolves to", None),
    "column_spec_not_an_object": (_edit(lambda m: m["columns"].update(input_ids=5)),
                                  'columns."input_ids" is 5, expected an object', None),
    "column_shape_not_a_list": (_edit(lambda m: m["columns"]["input_ids"].update(shape="65")),
                                'columns."input_ids".shape is "65", expected a list of integers', None),
    "file_name_a_lone_surrogate": (_surrogate_path, "is not a valid file name", None),
    "manifest_deleted": (lambda d: (d / "manifest.json").unlink(), "does not exist: not a finished corpusmill shard", None),
    "format_tag_wrong": (_edit(lambda m: m.update(format="corpusmill-shards/9")), "written by a newer corpusmill", None),
    "format_tag_missing": (_edit(lambda m: m.pop("format")), "has no `format` tag", None),
    "files_list_empty": (_edit(lambda m: m.update(files=[])), "lists no files", None),
}


def _damaged(pristine: Path, tmp_path: Path, kind: str) -> Path:
    d = tmp_path / "sets" / "shards"
    shutil.copytree(pristine / "out" / "shards", d, symlinks=True)
    damage = DAMAGE[kind][0]
    if kind.startswith("tokenizer_replaced"):
        (tmp_path / "foreign.model").write_bytes((pristine / "foreign.model").read_bytes())
    damage(d)
    return d


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_damage_is_named_by_verify_and_refused_by_train_in_one_line(pristine, tmp_path, capsys, kind):
    d = _damaged(pristine, tmp_path, kind)
    _, says, train_says = DAMAGE[kind]

    assert main(["shards", "verify", str(d)]) == 1
    err = capsys.readouterr().err
    assert says in err, err
    assert "problem(s) in" in err and "Traceback" not in err

    code = main(["train", "--shards", str(d), "--config", str(pristine / "train.yaml"), "--steps", "1",
                 "--num-parallel-workers", "1", "--out", str(tmp_path / "train")])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("corpusmill: error: "), err
    assert (train_says or says) in lines[0], lines[0]
    assert not (tmp_path / "train" / "metrics.jsonl").exists()  # refused before the first step


def _train_args(pristine: Path, d: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--shards", str(d), "--config", str(pristine / "train.yaml"), "--steps", "2", "--batch-size", "4",
            "--num-parallel-workers", "1", "--out", str(out), *extra]


def test_an_undamaged_set_verifies_and_trains(pristine, tmp_path, capsys):
    d = pristine / "out" / "shards"
    assert main(["shards", "verify", str(d)]) == 0
    out = capsys.readouterr()
    assert "shards ok: 2 files, 504 samples, 2 ranks x 252 samples" in out.out and not out.err
    assert main(_train_args(pristine, d, tmp_path / "train")) == 0
    out = capsys.readouterr()
    assert "shards checked against the manifest: 2 files" in out.out
    assert len((tmp_path / "train" / "metrics.jsonl").read_text().splitlines()) == 2


def test_no_verify_trains_on_shards_whose_checksums_fail_but_lr_find_without_it_refuses(pristine, tmp_path, capsys):
    """--no-verify is for those who insist: a missing tokenizer does not stop training then."""
    d = _damaged(pristine, tmp_path, "tokenizer_deleted")
    assert main(["train", "lr-find", "--shards", str(d), "--num-parallel-workers", "1"]) == 2
    assert "tokenizer tokenizer.model: missing" in capsys.readouterr().err
    assert main(_train_args(pristine, d, tmp_path / "train", "--no-verify")) == 0
    assert "--no-verify: shard checksums" in capsys.readouterr().out
    assert len((tmp_path / "train" / "metrics.jsonl").read_text().splitlines()) == 2


def test_a_reader_crash_is_a_finding_naming_the_file_and_the_next_file_is_still_read(pristine, tmp_path):
    """Two .mindrecord files swapped without their .db crash MindSpore's reader (SIGSEGV): the read
    runs in a child process, the crash is reported against that file, and a new child goes on."""
    from corpusmill.stages.shard import read_rows_isolated

    d = _damaged(pristine, tmp_path, "two_mindrecords_swapped_without_db")
    good = pristine / "out" / "shards" / F1
    results = read_rows_isolated([("swapped", str(d / F0)), ("good", str(good))], window=33)
    assert "error" in results["swapped"] and "MindSpore's reader" in results["swapped"]["error"], results
    assert results["good"]["count"] == 252 and results["good"]["top"] < 1500


def test_a_global_layout_set_verifies_through_mindspores_own_split_and_a_flipped_byte_is_named(tmp_path, dask_client,
                                                                                               capsys):
    build_corpus(tmp_path / "corpus")
    cfg = parse_config(e2e_config(tmp_path / "corpus", shard={"ranks": 2, "files_per_rank": 2, "layout": "global"}))
    Pipeline(cfg, tmp_path / "out", client=dask_client, log=lambda m: None).run()
    d = tmp_path / "out" / "shards"
    assert main(["shards", "verify", str(d)]) == 0
    assert "shards ok: 4 files" in capsys.readouterr().out
    _flip("corpus.mindrecord1", 0.999)(d)
    assert main(["shards", "verify", str(d)]) == 1
    assert "corpus.mindrecord1: sha256 differs" in capsys.readouterr().err
