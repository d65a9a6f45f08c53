"""TL104 step-before-backward."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.model import FileModel
from trainlint.analysis.ordering import runs_before
from trainlint.analysis.paths import Reported, precise_step_loops
from trainlint.analysis.steps import STEP_LOOP_TRIGGERS, Event, Kind, StepLoop
from trainlint.edits import move_after_last
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


def _takes_closure(step: Event) -> bool:
    """``opt.step(closure)``: the closure backpropagates inside the step, whatever it is
    (a local def, a ``functools.partial``, a bound method)."""
    call = step.node
    if not isinstance(call, ast.Call):
        return False
    args = call.args[1:] if step.scaled else call.args
    return bool(args) or any(k.arg == "closure" for k in call.keywords)


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

    ## Fix safety
    The fix moves the step statement to just after the last backward of the iteration
    (after the loop or `if` holding it, when the backward sits in one). It is unsafe:
    the step now also runs after whatever lay between (a scheduler step, logging of the
    learning rate), and a loop that relied on the lagged update changes behaviour. It is
    left undone when the backward is not in the step's block, or a `try`, `return`,
    `break` or `raise` lies between them.

    ## References
    - [PyTorch optimization loop](https://pytorch.org/tutorials/beginner/basics/optimization_tutorial.html)
    """

    code = "TL104"
    name = "step-before-backward"
    message = "the optimizer steps before this iteration's backward: it applies stale gradients; call `step()` after `backward()`"
    triggers = STEP_LOOP_TRIGGERS
    fix_safety = "unsafe"
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
        # closure built with functools.partial, inside a test that loops over
        # optimizer configurations and runs a plain training helper afterwards
        """
import functools
import torch

def loss_fn(opt, w):
    opt.zero_grad()
    loss = (w ** 2).sum()
    loss.backward()
    return loss

def check_closure(make_opt):
    w = torch.nn.Parameter(torch.ones(3))
    opt = make_opt([w])
    closure = functools.partial(loss_fn, opt, w)
    for _ in range(10):
        opt.step(closure)

def check_plain(make_opt):
    w = torch.nn.Parameter(torch.ones(3))
    opt = make_opt([w])
    loss_fn(opt, w)
    opt.step()

for make_opt in (torch.optim.SGD, torch.optim.Adam):
    check_closure(make_opt)
    check_plain(make_opt)
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
            fixed="""
import torch
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
""",
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
            fixed="""
import torch.optim as O

def train(model, loader, accelerator):
    opt = O.AdamW(model.parameters())
    for batch in loader:
        opt.zero_grad()
        out = model(**batch)
        accelerator.backward(out.loss)
        opt.step()
""",
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        seen = Reported()
        for loop in precise_step_loops(model):
            steps = loop.of(Kind.STEP)
            for step in steps:
                if step.depth > 0 or _takes_closure(step):
                    # a step in a nested loop is judged in that loop's own iterations
                    continue
                if _guard_mentions_loop_state(step.guards, loop):
                    continue
                if runs_before(loop.paths, step, Kind.BACKWARD):
                    node = model.steps.anchor(step)
                    if seen.first(node):
                        later = [
                            e.chain[0] if e.chain else e.node
                            for p in loop.paths
                            if step in p
                            for e in p[p.index(step) + 1 :]
                            if e.kind is Kind.BACKWARD
                        ]
                        fix = self.restructure(
                            move_after_last(model, node, later), "step after the backward"
                        )
                        yield self.report(node, fix=fix)
