"""Which additive terms of a backpropagated loss were cut off the graph that trains."""

from __future__ import annotations

import ast

from trainlint.analysis.flow import CUT_METHODS, Taint
from trainlint.analysis.model import FileModel


def _cut_of(model: FileModel, term: ast.AST, depth: int = 0) -> ast.Call | None:
    """The ``.detach()`` / ``.item()`` call that makes ``term`` (``f(x).detach() * w``,
    a name bound to one) where the cut is on the term itself, not inside an argument."""
    flow = model.flow
    if depth > 4:
        return None
    if isinstance(term, ast.BinOp) and isinstance(term.op, (ast.Mult, ast.Div)):
        if _weight(model, term.right):
            return _cut_of(model, term.left, depth + 1)
        if isinstance(term.op, ast.Mult) and _weight(model, term.left):
            return _cut_of(model, term.right, depth + 1)
        return None
    if isinstance(term, ast.Name):
        found = flow.definition(term.id, term)
        if found is not None and isinstance(found[0], ast.Assign):
            return _cut_of(model, found[1], depth + 1)
        return None
    if (
        isinstance(term, ast.Call)
        and isinstance(term.func, ast.Attribute)
        and term.func.attr in CUT_METHODS
        and not term.args
    ):
        return term
    return None


def _weight(model: FileModel, expr: ast.AST) -> bool:
    """A scaling factor without a graph: data, or a hyper-parameter read off an options
    object handed in (``opt.beta``; not ``self.``, where a learnable weight may live)."""
    if model.flow.value(expr).taint is Taint.DATA:
        return True
    if not (isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name)):
        return False
    if expr.value.id in ("self", "cls"):
        return False
    fn = model.function_of(expr)
    args = fn.args if fn is not None else None
    return args is not None and expr.value.id in {
        a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)
    }


def _receiver(call: ast.Call) -> ast.expr:
    """``f(x).detach().item()`` -> ``f(x)``."""
    inner: ast.expr = call
    while (
        isinstance(inner, ast.Call)
        and isinstance(inner.func, ast.Attribute)
        and inner.func.attr in CUT_METHODS
    ):
        inner = inner.func.value
    return inner


def _forward_passes(model: FileModel, expr: ast.AST, depth: int = 0) -> set[int]:
    """The statements ``a, b = net(x)`` (several outputs of one call) that ``expr`` is
    computed from, following names to their definitions."""
    out: set[int] = set()
    if depth > 5:
        return out
    for sub in ast.walk(expr):
        if not isinstance(sub, ast.Name) or not isinstance(sub.ctx, ast.Load):
            continue
        found = model.flow.definition(sub.id, sub)
        if found is None or not isinstance(found[0], ast.Assign):
            continue
        stmt = found[0]
        target = stmt.targets[0] if len(stmt.targets) == 1 else None
        if isinstance(target, ast.Tuple) and isinstance(stmt.value, ast.Call):
            out.add(id(stmt))
        else:
            out |= _forward_passes(model, stmt.value, depth + 1)
    return out


def cut_terms_of_trained_graph(model: FileModel, value: ast.AST) -> list[ast.Call]:
    """The cut calls of the additive terms of ``value`` (a loss reaching ``backward()``)
    whose cut operand comes from the same forward pass (one call's several outputs,
    ``feats, logits = net(x)``) as a term that still reaches backward uncut: a loss of
    the trained model's outputs that contributes no gradient. A cut term of other
    origin (a constant, a baseline) is left alone."""
    terms = model.flow.terms(value)
    cuts = [(t, _cut_of(model, t)) for t in terms]
    live = [
        t
        for t, cut in cuts
        if cut is None and model.flow.value(t).taint not in (Taint.DATA, Taint.CUT)
    ]
    if not live:
        return []
    live_passes: set[int] = set()
    for t in live:
        live_passes |= _forward_passes(model, t)
    return [
        cut
        for _, cut in cuts
        if cut is not None and _forward_passes(model, _receiver(cut)) & live_passes
    ]
