"""TL105 backward-under-no-grad."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.flow import grad_enabled_at
from trainlint.analysis.model import FileModel, call_name, dotted
from trainlint.analysis.roles import Role
from trainlint.analysis.steps import backward_calls, backward_value
from trainlint.rules.base import Invalid, Report, Rule

_LOSS_FUNCS = ("loss", "cross_entropy", "nll", "mse", "l1", "kl_div", "bce", "huber", "hinge",
               "margin", "triplet", "ctc", "focal", "dice")


def _is_loss_or_output(model: FileModel, value: ast.AST) -> bool:
    """A loss-function or model call (what carries the graph a backward needs)."""
    if not isinstance(value, ast.Call):
        return False
    if model.flow._is_model_call(value.func):
        return True
    if model.roles.role(value.func) is Role.CRITERION:
        return True
    qual = model.qualname(value.func) or ""
    name = (call_name(value) or "").lower()
    return qual.startswith("torch.nn.functional.") and any(w in name for w in _LOSS_FUNCS) or (
        "loss" in name or name in ("criterion", "loss_fn")
    )


class BackwardUnderNoGrad(Rule):
    """## What it does
    Flags `backward()` inside `torch.no_grad()` / `torch.inference_mode()` (a `with` block
    or a decorated function), and `backward()` on a loss that was computed inside one.

    ## Why is this bad?
    Under no-grad nothing records a graph: the loss has no `grad_fn`, so `backward()`
    either raises, or, when some other term still requires grad (a regulariser on the
    parameters), silently backpropagates only that term. The model's main weights
    never receive a gradient.

    ## Example
    ```python
    with torch.no_grad():
        loss = criterion(model(x), y)
    loss.backward()
    ```

    ## Use instead
    ```python
    loss = criterion(model(x), y)
    loss.backward()
    ```

    ## References
    - [Locally disabling gradient computation](https://pytorch.org/docs/stable/notes/autograd.html#locally-disabling-gradient-computation)
    """

    code = "TL105"
    name = "backward-under-no-grad"
    message = (
        "`backward()` on a value computed without autograd recording (`no_grad`/`inference_mode`): compute the loss outside that block"
    )
    triggers = ("no_grad", "inference_mode", "set_grad_enabled")
    confirm_with = "assert_grads_nonzero"
    valid = [
        """
import torch
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
    with torch.no_grad():
        ema.update(model)
""",
        # enable_grad inside no_grad re-enables recording
        """
import torch
with torch.no_grad():
    with torch.enable_grad():
        loss = model(x).sum()
        loss.backward()
""",
        # evaluation under no_grad, training loss recomputed outside
        """
import torch
with torch.no_grad():
    loss = criterion(model(xv), yv)
loss = criterion(model(x), y)
loss.backward()
""",
        # shadowed: a local `torch` object
        """
def run(torch, model, x):
    with torch.no_grad():
        model(x).sum().backward()
""",
        # no torch
        """
with no_grad():
    job.backward()
""",
    ]
    invalid = [
        Invalid(
            """
import torch
with torch.no_grad():
    loss = criterion(model(x), y)
loss.backward()
""",
            line=4,
        ),
        Invalid(
            """
from torch import inference_mode

@inference_mode()
def train_step(model, opt, batch):
    loss = model(batch).mean()
    loss.backward()
    opt.step()
""",
            line=6,
        ),
        Invalid(
            """
import torch as T
for x, y in loader:
    with T.set_grad_enabled(False):
        out = model(x)
        loss = crit(out, y) + reg
        loss.backward()
""",
            line=6,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        for call in backward_calls(model):
            enabled, _ = grad_enabled_at(model, call)
            if not enabled:
                yield self.report(call)
                continue
            value = backward_value(model, call)
            if value is not None and self._computed_without_grad(model, value, call):
                yield self.report(call)

    @staticmethod
    def _computed_without_grad(model: FileModel, value: ast.AST, call: ast.Call) -> bool:
        """The loss itself, or one of its additive terms that is a loss or model output,
        was assigned inside a no-grad block of the same function."""
        fn = model.function_of(call)
        names = []
        if isinstance(value, (ast.Name, ast.Attribute)):
            names.append(value)
        for term in model.flow.terms(value):
            if isinstance(term, ast.Name) and term not in names:
                names.append(term)
        for ref in names:
            name = dotted(ref)
            found = model.flow.definition(name, ref) if name else None
            if found is None:
                continue
            stmt, val = found
            if not isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                continue
            if model.function_of(stmt) is not fn or grad_enabled_at(model, stmt)[0]:
                continue
            if ref is value or _is_loss_or_output(model, val):
                return True
        return False
