"""Built-in rules: one package per family, one module per rule (``rules/<family>/<rule>.py``).

:func:`builtin_rules` finds them by scanning this package, so adding a rule is adding a
module. A rule module imports from ``analysis/``, ``rules.base`` and its family's
``_shared.py``, never from another rule module.

:func:`catalog_rules` gives the same rules without importing their modules: stand-ins
made from ``rules/_catalog.py`` (the rules' metadata, generated from the classes), each
importing its rule the first time it checks a file. ``trainlint check`` selects and
runs those, so a file imports only the rules its trigger words call for.
"""

from __future__ import annotations

import copyreg
import importlib
from collections.abc import Iterable
from functools import cache
from typing import TYPE_CHECKING, Any, cast

from trainlint.rules.base import Invalid, Report, Rule, Valid

if TYPE_CHECKING:
    from trainlint.analysis.model import FileModel

__all__ = [
    "CatalogRule",
    "Invalid",
    "Report",
    "Rule",
    "Valid",
    "builtin_rules",
    "catalog_rules",
    "family_rule",
    "real_rule",
    "rule_modules",
]


def rule_modules() -> list[str]:
    """Dotted names of the modules that define built-in rules (one rule each)."""
    import pkgutil

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
    """The built-in rule classes, every rule module imported."""
    return list(_scan())


class _Listed(type):
    """The type of the catalog's stand-ins: shown as what they stand for, and pickled by
    code (a worker process finds its own stand-in for the same rule)."""

    def __repr__(cls) -> str:
        return f"<catalog rule {cls.__module__}.{cls.__qualname__}>"


class CatalogRule(Rule, metaclass=_Listed):
    """A built-in rule as the catalog lists it: the rule's metadata, under the rule's own
    module and class name, without its module imported. An instance imports and makes
    the rule itself (with the same options) the first time it checks a file; the rule's
    documentation is the rule's own."""

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        self._given = options
        self._rule: Rule | None = None

    @classmethod
    def load(cls) -> type[Rule]:
        """The rule class this stands for (its module imported now, if not yet)."""
        rule: type[Rule] = getattr(importlib.import_module(cls.__module__), cls.__qualname__)
        return rule

    def check(self, model: FileModel) -> Iterable[Report]:
        if self._rule is None:
            self._rule = self.load()(self._given)
        return self._rule.check(model)

    @classmethod
    def doc_sections(cls) -> dict[str, str]:
        return cls.load().doc_sections()

    @classmethod
    def documentation(cls) -> str:
        return cls.load().documentation()

    @classmethod
    def validate_metadata(cls) -> list[str]:
        return cls.load().validate_metadata()


@cache
def _stand_ins() -> dict[str, type[Rule]]:
    from trainlint.rules._catalog import RULES

    listed = {}
    for entry in RULES:
        attrs = {k: v for k, v in entry.items() if k not in ("module", "class")}
        attrs.update(__module__=entry["module"], __qualname__=entry["class"], __doc__=None)
        listed[entry["code"]] = cast("type[Rule]", _Listed(entry["class"], (CatalogRule,), attrs))
    return listed


def catalog_rules() -> list[type[Rule]]:
    """The built-in rules as the catalog lists them (stand-ins; see :class:`CatalogRule`),
    in code order, no rule module imported."""
    return list(_stand_ins().values())


def _catalog_rule(code: str) -> type[Rule]:
    return _stand_ins()[code]


def _pickled(cls: Any) -> Any:
    return _catalog_rule, (cls.code,)


copyreg.pickle(_Listed, _pickled)


def family_rule(family: str, name: str) -> type[Rule]:
    """The rule class ``name`` of the family package ``family``, its module imported now:
    what a family package's ``__getattr__`` answers (``from trainlint.rules.memory import
    RetainGraphInLoop`` imports that rule's module alone)."""
    from trainlint.rules._catalog import RULES

    for entry in RULES:
        if entry["class"] == name and entry["module"].rpartition(".")[0] == family:
            rule: type[Rule] = getattr(importlib.import_module(entry["module"]), name)
            return rule
    raise AttributeError(f"module {family!r} has no attribute {name!r}")


def real_rule(rule: type[Rule]) -> type[Rule]:
    """The rule class itself: a stand-in's rule, any other rule class as it is."""
    return rule.load() if issubclass(rule, CatalogRule) else rule
