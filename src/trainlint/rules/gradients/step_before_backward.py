"""TL104 step-before-backward."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.model import FileModel
from trainlint.analysis.paths import Reported, precise_step_loops
from trainlint.analysis.steps import STEP_LOOP_TRIGGERS, Kind, StepLoop
from trainlint.rules.base import Invalid, Report, Rule


def _guard_mentions_loop_state(guards: tuple[tuple[ast.If, bool], ...], loop: StepLoop) -> bool:
    targets: set[str] = set()
    node = loop.node
    if isinstance(node, (ast.For, ast.AsyncFor)):
        for sub in ast.walk(node.target):
            if isinstance(sub, ast.Name):
                targets.add(sub.id)
    for g, _ in guards:
        for sub in ast.walk(g.test):
            if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Mod):
                return True
            if isinstance(sub, ast.Name) and sub.id in targets:
                return True
            if isinstance(sub, ast.Compare):
                return True
    return False


class StepBeforeBackward(Rule):
    """## What it does
    Flags an optimizer step that runs before the backward pass of the same loop
    iteration, with no backward before it.

    ## Why is this bad?
    The step applies whatever is in `.grad` at that moment: the previous batch's
    gradients, or nothing on the first batch. Every update lags one batch behind (and
    with a `zero_grad()` in between, never happens at all). Training looks plausible
    and converges worse.

    ## Example
    ```python
    for x, y in loader:
        optimizer.zero_grad()
        optimizer.step()
        criterion(model(x), y).backward()
    ```

    ## Use instead
    ```python
    for x, y in loader:
        optimizer.zero_grad()
        criterion(model(x), y).backward()
        optimizer.step()
    ```

    ## References
    - [PyTorch optimization loop](https://pytorch.org/tutorials/beginner/basics/optimization_tutorial.html)
    """

    code = "TL104"
    name = "step-before-backward"
    message = (
        "the optimizer steps before this iteration's backward: it applies stale gradients; call `step()` after `backward()`"
    )
    triggers = STEP_LOOP_TRIGGERS
    confirm_with = "assert_weights_updated"
    valid = [
        """
import torch
for x, y in loader:
    optimizer.zero_grad()
    criterion(model(x), y).backward()
    optimizer.step()
""",
        # deliberate delayed update guarded by the loop counter
        """
import torch
for i, x in enumerate(loader):
    if i > 0:
        optimizer.step()
        optimizer.zero_grad()
    model(x).sum().backward()
""",
        # closure form: the closure backpropagates inside step()
        """
from torch import optim
opt = optim.LBFGS(params)
for x in loader:
    def closure():
        opt.zero_grad()
        l = f(x)
        l.backward()
        return l
    opt.step(closure)
""",
        # no torch
        """
for t in range(100):
    sim.step()
    sim.backward()
""",
    ]
    invalid = [
        Invalid(
            """
import torch
for x, y in loader:
    optimizer.zero_grad()
    optimizer.step()
    loss = criterion(model(x), y)
    loss.backward()
""",
            line=4,
        ),
        Invalid(
            """
import torch.optim as O

def train(model, loader, accelerator):
    opt = O.AdamW(model.parameters())
    for batch in loader:
        opt.step()
        opt.zero_grad()
        out = model(**batch)
        accelerator.backward(out.loss)
""",
            line=6,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        seen = Reported()
        for loop in precise_step_loops(model):
            steps = loop.of(Kind.STEP)
            for step in steps:
                if _guard_mentions_loop_state(step.guards, loop):
                    continue
                containing = [p for p in loop.paths if any(e is step for e in p)]
                if not containing:
                    continue
                bad = True
                later = False
                for p in containing:
                    i = next(k for k, e in enumerate(p) if e is step)
                    if any(e.kind is Kind.BACKWARD for e in p[:i]):
                        bad = False
                        break
                    if any(e.kind is Kind.BACKWARD for e in p[i + 1 :]):
                        later = True
                if bad and later:
                    node = model.steps.anchor(step)
                    if seen.first(node):
                        yield self.report(node)
