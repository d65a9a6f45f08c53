"""Dispatch targets defined in another module of the project.

``mp.Process(target=train_worker, args=(model, loader))`` with ``train_worker`` imported
from ``workers.py``, or ``workers.train_remote.remote(model, opt, shard)``: the escape
analysis knows what a same-file target trains by reading its body; for an imported one,
the target's own file says it in its summary (:func:`worker_facts`), and the project
index hands those facts to every file that imports the function (``view["workers"]``,
keyed by the name as the importing file spells it). :func:`foreign_worker` stands such a
target in for a definition: a bodiless ``def`` with the target's parameters, which the
escape analysis recognises (:func:`facts_of`) and answers from the facts instead of a
body.

The facts, all in the target's parameter names: ``trains`` (parameters whose object it
steps, or whose parameters an optimizer it steps holds), ``forwards`` (parameters it runs
forward with autograd on while stepping an optimizer it received, whose models it cannot
tell: they count when the dispatching file knows the argument as a model), ``moves``
(parameters it copies to another device or dtype before training) and ``remote`` (it is a
``@ray.remote`` function).
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Any

from trainlint.analysis.arguments import parameter_names
from trainlint.analysis.flow import grad_enabled_at
from trainlint.analysis.model import dotted, walk_local
from trainlint.analysis.steps import Kind

if TYPE_CHECKING:
    from trainlint.analysis.escapes import Escapes
    from trainlint.analysis.model import FileModel, FunctionNode

#: the attribute a stand-in definition carries its facts in
_FACTS = "_trainlint_worker"


def worker_facts(esc: Escapes, fn: FunctionNode) -> dict[str, Any] | None:
    """What ``fn`` does to the objects it receives, for its summary; None when nothing."""
    params = parameter_names(fn)
    out: dict[str, Any] = {}
    trained = {t.root for t in esc.trained(fn).values()} & set(params)
    if trained:
        out["trains"] = sorted(trained)
        moves = [p for p in sorted(trained) if esc.copies_before_training(fn, p) is not None]
        if moves:
            out["moves"] = moves
    forwards = _forwards_beside_a_received_step(esc, fn, params)
    if forwards:
        out["forwards"] = forwards
    if esc.is_remote_def(fn):
        out["remote"] = True
    return out or None


def _forwards_beside_a_received_step(
    esc: Escapes, fn: FunctionNode, params: list[str]
) -> list[str]:
    """Parameters ``fn`` runs forward (``p(x)``, ``p.forward(x)``) with autograd on, when it
    backpropagates and steps an optimizer it received whose models it cannot name."""
    steps = [esc.step_touches(fn, ev) for ev in esc.events(fn, Kind.STEP)]
    if not any(len(ts) == 1 and ts[0].name in params for ts in steps):
        return []
    if not esc.events(fn, Kind.BACKWARD):
        return []
    out: set[str] = set()
    for call in walk_local(fn):
        if not isinstance(call, ast.Call):
            continue
        func = call.func
        target = func.value if isinstance(func, ast.Attribute) and func.attr == "forward" else func
        if isinstance(target, ast.Name) and target.id in params:
            if grad_enabled_at(esc.model, call)[0]:
                out.add(target.id)
    return sorted(out)


def foreign_worker(model: FileModel, expr: ast.AST) -> FunctionNode | None:
    """A stand-in definition for the imported function ``expr`` names, when the project
    view says what it does to its arguments; the same object for the same name."""
    view = getattr(model, "project", None) or {}
    workers = view.get("workers")
    if not workers:
        return None
    qual = model.qualname(expr) if isinstance(expr, (ast.Name, ast.Attribute)) else None
    entry = workers.get(qual) if qual is not None else None
    if entry is None:
        return None

    def build(_: FileModel) -> dict[str, FunctionNode]:
        return {}

    made = model.memo(("escape-targets",), build)
    fn = made.get(qual)  # type: ignore[arg-type]
    if fn is None:
        name = (dotted(expr) or "worker").rsplit(".", 1)[-1]
        params = [ast.arg(arg=p) for p in entry["params"]]
        kwonly = [ast.arg(arg=p) for p in entry.get("kwonly", ())]
        fn = ast.FunctionDef(
            name=name,
            args=ast.arguments(
                posonlyargs=[],
                args=params,
                kwonlyargs=kwonly,
                kw_defaults=[None] * len(kwonly),
                defaults=[],
            ),
            body=[ast.Pass()],
            decorator_list=[],
            returns=None,
        )
        setattr(fn, _FACTS, entry)
        made[qual] = fn  # type: ignore[index]
    return fn


def facts_of(fn: ast.AST) -> dict[str, Any] | None:
    """The facts a stand-in definition carries; None for a definition of the file."""
    facts = getattr(fn, _FACTS, None)
    return facts if isinstance(facts, dict) else None


def moves_first(fn: ast.AST, param: str) -> bool:
    """A stand-in's target copies ``param`` to another device or dtype before training it
    (``Escapes.copies_before_training`` for a body of this file)."""
    facts = facts_of(fn)
    return facts is not None and param in facts.get("moves", ())
