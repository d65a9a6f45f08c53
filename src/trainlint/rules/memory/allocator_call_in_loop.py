"""TL305 allocator-call-in-loop."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.escapes import params_of
from trainlint.analysis.model import FileModel, call_name, dotted, walk_local
from trainlint.analysis.paths import Reported
from trainlint.analysis.steps import rebuilds_model
from trainlint.rules.base import Invalid, Report, Rule

_AVAILABILITY = {
    "torch.cuda.is_available",
    "torch.cuda.is_initialized",
    "torch.backends.mps.is_available",
    "torch.mps.is_available",
    "torch.xpu.is_available",
    "torch.distributed.is_available",
    "torch.distributed.is_initialized",
}
_DEVICE_WORDS = {"cuda", "mps", "xpu", "gpu"}


def _availability_check(model: FileModel, test: ast.AST, depth: int = 0) -> bool:
    """`torch.cuda.is_available()`, `x.is_cuda`, `device.type == "cuda"`, and `and`s of
    them: a guard on the platform, true on every step, so it limits nothing. A name
    every earlier binding of which is such a check (`use_cuda = torch.cuda.is_available()`
    before the loop, or at module level) is one too."""
    if isinstance(test, ast.Name) and depth < 3:
        return _flag_of_availability(model, test, depth)
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return all(_availability_check(model, v, depth) for v in test.values)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _availability_check(model, test.operand, depth)
    if isinstance(test, ast.Call):
        return model.qualname(test.func) in _AVAILABILITY or call_name(test) == "is_available"
    if isinstance(test, ast.Attribute):
        return test.attr in ("is_cuda", "is_mps", "is_xpu")
    if (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], (ast.Eq, ast.NotEq, ast.In))
    ):
        sides = (test.left, *test.comparators)
        names = " ".join((dotted(x) or "").lower() for x in sides)
        consts = [x.value for x in sides if isinstance(x, ast.Constant)]
        return "device" in names and any(
            isinstance(c, str) and c.split(":")[0] in _DEVICE_WORDS for c in consts
        )
    return False


def _flag_of_availability(model: FileModel, name: ast.Name, depth: int) -> bool:
    """`if use_cuda:` where every binding of `use_cuda` that may reach the test (in its
    function, or at module level when the function binds it nowhere) is an availability
    check; a flag the loop itself rebinds is not one."""
    fn = model.function_of(name)
    defs = model.flow.definitions_before(name.id, name)
    if not defs and fn is not None and name.id not in params_of(fn):
        defs = model.flow.definitions_before(name.id, fn)  # a module-level flag
    return bool(defs) and all(
        isinstance(stmt, (ast.Assign, ast.AnnAssign))
        and value is not None
        and _availability_check(model, value, depth + 1)
        for stmt, value in defs
    )


def _generates(model: FileModel, loop: ast.AST) -> bool:
    """Does each step also generate (`model.generate(...)`, `self.generate_trajectory(...)`,
    a rollout), in the step loop or, before it, in a loop around it (PPO epochs over one
    batch of generations)? RL fine-tuning alternates a KV-cache generation phase and a
    training phase; emptying the cache between the two is a deliberate memory trade-off,
    and its milliseconds are nothing next to the generation."""
    outer = [a for a in model.ancestors(loop) if isinstance(a, (ast.For, ast.AsyncFor, ast.While))]
    start = getattr(loop, "lineno", 0)
    for scope in (loop, *outer[:1]):
        for node in walk_local(scope):
            if isinstance(node, ast.Call) and (scope is loop or node.lineno < start):
                name = (call_name(node) or "").lower()
                if "generate" in name or "rollout" in name:
                    return True
    return False


class AllocatorCallInLoop(Rule):
    """## What it does
    Flags `torch.cuda.empty_cache()`, `torch.cuda.reset_peak_memory_stats()` and
    `gc.collect()` (and the other `reset_*memory*` statistics calls) called on every
    step of a training loop (not under a rate-limiting `if`, not in an OOM `except`
    handler). A guard on the platform (`if torch.cuda.is_available():`, or a flag set
    from it before the loop, `if use_cuda:`) is true on every step and limits nothing. Steps
    that also generate (RL fine-tuning: a KV-cache generation phase, then training) are
    left alone: emptying the cache between the phases is a deliberate trade-off there.
    So are loops that build a fresh model on each iteration (a batch-size probe, a
    benchmark sweep): each iteration is a trial of its own, and freeing its memory
    before the next one is the point.

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
    message = "allocator/GC call on every training step: costs time and does not fix leaks; remove it or run it every N steps"
    severity = "warning"
    triggers = (
        "empty_cache",
        "reset_peak_memory_stats",
        "reset_max_memory",
        "reset_accumulated_memory_stats",
        "gc.collect",
        "collect(",
    )
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
        # RL fine-tuning: generate with a KV cache, then train (here for a few PPO
        # epochs on the same generations); the cache is emptied between the phases on
        # purpose
        """
import torch
for prompts in prompt_loader:
    with torch.no_grad():
        completions = policy.generate(prompts, max_new_tokens=512)
    for _ in range(ppo_epochs):
        torch.cuda.empty_cache()
        opt.zero_grad()
        rl_loss(policy, prompts, completions).backward()
        opt.step()
""",
        # a batch-size probe: each try builds its own model, so freeing it is the point
        """
import torch
from gpt import GPTModel
while low <= high:
    size = (low + high) // 2
    try:
        net = GPTModel(cfg).bfloat16().to("cuda")
        out = net(torch.randint(0, 100, (size, 64), device="cuda"))
        out.sum().backward()
        low = size + 1
        del net, out
        torch.cuda.empty_cache()
    except torch.cuda.OutOfMemoryError:
        high = size - 1
""",
    ]
    invalid = [
        # samples generated after each epoch do not make the per-step call deliberate
        Invalid(
            """
import torch
for epoch in range(epochs):
    for x, y in loader:
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()
        torch.cuda.empty_cache()
    samples = model.generate(prompt)
""",
            line=7,
        ),
        # a guard on availability is true on every step: it is not a rate limit
        Invalid(
            """
import torch
for step, (x, y) in enumerate(loader):
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    opt.zero_grad()
    crit(model(x), y).backward()
    opt.step()
""",
            line=4,
        ),
        # a flag set from the platform check before the loop is no rate limit either
        Invalid(
            """
import torch

def train(model, loader, opt, crit):
    use_cuda = torch.cuda.is_available()
    for x, y in loader:
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()
        if use_cuda:
            torch.cuda.reset_max_memory_allocated()
""",
            line=10,
        ),
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
            "torch.cuda.empty_cache",
            "torch.cuda.reset_peak_memory_stats",
            "gc.collect",
            "torch.cuda.memory.empty_cache",
            "torch.mps.empty_cache",
            "torch.xpu.empty_cache",
            "torch.cuda.memory.reset_peak_memory_stats",
            "torch.cuda.reset_max_memory_allocated",
            "torch.cuda.reset_max_memory_cached",
            "torch.cuda.reset_accumulated_memory_stats",
            "torch.xpu.reset_peak_memory_stats",
        )
        seen = Reported()
        for call in calls:
            found = model.steps.per_step(
                call, limits=lambda g: not _availability_check(model, g.test)
            )
            if found is None or _generates(model, found[0].node):
                continue
            if rebuilds_model(model, found[0].node):
                # a probe or a sweep: freeing one trial's memory before the next is the point
                continue
            _, anchor = found
            if seen.first(anchor):
                yield self.report(anchor)
