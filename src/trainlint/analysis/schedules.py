"""Learning-rate schedulers: which calls build one, what unit its length is in, where it is stepped."""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence

from trainlint._record import Record
from trainlint.analysis.arguments import bind, receiver_skip
from trainlint.analysis.model import FileModel, call_name, dotted, keyword
from trainlint.analysis.roles import LEGACY_SCHEDULE, LEGACY_TRANSFORMERS, Binding, Role

LR_SCHEDULER = "torch.optim.lr_scheduler."
EPOCH_CLASSES = {"StepLR", "MultiStepLR", "ExponentialLR", "ReduceLROnPlateau"}
ITERATION_CLASSES = {"OneCycleLR", "CyclicLR"}
LENGTH_CLASSES = {
    "CosineAnnealingLR",
    "CosineAnnealingWarmRestarts",
    "LambdaLR",
    "PolynomialLR",
    "LinearLR",
    "MultiplicativeLR",
    "ConstantLR",
}
ITER_WORDS = re.compile(
    r"steps_per_epoch|total_steps|max_steps|num_training_steps|"
    r"training_steps|num_steps|total_iters?$|max_iters?|num_iters?|"
    r"iterations|num_updates|total_updates|train_steps|n_steps",
    re.I,
)
EPOCH_WORD = re.compile(r"epoch", re.I)


class Schedule(Record):
    """A scheduler construction and what it counts in."""

    __slots__ = ("binding", "cls", "unit")

    binding: Binding
    cls: str  # class or factory name
    unit: str | None  # "epoch", "iteration" or None (cannot tell)

    def __init__(self, binding: Binding, cls: str, unit: str | None) -> None:
        self.binding = binding
        self.cls = cls
        self.unit = unit


def names_in(node: ast.AST, skip: set[str] = frozenset()) -> list[str]:  # type: ignore[assignment]
    out = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id not in skip:
            out.append(sub.id)
        elif isinstance(sub, ast.Attribute):
            out.append(sub.attr)
    return out


