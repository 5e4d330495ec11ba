"""The house's import contract, read from the source (an import-linter in one file):

- kernels (`stages/`) import neither Dask nor `pipeline/`: they work on one partition and are
  mapped over partitions by the steps;
- `trainer/` does not import `pipeline/`: training runs on shards alone;
- no import cycles between corpusmill's modules, lazy (inside a function) ones included: a cycle
  hidden behind a function-level import is still a cycle a newcomer has to untangle.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("stages", "pipeline", "trainer")


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            parts = f.relative_to(ROOT).with_suffix("").parts
            name = "corpusmill." + ".".join(parts)
            mods[name.removesuffix(".__init__")] = f
    return mods


def _imports(name: str, path: Path) -> list[str]:
    """Every module name an import statement of `path` names (absolute, relative ones resolved)."""
    out = []
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + is_pkg]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out += [target] + [f"{target}.{a.name}" for a in node.names]
    return out


MODULES = _modules()
IMPORTS = {m: _imports(m, p) for m, p in MODULES.items()}


def _violations(prefix: str, forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    bad = {}
    for m, names in IMPORTS.items():
        if m.startswith(prefix):
            hits = sorted({n for n in names if n.split(".")[0] in forbidden or n.startswith(forbidden)})
            if hits:
                bad[m] = hits
    return bad


def test_kernels_import_neither_dask_nor_the_pipeline():
    assert _violations("corpusmill.stages", ("dask", "distributed", "corpusmill.pipeline")) == {}


def test_the_trainer_does_not_import_the_pipeline():
    assert _violations("corpusmill.trainer", ("corpusmill.pipeline",)) == {}


def test_no_import_cycles_between_modules():
    edges = {m: sorted({n for n in names if n in MODULES and n != m}) for m, names in IMPORTS.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for m in sorted(edges):
        if m not in index:
            visit(m)
    assert cycles == []


def test_the_contract_sees_the_imports_it_checks():
    """The scan is not vacuous: it finds the modules and resolves relative imports."""
    assert len(MODULES) > 50
    assert "corpusmill.stages.base" in IMPORTS["corpusmill.stages.read"]
    assert any(n.startswith("dask") for n in IMPORTS["corpusmill.pipeline.engine"])
