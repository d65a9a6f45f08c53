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
from trainlint.analysis.arguments import (
    arguments_for,
    parameter_names,
    passed_at,
    passed_for,
    positional_names,
    rebinds,
)
from trainlint.analysis.dominance import dominates
from trainlint.analysis.flow import is_parameter, iterated_from, unpacked_from
from trainlint.analysis.hooks import ANSWERS
from trainlint.analysis.model import FileModel, walk_local
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
        iterated = iterated_from(found[1])
        if iterated is not None:
            return _rows_of(model, found[0], expr, iterated, layer, d, classes)
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


def _rows_of(
    model: FileModel,
    loop: ast.AST,
    name: ast.Name,
    iterated: ast.AST,
    layer: Layer,
    depth: int,
    classes: frozenset[int],
) -> list[ast.AST]:
    """``for row in probs: ... row ...``: a tensor's rows keep its values, so the loop
    target read in the loop's body comes from what ``probs`` comes from. Only a plain
    name target over a tensor expression (not ``enumerate``/``zip``, whose elements are
    tuples, nor a literal list of tensors)."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)) or not isinstance(loop.target, ast.Name):
        return []
    if not isinstance(iterated, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)):
        return []
    if not any(anc is loop for anc in model.ancestors(name)):
        return []  # read after the loop: the last row, or never bound
    return _sources(model, iterated, layer, depth, classes)


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
    if func.id not in parameter_names(fn) or rebinds(fn, func.id):
        return None  # rebound somewhere in the function: the callers' object may be gone
    return ANSWERS.foreign_binding(model, func)


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
        or rebinds(fn, name.id)
    ):
        return []
    found: list[ast.AST] = []
    for _call, arg in arguments_for(model, fn, name.id):
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
    if (
        isinstance(func, ast.Attribute)
        and func.attr == "forward"
        and isinstance(func.value, ast.Name)
        and func.value.id == "self"
    ):
        func = func.value  # `self.forward(x)` runs the module as `self(x)` does
    return _applied(model, func, call, layer, depth, classes, element)


def _applied(
    model: FileModel,
    module: ast.expr,
    call: ast.Call | None,
    layer: Layer,
    depth: int,
    classes: frozenset[int],
    element: tuple[int, int] | None = None,
) -> list[ast.AST]:
    """The layer nodes the output of applying the module object ``module`` certainly
    comes from (``call``: the application, when it is in the file, for the arguments a
    wrapper's ``forward`` applies; ``element``: as in :func:`_module_output`)."""
    if depth > 8:
        return []
    d = depth + 1
    cls: ast.ClassDef | None = None
    if isinstance(module, ast.Call) and element is None:
        # a module built where it is applied or passed: `nn.Sequential(fc, nn.Softmax(1))`
        qual = model.qualname(module.func)
        if qual == layer.module:
            return [module]
        if qual == "torch.nn.Sequential":
            return _last_layer(model, module, layer, d, classes)
        return []
    if isinstance(module, ast.Name) and module.id == "self":
        cls = model.enclosing_class(module)
        if cls is not None and not is_module_class(model, cls):
            return []
    elif isinstance(module, (ast.Name, ast.Attribute)):
        binding = model.roles.lookup(module)
        if element is not None:
            binding = binding if binding is not None and binding.role is Role.MODEL else None
        elif layer.project_flag and any(
            b is not None and getattr(b, layer.project_flag, False)
            for b in (binding, _parameter_at_callers(model, module))
        ):
            return [call if call is not None else module]  # a project model whose
            # `forward` (in its own file) ends in it
        if binding is None:
            return []
        if binding.call is None:
            cls = _own_class(model, binding)  # a parameter every caller fills with one
            if cls is None:
                return []
        elif element is None and binding.qualname == layer.module:
            return [call if call is not None else module]
        elif element is None and binding.qualname == "torch.nn.Sequential":
            return _last_layer(model, binding.call, layer, d, classes)
        elif element is None and call is not None and _applies_at(model, binding) is not None:
            passed = passed_at(call, *_applies_at(model, binding))  # type: ignore[misc]
            return _applied(model, passed, None, layer, d, classes) if passed is not None else []
        else:
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
        passed = _passed_module(model, forward, value, call)
        if passed is not None:  # a wrapper: `return layer(self.drop(x))`
            nodes = _applied(model, passed, None, layer, d, classes | {id(cls)})
        else:
            nodes = _sources(model, value, layer, d, classes | {id(cls)})
        if not nodes:
            return []  # some return is not that layer's output: not certain
        found.extend(nodes)
    return found


def _last_layer(
    model: FileModel, seq: ast.Call, layer: Layer, depth: int, classes: frozenset[int]
) -> list[ast.AST]:
    """The ``layer`` node an ``nn.Sequential(...)``'s output certainly comes from: its
    last module, built there or named (``nn.Sequential(self.fc, self.softmax)``)."""
    last = seq.args[-1] if seq.args and not seq.keywords else None
    if isinstance(last, ast.Call) and model.qualname(last.func) == layer.module:
        return [last]
    if isinstance(last, (ast.Name, ast.Attribute)):
        binding = model.roles.lookup(last)
        if binding is not None and binding.call is not None:
            if binding.qualname == layer.module:
                return [last]
            if binding.qualname == "torch.nn.Sequential" and binding.call is not seq:
                return _last_layer(model, binding.call, layer, depth + 1, classes)
    return []


def _own_class(model: FileModel, binding: object) -> ast.ClassDef | None:
    """The same-file class a binding without a construction call names (a parameter
    the project index says every caller fills with an instance of it)."""
    cls = getattr(binding, "cls", None)
    if not isinstance(cls, str) or getattr(binding, "role", None) is not Role.MODEL:
        return None
    # the index names a class by its last part, as this file's own classes are named
    return model.class_named(cls) if "." not in cls else None


def applied_parameter(forward: ast.FunctionDef | ast.AsyncFunctionDef) -> list[object] | None:
    """[position after ``self``, name] of the parameter of ``forward`` whose application
    every return gives (``def forward(self, x, layer): out = layer(x); return out``),
    read from the tree alone (the project summary keeps it for other files); None when
    a return gives anything else or the parameter is rebound."""
    a = forward.args
    params = [x.arg for x in (*a.posonlyargs, *a.args)][1:]
    assigned: dict[str, list[ast.expr]] = {}
    returns: list[ast.expr | None] = []
    for node in walk_local(forward):
        if isinstance(node, ast.Return):
            returns.append(node.value)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.With)):
            if isinstance(node, ast.Assign):
                targets: list[ast.expr] = node.targets
            elif isinstance(node, ast.With):
                targets = [i.optional_vars for i in node.items if i.optional_vars is not None]
            else:
                targets = [node.target]
            single = isinstance(node, ast.Assign) and len(targets) == 1
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        # only `name = value` says what the name holds; anything else
                        # binds it to something unknown
                        known = single and isinstance(t, ast.Name)
                        held = node.value if known and isinstance(node, ast.Assign) else None
                        assigned.setdefault(n.id, []).append(
                            held if held is not None else ast.Constant(None)
                        )
        elif isinstance(node, ast.NamedExpr):
            assigned.setdefault(node.target.id, []).append(ast.Constant(None))
    if not returns:
        return None
    found: str | None = None
    for value in returns:
        for _ in range(4):
            if isinstance(value, ast.Name) and len(assigned.get(value.id, ())) == 1:
                value = assigned[value.id][0]
            elif (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Attribute)
                and value.func.attr in SAME_VALUES
            ):
                value = value.func.value
            else:
                break
        if not (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name)
            and value.func.id in params
            and value.func.id not in assigned
            and value.func.id in (found or value.func.id)
        ):
            return None
        found = value.func.id
    return [params.index(found), found] if found is not None else None


