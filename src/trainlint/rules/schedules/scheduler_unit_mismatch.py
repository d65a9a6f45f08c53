"""TL201 scheduler-unit-mismatch."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.model import FileModel
from trainlint.analysis.paths import Reported
from trainlint.analysis.schedules import schedule_for_step
from trainlint.analysis.steps import EPOCH_FUNCTION_NAMES, LOOP_NODES, Event, Kind
from trainlint.rules.base import Invalid, Report, Rule


def _per_batch(model: FileModel, call: ast.Call) -> Event | None:
    """The step-loop event of this scheduler step when it runs once per batch."""
    for loop in model.steps.step_loops:
        for e in loop.of(Kind.SCHED):
            if e.node is call and e.depth == 0:
                return e
    return None


def _per_epoch(model: FileModel, call: ast.Call) -> bool:
    """Runs once per epoch: in a loop that encloses a step loop but is none itself, or in a
    `train_one_epoch`-style function after its batch loop."""
    if _per_batch(model, call) is not None:
        return False
    epoch_ids = {id(e) for e in model.steps.epoch_loops}
    step_ids = model.steps.step_loop_ids
    contexts = model.loop_contexts(call)
    for ctx in contexts:
        loops = [n for n in ctx if isinstance(n, LOOP_NODES)]
        if not loops:
            continue
        innermost = loops[0]
        if id(innermost) in step_ids:
            return False
        if id(innermost) in epoch_ids:
            return True
    fn = model.function_of(call)
    if fn is not None and EPOCH_FUNCTION_NAMES.search(fn.name) and not model.enclosing_loops(call):
        return any(id(loop) in step_ids for loop in model.loops
                   if model.function_of(loop) is fn)
    return False


class SchedulerUnitMismatch(Rule):
    """## What it does
    Flags `scheduler.step()` stepped in the wrong unit: a schedule measured in epochs
    (`StepLR`, `MultiStepLR`, `ExponentialLR`, `ReduceLROnPlateau`, or a
    `CosineAnnealingLR`/`CosineAnnealingWarmRestarts`/`LambdaLR`/`PolynomialLR`/`LinearLR`
    whose length comes from an epoch count) stepped once per batch, or a schedule
    measured in iterations (`OneCycleLR`, `CyclicLR`, anything sized by `len(loader)`,
    `steps_per_epoch`, `total_steps`, `max_steps`, `num_training_steps`) stepped once
    per epoch.

    ## Why is this bad?
    The schedule runs `len(loader)` times too fast or too slow. A cosine decay over
    `T_max=epochs` stepped per batch finishes its half-period after `epochs` batches and
    then climbs back up: one smooth decay becomes periodic warm restarts, with LR spikes
    that blow training up late in the run. A `StepLR(step_size=30)` stepped per batch
    decays the LR to nothing in the first epoch. A `OneCycleLR` stepped per epoch never
    leaves its warmup.

    ## Example
    ```python
    scheduler = CosineAnnealingLR(optimizer, T_max=args.epochs)
    for epoch in range(args.epochs):
        for x, y in loader:
            ...
            optimizer.step()
            scheduler.step()
    ```

    ## Use instead
    ```python
    scheduler = CosineAnnealingLR(optimizer, T_max=args.epochs * len(loader))
    ```
    or step it once per epoch, after the batch loop.

    ## References
    - [How to adjust learning rate](https://pytorch.org/docs/stable/optim.html#how-to-adjust-learning-rate)
    """

    code = "TL201"
    name = "scheduler-unit-mismatch"
    message = "scheduler stepped in the wrong unit"
    triggers = ("lr_scheduler", "Scheduler", "LR(", "LR,", "LR)", "schedule")
    confirm_with = "assert_lr_schedule"
    valid = [
        # epoch schedule stepped per epoch
        """
import torch
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=30)
for epoch in range(90):
    for x, y in loader:
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()
    sched.step()
""",
        # iteration schedule (sized by len(loader)) stepped per batch
        """
from torch.optim import lr_scheduler as S
sched = S.CosineAnnealingLR(opt, T_max=args.epochs * len(train_loader))
for epoch in range(args.epochs):
    for x, y in train_loader:
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()
        sched.step()
""",
        # warm restarts with a fractional epoch (documented usage)
        """
import torch
sched = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=10)
iters = len(loader)
for epoch in range(100):
    for i, (x, y) in enumerate(loader):
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()
        sched.step(epoch + i / iters)
""",
        # length unknown: stay silent
        """
import torch
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cfg.t_max)
for x, y in loader:
    opt.zero_grad()
    crit(model(x), y).backward()
    opt.step()
    sched.step()
""",
        # no torch: a local StepLR
        """
class StepLR:
    def step(self): pass
sched = StepLR()
for x in loader:
    x.backward()
    opt.step()
    sched.step()
""",
    ]
    invalid = [
        Invalid(
            """
import torch
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.epochs)
for epoch in range(args.epochs):
    for x, y in loader:
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()
        sched.step()
""",
            line=8,
        ),
        Invalid(
            """
import torch.optim as optim

def fit(model, loader, epochs):
    opt = optim.SGD(model.parameters(), lr=0.1)
    sched = optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, epochs=epochs, steps_per_epoch=len(loader))
    for epoch in range(epochs):
        for x, y in loader:
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
        sched.step()
""",
            line=11,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        seen = Reported()
        for call in model.calls.get("step", ()):
            sched = schedule_for_step(model, call)
            if sched is None or sched.unit is None:
                continue
            if sched.cls == "CosineAnnealingWarmRestarts" and (call.args or call.keywords):
                continue  # step(epoch + i / iters) is the documented per-batch form
            event = _per_batch(model, call)
            if event is not None and sched.unit == "epoch":
                node = model.steps.anchor(event)
                if seen.first(node):
                    yield self.report(
                        node,
                        f"`{sched.cls}` counts epochs but is stepped every batch: the "
                        "schedule runs len(loader) times too fast; step it once per epoch, or size it in steps",
                    )
            elif event is None and sched.unit == "iteration" and _per_epoch(model, call):
                if seen.first(call):
                    yield self.report(
                        call,
                        f"`{sched.cls}` counts iterations but is stepped once per epoch: the "
                        "schedule barely moves; step it after every batch",
                    )
