"""TL2: learning-rate schedules. Which unit a schedule counts in, and when it is stepped."""

from __future__ import annotations

import ast
import math
import re
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from trainlint.analysis.model import FileModel, call_name, dotted, keyword, walk_local
from trainlint.analysis.roles import Binding, Role
from trainlint.analysis.steps import EPOCH_FUNCTION_NAMES, LOOP_NODES, Event, Kind
from trainlint.rules._paths import Reported, precise_step_loops
from trainlint.rules.base import Invalid, Report, Rule

LR_SCHEDULER = "torch.optim.lr_scheduler."
_EPOCH_CLASSES = {"StepLR", "MultiStepLR", "ExponentialLR", "ReduceLROnPlateau"}
_ITERATION_CLASSES = {"OneCycleLR", "CyclicLR"}
_LENGTH_CLASSES = {"CosineAnnealingLR", "CosineAnnealingWarmRestarts", "LambdaLR",
                   "PolynomialLR", "LinearLR", "MultiplicativeLR", "ConstantLR"}
_ITER_WORDS = re.compile(r"steps_per_epoch|total_steps|max_steps|num_training_steps|"
                         r"training_steps|num_steps|total_iters?$|max_iters?|num_iters?|"
                         r"iterations|num_updates|total_updates|train_steps|n_steps", re.I)
_EPOCH_WORD = re.compile(r"epoch", re.I)


@dataclass
class Schedule:
    """A scheduler construction and what it counts in."""

    binding: Binding
    cls: str  # class or factory name
    unit: str | None  # "epoch", "iteration" or None (cannot tell)


def _names_in(node: ast.AST, skip: set[str] = frozenset()) -> list[str]:  # type: ignore[assignment]
    out = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id not in skip:
            out.append(sub.id)
        elif isinstance(sub, ast.Attribute):
            out.append(sub.attr)
    return out


