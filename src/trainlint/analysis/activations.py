"""Which output layer an expression's value certainly comes from: a sigmoid, or a bare
linear layer (raw logits).

The same question :mod:`softmax` answers for softmax, asked for other last layers. The
layer may be applied directly, through a name, by a module instance (`nn.Sigmoid()`,
`nn.Linear(...)`), as the last layer of an `nn.Sequential`, or as every return value of a
same-file model's `forward`. When any of those is uncertain the answer is [].
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from trainlint.analysis.dominance import dominates
from trainlint.analysis.model import FileModel, walk_local
from trainlint.analysis.roles import Role
from trainlint.analysis.softmax import SAME_VALUES


@dataclass(frozen=True)
class Layer:
    """How one kind of last layer is spelled."""

    funcs: frozenset[str]  # functional forms: `torch.sigmoid(x)`
    module: str  # the module class: `torch.nn.Sigmoid`
    method: str | None = None  # the argument-less tensor method: `x.sigmoid()`


SIGMOID = Layer(
    frozenset({"torch.sigmoid", "torch.nn.functional.sigmoid", "torch.special.expit"}),
    "torch.nn.Sigmoid",
    "sigmoid",
)
LINEAR = Layer(frozenset({"torch.nn.functional.linear"}), "torch.nn.Linear")

# Methods that keep a tensor's values, minus the casts a model may use to leave its graph
# dtype: reshaping a probability keeps it a probability, and logits stay logits.
_KEEP = SAME_VALUES


def layer_sources(model: FileModel, expr: ast.AST, layer: Layer) -> list[ast.AST]:
    """The ``layer`` node(s) whose output ``expr`` certainly is; [] when not certain."""
    return _sources(model, expr, layer, 0, frozenset())


def _sources(model: FileModel, expr: ast.AST, layer: Layer, depth: int,
             classes: frozenset[int]) -> list[ast.AST]:
    if depth > 8:
        return []
    d = depth + 1
    if isinstance(expr, ast.Subscript):
        return _sources(model, expr.value, layer, d, classes)
    if isinstance(expr, ast.Name):
        found = model.flow.definition(expr.id, expr)
        if found is None or not isinstance(found[1], ast.expr):
            return []
        if not dominates(model, found[0], expr):
            return []
        return _sources(model, found[1], layer, d, classes)
    if not isinstance(expr, ast.Call):
        return []
    func = expr.func
    qual = model.qualname(func)
    if qual in layer.funcs:
        return [expr]
    if isinstance(func, ast.Attribute) and qual is None:
        if layer.method and func.attr == layer.method and not expr.args and not expr.keywords:
            return [expr]
        if func.attr in _KEEP:
            return _sources(model, func.value, layer, d, classes)
    if isinstance(func, ast.Call) and model.qualname(func.func) == layer.module:
        return [expr]  # nn.Sigmoid()(x)
    return _module_output(model, expr, layer, d, classes)


def _module_output(model: FileModel, call: ast.Call, layer: Layer, depth: int,
                   classes: frozenset[int]) -> list[ast.AST]:
    func = call.func
    cls: ast.ClassDef | None = None
    if isinstance(func, ast.Name) and func.id == "self":
        cls = model.enclosing_class(func)
        if cls is not None and not model.roles.is_module_class(cls):
            return []
    elif isinstance(func, (ast.Name, ast.Attribute)):
        binding = model.roles.lookup(func)
        if binding is None or binding.call is None:
            return []
        if binding.qualname == layer.module:
            return [call]
        if binding.qualname == "torch.nn.Sequential":
            last = binding.call.args[-1] if binding.call.args else None
            if isinstance(last, ast.Call) and model.qualname(last.func) == layer.module:
                return [last]
            return []
        ctor = binding.call
        if (binding.role is not Role.MODEL or not isinstance(ctor.func, ast.Name)
                or model.qualname(ctor.func) is not None):
            return []
        cls = model.class_named(ctor.func.id)
    if cls is None or id(cls) in classes:
        return []
    forward = model.method_of(cls, "forward")
    if not isinstance(forward, ast.FunctionDef):
        return []
    returns = [n for n in walk_local(forward) if isinstance(n, ast.Return)]
    if not returns:
        return []
    found: list[ast.AST] = []
    for ret in returns:
        if ret.value is None:
            return []
        nodes = _sources(model, ret.value, layer, depth, classes | {id(cls)})
        if not nodes:
            return []  # some return is not that layer's output: not certain
        found.extend(nodes)
    return found
