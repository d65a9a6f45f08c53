"""TL201 scheduler-unit-mismatch."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.model import FileModel, keyword
from trainlint.analysis.paths import Reported
from trainlint.analysis.schedule_units import (
    kind_guarded,
    per_batch_event,
    runs_per_epoch,
    sized_in_iterations,
)
from trainlint.analysis.schedules import Schedule, schedule_for_step
from trainlint.rules.base import Invalid, Report, Rule

_LENGTH_KEYWORDS = (
    "T_max",
    "T_0",
    "step_size",
    "milestones",
    "total_steps",
    "epochs",
    "steps_per_epoch",
    "total_iters",
    "num_training_steps",
    "step_size_up",
)


def _length_site(sched: Schedule) -> tuple[tuple[ast.AST, str], ...]:
    """Where the schedule's length is given (`T_max=...`), else its construction."""
    call = sched.binding.call
    if call is None:
        return ()
    for name in _LENGTH_KEYWORDS:
        value = keyword(call, name)
        if value is not None:
            return ((value, f"`{name}` sets the schedule's length here"),)
    return ((call, "the scheduler is built here"),)


class SchedulerUnitMismatch(Rule):
    """## What it does
    Flags `scheduler.step()` stepped in the wrong unit: a schedule measured in epochs
    (`StepLR`, `MultiStepLR`, `ExponentialLR`, `ReduceLROnPlateau`, or a
    `CosineAnnealingLR`/`CosineAnnealingWarmRestarts`/`LambdaLR`/`PolynomialLR`/`LinearLR`
    whose length comes from an epoch count) stepped once per batch, or a schedule
    measured in iterations (`OneCycleLR`, `CyclicLR`, anything sized by `len(loader)`,
    `steps_per_epoch`, `total_steps`, `max_steps`, `num_training_steps`) stepped once
    per epoch. A `StepLR`/`MultiStepLR` sized in iterations (a step size or milestone of
    1000 or more, written directly, as a default or as a named constant, or a name with
    `iter` in it) counts iterations; a step under a test of which scheduler was built (an
    `isinstance`, a scheduler name, a flag set where the scheduler is built) is not
    judged.

    A step under a test on the epoch's last batch (`if self.trainer.is_last_batch:`,
    `if i == len(loader) - 1:`) runs once per epoch.

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
        # stepped inside the training step, but only on the epoch's last batch
        """
import torch
import lightning as L

class GAN(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.opt = torch.optim.AdamW(self.parameters())
        self.sched = torch.optim.lr_scheduler.ExponentialLR(self.opt, gamma=0.999)

    def training_step(self, batch, batch_idx):
        self.opt.zero_grad()
        self.manual_backward(self(batch).mean())
        self.opt.step()
        if self.trainer.is_last_batch:
            self.sched.step()
""",
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
        # milestones in iterations (large constants), stepped per batch
        """
import torch
sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[60000, 80000], gamma=0.1)
for epoch in range(args.epochs):
    for x, y in loader:
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()
        sched.step()
""",
        # a step size in iterations given as a default, or by a name that says so
        """
import torch

def build_scheduler(opt, step_size=20000, gamma=0.5):
    return torch.optim.lr_scheduler.StepLR(opt, step_size=step_size, gamma=gamma)

sched = build_scheduler(opt)
decay = torch.optim.lr_scheduler.StepLR(opt2, step_size=cfg.lr_decay_iters)
for epoch in range(args.epochs):
    for x, y in loader:
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()
        sched.step()
        decay.step()
""",
        # milestones read from a config entry named "steps": detectron2 counts those in
        # iterations, torchvision in epochs, so a per-batch step is not judged
        """
import torch
sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=cfg.SOLVER.STEPS, gamma=0.1)
for it, (x, y) in enumerate(loader):
    opt.zero_grad()
    crit(model(x), y).backward()
    opt.step()
    sched.step()
""",
        # a flag set where each scheduler is built decides where it steps
        """
import torch
from torch.optim import lr_scheduler

if args.scheduler == "onecycle":
    scheduler = lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=args.epochs * len(loader))
    fine_grained = True
else:
    scheduler = lr_scheduler.StepLR(opt, step_size=30)
    fine_grained = False
for epoch in range(args.epochs):
    for x, y in loader:
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()
        if fine_grained:
            scheduler.step()
    if not fine_grained:
        scheduler.step()
""",
        # the step chosen by the scheduler's type
        """
from torch.optim import lr_scheduler

def make_scheduler(name, opt, epochs, steps):
    if name == "onecycle":
        return lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=epochs * steps)
    return lr_scheduler.MultiStepLR(opt, milestones=[30, 60])

scheduler = make_scheduler(args.sched, opt, args.epochs, len(loader))
for epoch in range(args.epochs):
    for x, y in loader:
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()
        if isinstance(scheduler, lr_scheduler.OneCycleLR):
            scheduler.step()
    if isinstance(scheduler, lr_scheduler.MultiStepLR):
        scheduler.step()
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
        # a step size in epochs (a small constant) stepped per batch, under a flag that
        # says nothing about the scheduler
        Invalid(
            """
import torch
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=30, gamma=0.1)
for epoch in range(90):
    for x, y in loader:
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()
        if use_schedule:
            sched.step()
""",
            line=9,
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
            if kind_guarded(model, call):
                continue
            if sched.unit == "epoch" and sized_in_iterations(model, sched):
                continue  # its sizes count iterations: per-batch is its unit
            event = per_batch_event(model, call)
            if event is not None and sched.unit == "epoch":
                node = model.steps.anchor(event)
                if seen.first(node):
                    yield self.report(
                        node,
                        f"`{sched.cls}` counts epochs but is stepped every batch: the "
                        "schedule runs len(loader) times too fast; step it once per epoch, "
                        "or size it in steps",
                        related=_length_site(sched),
                    )
            elif event is None and sched.unit == "iteration" and runs_per_epoch(model, call):
                if seen.first(call):
                    yield self.report(
                        call,
                        f"`{sched.cls}` counts iterations but is stepped once per epoch: the "
                        "schedule barely moves; step it after every batch",
                        related=_length_site(sched),
                    )
