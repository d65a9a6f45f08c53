"""TL206 hand-rolled-lr-starts-at-zero."""

from __future__ import annotations

from collections.abc import Iterator

from trainlint.analysis.constants import is_zero
from trainlint.analysis.lr_assignments import FirstStep, first_iteration_env, lr_writes
from trainlint.analysis.lr_objects import construction_writes
from trainlint.analysis.model import FileModel
from trainlint.rules.base import Invalid, Report, Rule


class HandRolledLrStartsAtZero(Rule):
    """## What it does
    Flags a learning rate written by hand into `optimizer.param_groups` inside a
    training loop (`opt.param_groups[0]["lr"] = lr`, `for g in opt.param_groups:
    g["lr"] = lr`, or a same-file `set_lr(opt, lr)` helper that does it) whose value on
    the loop's first iteration is 0: a warmup computed as `base_lr * it / warmup_iters`
    from a counter that starts at 0. The value is evaluated statically with the loop
    counters at their first value (`range` start, `enumerate` start, a counter set
    before the loop and incremented in it, or an entry of a dict such as litgpt's
    `state["iter_num"]`, set before the loop or by every same-file caller, that no call
    in the loop receives), the assignments that precede it in the
    loop body and simple same-file functions such as `get_lr(it)`. A value that is
    still 0 on the second iteration (a group frozen on purpose) or that cannot be
    evaluated is not reported.

    A schedule object that writes the LR into its optimizer's groups from a method its
    constructor calls (`self.step(self.num_iters)` in `__init__`, Megatron's
    `AnnealingLR`) is run statically from its construction: its counter's first value
    comes from the constant every construction in the project passes, or the default.

    ## Why is this bad?
    The first optimizer update runs at LR 0 and does nothing: with Adam the moment
    estimates absorb a step that never moved the weights, and a short fine-tune loses a
    real fraction of its updates. nanoGPT's `get_lr` had this form and was changed to
    `(it + 1) / (warmup_iters + 1)` for this reason. It is the hand-written counterpart
    of TL203 (`LambdaLR(opt, lambda s: s / warmup)`).

    ## Example
    ```python
    def get_lr(it):
        if it < warmup_iters:
            return learning_rate * it / warmup_iters
        ...

    for it in range(max_iters):
        lr = get_lr(it)
        for group in optimizer.param_groups:
            group["lr"] = lr
        ...
    ```

    ## Use instead
    ```python
    def get_lr(it):
        if it < warmup_iters:
            return learning_rate * (it + 1) / (warmup_iters + 1)
        ...
    ```

    ## References
    - [nanoGPT: warmup starting above 0](https://github.com/karpathy/nanoGPT/blob/master/train.py)
    """

    code = "TL206"
    name = "hand-rolled-lr-starts-at-zero"
    message = (
        "hand-written LR schedule sets the LR to 0 on the first step: the first update "
        "does nothing; start the warmup above 0, e.g. `(it + 1) / (warmup + 1)`"
    )
    triggers = ("param_groups",)
    test_files = False
    confirm_with = "assert_weights_updated"
    valid = [
        # the same object, its warmup counted from max(1, it)
        """
class WarmupLR:
    def __init__(self, optimizer, base_lr, warmup, start_iter=0):
        self.optimizer = optimizer
        self.base_lr = base_lr
        self.warmup = warmup
        self.it = start_iter
        self.step(self.it)

    def get_lr(self):
        if self.warmup > 0 and self.it < self.warmup:
            return self.base_lr * max(1, self.it) / self.warmup
        return self.base_lr

    def step(self, it=None):
        self.it = self.it + 1 if it is None else it
        for group in self.optimizer.param_groups:
            group["lr"] = self.get_lr()
""",
        # warmup from (it + 1): above 0 on the first step
        """
import torch

def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    return learning_rate

for it in range(max_iters):
    lr = get_lr(it)
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss = model(x).sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
""",
        # cleanrl's annealing: counts from 1, LR is the full rate on the first update
        """
import torch

for update in range(1, num_updates + 1):
    frac = 1.0 - (update - 1.0) / num_updates
    optimizer.param_groups[0]["lr"] = frac * args.learning_rate
    for epoch in range(update_epochs):
        loss = agent.loss(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
""",
        # a frozen group: 0 whatever the step, on purpose
        """
import torch

for step, batch in enumerate(loader):
    optimizer.param_groups[1]["lr"] = 0.0 if step < 100 else base_lr
    optimizer.zero_grad()
    model(batch).sum().backward()
    optimizer.step()
""",
        # the counter is incremented before the LR is computed
        """
import torch

step = 0
for x in loader:
    step += 1
    for g in opt.param_groups:
        g["lr"] = base_lr * min(1.0, step / warmup)
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
""",
        # the schedule is only applied after the first epoch
        """
import torch

for epoch in range(epochs):
    if epoch > 0:
        for g in opt.param_groups:
            g["lr"] = base_lr * epoch / epochs
    for x in loader:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
""",
        # shadowed: `param_groups` of a project object that is a plain dict store
        """
def tune(store, steps):
    for step in range(steps):
        store.param_groups[0]["lr"] = step * 0.1
        store.commit()
""",
        # a counter kept in a dict, handed whole to a helper in the loop: it may move it
        """
import torch

def fit(state, optimizer, loader):
    for batch in loader:
        lr = 3e-4 * state["iter_num"] / 100
        for g in optimizer.param_groups:
            g["lr"] = lr
        train_step(state, batch)
        state["iter_num"] += 1

state = {"iter_num": 0}
fit(state, optimizer, loader)
""",
    ]
    invalid = [
        # a schedule object that writes the LR while it is built (Megatron's AnnealingLR
        # shape): the constructor's first write, at the counter's start, is 0
        Invalid(
            """
class WarmupLR:
    def __init__(self, optimizer, base_lr, warmup, start_iter=0):
        self.optimizer = optimizer
        self.base_lr = base_lr
        self.warmup = warmup
        self.it = start_iter
        self.step(self.it)

    def get_lr(self):
        if self.warmup > 0 and self.it < self.warmup:
            return self.base_lr * self.it / self.warmup
        return self.base_lr

    def step(self, it=None):
        self.it = self.it + 1 if it is None else it
        for group in self.optimizer.param_groups:
            group["lr"] = self.get_lr()
""",
            line=17,
        ),
        # litgpt-style: the counter is an entry of a state dict built by the caller
        Invalid(
            """
import torch

def fit(state, optimizer, loader, warmup_iters=100):
    for batch in loader:
        lr = 3e-4 * state["iter_num"] / warmup_iters
        for g in optimizer.param_groups:
            g["lr"] = lr
        state["iter_num"] += 1
        loss = state["model"](batch).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

def main(resume=None):
    state = {"model": model, "iter_num": 0}
    if resume:
        load_checkpoint(resume, state)
    fit(state, optimizer, loader)
""",
            line=7,
        ),
        Invalid(
            """
import math
import torch

learning_rate, min_lr = 6e-4, 6e-5
warmup_iters, lr_decay_iters, max_iters = 2000, 600000, 600000

def get_lr(it):
    if it < warmup_iters:
        return learning_rate * it / warmup_iters
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * decay_ratio)) * (learning_rate - min_lr)

for it in range(max_iters):
    lr = get_lr(it)
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss = model(x).sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
""",
            line=16,
        ),
        # a setter helper, a hand-kept counter, an aliased import
        Invalid(
            """
import torch as T

def set_lr(opt, value):
    for i, g in enumerate(opt.param_groups):
        g["lr"] = value

global_step = 0
for epoch in range(num_epochs):
    for x, y in loader:
        set_lr(opt, args.lr * min(1.0, global_step / args.warmup_steps))
        opt.zero_grad()
        T.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
        global_step += 1
""",
            line=10,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        for built in construction_writes(model):
            # a schedule object that writes the LR while it is built: the first update
            # runs at that LR (a param-groups write is evidence enough, torch or not)
            if is_zero(built.first) and not is_zero(built.later):
                yield self.report(built.node)
        if not model.imports_training_library:
            return
        training = model.steps.step_loop_ids | {id(e) for e in model.steps.epoch_loops}
        for write in lr_writes(model):
            loops = model.enclosing_loops(model.statement_of(write.node))
            if not loops or not any(id(loop) in training for loop in loops):
                continue
            found = first_iteration_env(model, write.node)
            if found is None:
                continue
            env, counted = found
            if not counted:
                continue
            value = FirstStep(model).expr(write.value, env)
            if not is_zero(value):
                continue
            # a warmup grows from 0; a group held at 0 on purpose stays 0 a step later
            later = first_iteration_env(model, write.node, offset=1)
            if later is None or is_zero(FirstStep(model).expr(write.value, later[0])):
                continue
            yield self.report(write.node)
