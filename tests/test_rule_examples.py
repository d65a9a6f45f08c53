"""Every rule's embedded examples, as parametrized tests (ids like TL301-invalid-2)."""

from __future__ import annotations

import pytest

from trainlint.rule_testing import example_params, run_example
from trainlint.rules import builtin_rules


@pytest.mark.parametrize(("rule", "example"), example_params(builtin_rules()))
def test_example(rule, example):
    run_example(rule, example)
