"""TL201 scheduler-unit-mismatch."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from trainlint.analysis.model import FUNCTION_NODES, FileModel, dotted, keyword
from trainlint.analysis.paths import Reported
from trainlint.analysis.schedules import (
    ITERATION_CLASSES,
    Schedule,
    schedule_for_step,
    scheduler_calls,
)
from trainlint.analysis.steps import EPOCH_FUNCTION_NAMES, LOOP_NODES, Event, Kind
from trainlint.rules.base import Invalid, Report, Rule


def _per_batch(model: FileModel, call: ast.Call) -> Event | None:
    """The step-loop event of this scheduler step when it runs once per batch."""
    for loop in model.steps.step_loops:
        for e in loop.of(Kind.SCHED):
            if e.node is call and e.depth == 0:
                return e
    return None


def _per_epoch(model: FileModel, call: ast.Call) -> bool:
    """Runs once per epoch: in a loop that encloses a step loop but is none itself, or in a
    `train_one_epoch`-style function after its batch loop."""
    if _per_batch(model, call) is not None:
        return False
    epoch_ids = {id(e) for e in model.steps.epoch_loops}
    step_ids = model.steps.step_loop_ids
    contexts = model.loop_contexts(call)
    for ctx in contexts:
        loops = [n for n in ctx if isinstance(n, LOOP_NODES)]
        if not loops:
            continue
        innermost = loops[0]
        if id(innermost) in step_ids:
            return False
        if id(innermost) in epoch_ids:
            return True
    fn = model.function_of(call)
    if fn is not None and EPOCH_FUNCTION_NAMES.search(fn.name) and not model.enclosing_loops(call):
        return any(id(loop) in step_ids for loop in model.loops
                   if model.function_of(loop) is fn)
    return False


#: Epoch schedules rarely decay after more than this many epochs; a step size or
#: milestone this large counts iterations (detectron-style `milestones=[60000, 80000]`).
ITERATION_SIZED = 1000
_ITER_NAME = re.compile(r"iter", re.IGNORECASE)
_KIND_WORDS = re.compile(
    r"one_?cycle|cyclic|per_?(iter|batch|step)|by_?(iter|step)|iter(ation)?_?based|"
    r"step_?(per|every|each|on)_?(batch|iter)|batch_?(level|wise)", re.IGNORECASE)


def _sized_in_iterations(model: FileModel, sched: Schedule) -> bool:
    """A StepLR/MultiStepLR whose step size or milestones say iterations: a large
    constant (directly, or as a default or constant it is named by), or a name with
    `iter` in it (`lr_decay_iters`)."""
    call = sched.binding.call
    if call is None or sched.cls not in ("StepLR", "MultiStepLR"):
        return False
    size = keyword(call, "step_size") or keyword(call, "milestones") or (
        call.args[1] if len(call.args) > 1 else None
    )
    if size is None:
        return False
    for sub in ast.walk(size):
        text = sub.id if isinstance(sub, ast.Name) else sub.attr if isinstance(
            sub, ast.Attribute) else ""
        if text and _ITER_NAME.search(text):
            return True
        value = _constant(model, sub)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and (
            value >= ITERATION_SIZED
        ):
            return True
        if isinstance(value, (tuple, list)) and any(
            isinstance(v, (int, float)) and v >= ITERATION_SIZED for v in value
        ):
            return True
    return False


def _constant(model: FileModel, node: ast.AST) -> object:
    """A literal, or a name bound to one: a parameter default or an assignment."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List)):
        return [_constant(model, e) for e in node.elts]
    if not isinstance(node, ast.Name):
        return None
    fn = model.function_of(node)
    if fn is not None:
        a = fn.args
        positional = [*a.posonlyargs, *a.args]
        for arg, default in zip(positional[len(positional) - len(a.defaults):], a.defaults,
                                strict=True):
            if arg.arg == node.id:
                return _constant(model, default)
    found = model.flow.definition(node.id, node)
    if found is not None and isinstance(found[1], (ast.Constant, ast.Tuple, ast.List)):
        return _constant(model, found[1])
    return None


def _kind_guarded(model: FileModel, call: ast.Call) -> bool:
    """The step sits under a test of which kind of scheduler this is: an `isinstance`
    or a name string (`"onecycle"`), a flag named for it (`step_per_batch`), or a flag
    set right where a scheduler is built. Whatever was built, it is stepped in the unit
    the code chose for it."""
    sched_ids = {id(c) for c in scheduler_calls(model)}
    for anc in model.ancestors(call):
        if isinstance(anc, (*FUNCTION_NODES, ast.ClassDef)):
            break
        if not isinstance(anc, ast.If):
            continue
        for sub in ast.walk(anc.test):
            text = sub.id if isinstance(sub, ast.Name) else sub.attr if isinstance(
                sub, ast.Attribute) else sub.value if isinstance(sub, ast.Constant) and isinstance(
                sub.value, str) else ""
            if text and (_KIND_WORDS.search(text) or text in ITERATION_CLASSES):
                return True
        if any(_set_beside_scheduler(model, dotted(flag), sched_ids) for flag in _flags(anc.test)):
            return True
    return False


