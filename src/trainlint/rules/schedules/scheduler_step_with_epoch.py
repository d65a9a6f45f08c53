"""TL205 scheduler-step-with-epoch."""

from __future__ import annotations

from collections.abc import Iterator

from trainlint.analysis.model import FileModel
from trainlint.analysis.schedules import LR_SCHEDULER, schedule_for_step
from trainlint.rules.base import Invalid, Report, Rule


class SchedulerStepWithEpoch(Rule):
    """## What it does
    Flags `scheduler.step(epoch)` / `scheduler.step(i)` with an argument, on a
    torch scheduler other than `ReduceLROnPlateau` (whose `step(metric)` is right) and
    `CosineAnnealingWarmRestarts` (whose fractional-epoch `step(epoch + i / iters)` is
    documented).

    ## Why is this bad?
    The epoch argument is deprecated: it sets the scheduler's position (`last_epoch`) to
    the value passed, through a closed form where the scheduler has one, instead of
    advancing it by one. Called as usual after an epoch with the epoch just finished,
    `step(epoch)` leaves `last_epoch` where the previous `step()` had put it: every
    epoch runs with the previous epoch's LR. Chained and sequential schedulers
    (`SequentialLR`, `ChainedScheduler`) do not support the argument correctly, and a
    batch counter as the argument moves an epoch schedule once per batch.

    ## Example
    ```python
    for epoch in range(epochs):
        train(...)
        scheduler.step(epoch)
    ```

    ## Use instead
    ```python
    for epoch in range(epochs):
        train(...)
        scheduler.step()
    ```

    ## References
    - [PyTorch 1.4 release notes: the epoch parameter of step() is deprecated](https://github.com/pytorch/pytorch/releases/tag/v1.4.0)
    """

    code = "TL205"
    name = "scheduler-step-with-epoch"
    message = (
        "`scheduler.step(n)` passes the deprecated epoch argument: it sets the schedule's "
        "position to `n` instead of advancing it (one step behind when `n` counts the "
        "epochs already done); call `scheduler.step()` with no argument"
    )
    severity = "warning"
    triggers = ("step(",)
    valid = [
        """
import torch
s = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
for epoch in range(10):
    s.step(val_loss)
""",
        """
import torch
s = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=5)
for epoch in range(10):
    for i in range(100):
        s.step(epoch + i / 100)
""",
        # a timm scheduler takes the epoch by design
        """
from timm.scheduler import create_scheduler
lr_scheduler, _ = create_scheduler(args, opt)
for epoch in range(10):
    lr_scheduler.step(epoch + 1)
""",
        # no torch
        """
class S:
    def step(self, e): pass
s = S()
s.step(3)
""",
    ]
    invalid = [
        Invalid(
            """
from torch.optim.lr_scheduler import StepLR as Step
s = Step(opt, step_size=10)
for epoch in range(100):
    train()
    s.step(epoch)
""",
            line=5,
        ),
        Invalid(
            """
import torch
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda it: (1 - it / total) ** 0.9)
for it, batch in enumerate(loader):
    opt.step()
    sched.step(epoch=it)
""",
            line=5,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        for call in model.calls.get("step", ()):
            if not call.args and not call.keywords:
                continue
            sched = schedule_for_step(model, call)
            if sched is None or sched.cls in ("ReduceLROnPlateau", "CosineAnnealingWarmRestarts"):
                continue
            qual = sched.binding.qualname or ""
            if not (qual.startswith(LR_SCHEDULER) or qual.startswith("transformers")):
                continue
            yield self.report(call)
