"""What a step is made of: the events of a training step, and the loops that hold them.

:class:`Event` (a backward, an optimizer step, a zero_grad, a gradient read or write,
a clip, ...) of a :class:`Kind`; :class:`StepLoop` (a loop and its iteration paths);
which calls are backward passes and what they backpropagate (:func:`backward_calls`,
:func:`backward_value`, :func:`backpropagated`); the counter and logging guards
(:func:`is_counter_guard`). :mod:`steps` finds the step loops and their paths.
"""

from __future__ import annotations

import ast
import re
from enum import Enum
from typing import TYPE_CHECKING

from trainlint._record import Record
from trainlint.analysis.model import (
    call_name,
    dotted,
    walk_tree,
)

if TYPE_CHECKING:
    from trainlint.analysis.model import FileModel

Loop = ast.For | ast.AsyncFor | ast.While
#: A file without any of these words has no step loop: rules that only look inside
#: training steps use them as their pre-filter triggers.
STEP_LOOP_TRIGGERS = ("backward", "step(", "optimizer_step", ".grad")
MAX_PATHS = 256
MAX_INLINE_DEPTH = 4
STEP_FUNCTION_NAMES = re.compile(
    r"^(train_?step|training_step|train_one_step|train_batch|training_batch|run_step|"
    r"train_iter(ation)?|training_iteration|optimi[sz]e_step|update_step|step_fn|"
    r"train_on_batch|fit_batch|_?train_step_\w*|\w*_train_step)$"
)
EPOCH_FUNCTION_NAMES = re.compile(r"(train|run|fit)_?(one_)?epoch|epoch_?train|train_loop")


class Kind(Enum):
    BACKWARD = "backward"
    STEP = "optimizer step"
    ZERO = "zero_grad"
    READ = "gradient read"
    CLIP = "gradient clip"
    SCHED = "scheduler step"
    UNSCALE = "unscale"
    UPDATE = "scaler update"
    EVAL = "model.eval()"
    TRAIN = "model.train()"
    #: a call to another file's function, in a summary's walk only (analysis.effects)
    CALL = "project call"


class Event(Record, frozen=True, eq=False):
    __slots__ = ("kind", "node", "target", "chain", "guards", "depth", "scaled", "via", "flags")

    kind: Kind
    node: ast.AST
    #: dotted receiver/argument: the optimizer stepped or zeroed, the scheduler stepped
    target: str | None
    #: call sites the event came through, outermost (in the loop body) first
    chain: tuple[ast.Call, ...]
    #: ``if`` statements the event sits under inside the iteration, with the branch taken
    guards: tuple[tuple[ast.If, bool], ...]
    #: how many loops nested inside the analysed loop body the event sits in
    depth: int
    #: for STEP: made through a GradScaler (``scaler.step(opt)``)
    scaled: bool
    #: a project function of another file the event happens in (``engine.train_step``);
    #: ``node`` is then the call to it in this file (SPEC §7)
    via: str | None
    #: guards inside that function: FLAG_COUNTER / FLAG_LOGGING
    flags: int

    def __init__(
        self,
        kind: Kind,
        node: ast.AST,
        target: str | None = None,
        chain: tuple[ast.Call, ...] = (),
        guards: tuple[tuple[ast.If, bool], ...] = (),
        depth: int = 0,
        scaled: bool = False,
        via: str | None = None,
        flags: int = 0,
    ) -> None:
        self.kind = kind
        self.node = node
        self.target = target
        self.chain = chain
        self.guards = guards
        self.depth = depth
        self.scaled = scaled
        self.via = via
        self.flags = flags

    def under_counter_guard(self) -> bool:
        return bool(self.flags & FLAG_COUNTER) or any(
            is_counter_guard(g.test) for g, _ in self.guards
        )

    def rate_limited(self) -> bool:
        return bool(self.flags & (FLAG_COUNTER | FLAG_LOGGING)) or any(
            is_counter_guard(g.test) or is_logging_guard(g.test) for g, _ in self.guards
        )


#: Event.flags: the event sits, inside another file's function, under a counter guard
#: (``if step % n == 0``) / a logging guard.
FLAG_COUNTER, FLAG_LOGGING = 1, 2


Path = tuple[Event, ...]


class StepLoop(Record):
    """A loop (or a step function called per step from elsewhere) and its iteration paths."""

    __slots__ = ("node", "paths", "precise", "epoch_loops")

    node: ast.AST  # the loop, or a FunctionDef for a step function
    paths: list[Path]
    precise: bool
    epoch_loops: list[ast.AST]

    def __init__(
        self,
        node: ast.AST,
        paths: list[Path],
        precise: bool = True,
        epoch_loops: list[ast.AST] | None = None,
    ) -> None:
        self.node = node
        self.paths = paths
        self.precise = precise
        self.epoch_loops = [] if epoch_loops is None else epoch_loops

    @property
    def events(self) -> list[Event]:
        seen: dict[int, Event] = {}
        for p in self.paths:
            for e in p:
                seen.setdefault(id(e), e)
        return sorted(seen.values(), key=lambda e: _pos(e.node))

    def of(self, kind: Kind) -> list[Event]:
        return [e for e in self.events if e.kind is kind]

    def targets(self, kind: Kind) -> set[str]:
        return {e.target for e in self.events if e.kind is kind and e.target}