def _flags(test: ast.expr) -> list[ast.expr]:
    """The plain names a condition tests: `flag`, `not flag`, `a and not b`."""
    while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test = test.operand
    if isinstance(test, ast.BoolOp):
        return [f for v in test.values for f in _flags(v)]
    return [test] if isinstance(test, (ast.Name, ast.Attribute)) else []


def _set_beside_scheduler(model: FileModel, name: str | None, sched_ids: set[int]) -> bool:
    if name is None:
        return False
    for node in ast.walk(model.tree):
        if not isinstance(node, ast.Assign) or not any(dotted(t) == name for t in node.targets):
            continue
        if not (isinstance(node.value, (ast.Compare, ast.BoolOp)) or (
            isinstance(node.value, ast.Constant) and isinstance(node.value.value, bool)
        )):
            continue  # a flag holds a truth value
        parent = model.parent_of(node)
        for field in ("body", "orelse"):
            block = getattr(parent, field, None)
            if isinstance(block, list) and any(st is node for st in block) and any(
                id(sub) in sched_ids for st in block for sub in ast.walk(st)
            ):
                return True
    return False


_LENGTH_KEYWORDS = ("T_max", "T_0", "step_size", "milestones", "total_steps", "epochs",
                    "steps_per_epoch", "total_iters", "num_training_steps", "step_size_up")


def _length_site(sched: Schedule) -> tuple[tuple[ast.AST, str], ...]:
    """Where the schedule's length is given (`T_max=...`), else its construction."""
    call = sched.binding.call
    if call is None:
        return ()
    for name in _LENGTH_KEYWORDS:
        value = keyword(call, name)
        if value is not None:
            return ((value, f"`{name}` sets the schedule's length here"),)
    return ((call, "the scheduler is built here"),)


