"""The deploy files (Docker cannot build here): their commands parse, their pins match pyproject's, and the\ndeploy page's Docker commands (docs/deploy.md) name files, images, ports and routes that exist."""
from __future__ import annotations

import fnmatch
import re
import shlex
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

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
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    deps = project["dependencies"] + [d for e in ("service", "web", "report", "quality", "s3") for d in extras[e]]
    assert extras["all"] == ["corpusmill[service,web,report,quality,s3]"]  # the image serves: it installs them all
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
    from corpusmill.pipeline.cli import _build_parser

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


def _readme_docker_commands() -> list[list[str]]:
    """The shell lines of the deploy page's Docker section, split as the shell splits them (comments dropped)."""
    section = (ROOT / "docs" / "deploy.md").read_text().split("## Deploy with Docker", 1)[1].split("\n## ", 1)[0]
    section = re.split(r"\n#{2,3} ", section, maxsplit=1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]


def _readme_command(*prefix: str) -> list[str]:
    found = [argv for argv in _readme_docker_commands() if argv[: len(prefix)] == list(prefix)]
    assert len(found) == 1, f"the deploy page's Docker section should show one `{' '.join(prefix)}`"
    return found[0]


def _options(argv: list[str], with_value: set[str]) -> tuple[dict, list[str]]:
    """Docker-CLI style: flags in `with_value` take the next word; everything else is a switch or positional."""
    options, positional, words = {}, [], iter(argv)
    for word in words:
        if word in with_value:
            options[word] = next(words)
        elif word.startswith("-"):
            options[word] = True
        else:
            positional.append(word)
    return options, positional


def _sent_to_the_build(path: str, ignore_file: Path) -> bool:
    """Whether the .dockerignore lets `path` (relative to the build context) into the build: the last
    pattern matching the path or one of its parents decides, `!` re-admits."""
    admitted, parts = True, path.strip("/").split("/")
    for line in ignore_file.read_text().splitlines():
        pattern = line.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negated, pattern = pattern.startswith("!"), pattern.lstrip("!").rstrip("/")
        if any(fnmatch.fnmatchcase("/".join(parts[:i]), pattern) for i in range(1, len(parts) + 1)):
            admitted = negated
    return admitted


def _compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def test_readme_docker_build_builds_this_dockerfile_as_compose_image_from_a_context_holding_what_it_copies():
    options, positional = _options(_readme_command("docker", "build")[2:], {"-f", "-t"})
    context = (ROOT / positional[0]).resolve()  # the deploy page runs it from the repository root
    dockerfile = (ROOT / options["-f"]).resolve()
    assert dockerfile == (DOCKER / "Dockerfile").resolve()
    image = _compose()["x-image"]  # the image every compose service runs
    assert options["-t"] == image["image"]
    assert (DOCKER / image["build"]["context"]).resolve() == context
    assert (context / image["build"]["dockerfile"]).resolve() == dockerfile
    ignore_file = dockerfile.with_name(dockerfile.name + ".dockerignore")  # BuildKit's per-Dockerfile ignore file
    copies = [v.split() for k, v in _dockerfile_instructions() if k == "COPY"]
    assert copies
    for *sources, _ in copies:
        for source in (s for s in sources if not s.startswith("--")):
            assert (context / source).exists(), f"the Dockerfile copies {source}, which the context lacks"
            assert _sent_to_the_build(source, ignore_file), f"{ignore_file.name} keeps {source} out of the build"
    assert not _sent_to_the_build("docker/token", ignore_file) and not _sent_to_the_build("tests", ignore_file)


def test_readme_docker_compose_up_starts_this_compose_file_building_its_image():
    options, positional = _options(_readme_command("docker", "compose")[2:], {"-p", "-f"})
    assert (ROOT / options["-f"]).resolve() == (DOCKER / "compose.yaml").resolve()
    assert positional == ["up"] and options.get("--build") and options.get("-d")
    services = _compose()["services"]
    assert {s["image"] for s in services.values()} == {_compose()["x-image"]["image"]}
    assert all("build" in s for s in services.values())  # --build rebuilds what every service runs


def test_readme_token_and_request_reach_the_service_compose_publishes():
    from corpusmill.pipeline.cli import _build_parser
    from corpusmill.pipeline.service.app import ServiceContext, create_app

    make_token = next(argv for argv in _readme_docker_commands() if ">" in argv)
    token_path = make_token[make_token.index(">") + 1]
    assert make_token[:2] == ["python3", "-c"]
    token = subprocess.run([sys.executable, "-c", make_token[2]], capture_output=True, text=True, check=True).stdout
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}\n", token)  # 32 random bytes, URL-safe
    compose = _compose()
    assert (DOCKER / compose["secrets"]["corpusmill_token"]["file"]).resolve() == (ROOT / token_path).resolve()
    assert f"/{token_path}" in (ROOT / ".gitignore").read_text().splitlines()  # never committed

    curl = _readme_command("curl")
    assert curl[curl.index("-H") + 1] == f"Authorization: Bearer $(cat {token_path})"
    url = urlparse(curl[-1])
    service = compose["services"]["service"]
    port = _build_parser().parse_args(_serve_args(service["command"])).port
    assert f"{url.hostname}:{url.port}:{port}" in service["ports"]
    # the route exists on the service's own app (built, not served: only its route table is read)
    app = create_app(ServiceContext(store=None, roots=None, supervisor=None, token="unused", scheduler="",
                                    dashboard=None, max_queued=1))
    assert any(r.path == url.path and "GET" in r.methods for r in app.routes if hasattr(r, "methods")), url.path
