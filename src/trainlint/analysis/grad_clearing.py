"""Whether a hand-written gradient clearing (``p.grad = None``, ``del p.grad``,
``p.grad.zero_()``) clears every gradient of the model, or only some of them."""

from __future__ import annotations

import ast

from trainlint.analysis.model import NESTED_SCOPES, FileModel, call_name, dotted
from trainlint.analysis.roles import Binding, Role, parameter_owners
from trainlint.analysis.steps import Event, Kind

_PARAMETER_METHODS = ("parameters", "named_parameters")


def clears_some_only(model: FileModel, zero: Event) -> bool:
    """Does the hand-written clearing ``zero`` provably leave other gradients for the
    step: one named tensor (``model.fc.weight.grad = None``), the parameters of a
    submodule (``for p in model.embed.parameters()``), some parameters picked by a test
    (``if "bias" in name``), or any clearing under a test that is not about the gradient
    existing (``if step < freeze_steps``: the first steps on purpose)? A
    ``zero_grad()`` call is never partial here."""
    node = zero.node
    if isinstance(node, ast.Call) and call_name(node) == "zero_grad":
        return False
    grad = _grad_attribute(node)
    if grad is None:
        return False
    owner = grad.value
    if not isinstance(owner, ast.Name):
        return True  # a named tensor of a module: one layer
    loop = _binding_loop(model, node, owner.id)
    if loop is None:
        return False  # a name from elsewhere: cannot tell
    source = _iterated_parameters(loop.iter)
    if source is None:
        return False
    if _is_submodule(source):
        return True
    return any(not _only_tests_existence(g.test) for g, _ in zero.guards)


def misses_optimizer(model: FileModel, zero: Event, step: Event) -> bool:
    """Does the clearing ``zero`` provably leave the gradients ``step`` applies: both are
    calls on two optimizers of this file (``opt_e.zero_grad()``, ``opt_d.step()``) built
    over the parameters of disjoint objects (``E.net.parameters()``, ``D.net.parameters()``:
    neither holds the other)? Any doubt (a module's ``zero_grad()``, an optimizer of
    unknown construction, parameters passed in a list) answers False."""
    if zero.kind is not Kind.ZERO or step.kind is not Kind.STEP:
        return False
    if zero.via is not None or step.via is not None:
        return False
    zeroed = _optimizer_of_call(model, zero.node, "zero_grad")
    stepped = _stepped_optimizer(model, step)
    if zeroed is None or stepped is None or zeroed == stepped:
        return False
    zero_owners = _owner_paths(zeroed)
    step_owners = _owner_paths(stepped)
    if not zero_owners or not step_owners:
        return False
    return not any(_nested(a, b) for a in zero_owners for b in step_owners)


def _optimizer_of_call(model: FileModel, node: ast.AST, method: str) -> Binding | None:
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == method
    ):
        return None
    return _optimizer_binding(model, node.func.value)


def _stepped_optimizer(model: FileModel, step: Event) -> Binding | None:
    node = step.node
    if step.scaled:
        if isinstance(node, ast.Call) and node.args:
            return _optimizer_binding(model, node.args[0])
        return None
    return _optimizer_of_call(model, node, "step")


def _optimizer_binding(model: FileModel, expr: ast.AST) -> Binding | None:
    binding = model.roles.lookup(expr)
    if binding is None or binding.role is not Role.OPTIMIZER or binding.call is None:
        return None
    return binding


def _owner_paths(binding: Binding) -> list[str]:
    """``X`` of each ``X.parameters()`` the optimizer was built over; empty when any
    parameter source is not of that form (a list built elsewhere, a filter)."""
    call = binding.call
    if call is None:
        return []
    owners = parameter_owners(call)
    names = [dotted(o) for o in owners]
    if not names or any(n is None for n in names):
        return []
    return [n for n in names if n is not None]


def _nested(a: str, b: str) -> bool:
    """One parameter source holds the other (``net`` and ``net.head``), or they are one."""
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def _grad_attribute(node: ast.AST) -> ast.Attribute | None:
    targets: list[ast.AST] = []
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, ast.AnnAssign):
        targets = [node.target]
    elif isinstance(node, ast.Delete):
        targets = list(node.targets)
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        targets = [node.func.value]
    for t in targets:
        if isinstance(t, ast.Attribute) and t.attr == "grad":
            return t
    return None


def _binding_loop(model: FileModel, node: ast.AST, name: str) -> ast.For | None:
    for anc in model.ancestors(node):
        if isinstance(anc, NESTED_SCOPES):
            return None
        if isinstance(anc, ast.For):
            bound = anc.target.elts[-1] if isinstance(anc.target, ast.Tuple) else anc.target
            if isinstance(bound, ast.Name) and bound.id == name:
                return anc
    return None


def _iterated_parameters(it: ast.AST) -> ast.AST | None:
    """``X`` of ``for p in X.parameters()`` (through ``enumerate``); None otherwise."""
    while isinstance(it, ast.Call) and call_name(it) == "enumerate" and it.args:
        it = it.args[0]
    if (
        isinstance(it, ast.Call)
        and isinstance(it.func, ast.Attribute)
        and it.func.attr in _PARAMETER_METHODS
    ):
        return it.func.value
    return None


def _is_submodule(source: ast.AST) -> bool:
    """``model.embed`` / ``self.model.head``: an attribute of a module, not the module a
    trainer keeps as ``self.model``."""
    name = dotted(source)
    if name is None:
        return False
    parts = name.split(".")
    if parts[0] == "self":
        parts = parts[1:]
    return len(parts) >= 2


def _only_tests_existence(test: ast.AST) -> bool:
    """``p.grad is not None`` (and nothing else)."""
    return isinstance(test, ast.Compare) and all(
        isinstance(op, (ast.Is, ast.IsNot)) for op in test.ops
    ) and any(
        isinstance(n, ast.Attribute) and n.attr == "grad" for n in ast.walk(test.left)
    )
