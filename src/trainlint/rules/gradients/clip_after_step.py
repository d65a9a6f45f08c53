"""TL110 clip-after-step."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.model import FileModel
from trainlint.analysis.paths import Reported, precise_step_loops
from trainlint.analysis.steps import Event, Kind, StepLoop
from trainlint.edits import move_intent, siblings
from trainlint.findings import Intent
from trainlint.rules.base import Invalid, Report, Rule


def _is_unscale(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Call)
        and isinstance(stmt.value.func, ast.Attribute)
        and stmt.value.func.attr == "unscale_"
    )


def _clip_before_step(model: FileModel, clip: ast.AST, step: ast.AST) -> Intent | None:
    """Move the clip statement, with the `scaler.unscale_(opt)` right above it under AMP,
    to just before the step statement."""
    clip_stmt, step_stmt = model.statement_of(clip), model.statement_of(step)
    block = siblings(model, clip_stmt)
    if block is None or not any(s is step_stmt for s in block):
        return None
    i = next(k for k, s in enumerate(block) if s is clip_stmt)
    moved = [clip_stmt]
    while i > 0 and _is_unscale(block[i - 1]) and block[i - 1] is not step_stmt:
        i -= 1
        moved.insert(0, block[i])
    return move_intent(model, moved, step_stmt, "before")


def _reenters(model: FileModel, loop: StepLoop, event: Event) -> bool:
    """The event comes from the step function calling itself again."""
    fn = loop.node
    return isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
        model.resolve_call(site) is fn for site in event.chain
    )


class ClipAfterStep(Rule):
    """## What it does
    Flags gradient clipping (`clip_grad_norm_`/`clip_grad_value_` with a finite bound)
    that runs after the optimizer step of the same iteration, with no later step to use
    the clipped gradients.

    ## Why is this bad?
    The update has already been applied with the unclipped gradients; the clip changes
    gradients that the next `zero_grad()` discards. Training runs unclipped while the
    code says otherwise, and the gradient explosions clipping was meant to stop happen
    anyway. Reading the norm after the step for logging (`max_norm=inf`) is fine.

    ## Example
    ```python
    loss.backward()
    optimizer.step()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    ```

    ## Use instead
    ```python
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    ```

    ## Fix safety
    The fix moves the clip statement (with a `scaler.unscale_(optimizer)` right above
    it, under AMP) to just before the optimizer step; only the bug changes, so it is
    safe. It is left undone when the clip and the step are not in the same block or
    a `try`, `return`, `break` or `raise` lies between them.

    ## References
    - [torch.nn.utils.clip_grad_norm_](https://pytorch.org/docs/stable/generated/torch.nn.utils.clip_grad_norm_.html)
    """

    code = "TL110"
    name = "clip-after-step"
    message = "gradients clipped after the optimizer step: the update already used unclipped gradients; clip between `backward()` and `step()`"
    triggers = ("clip_grad",)
    fix_safety = "safe"
    confirm_with = "assert_clip_effective"
    valid = [
        """
import torch
for x, y in loader:
    optimizer.zero_grad()
    criterion(model(x), y).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
""",
        # a norm read for logging after the step
        """
import torch
for x, y in loader:
    optimizer.zero_grad()
    criterion(model(x), y).backward()
    optimizer.step()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
""",
        # GAN: G is clipped after D's step but before its own
        """
import torch
for real in loader:
    d_loss(real).backward()
    opt_d.step()
    g_loss(real).backward()
    torch.nn.utils.clip_grad_norm_(gen.parameters(), 5.0)
    opt_g.step()
""",
        # a retry that zeroes the gradients and runs the whole step again (the
        # backward lives in another module's helper)
        """
import torch
class Trainer:
    def train_step(self, batch, retry=True):
        self.opt.zero_grad()
        self.task.forward_backward(self.model, batch)
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        if not torch.isfinite(norm):
            raise FloatingPointError("non-finite gradients")
        self.opt.step()
        if retry and self.overflowed():
            return self.train_step(batch, retry=False)
""",
        # no torch
        """
for job in jobs:
    job.backward()
    job.opt.step()
    job.clip_grad_norm_(1.0)
""",
    ]
    invalid = [
        Invalid(
            """
import torch
for x, y in loader:
    optimizer.zero_grad()
    criterion(model(x), y).backward()
    optimizer.step()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
""",
            line=6,
            fixed="""
import torch
for x, y in loader:
    optimizer.zero_grad()
    criterion(model(x), y).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    optimizer.step()
""",
        ),
        Invalid(
            """
from torch.nn.utils import clip_grad_value_ as clip

class Trainer:
    def train_step(self, batch):
        self.opt.zero_grad()
        self.model(batch).mean().backward()
        self.opt.step()
        clip(self.model.parameters(), 0.5)
""",
            line=8,
            fixed="""
from torch.nn.utils import clip_grad_value_ as clip

class Trainer:
    def train_step(self, batch):
        self.opt.zero_grad()
        self.model(batch).mean().backward()
        clip(self.model.parameters(), 0.5)
        self.opt.step()
""",
        ),
        # AMP: the unscale_ above the clip moves with it; comments travel along
        Invalid(
            """
import torch
scaler = torch.cuda.amp.GradScaler()
for x, y in loader:
    optimizer.zero_grad()
    scaler.scale(criterion(model(x), y)).backward()
    scaler.step(optimizer)  # skips the step on inf/nan
    scaler.update()
    # clip in true units
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # max norm 1
""",
            line=10,
            fixed="""
import torch
scaler = torch.cuda.amp.GradScaler()
for x, y in loader:
    optimizer.zero_grad()
    scaler.scale(criterion(model(x), y)).backward()
    # clip in true units
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # max norm 1
    scaler.step(optimizer)  # skips the step on inf/nan
    scaler.update()
""",
        ),
        # the clip sits in another block than the step: reported, left unfixed
        Invalid(
            """
import torch
for x, y in loader:
    optimizer.zero_grad()
    criterion(model(x), y).backward()
    optimizer.step()
    if args.clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
""",
            line=7,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        seen = Reported()
        for loop in precise_step_loops(model):
            for path in loop.paths:
                last_step = -1
                for i, e in enumerate(path):
                    if e.kind is Kind.STEP:
                        last_step = i
                    elif e.kind is Kind.BACKWARD or (
                        last_step >= 0
                        and _reenters(model, loop, e)
                        and not _reenters(model, loop, path[last_step])
                    ):
                        # new gradients, or a retry that runs the whole step function
                        # again (`return self.train_step(batch)` on an AMP overflow)
                        last_step = -1
                    elif e.kind is Kind.CLIP and last_step >= 0:
                        if any(x.kind is Kind.STEP for x in path[i + 1 :]):
                            continue
                        node = model.steps.anchor(e)
                        if seen.first(node):
                            step = model.steps.anchor(path[last_step])
                            fix = self.restructure(
                                _clip_before_step(model, node, step),
                                "clip before the optimizer step",
                            )
                            yield self.report(
                                node,
                                related=((step, "the optimizer step it comes after"),),
                                fix=fix,
                            )
