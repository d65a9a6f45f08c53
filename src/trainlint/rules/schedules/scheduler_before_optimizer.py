"""TL202 scheduler-before-optimizer."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.model import FileModel, dotted
from trainlint.analysis.ordering import runs_before
from trainlint.analysis.paths import Reported, precise_step_loops
from trainlint.analysis.schedules import advances_schedule
from trainlint.analysis.steps import STEP_FUNCTION_NAMES, Event, Kind
from trainlint.edits import move_after_last
from trainlint.rules.base import Invalid, Report, Rule


def _rewound(model: FileModel) -> set[str]:
    """Schedulers whose ``last_epoch`` the file assigns (ultralytics sets it to
    ``start_epoch - 1`` and then steps at the top of each epoch, so the first epoch
    gets the schedule's first value)."""
    out = set()
    # the model's assignment table, not a walk of the whole tree (a hot spot of TL202)
    for node in model.assignments:
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Attribute) and t.attr == "last_epoch":
                    name = dotted(t.value)
                    if name is not None:
                        out.add(name)
    return out


def _inside_step_function(paths: list, sched: Event) -> bool:
    """Both steps in one call of another file's step function (``train_step``): that
    file reports the order, at its own lines."""
    if sched.via is None or not STEP_FUNCTION_NAMES.match(sched.via.rsplit(".", 1)[-1]):
        return False
    return all(
        e.node is sched.node
        for p in paths
        if sched in p
        for e in p[p.index(sched) + 1 :]
        if e.kind is Kind.STEP
    )


class SchedulerBeforeOptimizer(Rule):
    """## What it does
    Flags `scheduler.step()` called before `optimizer.step()` in the same iteration (of a
    batch loop, or of an epoch loop whose training happens after it). Not reported: a
    `step(n)` that puts the schedule at an explicit position (nothing is skipped), and a
    `step()` whose result is used (`lr = scheduler.step()`: torch's returns None, so it
    is a project scheduler that writes the LR for the coming update).

    ## Why is this bad?
    Since PyTorch 1.1 the scheduler must step *after* the optimizer. Stepping it first
    skips the schedule's first value: the warmup starts one step in, or the first epoch
    already runs at the decayed LR. PyTorch only warns once, easy to miss in logs.

    ## Example
    ```python
    for epoch in range(epochs):
        scheduler.step()
        train_one_epoch(model, loader, optimizer)
    ```

    ## Use instead
    ```python
    for epoch in range(epochs):
        train_one_epoch(model, loader, optimizer)
        scheduler.step()
    ```

    ## Fix safety
    The fix moves the `scheduler.step()` statement to just after the last statement of
    its block that steps the optimizer (the batch loop, the `train_one_epoch(...)`
    call); the schedule then starts at its first value, which is the bug being fixed,
    so it is safe. It is left undone when the optimizer step is not in the scheduler's
    block, or a `try`, `return`, `break` or `raise` lies between them.

    ## References
    - [How to adjust learning rate](https://pytorch.org/docs/stable/optim.html#how-to-adjust-learning-rate)
    """

    code = "TL202"
    name = "scheduler-before-optimizer"
    message = "`scheduler.step()` before `optimizer.step()`: the schedule's first value is skipped; step the scheduler after the optimizer"
    triggers = ("sched", "lr_scheduler", "Scheduler")
    fix_safety = "safe"
    confirm_with = None  # the check steps in the right order itself
    valid = [
        """
import torch
for epoch in range(10):
    for x, y in loader:
        optimizer.zero_grad()
        crit(model(x), y).backward()
        optimizer.step()
        scheduler.step()
""",
        # epoch loop: train first, then step the schedule
        """
import torch

def train_one_epoch(model, loader, optimizer):
    for x, y in loader:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()

for epoch in range(10):
    train_one_epoch(model, loader, optimizer)
    scheduler.step()
""",
        # the schedule's position rewound by hand, then stepped at the top of each
        # epoch on purpose: the first epoch gets the first value
        """
import torch

class Trainer:
    def train_epoch(self):
        for x, y in self.loader:
            self.optimizer.zero_grad()
            self.model(x).sum().backward()
            self.optimizer.step()

    def fit(self):
        self.scheduler.last_epoch = self.start_epoch - 1
        for epoch in range(self.start_epoch, self.epochs):
            self.scheduler.step()
            self.train_epoch()
""",
        # a project scheduler that writes the LR for the coming update and returns it
        # (torch's `step()` returns None), and one put at an explicit position
        """
import torch

for epoch in range(10):
    for i, (x, y) in enumerate(loader):
        lr = scheduler.step()
        wd_scheduler.step(epoch * len(loader) + i)
        optimizer.zero_grad()
        crit(model(x), y).backward()
        optimizer.step()
""",
        # no torch
        """
for t in range(10):
    scheduler.step()
    optimizer.step()
""",
    ]
    invalid = [
        Invalid(
            """
import torch
for x, y in loader:
    optimizer.zero_grad()
    crit(model(x), y).backward()
    scheduler.step()
    optimizer.step()
""",
            line=5,
            fixed="""
import torch
for x, y in loader:
    optimizer.zero_grad()
    crit(model(x), y).backward()
    optimizer.step()
    scheduler.step()
""",
        ),
        Invalid(
            """
from torch.optim import lr_scheduler

def train(model, loader, optimizer):
    for x, y in loader:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()

sched = lr_scheduler.StepLR(optimizer, 30)
for epoch in range(90):
    sched.step()
    train(model, loader, optimizer)
""",
            line=11,
            fixed="""
from torch.optim import lr_scheduler

def train(model, loader, optimizer):
    for x, y in loader:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()

sched = lr_scheduler.StepLR(optimizer, 30)
for epoch in range(90):
    train(model, loader, optimizer)
    sched.step()
""",
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        seen = Reported()
        loops = [(loop.node, loop.paths) for loop in precise_step_loops(model)]
        for ep in model.steps.epoch_loops:
            paths, precise = model.steps.loop_paths(ep)
            if precise:
                loops.append((ep, paths))
        rewound = _rewound(model)
        for _node, paths in loops:
            scheds = {id(e): e for p in paths for e in p if e.kind is Kind.SCHED and e.depth == 0}
            for sched in scheds.values():
                if sched.target in rewound:
                    continue  # the position is set by hand: stepping first is deliberate
                if isinstance(sched.node, ast.Call) and not advances_schedule(model, sched.node):
                    continue  # sets the LR for this update: `step(epoch)`, `lr = s.step()`
                if runs_before(paths, sched, Kind.STEP) and not _inside_step_function(paths, sched):
                    node = model.steps.anchor(sched)
                    if seen.first(node):
                        later = [
                            e.chain[0] if e.chain else e.node
                            for p in paths
                            if sched in p
                            for e in p[p.index(sched) + 1 :]
                            if e.kind is Kind.STEP
                        ]
                        fix = self.restructure(
                            move_after_last(model, node, later),
                            "step the scheduler after the optimizer",
                        )
                        yield self.report(node, fix=fix)