def _len_of_loader(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and call_name(sub) == "len" and sub.args:
            text = (dotted(sub.args[0]) or "").lower()
            if "loader" in text or "batches" in text or "data" in text or "iter" in text:
                return True
    return False


def _unit_of_length(model: FileModel, exprs: Sequence[ast.AST]) -> str | None:
    iteration = epoch = False
    for expr in exprs:
        if _len_of_loader(expr):
            iteration = True
        for name in _names_in(expr):
            if _ITER_WORDS.search(name):
                iteration = True
            elif _EPOCH_WORD.search(name):
                epoch = True
    if iteration:
        return "iteration"  # `len(loader) * epochs` counts iterations
    if epoch:
        return "epoch"
    return None


def _lambda_body(model: FileModel, node: ast.AST | None) -> tuple[ast.AST, set[str]] | None:
    """The expression/def a LambdaLR multiplier is computed by, and its parameter names."""
    if isinstance(node, ast.Lambda):
        return node.body, {a.arg for a in node.args.args}
    if isinstance(node, ast.Name):
        for fn in model.functions:
            if fn.name == node.id:
                return fn, {a.arg for a in fn.args.args}
        found = model.flow.definition(node.id, node)
        if found is not None and isinstance(found[1], ast.Lambda):
            return found[1].body, {a.arg for a in found[1].args.args}
    if isinstance(node, ast.Call) and call_name(node) == "partial" and node.args:
        return _lambda_body(model, node.args[0])
    return None


def _lambda_arg(call: ast.Call) -> ast.AST | None:
    return keyword(call, "lr_lambda") or (call.args[1] if len(call.args) > 1 else None)


def schedule_of(model: FileModel, binding: Binding) -> Schedule | None:
    call = binding.call
    qual = binding.qualname or ""
    if call is None:
        return None
    cls = qual.rsplit(".", 1)[-1]
    if qual.startswith(LR_SCHEDULER):
        if cls in _ITERATION_CLASSES:
            return Schedule(binding, cls, "iteration")
        args = [*call.args[1:], *(k.value for k in call.keywords if k.arg != "optimizer")]
        if cls in _EPOCH_CLASSES:
            unit = _unit_of_length(model, args)
            return Schedule(binding, cls, "iteration" if unit == "iteration" else "epoch")
        if cls in _LENGTH_CLASSES:
            if cls in ("LambdaLR", "MultiplicativeLR"):
                body = _lambda_body(model, _lambda_arg(call))
                if body is None:
                    return Schedule(binding, cls, None)
                node, params = body
                names = [n for n in _names_in(node, params)]
                fake = [ast.Name(id=n) for n in names]
                return Schedule(binding, cls, _unit_of_length(model, fake))
            return Schedule(binding, cls, _unit_of_length(model, args))
        return Schedule(binding, cls, None)
    if qual.startswith("transformers") and (re.match(r"get_\w*schedule", cls)):
        return Schedule(binding, cls, "iteration")
    return None


_SCHEDULES: weakref.WeakKeyDictionary[FileModel, dict[int, Schedule]] = (
    weakref.WeakKeyDictionary()
)


def _schedules(model: FileModel) -> dict[int, Schedule]:
    """Scheduler constructions (by id of the construction call) with their unit; computed
    once per file, since every `scheduler.step()` asks."""
    cached = _SCHEDULES.get(model)
    if cached is None:
        cached = _SCHEDULES[model] = _compute_schedules(model)
    return cached


def _compute_schedules(model: FileModel) -> dict[int, Schedule]:
    out: dict[int, Schedule] = {}
    for _, b in model.roles.all_of(Role.SCHEDULER):
        if b.call is not None and id(b.call) not in out:
            sched = schedule_of(model, b)
            if sched is not None:
                out[id(b.call)] = sched
    # constructions not bound to a name (returned directly, passed along)
    for call in _scheduler_calls(model):
        if id(call) not in out:
            qual = model.qualname(call.func)
            sched = schedule_of(model, Binding(Role.SCHEDULER, qual, call, call))
            if sched is not None:
                out[id(call)] = sched
    return out


def _is_scheduler_qualname(qual: str) -> bool:
    last = qual.rsplit(".", 1)[-1]
    return (qual.startswith(LR_SCHEDULER) and last[:1].isupper()) or bool(
        qual.startswith("transformers") and re.match(r"get_\w*schedule", last)
    )


def _scheduler_calls(model: FileModel) -> list[ast.Call]:
    """Scheduler constructions, in source order. Only names that can spell one are
    resolved: a class (`StepLR`), a factory (`get_..._schedule...`), or an import alias."""
    names = {n for n in model.calls if n[:1].isupper() or n.startswith("get_")}
    for b in model.imports._scopes.values():
        names.update(local for local, q in b.imports.items() if _is_scheduler_qualname(q))
    calls = [c for n in names for c in model.calls.get(n, ())
             if _is_scheduler_qualname(model.qualname(c.func) or "")]
    return sorted(calls, key=lambda c: (c.lineno, c.col_offset))


def _schedule_for_step(model: FileModel, call: ast.Call) -> Schedule | None:
    if not isinstance(call.func, ast.Attribute):
        return None
    binding = model.roles.lookup(call.func.value)
    if binding is None or binding.role is not Role.SCHEDULER or binding.call is None:
        return None
    return _schedules(model).get(id(binding.call))


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


class SchedulerUnitMismatch(Rule):
    """## What it does
    Flags `scheduler.step()` stepped in the wrong unit: a schedule measured in epochs
    (`StepLR`, `MultiStepLR`, `ExponentialLR`, `ReduceLROnPlateau`, or a
    `CosineAnnealingLR`/`CosineAnnealingWarmRestarts`/`LambdaLR`/`PolynomialLR`/`LinearLR`
    whose length comes from an epoch count) stepped once per batch, or a schedule
    measured in iterations (`OneCycleLR`, `CyclicLR`, anything sized by `len(loader)`,
    `steps_per_epoch`, `total_steps`, `max_steps`, `num_training_steps`) stepped once
    per epoch.

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
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        seen = Reported()
        for call in model.calls.get("step", ()):
            sched = _schedule_for_step(model, call)
            if sched is None or sched.unit is None:
                continue
            if sched.cls == "CosineAnnealingWarmRestarts" and (call.args or call.keywords):
                continue  # step(epoch + i / iters) is the documented per-batch form
            event = _per_batch(model, call)
            if event is not None and sched.unit == "epoch":
                node = model.steps.anchor(event)
                if seen.first(node):
                    yield self.report(
                        node,
                        f"`{sched.cls}` counts epochs but is stepped every batch: the "
                        "schedule runs len(loader) times too fast",
                    )
            elif event is None and sched.unit == "iteration" and _per_epoch(model, call):
                if seen.first(call):
                    yield self.report(
                        call,
                        f"`{sched.cls}` counts iterations but is stepped once per epoch: the "
                        "schedule barely moves",
                    )


class SchedulerBeforeOptimizer(Rule):
    """## What it does
    Flags `scheduler.step()` called before `optimizer.step()` in the same iteration (of a
    batch loop, or of an epoch loop whose training happens after it).

    ## Why is this bad?
    Since PyTorch 1.1 the scheduler must step *after* the optimizer. Stepping it first
    skips the schedule's first value: the warmup starts one step in, or the first epoch
    already runs at the decayed LR. PyTorch only warns once, easy to miss in logs.

    ## Example
    ```python
    for epoch in range(epochs):
        scheduler.step()
        train_one_epoch(model, loader, optimizer)
    ```

    ## Use instead
    ```python
    for epoch in range(epochs):
        train_one_epoch(model, loader, optimizer)
        scheduler.step()
    ```

    ## References
    - [How to adjust learning rate](https://pytorch.org/docs/stable/optim.html#how-to-adjust-learning-rate)
    """

    code = "TL202"
    name = "scheduler-before-optimizer"
    message = "`scheduler.step()` before `optimizer.step()`: the schedule's first value is skipped"
    triggers = ("sched", "lr_scheduler", "Scheduler")
    confirm_with = "assert_lr_schedule"
    valid = [
        """
import torch
for epoch in range(10):
    for x, y in loader:
        optimizer.zero_grad()
        crit(model(x), y).backward()
        optimizer.step()
        scheduler.step()
""",
        # epoch loop: train first, then step the schedule
        """
import torch

def train_one_epoch(model, loader, optimizer):
    for x, y in loader:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()

for epoch in range(10):
    train_one_epoch(model, loader, optimizer)
    scheduler.step()
""",
        # no torch
        """
for t in range(10):
    scheduler.step()
    optimizer.step()
""",
    ]
    invalid = [
        Invalid(
            """
import torch
for x, y in loader:
    optimizer.zero_grad()
    crit(model(x), y).backward()
    scheduler.step()
    optimizer.step()
""",
            line=5,
        ),
        Invalid(
            """
from torch.optim import lr_scheduler

def train(model, loader, optimizer):
    for x, y in loader:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()

sched = lr_scheduler.StepLR(optimizer, 30)
for epoch in range(90):
    sched.step()
    train(model, loader, optimizer)
""",
            line=11,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        seen = Reported()
        loops = [(loop.node, loop.paths) for loop in precise_step_loops(model)]
        for ep in model.steps.epoch_loops:
            paths, precise = model.steps.loop_paths(ep)
            if precise:
                loops.append((ep, paths))
        for _node, paths in loops:
            scheds = {id(e): e for p in paths for e in p if e.kind is Kind.SCHED and e.depth == 0}
            for sched in scheds.values():
                containing = [p for p in paths if any(e is sched for e in p)]
                first = True
                later = False
                for p in containing:
                    i = next(k for k, e in enumerate(p) if e is sched)
                    if any(e.kind is Kind.STEP for e in p[:i]):
                        first = False
                        break
                    if any(e.kind is Kind.STEP for e in p[i + 1 :]):
                        later = True
                if first and later:
                    node = model.steps.anchor(sched)
                    if seen.first(node):
                        yield self.report(node)


# -- evaluating a multiplier at step 0 ------------------------------------------------------

POS = object()  # an unknown but positive quantity (warmup lengths, totals)


def _num(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class _Eval:
    """Evaluates a warmup multiplier at step 0, with unknown names taken as positive."""

    def __init__(self, model: FileModel) -> None:
        self.model = model

    def expr(self, node: ast.AST, env: dict[str, object]) -> object:
        if isinstance(node, ast.Constant):
            return node.value if _num(node.value) or isinstance(node.value, bool) else None
        if isinstance(node, ast.Name):
            return env.get(node.id, POS)
        if isinstance(node, ast.Attribute):
            return POS
        if isinstance(node, ast.UnaryOp):
            v = self.expr(node.operand, env)
            if isinstance(node.op, ast.USub) and _num(v):
                return -v  # type: ignore[operator]
            if isinstance(node.op, ast.Not) and isinstance(v, bool):
                return not v
            return None
        if isinstance(node, ast.BinOp):
            return self._binop(node.op, self.expr(node.left, env), self.expr(node.right, env))
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            return self._compare(node.ops[0], self.expr(node.left, env),
                                 self.expr(node.comparators[0], env))
        if isinstance(node, ast.IfExp):
            t = self.expr(node.test, env)
            if isinstance(t, bool):
                return self.expr(node.body if t else node.orelse, env)
            return None
        if isinstance(node, ast.Call):
            name = call_name(node)
            args = [self.expr(a, env) for a in node.args]
            if name in ("float", "int") and len(args) == 1:
                return args[0]
            if name in ("min", "max") and args:
                if all(_num(a) for a in args):
                    return (min if name == "min" else max)(args)  # type: ignore[type-var]
                nums = [a for a in args if _num(a)]
                if name == "min" and any(a == 0 for a in nums) and all(
                    a is POS or (_num(a) and a >= 0) for a in args  # type: ignore[operator]
                ):
                    return 0
                if name == "max" and any(a is POS for a in args) and all(
                    a is POS or (_num(a) and a > 0) for a in args  # type: ignore[operator]
                ):
                    return POS
                if name == "max" and any(a is POS for a in args):
                    return POS
                return None
            if name in ("cos", "exp") and len(args) == 1 and args[0] == 0:
                return 1.0
            return None
        return None

    @staticmethod
    def _binop(op: ast.operator, a: object, b: object) -> object:
        if _num(a) and _num(b):
            try:
                if isinstance(op, ast.Add):
                    return a + b  # type: ignore[operator]
                if isinstance(op, ast.Sub):
                    return a - b  # type: ignore[operator]
                if isinstance(op, ast.Mult):
                    return a * b  # type: ignore[operator]
                if isinstance(op, ast.Div):
                    return a / b  # type: ignore[operator]
                if isinstance(op, ast.FloorDiv):
                    return a // b  # type: ignore[operator]
                if isinstance(op, ast.Pow):
                    return a**b  # type: ignore[operator]
            except (ZeroDivisionError, OverflowError):
                return None
            return None
        if isinstance(op, (ast.Mult,)) and (a == 0 and b is POS or b == 0 and a is POS):
            return 0
        if isinstance(op, (ast.Div, ast.FloorDiv)) and a == 0 and b is POS:
            return 0
        if isinstance(op, ast.Div) and a is POS and b is POS:
            return POS
        if isinstance(op, ast.Add) and (
            (a is POS and (b is POS or (_num(b) and b >= 0)))  # type: ignore[operator]
            or (b is POS and _num(a) and a >= 0)  # type: ignore[operator]
        ):
            return POS
        if isinstance(op, ast.Mult) and a is POS and b is POS:
            return POS
        return None

    @staticmethod
    def _compare(op: ast.cmpop, a: object, b: object) -> object:
        if _num(a) and _num(b):
            return {
                ast.Lt: a < b, ast.LtE: a <= b, ast.Gt: a > b,  # type: ignore[operator]
                ast.GtE: a >= b, ast.Eq: a == b, ast.NotEq: a != b,  # type: ignore[operator]
            }.get(type(op))
        if a == 0 and b is POS:
            return {ast.Lt: True, ast.LtE: True, ast.Gt: False, ast.GtE: False,
                    ast.Eq: False, ast.NotEq: True}.get(type(op))
        if a is POS and b == 0:
            return {ast.Lt: False, ast.LtE: False, ast.Gt: True, ast.GtE: True,
                    ast.Eq: False, ast.NotEq: True}.get(type(op))
        return None

    def function(self, fn: ast.FunctionDef, env: dict[str, object]) -> object:
        return self._block(fn.body, dict(env))

    def _block(self, stmts: list[ast.stmt], env: dict[str, object]) -> object:
        for stmt in stmts:
            if isinstance(stmt, ast.Return):
                return self.expr(stmt.value, env) if stmt.value is not None else None
            if isinstance(stmt, ast.If):
                t = self.expr(stmt.test, env)
                if not isinstance(t, bool):
                    return None
                branch = stmt.body if t else stmt.orelse
                result = self._block(branch, env)
                if result is not _FALLTHROUGH:
                    return result
                continue
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(
                stmt.targets[0], ast.Name
            ):
                env[stmt.targets[0].id] = self.expr(stmt.value, env)
                continue
            if isinstance(stmt, (ast.Expr, ast.Pass)):
                continue  # docstrings
            return None
        return _FALLTHROUGH


_FALLTHROUGH = object()


def _multiplier_at_zero(model: FileModel, node: ast.AST | None) -> object:
    body = _lambda_body(model, node)
    if body is None:
        return None
    expr, params = body
    if not params:
        return None
    env: dict[str, object] = {p: 0 for p in params}
    ev = _Eval(model)
    if isinstance(expr, ast.FunctionDef):
        if len(expr.args.args) != 1:
            return None
        return ev.function(expr, env)
    return ev.expr(expr, env)


_WARMUP_FACTORIES = re.compile(r"^get_\w*schedule_with_warmup$")


class WarmupStartsAtZero(Rule):
    """## What it does
    Flags a `LambdaLR` whose multiplier is 0 at step 0 (`lambda s: s / warmup`), a
    `LinearLR(start_factor=0)`, and a `transformers` `get_*_schedule_with_warmup` factory
    with a non-zero warmup. Simple lambdas and `def`s are evaluated at step 0 statically,
    with unknown lengths taken as positive.

    ## Why is this bad?
    The first optimizer update runs with LR 0 and does nothing; and if `scheduler.step()`
    is never reached (it was commented out, it sits behind a condition that is never
    true, the loop was refactored), the LR stays at 0 for the whole run: training
    "works", the loss never moves. This is the failure of seed report 003 (LR 0 after the
    scheduler was disabled).

    ## Example
    ```python
    scheduler = LambdaLR(optimizer, lambda step: step / warmup_steps)
    ```

    ## Use instead
    ```python
    scheduler = LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup_steps))
    ```

    ## References
    - [torch.optim.lr_scheduler.LambdaLR](https://pytorch.org/docs/stable/generated/torch.optim.lr_scheduler.LambdaLR.html)
    """

    code = "TL203"
    name = "warmup-starts-at-zero"
    message = "the LR multiplier is 0 at step 0: the first update uses LR 0"
    triggers = ("LambdaLR", "LinearLR", "_with_warmup")
    confirm_with = "assert_lr_schedule"
    valid = [
        "import torch\nS = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))\n",
        "from torch.optim.lr_scheduler import LinearLR\ns = LinearLR(opt, start_factor=0.1, total_iters=5)\n",
        "from torch.optim.lr_scheduler import LambdaLR\ns = LambdaLR(opt, lambda epoch: 0.95 ** epoch)\n",
        "from transformers import get_linear_schedule_with_warmup\n"
        "s = get_linear_schedule_with_warmup(opt, num_warmup_steps=0, num_training_steps=n)\n",
        # unknown multiplier: silent
        "import torch\ns = torch.optim.lr_scheduler.LambdaLR(opt, make_lambda(cfg))\n",
        # no torch
        "def LambdaLR(o, f):\n    return f\ns = LambdaLR(opt, lambda s: s / 10)\n",
    ]
    invalid = [
        Invalid(
            "import torch.optim.lr_scheduler as sched\n"
            "s = sched.LambdaLR(opt, lambda step: step / warmup_steps)\n",
            line=2,
        ),
        Invalid(
            """
from torch.optim.lr_scheduler import LambdaLR
import math

def lr_lambda(epoch):
    if epoch < warmup_epochs:
        return epoch / warmup_epochs
    progress = (epoch - warmup_epochs) / (total_epochs - warmup_epochs)
    return 0.5 * (1 + math.cos(math.pi * progress))

scheduler = LambdaLR(optimizer, lr_lambda)
""",
            line=10,
        ),
        Invalid(
            "from torch.optim.lr_scheduler import LinearLR\n"
            "s = LinearLR(opt, start_factor=0.0, total_iters=1000)\n",
            line=2,
        ),
        Invalid(
            "from transformers import get_cosine_schedule_with_warmup as cosine\n"
            "s = cosine(opt, num_warmup_steps=args.warmup, num_training_steps=total)\n",
            line=2,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        for call in _scheduler_calls(model):
            qual = model.qualname(call.func) or ""
            cls = qual.rsplit(".", 1)[-1]
            if cls == "LambdaLR":
                arg = _lambda_arg(call)
                values = arg.elts if isinstance(arg, (ast.List, ast.Tuple)) else [arg]
                if any(self._zero(_multiplier_at_zero(model, v)) for v in values):
                    yield self.report(call)
            elif cls == "LinearLR":
                start = keyword(call, "start_factor")
                if start is None and len(call.args) > 1:
                    start = call.args[1]
                if isinstance(start, ast.Constant) and _num(start.value) and start.value == 0:
                    yield self.report(
                        call,
                        "`LinearLR(start_factor=0)`: a zero LR factor (current torch rejects it "
                        "with a ValueError at construction; older versions train at LR 0)",
                    )
            elif qual.startswith("transformers") and _WARMUP_FACTORIES.match(cls):
                warm = keyword(call, "num_warmup_steps")
                if warm is None and len(call.args) > 1:
                    warm = call.args[1]
                if warm is None:
                    continue
                if isinstance(warm, ast.Constant) and (not _num(warm.value) or warm.value == 0):
                    continue
                yield self.report(
                    call,
                    f"`{cls}` starts warmup at LR 0: the first update does nothing, and the "
                    "LR stays 0 if `scheduler.step()` is never reached",
                )

    @staticmethod
    def _zero(value: object) -> bool:
        return _num(value) and math.isclose(value, 0.0, abs_tol=0.0)  # type: ignore[arg-type]


class SchedulerNeverStepped(Rule):
    """## What it does
    Flags a scheduler that is built but whose `step()` is never called anywhere its
    value flows in the file: through assignments, `self` attributes, returns and tuple
    unpacking into callers, and arguments of same-file functions. A scheduler that
    escapes the file (returned from a method a framework calls, like Lightning's
    `configure_optimizers`; passed to an unknown function; stored in a container) is
    left alone.

    ## Why is this bad?
    The schedule never runs: the LR stays at its initial value for the whole run, and
    with a warmup multiplier that initial value is 0 or tiny. The code reads as if a
    cosine decay or a warmup were in place; the logs show a flat LR nobody looks at.

    ## Example
    ```python
    scheduler = CosineAnnealingLR(optimizer, T_max=epochs)
    for epoch in range(epochs):
        train_one_epoch(model, loader, optimizer)
    ```

    ## Use instead
    ```python
    scheduler = CosineAnnealingLR(optimizer, T_max=epochs)
    for epoch in range(epochs):
        train_one_epoch(model, loader, optimizer)
        scheduler.step()
    ```

    ## References
    - [How to adjust learning rate](https://pytorch.org/docs/stable/optim.html#how-to-adjust-learning-rate)
    """

    code = "TL204"
    name = "scheduler-never-stepped"
    message = "this scheduler is never stepped: the LR stays at its initial value"
    triggers = ("lr_scheduler", "LR(", "LR)", "Scheduler", "_schedule")
    confirm_with = "assert_lr_schedule"
    valid = [
        """
import torch
sched = torch.optim.lr_scheduler.StepLR(opt, 30)
for epoch in range(90):
    train(model, opt)
    sched.step()
""",
        # Lightning: the framework steps what configure_optimizers returns
        """
import torch
import pytorch_lightning as pl
class M(pl.LightningModule):
    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters())
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=1000)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
""",
        # returned from a factory and stepped by the caller
        """
from torch import optim
def build(model):
    opt = optim.SGD(model.parameters(), lr=0.1)
    sched = optim.lr_scheduler.StepLR(opt, 10)
    return opt, sched

opt, sched = build(model)
for epoch in range(30):
    train(model, opt)
    sched.step()
""",
        # handed to an unknown trainer
        """
import torch
sched = torch.optim.lr_scheduler.StepLR(opt, 10)
trainer = Trainer(model, opt, sched)
trainer.fit()
""",
        # stepped through a same-file helper's parameter
        """
import torch
def train_epoch(model, opt, scheduler):
    for x in loader:
        model(x).sum().backward()
        opt.step()
        scheduler.step()

sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 100)
train_epoch(model, opt, sched)
""",
        # no torch
        """
class StepLR:
    pass
s = StepLR()
""",
    ]
    invalid = [
        Invalid(
            """
import torch.optim as optim
sched = optim.lr_scheduler.CosineAnnealingLR(opt, T_max=100)
for epoch in range(100):
    train(model, opt)
""",
            line=2,
        ),
        Invalid(
            """
from torch.optim.lr_scheduler import LambdaLR

class Trainer:
    def __init__(self, model, opt):
        self.opt = opt
        self.scheduler = LambdaLR(opt, lambda s: min(1.0, (s + 1) / 100))

    def save(self, path):
        torch.save({"sched": self.scheduler.state_dict()}, path)
""",
            line=6,
        ),
        Invalid(
            """
import torch
def build(model):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 10)
    return opt, sched

