"""Meta tests: the registry, metadata, documentation, and generated docs are consistent."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import trainlint.rules
from trainlint.rules import builtin_rules
from trainlint.rules.base import Rule

RULES = builtin_rules()


def test_codes_and_names_unique():
    codes = [r.code for r in RULES]
    names = [r.name for r in RULES]
    assert len(codes) == len(set(codes))
    assert len(names) == len(set(names))


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
def test_metadata_and_docs(rule):
    assert rule.validate_metadata() == []
    assert re.fullmatch(r"TL\d{3}", rule.code)
    assert re.fullmatch(r"[a-z]+(-[a-z]+)*", rule.name), "names are kebab-case"
    assert rule.valid, f"{rule.code} has no valid examples"
    assert rule.invalid, f"{rule.code} has no invalid examples"
    if rule.fix_safety:
        assert any(ex.fixed is not None for ex in rule.invalid), "fixable rule needs fixed text"
    assert rule.message and not rule.message.endswith(".")


def _rule_classes_defined_in(module):
    return [
        obj
        for _, obj in inspect.getmembers(module, inspect.isclass)
        if issubclass(obj, Rule) and obj is not Rule and obj.__module__ == module.__name__
    ]


def test_every_rule_class_is_registered():
    """Walk the whole package independently of the registry: nothing defined is missed."""
    defined = set()
    for mod in pkgutil.walk_packages(trainlint.rules.__path__, "trainlint.rules."):
        defined.update(_rule_classes_defined_in(importlib.import_module(mod.name)))
    assert defined == set(RULES)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
def test_one_rule_per_module_named_after_it(rule):
    module = importlib.import_module(rule.__module__)
    family, _, stem = rule.__module__.removeprefix("trainlint.rules.").rpartition(".")
    assert family, f"{rule.code} lives in {rule.__module__}, not in rules/<family>/<rule>.py"
    assert stem == rule.name.replace("-", "_")
    assert _rule_classes_defined_in(module) == [rule]


RULES_DIR = Path(trainlint.rules.__file__).parent


@pytest.mark.parametrize(
    "path",
    sorted(p for p in RULES_DIR.rglob("*.py") if p.parent != RULES_DIR),
    ids=lambda p: p.relative_to(RULES_DIR).as_posix(),
)
def test_rule_modules_import_no_other_rule_module(path):
    """Rules share code through analysis/ (or their family's _shared.py), never each other.
    A rule whose examples outgrow its module keeps them in its own `_<rule>_examples.py`."""
    family = path.parent.name
    allowed = {
        "trainlint.rules.base",
        f"trainlint.rules.{family}._shared",
        f"trainlint.rules.{family}._{path.stem}_examples",
        "trainlint.rules",
    }
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.startswith("trainlint.rules")
        ):
            if path.name == "__init__.py" and node.module.startswith(f"trainlint.rules.{family}."):
                continue  # the family package re-exports its rules
            assert node.module in allowed, f"{path.name} imports {node.module}"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@pytest.mark.parametrize(
    "path",
    sorted(p for p in RULES_DIR.rglob("*.py") if p.parent != RULES_DIR),
    ids=lambda p: p.relative_to(RULES_DIR).as_posix(),
)
def test_rules_use_only_public_names_of_analysis(path):
    """A rule asks the shared model through its public names: no ``_private`` import from
    ``trainlint.analysis``, and no ``obj._private`` reach into an analysis object (a rule's
    own ``self._helper`` is its business)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "trainlint.analysis"
        ):
            assert not any(_private(part) for part in node.module.split(".")), node.module
            for alias in node.names:
                assert not _private(alias.name), f"{path.name} imports {alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("trainlint.analysis"):
                    assert not any(_private(p) for p in alias.name.split(".")), alias.name
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            root = node.value
            assert isinstance(root, ast.Name) and (
                root.id in ("self", "cls") or root.id[:1].isupper()
            ), f"{path.name}:{node.lineno} reaches `.{node.attr}`"


def test_rule_examples_cover_aliases_and_no_torch():
    """STYLE: examples include an aliased import and a file that never imports torch."""
    for rule in RULES:
        if rule.code in ("TL001", "TL002"):
            continue
        sources = [getattr(ex, "source", ex) for ex in [*rule.valid, *rule.invalid]]
        assert any("import torch" not in s and "from torch" not in s for s in sources), rule.code
        assert any(" as " in s or "from torch" in s for s in sources), rule.code


def test_generated_docs_are_current():
    from trainlint.docs import check_docs

    stale = check_docs()
    assert not stale, f"docs are stale, run `python -m trainlint.docs`: {stale}"


def test_rule_catalog_is_current():
    from trainlint.rules import _catalog

    text = Path(_catalog.__file__).read_text(encoding="utf-8")
    assert _catalog._split(text)[1] == _catalog.render(), (
        "the rule catalog is stale: run `python -m trainlint.rules._catalog --write`"
    )


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
def test_catalog_stand_in_answers_as_its_rule(rule):
    from trainlint.rules import CatalogRule, catalog_rules, real_rule
    from trainlint.rules._catalog import FIELDS

    listed = {r.code: r for r in catalog_rules()}[rule.code]
    assert issubclass(listed, CatalogRule) and real_rule(listed) is rule
    for attr in (*FIELDS, "origin", "__module__", "__qualname__", "__name__"):
        assert getattr(listed, attr) == getattr(rule, attr), attr
    assert listed.doc_sections() == rule.doc_sections()
    assert listed.documentation() == rule.documentation()
    assert listed.validate_metadata() == rule.validate_metadata()


def test_catalog_lists_the_rules_in_code_order():
    from trainlint.rules import catalog_rules

    assert [r.code for r in catalog_rules()] == [r.code for r in RULES]


SRC = Path(trainlint.__file__).resolve().parent


@pytest.mark.parametrize(
    "path",
    [p for p in sorted(SRC.rglob("*.py")) if "analysis" not in p.relative_to(SRC).parts],
    ids=lambda p: p.relative_to(SRC).as_posix(),
)
def test_modules_outside_analysis_stay_small(path):
    # a module past this size mixes concerns: split it (analysis/ holds the big queries)
    lines = path.read_text(encoding="utf-8").count("\n")
    assert lines <= 400, f"{path.relative_to(SRC)} has {lines} lines (at most 400)"
