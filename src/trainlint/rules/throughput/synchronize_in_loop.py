"""TL402 synchronize-in-loop."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.model import FUNCTION_NODES, FileModel, call_name
from trainlint.analysis.paths import Reported
from trainlint.analysis.steps import after_limiting_exit
from trainlint.analysis.syncs import queue_drained_before, reads_clock, timing_only_kept
from trainlint.rules.base import Invalid, Report, Rule

_COST = "the host waits for the GPU each batch; remove it or run it only when timing"
_KEPT_COST = (
    "the host waits for the GPU each batch to time a step whose time is only kept for "
    "after the loop; take the wall-clock time of the whole run instead"
)


def _times_next(model: FileModel, call: ast.Call) -> bool:
    """Is the statement run right after ``call`` a clock read? `synchronize(); t0 =
    time.perf_counter()`, or a `time_sync()` helper that synchronizes and returns
    `time.time()`: the synchronize is there to make that reading honest."""
    cur: ast.AST = model.statement_of(call)
    for anc in model.ancestors(cur):
        for field_name in ("body", "orelse", "finalbody"):
            block = getattr(anc, field_name, None)
            if not (isinstance(block, list) and any(s is cur for s in block)):
                continue
            ids = [id(s) for s in block]
            i = ids.index(id(cur))
            if i + 1 < len(block):
                return reads_clock(model, block[i + 1])
        if isinstance(anc, (*FUNCTION_NODES, ast.ClassDef, ast.For, ast.AsyncFor, ast.While)):
            return False
        cur = anc
    return False


class SynchronizeInLoop(Rule):
    """## What it does
    Flags `torch.cuda.synchronize()`, `torch.cuda.current_stream().synchronize()` and
    `torch.xpu.synchronize()` on every step of a training loop. A synchronize right
    before a clock read (`torch.cuda.synchronize(); t0 = time.perf_counter()`, or a
    `time_sync()` helper that synchronizes and returns `time.time()`, or CUDA events'
    `start.elapsed_time(end)`, a CUDA event's `start.record()`, a timer's `tic()`/`toc()`)
    is deliberate timing and is not reported, unless the time read is only appended to a
    list that nothing in the loop reads (a summary after training); neither is one under a rate-limiting `if`,
    nor one right after a host read of a tensor (`loss.item()`) with no device work
    queued since: the host already waited there, so it waits for nothing more.

    ## Why is this bad?
    An explicit synchronize blocks the host until every queued kernel has finished, so
    the CPU can no longer prepare the next step while the GPU computes. One with no
    clock read after it (left over from a debugging session, or added "to be safe"
    after a copy already ordered with `wait_stream`) buys nothing and costs
    throughput on every step, silently.

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
    message = f"device synchronize on every training step: {_COST}"
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
        # deliberate timing: the synchronize makes the clock read right after it honest
        """
import time
import torch
for x in loader:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
    torch.cuda.synchronize()
    step_times.append(time.perf_counter() - t0)
""",
        # CUDA-event timing: the event pair is read right after the synchronize
        """
import torch
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
for x in loader:
    start.record()
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
    end.record()
    torch.cuda.synchronize()
    step_ms.append(start.elapsed_time(end))
""",
        """
import time
import torch

def time_sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.time()

for x in inputs:
    t0 = time_sync()
    model(x).sum().backward()
    opt.step()
    elapsed.append(time_sync() - t0)
""",
        # a benchmark: the synchronize makes the timer's toc() measure the GPU's work
        """
import torch
for it in range(num_iters):
    fw_timer.tic()
    loss = loss_fn(model(inputs), labels)
    torch.cuda.synchronize()
    fw_timer.toc()
    bw_timer.tic()
    loss.backward()
    torch.cuda.synchronize()
    bw_timer.toc()
""",
        # an event pair started right after the synchronize times the step
        """
import torch
for batch in loader:
    begin = torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    begin.record()
    opt.zero_grad()
    model(batch).mean().backward()
    opt.step()
""",
        # the `.item()` reads already drained the queue: nothing is left to wait for
        """
import torch
for step, (x, y) in enumerate(loader):
    opt.zero_grad()
    loss = crit(model(x.cuda()), y.cuda())
    loss.backward()
    opt.step()
    loss_value = loss.item()
    meter.update(loss_value, x.size(0))
    if torch.cuda.is_available():
        torch.cuda.synchronize()
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
        # a clock read later in the step does not make an earlier synchronize timing
        Invalid(
            """
import time
import torch
for x in loader:
    t0 = time.perf_counter()
    opt.zero_grad()
    model(x).sum().backward()
    torch.cuda.synchronize()
    opt.step()
    step_times.append(time.perf_counter() - t0)
""",
            line=7,
        ),
        # work queued after the read: the synchronize waits for it again
        Invalid(
            """
import torch
for x, y in loader:
    opt.zero_grad()
    loss = crit(model(x.cuda()), y.cuda())
    meter.update(loss.item())
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
""",
            line=8,
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
        calls = list(
            model.calls_to(
                "torch.cuda.synchronize",
                "torch.xpu.synchronize",
                "torch.mps.synchronize",
                "torch.cuda.Stream.synchronize",
            )
        )
        for call in model.calls.get("synchronize", ()):
            func = call.func
            if (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Call)
                and (
                    model.qualname(func.value.func)
                    in ("torch.cuda.current_stream", "torch.cuda.default_stream")
                )
            ):
                calls.append(call)
        seen = Reported()
        for call in calls:
            found = model.steps.per_step(call)
            if found is None or queue_drained_before(model, call):
                continue
            loop, anchor = found
            timed = _times_next(model, call)
            if timed and not timing_only_kept(model, call, loop.node):
                continue  # deliberate timing, unless the time only feeds an end summary
            if after_limiting_exit(model, call, loop.node) or not seen.first(anchor):
                continue
            what = f"`{ast.unparse(call.func)}()`"
            if anchor is not call and isinstance(anchor, ast.Call) and call_name(anchor):
                what += f" (in `{call_name(anchor)}()`)"
            cost = _KEPT_COST if timed else _COST
            yield self.report(anchor, f"{what} on every training step: {cost}")
