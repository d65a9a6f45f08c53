"""What several memory rules share."""

from __future__ import annotations

import ast

from trainlint.analysis.model import dotted


def value_names(expr: ast.AST) -> tuple[set[str], bool]:
    """Dotted names read by an expression, and whether it calls anything."""

    names: set[str] = set()
    has_call = False
    stack = [expr]
    while stack:
        sub = stack.pop()
        if isinstance(sub, ast.Call):
            has_call = True
        if isinstance(sub, (ast.Name, ast.Attribute)):
            name = dotted(sub)
            if name:
                parts = name.split(".")
                names.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
                continue
        if isinstance(sub, ast.Subscript):
            stack.append(sub.value)  # `y[i]` reads y's graph; the index carries none
            continue
        stack.extend(ast.iter_child_nodes(sub))
    return names, has_call
