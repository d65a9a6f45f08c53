"""Whether grad mode may be off at a call in ways torch's own contexts do not show
(:func:`trainlint.analysis.flow.grad_enabled_at` reads those): a project wrapper named
for it, an earlier ``set_grad_enabled(False)`` statement, callers that all run without
grad."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from trainlint.analysis.flow import grad_enabled_at
from trainlint.analysis.loaders import goes_over_data
from trainlint.analysis.model import FileModel, dotted, is_false, walk_local

#: Names of wrappers that turn grad mode off (`smart_inference_mode()`, `maybe_no_grad`)
#: or context managers from elsewhere that may (`eval_mode(model)`, `evaluating(net)`):
#: whether grad is on under them cannot be seen from this file.
_GRAD_WRAPPER = re.compile(
    r"no_grad|inference_mode|eval_mode|evaluating|inference_context", re.IGNORECASE
)


def under_grad_wrapper(model: FileModel, node: ast.AST) -> bool:
    """Inside a `with` or under a decorator that is not torch's own but whose name says it
    disables grad (or may): a project wrapper torch's names do not cover."""
    for anc in model.ancestors(node):
        exprs: list[ast.AST] = []
        if isinstance(anc, (ast.With, ast.AsyncWith)):
            exprs = [item.context_expr for item in anc.items]
        elif isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef)):
            exprs = list(anc.decorator_list)
        for expr in exprs:
            target = expr.func if isinstance(expr, ast.Call) else expr
            name = dotted(target)
            if (
                name is not None
                and not (model.qualname(target) or "").startswith("torch.")
                and (_GRAD_WRAPPER.search(name.rsplit(".", 1)[-1]))
            ):
                return True
            if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef)) and _wraps_in_no_grad(
                model, target
            ):
                return True
    return False


_NO_GRAD_CONTEXTS = ("torch.no_grad", "torch.inference_mode")


def _wraps_in_no_grad(model: FileModel, decorator: ast.AST) -> bool:
    """``decorator`` names a module-level function of this file that runs what it wraps
    inside ``torch.no_grad()``/``inference_mode()`` (``def nograd(f): def g(*a): with
    torch.no_grad(): return f(*a)``), whatever it is called."""
    if not isinstance(decorator, ast.Name) or model.qualname(decorator) is not None:
        return False
    for fn in model.functions:
        if (
            fn.name != decorator.id
            or model.function_of(fn) is not None
            or model.class_of(fn) is not None
        ):
            continue
        for node in ast.walk(fn):
            if isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    expr = item.context_expr
                    head = expr.func if isinstance(expr, ast.Call) else expr
                    qual = model.qualname(head) or ""
                    if qual in _NO_GRAD_CONTEXTS:
                        return True
    return False


def grad_disabled_earlier(model: FileModel, call: ast.Call, fn: ast.AST | None) -> bool:
    """A ``set_grad_enabled(False)`` statement comes before ``call`` in its function
    ``fn`` (None: the module)."""
    for c in model.calls.get("set_grad_enabled", ()):
        if (
            model.function_of(c) is fn
            and (c.lineno, c.col_offset) < (call.lineno, call.col_offset)
            and isinstance(model.parent_of(c), ast.Expr)
            and c.args
            and is_false(c.args[0])
        ):
            return True
    return False


def callers_disable_grad(model: FileModel, fn: ast.AST) -> bool:
    """``fn`` is called in this file, and only where grad mode is off."""
    sites = [*model.call_sites.get(id(fn), []), *inherited_dispatch_sites(model, fn)]
    return bool(sites) and all(not grad_enabled_at(model, s)[0] for s in sites)


def inherited_dispatch_sites(model: FileModel, fn: ast.AST) -> list[ast.Call]:
    """``self.m()`` calls in a same-file base class of ``fn``'s class that reach ``fn``,
    an override of ``m`` there: the template-method shape (the base class's ``train()``
    calls ``self._valid_epoch()``, which only a subclass defines). ``call_sites`` resolves
    such a call to the base class's own method, or to nothing."""
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return []
    cls = model.class_of(fn)
    if cls is None:
        return []
    bases: set[int] = set()
    base = model.local_base(cls)
    while base is not None and id(base) not in bases and base is not cls:
        bases.add(id(base))
        base = model.local_base(base)
    out = []
    for call in model.calls.get(fn.name, ()):
        func = call.func
        if not (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "self"
        ):
            continue
        holder = model.enclosing_class(call)
        if holder is not None and id(holder) in bases:
            out.append(call)
    return out


def walks_data(model: FileModel, loop: ast.AST) -> bool:
    """``loop`` goes over a data set: a loader or its batches, ``range(len(loader))``, or
    ``range(n)`` with ``n`` computed from a length (:func:`counts_over_data`)."""
    return goes_over_data(loop) or counts_over_data(model, loop)


