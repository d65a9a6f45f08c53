"""TL601 clip-before-unscale."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis import amp
from trainlint.analysis.amp import Scalers, contains_in_order, off_amp_branch
from trainlint.analysis.model import FileModel, dotted
from trainlint.analysis.paths import Reported, precise_step_loops
from trainlint.analysis.reordering import jumps
from trainlint.analysis.steps import Event, Kind, StepLoop, backward_value
from trainlint.edits import insert_before, runs_after, siblings
from trainlint.findings import Fix
from trainlint.rules.base import Invalid, Report, Rule

_NORM_FUNCS = {
    "torch.norm",
    "torch.linalg.norm",
    "torch.linalg.vector_norm",
    "torch.linalg.matrix_norm",
    "torch.nn.utils.get_total_norm",
    "torch.nn.utils.clip_grad_norm_",
}


def _is_norm_read(model: FileModel, event: Event) -> bool:
    """A read that measures gradient magnitude: ``clip_grad_norm_(ps, inf)``,
    ``get_total_norm``, ``p.grad.norm()``, ``torch.norm(p.grad)``. Finiteness checks and
    ``is None`` tests are unaffected by the scale and do not count."""
    node = event.node
    if isinstance(node, ast.Call):
        return True  # READ calls are the norm helpers (clip with an infinite bound & co.)
    cur: ast.AST = node
    for _ in range(6):
        parent = model.parent_of(cur)
        if isinstance(parent, ast.Attribute) and parent.value is cur:
            grand = model.parent_of(parent)
            if parent.attr == "norm" and isinstance(grand, ast.Call) and grand.func is parent:
                return True
            cur = parent
        elif isinstance(parent, ast.Call) and parent.func is cur:
            cur = parent  # `p.grad.detach()`, `p.grad.data.float()`
        elif isinstance(parent, ast.Call) and any(a is cur for a in parent.args):
            return model.qualname(parent.func) in _NORM_FUNCS
        else:
            return False
    return False


_READ_MSG = (
    "gradient norm read before `scaler.unscale_(optimizer)`: it measures scaled "
    "gradients, off by the loss scale; call `scaler.unscale_(optimizer)` first"
)


class ClipBeforeUnscale(Rule):
    """## What it does
    Flags gradient clipping (`clip_grad_norm_`/`clip_grad_value_`), or a gradient-norm
    read, after `scaler.scale(loss).backward()` with no `scaler.unscale_(optimizer)` in
    between, in the same training step, or in a function that runs the whole scaled
    update for a loop elsewhere (an optimizer wrapper's `step(loss)`).

    ## Why is this bad?
    A `GradScaler` multiplies the loss, and so every gradient, by the loss scale
    (65536 at the start, adapted during training). Before `unscale_`,
    `clip_grad_norm_(params, 1.0)` measures a norm that many times too large: it fires on
    every step, and once `scaler.step` divides the scale back out the update is made
    with gradients of total norm `max_norm / scale` (1/65536 for `max_norm=1.0`). Plain
    SGD then barely moves the weights, Adam-style optimizers see gradients at the level
    of their `eps`, which damps their steps, and the threshold you chose no longer
    relates to the real gradient norm (its effect even changes whenever the scaler
    adapts). A gradient norm logged at that point is off by the same factor, so people
    chasing NaN gradients tune ever smaller clip norms against a number that means
    nothing.

    ## Example
    ```python
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    ```

    ## Use instead
    ```python
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    ```

    ## Fix safety
    The fix inserts `scaler.unscale_(optimizer)`, with the step's own names, on its own line
    before the clip, only where the clip always runs before `scaler.step` of the one
    optimizer and after the scaled backward (a second `unscale_` before `update()` raises).
    It is unsafe: the clip then bounds the real gradients, changing every update's size.

    ## References
    - [Working with unscaled gradients (AMP examples)](https://pytorch.org/docs/stable/notes/amp_examples.html#working-with-unscaled-gradients)
    """

    code = "TL601"
    name = "clip-before-unscale"
    message = "gradients clipped before `scaler.unscale_(optimizer)`: the threshold applies to scaled gradients; call `scaler.unscale_(optimizer)` first"
    triggers = ("scale(",)
    confirm_with = "assert_clip_effective"
    fix_safety = "unsafe"
    valid = [
        # the AMP recipe
        """
import torch
scaler = torch.cuda.amp.GradScaler()
for x, y in loader:
    optimizer.zero_grad()
    with torch.autocast("cuda"):
        loss = criterion(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
""",
        # clipping in the non-AMP branch
        """
import torch
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    if use_amp:
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
    else:
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
""",
        # correlated flags: the un-unscaled clip only runs without a scaler (the seed's fix)
        """
import torch

class Trainer:
    def train_step(self, batch):
        self.optimizer.zero_grad()
        loss = self.model(batch).mean()
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()
        self.control()
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()

    def control(self):
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
""",
        # a finiteness check is unaffected by the scale; a norm logged after scaler.step is
        # unscaled
        """
import torch
for x, y in loader:
    optimizer.zero_grad()
    scaler.scale(criterion(model(x), y)).backward()
    bad = any(not torch.isfinite(p.grad).all() for p in model.parameters())
    scaler.step(optimizer)
    scaler.update()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
""",
        # shadowed: a custom loss scaler (its own unscaling semantics), not a GradScaler
        """
import torch

class LossScaler:
    def scale(self, loss):
        return loss * 1024.0

scaler = LossScaler()
for x, y in loader:
    optimizer.zero_grad()
    scaler.scale(criterion(model(x), y)).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
""",
        # a literally disabled GradScaler scales nothing
        """
from torch.cuda.amp import GradScaler
scaler = GradScaler(enabled=False)
for x, y in loader:
    optimizer.zero_grad()
    scaler.scale(criterion(model(x), y)).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
""",
        # no torch
        """
for job in jobs:
    scaler.scale(job).backward()
    job.clip_grad_norm_(1.0)
    scaler.step(job)
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
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
""",
            line=8,
            column=5,
            fixed="""
import torch
scaler = torch.cuda.amp.GradScaler()
for x, y in loader:
    optimizer.zero_grad()
    with torch.autocast("cuda"):
        loss = criterion(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
""",
        ),
        # aliased imports, scaled loss through a name, a clipping helper called per step
        Invalid(
            """
import torch.amp as amp
from torch.nn.utils import clip_grad_value_ as clip

def clip_all(model):
    clip(model.parameters(), 0.5)

grad_scaler = amp.GradScaler("cuda")
for epoch in range(10):
    for x, y in loader:
        opt.zero_grad()
        scaled = grad_scaler.scale(crit(net(x), y))
        scaled.backward()
        clip_all(net)
        grad_scaler.step(opt)
        grad_scaler.update()
""",
            line=13,
            fixed="""
import torch.amp as amp
from torch.nn.utils import clip_grad_value_ as clip

def clip_all(model):
    clip(model.parameters(), 0.5)

grad_scaler = amp.GradScaler("cuda")
for epoch in range(10):
    for x, y in loader:
        opt.zero_grad()
        scaled = grad_scaler.scale(crit(net(x), y))
        scaled.backward()
        grad_scaler.unscale_(opt)
        clip_all(net)
        grad_scaler.step(opt)
        grad_scaler.update()
""",
        ),
        # the clip runs on the AMP path of a script that supports both
        Invalid(
            """
import torch
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    if scaler is not None:
        scaler.scale(loss).backward()
    else:
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
""",
            line=9,
        ),
        # a logged gradient norm read off scaled gradients
        Invalid(
            """
import torch
scaler = torch.amp.GradScaler()
for step, (x, y) in enumerate(loader):
    optimizer.zero_grad()
    scaler.scale(criterion(model(x), y)).backward()
    if step % 100 == 0:
        total = sum(p.grad.norm() ** 2 for p in model.parameters()) ** 0.5
        print(step, total)
    scaler.step(optimizer)
    scaler.update()
""",
            line=7,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        scalers = Scalers(model)
        seen = Reported()
        loops = [*precise_step_loops(model)]
        loops += [sl for sl in amp.scaled_update_functions(model, scalers) if sl.precise]
        for loop in loops:
            if not any(
                e.kind is Kind.CLIP or (e.kind is Kind.READ and _is_norm_read(model, e))
                for e in loop.events
            ):
                continue
            for path in loop.paths:
                scaled: Event | None = None  # the scaled backward whose gradients are live
                for e in path:
                    if e.kind is Kind.BACKWARD:
                        scaled = e if scalers.scaled(e) else None
                    elif e.kind in (Kind.UNSCALE, Kind.ZERO) or (e.kind is Kind.STEP and e.scaled):
                        scaled = None  # `scaler.step` unscales whatever is still scaled
                    elif scaled is not None and (
                        e.kind is Kind.CLIP or (e.kind is Kind.READ and _is_norm_read(model, e))
                    ):
                        if self._unscaled_elsewhere(loop, scaled, e) or off_amp_branch(e, scaled):
                            continue
                        node = model.steps.anchor(e)
                        if seen.first(node):
                            if e.kind is not Kind.CLIP:
                                yield self.report(node, _READ_MSG)
                                continue
                            fix = self._unscale_first(model, scalers, loop, scaled, node)
                            yield self.report(node, fix=fix)

    def _unscale_first(
        self, model: FileModel, scalers: Scalers, loop: StepLoop, backward: Event, clip: ast.AST
    ) -> Fix | None:
        """``scaler.unscale_(optimizer)`` before the clip; None where the scaler or its one
        optimizer is unknown, or the call could run twice before ``update()`` (it raises):
        the clip runs without the step (accumulation, a ``continue``) or the backward."""
        if loop.of(Kind.UNSCALE) or not isinstance(backward.node, ast.Call):
            return None
        scale = scalers.scale_call(backward_value(model, backward.node))
        steps = [e for e in loop.of(Kind.STEP) if e.scaled]
        optimizers = {e.target for e in steps}
        scaler = dotted(scale.func) if scale else None  # `scaler.scale`: drop `.scale`
        if scaler is None or len(optimizers) != 1 or "<expr>" in optimizers:
            return None
        scaler = scaler.rpartition(".")[0]
        # stepped by this very scaler
        if any(_receiver(e.node) != scaler for e in steps):
            return None
        stmt = model.statement_of(clip)
        block = siblings(model, stmt) or []
        if not block or not isinstance(stmt, (ast.Expr, ast.Assign, ast.AnnAssign)):
            return None
        after = block[[id(s) for s in block].index(id(stmt)) + 1 :]
        step_at = {id(model.statement_of(model.steps.anchor(e))) for e in steps}
        until = next((i for i, s in enumerate(after) if id(s) in step_at), None)
        if until is None or any(jumps(s) for s in after[:until]):
            return None
        if not runs_after(model, stmt, model.statement_of(model.steps.anchor(backward))):
            return None
        code = f"{scaler}.unscale_({optimizers.pop()})"
        edit = insert_before(model, stmt, code)
        return self.fix(edit, message=f"insert `{code}`") if edit else None

    @staticmethod
    def _unscaled_elsewhere(loop: StepLoop, backward: Event, clip: Event) -> bool:
        """Another path runs this backward, then an unscale, then this very clip: the unscale
        is conditional on something paths cannot correlate (``if self.scaler is not None``
        guarding both the scaled backward and the unscale): stay silent."""
        return any(
            contains_in_order(p, backward, u, clip) >= 0
            for u in loop.of(Kind.UNSCALE)
            for p in loop.paths
        )


def _receiver(node: ast.AST) -> str | None:
    func = node.func if isinstance(node, ast.Call) else None
    return dotted(func.value) if isinstance(func, ast.Attribute) else None
