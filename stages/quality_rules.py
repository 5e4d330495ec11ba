"""The quality-rule extension point: a rule family added by one module, without touching the filter.

A `QualityRule` brings its own score columns (computed from the texts, vectorised per chunk, stored
with the built-in scores, so a changed threshold on --resume reuses them), the rules over them (the
tuples `quality.rule_table` gives: reason, column, 'min' | 'max', threshold, applies_to 'all' | 'zh' |
'non_zh'), the meaning of each reason for the report, and a pydantic model of its settings. It is off
until a config names it under `filter.rules` (`{NAME: {setting: value}}`, `{}` for the defaults); its
rules are tried after the built-in ones. A package of its own registers through the
`corpusmill.quality_rules` entry point. Light on purpose: the config validates against it before Dask
or the compiled loops are imported."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

ENTRY_POINT_GROUP = "corpusmill.quality_rules"
# the families that ship with corpusmill as modules of this folder: a new one adds its module name here
IN_TREE: tuple[str, ...] = ()


@dataclass(frozen=True)
class QualityRule:
    name: str  # the key under filter.rules
    settings: type  # a pydantic model (extra="forbid" recommended); filter.rules.NAME is validated by it
    score: Callable[[Any], dict[str, np.ndarray]]  # pyarrow string array -> {column: one value per text}
    rules: Callable[[Any], list[tuple]]  # the validated settings -> rule tuples over its columns
    reasons: dict[str, str]  # reason code -> what it means (the report)
    version: int = 1  # bump when a score's definition changes: stored scores are then recomputed


_RULES: dict[str, QualityRule] = {}
_plugins_loaded = False


def register_rule(rule: QualityRule) -> QualityRule:
    """Make `rule` available to filter.rules (its module calls this on import)."""
    taken = _RULES.get(rule.name)
    if taken is not None and taken is not rule:
        raise ValueError(f"quality rule {rule.name} is registered twice")
    _RULES[rule.name] = rule
    return rule


def registered() -> dict[str, QualityRule]:
    """name -> QualityRule, every installed package's entry points loaded once per process."""
    global _plugins_loaded
    if not _plugins_loaded:
        _plugins_loaded = True
        import importlib
        from importlib.metadata import entry_points

        for module in IN_TREE:
            importlib.import_module(f"{__package__}.{module}")
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            try:
                ep.load()
            except Exception as e:  # noqa: BLE001 - a broken plugin ends in one line naming it
                raise ValueError(f"quality rule plugin {ep.name} ({ep.value}) cannot be loaded: "
                                 f"{type(e).__name__}: {e}") from None
    return dict(_RULES)


def get(name: str) -> QualityRule:
    rules = registered()
    if name not in rules:
        known = ", ".join(sorted(rules)) or "none is installed"
        raise ValueError(f"filter.rules: no quality rule named {name!r} (registered: {known})")
    return rules[name]


def validate(configured: dict[str, Any]) -> dict[str, dict]:
    """filter.rules checked against the registry: each name known, its settings valid (and completed
    with the defaults), as plain dicts the config hash and the workers take."""
    out = {}
    for name, settings in configured.items():
        rule = get(name)
        try:
            out[name] = rule.settings.model_validate(settings or {}).model_dump(mode="json")
        except Exception as e:  # pydantic's ValidationError, said in one line under the rule's name
            raise ValueError(f"filter.rules.{name}: {e}") from None
    return out


def rule_tuples(configured: dict[str, dict]) -> list[tuple]:
    """The rule tuples of every configured rule family, in the order the config names them."""
    rules: list[tuple] = []
    for name, settings in configured.items():
        rule = get(name)
        rules += rule.rules(rule.settings.model_validate(settings))
    return rules


def scores(texts: Any, names: list[str]) -> dict[str, np.ndarray]:
    """The score columns of the named rule families for these texts."""
    out: dict[str, np.ndarray] = {}
    for name in names:
        for column, values in get(name).score(texts).items():
            values = np.asarray(values)
            if len(values) != len(texts):
                raise ValueError(f"quality rule {name}: column {column} has {len(values)} values for {len(texts)} texts")
            out[column] = values
    return out


def versions(names: list[str]) -> list[list]:
    """[name, version] of each named family: what their stored scores depend on."""
    return [[n, get(n).version] for n in names]
