"""TL402 synchronize-in-loop."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.model import FileModel
from trainlint.analysis.paths import Reported
from trainlint.rules.base import Invalid, Report, Rule


class SynchronizeInLoop(Rule):
    """## What it does
    Flags `torch.cuda.synchronize()`, `torch.cuda.current_stream().synchronize()` and
    `torch.xpu.synchronize()` on every step of a training loop.

    ## Why is this bad?
    An explicit synchronize blocks the host until every queued kernel has finished, so
    the CPU can no longer prepare the next step while the GPU computes. Left in from a
    timing experiment it costs throughput on every step, silently. Timing code belongs
    under a profiling flag or a rate-limiting `if`.

    ## Example
    ```python
    for x, y in loader:
        ...
        optimizer.step()
        torch.cuda.synchronize()
    ```

    ## Use instead
    ```python
    for step, (x, y) in enumerate(loader):
        ...
        optimizer.step()
        if step % 100 == 0:
            torch.cuda.synchronize()
            log_step_time()
    ```

    ## References
    - [CUDA semantics: asynchronous execution](https://pytorch.org/docs/stable/notes/cuda.html#asynchronous-execution)
    """

    code = "TL402"
    name = "synchronize-in-loop"
    message = (
        "device synchronize on every training step: the host waits for the GPU each batch; remove it or run it only when timing"
    )
    triggers = ("synchronize",)
    confirm_with = "assert_step_time_stable"
    valid = [
        """
import torch
for step, x in enumerate(loader):
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
    if step % 100 == 0:
        torch.cuda.synchronize()
""",
        """
import torch
for x in loader:
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
torch.cuda.synchronize()
""",
        # a distributed barrier-like object of its own
        """
import torch
for x in loader:
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
    clock.synchronize()
""",
        # no torch
        """
for x in items:
    x.backward()
    opt.step()
    device.synchronize()
""",
    ]
    invalid = [
        Invalid(
            """
import torch
for x in loader:
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
    torch.cuda.synchronize()
""",
            line=6,
        ),
        Invalid(
            """
from torch import cuda

class Trainer:
    def train_step(self, batch):
        self.opt.zero_grad()
        self.model(batch).mean().backward()
        self.opt.step()
        cuda.current_stream().synchronize()
""",
            line=8,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        calls = list(model.calls_to("torch.cuda.synchronize", "torch.xpu.synchronize",
                                    "torch.mps.synchronize", "torch.cuda.Stream.synchronize"))
        for call in model.calls.get("synchronize", ()):
            func = call.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call) and (
                model.qualname(func.value.func) in ("torch.cuda.current_stream",
                                                    "torch.cuda.default_stream")
            ):
                calls.append(call)
        seen = Reported()
        for call in calls:
            found = model.steps.per_step(call)
            if found is not None and seen.first(found[1]):
                yield self.report(found[1])
