"""The deploy files (Docker cannot build here): their commands parse, their pins match pyproject's."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
BIN = Path(sys.executable).parent


def _dockerfile_instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n\s*", " ", (DOCKER / "Dockerfile").read_text())
    return [(m.group(1).upper(), m.group(2).strip()) for m in re.finditer(r"^([A-Za-z]+)\s+(.*)$", text, re.M)]


def test_lock_file_satisfies_every_pin_in_pyproject():
    pins = {ln.split("==")[0].lower().replace("_", "-"): ln.split("==")[1].strip()
            for ln in (DOCKER / "requirements.lock").read_text().splitlines() if "==" in ln and not ln.startswith("#")}
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for dep in deps:
        req = Requirement(dep)
        name = req.name.lower().replace("_", "-")
        assert name in pins, f"{name} is a dependency but not in docker/requirements.lock"
        assert req.specifier.contains(pins[name], prereleases=True), f"lock has {name}=={pins[name]}, pyproject wants {req}"
        for extra in req.extras:  # dask[dataframe,distributed]
            if extra == "distributed":
                assert "distributed" in pins
    assert "corpusmill" not in pins and "pytest" not in pins


def test_dockerfile_is_pinned_non_root_and_checks_health():
    instructions = _dockerfile_instructions()
    base = [v for k, v in instructions if k == "FROM"]
    assert len(base) == 1 and re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+", base[0])
    user = [v for k, v in instructions if k == "USER"][-1]
    assert re.fullmatch(r"[1-9]\d{3,}:[1-9]\d{3,}", user), user  # numeric, not root
    health = [v for k, v in instructions if k == "HEALTHCHECK"]
    assert health and "/v1/health" in health[0] and "8787" in health[0]
    runs = " ".join(v for k, v in instructions if k == "RUN")
    assert "-r requirements.lock" in runs and "--no-deps" in runs
    apt = re.search(r"apt-get install (.*?)&&", runs).group(1)
    assert all("=" in pkg for pkg in apt.split() if not pkg.startswith("-")), "apt packages must be pinned"


def _serve_args(argv: list[str]) -> list[str]:
    assert argv[:2] == ["corpusmill", "serve"], argv
    return argv[1:]


def test_the_service_commands_of_image_and_compose_parse_and_keep_the_token_off_the_command_line():
    from pipeline.cli import _build_parser

    cmd = [v for k, v in _dockerfile_instructions() if k == "CMD"][-1]
    image_cmd = yaml.safe_load(cmd)  # exec form: a JSON list
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    commands = [image_cmd, services["service"]["command"]]
    for argv in commands:
        args = _build_parser().parse_args(_serve_args(argv))
        assert args.host == "0.0.0.0" and args.token_file == "/run/secrets/corpusmill_token"
        assert args.data_root == ["/data"] and args.state == "/state"
    assert _build_parser().parse_args(_serve_args(services["service"]["command"])).scheduler == "tcp://scheduler:8786"
    assert "corpusmill_token" in services["service"]["secrets"] and "CORPUSMILL_TOKEN" not in str(services)
    # the service and both workers see the same data volume at the same path
    workers = [s for name, s in services.items() if name.startswith("worker")]
    assert len(workers) == 2
    for s in [services["service"], *workers]:
        assert "data:/data" in s["volumes"]
    assert all(s["command"][:2] == ["dask", "worker"] and s["command"][2] == "tcp://scheduler:8786" for s in workers)
    # ports published on the host's loopback only
    assert all(p.startswith("127.0.0.1:") for s in services.values() for p in s.get("ports", []))


def test_the_dask_commands_of_compose_use_flags_this_dask_has():
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    for name, service in compose["services"].items():
        argv = service["command"]
        if argv[0] != "dask":
            continue
        help_text = subprocess.run([str(BIN / "dask"), argv[1], "--help"], capture_output=True, text=True,
                                   timeout=120).stdout
        for flag in (a for a in argv if a.startswith("--")):
            assert flag in help_text, f"{name}: `dask {argv[1]}` has no {flag}"


def test_readme_shows_the_compose_commands_that_exist():
    readme = (ROOT / "README.md").read_text()
    assert "docker compose -p corpusmill -f docker/compose.yaml up -d --build" in readme
    assert "docker build -f docker/Dockerfile" in readme