opt, sched = build(model)
for epoch in range(30):
    train(model, opt)
""",
            line=4,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        for call in _scheduler_calls(model):
            verdict = _flow_of(model, call, depth=0)
            if verdict == "never":
                yield self.report(call)


def _flow_of(model: FileModel, expr: ast.AST, depth: int) -> str:
    """Follow where a value goes: "stepped", "escapes" or "never"."""
    if depth > 6:
        return "escapes"
    cur = expr
    parent = model.parent_of(cur)
    # climb out of containers and wrappers that keep the object
    while isinstance(parent, (ast.Tuple, ast.List, ast.Dict, ast.Set, ast.Starred, ast.keyword)):
        if isinstance(parent, (ast.Tuple, ast.List)) and isinstance(
            model.parent_of(parent), (ast.Assign,)
        ) and model.parent_of(parent).value is parent:  # type: ignore[union-attr]
            break  # `a, b = x, y` unpacks element-wise: handled below
        cur, parent = parent, model.parent_of(parent)
        if isinstance(parent, (ast.Assign, ast.AnnAssign)) and cur is not expr:
            return "escapes"  # stored in a container
    if isinstance(parent, ast.Return):
        return _flow_of_return(model, parent, cur, expr, depth)
    if isinstance(parent, ast.Call) and cur is not parent.func:
        return _flow_into_call(model, parent, cur, depth)
    if isinstance(parent, (ast.Assign, ast.AnnAssign)) and parent.value is cur:
        targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
        verdicts = []
        for t in targets:
            if isinstance(t, (ast.Tuple, ast.List)) and isinstance(cur, (ast.Tuple, ast.List)):
                for te, ve in zip(t.elts, cur.elts, strict=False):
                    if ve is expr or any(s is expr for s in ast.walk(ve)):
                        verdicts.append(_flow_of_name(model, te, depth))
            elif isinstance(t, (ast.Name, ast.Attribute)):
                verdicts.append(_flow_of_name(model, t, depth))
            else:
                verdicts.append("escapes")
        return _merge(verdicts)
    if isinstance(parent, ast.Expr):
        return "never"
    if isinstance(parent, (ast.withitem, ast.NamedExpr, ast.Lambda, ast.IfExp, ast.BoolOp)):
        return "escapes"
    return "escapes"


def _merge(verdicts: list[str]) -> str:
    if not verdicts:
        return "never"
    if "stepped" in verdicts:
        return "stepped"
    if "escapes" in verdicts:
        return "escapes"
    return "never"


def _flow_of_name(model: FileModel, target: ast.AST, depth: int) -> str:
    """A name/attribute now holds the scheduler: is it stepped or handed on?"""
    key = model.roles.key(target)
    if key is None:
        return "escapes"
    if key[0] == "dotted" and not str(key[1]).startswith("self."):
        return "escapes"  # someone else's attribute
    refs = _references(model, target, key)
    verdicts = []
    for ref in refs:
        parent = model.parent_of(ref)
        if isinstance(parent, ast.Attribute) and parent.value is ref:
            grand = model.parent_of(parent)
            if isinstance(grand, ast.Call) and grand.func is parent:
                if parent.attr == "step":
                    return "stepped"
                continue  # other methods: get_last_lr(), state_dict()
            continue
        if isinstance(parent, (ast.Compare, ast.If, ast.BoolOp, ast.UnaryOp, ast.FormattedValue,
                               ast.JoinedStr)):
            continue
        if isinstance(parent, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and ref in (
            parent.targets if isinstance(parent, ast.Assign) else [parent.target]
        ):
            continue
        verdicts.append(_flow_of(model, ref, depth + 1))
    return _merge(verdicts)


def _references(model: FileModel, target: ast.AST, key: tuple[object, ...]) -> list[ast.AST]:
    out: list[ast.AST] = []
    if key[0] == "name":
        scope_id = key[1]
        scope = model.tree if scope_id == id(model.tree) else next(
            (f for f in model.functions if id(f) == scope_id), model.tree
        )
        nodes = ast.walk(scope)
    else:
        nodes = ast.walk(model.tree)
    for node in nodes:
        if node is target:
            continue
        if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load):
            k = model.roles.key(node)
            if k == key or (key[0] == "attr" and k is not None and k[0] == "attr"
                            and k[2] == key[2]):
                out.append(node)
    return out


def _flow_of_return(model: FileModel, ret: ast.Return, cur: ast.AST, expr: ast.AST,
                    depth: int) -> str:
    fn = model.function_of(ret)
    if fn is None or fn.name.startswith("configure_") or fn.name.startswith("_configure"):
        return "escapes"
    sites = model.call_sites.get(id(fn), [])
    if not sites:
        return "escapes"  # called from outside this file
    index = None
    value = ret.value
    if isinstance(value, (ast.Tuple, ast.List)) and value is not cur:
        return "escapes"
    if isinstance(value, (ast.Tuple, ast.List)):
        for i, elt in enumerate(value.elts):
            if elt is expr or any(s is expr for s in ast.walk(elt)):
                index = i
    verdicts = []
    for site in sites:
        parent = model.parent_of(site)
        if isinstance(parent, ast.Assign) and parent.value is site and len(parent.targets) == 1:
            t = parent.targets[0]
            if index is not None and isinstance(t, (ast.Tuple, ast.List)) and index < len(t.elts):
                verdicts.append(_flow_of_name(model, t.elts[index], depth + 1))
            elif index is None and isinstance(t, (ast.Name, ast.Attribute)):
                verdicts.append(_flow_of_name(model, t, depth + 1))
            else:
                verdicts.append("escapes")
        else:
            verdicts.append(_flow_of(model, site, depth + 1) if index is None else "escapes")
    return _merge(verdicts)


def _flow_into_call(model: FileModel, call: ast.Call, arg: ast.AST, depth: int) -> str:
    target = model.resolve_call(call)
    if target is None:
        return "escapes"
    params = [a.arg for a in (*target.args.posonlyargs, *target.args.args)]
    if params and params[0] in ("self", "cls") and isinstance(call.func, ast.Attribute):
        params = params[1:]
    name = None
    for i, a in enumerate(call.args):
        if a is arg and i < len(params):
            name = params[i]
    for kw in call.keywords:
        if kw.value is arg:
            name = kw.arg
    if name is None:
        return "escapes"
    for node in walk_local(target):
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load):
            parent = model.parent_of(node)
            if isinstance(parent, ast.Attribute) and parent.attr == "step":
                return "stepped"
    # not stepped directly: follow its uses inside the helper
    verdicts = []
    for node in walk_local(target):
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load):
            parent = model.parent_of(node)
            if isinstance(parent, ast.Attribute):
                continue
            if isinstance(parent, (ast.Compare, ast.If, ast.BoolOp, ast.UnaryOp)):
                continue
            verdicts.append(_flow_of(model, node, depth + 1))
    return _merge(verdicts)


class SchedulerStepWithEpoch(Rule):
    """## What it does
    Flags `scheduler.step(epoch)` / `scheduler.step(i)` with an argument, on a
    torch scheduler other than `ReduceLROnPlateau` (whose `step(metric)` is right) and
    `CosineAnnealingWarmRestarts` (whose fractional-epoch `step(epoch + i / iters)` is
    documented).

    ## Why is this bad?
    The epoch argument is deprecated: it makes the scheduler jump to a closed-form value
    instead of stepping, which many schedulers (`LambdaLR` chains, `SequentialLR`,
    `ChainedScheduler`, `OneCycleLR`) do not support correctly. With a batch counter as
    the argument the schedule jumps by whole epochs per batch.

    ## Example
    ```python
    for epoch in range(epochs):
        train(...)
        scheduler.step(epoch)
    ```

    ## Use instead
    ```python
    for epoch in range(epochs):
        train(...)
        scheduler.step()
    ```

    ## References
    - [PyTorch 1.4 release notes: the epoch parameter of step() is deprecated](https://github.com/pytorch/pytorch/releases/tag/v1.4.0)
    """

    code = "TL205"
    name = "scheduler-step-with-epoch"
    message = "`scheduler.step()` with an epoch argument is deprecated and jumps the schedule"
    severity = "warning"
    triggers = ("step(",)
    valid = [
        """
import torch
s = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
for epoch in range(10):
    s.step(val_loss)
""",
        """
import torch
s = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=5)
for epoch in range(10):
    for i in range(100):
        s.step(epoch + i / 100)
