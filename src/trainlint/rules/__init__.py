"""Built-in rules: one package per family, one module per rule (``rules/<family>/<rule>.py``).

:func:`builtin_rules` finds them by scanning this package, so adding a rule is adding a
module. A rule module imports from ``analysis/``, ``rules.base`` and its family's
``_shared.py``, never from another rule module.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from trainlint.rules.base import Invalid, Report, Rule, Valid

__all__ = ["Invalid", "Report", "Rule", "Valid", "builtin_rules", "rule_modules"]


def rule_modules() -> list[str]:
    """Dotted names of the modules that define built-in rules (one rule each)."""
    names = []
    for family in pkgutil.iter_modules(__path__):
        if not family.ispkg:
            continue
        package = importlib.import_module(f"{__name__}.{family.name}")
        for mod in pkgutil.iter_modules(package.__path__):
            if not mod.name.startswith("_"):
                names.append(f"{package.__name__}.{mod.name}")
    return sorted(names)


@cache
def _scan() -> tuple[type[Rule], ...]:
    rules: list[type[Rule]] = []
    for name in rule_modules():
        module = importlib.import_module(name)
        rules.extend(
            obj
            for obj in vars(module).values()
            if isinstance(obj, type)
            and issubclass(obj, Rule)
            and obj is not Rule
            and obj.__module__ == name
        )
    return tuple(sorted(rules, key=lambda r: r.code))


def builtin_rules() -> list[type[Rule]]:
    return list(_scan())
