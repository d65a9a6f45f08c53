"""TL110 clip-after-step."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.model import FileModel
from trainlint.analysis.paths import Reported, precise_step_loops
from trainlint.analysis.steps import Event, Kind, StepLoop
from trainlint.rules.base import Invalid, Report, Rule


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

    ## References
    - [torch.nn.utils.clip_grad_norm_](https://pytorch.org/docs/stable/generated/torch.nn.utils.clip_grad_norm_.html)
    """

    code = "TL110"
    name = "clip-after-step"
    message = (
        "gradients clipped after the optimizer step: the update already used unclipped gradients; clip between `backward()` and `step()`"
    )
    triggers = ("clip_grad",)
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
                        last_step >= 0 and _reenters(model, loop, e)
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
                            yield self.report(
                                node, related=((step, "the optimizer step it comes after"),)
                            )
