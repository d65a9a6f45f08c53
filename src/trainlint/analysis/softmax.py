"""Which softmax calls an expression's value certainly comes from."""

from __future__ import annotations

import ast

from trainlint.analysis.dominance import dominates
from trainlint.analysis.model import FileModel, walk_local
from trainlint.analysis.roles import Binding, Role

SOFTMAX_FUNCS = {"torch.nn.functional.softmax", "torch.softmax", "torch.special.softmax"}
SOFTMAX_MODULE = "torch.nn.Softmax"

# Methods that keep a tensor's values (reshaping, casting, selecting): probabilities stay
# probabilities through them, so a softmax output is still one after `.view(-1, C)`.
SAME_VALUES = {"view", "reshape", "flatten", "squeeze", "unsqueeze", "permute", "transpose",
               "contiguous", "float", "double", "half", "bfloat16", "to", "type", "clone",
               "gather", "view_as", "reshape_as", "cuda", "cpu"}


def softmax_sources(model: FileModel, expr: ast.AST) -> list[ast.AST]:
    """The softmax node(s) whose output ``expr`` certainly is; [] when not certain. The
    softmax may be applied directly, through a name, by an `nn.Softmax` module, as the last
    layer of an `nn.Sequential`, or as the return value of a same-file model's `forward`."""
    return _sources(model, expr, 0, set())


def _int_literal(node: ast.AST) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return isinstance(node, ast.Constant) and type(node.value) is int


def _sources(model: FileModel, expr: ast.AST, depth: int, classes: set[int]) -> list[ast.AST]:
    if depth > 8:
        return []
    d = depth + 1
    if isinstance(expr, ast.Subscript):
        return _sources(model, expr.value, d, classes)
    if isinstance(expr, ast.Name):
        found = model.flow.definition(expr.id, expr)
        if found is None or not isinstance(found[1], ast.expr):
            return []
        if not dominates(model, found[0], expr):
            return []
        return _sources(model, found[1], d, classes)
    if not isinstance(expr, ast.Call):
        return []
    func = expr.func
    qual = model.qualname(func)
    if qual in SOFTMAX_FUNCS:
        return [expr]
    if isinstance(func, ast.Attribute) and qual is None:
        if func.attr == "softmax" and _method_form(expr):
            return [expr]
        if func.attr in SAME_VALUES:
            return _sources(model, func.value, d, classes)
    if isinstance(func, ast.Call) and model.qualname(func.func) == SOFTMAX_MODULE:
        return [expr]  # nn.Softmax(dim=1)(x)
    return _module_output(model, expr, d, classes)


def _method_form(call: ast.Call) -> bool:
    """``t.softmax(-1)`` / ``t.softmax(dim=1)``, told apart from an unresolved
    ``F.softmax(t, 1)`` (a shadowed module) by its arguments."""
    kws = {k.arg for k in call.keywords}
    if not kws <= {"dim", "dtype"}:
        return False
    if not call.args:
        return "dim" in kws
    return len(call.args) == 1 and _int_literal(call.args[0]) and "dim" not in kws


def _module_output(model: FileModel, call: ast.Call, depth: int,
                   classes: set[int]) -> list[ast.AST]:
    """Softmax at the end of a module called here: an `nn.Softmax` instance, the last
    layer of an `nn.Sequential`, or every return of a same-file class's `forward`."""
    func = call.func
    cls: ast.ClassDef | None = None
    if isinstance(func, ast.Name) and func.id == "self":
        cls = model.enclosing_class(func)
        if cls is not None and not model.roles.is_module_class(cls):
            return []  # `self(x)` runs `__call__`, which is `forward` only for modules
    elif isinstance(func, (ast.Name, ast.Attribute)):
        binding = model.roles.lookup(func)
        if binding is not None and getattr(binding, "softmax", False):
            return [call]  # a project model whose `forward` (in its own file) returns softmax
        if binding is None or binding.call is None:
            return []
        if binding.qualname == SOFTMAX_MODULE:
            return [call]
        if binding.qualname == "torch.nn.Sequential":
            last = binding.call.args[-1] if binding.call.args else None
            if isinstance(last, ast.Call) and model.qualname(last.func) == SOFTMAX_MODULE:
                return [last]
            return []
        cls = _local_module_class(model, binding)
    if cls is None or id(cls) in classes:
        return []
    forward = _forward_of(model, cls)
    if forward is None:
        return []
    returns = [n for n in walk_local(forward) if isinstance(n, ast.Return)]
    if not returns:
        return []
    found: list[ast.AST] = []
    for ret in returns:
        if ret.value is None:
            return []
        nodes = _sources(model, ret.value, depth, classes | {id(cls)})
        if not nodes:
            return []  # some return is not a softmax output: not certain
        found.extend(nodes)
    return found


def _local_module_class(model: FileModel, binding: Binding) -> ast.ClassDef | None:
    call = binding.call
    if binding.role is not Role.MODEL or call is None or not isinstance(call.func, ast.Name):
        return None
    if model.qualname(call.func) is not None:
        return None
    return model.class_named(call.func.id)


def _forward_of(model: FileModel, cls: ast.ClassDef) -> ast.FunctionDef | None:
    seen: set[int] = set()
    cur: ast.ClassDef | None = cls
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        fn = model.methods(cur).get("forward")
        if isinstance(fn, ast.FunctionDef):
            return fn
        cur = model.local_base(cur)
    return None
