"""TL305 allocator-call-in-loop."""

from __future__ import annotations

from collections.abc import Iterator

from trainlint.analysis.model import FileModel
from trainlint.analysis.paths import Reported
from trainlint.rules.base import Invalid, Report, Rule


class AllocatorCallInLoop(Rule):
    """## What it does
    Flags `torch.cuda.empty_cache()`, `torch.cuda.reset_peak_memory_stats()` and
    `gc.collect()` called on every step of a training loop (not under a rate-limiting
    `if`, not in an OOM `except` handler).

    ## Why is this bad?
    `empty_cache()` synchronises and returns cached blocks to the driver, so the next
    step has to `cudaMalloc` them again; `gc.collect()` walks every Python object. Both
    cost milliseconds per step and neither fixes a leak: memory held by live tensors
    (a kept graph, a growing list) is not freed by them. They hide the symptom while
    making every step slower.

    ## Example
    ```python
    for x, y in loader:
        ...
        optimizer.step()
        torch.cuda.empty_cache()
    ```

    ## Use instead
    ```python
    for step, (x, y) in enumerate(loader):
        ...
        optimizer.step()
    torch.cuda.empty_cache()  # once, between phases, if at all
    ```
    and fix the leak itself (see TL302, TL304).

    ## References
    - [CUDA memory management](https://pytorch.org/docs/stable/notes/cuda.html#memory-management)
    """

    code = "TL305"
    name = "allocator-call-in-loop"
    message = (
        "allocator/GC call on every training step: costs time and does not fix leaks; remove it or run it every N steps"
    )
    severity = "warning"
    triggers = ("empty_cache", "reset_peak_memory_stats", "gc.collect", "collect(")
    confirm_with = None  # a constant per-step cost: step-time checks compare steps
    valid = [
        """
import torch
for epoch in range(10):
    for x in loader:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    torch.cuda.empty_cache()
""",
        """
import torch, gc
for step, x in enumerate(loader):
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
    if step % 1000 == 0:
        gc.collect()
""",
        # OOM recovery
        """
import torch
for x in loader:
    try:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
""",
        # no torch
        """
import gc
for item in queue:
    process(item)
    gc.collect()
""",
    ]
    invalid = [
        Invalid(
            """
import torch
for x, y in loader:
    opt.zero_grad()
    crit(model(x), y).backward()
    opt.step()
    torch.cuda.empty_cache()
""",
            line=6,
        ),
        Invalid(
            """
import gc as garbage
import torch

def cleanup():
    garbage.collect()

for epoch in range(3):
    for x in loader:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        cleanup()
""",
            line=12,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        if not model.imports_module("torch"):
            return
        calls = model.calls_to(
            "torch.cuda.empty_cache", "torch.cuda.reset_peak_memory_stats", "gc.collect",
            "torch.cuda.memory.empty_cache", "torch.mps.empty_cache", "torch.xpu.empty_cache",
        )
        seen = Reported()
        for call in calls:
            found = model.steps.per_step(call, limits=lambda g: True)
            if found is None:
                continue
            _, anchor = found
            if seen.first(anchor):
                yield self.report(anchor)
