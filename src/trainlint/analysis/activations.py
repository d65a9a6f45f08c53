"""Which output layer an expression's value certainly comes from: a softmax, a sigmoid,
or a bare linear layer (raw logits). One query for every "activation feeding a loss" rule
(TL602, TL605).

The layer may be applied directly, through a name, by a module instance (`nn.Softmax()`,
`nn.Sigmoid()`, `nn.Linear(...)`), as the last layer of an `nn.Sequential`, as every
return value of a same-file model's `forward` (inherited from a same-file base too), or,
for softmax, by a project model whose `forward` in another file returns one (the project
index marks its binding). When any of those is uncertain the answer is [].
"""

from __future__ import annotations

import ast
from collections.abc import Callable

from trainlint._record import Record
from trainlint.analysis.dominance import dominates
from trainlint.analysis.flow import is_parameter, unpacked_from
from trainlint.analysis.hooks import ANSWERS
from trainlint.analysis.model import FileModel, keyword, walk_local
from trainlint.analysis.roles import Role, is_module_class

# Methods that keep a tensor's values (reshaping, casting, selecting): probabilities stay
# probabilities and logits stay logits through them (`.view(-1, C)`, `.float()`).
SAME_VALUES = frozenset(
    {
        "view",
        "reshape",
        "flatten",
        "squeeze",
        "unsqueeze",
        "permute",
        "transpose",
        "contiguous",
        "float",
        "double",
        "half",
        "bfloat16",
        "to",
        "type",
        "clone",
        "gather",
        "view_as",
        "reshape_as",
        "cuda",
        "cpu",
    }
)


def _no_arguments(call: ast.Call) -> bool:
    return not call.args and not call.keywords


def _int_literal(node: ast.AST) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return isinstance(node, ast.Constant) and type(node.value) is int


def _dim_only(call: ast.Call) -> bool:
    """``t.softmax(-1)`` / ``t.softmax(dim=1)``, told apart from an unresolved
    ``F.softmax(t, 1)`` (a shadowed module) by its arguments."""
    kws = {k.arg for k in call.keywords}
    if not kws <= {"dim", "dtype"}:
        return False
    if not call.args:
        return "dim" in kws
    return len(call.args) == 1 and _int_literal(call.args[0]) and "dim" not in kws


class Layer(Record, frozen=True):
    """How one kind of last layer is spelled."""

    __slots__ = ("funcs", "module", "method", "method_args", "project_flag", "log_form")

    funcs: frozenset[str]  # functional forms: `torch.sigmoid(x)`
    module: str  # the module class: `torch.nn.Sigmoid`
    method: str | None  # the tensor method: `x.sigmoid()`
    method_args: Callable[[ast.Call], bool]  # which calls of it count
    project_flag: str | None  # the binding attribute the project index sets
    log_form: Layer | None  # the layer whose `exp` is this one: `exp(log_softmax(x))`

    def __init__(
        self,
        funcs: frozenset[str],
        module: str,
        method: str | None = None,
        method_args: Callable[[ast.Call], bool] = _no_arguments,
        project_flag: str | None = None,
        log_form: Layer | None = None,
    ) -> None:
        self.funcs = funcs
        self.module = module
        self.method = method
        self.method_args = method_args
        self.project_flag = project_flag
        self.log_form = log_form


# The log forms: exponentiating them gives back the probabilities.
LOG_SOFTMAX = Layer(
    frozenset({"torch.nn.functional.log_softmax", "torch.log_softmax", "torch.special.log_softmax"}),
    "torch.nn.LogSoftmax",
    "log_softmax",
    _dim_only,
)
LOG_SIGMOID = Layer(frozenset({"torch.nn.functional.logsigmoid"}), "torch.nn.LogSigmoid")


SOFTMAX = Layer(
    frozenset({"torch.nn.functional.softmax", "torch.softmax", "torch.special.softmax"}),
    "torch.nn.Softmax",
    "softmax",
    _dim_only,
    "softmax",
    LOG_SOFTMAX,
)
SIGMOID = Layer(
    frozenset({"torch.sigmoid", "torch.nn.functional.sigmoid", "torch.special.expit"}),
    "torch.nn.Sigmoid",
    "sigmoid",
    log_form=LOG_SIGMOID,
)
LINEAR = Layer(frozenset({"torch.nn.functional.linear"}), "torch.nn.Linear")


def layer_sources(model: FileModel, expr: ast.AST, layer: Layer) -> list[ast.AST]:
    """The ``layer`` node(s) whose output ``expr`` certainly is; [] when not certain."""
    return _sources(model, expr, layer, 0, frozenset())


def _sources(
    model: FileModel, expr: ast.AST, layer: Layer, depth: int, classes: frozenset[int]
) -> list[ast.AST]:
    if depth > 8:
        return []
    d = depth + 1
    if isinstance(expr, ast.Subscript):
        return _sources(model, expr.value, layer, d, classes)
    if isinstance(expr, ast.Name):
        found = model.flow.definition(expr.id, expr)
        if found is None:
            return []
        if is_parameter(found[1]):
            return _from_callers(model, expr, layer, d, classes)
        unpacked = unpacked_from(found[1])
        if unpacked is not None and dominates(model, found[0], expr):
            call, index, arity = unpacked  # `validity, label = self.discriminator(x)`
            return _module_output(model, call, layer, d, classes, (index, arity))
        if not isinstance(found[1], ast.expr):
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
    if layer.log_form is not None and _exp_of(model, expr, qual, layer.log_form, d, classes):
        return [expr]  # `torch.exp(log_softmax(x))` is a softmax, spelled twice
    if isinstance(func, ast.Attribute) and qual is None:
        if layer.method and func.attr == layer.method and layer.method_args(expr):
            return [expr]
        if func.attr in SAME_VALUES:
            return _sources(model, func.value, layer, d, classes)
    if isinstance(func, ast.Call) and model.qualname(func.func) == layer.module:
        return [expr]  # nn.Sigmoid()(x)
    return _module_output(model, expr, layer, d, classes)


