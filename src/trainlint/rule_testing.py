"""The example harness: turns a rule's ``valid``/``invalid`` examples into tests.

Public so third-party rule packs test themselves exactly like built-in rules::

    from trainlint.rule_testing import example_params, run_example

    @pytest.mark.parametrize("rule, example", example_params([MyRule]))
    def test_examples(rule, example):
        run_example(rule, example)
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Sequence
from typing import Any

from trainlint.config import RuleSelection
from trainlint.engine import Linter
from trainlint.findings import Finding
from trainlint.rules.base import Invalid, Rule, Valid


def _dedent(source: str) -> str:
    source = textwrap.dedent(source)
    return source[1:] if source.startswith("\n") else source


def lint_example(
    rule: type[Rule],
    source: str,
    *,
    options: dict[str, Any] | None = None,
    path: str = "example.py",
    dedent: bool = True,
) -> list[Finding]:
    """Lint ``source`` with ``rule`` plus every default built-in rule; return ``rule``'s findings.

    Other rules run too, so interactions (suppressions, TL002) behave as in a real run.
    """
    from trainlint.rules import builtin_rules

    rules = [r for r in builtin_rules() if r.default_enabled and r.code != rule.code] + [rule]
    selection = RuleSelection(rules, {rule.code: dict(options or {})})
    text = _dedent(source) if dedent else source
    result = Linter(selection).lint_bytes(text.encode("utf-8"), path)
    if result.errors:
        raise AssertionError("internal error: " + "; ".join(str(e) for e in result.errors))
    return [f for f in result.findings if f.code == rule.code]


def fix_example(rule: type[Rule], source: str, findings: Sequence[Finding]) -> str:
    from trainlint.fix import apply_edits, selected_edits

    # Restructuring intents are carried out too (that needs libcst, as `--fix` does).
    return apply_edits(source, selected_edits(list(findings), True, source))[0]


def _normalise(example: str | Valid | Invalid) -> Valid | Invalid:
    return Valid(example) if isinstance(example, str) else example


def example_params(rules: Iterable[type[Rule]]) -> list[Any]:
    """``pytest.param(rule, example, id="TL301-invalid-2")`` for every example of every rule."""
    import pytest

    params = []
    for rule in rules:
        for i, ex in enumerate(rule.valid, 1):
            params.append(pytest.param(rule, _normalise(ex), id=f"{rule.code}-valid-{i}"))
        for i, bad in enumerate(rule.invalid, 1):
            params.append(pytest.param(rule, bad, id=f"{rule.code}-invalid-{i}"))
    return params


def _describe(findings: Sequence[Finding]) -> str:
    return "\n".join(f"  {f.line}:{f.column} {f.code} {f.message}" for f in findings) or "  (none)"


def run_example(rule: type[Rule], example: str | Valid | Invalid) -> None:
    """Assert one example behaves as declared; fixed text is checked for fixable rules."""
    example = _normalise(example)
    source = _dedent(example.source)
    findings = lint_example(rule, source, options=example.options, path=example.path, dedent=False)
    if isinstance(example, Valid):
        if findings:
            raise AssertionError(
                f"{rule.code}: valid example produced findings:\n{_describe(findings)}\n"
                f"--- source ---\n{source}"
            )
        return
    expected = sorted(example.expected_lines())
    got = sorted(f.line for f in findings)
    if got != expected:
        raise AssertionError(
            f"{rule.code}: expected findings on lines {expected}, got:\n{_describe(findings)}\n"
            f"--- source ---\n{source}"
        )
    if example.column is not None and findings[0].column != example.column:
        raise AssertionError(
            f"{rule.code}: expected column {example.column}, got {findings[0].column}"
        )
    if example.fixed is not None:
        fixed = fix_example(rule, source, findings)
        want = _dedent(example.fixed)
        if fixed != want:
            raise AssertionError(
                f"{rule.code}: fixed text differs\n--- got ---\n{fixed}\n--- want ---\n{want}"
            )
        again = lint_example(rule, fixed, options=example.options, path=example.path, dedent=False)
        if fix_example(rule, fixed, again) != fixed:
            raise AssertionError(f"{rule.code}: a second fix changes the text again")
    elif rule.fix_safety is not None and any(f.fix for f in findings):
        raise AssertionError(
            f"{rule.code}: example yields a fix but declares no `fixed` text to check it"
        )


def check_rule(rule: type[Rule]) -> None:
    """Run every example of one rule and its metadata checks (for quick use in a test)."""
    problems = rule.validate_metadata()
    if problems:
        raise AssertionError("\n".join(problems))
    if not rule.valid or not rule.invalid:
        raise AssertionError(f"{rule.code}: needs both valid and invalid examples")
    for ex in [*rule.valid, *rule.invalid]:
        run_example(rule, ex)
