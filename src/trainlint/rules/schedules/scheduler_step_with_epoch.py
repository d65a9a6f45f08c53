"""TL205 scheduler-step-with-epoch."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.model import FileModel
from trainlint.analysis.schedules import (
    LR_SCHEDULER,
    position_counter,
    schedule_for_step,
    stepped_per_batch,
)
from trainlint.rules.base import Invalid, Report, Rule


class SchedulerStepWithEpoch(Rule):
    """## What it does
    Flags `scheduler.step(n)` on a torch scheduler when the position `n` counts
    something else than the calls: an epoch index passed on every batch (in the batch
    loop, a step function, or a Lightning `lr_scheduler_step` hook whose interval may be
    `"step"`), or the index of `enumerate(loader)`, which starts again at 0 every epoch.
    Not reported: `ReduceLROnPlateau.step(metric)`, the documented fractional
    `step(epoch + i / iters)`, and a position that follows the scheduler's own count
    (`step(epoch)` once per epoch, `step(global_step)` per batch): deprecated, but the
    schedule runs as meant, at most one value behind.

    ## Why is this bad?
    The argument sets the scheduler's position (`last_epoch`) to the value passed,
    through a closed form, instead of advancing it by one. An epoch index passed per
    batch holds a per-iteration schedule (OneCycle, a warmup) at the epoch's position for
    the whole epoch: the LR barely moves and the run degrades with no error. A batch
    index restarts the schedule at 0 every epoch: the warmup and decay repeat each epoch.

    ## Example
    ```python
    for epoch in range(epochs):
        for x, y in loader:
            ...
            optimizer.step()
            scheduler.step(epoch)  # OneCycleLR, sized in iterations
    ```

    ## Use instead
    ```python
    for epoch in range(epochs):
        for x, y in loader:
            ...
            optimizer.step()
            scheduler.step()
    ```

    ## References
    - [PyTorch 1.4 release notes: the epoch parameter of step() is deprecated](https://github.com/pytorch/pytorch/releases/tag/v1.4.0)
    """

    code = "TL205"
    name = "scheduler-step-with-epoch"
    message = (
        "`scheduler.step(epoch)` on every batch: the position is set to the epoch index, "
        "so the schedule stands still for the whole epoch; call `scheduler.step()` with "
        "no argument"
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
        # once per epoch with the epoch index: deprecated, but it follows the schedule's
        # own count (at most one value behind)
        """
from torch.optim.lr_scheduler import MultiStepLR
s = MultiStepLR(opt, milestones=[60, 120], gamma=0.2)
for epoch in range(200):
    train(model, loader, opt)
    s.step(epoch)
""",
        # a global step counter per batch: the position is the schedule's own count
        """
import torch
s = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max_step)
step = 0
for epoch in range(10):
    for x, y in loader:
        crit(model(x), y).backward()
        opt.step()
        step += 1
        s.step(step)
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
from torch.optim.lr_scheduler import OneCycleLR as OneCycle
s = OneCycle(opt, max_lr=0.1, total_steps=len(loader) * 10)
for epoch in range(10):
    for x, y in loader:
        crit(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        s.step(epoch)
""",
            line=8,
        ),
        Invalid(
            """
import torch
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda it: (1 - it / total) ** 0.9)
for epoch in range(10):
    for it, batch in enumerate(loader):
        model(batch).sum().backward()
        opt.step()
        sched.step(epoch=it)
""",
            line=7,
        ),
        # a Lightning hook overriding the step with the epoch while the interval is a
        # batch one
        Invalid(
            """
import torch
import lightning as L

class Module(L.LightningModule):
    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters())
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, 0.01, total_steps=self.steps)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def lr_scheduler_step(self, scheduler, metric):
        scheduler.step(epoch=self.current_epoch)
""",
            line=11,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        for call in model.calls.get("step", ()):
            if not call.args and not call.keywords:
                continue
            counter = position_counter(model, call)
            if counter is None or counter == "epoch" and not stepped_per_batch(model, call):
                continue  # the position follows the schedule's own count
            if not _torch_scheduler(model, call):
                continue
            if counter == "batch":
                yield self.report(call, _BATCH_MESSAGE)
            else:
                yield self.report(call)


_BATCH_MESSAGE = (
    "`scheduler.step(i)` with the batch index of `enumerate(loader)`: the position "
    "starts again at 0 every epoch, so the schedule restarts each epoch; call "
    "`scheduler.step()` with no argument"
)


def _torch_scheduler(model: FileModel, call: ast.Call) -> bool:
    """A torch or transformers scheduler other than ``ReduceLROnPlateau`` (its argument
    is a metric) and ``CosineAnnealingWarmRestarts`` (fractional epochs are documented);
    or the scheduler Lightning hands to an ``lr_scheduler_step`` override."""
    sched = schedule_for_step(model, call)
    if sched is None:
        fn = model.function_of(call)
        recv = call.func.value if isinstance(call.func, ast.Attribute) else None
        return (
            getattr(fn, "name", "") == "lr_scheduler_step"
            and isinstance(recv, ast.Name)
            and recv.id == "scheduler"
        )
    if sched.cls in ("ReduceLROnPlateau", "CosineAnnealingWarmRestarts"):
        return False
    qual = sched.binding.qualname or ""
    return qual.startswith(LR_SCHEDULER) or qual.startswith("transformers")
