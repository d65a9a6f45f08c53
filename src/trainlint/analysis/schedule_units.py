"""In which unit a scheduler step runs: once per batch, once per epoch, or chosen by a test."""

from __future__ import annotations

import ast
import re

from trainlint.analysis.constants import literal_value
from trainlint.analysis.model import NESTED_SCOPES, FileModel, dotted, keyword
from trainlint.analysis.schedules import ITERATION_CLASSES, Schedule, scheduler_calls
from trainlint.analysis.steps import EPOCH_FUNCTION_NAMES, LOOP_NODES, Event, Kind


def per_batch_event(model: FileModel, call: ast.Call) -> Event | None:
    """The step-loop event of this scheduler step when it runs once per batch (not under
    a test that picks the epoch's last batch: that runs once per epoch)."""
    if last_batch_guarded(model, call):
        return None
    return model.memo(_per_batch_events, _per_batch_events).get(id(call))


def _per_batch_events(model: FileModel) -> dict[int, Event]:
    """Each scheduler step made directly in a step loop's body, by the call's id (the
    first loop's event, in loop order): one pass over the step loops per file."""
    out: dict[int, Event] = {}
    for loop in model.steps.step_loops:
        for e in loop.of(Kind.SCHED):
            if e.depth == 0:
                out.setdefault(id(e.node), e)
    return out


_LAST_BATCH = re.compile(r"is_last_batch|last_batch|end_of_epoch|epoch_end", re.IGNORECASE)


def last_batch_guarded(model: FileModel, call: ast.Call) -> bool:
    """Is ``call`` under an ``if`` on the epoch's last batch (Lightning's
    ``self.trainer.is_last_batch``, ``i == len(loader) - 1``)?"""
    for anc in model.ancestors(call):
        if isinstance(anc, NESTED_SCOPES):
            return False
        if not isinstance(anc, ast.If) or any(call is n for n in ast.walk(anc.test)):
            continue
        if any(call is n for s in anc.orelse for n in ast.walk(s)):
            continue  # the other branch: every batch but the last
        for sub in ast.walk(anc.test):
            name = sub.attr if isinstance(sub, ast.Attribute) else getattr(sub, "id", "")
            if isinstance(name, str) and _LAST_BATCH.search(name):
                return True
            if isinstance(sub, ast.Compare) and _is_last_index(sub):
                return True
    return False


def _is_last_index(test: ast.Compare) -> bool:
    """``i == len(loader) - 1`` / ``i + 1 == len(loader)``."""
    if len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq):
        return False
    nodes = [n for side in (test.left, test.comparators[0]) for n in ast.walk(side)]
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "len"
        for n in nodes
    ) and any(
        isinstance(n, ast.BinOp)
        and isinstance(n.op, (ast.Add, ast.Sub))
        and isinstance(n.right, ast.Constant)
        and n.right.value == 1
        for n in nodes
    )


def runs_per_epoch(model: FileModel, call: ast.Call) -> bool:
    """Runs once per epoch: in a loop that encloses a step loop but is none itself, or in a
    `train_one_epoch`-style function after its batch loop."""
    if per_batch_event(model, call) is not None:
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
        return any(id(loop) in step_ids for loop in model.loops if model.function_of(loop) is fn)
    return False


#: Epoch schedules rarely decay after more than this many epochs; a step size or
#: milestone this large counts iterations (detectron-style `milestones=[60000, 80000]`).
ITERATION_SIZED = 1000
_ITER_NAME = re.compile(r"iter", re.IGNORECASE)
# Names that leave the unit open: detectron2's `SOLVER.STEPS` counts iterations,
# torchvision's `--lr-steps` epochs. Stepped per batch, such a schedule is not judged.
_OPEN_NAME = re.compile(r"(^|_)steps$", re.IGNORECASE)
_KIND_WORDS = re.compile(
    r"one_?cycle|cyclic|per_?(iter|batch|step)|by_?(iter|step)|iter(ation)?_?based|"
    r"step_?(per|every|each|on)_?(batch|iter)|batch_?(level|wise)",
    re.IGNORECASE,
)


def sized_in_iterations(model: FileModel, sched: Schedule) -> bool:
    """A StepLR/MultiStepLR whose step size or milestones say iterations: a large
    constant (directly, or as a default or constant it is named by), or a name with
    `iter` in it (`lr_decay_iters`). A name that leaves the unit open (`cfg.SOLVER.STEPS`,
    `args.lr_steps`) counts too: a per-batch step of it is not judged."""
    call = sched.binding.call
    if call is None or sched.cls not in ("StepLR", "MultiStepLR"):
        return False
    size = (
        keyword(call, "step_size")
        or keyword(call, "milestones")
        or (call.args[1] if len(call.args) > 1 else None)
    )
    if size is None:
        return False
    for sub in ast.walk(size):
        text = (
            sub.id
            if isinstance(sub, ast.Name)
            else sub.attr
            if isinstance(sub, ast.Attribute)
            else ""
        )
        if text and (_ITER_NAME.search(text) or _OPEN_NAME.search(text)):
            return True
        value = literal_value(model, sub)
        if (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and (value >= ITERATION_SIZED)
        ):
            return True
        if isinstance(value, (tuple, list)) and any(
            isinstance(v, (int, float)) and v >= ITERATION_SIZED for v in value
        ):
            return True
    return False


def _scheduler_ids(model: FileModel) -> set[int]:
    return {id(c) for c in scheduler_calls(model)}


def kind_guarded(model: FileModel, call: ast.Call) -> bool:
    """The step sits under a test of which kind of scheduler this is: an `isinstance`
    or a name string (`"onecycle"`), a flag named for it (`step_per_batch`), or a flag
    set right where a scheduler is built. Whatever was built, it is stepped in the unit
    the code chose for it."""
    sched_ids = model.memo(_scheduler_ids, _scheduler_ids)
    for anc in model.ancestors(call):
        if isinstance(anc, NESTED_SCOPES):
            break
        if not isinstance(anc, ast.If):
            continue
        for sub in ast.walk(anc.test):
            text = (
                sub.id
                if isinstance(sub, ast.Name)
                else sub.attr
                if isinstance(sub, ast.Attribute)
                else sub.value
                if isinstance(sub, ast.Constant) and isinstance(sub.value, str)
                else ""
            )
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
        if not (
            isinstance(node.value, (ast.Compare, ast.BoolOp))
            or (isinstance(node.value, ast.Constant) and isinstance(node.value.value, bool))
        ):
            continue  # a flag holds a truth value
        parent = model.parent_of(node)
        for field in ("body", "orelse"):
            block = getattr(parent, field, None)
            if (
                isinstance(block, list)
                and any(st is node for st in block)
                and any(id(sub) in sched_ids for st in block for sub in ast.walk(st))
            ):
                return True
    return False