def counts_over_data(model: FileModel, loop: ast.AST, depth: int = 2) -> bool:
    """``for i in range(n)`` where ``n`` was computed from a length earlier in the function
    (``n = len(loader.dataset)``, then ``n = min(cap, n)``): the loop walks a data set by
    index, as ``range(len(loader))`` does, only through a name."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return False
    it = loop.iter
    if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range"):
        return False
    names = [n for arg in it.args for n in ast.walk(arg) if isinstance(n, ast.Name)]
    return any(_from_length(model, n.id, loop, depth) for n in names)


def _from_length(model: FileModel, name: str, at: ast.AST, depth: int) -> bool:
    for _stmt, value in model.flow.definitions_before(name, at):
        if not isinstance(value, ast.expr):
            continue
        for sub in ast.walk(value):
            if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id == "len":
                return True
            if depth > 0 and isinstance(sub, ast.Name) and sub.id != name:
                if _from_length(model, sub.id, at, depth - 1):
                    return True
    return False


def _mode_calls(model: FileModel) -> dict[int, list[tuple[str, str, tuple[int, int]]]]:
    """`X.eval()`/`X.train()` calls grouped by their function (id), as (method, receiver,
    position): built once per file, so each call looks only at its own function's."""
    by_fn: dict[int, list[tuple[str, str, tuple[int, int]]]] = {}
    for name in ("eval", "train"):
        for c in model.calls.get(name, ()):
            if not isinstance(c.func, ast.Attribute):
                continue
            recv = dotted(c.func.value)
            if recv is not None:
                key = id(model.function_of(c))
                by_fn.setdefault(key, []).append((name, recv, (c.lineno, c.col_offset)))
    return by_fn


def after_eval(
    model: FileModel, call: ast.Call, fn: ast.AST | None, target: str | None = None
) -> bool:
    """``X.eval()`` earlier in ``call``'s function ``fn``, with no ``X.train()`` in
    between; ``X`` is what ``call`` calls, or ``target`` (an argument handed on)."""
    target = target or dotted(call.func)
    if target is None:
        return False
    pos = (call.lineno, call.col_offset)
    last_eval = last_train = (-1, -1)
    for name, recv, cpos in model.memo("eval-train-calls", _mode_calls).get(id(fn), ()):
        if cpos >= pos or not (
            target == recv or target.startswith(recv + ".") or recv.startswith(target + ".")
        ):
            continue
        if name == "eval":
            last_eval = max(last_eval, cpos)
        else:
            last_train = max(last_train, cpos)
    return last_eval > last_train


def evaluated_through_helpers(model: FileModel) -> Iterator[tuple[ast.Call, list[ast.Call]]]:
    """Calls of a same-file helper handed a model just put in eval mode (``model.eval();
    run_epoch(data, model, ...)``), with the helper's calls of that model in a loop over
    data with grad on: a helper shared by training and evaluation runs the evaluation."""
    for fn_id, calls in model.memo("eval-train-calls", _mode_calls).items():
        receivers = {recv for name, recv, _ in calls if name == "eval"}
        scope = next(
            (c for c in model.calls.get("eval", ()) if id(model.function_of(c)) == fn_id), None
        )
        if scope is None:
            continue
        fn = model.function_of(scope)
        for site in walk_local(fn if fn is not None else model.tree):
            if not isinstance(site, ast.Call):
                continue
            helper = model.resolve_call(site)
            if helper is None or helper is fn:
                continue
            for param, arg in _bound(model, site, helper):
                name = dotted(arg)
                if name in receivers and after_eval(model, site, fn, name):
                    runs = _param_calls_over_data(model, helper, param)
                    if runs:
                        yield site, runs


def _bound(model: FileModel, site: ast.Call, helper: ast.AST) -> list[tuple[str, ast.expr]]:
    """(parameter, argument) pairs of a plain call (no ``*args``/``**kwargs``)."""
    if not isinstance(helper, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return []
    params = [a.arg for a in (*helper.args.posonlyargs, *helper.args.args)]
    if isinstance(site.func, ast.Attribute) and model.class_of(helper) is not None:
        params = params[1:]  # `self.run(...)`: the first parameter is the instance
    out = [(p, a) for p, a in zip(params, site.args, strict=False)]
    if any(isinstance(a, ast.Starred) for a in site.args):
        return []
    out += [(k.arg, k.value) for k in site.keywords if k.arg is not None]
    return out


def _param_calls_over_data(model: FileModel, helper: ast.AST, param: str) -> list[ast.Call]:
    out = []
    for sub in walk_local(helper):
        if not isinstance(sub, ast.Call):
            continue
        func = sub.func
        if isinstance(func, ast.Attribute) and func.attr == "forward":
            func = func.value
        if not (isinstance(func, ast.Name) and func.id == param):
            continue
        loops = model.enclosing_loops(sub)
        if any(walks_data(model, lp) for lp in loops) and grad_enabled_at(model, sub)[0]:
            if not under_grad_wrapper(model, sub) and not grad_disabled_earlier(model, sub, helper):
                out.append(sub)
    return out