def _exp_of(
    model: FileModel,
    call: ast.Call,
    qual: str | None,
    log_form: Layer,
    depth: int,
    classes: frozenset[int],
) -> bool:
    """``call`` is ``torch.exp(y)`` / ``y.exp()`` with ``y`` certainly ``log_form``'s output."""
    if qual == "torch.exp" and len(call.args) == 1 and not call.keywords:
        inner: ast.AST = call.args[0]
    elif (
        qual is None
        and isinstance(call.func, ast.Attribute)
        and call.func.attr == "exp"
        and _no_arguments(call)
    ):
        inner = call.func.value
    else:
        return False
    return bool(_sources(model, inner, log_form, depth, classes))


def _parameter_at_callers(model: FileModel, func: ast.expr) -> object | None:
    """What every call site passes for the parameter ``func`` names, when the function
    never rebinds it: the local binding (`model.parameters()` into an optimizer makes it
    some model) does not say which class, the callers in other files do."""
    if not isinstance(func, ast.Name) or not model.project:
        return None
    fn = model.function_of(func)
    if fn is None or not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    a = fn.args
    if func.id not in {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)}:
        return None
    for node in walk_local(fn):
        if isinstance(node, ast.Name) and node.id == func.id and not isinstance(node.ctx, ast.Load):
            return None  # rebound somewhere in the function: the callers' object may be gone
    return ANSWERS.foreign_binding(model, func)


def _rebound(fn: ast.AST, name: str) -> bool:
    return any(
        isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Load)
        for n in walk_local(fn)
    )


def _from_callers(
    model: FileModel, name: ast.Name, layer: Layer, depth: int, seen: frozenset[int]
) -> list[ast.AST]:
    """A helper's parameter (``def aux_loss(self, pred, y): return F.cross_entropy(pred,
    y)``): the layer nodes whose output some same-file call passes it, each one certain
    at its call. A ``forward`` is left out: what a model returns must hold for every
    caller, not for one."""
    fn = model.function_of(name)
    if (
        not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
        or fn.name in ("forward", "__call__")
        or id(fn) in seen
        or _rebound(fn, name.id)
    ):
        return []
    a = fn.args
    positional = [x.arg for x in (*a.posonlyargs, *a.args)]
    found: list[ast.AST] = []
    for call in model.calls.get(fn.name, ()):
        if model.resolve_call(call) is not fn:
            continue
        params = positional
        if isinstance(call.func, ast.Attribute) and params[:1] in (["self"], ["cls"]):
            params = params[1:]  # `self.aux_loss(pred, y)`
        arg: ast.AST | None = keyword(call, name.id)
        if arg is None and name.id in params:
            i = params.index(name.id)
            before = call.args[: i + 1]
            if len(call.args) > i and not any(isinstance(x, ast.Starred) for x in before):
                arg = call.args[i]
        if arg is not None:
            found.extend(_sources(model, arg, layer, depth, seen | {id(fn)}))
    return found


def _module_output(
    model: FileModel,
    call: ast.Call,
    layer: Layer,
    depth: int,
    classes: frozenset[int],
    element: tuple[int, int] | None = None,
) -> list[ast.AST]:
    """The layer nodes ``call``'s output certainly comes from; with ``element`` (position,
    count), those of that element of the tuple every ``forward`` return builds."""
    func = call.func
    cls: ast.ClassDef | None = None
    if isinstance(func, ast.Name) and func.id == "self":
        cls = model.enclosing_class(func)
        if cls is not None and not is_module_class(model, cls):
            return []
    elif isinstance(func, (ast.Name, ast.Attribute)):
        binding = model.roles.lookup(func)
        if element is not None:
            binding = binding if binding is not None and binding.role is Role.MODEL else None
        elif layer.project_flag and any(
            b is not None and getattr(b, layer.project_flag, False)
            for b in (binding, _parameter_at_callers(model, func))
        ):
            return [call]  # a project model whose `forward` (in its own file) ends in it
        if binding is None or binding.call is None:
            return []
        if element is None and binding.qualname == layer.module:
            return [call]
        if element is None and binding.qualname == "torch.nn.Sequential":
            last = binding.call.args[-1] if binding.call.args else None
            if isinstance(last, ast.Call) and model.qualname(last.func) == layer.module:
                return [last]
            return []
        ctor = binding.call
        if (
            binding.role is not Role.MODEL
            or not isinstance(ctor.func, ast.Name)
            or model.qualname(ctor.func) is not None
        ):
            return []
        cls = model.class_named(ctor.func.id)
    if cls is None or id(cls) in classes:
        return []
    forward = model.method_of(cls, "forward")  # also inherited from a same-file base
    if not isinstance(forward, ast.FunctionDef):
        return []
    returns = [n for n in walk_local(forward) if isinstance(n, ast.Return)]
    if not returns:
        return []
    found: list[ast.AST] = []
    for ret in returns:
        value = ret.value
        if value is None:
            return []
        if element is not None:
            index, arity = element
            if not isinstance(value, ast.Tuple) or len(value.elts) != arity:
                return []
            value = value.elts[index]
        nodes = _sources(model, value, layer, depth, classes | {id(cls)})
        if not nodes:
            return []  # some return is not that layer's output: not certain
        found.extend(nodes)
    return found
