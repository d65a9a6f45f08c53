"""TL103 missing-zero-grad."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from trainlint.analysis.grad_clearing import misses_optimizer
from trainlint.analysis.model import FileModel, call_name
from trainlint.analysis.paths import Reported, precise_step_loops
from trainlint.analysis.steps import STEP_LOOP_TRIGGERS, Event, Kind
from trainlint.rules.base import Invalid, Report, Rule

_HOOK_NAME = re.compile(
    r"^(on|before|after)_|hook|callback|trigger|fire_event|dispatch", re.IGNORECASE
)


def _calls_hooks(loop: ast.AST, hooks: set[str]) -> bool:
    """The loop fires a hook: a call named like one, or one naming a zeroing hook of this
    file by string (`self._fire("on_batch_start")`, `getattr(cb, name)(self)` inside)."""
    return any(
        isinstance(n, ast.Call)
        and (
            _HOOK_NAME.search(call_name(n) or "")
            or any(isinstance(a, ast.Constant) and a.value in hooks for a in n.args)
        )
        for n in ast.walk(loop)
    )


def _distributed_autograd(model: FileModel, node: ast.AST) -> bool:
    """`dist_autograd.backward(context_id, [loss])`: gradients go to the context that
    `dist_autograd.context()` opens for this step, and `DistributedOptimizer.step(
    context_id)` reads them there; nothing accumulates in `.grad`."""
    return isinstance(node, ast.Call) and (model.qualname(node.func) or "").startswith(
        "torch.distributed.autograd."
    )


class MissingZeroGrad(Rule):
    """## What it does
    Flags an optimizer step in a training loop where, on some path through the loop body
    (helpers included), backward and the step run but nothing clears the gradients, or
    only another optimizer's are cleared (`opt_g.zero_grad()` each step, never
    `opt_d.zero_grad()`, the two built over the parameters of separate models).
    Distributed-autograd steps (`dist_autograd.backward` in a `dist_autograd.context()`)
    keep their gradients per context and are not reported, nor are loops that fire
    hooks (`call_hook(...)`, `on_*`, `before_*`) when a hook in the file calls
    `zero_grad()`.

    ## Why is this bad?
    `backward()` adds to `.grad`. Without `zero_grad()` every step applies the sum of
    all gradients so far: the effective learning rate grows each batch and training
    diverges or oscillates, with no error. Gradient accumulation is deliberate only when
    the step (and the clearing) happen every N batches; that form stays silent.

    ## Example
    ```python
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    ```

    ## Use instead
    ```python
    for x, y in loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    ```

    ## References
    - [Zeroing out gradients in PyTorch](https://pytorch.org/tutorials/recipes/recipes/zeroing_out_gradients.html)
    """

    code = "TL103"
    name = "missing-zero-grad"
    message = "no `zero_grad()` on this path of the training loop: gradients accumulate across batches; call `optimizer.zero_grad()` once per step"
    triggers = STEP_LOOP_TRIGGERS
    confirm_with = "assert_loss_decreases"
    valid = [
        """
import torch
for x, y in loader:
    optimizer.zero_grad()
    criterion(model(x), y).backward()
    optimizer.step()
""",
        # zeroing by hand, in a nested loop
        """
import torch
for x, y in loader:
    criterion(model(x), y).backward()
    optimizer.step()
    for p in model.parameters():
        p.grad = None
""",
        # accumulation: zero_grad in the step's branch
        """
import torch
for i, (x, y) in enumerate(loader):
    (criterion(model(x), y) / accum).backward()
    if (i + 1) % accum == 0:
        optimizer.step()
        optimizer.zero_grad()
""",
        # accumulation with the clearing at the start of a window
        """
import torch
for i, (x, y) in enumerate(loader):
    if i % accum == 0:
        optimizer.zero_grad()
    (criterion(model(x), y) / accum).backward()
    if (i + 1) % accum == 0:
        optimizer.step()
""",
        # LBFGS closure clears inside the step
        """
import torch.optim as optim
opt = optim.LBFGS(model.parameters())
for x, y in loader:
    def closure():
        opt.zero_grad()
        loss = crit(model(x), y)
        loss.backward()
        return loss
    opt.step(closure)
""",
        # distributed autograd: each step's gradients live in their own context
        """
import torch.distributed.autograd as dist_autograd
from torch import optim
from torch.distributed.optim import DistributedOptimizer

def run_trainer(model, loader):
    opt = DistributedOptimizer(optim.SGD, model.parameter_rrefs(), lr=0.05)
    for x, y in loader:
        with dist_autograd.context() as context_id:
            loss = criterion(model(x), y)
            dist_autograd.backward(context_id, [loss])
            opt.step(context_id)
""",
        # the runner fires a hook that this file implements with the zero_grad
        """
import torch

class ClearGradsHook:
    def before_train_iter(self, runner):
        runner.optimizer.zero_grad()

class Runner:
    def call_hook(self, name):
        for hook in self.hooks:
            getattr(hook, name)(self)

    def train(self, loader):
        for batch in loader:
            self.call_hook("before_train_iter")
            self.model(batch).mean().backward()
            self.optimizer.step()
""",
        # the loop fires the zeroing hook through a dispatcher, by its name
        """
import torch

class ResetGrads:
    def on_batch_start(self, loop):
        loop.opt.zero_grad(set_to_none=True)

class Loop:
    def _emit(self, event):
        for cb in self.callbacks:
            getattr(cb, event)(self)

    def run(self, batches):
        for batch in batches:
            self._emit("on_batch_start")
            self.net(batch).sum().backward()
            self.opt.step()
""",
        # no torch: a game environment
        """
for episode in range(10):
    obs = env.reset()
    for t in range(100):
        obs, reward, done, info = env.step(agent.act(obs))
""",
    ]
    invalid = [
        Invalid(
            """
import torch
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
""",
            line=5,
        ),
        # zero_grad only in the AMP branch
        Invalid(
            """
import torch.optim as optim
opt = optim.AdamW(model.parameters())
for x, y in loader:
    if use_amp:
        scaler.scale(crit(model(x), y)).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    else:
        crit(model(x), y).backward()
        opt.step()
""",
            line=11,
        ),
        # the dispatcher fires only a hook that does not clear the gradients
        Invalid(
            """
import torch

class Reset:
    def on_epoch_start(self, loop):
        loop.opt.zero_grad()

class Loop:
    def _emit(self, event):
        for cb in self.callbacks:
            getattr(cb, event)(self)

    def run(self, batches):
        for batch in batches:
            self.net(batch).sum().backward()
            self.opt.step()
            self._emit("on_batch_end")
""",
            line=15,
        ),
        # zero_grad once per epoch only
        Invalid(
            """
import torch
for epoch in range(10):
    optimizer.zero_grad()
    for x, y in loader:
        criterion(model(x), y).backward()
        optimizer.step()
""",
            line=6,
        ),
        # a loop that fires hooks, in a file whose hooks never clear gradients
        Invalid(
            """
import torch
for batch in loader:
    callbacks.on_batch_begin()
    model(batch).mean().backward()
    optimizer.step()
    callbacks.on_batch_end()
""",
            line=5,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        seen = Reported()
        hooks = {
            fn.name
            for fn in (model.function_of(c) for c in model.calls.get("zero_grad", ()))
            if fn is not None and _HOOK_NAME.search(fn.name)
        }
        for loop in precise_step_loops(model):
            if isinstance(loop.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue  # a step function called from elsewhere: its caller may clear grads
            if hooks and _calls_hooks(loop.node, hooks):
                continue  # a hook of this file clears the gradients when the loop fires it
            has_guarded_zero = any(e.under_counter_guard() for e in loop.of(Kind.ZERO))
            for path in loop.paths:
                kinds = {e.kind for e in path}
                if Kind.STEP not in kinds:
                    continue
                if Kind.ZERO in kinds:
                    # one optimizer cleared, another never: report the other's step
                    found = _uncleared_step(model, path)
                    if found is not None and seen.first(found[0]):
                        yield self.report(found[0], found[1])
                    continue
                if not any(e.kind is Kind.BACKWARD and isinstance(e.node, ast.Call) for e in path):
                    continue  # `p.grad = g` overwrites: nothing accumulates
                if any(
                    e.kind is Kind.BACKWARD and _distributed_autograd(model, e.node) for e in path
                ):
                    continue  # gradients live in the autograd context, fresh each time
                step = next(e for e in path if e.kind is Kind.STEP)
                if step.under_counter_guard() and has_guarded_zero:
                    continue  # accumulation window cleared by a correlated guard
                node = model.steps.anchor(step)
                if seen.first(node):
                    yield self.report(node)


def _uncleared_step(model: FileModel, path: tuple[Event, ...]) -> tuple[ast.AST, str] | None:
    """The anchor of a step on ``path`` whose optimizer no clearing on the path covers,
    where every clearing provably misses it (see ``misses_optimizer``), and the message."""
    zeros = [e for e in path if e.kind is Kind.ZERO]
    for step in (e for e in path if e.kind is Kind.STEP):
        if step.under_counter_guard():
            continue
        if all(misses_optimizer(model, z, step) for z in zeros):
            cleared = ", ".join(f"`{z.target}.zero_grad()`" for z in zeros)
            return model.steps.anchor(step), (
                f"`{step.target}` is stepped but its gradients are never cleared on this path "
                f"of the training loop (only {cleared} runs, over other parameters): they "
                f"accumulate across batches; call `{step.target}.zero_grad()` once per step"
            )
    return None
