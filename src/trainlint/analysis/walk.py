"""Walking one tree fast: the child plan of each node class, and the three walks.

``walk_tree`` (breadth first, everything), ``walk_local`` (source order, one scope) and
``postorder`` (evaluation order, one scope) skip expression contexts and operators and
read each class's children from a plan built once from its grammar line. The indexing
pass of :class:`~trainlint.analysis.model.FileModel` reads the same plans.
"""

from __future__ import annotations

import ast
import re
from collections import deque
from collections.abc import Iterator
from typing import Any

from trainlint.analysis.imports import NESTED_SCOPES

_AST = ast.AST
LEAF_TYPES = (ast.expr_context, ast.boolop, ast.operator, ast.unaryop, ast.cmpop)

#: The types the grammar gives no child node of: a field of one never holds a child.
_SCALAR_TYPES = frozenset(
    {"identifier", "string", "int", "constant", "expr_context", "operator", "boolop", "unaryop"}
)
_GRAMMAR = re.compile(r"\s*\w+\((.*)\)\s*$", re.DOTALL)

#: How to read a class's children, per class (memoized by ``plan_of``): its fields that
#: may hold one, in field order, each with what it holds: True a list (of nodes, or None
#: for a ``{**d}`` key or a missing keyword default), False one node or None, None not
#: known (a class whose grammar line cannot be read: its values are checked one by one).
Plan = tuple[tuple[str, "bool | None"], ...]
PLANS: dict[type, Plan] = {}
_RPLANS: dict[type, Plan] = {}  # the same, last field first (walk_local)


def plan_of(cls: type) -> Plan:
    """``cls``'s plan, read from its grammar line (``Dict(expr* keys, expr* values)``, the
    class's docstring in every supported Python)."""
    types: dict[str, str] = {}
    found = _GRAMMAR.match(cls.__doc__ or "") if cls.__module__ == "ast" else None
    if found is not None:
        for part in found.group(1).split(","):
            kind, _, name = part.strip().rpartition(" ")
            types[name] = kind
    plan: list[tuple[str, bool | None]] = []
    for name in getattr(cls, "_fields", ()):
        kind = types.get(name)
        if kind is not None and kind.rstrip("*?") in _SCALAR_TYPES:
            continue
        plan.append((name, None if kind is None else kind.endswith("*")))
    PLANS[cls] = tuple(plan)
    _RPLANS[cls] = tuple(reversed(plan))
    return PLANS[cls]


# Nodes with no children that the pass only records (parent, scope): handled where
# they are found instead of going through the stack.
LEAVES = frozenset({ast.Name, ast.Constant, ast.Pass, ast.Break, ast.Continue, ast.alias})
# walk_local: the nodes it yields but does not enter
_WALK_STOP = LEAVES | {*NESTED_SCOPES}


def nodes_in(value: object) -> list[ast.AST]:
    """The child nodes a field's value holds, checked one by one (no plan for the field)."""
    if value.__class__ is list:
        return [v for v in value if isinstance(v, _AST)]  # type: ignore[attr-defined]
    if isinstance(value, _AST) and not isinstance(value, LEAF_TYPES):
        return [value]
    return []


def children(node: ast.AST) -> list[ast.AST]:
    """ast.iter_child_nodes without the generator, contexts and operators: the indexing
    pass visits every node."""
    out: list[ast.AST] = []
    cls = node.__class__
    plan = PLANS.get(cls)
    if plan is None:
        plan = plan_of(cls)
    for name, many in plan:
        value = getattr(node, name, None)
        if value is None:
            continue
        if many is None:
            out.extend(nodes_in(value))
        elif many:
            out.extend(item for item in value if item is not None)
        else:
            out.append(value)
    return out


def walk_tree(node: ast.AST) -> Iterator[ast.AST]:
    """``ast.walk`` (breadth first, entering everything) in its order, without the
    expression contexts and operators it also yields, at about twice its speed: for
    scans that look for calls, names or statements, where those never matter."""
    todo = deque((node,))
    popleft = todo.popleft
    extend = todo.extend
    while todo:
        cur = popleft()
        extend(children(cur))
        yield cur


def walk_local(node: ast.AST) -> Iterator[ast.AST]:
    """Like ast.walk, in source order, but does not descend into nested defs/classes/lambdas."""
    yield node
    stack = children(node)
    stack.reverse()
    pop = stack.pop
    push = stack.append
    plans = _RPLANS
    stop = _WALK_STOP
    while stack:
        cur = pop()
        yield cur
        cls = cur.__class__
        if cls in stop:
            continue
        plan = plans.get(cls)
        if plan is None:
            plan_of(cls)
            plan = plans[cls]
        # children pushed last-first, so they come off the stack in source order
        for name, many in plan:
            value: Any = getattr(cur, name, None)
            if value is None:
                continue
            if many is None:
                value, many = nodes_in(value), True
            if many:
                for item in reversed(value):
                    if item is not None:
                        push(item)
            else:
                push(value)


def postorder(node: ast.AST) -> list[ast.AST]:
    """Children before parents (evaluation order), not entering nested defs/lambdas;
    contexts and operators left out. Built as the reverse of a preorder that takes the
    children last-first: no second visit per node, no call per node."""
    out: list[ast.AST] = []
    stack = [node]
    pop = stack.pop
    push = stack.append
    add = out.append
    plans = PLANS
    stop = _WALK_STOP  # (a leaf has no child to push)
    while stack:
        cur = pop()
        add(cur)
        cls = cur.__class__
        if cls in stop and cur is not node:
            continue
        plan = plans.get(cls)
        if plan is None:
            plan = plan_of(cls)
        for name, many in plan:  # (in field order: the last child comes off the stack first)
            value: Any = getattr(cur, name, None)
            if value is None:
                continue
            if many is None:
                value, many = nodes_in(value), True
            if many:
                for item in value:
                    if item is not None:
                        push(item)
            else:
                push(value)
    out.reverse()
    return out
