"""The documentation: the README stays a front page whose Quickstart is what CI runs, the config
reference is generated from the models, and the MkDocs site builds with --strict (no broken link
or anchor, no page left out of the navigation)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _quickstart_commands() -> list[str]:
    section = (ROOT / "README.md").read_text(encoding="utf-8").split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_readme_is_a_front_page_with_the_two_quickstart_commands_ci_runs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    demo, suite = _quickstart_commands()
    assert demo.endswith("corpusmill demo") and 'pip install -q -e ".[all]"' in demo  # the demo shows every part
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    install, test = suite.split(" && .venv/bin/python -m pytest", 1)[0], ".venv/bin/python -m pytest -q"
    assert suite.endswith(test) and test in ci
    assert 'pip install -q -e ".[test]"' in install and 'pip install -q -e ".[test]"' in ci


def test_readme_links_point_at_pages_that_exist():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    assert targets
    missing = [t for t in targets if not t.startswith("http") and not (ROOT / t).exists()]
    assert not missing


def test_config_reference_is_generated_from_the_models():
    done = subprocess.run([sys.executable, str(ROOT / "docs" / "gen_config_reference.py"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    page = (ROOT / "docs" / "reference" / "configuration.md").read_text(encoding="utf-8")
    from corpusmill.pipeline.config import Config

    for section, field in Config.model_fields.items():  # every key a user may write has its row
        if field.exclude:
            continue
        assert f"| `{section}" in page


def test_site_builds_strictly(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-f", str(ROOT / "mkdocs.yml"),
                           "--site-dir", str(tmp_path / "site")], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "reference" / "configuration" / "index.html").exists()
