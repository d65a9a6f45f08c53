"""Which static rules a failing runtime check confirms, derived from ``Rule.confirm_with``.

``Rule.confirm_with`` is the one place that links a rule to the check that confirms it.
Everything here is read from it: the codes a check may put in ``CheckFailed.rules``
(:func:`rules_confirmed_by`), and the name and message a failure prints for each code
(:func:`rule_info`).

A check's diagnosis adds what the registry cannot know: which symptom it saw, and which
rules explain that symptom, most likely first (the ``SYMPTOMS`` table of each check's
module). :func:`explain` keeps, in that order, the rules that name the check; the others
are printed as "see also" and never confirmed by this check.

No torch here. The rules' catalog is pure Python and imported only when first needed,
normally when a check fails; no rule module is imported.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class RuleInfo:
    """What a failure message says of a rule: its code, name and message, from its class."""

    code: str
    name: str
    message: str
    confirm_with: str | None


@dataclass(frozen=True)
class Symptom:
    """One thing a check can observe, and the static rules behind it.

    ``explained_by``: the rules that can cause the symptom, most likely first. Those whose
    ``confirm_with`` is the observing check go into ``CheckFailed.rules``; the others are
    shown as "see also" (another check confirms them). ``see_also``: related rules that do
    not cause the symptom (shown, never confirmed). ``text``: the paragraph that explains
    the symptom in the failure message (empty: none).
    """

    explained_by: tuple[str, ...] = ()
    see_also: tuple[str, ...] = ()
    text: str = ""


@dataclass(frozen=True)
class Explanation:
    """The rules a failure names: ``rules`` it confirms, ``see_also`` it only mentions."""

    rules: tuple[str, ...] = ()
    see_also: tuple[str, ...] = ()


@functools.cache
def _registry() -> dict[str, RuleInfo]:
    # the catalog's stand-ins carry each rule's code, name, message and confirm_with
    # (the test suite keeps the catalog in step with the classes): no rule module imported
    from trainlint.rules import catalog_rules

    return {r.code: RuleInfo(r.code, r.name, r.message, r.confirm_with) for r in catalog_rules()}


def rule_info(code: str) -> RuleInfo | None:
    """The rule with this code, or None when no built-in rule has it."""
    return _registry().get(code)


def rules_confirmed_by(check: str) -> tuple[str, ...]:
    """The codes of the rules whose ``confirm_with`` is ``check``, in code order."""
    return tuple(sorted(c for c, info in _registry().items() if info.confirm_with == check))


def symptoms_of(check: str) -> Mapping[str, Symptom]:
    """The symptom table of the public check named ``check`` (KeyError if there is none)."""
    import trainlint.testing as testing

    function = getattr(testing, check, None) if check in testing.__all__ else None
    if not inspect.isfunction(function):
        raise KeyError(f"trainlint.testing has no check named {check!r}")
    module = importlib.import_module(function.__module__)
    table: Mapping[str, Symptom] = module.SYMPTOMS
    return table


def explain(check: str, symptoms: Iterable[Symptom]) -> Explanation:
    """The rules a failure of ``check`` names, given the symptoms its diagnosis found."""
    symptoms = list(symptoms)
    ordered = list(dict.fromkeys(c for s in symptoms for c in s.explained_by))
    confirmed = set(rules_confirmed_by(check))
    rules = tuple(c for c in ordered if c in confirmed)
    related = dict.fromkeys([*ordered, *(c for s in symptoms for c in s.see_also)])
    see_also = tuple(c for c in related if c not in rules and rule_info(c) is not None)
    return Explanation(rules=rules, see_also=see_also)