def len_of_loader(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and call_name(sub) == "len" and sub.args:
            text = (dotted(sub.args[0]) or "").lower()
            if "loader" in text or "batches" in text or "data" in text or "iter" in text:
                return True
    return False


def unit_of_length(model: FileModel, exprs: Sequence[ast.AST]) -> str | None:
    iteration = epoch = False
    for expr in exprs:
        if len_of_loader(expr):
            iteration = True
        for name in names_in(expr):
            if ITER_WORDS.search(name):
                iteration = True
            elif EPOCH_WORD.search(name):
                epoch = True
    if iteration:
        return "iteration"  # `len(loader) * epochs` counts iterations
    if epoch:
        return "epoch"
    return None


def lambda_body(model: FileModel, node: ast.AST | None) -> tuple[ast.AST, set[str]] | None:
    """The expression/def a LambdaLR multiplier is computed by, and its parameter names."""
    if isinstance(node, ast.Lambda):
        return node.body, {a.arg for a in node.args.args}
    if isinstance(node, ast.Name):
        fn = _def_in_scope(model, node)
        if fn is not None:
            return fn, {a.arg for a in fn.args.args}
        found = model.flow.definition(node.id, node)
        if found is not None and isinstance(found[1], ast.Lambda):
            return found[1].body, {a.arg for a in found[1].args.args}
    if isinstance(node, ast.Call) and call_name(node) == "partial" and node.args:
        return lambda_body(model, node.args[0])
    return None


def _def_in_scope(model: FileModel, name: ast.Name) -> ast.FunctionDef | None:
    """The ``def`` a name refers to: the last one of that name defined before it in its
    own scope, else in an enclosing one, else any of the file (several factories each
    define their own ``lr_lambda``: the one beside the use is the one it means)."""
    named = [f for f in model.functions if f.name == name.id and isinstance(f, ast.FunctionDef)]
    if len(named) > 1:
        scope: ast.AST | None = model.function_of(name)
        while True:
            here = [
                f
                for f in named
                if (model.function_of(f) or model.tree) is (scope or model.tree)
                and f.lineno <= name.lineno
            ]
            if here:
                return here[-1]
            if scope is None:
                break
            scope = model.function_of(scope)
    return named[0] if named else None


def lambda_closure(
    model: FileModel, node: ast.AST | None
) -> tuple[ast.AST, set[str], dict[str, ast.AST]] | None:
    """:func:`lambda_body`, also through a same-file factory call (``LambdaLR(opt,
    warmup_fn(500))``, ``self.make_lambda(cfg.warmup)``): the lambda or nested def the
    factory returns, and the factory's parameters bound to the call's argument
    expressions (what the multiplier's free names stand for at this construction)."""
    found = lambda_body(model, node)
    if found is not None:
        return found[0], found[1], {}
    if not isinstance(node, ast.Call):
        return None
    fn = model.resolve_call(node)
    if fn is None:
        return None
    returns = [r for r in model.returns_in(fn) if r.value is not None]
    if len(returns) != 1:
        return None
    value = returns[0].value
    inner: tuple[ast.AST, set[str]] | None = None
    if isinstance(value, ast.Lambda):
        inner = value.body, {a.arg for a in value.args.args}
    elif isinstance(value, ast.Name):
        for stmt in fn.body:
            if isinstance(stmt, ast.FunctionDef) and stmt.name == value.id:
                inner = stmt, {a.arg for a in stmt.args.args}
    if inner is None:
        return None
    bound: dict[str, ast.AST] = dict(bind(fn, node.args, node.keywords, receiver_skip(model, node, fn)))
    return inner[0], inner[1], bound


#: Schedulers made of other schedulers: their unit is their children's.
COMPOSITE_CLASSES = {"SequentialLR", "ChainedScheduler"}


def _composite_unit(model: FileModel, call: ast.Call, depth: int) -> str | None:
    """The unit all the child schedules of a `SequentialLR`/`ChainedScheduler` agree on
    (built inline or bound to names), with `SequentialLR`'s milestones; None when they
    disagree or none can be told."""
    children = keyword(call, "schedulers")
    if children is None:
        children = next((a for a in call.args if isinstance(a, (ast.List, ast.Tuple))), None)
    if not isinstance(children, (ast.List, ast.Tuple)) or depth > 3:
        return None
    units: set[str] = set()
    for child in children.elts:
        binding: Binding | None = None
        if isinstance(child, ast.Call):
            binding = Binding(Role.SCHEDULER, model.qualname(child.func), child, child)
        elif isinstance(child, (ast.Name, ast.Attribute)):
            binding = model.roles.lookup(child)
        if binding is None or binding.call is None:
            continue
        sched = schedule_of(model, binding, depth + 1)
        if sched is not None and sched.unit is not None:
            units.add(sched.unit)
    milestones = keyword(call, "milestones")
    if milestones is not None:
        unit = unit_of_length(model, [milestones])
        if unit is not None:
            units.add(unit)
    return units.pop() if len(units) == 1 else None


def lambda_arg(call: ast.Call) -> ast.AST | None:
    return keyword(call, "lr_lambda") or (call.args[1] if len(call.args) > 1 else None)


def schedule_of(model: FileModel, binding: Binding, depth: int = 0) -> Schedule | None:
    call = binding.call
    qual = binding.qualname or ""
    if call is None:
        return None
    cls = qual.rsplit(".", 1)[-1]
    if qual.startswith(LR_SCHEDULER):
        if cls in ITERATION_CLASSES:
            return Schedule(binding, cls, "iteration")
        args = [*call.args[1:], *(k.value for k in call.keywords if k.arg != "optimizer")]
        if cls in EPOCH_CLASSES:
            unit = unit_of_length(model, args)
            return Schedule(binding, cls, "iteration" if unit == "iteration" else "epoch")
        if cls in LENGTH_CLASSES:
            if cls in ("LambdaLR", "MultiplicativeLR"):
                body = lambda_closure(model, lambda_arg(call))
                if body is None:
                    return Schedule(binding, cls, None)
                node, params, bound = body
                names = [n for n in names_in(node, params) if n not in bound]
                fake: list[ast.AST] = [ast.Name(id=n) for n in names]
                return Schedule(binding, cls, unit_of_length(model, [*fake, *bound.values()]))
            return Schedule(binding, cls, unit_of_length(model, args))
        if cls in COMPOSITE_CLASSES:
            return Schedule(binding, cls, _composite_unit(model, call, depth))
        return Schedule(binding, cls, None)
    if qual.startswith(LEGACY_TRANSFORMERS) and LEGACY_SCHEDULE.match(cls):
        return Schedule(binding, cls, "iteration")  # `t_total` counts optimizer steps
    if qual.startswith("transformers") and (re.match(r"get_\w*schedule", cls)):
        # sized by its training-step count: in epochs when that count is an epoch count
        total = keyword(call, "num_training_steps") or (
            call.args[2] if len(call.args) > 2 else None
        )
        unit = unit_of_length(model, [total]) if total is not None else None
        return Schedule(binding, cls, "epoch" if unit == "epoch" else "iteration")
    return None


def schedules(model: FileModel) -> dict[int, Schedule]:
    """Scheduler constructions (by id of the construction call) with their unit; computed
    once per file, since every `scheduler.step()` asks."""
    return model.memo(schedules, compute_schedules)


def compute_schedules(model: FileModel) -> dict[int, Schedule]:
    out: dict[int, Schedule] = {}
    for _, b in model.roles.all_of(Role.SCHEDULER):
        if b.call is not None and id(b.call) not in out:
            sched = schedule_of(model, b)
            if sched is not None:
                out[id(b.call)] = sched
    # constructions not bound to a name (returned directly, passed along)
    for call in scheduler_calls(model):
        if id(call) not in out:
            qual = model.qualname(call.func)
            sched = schedule_of(model, Binding(Role.SCHEDULER, qual, call, call))
            if sched is not None:
                out[id(call)] = sched
    return out


def is_scheduler_qualname(qual: str) -> bool:
    last = qual.rsplit(".", 1)[-1]
    return (
        (qual.startswith(LR_SCHEDULER) and last[:1].isupper())
        or bool(qual.startswith("transformers") and re.match(r"get_\w*schedule", last))
        or bool(qual.startswith(LEGACY_TRANSFORMERS) and LEGACY_SCHEDULE.match(last))
    )


def scheduler_calls(model: FileModel) -> list[ast.Call]:
    """Scheduler constructions, in source order (found once per file; callers must not
    change the list). Only names that can spell one are resolved: a class (`StepLR`), a
    factory (`get_..._schedule...`), or an import alias."""
    return model.memo(_scheduler_calls, _scheduler_calls)


def _scheduler_calls(model: FileModel) -> list[ast.Call]:
    names = {n for n in model.calls if n[:1].isupper() or n.startswith("get_")}
    for b in model.imports.scopes.values():
        names.update(local for local, q in b.imports.items() if is_scheduler_qualname(q))
    calls = [
        c
        for n in names
        for c in model.calls.get(n, ())
        if is_scheduler_qualname(model.qualname(c.func) or "")
    ]
    return sorted(calls, key=lambda c: (c.lineno, c.col_offset))


def schedule_for_step(model: FileModel, call: ast.Call) -> Schedule | None:
    if not isinstance(call.func, ast.Attribute):
        return None
    binding = model.roles.lookup(call.func.value)
    if binding is None or binding.role is not Role.SCHEDULER:
        return None
    cls, unit = getattr(binding, "cls", None), getattr(binding, "unit", None)
    if (
        cls is not None
        and binding.call is None
        or binding.call is not None
        and (id(binding.call) not in schedules(model) and cls is not None)
    ):
        # built in another file (a factory, a constructor's caller): its unit came with it
        return Schedule(binding, cls, unit)
    if binding.call is None:
        return None
    return schedules(model).get(id(binding.call))


def position_counter(model: FileModel, call: ast.Call) -> str | None:
    """What the position passed to ``scheduler.step(n)`` counts: ``"epoch"`` (an epoch
    index: ``epoch``, ``self.current_epoch``), ``"batch"`` (the index of ``enumerate``
    over the loader, which starts again at 0 every pass), or None (a global step or
    anything else: the schedule's own count, as far as can be told). A fraction
    (``epoch + i / iters``) is a deliberate fractional position: None."""
    arg = call.args[0] if call.args else keyword(call, "epoch")
    if arg is None or any(
        isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Div, ast.FloorDiv, ast.Mult))
        for n in ast.walk(arg)
    ):
        return None
    names = names_in(arg)
    if names and EPOCH_WORD.search(names[0]):
        return "epoch"
    if isinstance(arg, ast.Name):
        for anc in model.ancestors(call):
            if isinstance(anc, (ast.For, ast.AsyncFor)) and _enumerate_index(anc, arg.id):
                return "batch"
    return None