class SchedulerUnitMismatch(Rule):
    """## What it does
    Flags `scheduler.step()` stepped in the wrong unit: a schedule measured in epochs
    (`StepLR`, `MultiStepLR`, `ExponentialLR`, `ReduceLROnPlateau`, or a
    `CosineAnnealingLR`/`CosineAnnealingWarmRestarts`/`LambdaLR`/`PolynomialLR`/`LinearLR`
    whose length comes from an epoch count) stepped once per batch, or a schedule
    measured in iterations (`OneCycleLR`, `CyclicLR`, anything sized by `len(loader)`,
    `steps_per_epoch`, `total_steps`, `max_steps`, `num_training_steps`) stepped once
    per epoch. A `StepLR`/`MultiStepLR` sized in iterations (a step size or milestone of
    1000 or more, written directly, as a default or as a named constant, or a name with
    `iter` in it) counts iterations; a step under a test of which scheduler was built (an
    `isinstance`, a scheduler name, a flag set where the scheduler is built) is not
    judged.

    ## Why is this bad?
    The schedule runs `len(loader)` times too fast or too slow. A cosine decay over
    `T_max=epochs` stepped per batch finishes its half-period after `epochs` batches and
    then climbs back up: one smooth decay becomes periodic warm restarts, with LR spikes
    that blow training up late in the run. A `StepLR(step_size=30)` stepped per batch
    decays the LR to nothing in the first epoch. A `OneCycleLR` stepped per epoch never
    leaves its warmup.

    ## Example
    ```python
    scheduler = CosineAnnealingLR(optimizer, T_max=args.epochs)
    for epoch in range(args.epochs):
        for x, y in loader:
            ...
            optimizer.step()
            scheduler.step()
    ```

    ## Use instead
    ```python
    scheduler = CosineAnnealingLR(optimizer, T_max=args.epochs * len(loader))
    ```
    or step it once per epoch, after the batch loop.

    ## References
    - [How to adjust learning rate](https://pytorch.org/docs/stable/optim.html#how-to-adjust-learning-rate)
    """

    code = "TL201"
    name = "scheduler-unit-mismatch"
    message = "scheduler stepped in the wrong unit"
    triggers = ("lr_scheduler", "Scheduler", "LR(", "LR,", "LR)", "schedule")
    confirm_with = "assert_lr_schedule"
    valid = [
        # epoch schedule stepped per epoch
        """
import torch
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=30)
for epoch in range(90):
    for x, y in loader:
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()
    sched.step()
""",
        # iteration schedule (sized by len(loader)) stepped per batch
        """
from torch.optim import lr_scheduler as S
sched = S.CosineAnnealingLR(opt, T_max=args.epochs * len(train_loader))
for epoch in range(args.epochs):
    for x, y in train_loader:
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()
        sched.step()
""",
        # warm restarts with a fractional epoch (documented usage)
        """
import torch
sched = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=10)
iters = len(loader)
for epoch in range(100):
    for i, (x, y) in enumerate(loader):
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()
        sched.step(epoch + i / iters)
""",
        # length unknown: stay silent
        """
import torch
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cfg.t_max)
for x, y in loader:
    opt.zero_grad()
    crit(model(x), y).backward()
    opt.step()
    sched.step()
""",
        # milestones in iterations (large constants), stepped per batch
        """
import torch
sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[60000, 80000], gamma=0.1)
for epoch in range(args.epochs):
    for x, y in loader:
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()
        sched.step()
""",
        # a step size in iterations given as a default, or by a name that says so
        """
import torch

def build_scheduler(opt, step_size=20000, gamma=0.5):
    return torch.optim.lr_scheduler.StepLR(opt, step_size=step_size, gamma=gamma)

sched = build_scheduler(opt)
decay = torch.optim.lr_scheduler.StepLR(opt2, step_size=cfg.lr_decay_iters)
for epoch in range(args.epochs):
    for x, y in loader:
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()
        sched.step()
        decay.step()
""",
        # a flag set where each scheduler is built decides where it steps
        """
import torch
from torch.optim import lr_scheduler

if args.scheduler == "onecycle":
    scheduler = lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=args.epochs * len(loader))
    fine_grained = True
else:
    scheduler = lr_scheduler.StepLR(opt, step_size=30)
    fine_grained = False
for epoch in range(args.epochs):
    for x, y in loader:
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()
        if fine_grained:
            scheduler.step()
    if not fine_grained:
        scheduler.step()
""",
        # the step chosen by the scheduler's type
        """
from torch.optim import lr_scheduler

def make_scheduler(name, opt, epochs, steps):
    if name == "onecycle":
        return lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=epochs * steps)
    return lr_scheduler.MultiStepLR(opt, milestones=[30, 60])

scheduler = make_scheduler(args.sched, opt, args.epochs, len(loader))
for epoch in range(args.epochs):
    for x, y in loader:
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()
        if isinstance(scheduler, lr_scheduler.OneCycleLR):
            scheduler.step()
    if isinstance(scheduler, lr_scheduler.MultiStepLR):
        scheduler.step()
""",
        # no torch: a local StepLR
        """
class StepLR:
    def step(self): pass
sched = StepLR()
for x in loader:
    x.backward()
    opt.step()
    sched.step()
""",
    ]
    invalid = [
        Invalid(
            """
import torch
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.epochs)
for epoch in range(args.epochs):
    for x, y in loader:
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()
        sched.step()
""",
            line=8,
        ),
        Invalid(
            """
import torch.optim as optim

def fit(model, loader, epochs):
    opt = optim.SGD(model.parameters(), lr=0.1)
    sched = optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, epochs=epochs, steps_per_epoch=len(loader))
    for epoch in range(epochs):
        for x, y in loader:
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
        sched.step()
""",
            line=11,
        ),
        # a step size in epochs (a small constant) stepped per batch, under a flag that
        # says nothing about the scheduler
        Invalid(
            """
import torch
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=30, gamma=0.1)
for epoch in range(90):
    for x, y in loader:
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()
        if use_schedule:
            sched.step()
""",
            line=9,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        seen = Reported()
        for call in model.calls.get("step", ()):
            sched = schedule_for_step(model, call)
            if sched is None or sched.unit is None:
                continue
            if sched.cls == "CosineAnnealingWarmRestarts" and (call.args or call.keywords):
                continue  # step(epoch + i / iters) is the documented per-batch form
            if _kind_guarded(model, call):
                continue
            if sched.unit == "epoch" and _sized_in_iterations(model, sched):
                continue  # its sizes count iterations: per-batch is its unit
            event = _per_batch(model, call)
            if event is not None and sched.unit == "epoch":
                node = model.steps.anchor(event)
                if seen.first(node):
                    yield self.report(
                        node,
                        f"`{sched.cls}` counts epochs but is stepped every batch: the "
                        "schedule runs len(loader) times too fast; step it once per epoch, "
                        "or size it in steps",
                        related=_length_site(sched),
                    )
            elif event is None and sched.unit == "iteration" and _per_epoch(model, call):
                if seen.first(call):
                    yield self.report(
                        call,
                        f"`{sched.cls}` counts iterations but is stepped once per epoch: the "
                        "schedule barely moves; step it after every batch",
                        related=_length_site(sched),
                    )
