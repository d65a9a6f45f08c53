"""TL604 scaler-step-bypassed."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.amp import Scalers, contains_in_order, literally_disabled, off_amp_branch
from trainlint.analysis.model import FileModel, dotted
from trainlint.analysis.objects import objects
from trainlint.analysis.paths import Reported, precise_step_loops
from trainlint.analysis.roles import Role
from trainlint.analysis.steps import Event, Kind, StepLoop
from trainlint.analysis.torch_table import GRAD_SCALERS
from trainlint.rules.base import Invalid, Report, Rule


def _named_scaler(expr: ast.AST) -> bool:
    return "scaler" in (dotted(expr) or "").rsplit(".", 1)[-1].lower()


class ScalerStepBypassed(Rule):
    """## What it does
    Flags `optimizer.step()` applying gradients produced by
    `scaler.scale(loss).backward()` instead of `scaler.step(optimizer)`, and a
    `scaler.step(optimizer)` whose `GradScaler` never gets `scaler.update()` anywhere in
    the file.

    ## Why is this bad?
    `scaler.step(optimizer)` unscales the gradients, checks them for inf/NaN, and skips
    the update when the scale overflowed. `optimizer.step()` does none of this: with plain
    SGD every update is multiplied by the loss scale (65536 at the start) and the model
    diverges at once; with Adam the scale mostly cancels, but steps whose gradients
    overflowed write inf/NaN into the weights, and from then on every loss is NaN.
    Without `scaler.update()` the scale never adapts (it neither backs off after an
    overflow nor grows), and an enabled scaler raises "step() has already been called
    since the last update()" on the second step, typically only on the GPU machine, when
    the scaler was built with `enabled=torch.cuda.is_available()`.

    ## Example
    ```python
    scaler.scale(loss).backward()
    optimizer.step()
    ```

    ## Use instead
    ```python
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    ```

    ## References
    - [Automatic Mixed Precision examples](https://pytorch.org/docs/stable/notes/amp_examples.html)
    - [torch.amp.GradScaler](https://pytorch.org/docs/stable/amp.html#gradient-scaling)
    """

    code = "TL604"
    name = "scaler-step-bypassed"
    message = "gradients from `scaler.scale(loss).backward()` applied by `optimizer.step()`: no unscaling, no inf/NaN check; use `scaler.step(optimizer)`"
    triggers = ("scale(", "GradScaler")
    confirm_with = "assert_finite_grads"
    valid = [
        """
import torch
scaler = torch.cuda.amp.GradScaler()
for x, y in loader:
    optimizer.zero_grad()
    scaler.scale(criterion(model(x), y)).backward()
    scaler.step(optimizer)
    scaler.update()
""",
        # both modes behind one flag
        """
import torch
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    if use_amp:
        scaler.scale(loss).backward()
    else:
        loss.backward()
    if use_amp:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
""",
        # accumulation, and the update in a helper; a scaler handed to code we cannot see
        """
import torch

def finish(scaler, opt):
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()

scaler = torch.amp.GradScaler()
for i, (x, y) in enumerate(loader):
    scaler.scale(criterion(model(x), y) / 4).backward()
    if (i + 1) % 4 == 0:
        finish(scaler, optimizer)
other = torch.amp.GradScaler()
engine = Engine(other)
other.step(optimizer)
""",
        # shadowed: a parameter named GradScaler builds something else
        """
import torch

def train(GradScaler, loader, opt):
    scaler = GradScaler()
    for x in loader:
        scaler.scale(model(x).sum()).backward()
        opt.step()
""",
        # no torch
        """
for job in jobs:
    scaler.scale(job).backward()
    optimizer.step()
""",
    ]
    invalid = [
        Invalid(
            """
import torch
scaler = torch.cuda.amp.GradScaler()
for x, y in loader:
    optimizer.zero_grad()
    with torch.autocast("cuda"):
        loss = criterion(model(x), y)
    scaler.scale(loss).backward()
    optimizer.step()
    scaler.update()
""",
            line=8,
            column=5,
        ),
        # aliased import; unscale_ alone does not make optimizer.step() safe
        Invalid(
            """
from torch.amp import GradScaler as GS
import torch.optim as optim

gs = GS("cuda")
opt = optim.SGD(net.parameters(), lr=0.1)
for x, y in loader:
    opt.zero_grad()
    gs.scale(crit(net(x), y)).backward()
    gs.unscale_(opt)
    opt.step()
    gs.update()
""",
            line=10,
        ),
        # update never called for this scaler
        Invalid(
            """
import torch

class Trainer:
    def __init__(self, model):
        self.scaler = torch.cuda.amp.GradScaler(enabled=torch.cuda.is_available())
        self.opt = torch.optim.AdamW(model.parameters())

    def train_step(self, loss):
        self.opt.zero_grad()
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
""",
            line=11,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        scalers = Scalers(model)
        seen = Reported()
        for loop in precise_step_loops(model):
            if not any(scalers.scaled(e) for e in loop.of(Kind.BACKWARD)):
                continue
            for path in loop.paths:
                scaled: Event | None = None
                for e in path:
                    if e.kind is Kind.BACKWARD:
                        scaled = e if scalers.scaled(e) else None
                    elif e.kind is Kind.ZERO or (e.kind is Kind.STEP and e.scaled):
                        scaled = None
                    elif e.kind is Kind.STEP and scaled is not None:
                        if self._scaled_step_elsewhere(loop, scaled, e) or off_amp_branch(
                            e, scaled
                        ):
                            continue
                        node = model.steps.anchor(e)
                        if seen.first(node):
                            yield self.report(node)
        yield from self._never_updated(model, scalers, seen)

    @staticmethod
    def _scaled_step_elsewhere(loop: StepLoop, backward: Event, step: Event) -> bool:
        """Another path runs this backward and then a ``scaler.step`` instead of this
        ``optimizer.step()``: the two are alternatives chosen by a condition the paths
        cannot correlate (``if self.scaler is not None`` vs ``if self.use_amp``)."""
        for p in loop.paths:
            if any(e is step for e in p):
                continue
            for e in p:
                if e.kind is Kind.STEP and e.scaled and contains_in_order(p, backward, e) >= 0:
                    return True
        return False

    def _never_updated(
        self, model: FileModel, scalers: Scalers, seen: Reported
    ) -> Iterator[Report]:
        steps = [
            c for c in model.calls.get("step", ()) if isinstance(c.func, ast.Attribute) and c.args
        ]
        if not steps:
            return
        roles = model.roles
        updated: set[int] = set()
        for call in model.calls.get("update", ()):
            func = call.func
            if not isinstance(func, ast.Attribute) or call.args or call.keywords:
                continue
            if not scalers.is_scaler(func.value) and not _named_scaler(func.value):
                continue
            b = roles.lookup(func.value)
            if b is None or b.call is None:
                return  # an update on a scaler we cannot identify may be any of them
            updated.add(id(b.call))
        escaped: dict[int, bool] = {}
        for call in steps:
            recv = call.func.value  # type: ignore[attr-defined]
            b = roles.lookup(recv)
            if (
                b is None
                or b.role is not Role.SCALER
                or b.call is None
                or literally_disabled(b.call)
            ):
                continue  # a scaler passed in: its owner may update it
            if model.qualname(b.call.func) not in GRAD_SCALERS or id(b.call) in updated:
                continue
            if id(b.call) not in escaped:
                query = objects(model)
                escaped[id(b.call)] = query.escapes(query.of(b.call))
            if escaped[id(b.call)]:
                continue
            if seen.first(call):
                yield self.report(
                    call,
                    "`scaler.step()` but `scaler.update()` is never called: the loss scale "
                    "never adapts and the second step raises; call `scaler.update()` after "
                    "every `scaler.step()`",
                )
