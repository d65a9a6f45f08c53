"""Mixed precision: grad scalers, autocast regions, and the gradient reads around them."""

from __future__ import annotations

import ast
import re

from trainlint.analysis.model import FileModel, call_name, is_false, keyword
from trainlint.analysis.roles import Role, name_role
from trainlint.analysis.steps import (
    Event,
    Kind,
    Path,
    StepLoop,
    backward_value,
    condition_literal,
)

AMP_WORD = re.compile(
    r"(^|_)amp($|_)|fp16|bf16|float16|(^|_)half$|mixed|precision|scaler|"
    r"autocast",
    re.IGNORECASE,
)
NEGATED_WORD = re.compile(r"(^|_)(no|disable|disabled|without|skip)(_|$)|fp32|full", re.IGNORECASE)


def literally_disabled(call: ast.Call | None) -> bool:
    """``GradScaler(enabled=False)`` / ``autocast(enabled=False)``: a literal no-op."""
    return call is not None and is_false(keyword(call, "enabled"))


class Scalers:
    """Which receivers are GradScalers, and which backwards were scaled by one; memoised per
    file because every path of every loop asks the same questions."""

    def __init__(self, model: FileModel) -> None:
        self.model = model
        self._scaled: dict[int, bool] = {}
        self._assigned: dict[tuple[object, ...], list[ast.AST]] | None = None

    def is_scaler(self, expr: ast.AST) -> bool:
        roles = self.model.roles
        binding = roles.lookup(expr)
        if binding is not None:
            return binding.role is Role.SCALER and not literally_disabled(binding.call)
        # No role binding: a `scaler` parameter, `GradScaler() if amp else None`, or
        # something built by a constructor we do not know (a custom loss scaler, a shadowed
        # `GradScaler`). Only the first two are GradScalers.
        key = roles.key(expr)
        if key is not None and any(isinstance(v, ast.Call) for v in self._values_of(key)):
            return False
        return name_role(expr) is Role.SCALER and self.model.imports_module("torch")

    def _values_of(self, key: tuple[object, ...]) -> list[ast.AST]:
        if self._assigned is None:
            assigned: dict[tuple[object, ...], list[ast.AST]] = {}
            roles = self.model.roles
            for node in self.model.assignments:
                if isinstance(node, ast.AugAssign) or node.value is None:
                    continue
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, (ast.Name, ast.Attribute)):
                        k = roles.key(t)
                        if k is not None:
                            assigned.setdefault(k, []).append(node.value)
            self._assigned = assigned
        return self._assigned.get(key, [])

    def scale_call(self, expr: ast.AST | None, depth: int = 0) -> ast.Call | None:
        """The ``scaler.scale(...)`` call a backward's tensor comes from, following names."""
        if expr is None or depth > 4:
            return None
        if isinstance(expr, ast.Call):
            func = expr.func
            if (
                call_name(expr) == "scale"
                and isinstance(func, ast.Attribute)
                and (self.is_scaler(func.value))
            ):
                return expr
            return None
        if isinstance(expr, ast.BinOp):  # `(scaler.scale(loss) / accum).backward()`
            return self.scale_call(expr.left, depth + 1) or self.scale_call(expr.right, depth + 1)
        if isinstance(expr, ast.Name):
            found = self.model.flow.definition(expr.id, expr)
            if found is not None and isinstance(found[1], ast.expr):
                return self.scale_call(found[1], depth + 1)
        return None

    def scaled(self, event: Event) -> bool:
        """Is this backward ``scaler.scale(loss).backward()`` (or a name bound to it)?"""
        cached = self._scaled.get(id(event.node))
        if cached is None:
            node = event.node
            cached = (
                isinstance(node, ast.Call)
                and self.scale_call(backward_value(self.model, node)) is not None
            )
            self._scaled[id(event.node)] = cached
        return cached


def scaled_update_functions(model: FileModel, scalers: Scalers) -> list[StepLoop]:
    """Functions that run a whole mixed-precision update themselves (a scaled backward,
    then ``scaler.step(...)``, on one path) and that no step loop of this file reaches: an
    optimizer wrapper's ``step(loss)`` whose training loop lives in another file. Each
    comes as a step loop over the function's own paths, as the step functions that
    ``steps`` finds by their names do."""

    def build(m: FileModel) -> list[StepLoop]:
        steps = m.steps
        covered = {id(sl.node) for sl in steps.step_loops}
        for sl in steps.step_loops:
            for e in sl.events:
                for site in e.chain:
                    target = m.resolve_call(site)
                    if target is not None:
                        covered.add(id(target))
        out: list[StepLoop] = []
        seen: set[int] = set()
        for call in m.calls.get("scale", ()):
            fn = m.function_of(call)
            if fn is None or id(fn) in seen or id(fn) in covered:
                continue
            seen.add(id(fn))
            if m.loop_contexts(fn.body[0] if fn.body else fn):
                continue  # a loop of this file calls it: that loop's paths hold it
            paths, precise = steps.function_paths(fn)
            if any(_scaled_update(scalers, p) for p in paths):
                out.append(StepLoop(fn, paths, precise))
        return out

    return model.memo(scaled_update_functions, build)


def _scaled_update(scalers: Scalers, path: Path) -> bool:
    backward = next(
        (i for i, e in enumerate(path) if e.kind is Kind.BACKWARD and scalers.scaled(e)), None
    )
    return backward is not None and any(
        e.kind is Kind.STEP and e.scaled for e in path[backward + 1 :]
    )


def guard_condition(guard: tuple[ast.If, bool]) -> tuple[str, bool, ast.expr]:
    """(identity of the tested expression, its truth on this branch, the expression)."""
    if_node, branch = guard
    expr, positive = condition_literal(if_node.test)
    return ast.dump(expr), positive == branch, expr


def names_in(expr: ast.AST) -> list[str]:
    return [
        n.id if isinstance(n, ast.Name) else n.attr
        for n in ast.walk(expr)
        if isinstance(n, (ast.Name, ast.Attribute))
    ]


def off_amp_branch(event: Event, source: Event) -> bool:
    """Does ``event`` run only under a mixed-precision flag that ``source`` (the scaled
    backward) was not decided by, in a way that may mean "AMP off"? ``if not use_amp:``,
    ``if scaler is None:``, the ``else`` of ``if use_amp:``, ``if precision == "32":``.
    Such flags are correlated at run time in ways a path cannot see: stay silent."""
    decided = {guard_condition(g)[:2] for g in source.guards}
    own = {id(g) for g, _ in source.guards}
    for g in event.guards:
        if id(g[0]) in own:
            continue
        key, value, expr = guard_condition(g)
        words = names_in(expr)
        if not any(AMP_WORD.search(w) for w in words):
            continue
        if (key, value) in decided:
            continue  # the same flag, the same way, as the scaled backward
        if not value or not isinstance(expr, (ast.Name, ast.Attribute)):
            return True
        if any(NEGATED_WORD.search(w) for w in words):
            return True
    return False


def contains_in_order(path: Path, first: Event, *rest: Event) -> int:
    """Index of ``first`` when ``path`` holds first and then each of ``rest``; else -1."""
    start = -1
    for i, e in enumerate(path):
        if e is first:
            start = i
            break
    if start < 0:
        return -1
    pos = start
    for want in rest:
        for j in range(pos + 1, len(path)):
            if path[j] is want:
                pos = j
                break
        else:
            return -1
    return start
