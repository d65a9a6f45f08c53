"""TL105 backward-under-no-grad."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.context import demonstrates_error
from trainlint.analysis.flow import grad_enabled_at
from trainlint.analysis.model import FileModel, call_name, dotted
from trainlint.analysis.roles import Role
from trainlint.analysis.steps import backward_calls, backward_value
from trainlint.rules.base import Invalid, Report, Rule

_LOSS_FUNCS = (
    "loss",
    "cross_entropy",
    "nll",
    "mse",
    "l1",
    "kl_div",
    "bce",
    "huber",
    "hinge",
    "margin",
    "triplet",
    "ctc",
    "focal",
    "dice",
)


def _is_loss_or_output(model: FileModel, value: ast.AST) -> bool:
    """A loss-function or model call (what carries the graph a backward needs)."""
    if not isinstance(value, ast.Call):
        return False
    if model.flow.is_model_call(value.func):
        return True
    if model.roles.role(value.func) is Role.CRITERION:
        return True
    qual = model.qualname(value.func) or ""
    name = (call_name(value) or "").lower()
    return (
        qual.startswith("torch.nn.functional.")
        and any(w in name for w in _LOSS_FUNCS)
        or ("loss" in name or name in ("criterion", "loss_fn"))
    )


class BackwardUnderNoGrad(Rule):
    """## What it does
    Flags `backward()` on a loss computed without autograd recording: inside
    `torch.no_grad()` / `torch.inference_mode()` (a `with` block or a decorated
    function), or assigned inside one and backpropagated later. A `backward()` that only
    *runs* under no-grad, on a loss computed outside, is fine and not reported; nor is a
    frozen model's output under no-grad added to a loss that still carries the graph.

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
    message = "`backward()` on a value computed without autograd recording (`no_grad`/`inference_mode`): compute the loss outside that block"
    triggers = ("no_grad", "inference_mode", "set_grad_enabled")
    confirm_with = "assert_grads_nonzero"
    valid = [
        # a tutorial showing that backward fails on a result computed without grad
        """
import torch
net = torch.nn.Linear(3, 1)
with torch.no_grad():
    y = net(torch.ones(2, 3)).sum()
try:
    y.backward()
except RuntimeError as err:
    print("no graph to go back through:", err)
""",
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
        # backward itself under no_grad, on a loss computed outside: valid, and done on
        # purpose so the clip that follows is not recorded
        """
import torch
for batch in loader:
    loss = model.training_step(batch)
    optimizer.zero_grad()
    with torch.no_grad():
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
""",
        # a frozen model's output under no_grad, added to the trained model's loss
        """
import torch
from transformers import AutoModel, AutoModelForCausalLM
student = AutoModelForCausalLM.from_pretrained("student")
teacher = AutoModel.from_pretrained("teacher").eval()
for batch in loader:
    out = student(**batch)
    with torch.no_grad():
        penalty = teacher(out.loss)
    loss = out.loss + penalty
    accelerator.backward(loss)
    optimizer.step()
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
        # the model's loss under no_grad, a parameter penalty added outside: only the
        # penalty backpropagates
        Invalid(
            """
import torch
for x, y in loader:
    with torch.no_grad():
        out = model(x)
        loss = criterion(out, y)
    penalty = sum(p.pow(2).sum() for p in model.parameters())
    (loss + 1e-4 * penalty).backward()
""",
            line=7,
        ),
        # the model output under no_grad, its loss attribute backpropagated there
        Invalid(
            """
import torch
for batch in loader:
    with torch.no_grad():
        out = model(**batch)
        accelerator.backward(out.loss)
""",
            line=5,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        for call in backward_calls(model):
            value = backward_value(model, call)
            if value is None:
                continue
            # `backward()` itself works under no_grad (d2l runs it there on purpose, so
            # the clip that follows is not recorded): what matters is where the loss
            # was computed, right here in the block or in a no-grad assignment.
            here = not grad_enabled_at(model, call)[0] and _computes_output(model, value)
            if (here or self._computed_without_grad(model, value, call)) and not (
                demonstrates_error(model, call)
            ):
                yield self.report(call)

    @staticmethod
    def _computed_without_grad(model: FileModel, value: ast.AST, call: ast.Call) -> bool:
        """The loss itself, or one of its additive terms that is a loss or model output,
        was assigned inside a no-grad block of the same function, and no other term
        carries the graph."""
        fn = model.function_of(call)
        names = []
        if isinstance(value, (ast.Name, ast.Attribute)):
            names.append(value)
        elif isinstance(value, ast.Call):  # `scaler.scale(loss)`: the loss is an argument
            names.extend(a for a in value.args if isinstance(a, (ast.Name, ast.Attribute)))
        terms = model.flow.terms(value)
        for term in terms:
            if isinstance(term, ast.Name) and term not in names:
                names.append(term)
        for ref in names:
            name = dotted(ref)
            found = model.flow.definition(name, ref) if name else None
            root: ast.expr = ref
            while found is None and isinstance(root, ast.Attribute):
                root = root.value  # `out.loss`: follow `out`
                found = model.flow.definition(root.id, root) if isinstance(root, ast.Name) else None
            if found is None:
                continue
            stmt, val = found
            if not isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                continue
            if model.function_of(stmt) is not fn or grad_enabled_at(model, stmt)[0]:
                continue
            if ref is value:
                return True
            if _is_loss_or_output(model, val):
                # a frozen model's output added as a constant next to the trained
                # model's loss: the sum still backpropagates into the trained model
                return not any(_carries_graph(model, t, fn) for t in terms if t is not ref)
        return False


def _computes_output(model: FileModel, value: ast.AST) -> bool:
    """``value`` is a loss or model output itself (a name assigned here, or an inline
    model/loss call such as ``model(x).sum()``), not something merely passed along."""
    for sub in ast.walk(value):
        if isinstance(sub, ast.Call) and _is_loss_or_output(model, sub):
            return True
    return False


def _carries_graph(model: FileModel, term: ast.AST, fn: ast.AST | None) -> bool:
    """A loss term computed with grad enabled from a model output or a loss call
    (``outputs.loss``, ``criterion(out, y)``)."""
    node = term
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    if isinstance(node, ast.Call):
        return grad_enabled_at(model, node)[0] and _is_loss_or_output(model, node)
    if isinstance(node, ast.Name):
        found = model.flow.definition(node.id, node)
        if found is None or model.function_of(found[0]) is not fn:
            return False
        stmt, val = found
        return grad_enabled_at(model, stmt)[0] and _is_loss_or_output(model, val)
    return False
