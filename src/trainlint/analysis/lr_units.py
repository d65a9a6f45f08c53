"""In which unit a hand-written learning-rate schedule counts, and in which it ends.

A hand-written schedule (a value stored into ``param_groups[...]["lr"]``, see
:mod:`trainlint.analysis.lr_assignments`) is a fraction ``counter / horizon`` somewhere:
``step / total_steps``, ``(it - warmup) / (max_iters - warmup)`` inside a ``get_lr(it)``
helper, ``epoch / args.epochs`` inside a cosine. The counter advances once per batch
(the batch loop's own index, or a name incremented in the batch loop) or once per epoch
(the epoch loop's index, or a name incremented in the epoch loop outside the batch
loop); the horizon is a number of epochs (``num_epochs``, ``args.epochs``) or of
iterations (``len(loader)``, ``total_steps``, ``max_iters``, ``steps_per_epoch``).

:func:`unit_mismatch` finds a fraction whose counter and horizon disagree, with
everything in it known: names defined earlier in the function and same-file helpers are
expanded, and a horizon with any name of unknown unit (``warmup``, a bare parameter) is
left alone.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence

from trainlint._record import Record
from trainlint.analysis.escapes import params_of
from trainlint.analysis.lr_assignments import counter_key
from trainlint.analysis.model import NESTED_SCOPES, FileModel, call_name, dotted
from trainlint.analysis.steps import LOOP_NODES

_ITERATION = re.compile(r"iter|step|batch|sample|token|update|len\(\)", re.IGNORECASE)
_EPOCH = re.compile(r"epoch", re.IGNORECASE)
_LEN = "len()"
_DEPTH = 4


class UnitMismatch(Record, frozen=True):
    """A fraction ``counter / horizon`` whose units disagree."""

    __slots__ = ("counter", "counter_unit", "horizon", "horizon_unit")

    counter: str  # the counter's name, as written in the caller
    counter_unit: str  # "batch" or "epoch"
    horizon: str  # the horizon's names, as written
    horizon_unit: str  # "epochs" or "iterations"

    def __init__(self, counter: str, counter_unit: str, horizon: str, horizon_unit: str) -> None:
        self.counter = counter
        self.counter_unit = counter_unit
        self.horizon = horizon
        self.horizon_unit = horizon_unit


def _unit_of_name(name: str) -> str | None:
    if name == _LEN or _ITERATION.search(name):
        return "iterations"
    if _EPOCH.search(name):
        return "epochs"
    return None


class _Fractions:
    """The ``(numerator names, denominator names)`` of every division an expression
    computes, following local definitions and same-file helpers."""

    def __init__(self, model: FileModel) -> None:
        self.model = model
        self.pairs: list[tuple[frozenset[str], frozenset[str], bool]] = []

    def names(
        self,
        node: ast.AST,
        params: dict[str, frozenset[str]] | None,
        fn: ast.AST | None,
        depth: int,
    ) -> tuple[set[str], bool]:
        """Names an expression reads (expanded), and whether all of them are known: a
        name with no local definition, not a counter key and of no recognisable unit
        (``warmup``) is unknown."""
        out: set[str] = set()
        known = True
        todo: list[ast.AST] = [node]
        while todo:
            sub = todo.pop()
            if isinstance(sub, ast.BinOp) and isinstance(sub.op, (ast.Div, ast.FloorDiv)):
                num, num_known = self.names(sub.left, params, fn, depth)
                den, den_known = self.names(sub.right, params, fn, depth)
                self.pairs.append((frozenset(num), frozenset(den), den_known))
                out |= num | den
                known = known and num_known and den_known
                continue
            if isinstance(sub, ast.Call):
                if call_name(sub) == "len" and isinstance(sub.func, ast.Name):
                    out.add(_LEN)
                    continue
                callee = self.model.resolve_call(sub)
                if (
                    isinstance(callee, ast.FunctionDef)
                    and depth < _DEPTH
                    and not any(isinstance(a, ast.Starred) for a in sub.args)
                ):
                    ps = params_of(callee)
                    if isinstance(sub.func, ast.Attribute) and self.model.class_of(callee):
                        ps = ps[1:]
                    bound: dict[str, frozenset[str]] = {}
                    for p, a in zip(ps, sub.args, strict=False):
                        got, ok = self.names(a, params, fn, depth)
                        bound[p] = frozenset(got) if ok else frozenset({"?" + p})
                    for kw in sub.keywords:
                        if kw.arg is not None:
                            got, ok = self.names(kw.value, params, fn, depth)
                            bound[kw.arg] = frozenset(got) if ok else frozenset({"?" + kw.arg})
                    for ret in ast.walk(callee):
                        if isinstance(ret, ast.Return) and ret.value is not None:
                            got, ok = self.names(ret.value, bound, callee, depth + 1)
                            out |= got
                            known = known and ok
                    continue
                todo.extend(sub.args)
                todo.extend(k.value for k in sub.keywords)
                continue
            key = counter_key(sub) if isinstance(sub, ast.Subscript) else None
            if key is not None:
                out.add(key)
                continue
            if isinstance(sub, ast.Attribute):
                name = dotted(sub)
                if name is not None:
                    out.add(name)
                    known = known and _unit_of_name(name) is not None
                    continue
            if isinstance(sub, ast.Name):
                got, ok = self._name(sub, params, fn, depth)
                out |= got
                known = known and ok
                continue
            if isinstance(sub, ast.Constant):
                continue
            todo.extend(ast.iter_child_nodes(sub))
        return out, known

    def _name(
        self,
        node: ast.Name,
        params: dict[str, frozenset[str]] | None,
        fn: ast.AST | None,
        depth: int,
    ) -> tuple[set[str], bool]:
        if params is not None and node.id in params:
            got = set(params[node.id])
            return got, not any(g.startswith("?") for g in got)
        out = {node.id}
        if _unit_of_name(node.id) is not None:
            return out, True
        found = self.model.flow.definition(node.id, node) if depth < _DEPTH else None
        if (
            found is not None
            and isinstance(found[1], ast.expr)
            and isinstance(found[0], (ast.Assign, ast.AnnAssign))
        ):
            got, ok = self.names(found[1], params, fn, depth + 1)
            return out | got, ok
        return out, False


def _loop_targets(loop: ast.AST) -> set[str]:
    target = getattr(loop, "target", None)
    if target is None:
        return set()
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


def _within(model: FileModel, node: ast.AST, outer: ast.AST) -> bool:
    """``node`` is under ``outer``, not inside a def, lambda or class nested there."""
    for anc in model.ancestors(node):
        if anc is outer:
            return True
        if isinstance(anc, NESTED_SCOPES):
            return False
    return False


def _incremented(model: FileModel, loop: ast.AST, skip: Sequence[ast.AST] = ()) -> set[str]:
    """The counters ``+=``-ed in ``loop`` (outside the loops ``skip``), from the model's
    assignment table."""
    return {
        k
        for n in model.assignments
        if isinstance(n, ast.AugAssign)
        and isinstance(n.op, ast.Add)
        and _within(model, n, loop)
        and not any(_within(model, n, s) for s in skip)
        for k in [counter_key(n.target)]
        if k is not None
    }


def counters(model: FileModel, node: ast.AST) -> tuple[set[str], set[str]] | None:
    """(per-batch, per-epoch) counters seen at ``node``: inside a batch loop (a loop with
    the optimizer step) nested in an epoch loop, or inside an epoch loop around one. None
    when ``node`` is in neither."""
    loops = [lp for lp in model.enclosing_loops(node) if isinstance(lp, LOOP_NODES)]
    step_ids = model.steps.step_loop_ids
    epoch_ids = {id(e) for e in model.steps.epoch_loops}
    batch = next((lp for lp in loops if id(lp) in step_ids), None)
    epochs = [lp for lp in loops if id(lp) in epoch_ids and lp is not batch]
    if batch is None and not epochs:
        return None
    # the same loops for every LR store in them: counted once
    key = ("lr_units.counters", id(batch), *(id(lp) for lp in epochs))
    return model.memo(key, lambda m: _counters(m, batch, epochs, step_ids))


def _counters(
    model: FileModel, batch: ast.AST | None, epochs: Sequence[ast.AST], step_ids: set[int]
) -> tuple[set[str], set[str]]:
    batch_loops: list[ast.AST] = [batch] if batch is not None else []
    if batch is None:
        batch_loops = [
            lp for lp in model.loops if id(lp) in step_ids and _within(model, lp, epochs[0])
        ]
    per_batch: set[str] = set()
    for lp in batch_loops:
        per_batch |= _loop_targets(lp) | _incremented(model, lp)
    per_epoch: set[str] = set()
    for lp in epochs:
        per_epoch |= _loop_targets(lp)
        per_epoch |= _incremented(model, lp, batch_loops)
    return per_batch - per_epoch, per_epoch - per_batch


def unit_mismatch(model: FileModel, node: ast.AST, value: ast.expr) -> UnitMismatch | None:
    """A division in ``value`` (the LR stored at ``node``) of a per-batch counter by an
    epoch count, or of a per-epoch counter by an iteration count."""
    found = counters(model, model.statement_of(node))
    if found is None:
        return None
    per_batch, per_epoch = found
    fractions = _Fractions(model)
    fractions.names(value, None, model.function_of(node), 0)
    for num, den, den_known in fractions.pairs:
        if not den_known or not den or num & per_batch and num & per_epoch:
            continue
        units = {_unit_of_name(n) for n in den} - {None}
        if den & (per_batch | per_epoch):
            continue
        if num & per_batch and units == {"epochs"}:
            counter = _first(num & per_batch)
            if not _agree(model, node, counter, den, "epochs"):
                return UnitMismatch(counter, "batch", _shown(den, "epochs"), "epochs")
        if num & per_epoch and not num & per_batch and units == {"iterations"}:
            counter = _first(num & per_epoch)
            if not _agree(model, node, counter, den, "iterations"):
                return UnitMismatch(counter, "epoch", _shown(den, "iterations"), "iterations")
    return None


def _agree(model: FileModel, node: ast.AST, counter: str, den: frozenset[str], unit: str) -> bool:
    """The counter is measured in the horizon's unit after all: its name says so (the
    outer loop of PPO counts `update`s over `num_updates`), or its loop runs over the
    horizon (`for update in range(1, num_updates + 1)`)."""
    if _unit_of_name(counter) == unit:
        return True
    for loop in model.enclosing_loops(model.statement_of(node)):
        if counter in _loop_targets(loop):
            bound = {
                dotted(n)
                for n in ast.walk(getattr(loop, "iter", loop))
                if isinstance(n, (ast.Name, ast.Attribute))
            }
            if den & bound:
                return True
    return False


def _first(names: set[str] | frozenset[str]) -> str:
    return sorted(names)[0]


def _shown(names: frozenset[str], unit: str) -> str:
    return ", ".join(sorted(n for n in names if _unit_of_name(n) == unit))
