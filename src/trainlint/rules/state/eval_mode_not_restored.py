"""TL701 eval-mode-not-restored."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.model import LOOP_NODES, FileModel
from trainlint.analysis.steps import Event, Kind
from trainlint.rules.base import Invalid, Report, Rule


def _same_module(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return True
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


class EvalModeNotRestored(Rule):
    """## What it does
    Flags `model.eval()` inside a training loop (typically validation in the epoch
    loop) when no `model.train()` follows before the next training step, on some path
    through the loop (the next iteration included).

    ## Why is this bad?
    `eval()` switches dropout off and makes batch-norm use its running statistics. If
    training resumes without `train()`, every epoch after the first validation trains
    with dropout disabled and frozen batch-norm statistics: the model overfits or stops
    improving, with no error, and only the learning curves hint at it.

    ## Example
    ```python
    model.train()
    for epoch in range(epochs):
        for x, y in loader:
            ...
        model.eval()
        validate(model, val_loader)
    ```

    ## Use instead
    ```python
    for epoch in range(epochs):
        model.train()
        for x, y in loader:
            ...
        model.eval()
        validate(model, val_loader)
    ```

    ## References
    - [torch.nn.Module.eval](https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.eval)
    """

    code = "TL701"
    name = "eval-mode-not-restored"
    message = (
        "`eval()` in the training loop and no `train()` before the next training step: dropout and batch norm stay in eval mode; call `.train()` after evaluating"
    )
    triggers = ("eval(",)
    confirm_with = None  # weights still update in eval mode
    valid = [
        """
import torch
for epoch in range(10):
    model.train()
    for x, y in loader:
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()
    model.eval()
    validate(model)
""",
        # train() restored inside the training helper
        """
import torch

def train_one_epoch(model, loader, opt):
    model.train()
    for x, y in loader:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

def evaluate(model, loader):
    model.eval()
    with torch.no_grad():
        for x, y in loader:
            model(x)

for epoch in range(10):
    train_one_epoch(model, loader, opt)
    evaluate(model, val_loader)
""",
        # nanoGPT: evaluation helper switches back itself
        """
import torch
@torch.no_grad()
def estimate_loss():
    model.eval()
    out = model(val_x)
    model.train()
    return out

while True:
    if it % eval_interval == 0:
        estimate_loss()
    loss = model(x).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
""",
        # final evaluation after training
        """
import torch
for epoch in range(10):
    for x, y in loader:
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()
model.eval()
""",
        # no torch
        """
for epoch in range(3):
    for x in data:
        x.backward()
        opt.step()
    model.eval()
""",
    ]
    invalid = [
        Invalid(
            """
import torch
model.train()
for epoch in range(10):
    for x, y in loader:
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        val = sum(crit(model(x), y).item() for x, y in val_loader)
""",
            line=8,
        ),
        Invalid(
            """
import torch.nn as nn
net = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))

def validate(net, loader):
    net.eval()
    return [net(x) for x, _ in loader]

def train(net, loader, opt):
    for x, y in loader:
        opt.zero_grad()
        net(x).sum().backward()
        opt.step()

for epoch in range(20):
    train(net, loader, opt)
    if epoch % 5 == 0:
        validate(net, val_loader)
""",
            line=5,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        steps = model.steps
        loops: list[tuple[ast.AST, list[tuple[Event, ...]]]] = []
        for ep in steps.epoch_loops:
            paths, precise = steps.loop_paths(ep)
            if precise:
                loops.append((ep, paths))
        for sl in steps.step_loops:
            if sl.precise and isinstance(sl.node, LOOP_NODES):
                loops.append((sl.node, sl.paths))
        seen: set[int] = set()
        for _loop, paths in loops:
            # What the start of an iteration looks like on every path: does some path
            # train before any train()? (for each eval target)
            for path in paths:
                for i, e in enumerate(path):
                    if e.kind is not Kind.EVAL or id(e.node) in seen:
                        continue
                    if self._trains_before_restore(path[i + 1 :], e.target) or any(
                        self._trains_before_restore(p, e.target) is True
                        and not self._restores_before_end(path[i + 1 :], e.target)
                        for p in paths
                    ):
                        seen.add(id(e.node))
                        yield self.report(e.node)

    @staticmethod
    def _trains_before_restore(events: tuple[Event, ...], target: str | None) -> bool:
        for e in events:
            if e.kind is Kind.TRAIN and _same_module(e.target, target):
                return False
            if e.kind is Kind.EVAL and _same_module(e.target, target):
                continue
            if e.kind in (Kind.BACKWARD, Kind.STEP):
                return True
        return False

    @staticmethod
    def _restores_before_end(events: tuple[Event, ...], target: str | None) -> bool:
        return any(e.kind is Kind.TRAIN and _same_module(e.target, target) for e in events)
