"""TL102 zero-grad-before-step."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.grad_clearing import clears_some_only
from trainlint.analysis.model import FileModel
from trainlint.analysis.paths import Reported, precise_step_loops
from trainlint.analysis.roles import Role
from trainlint.analysis.steps import Event, Kind, StepLoop
from trainlint.edits import move_next_to
from trainlint.rules.base import Invalid, Report, Rule
from trainlint.rules.gradients._shared import single_optimizer


def _zero_matches_step(model: FileModel, zero: Event, step: Event, loop: StepLoop) -> bool:
    """Does this zero_grad clear the gradients that this step applies?"""
    if zero.target is not None and zero.target == step.target:
        return True
    if not single_optimizer(loop):
        return False
    if zero.target is None:
        return True  # `p.grad = None` over the parameters
    node = zero.node
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        role = model.roles.role(node.func.value, by_name=True)
        if role is Role.MODEL:
            return True
        if role is Role.OPTIMIZER:
            return False  # another optimizer's zero_grad (two-optimizer loops)
        if isinstance(node.func.value, ast.Name) and node.func.value.id == "self":
            return True  # a LightningModule / nn.Module zeroing itself
    return False


def _sanitizing(zero: Event) -> bool:
    """A zeroing under a test of the gradient's values (`if not torch.isfinite(p.grad)
    .all()`) drops only the bad gradients; the others still reach the step. A test that
    only asks whether a gradient exists (`p.grad is not None`) does not count."""
    for guard, _ in zero.guards:
        for sub in ast.walk(guard.test):
            if isinstance(sub, ast.Call) and any(
                isinstance(n, ast.Attribute) and n.attr == "grad" for n in ast.walk(sub)
            ):
                return True
    return False


class ZeroGradBeforeStep(Rule):
    """## What it does
    Flags `zero_grad()` called between `backward()` and the optimizer step of the same
    step, clearing the gradients the step was about to apply. A hand-written clearing
    that provably leaves other gradients for the step is not reported: one named tensor
    (`model.fc.weight.grad = None`), a submodule's parameters, parameters picked by a
    test, or a clearing under a test such as `if it < warmup_iters:`.

    ## Why is this bad?
    The optimizer steps with zero (or `None`) gradients: the weights never change, or
    only weight decay and momentum from earlier steps move them. The loss stays flat
    and nothing raises.

    ## Example
    ```python
    loss.backward()
    optimizer.zero_grad()
    optimizer.step()
    ```

    ## Use instead
    ```python
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    ```

    ## Fix safety
    The fix moves the `zero_grad()` statement to just after the optimizer step of the
    same block, so the step sees the gradients and the next backward starts clean; only
    the bug changes, so it is safe. It is left undone when the step is not in the same
    block (a step under an accumulation `if`: clearing after the `if` would clear every
    iteration), or a `try`, `return`, `break` or `raise` lies between them.

    ## References
    - [Zeroing out gradients in PyTorch](https://pytorch.org/tutorials/recipes/recipes/zeroing_out_gradients.html)
    """

    code = "TL102"
    name = "zero-grad-before-step"
    message = "`zero_grad()` between `backward()` and the optimizer step: the step applies no update; call it before the forward pass or after `step()`"
    triggers = ("zero_grad", ".grad")
    fix_safety = "safe"
    confirm_with = "assert_weights_updated"
    valid = [
        # the new head's gradients dropped for the first steps on purpose: the rest of
        # the model still steps
        """
import torch
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for it, (x, y) in enumerate(loader):
    opt.zero_grad()
    crit(model(x), y).backward()
    if it < warmup_iters:
        for p in model.head.parameters():
            p.grad = None
    model.encoder.proj.weight.grad = None
    opt.step()
""",
        """
import torch
for x, y in loader:
    optimizer.zero_grad()
    criterion(model(x), y).backward()
    optimizer.step()
""",
        # GAN: G's zero_grad between D's backward and... G's step after G's backward
        """
import torch
for real in loader:
    loss_d = d_loss(real)
    loss_d.backward()
    opt_g.zero_grad()
    opt_d.step()
""",
        # accumulation with zero_grad after the step
        """
import torch.optim as optim
opt = optim.SGD(model.parameters(), lr=0.1)
for i, x in enumerate(loader):
    (model(x).mean() / 4).backward()
    if (i + 1) % 4 == 0:
        opt.step()
        opt.zero_grad()
""",
        # dropping only non-finite gradients before the step
        """
import torch
for x, y in loader:
    optimizer.zero_grad()
    criterion(model(x), y).backward()
    for p in model.parameters():
        if p.grad is not None and not torch.isfinite(p.grad).all():
            p.grad = None
    optimizer.step()
""",
        # a mixed-precision optimizer: the flat fp32 gradient is written by hand,
        # then the fp16 copies' gradients are freed before the fp32 step
        """
import torch
class MixedPrecisionOptimizer:
    def step(self):
        for i, group in enumerate(self.fp16_groups):
            self.fp32_groups[i].grad = torch.cat([p.grad.flatten() for p in group]).float()
            for p in group:
                p.grad = None
            self.optimizer.step()
""",
        # no torch
        """
for job in jobs:
    job.backward()
    job.zero_grad()
""",
    ]
    invalid = [
        Invalid(
            """
import torch
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.zero_grad()
    optimizer.step()
""",
            line=5,
            fixed="""
import torch
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
""",
        ),
        Invalid(
            """
from torch import optim

class Trainer:
    def __init__(self, model):
        self.model = model
        self.opt = optim.Adam(model.parameters())

    def clear(self):
        for p in self.model.parameters():
            p.grad = None

    def train_step(self, batch):
        loss = self.model(batch).sum()
        loss.backward()
        self.clear()
        self.opt.step()
""",
            line=15,
            fixed="""
from torch import optim

class Trainer:
    def __init__(self, model):
        self.model = model
        self.opt = optim.Adam(model.parameters())

    def clear(self):
        for p in self.model.parameters():
            p.grad = None

    def train_step(self, batch):
        loss = self.model(batch).sum()
        loss.backward()
        self.opt.step()
        self.clear()
""",
        ),
        # a hand-written zero_grad: testing that a gradient exists is not sanitising it
        Invalid(
            """
import torch
for x, y in loader:
    criterion(model(x), y).backward()
    for p in model.parameters():
        if p.grad is not None:
            p.grad.zero_()
    optimizer.step()
""",
            line=6,
            fixed="""
import torch
for x, y in loader:
    criterion(model(x), y).backward()
    optimizer.step()
    for p in model.parameters():
        if p.grad is not None:
            p.grad.zero_()
""",
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        seen = Reported()
        for loop in precise_step_loops(model):
            for path in loop.paths:
                last_backward = -1
                for i, e in enumerate(path):
                    if e.kind is Kind.BACKWARD:
                        # `x.grad = g` hands the step a gradient built by hand (a master
                        # copy); freeing other tensors' grads after it is bookkeeping
                        last_backward = i if isinstance(e.node, ast.Call) else -1
                    elif e.kind is Kind.ZERO and last_backward >= 0:
                        if _sanitizing(e) or clears_some_only(model, e):
                            continue  # the other gradients still reach the step
                        if any(x.kind is Kind.STEP for x in path[last_backward + 1 : i]):
                            continue
                        for s in path[i + 1 :]:
                            if s.kind is Kind.BACKWARD:
                                break
                            if s.kind is Kind.STEP and _zero_matches_step(model, e, s, loop):
                                node = model.steps.anchor(e)
                                if seen.first(node):
                                    intent = move_next_to(
                                        model, node, model.steps.anchor(s), "after"
                                    )
                                    yield self.report(
                                        node,
                                        fix=self.restructure(
                                            intent, "clear the gradients after the step"
                                        ),
                                    )
                                break
