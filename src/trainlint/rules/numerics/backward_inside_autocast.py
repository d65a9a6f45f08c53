"""TL603 backward-inside-autocast."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.model import FileModel, is_false, keyword
from trainlint.analysis.steps import backward_calls
from trainlint.edits import dedent_intent, sibling_ancestor
from trainlint.findings import Applicability, Fix
from trainlint.rules.base import Invalid, Report, Rule

_AUTOCAST_ENABLED_ARG = {
    # position of `enabled` among the positional arguments
    "torch.autocast": 2,
    "torch.amp.autocast": 2,
    "torch.cuda.amp.autocast": 0,
    "torch.cpu.amp.autocast": 0,
}


def _autocast_enabled(model: FileModel, expr: ast.AST, depth: int = 0) -> bool | None:
    """True for an autocast context/decorator that may be enabled, False for one literally
    disabled (``enabled=False``), None for anything else. A name is followed to its
    definition: nanoGPT's ``ctx = nullcontext() if cpu else torch.amp.autocast(...)``
    is an autocast region whenever it matters."""
    if isinstance(expr, ast.Name) and depth == 0:
        found = model.flow.definition(expr.id, expr)
        if found is None or not isinstance(found[1], (ast.Call, ast.IfExp)):
            return None
        value = found[1]
        if isinstance(value, ast.IfExp):
            states = [_autocast_enabled(model, b, 1) for b in (value.body, value.orelse)]
            nulls = [
                isinstance(b, ast.Call) and model.qualname(b.func) == "contextlib.nullcontext"
                for b in (value.body, value.orelse)
            ]
            if True in states and all(
                s is not None or n for s, n in zip(states, nulls, strict=True)
            ):
                return True
            return None
        return _autocast_enabled(model, value, 1)
    if not isinstance(expr, ast.Call):
        return None
    qual = model.qualname(expr.func)
    if qual not in _AUTOCAST_ENABLED_ARG:
        return None
    enabled = keyword(expr, "enabled")
    index = _AUTOCAST_ENABLED_ARG[qual]
    if enabled is None and len(expr.args) > index:
        enabled = expr.args[index]
    return not is_false(enabled)


class BackwardInsideAutocast(Rule):
    """## What it does
    Flags `backward()` (in any form: `loss.backward()`, `scaler.scale(loss).backward()`,
    `accelerator.backward(loss)`, `torch.autograd.backward`) inside an enabled
    `torch.autocast(...)` / `torch.cuda.amp.autocast()` / `torch.amp.autocast(...)`
    region: a `with` block, a function decorated with it, or a same-file helper whose
    every call site is inside one.

    ## Why is this bad?
    Autocast is meant to wrap the forward pass and the loss only; PyTorch documents
    backward passes under autocast as not recommended. Backward ops already run in the
    dtype autocast chose for their forward ops. Inside the region, other ops that run
    during the backward call (gradient hooks, `create_graph=True` gradient penalties,
    custom `autograd.Function` backwards without `custom_bwd`) can be autocast as well and
    run in float16, where small gradient terms underflow to zero and large ones overflow
    to inf/NaN. Under `torch.compile` the compiled backward bakes in an assumption about
    the surrounding autocast state, and a mismatch gives silently wrong gradients. Plain
    models often train fine either way, hence a warning.

    ## Example
    ```python
    with torch.autocast("cuda"):
        loss = criterion(model(x), y)
        scaler.scale(loss).backward()
    ```

    ## Use instead
    ```python
    with torch.autocast("cuda"):
        loss = criterion(model(x), y)
    scaler.scale(loss).backward()
    ```

    ## Fix safety
    The fix moves the statement holding `backward()` out of the `with` block, just after
    it, together with any statements after it in the block (the optimizer step, the
    scaler update). When `backward()` is the block's last statement only the bug
    changes: safe. When statements after it move too, ops among them that autocast
    would have run in lower precision now run in float32: unsafe. It is left undone when
    `backward()` is the block's first statement (the block would be left empty), the
    `with` holds other context managers too, or autocast comes from a decorator or a
    caller.

    ## References
    - [Automatic Mixed Precision: torch.autocast](https://pytorch.org/docs/stable/amp.html#torch.autocast)
    - [torch.compile has different autograd semantics](https://pytorch.org/docs/stable/torch.compiler_backward.html)
    """

    code = "TL603"
    name = "backward-inside-autocast"
    message = "`backward()` inside an `autocast` region: autocast should wrap only the forward pass and loss; move `backward()` out of the block"
    severity = "warning"
    triggers = ("autocast",)
    fix_safety = "safe"
    confirm_with = "assert_finite_grads"
    valid = [
        """
import torch
for x, y in loader:
    optimizer.zero_grad()
    with torch.autocast("cuda", dtype=torch.float16):
        loss = criterion(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
""",
        # a disabled region, and a closure defined (not run) inside the region
        """
import torch
from torch.cuda.amp import autocast
with autocast(enabled=False):
    loss = criterion(model(x.float()), y)
    loss.backward()
with torch.autocast("cuda"):
    with torch.autocast("cuda", enabled=False):
        model(x).sum().backward()
    def closure():
        loss = model(x).sum()
        loss.backward()
        return loss
optimizer.step(closure)
""",
        # a helper called both inside and outside a region
        """
import torch

def backprop(loss):
    loss.backward()

with torch.autocast("cpu", dtype=torch.bfloat16):
    l1 = model(x).sum()
    backprop(l1)
backprop(model(x).sum())
""",
        # shadowed: a parameter named autocast
        """
import torch

def run(autocast, loss):
    with autocast():
        loss.backward()
""",
        # no torch
        """
with autocast():
    loss.backward()
""",
    ]
    invalid = [
        Invalid(
            """
import torch
for x, y in loader:
    optimizer.zero_grad()
    with torch.autocast(device_type="cuda", dtype=torch.float16):
        loss = criterion(model(x), y)
        scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
""",
            line=6,
            fixed="""
import torch
for x, y in loader:
    optimizer.zero_grad()
    with torch.autocast(device_type="cuda", dtype=torch.float16):
        loss = criterion(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
""",
            column=9,
        ),
        # aliased import, an enabled flag that is not literally False, accelerate backward
        Invalid(
            """
from torch.cuda.amp import autocast as amp_region
for batch in loader:
    with amp_region(enabled=args.amp):
        out = model(**batch)
        accelerator.backward(out.loss)
""",
            line=5,
            fixed="""
from torch.cuda.amp import autocast as amp_region
for batch in loader:
    with amp_region(enabled=args.amp):
        out = model(**batch)
    accelerator.backward(out.loss)
""",
        ),
        # a decorated step function, and a helper only called inside a region
        Invalid(
            """
import torch

def backprop(loss):
    loss.backward()

@torch.amp.autocast("cuda")
def train_step(model, x):
    torch.autograd.backward(model(x).sum())

with torch.cpu.amp.autocast():
    backprop(model(x).sum())
""",
            lines=(4, 8),
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        if not model.imports_module("torch"):
            return
        memo: dict[int, bool] = {}
        for call in backward_calls(model):
            if self._under_autocast(model, call, 2, memo):
                yield self.report(call, fix=self._dedent(model, call))

    def _dedent(self, model: FileModel, call: ast.AST) -> Fix | None:
        """Move the backward's statement (and what follows it) out of the innermost
        enabled autocast ``with`` that holds it."""
        block = next(
            (
                anc
                for anc in model.ancestors(call)
                if isinstance(
                    anc,
                    (
                        ast.With,
                        ast.AsyncWith,
                        ast.FunctionDef,
                        ast.AsyncFunctionDef,
                        ast.Lambda,
                        ast.ClassDef,
                    ),
                )
            ),
            None,
        )
        if (
            not isinstance(block, ast.With)
            or len(block.items) != 1
            or not _autocast_enabled(model, block.items[0].context_expr)
        ):
            return None
        first = sibling_ancestor(model, call, block.body)
        intent = dedent_intent(model, block, first) if first is not None else None
        if intent is None:
            return None
        safety: Applicability = "safe" if first is block.body[-1] else "unsafe"
        return Fix(safety, (), "move `backward()` out of the autocast block", intent)

    def _under_autocast(
        self, model: FileModel, node: ast.AST, depth: int, memo: dict[int, bool]
    ) -> bool:
        """Does ``node`` always run inside an enabled autocast region? The innermost
        autocast decides (``enabled=False`` nested inside an enabled region turns it off)."""
        for anc in model.ancestors(node):
            if isinstance(anc, (ast.With, ast.AsyncWith)):
                for item in reversed(anc.items):
                    state = _autocast_enabled(model, item.context_expr)
                    if state is not None:
                        return state
            elif isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for dec in anc.decorator_list:
                    state = _autocast_enabled(model, dec)
                    if state is not None:
                        return state
                return depth > 0 and self._every_call_under_autocast(model, anc, depth, memo)
            elif isinstance(anc, (ast.Lambda, ast.ClassDef)):
                return False
        return False

    def _every_call_under_autocast(
        self, model: FileModel, fn: ast.AST, depth: int, memo: dict[int, bool]
    ) -> bool:
        cached = memo.get(id(fn))
        if cached is None:
            memo[id(fn)] = False  # recursion guard
            sites = model.call_sites.get(id(fn), [])
            cached = bool(sites) and all(
                self._under_autocast(model, site, depth - 1, memo) for site in sites
            )
            memo[id(fn)] = cached
        return cached
