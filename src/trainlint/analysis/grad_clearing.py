"""Whether a hand-written gradient clearing (``p.grad = None``, ``del p.grad``,
``p.grad.zero_()``) clears every gradient of the model, or only some of them."""

from __future__ import annotations

import ast

from trainlint.analysis.model import NESTED_SCOPES, FileModel, call_name, dotted
from trainlint.analysis.steps import Event

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
