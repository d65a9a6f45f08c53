"""Training-step structure: step events, step loops, iteration paths, rate-limit guards.

Placeholder for the step model built in the next layer; the event classifier
lives here already because every family of rules asks "is this a backward?".
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from trainlint.analysis.model import call_name

if TYPE_CHECKING:
    from trainlint.analysis.model import FileModel

AUTOGRAD_BACKWARD = "torch.autograd.backward"
AUTOGRAD_GRAD = "torch.autograd.grad"


def is_backward(model: FileModel, call: ast.Call) -> bool:
    """``x.backward()``, ``scaler.scale(l).backward()``, ``accelerator.backward(l)``,
    ``self.manual_backward(l)``, ``torch.autograd.backward(l)``."""
    name = call_name(call)
    if name in ("backward", "manual_backward"):
        if isinstance(call.func, ast.Attribute):
            return True
        return model.qualname(call.func) == AUTOGRAD_BACKWARD
    return False


def is_autograd_grad(model: FileModel, call: ast.Call) -> bool:
    return call_name(call) == "grad" and model.qualname(call.func) == AUTOGRAD_GRAD


def backward_calls(model: FileModel) -> list[ast.Call]:
    return [c for c in model.calls.get("backward", ()) if is_backward(model, c)] + [
        c for c in model.calls.get("manual_backward", ()) if is_backward(model, c)
    ]


def graph_uses(model: FileModel) -> list[ast.Call]:
    """Calls that traverse an autograd graph: backward in every form and autograd.grad."""
    uses = backward_calls(model)
    uses += [c for c in model.calls.get("grad", ()) if is_autograd_grad(model, c)]
    return sorted(uses, key=lambda c: (c.lineno, c.col_offset))


def backward_value(model: FileModel, call: ast.Call) -> ast.expr | None:
    """The tensor whose graph a backward/grad call traverses."""
    func = call.func
    name = call_name(call)
    if isinstance(func, ast.Attribute) and name == "backward":
        qual = model.qualname(func)
        if qual == AUTOGRAD_BACKWARD:
            return call.args[0] if call.args else None
        receiver = func.value
        # accelerator.backward(loss) / fabric.backward(loss): the loss is the argument.
        if call.args and not _looks_like_tensor_receiver(receiver):
            return call.args[0]
        return receiver
    if name == "manual_backward" or model.qualname(func) in (AUTOGRAD_BACKWARD, AUTOGRAD_GRAD):
        if call.args:
            return call.args[0]
        for kw in call.keywords:
            if kw.arg in ("tensors", "outputs"):
                return kw.value
    return None


def _looks_like_tensor_receiver(node: ast.expr) -> bool:
    from trainlint.analysis.model import dotted

    name = dotted(node) or ""
    last = name.rsplit(".", 1)[-1].lower()
    return not any(k in last for k in ("accelerator", "fabric", "engine", "trainer", "strategy"))