def _enumerate_index(loop: ast.For | ast.AsyncFor, name: str) -> bool:
    """``for name, batch in enumerate(loader)`` (no ``start``: 0 at every pass)."""
    it = loop.iter
    target = loop.target
    return (
        isinstance(it, ast.Call)
        and call_name(it) == "enumerate"
        and len(it.args) == 1
        and not it.keywords
        and isinstance(target, ast.Tuple)
        and len(target.elts) == 2
        and isinstance(target.elts[0], ast.Name)
        and target.elts[0].id == name
        and "loader" in (dotted(it.args[0]) or "").lower()
    )


def stepped_per_batch(model: FileModel, call: ast.Call) -> bool:
    """Does ``call`` run once per batch: inside a step loop or step function, or in a
    Lightning ``lr_scheduler_step`` hook while some scheduler of the file may be stepped
    with ``"interval": "step"`` (or one not a constant ``"epoch"``)?"""
    for loop in model.steps.step_loops:
        if any(anc is loop.node for anc in model.ancestors(call)):
            return True
    fn = model.function_of(call)
    if fn is not None and getattr(fn, "name", "") == "lr_scheduler_step":
        for node in ast.walk(model.tree):
            if isinstance(node, ast.Dict):
                for k, v in zip(node.keys, node.values, strict=True):
                    if (
                        isinstance(k, ast.Constant)
                        and k.value == "interval"
                        and not (isinstance(v, ast.Constant) and v.value == "epoch")
                    ):
                        return True
    return False


def advances_schedule(model: FileModel, call: ast.Call) -> bool:
    """Is ``scheduler.step(...)`` torch's plain advance by one, whose new LR serves the
    *next* update? Not when it passes a position (``step(epoch)``: the schedule is put
    at that point, so nothing is skipped by calling it before the update), nor when its
    result is used (``lr = scheduler.step()``: torch's returns None, so this is a
    project's own scheduler that computes and writes the LR for the coming update)."""
    if call.args or call.keywords:
        return False
    return isinstance(model.parent_of(call), ast.Expr)
