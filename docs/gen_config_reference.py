"""Write docs/reference/configuration.md from the pydantic models of pipeline/config.py: every key,
its type, its default and its description, so the reference can never disagree with the code.

    .venv/bin/python docs/gen_config_reference.py          # rewrite the page
    .venv/bin/python docs/gen_config_reference.py --check  # exit 1 when the page is stale (tests/test_docs.py)
"""
from __future__ import annotations

import argparse
import sys
import typing
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from corpusmill.pipeline.config import Config

PAGE = Path(__file__).resolve().parent / "reference" / "configuration.md"

HEADER = """# Configuration reference

Every key of a corpusmill config, generated from `pipeline/config.py` by `docs/gen_config_reference.py`
(a test keeps the two in step). A config file only needs the keys it changes; `corpusmill config example`
prints all of them at their defaults as YAML, and [Configuration](../configuration.md) explains how a
file is read, validated and migrated. `KEY[]` is a list of the objects described below it.
"""


def _model_of(annotation: Any) -> tuple[Optional[type[BaseModel]], bool]:
    """(the model a field holds, whether it is a list of them)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (list, tuple):
        inner, _ = _model_of(args[0]) if args else (None, False)
        return inner, inner is not None
    for arg in args:  # Optional[Model], Union[...]
        inner, is_list = _model_of(arg)
        if inner is not None:
            return inner, is_list
    return None, False


def _type_name(annotation: Any) -> str:
    text = str(annotation).replace("typing.", "")
    for prefix in ("<class '", "'>"):
        text = text.replace(prefix, "")
    return text.replace("NoneType", "None").replace("|", "\\|")


_BOUNDS = (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤"), ("min_length", "length ≥"), ("max_length", "length ≤"))


def _bounds(field: Any) -> str:
    """The numeric and length bounds pydantic enforces, e.g. '> 0, ≤ 16384'."""
    found = []
    for item in field.metadata:
        for attr, sign in _BOUNDS:
            value = getattr(item, attr, None)
            if value is not None:
                found.append(f"{sign} {value}")
    return ", ".join(found)


def _default(field: Any) -> str:
    if field.default_factory is not None:
        try:
            value = field.default_factory()
        except TypeError:
            return "(computed)"
        if isinstance(value, BaseModel):
            return "(section)"
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    return f"`{value!r}`".replace("|", "\\|")


def _rows(model: type[BaseModel], prefix: str, sections: list[tuple[str, type[BaseModel]]]) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        if field.exclude:
            continue
        key = f"{prefix}{name}"
        inner, is_list = _model_of(field.annotation)
        desc = (field.description or "").replace("|", "\\|").replace("\n", " ")
        if inner is not None and not is_list and _default(field) == "(section)":
            sections.append((key, inner))
            rows.append(f"| `{key}` | section | | see [`{key}`](#{key.replace('.', '')}) |")
            continue
        if inner is not None:
            sections.append((f"{key}[]" if is_list else key, inner))
        bounds = _bounds(field)
        kind = (f"list of objects (`{key}[]` below)" if is_list else "object (below)") if inner is not None \
            else _type_name(field.annotation)
        kind += f" ({bounds})" if bounds else ""
        rows.append(f"| `{key}` | {kind} | {_default(field)} | {desc} |")
    return rows


def render() -> str:
    out = [HEADER]
    queue: list[tuple[str, type[BaseModel]]] = [("", Config)]
    while queue:
        prefix, model = queue.pop(0)
        found: list[tuple[str, type[BaseModel]]] = []
        rows = _rows(model, f"{prefix}." if prefix else "", found)
        out.append(f"## `{prefix}`" if prefix else "## Top level")
        doc = (model.__doc__ or "").strip()
        if prefix and doc and not doc.startswith(("A base class", "!!!")) and "BaseModel" not in doc:
            out.append(doc)
        out.append("")
        out.append("| key | type | default | meaning |")
        out.append("|---|---|---|---|")
        out.extend(rows)
        out.append("")
        queue.extend(found)
    return "\n".join(out).rstrip() + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the page differs from the models")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not PAGE.exists() or PAGE.read_text(encoding="utf-8") != text:
            print(f"{PAGE} is stale: run .venv/bin/python docs/gen_config_reference.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
