"""TL207 hand-rolled-lr-unit-mismatch."""

from __future__ import annotations

from collections.abc import Iterator

from trainlint.analysis.lr_assignments import lr_writes
from trainlint.analysis.lr_units import unit_mismatch
from trainlint.analysis.model import FileModel
from trainlint.rules.base import Invalid, Report, Rule


class HandRolledLrUnitMismatch(Rule):
    """## What it does
    Flags a learning rate written by hand into `optimizer.param_groups` (as TL206 reads
    them: `opt.param_groups[0]["lr"] = lr`, `for g in opt.param_groups: g["lr"] = lr`,
    a same-file `set_lr(opt, lr)`) whose schedule divides a counter by a horizon of
    another unit: a counter that advances once per batch (the batch loop's index, or a
    `step += 1` in the batch loop) over a number of epochs (`num_epochs`,
    `args.epochs`), or the epoch loop's counter over a number of iterations
    (`len(loader)`, `total_steps`, `max_iters`). Names set earlier in the function and
    same-file helpers such as `get_lr(step, args.epochs)` are followed; a fraction with
    any name of unknown unit in its horizon, or with both counters in it (`epoch + i /
    len(loader)`), is not reported, nor a counter whose own loop runs over the horizon
    (`for update in range(num_updates)`). It is the hand-written counterpart of TL201.
    Off by default until the ecosystem check measures its precision.

    ## Why is this bad?
    A cosine or linear decay whose horizon is 100 epochs, driven by a batch counter,
    reaches its end after 100 *batches*: the LR hits its floor (or, for a cosine that
    is not clamped, climbs back up and oscillates) within the first epoch, and the
    rest of training runs at the wrong rate. The reverse, an epoch counter over an
    iteration horizon, barely moves the LR at all. Nothing raises and the loss still
    goes down, only worse.

    ## Example
    ```python
    step = 0
    for epoch in range(args.epochs):
        for x, y in loader:
            lr = base_lr * 0.5 * (1 + math.cos(math.pi * step / args.epochs))
            for g in optimizer.param_groups:
                g["lr"] = lr
            ...
            step += 1
    ```

    ## Use instead
    Measure both in the same unit:
    ```python
    total_steps = args.epochs * len(loader)
    ...
            lr = base_lr * 0.5 * (1 + math.cos(math.pi * step / total_steps))
    ```

    ## References
    - [PyTorch: how to adjust the learning rate](https://pytorch.org/docs/stable/optim.html#how-to-adjust-learning-rate)
    """

    code = "TL207"
    name = "hand-rolled-lr-unit-mismatch"
    message = "hand-written LR schedule counts in one unit and ends in another"
    triggers = ("param_groups",)
    test_files = False
    # Opt-in: no finding on the ecosystem check yet, so no measured precision (its first
    # version misread PPO's `update` loop, 12 false findings in cleanrl).
    default_enabled = False
    confirm_with = "assert_lr_schedule"
    valid = [
        # batch counter over an iteration horizon built from the epochs
        """
import math
import torch

total_steps = args.epochs * len(loader)
step = 0
for epoch in range(args.epochs):
    for x, y in loader:
        lr = base_lr * 0.5 * (1 + math.cos(math.pi * step / total_steps))
        for g in optimizer.param_groups:
            g["lr"] = lr
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
        step += 1
""",
        # epoch counter over epochs, written at every batch
        """
import torch

for epoch in range(num_epochs):
    for x, y in loader:
        for g in optimizer.param_groups:
            g["lr"] = base_lr * (1 - epoch / num_epochs)
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
""",
        # fractional epoch: `epoch + i / len(loader)` over epochs
        """
import math
import torch

for epoch in range(args.epochs):
    for i, (x, y) in enumerate(loader):
        t = (epoch + i / len(loader)) / args.epochs
        for g in optimizer.param_groups:
            g["lr"] = base_lr * 0.5 * (1 + math.cos(math.pi * t))
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
""",
        # a horizon of unknown unit (a bare parameter): silent
        """
import torch

def train(model, optimizer, loader, epochs, horizon):
    step = 0
    for epoch in range(epochs):
        for x, y in loader:
            for g in optimizer.param_groups:
                g["lr"] = base_lr * (1 - step / horizon)
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
            step += 1
""",
        # PPO (cleanrl): the outer loop counts updates over `num_updates`, its own bound
        """
import torch

num_updates = total_timesteps // batch_size
for update in range(1, num_updates + 1):
    frac = 1.0 - (update - 1.0) / num_updates
    optimizer.param_groups[0]["lr"] = frac * learning_rate
    for epoch in range(update_epochs):
        for start in range(0, batch_size, minibatch_size):
            optimizer.zero_grad()
            agent.loss(start).backward()
            optimizer.step()
""",
        # shadowed: `param_groups` of a non-optimizer written outside any training loop
        """
class Config:
    param_groups = [{"lr": 0.1}]

cfg = Config()
for epoch in range(num_epochs):
    cfg.param_groups[0]["lr"] = 0.1 * (1 - epoch / total_steps)
""",
    ]
    invalid = [
        # a batch counter over an epoch count (inline cosine)
        Invalid(
            """
import math
import torch

step = 0
for epoch in range(args.epochs):
    for x, y in loader:
        lr = base_lr * 0.5 * (1 + math.cos(math.pi * step / args.epochs))
        for g in optimizer.param_groups:
            g["lr"] = lr
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
        step += 1
""",
            line=9,
        ),
        # through a helper: `get_lr(global_step, num_epochs)` with an aliased import
        Invalid(
            """
import math as m
import torch

def get_lr(it, total):
    return min_lr + 0.5 * (max_lr - min_lr) * (1 + m.cos(m.pi * it / total))

def set_lr(optimizer, lr):
    for group in optimizer.param_groups:
        group["lr"] = lr

global_step = 0
for epoch in range(num_epochs):
    for batch in loader:
        set_lr(optimizer, get_lr(global_step, num_epochs))
        optimizer.zero_grad()
        model(batch).mean().backward()
        optimizer.step()
        global_step += 1
""",
            line=14,
        ),
        # the reverse: the epoch counter over an iteration count
        Invalid(
            """
import torch

total_steps = num_epochs * len(loader)
for epoch in range(num_epochs):
    optimizer.param_groups[0]["lr"] = base_lr * (1 - epoch / total_steps)
    for x, y in loader:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
""",
            line=5,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        if not model.imports_training_library:
            return
        for write in lr_writes(model):
            found = unit_mismatch(model, write.node, write.value)
            if found is None:
                continue
            if found.counter_unit == "batch":
                text = (
                    f"hand-written LR schedule divides `{found.counter}`, which advances "
                    f"once per batch, by `{found.horizon}`, a number of epochs: the "
                    "schedule ends after that many batches; divide by the total number "
                    "of steps (epochs * len(loader))"
                )
            else:
                text = (
                    f"hand-written LR schedule divides the epoch counter `{found.counter}` "
                    f"by `{found.horizon}`, a number of iterations: the LR barely moves; "
                    "divide by the number of epochs, or count batches"
                )
            yield self.report(write.node, text)
