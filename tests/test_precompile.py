"""precompile() reaches every cached numba loop of `stages` (a loop it misses compiles again in each
Dask worker of a fresh install), and the image compiles them where its user's workers find them."""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _cached_loops() -> set[str]:
    """module.function of every `@nb.njit(cache=True, ...)` in stages/."""
    found = set()
    for f in (ROOT / "stages").glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef):
                for d in node.decorator_list:
                    if isinstance(d, ast.Call) and any(k.arg == "cache" and getattr(k.value, "value", False) for k in d.keywords):
                        found.add(f"{f.stem}.{node.name}")
    return found


@pytest.mark.slow
def test_precompile_compiles_every_cached_loop(tmp_path):
    """From an empty cache (a fresh install): afterwards each cached loop has its index file. In a
    fresh clone the session's own precompile (conftest.py) was that run; elsewhere one is made here,
    into an empty cache of its own."""
    listing = os.environ.get("CORPUSMILL_TEST_COLD_PRECOMPILE")
    if listing:
        names = Path(listing).read_text().split()
    else:
        cache = tmp_path / "numba"
        proc = subprocess.run([sys.executable, "-c", "from corpusmill.stages.precompile import precompile; precompile()"],
                              env={**os.environ, "NUMBA_CACHE_DIR": str(cache)}, capture_output=True, text=True,
                              timeout=900)
        assert proc.returncode == 0, proc.stderr[-2000:]
        names = [p.name for p in cache.rglob("*.nbi")]
    compiled = {re.sub(r"-\d+\.py\d+\.nbi$", "", n) for n in names}
    loops = _cached_loops()
    assert len(loops) >= 30 and loops - compiled == set(), sorted(loops - compiled)


def test_the_image_precompiles_into_a_cache_its_user_owns():
    text = re.sub(r"\\\n\s*", " ", (ROOT / "docker" / "Dockerfile").read_text())
    env = re.search(r"^ENV NUMBA_CACHE_DIR=(\S+)", text, re.M)
    assert env, "the image sets NUMBA_CACHE_DIR"
    run = next(line for line in text.splitlines() if "precompile()" in line)
    assert run.startswith("RUN ") and f"chown -R corpusmill:corpusmill {env.group(1)}" in run
    assert text.index(run) < text.index("\nUSER ")  # compiled at build time, before the unprivileged user
