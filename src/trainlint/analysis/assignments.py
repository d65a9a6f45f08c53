"""The values a plain name is assigned, per scope: the cheapest value question.

:func:`single_assignments` lists, per (scope, name), every value assigned to the name
there (an augmented assignment counts as its target: the value is not known);
:func:`single_value` is the one value of a name assigned exactly once. No flow, no
order: questions that need "which assignment reaches here" ask :mod:`flow`.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainlint.analysis.model import FileModel


def single_assignments(model: FileModel) -> dict[tuple[int, str], list[ast.expr]]:
    """(scope, name) -> the values assigned to the plain name there (cheap, no flow)."""

    def build(m: FileModel) -> dict[tuple[int, str], list[ast.expr]]:
        out: dict[tuple[int, str], list[ast.expr]] = {}
        for node in m.assignments:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    value = node.value if not isinstance(node, ast.AugAssign) else None
                    out.setdefault((id(m.scope_of(node)), t.id), []).append(
                        value if value is not None else t
                    )
        return out

    return model.memo(single_assignments, build)


def single_value(model: FileModel, name: ast.Name) -> ast.expr | None:
    """The one value ``name`` is assigned in its scope; None when it is assigned more
    than once or never (a parameter, a global)."""
    values = single_assignments(model).get((id(model.scope_of(name)), name.id))
    return values[0] if values is not None and len(values) == 1 else None