""",
        # a timm scheduler takes the epoch by design
        """
from timm.scheduler import create_scheduler
lr_scheduler, _ = create_scheduler(args, opt)
for epoch in range(10):
    lr_scheduler.step(epoch + 1)
""",
        # no torch
        """
class S:
    def step(self, e): pass
s = S()
s.step(3)
""",
    ]
    invalid = [
        Invalid(
            """
from torch.optim.lr_scheduler import StepLR as Step
s = Step(opt, step_size=10)
for epoch in range(100):
    train()
    s.step(epoch)
""",
            line=5,
        ),
        Invalid(
            """
import torch
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda it: (1 - it / total) ** 0.9)
for it, batch in enumerate(loader):
    opt.step()
    sched.step(epoch=it)
""",
            line=5,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        for call in model.calls.get("step", ()):
            if not call.args and not call.keywords:
                continue
            sched = _schedule_for_step(model, call)
            if sched is None or sched.cls in ("ReduceLROnPlateau", "CosineAnnealingWarmRestarts"):
                continue
            qual = sched.binding.qualname or ""
            if not (qual.startswith(LR_SCHEDULER) or qual.startswith("transformers")):
                continue
            yield self.report(call)


RULES = [
    SchedulerUnitMismatch,
    SchedulerBeforeOptimizer,
    WarmupStartsAtZero,
    SchedulerNeverStepped,
    SchedulerStepWithEpoch,
]
