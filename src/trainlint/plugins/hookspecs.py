"""Hook specifications: the contract for trainlint plugins.

A plugin is a module (or object) with functions named like these hooks and
decorated with ``trainlint.plugins.hookspecs.hookimpl``; it is found through the
``trainlint`` entry-point group or listed in the ``plugins`` config key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from trainlint.rules.base import Rule

PROJECT = "trainlint"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def trainlint_rules() -> list[type[Rule]]:  # type: ignore[empty-body]
    """Return rule classes (subclasses of :class:`trainlint.Rule`) this plugin adds.

    Codes must not clash with built-in rules or other plugins; a clash is an error
    naming both. Each rule carries its own metadata, docs and examples, and is
    tested with :mod:`trainlint.rule_testing` exactly like built-in rules.
    """


@hookspec
def trainlint_output_formats() -> dict[str, Any]:  # type: ignore[empty-body]
    """Return ``{name: formatter}``; a formatter is ``f(findings, rules) -> str``."""