def _applies_at(model: FileModel, binding: object) -> tuple[int, str] | None:
    """(position, name) of the ``forward`` parameter a project class in another file
    applies (the project index's ``applies``), for an instance ``binding`` names."""
    view = getattr(model, "project", None)
    cls = getattr(binding, "cls", None)
    if not view or not isinstance(cls, str) or getattr(binding, "role", None) is not Role.MODEL:
        return None
    found = view.get("applies", {}).get(cls)
    return (found[0], found[1]) if found else None


def _passed_module(
    model: FileModel, forward: ast.FunctionDef, value: ast.AST, call: ast.Call | None
) -> ast.expr | None:
    """When ``value`` (a ``forward`` return) is the output of a module ``forward`` takes as
    a parameter (``def forward(self, x, layer): return layer(x)``, possibly through a
    name): the argument ``call`` passes for that parameter."""
    if call is None:
        return None
    for _ in range(4):
        if isinstance(value, ast.Name):
            found = model.flow.definition(value.id, value)
            if found is None or is_parameter(found[1]) or not isinstance(found[1], ast.expr):
                return None
            if not dominates(model, found[0], value):
                return None
            value = found[1]
        elif (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Attribute)
            and value.func.attr in SAME_VALUES
            and model.qualname(value.func) is None
        ):
            value = value.func.value
        else:
            break
    if not isinstance(value, ast.Call) or not isinstance(value.func, ast.Name):
        return None
    name = value.func.id
    found = model.flow.definition(name, value)
    if found is None or not is_parameter(found[1]) or rebinds(forward, name):
        return None
    return passed_for(call, positional_names(forward)[1:], name)  # (less `self`)
