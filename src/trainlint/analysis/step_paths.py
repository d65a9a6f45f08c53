"""Event paths through a block of statements: the step walker.

:class:`PathWalker` enumerates the orders in which a step's events can happen along the
branches of a block, inlining same-file helpers and asking a foreign-call hook (the
project layer's answer) about calls into other files; :func:`condition_literal`,
:func:`dedupe` and the other helpers here serve it.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING

from trainlint.analysis.model import (
    LOOP_NODES,
    NESTED_SCOPES,
)
from trainlint.analysis.step_events import (
    MAX_INLINE_DEPTH,
    MAX_PATHS,
    Event,
    Kind,
    Path,
)

if TYPE_CHECKING:
    from trainlint.analysis.model import FileModel, FunctionNode
    from trainlint.analysis.steps import StepModel

#: the walker's question at a call it cannot resolve in the file: its paths, or None
Foreign = Callable[
    ["PathWalker", ast.Call, int, tuple[tuple[ast.If, bool], ...]], "list[Path] | None"
]
#: a node the step walker acts on: (node, its event, the same-file helper a call runs)
NodeEvent = tuple[ast.AST, "Event | None", "FunctionNode | None"]


class PathWalker:
    """Enumerates event paths through statements; inlines same-file helpers; asks
    ``foreign`` (analysis.effects) about calls into other files."""

    def __init__(
        self,
        steps: StepModel,
        depth: int = 0,
        chain: tuple[ast.Call, ...] = (),
        guards: tuple[tuple[ast.If, bool], ...] = (),
        inline_depth: int = 0,
        foreign: Foreign | None = None,
    ) -> None:
        self.steps = steps
        self.depth = depth
        self.chain = chain
        self.guards = guards
        self.inline_depth = inline_depth
        self.precise = True
        self.foreign = foreign

    def run(self, stmts: list[ast.stmt]) -> list[Path]:
        open_paths, closed = self._block(stmts, [()], self.depth, self.guards)
        keys = self.steps.test_keys
        return [p for p in _dedupe(open_paths + closed) if _feasible(p, keys)]

    # Each block returns (paths still running, paths that ended the iteration).
    def _block(
        self,
        stmts: list[ast.stmt],
        paths: list[Path],
        depth: int,
        guards: tuple[tuple[ast.If, bool], ...],
    ) -> tuple[list[Path], list[Path]]:
        closed: list[Path] = []
        for stmt in stmts:
            if not paths:
                break
            paths, ended = self._stmt(stmt, paths, depth, guards)
            closed.extend(ended)
            if len(paths) + len(closed) > MAX_PATHS:
                self.precise = False
                paths = paths[:MAX_PATHS]
                closed = closed[:MAX_PATHS]
        return paths, closed

    def _stmt(
        self, stmt: ast.stmt, paths: list[Path], depth: int, guards: tuple[tuple[ast.If, bool], ...]
    ) -> tuple[list[Path], list[Path]]:
        if stmt.__class__ in _SIMPLE_STATEMENTS:  # (most statements: the last case below)
            return _extend(paths, self._expr_events(stmt, depth, guards)), []
        if isinstance(stmt, ast.If):
            pre = self._expr_events(stmt.test, depth, guards)
            paths = _extend(paths, pre)
            t_open, t_closed = self._block(stmt.body, paths, depth, (*guards, (stmt, True)))
            f_open, f_closed = self._block(stmt.orelse, paths, depth, (*guards, (stmt, False)))
            return _dedupe(t_open + f_open), t_closed + f_closed
        if isinstance(stmt, LOOP_NODES):
            head = stmt.iter if isinstance(stmt, (ast.For, ast.AsyncFor)) else stmt.test
            paths = _extend(paths, self._expr_events(head, depth, guards))
            # A nested loop's body runs once on our paths: zeroing `for p in params` counts.
            inner_open, inner_closed = self._block(stmt.body, paths, depth + 1, guards)
            inner = inner_open + inner_closed  # `continue`/`break` end the inner loop only
            after, closed = self._block(stmt.orelse, _dedupe(inner), depth, guards)
            return after, closed
        if isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                paths = _extend(paths, self._expr_events(item.context_expr, depth, guards))
            return self._block(stmt.body, paths, depth, guards)
        if isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
            body_open, body_closed = self._block(stmt.body, paths, depth, guards)  # type: ignore[attr-defined]
            else_open, else_closed = self._block(stmt.orelse, body_open, depth, guards)  # type: ignore[attr-defined]
            fin_open, fin_closed = self._block(stmt.finalbody, else_open, depth, guards)  # type: ignore[attr-defined]
            # `finally` also runs on the way out of a `return`/`break` in the body
            exited = body_closed + else_closed
            if stmt.finalbody and exited:  # type: ignore[attr-defined]
                o, c = self._block(stmt.finalbody, exited, depth, guards)  # type: ignore[attr-defined]
                exited = o + c
            return fin_open, exited + fin_closed
        if isinstance(stmt, ast.Match):
            opened: list[Path] = []
            ended: list[Path] = []
            paths = _extend(paths, self._expr_events(stmt.subject, depth, guards))
            for case in stmt.cases:
                o, c = self._block(case.body, paths, depth, guards)
                opened += o
                ended += c
            return _dedupe(opened + paths), ended
        if isinstance(stmt, (ast.Continue, ast.Break)):
            return [], paths if depth == self.depth else paths
        if isinstance(stmt, (ast.Return, ast.Raise)):
            value = stmt.value if isinstance(stmt, ast.Return) else stmt.exc
            if value is not None:
                paths = _extend(paths, self._expr_events(value, depth, guards))
            return [], paths
        if isinstance(stmt, NESTED_SCOPES):
            return paths, []
        return _extend(paths, self._expr_events(stmt, depth, guards)), []

    def _expr_events(
        self, node: ast.AST, depth: int, guards: tuple[tuple[ast.If, bool], ...]
    ) -> list[list[Path]]:
        """Events of one statement/expression in evaluation order, as a list of
        alternatives-per-position (helpers contribute their own path sets)."""
        seq: list[list[Path]] = []
        for sub, ev, fn in self.steps.node_events(node):
            if fn is not None:  # a call of a same-file helper that is no event itself
                seq.append(self._inline(fn, sub, depth, guards))  # type: ignore[arg-type]
                continue
            if ev is None:  # maybe a function of another file
                if self.foreign is not None and self.inline_depth < MAX_INLINE_DEPTH:
                    alternatives = self.foreign(self, sub, depth, guards)  # type: ignore[arg-type]
                    if alternatives is not None:
                        seq.append(alternatives)
                continue
            if ev is not None and ev.kind is Kind.STEP and isinstance(sub, ast.Call):
                # opt.step(closure): the closure runs inside the step, before the update
                for arg in sub.args:
                    local = self._local_function(arg)
                    if local is not None:
                        seq.append(self._inline(local, sub, depth, guards))
            if ev is not None:
                seq.append(
                    [(Event(ev.kind, ev.node, ev.target, self.chain, guards, depth, ev.scaled),)]
                )
        return seq

    def _local_function(self, node: ast.AST) -> FunctionNode | None:
        if isinstance(node, ast.Name):
            model = self.steps.model
            defs = model.memo(_functions_by_scope, _functions_by_scope)
            return defs.get((node.id, id(model.scope_of(node))))
        return None

    def _inline(
        self, fn: FunctionNode, site: ast.Call, depth: int, guards: tuple[tuple[ast.If, bool], ...]
    ) -> list[Path]:
        if self.inline_depth >= MAX_INLINE_DEPTH or site in self.chain:
            return [()]
        if any(self.steps.model.resolve_call(c) is fn for c in self.chain):
            return [()]  # recursion
        sub = PathWalker(
            self.steps, depth, (*self.chain, site), guards, self.inline_depth + 1, self.foreign
        )
        paths = sub.run(fn.body)
        if not sub.precise:
            self.precise = False
        return paths or [()]


def condition_literal(test: ast.expr) -> tuple[ast.expr, bool]:
    """The condition a test is about, and whether the test asserts it: ``not x`` ->
    (x, False); ``x is None`` -> (x, False); ``x is not None`` -> (x, True)."""
    positive = True
    while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, positive = test.operand, not positive
    if (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], (ast.Is, ast.IsNot))
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value is None
    ):
        positive = positive if isinstance(test.ops[0], ast.IsNot) else not positive
        test = test.left
    return test, positive


def _feasible(path: Path, keys: dict[int, tuple[str, bool]]) -> bool:
    """A path cannot take both branches of the same condition: `if phase == "train":`
    tested twice in one iteration goes the same way both times, and `if amp:` ...
    `if not amp:` (or `scaler is None` / `is not None`) go opposite ways."""
    taken: dict[str, bool] = {}
    # The events of one block share one guards tuple: each distinct tuple is read once (in
    # any order: the answer is whether some condition is taken both ways).
    every = list(map(_GUARDS, path))
    for guards in dict(zip(map(id, every), every, strict=True)).values():
        for g, branch in guards:
            literal = keys.get(id(g))
            if literal is None:
                expr, positive = condition_literal(g.test)
                literal = keys[id(g)] = (ast.dump(expr), positive)
            key, positive = literal
            if taken.setdefault(key, positive == branch) != (positive == branch):
                return False
    return True


_GUARDS = operator.attrgetter("guards")
#: statements that neither branch, loop, nest a block nor leave it: their events in order
_SIMPLE_STATEMENTS = frozenset(
    {
        ast.Expr,
        ast.Assign,
        ast.AugAssign,
        ast.AnnAssign,
        ast.Delete,
        ast.Pass,
        ast.Import,
        ast.ImportFrom,
        ast.Global,
        ast.Nonlocal,
        ast.Assert,
    }
)
#: the only nodes ``StepModel.classify`` makes an event of, or the walker inlines
EVENT_NODES = frozenset({ast.Call, ast.Attribute, ast.Assign, ast.AnnAssign, ast.Delete})
CALLEES = frozenset({ast.Name, ast.Attribute})


def _extend(paths: list[Path], seq: list[list[Path]]) -> list[Path]:
    for alternatives in seq:
        paths = _dedupe([p + alt for p in paths for alt in alternatives])
        if len(paths) > MAX_PATHS:
            paths = paths[:MAX_PATHS]
    return paths


def _dedupe(paths: list[Path]) -> list[Path]:
    """The paths without repeats, first occurrences in order. Events compare and hash by
    identity (``eq=False``), so a path is its own key: the work stays in C."""
    if len(paths) < 2:
        return paths
    return list(dict.fromkeys(paths))


def _functions_by_scope(model: FileModel) -> dict[tuple[str, int], FunctionNode]:
    """The first def of each name in each scope, in source order: a call's local function
    is one look-up."""
    out: dict[tuple[str, int], FunctionNode] = {}
    for fn in model.functions:
        out.setdefault((fn.name, id(model.scope_of(fn))), fn)
    return out
