"""Is a name's value the same on every iteration of a loop?

Answered conservatively for local names: not when the loop (its target, its body, nested
loops and comprehensions in it) binds the name, when a function of the file may rebind it
through ``global``/``nonlocal``, or when the loop may change the object in place (item or
attribute assignment, an in-place method, a method of unknown effect, or the object handed
to a call that is not a known read-only one).
"""

from __future__ import annotations

import ast

from trainlint.analysis.model import FileModel, walk_local
from trainlint.analysis.roles import Role

# Methods that read a tensor or module without changing it (or make a new object).
READ_ONLY_METHODS = frozenset(
    {
        "to",
        "cuda",
        "cpu",
        "float",
        "double",
        "half",
        "bfloat16",
        "long",
        "int",
        "bool",
        "size",
        "dim",
        "numel",
        "view",
        "reshape",
        "expand",
        "expand_as",
        "view_as",
        "reshape_as",
        "unsqueeze",
        "squeeze",
        "permute",
        "transpose",
        "t",
        "contiguous",
        "clone",
        "detach",
        "type",
        "type_as",
        "repeat",
        "flatten",
        "sum",
        "mean",
        "max",
        "min",
        "norm",
        "pow",
        "sqrt",
        "exp",
        "log",
        "abs",
        "index_select",
        "gather",
        "masked_select",
        "chunk",
        "split",
        "narrow",
        "numpy",
        "tolist",
        "item",
        "get",
        "keys",
        "values",
        "items",
        "parameters",
        "named_parameters",
        "state_dict",
        "forward",
        "eval",
        "train",
    }
)
# Functions that only read their arguments.
_READ_ONLY_BUILTINS = frozenset(
    {
        "len",
        "isinstance",
        "print",
        "float",
        "int",
        "str",
        "repr",
        "tuple",
        "list",
        "range",
        "enumerate",
        "zip",
        "getattr",
        "hasattr",
        "type",
        "id",
        "max",
        "min",
        "sum",
        "abs",
    }
)


def invariant_in(model: FileModel, loop: ast.AST, name: str) -> bool:
    """Does ``name`` hold the same, unchanged object on every iteration of ``loop``?"""
    if _rebound_elsewhere(model, name):
        return False
    for node in ast.walk(loop):
        if node is getattr(loop, "iter", None):
            continue
        if isinstance(node, ast.Name) and node.id == name:
            if not isinstance(node.ctx, ast.Load):
                return False
            if not _read_only_use(model, node):
                return False
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == name:
                return False
        elif isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
            return False
    return True


def _rebound_elsewhere(model: FileModel, name: str) -> bool:
    """A function of the file declares the name ``global``/``nonlocal``: a helper called
    in the loop may rebind it."""

    def build(m: FileModel) -> frozenset[str]:
        out: set[str] = set()
        for fn in m.functions:
            for node in walk_local(fn):
                if isinstance(node, (ast.Global, ast.Nonlocal)):
                    out.update(node.names)
        return frozenset(out)

    return name in model.memo("invariants.rebound_names", build)


def _read_only_use(model: FileModel, node: ast.Name) -> bool:
    parent = model.parent_of(node)
    if isinstance(parent, ast.Attribute):
        if not isinstance(parent.ctx, ast.Load):
            return False  # `x.attr = ...`
        grand = model.parent_of(parent)
        if isinstance(grand, ast.Call) and grand.func is parent:
            return parent.attr in READ_ONLY_METHODS
        if isinstance(grand, ast.Attribute) and grand.attr.endswith("_"):
            return False  # `x.data.zero_()`
        return parent.attr not in ("data", "grad") or _attr_read_only(model, parent)
    if isinstance(parent, ast.Subscript):
        return isinstance(parent.ctx, ast.Load)
    if isinstance(parent, ast.keyword):
        parent = model.parent_of(parent)
    if isinstance(parent, ast.Call):
        if parent.func is node:
            return True  # calling it (a model's forward) leaves it where it is
        return _read_only_callee(model, parent)
    return True


def _attr_read_only(model: FileModel, attr: ast.Attribute) -> bool:
    grand = model.parent_of(attr)
    if isinstance(grand, ast.Subscript) and not isinstance(grand.ctx, ast.Load):
        return False
    if isinstance(grand, ast.Attribute):
        call = model.parent_of(grand)
        if isinstance(call, ast.Call) and call.func is grand:
            return grand.attr in READ_ONLY_METHODS
    return True


def _calls_read_only(model: FileModel, func: ast.Name) -> bool:
    """``name(...)``: calling a model or a criterion does not change it."""
    binding = model.roles.lookup(func)
    return binding is not None and binding.role in (Role.MODEL, Role.CRITERION)


def _read_only_callee(model: FileModel, call: ast.Call) -> bool:
    func = call.func
    qual = model.qualname(func)
    if qual is not None:
        last = qual.rsplit(".", 1)[-1]
        if qual.startswith("builtins."):
            return last in _READ_ONLY_BUILTINS
        return (
            qual.startswith("torch.")
            and not last.endswith("_")
            and "out" not in {k.arg for k in call.keywords}
        )
    if isinstance(func, ast.Name) and func.id in _READ_ONLY_BUILTINS:
        return True
    if isinstance(func, (ast.Name, ast.Attribute)):
        return (
            _calls_read_only(model, func)
            if isinstance(func, ast.Name)
            else (model.roles.role(func) in (Role.MODEL, Role.CRITERION))
        )
    return False
