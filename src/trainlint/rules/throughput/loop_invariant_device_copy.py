"""TL404 loop-invariant-device-copy."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.devices import device_copy
from trainlint.analysis.invariants import invariant_in
from trainlint.analysis.model import FileModel
from trainlint.analysis.steps import STEP_LOOP_TRIGGERS
from trainlint.rules.base import Invalid, Report, Rule


def _device_copy(model: FileModel, call: ast.Call) -> ast.Name | None:
    """The local name moved by ``name.to(device)`` / ``name.cuda()``."""
    moved = device_copy(model, call)
    return moved if isinstance(moved, ast.Name) else None


def _pos(node: ast.AST) -> tuple[int, int]:
    return node.lineno, node.col_offset  # type: ignore[attr-defined]


def _loops_around(
    model: FileModel, node: ast.AST, loops: dict[int, ast.For | ast.AsyncFor | ast.While]
) -> list[ast.For | ast.AsyncFor | ast.While]:
    """The ``loops`` whose body holds ``node`` at any depth, outermost first."""
    found = []
    child = node
    for anc in model.ancestors(node):
        loop = loops.get(id(anc))
        if loop is not None and any(s is child for s in loop.body):
            found.append(loop)
        child = anc
    found.reverse()
    return found


class LoopInvariantDeviceCopy(Rule):
    """## What it does
    Flags `x.to(device)` / `x.cuda()` on every step of a training loop when `x` is the
    same object on every iteration: a tensor or module bound before the loop, which the
    loop neither rebinds nor changes in place. Typical cases are full-batch training
    (`model(X.to(device))` for every epoch of a tiny dataset), class weights or a mask
    moved inside the step, and `model.to(device)` repeated in the loop. Only local names
    are considered; a copy in a rate-limited branch is fine.

    ## Why is this bad?
    A tensor that lives on the host is copied to the GPU again on every step: a
    host-to-device transfer of the same bytes, synchronous unless it is pinned and
    `non_blocking`, that stalls the step while the GPU waits. For a dataset moved whole
    it can cost more than the step itself. A module already on the device makes
    `.to()` walk every parameter and buffer each step for nothing.

    No runtime check confirms it: the copy costs the same on every step, and
    `assert_step_time_stable` looks for steps that get slower, not for a constant cost.

    ## Example
    ```python
    X, y = load_dataset()
    for epoch in range(epochs):
        optimizer.zero_grad()
        loss = criterion(model(X.to(device)), y.to(device))
        loss.backward()
        optimizer.step()
    ```

    ## Use instead
    ```python
    X, y = load_dataset()
    X, y = X.to(device), y.to(device)
    for epoch in range(epochs):
        optimizer.zero_grad()
        loss = criterion(model(X), y)
        loss.backward()
        optimizer.step()
    ```

    ## References
    - [CUDA semantics: pinned memory buffers](https://pytorch.org/docs/stable/notes/cuda.html#use-pinned-memory-buffers)
    - [Performance tuning guide](https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html)
    """

    code = "TL404"
    severity = "warning"  # costs time or reproducibility, the training itself is right
    name = "loop-invariant-device-copy"
    message = "the same tensor is copied to the device on every step: move it once, before the loop"
    triggers = STEP_LOOP_TRIGGERS
    valid = [
        # the batch changes every step
        """
import torch
for x, y in loader:
    x, y = x.to(device), y.to(device)
    opt.zero_grad()
    crit(model(x), y).backward()
    opt.step()
""",
        # moved once, before the loop; a dtype cast is not a device copy
        """
import torch
X = X.to(device)
weights = class_weights.cuda()
for epoch in range(100):
    opt.zero_grad()
    loss = crit(model(X.to(torch.float32)), y, weight=weights)
    loss.backward()
    opt.step()
""",
        # the source is refilled in place every step (a pinned staging buffer)
        """
import torch
staging = torch.empty(64, 3, 224, 224).pin_memory()
for batch in batches:
    staging.copy_(batch)
    x = staging.to(device, non_blocking=True)
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
""",
        # rebound in the loop, mutated by an unknown call, or changed by a helper's `global`
        """
import torch
for i in range(steps):
    obs = env_obs.to(device)
    loss = policy(obs).mean()
    loss.backward()
    opt.step()
    env.step_into(env_obs)

def refill():
    global buf
    buf = torch.randn(8)

for i in range(steps):
    refill()
    loss = model(buf.to(device)).sum()
    loss.backward()
    opt.step()
""",
        # once per epoch, outside the step loop; in evaluation
        """
import torch
for epoch in range(epochs):
    model.to(device)
    for x, y in loader:
        opt.zero_grad()
        crit(model(x.to(device)), y.to(device)).backward()
        opt.step()
    with torch.no_grad():
        for x in val_loader:
            acc = metric(model(x.cuda()), labels.cuda())
""",
        # shadowed: a local `torch` object is not the torch module, and no torch at all
        """
def go(X, steps):
    for i in range(steps):
        opt.zero_grad()
        loss = model(X.to(device)).sum()
        loss.backward()
        opt.step()
""",
    ]
    invalid = [
        Invalid(
            """
import torch
X, y = load()
for epoch in range(epochs):
    optimizer.zero_grad()
    loss = criterion(model(X.to(device)), y.to(device))
    loss.backward()
    optimizer.step()
""",
            lines=(5, 5),
        ),
        # class weights and a module moved inside the step loop, with `.cuda()`
        Invalid(
            """
import torch
import torch.nn.functional as F
net = Net()
w = torch.tensor([1.0, 4.0])
for images, labels in train_loader:
    net.cuda()
    images, labels = images.cuda(), labels.cuda()
    out = net(images)
    loss = F.cross_entropy(out, labels, weight=w.to(torch.device("cuda")))
    opt.zero_grad()
    loss.backward()
    opt.step()
""",
            lines=(6, 9),
        ),
        # a function's argument moved on every step of its loop
        Invalid(
            """
import torch

def fit(model, features, targets, device, steps=1000):
    opt = torch.optim.LBFGS(model.parameters())
    for step in range(steps):
        opt.zero_grad()
        pred = model(features.to(device, non_blocking=True))
        loss = torch.nn.functional.mse_loss(pred, targets.to(device))
        loss.backward()
        opt.step()
""",
            lines=(7, 8),
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        if not model.imports_module("torch"):
            return
        loops = {id(loop): loop for loop in model.steps.statement_loops}
        if not loops:
            return
        # Only `x.to(...)` and `x.cuda()` copy: found by name, then each step loop whose
        # body holds the call (through its parents), outermost first.
        calls = sorted([*model.calls.get("to", ()), *model.calls.get("cuda", ())], key=_pos)
        for node in calls:
            name = _device_copy(model, node)
            if name is None:
                continue
            for loop in _loops_around(model, node, loops):
                if model.function_of(node) is not model.function_of(loop):
                    continue
                if model.steps.per_step(node) is None:
                    continue
                if not invariant_in(model, loop, name.id):
                    continue
                yield self.report(node, self._message(name.id, node))
                break

    @staticmethod
    def _message(name: str, call: ast.Call) -> str:
        how = (
            "`.cuda()`"
            if isinstance(call.func, ast.Attribute) and (call.func.attr == "cuda")
            else "`.to(device)`"
        )
        return (
            f"`{name}` does not change in the loop, yet {how} copies it to the device on "
            "every step: move it once, before the loop"
        )