AUTOGRAD_BACKWARD = "torch.autograd.backward"
AUTOGRAD_GRAD = "torch.autograd.grad"


def is_backward(model: FileModel, call: ast.Call) -> bool:
    """``x.backward()``, ``scaler.scale(l).backward()``, ``accelerator.backward(l)``,
    ``self.manual_backward(l)``, ``torch.autograd.backward(l)``."""
    name = call_name(call)
    if name in ("backward", "manual_backward"):
        if isinstance(call.func, ast.Attribute):
            return True
        return model.qualname(call.func) == AUTOGRAD_BACKWARD
    return False


def is_autograd_grad(model: FileModel, call: ast.Call) -> bool:
    return call_name(call) == "grad" and model.qualname(call.func) == AUTOGRAD_GRAD


def backward_calls(model: FileModel) -> list[ast.Call]:
    return [c for c in model.calls.get("backward", ()) if is_backward(model, c)] + [
        c for c in model.calls.get("manual_backward", ()) if is_backward(model, c)
    ]


def graph_uses(model: FileModel) -> list[ast.Call]:
    """Calls that traverse an autograd graph: backward in every form and autograd.grad."""
    uses = backward_calls(model)
    uses += [c for c in model.calls.get("grad", ()) if is_autograd_grad(model, c)]
    return sorted(uses, key=lambda c: (c.lineno, c.col_offset))


def backward_value(model: FileModel, call: ast.Call) -> ast.expr | None:
    """The tensor whose graph a backward/grad call traverses."""
    func = call.func
    name = call_name(call)
    if isinstance(func, ast.Attribute) and name == "backward":
        qual = model.qualname(func)
        if qual == AUTOGRAD_BACKWARD:
            return call.args[0] if call.args else None
        receiver = func.value
        # accelerator.backward(loss) / fabric.backward(loss): the loss is the argument.
        if call.args and not _looks_like_tensor_receiver(receiver):
            return call.args[0]
        return receiver
    if name == "manual_backward" or model.qualname(func) in (AUTOGRAD_BACKWARD, AUTOGRAD_GRAD):
        if call.args:
            return call.args[0]
        for kw in call.keywords:
            if kw.arg in ("tensors", "outputs"):
                return kw.value
    return None


def backpropagated(model: FileModel, expr: ast.AST) -> bool:
    """``expr`` names a value that the same function backpropagates (``loss.backward()``
    on the same definition): it carries a graph whatever computed it, a loss function
    of another module included. An entry under a constant key counts for its container
    (``out["loss"].backward()``: the dict ``out`` holds that graph)."""
    if not isinstance(expr, ast.Name):
        return False
    here = model.flow.definition(expr.id, expr)
    if here is None:
        return False
    fn = model.function_of(expr)
    for call in backward_calls(model):
        value = backward_value(model, call)
        keys = []
        while (
            isinstance(value, ast.Subscript)
            and isinstance(value.slice, ast.Constant)
            and isinstance(value.slice.value, str)
        ):
            keys.append(value.slice.value)
            value = value.value
        if keys and _entry_replaced(model, expr, keys[-1], call):
            continue  # `out["loss"] = out["loss"].detach()` before it is kept
        if isinstance(value, ast.Name) and value.id == expr.id and (model.function_of(call) is fn):
            there = model.flow.definition(value.id, value)
            if there is not None and there[0] is here[0]:
                return True
    return False


def _entry_replaced(model: FileModel, expr: ast.Name, key: str, after: ast.Call) -> bool:
    """``expr.id[key]`` is assigned again between ``after`` and ``expr``."""
    start, end = (after.lineno, after.col_offset), (expr.lineno, expr.col_offset)
    for node in model.assignments:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for t in targets:
            if (
                isinstance(t, ast.Subscript)
                and isinstance(t.value, ast.Name)
                and t.value.id == expr.id
                and isinstance(t.slice, ast.Constant)
                and t.slice.value == key
                and start < (t.lineno, t.col_offset) < end
            ):
                return True
    return False


def _looks_like_tensor_receiver(node: ast.expr) -> bool:

    name = dotted(node) or ""
    last = name.rsplit(".", 1)[-1].lower()
    return not any(k in last for k in ("accelerator", "fabric", "engine", "trainer", "strategy"))


# -- guards ---------------------------------------------------------------------------------


def _has_mod(node: ast.AST) -> bool:
    for sub in walk_tree(node):
        if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Mod):
            if not (isinstance(sub.left, ast.Constant) and isinstance(sub.left.value, str)):
                return True
    return False


def is_counter_guard(test: ast.AST) -> bool:
    """``step % N == 0``, ``(i + 1) % accum == 0``, ``not it % k``, ``a and i % n == 0``."""
    return _has_mod(test)


_LOG_WORDS = re.compile(
    r"log|print|verbose|display|report|debug|wandb|tensorboard|writer|"
    r"is_main|main_process|master|profil|timing|benchmark|monitor",
    re.IGNORECASE,
)


def is_logging_guard(test: ast.AST) -> bool:
    for sub in walk_tree(test):
        text = (
            sub.id
            if isinstance(sub, ast.Name)
            else sub.attr
            if isinstance(sub, ast.Attribute)
            else None
        )
        if text and _LOG_WORDS.search(text):
            return True
    return False


def _pos(node: ast.AST) -> tuple[int, int]:
    return (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))
