"""Meta tests: the registry, metadata, documentation, and generated docs are consistent."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

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


def test_every_rule_class_is_registered():
    defined = set()
    for mod in pkgutil.iter_modules(trainlint.rules.__path__):
        module = importlib.import_module(f"trainlint.rules.{mod.name}")
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, Rule) and obj is not Rule and obj.__module__ == module.__name__:
                defined.add(obj)
    assert defined == set(RULES)


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
