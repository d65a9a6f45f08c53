"""Built-in rules, one module per family; :func:`builtin_rules` is the registry."""

from __future__ import annotations

from trainlint.rules.base import Invalid, Report, Rule, Valid

__all__ = ["Invalid", "Report", "Rule", "Valid", "builtin_rules"]


def builtin_rules() -> list[type[Rule]]:
    from trainlint.rules import (
        concurrency,
        gradients,
        memory,
        meta,
        numerics,
        schedules,
        state,
        throughput,
    )

    rules: list[type[Rule]] = []
    for module in (meta, gradients, schedules, memory, throughput, concurrency, numerics, state):
        rules.extend(module.RULES)
    return sorted(rules, key=lambda r: r.code)
