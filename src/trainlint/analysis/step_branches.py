"""Where a node sits among the branches and exits of a step loop.

:func:`after_limiting_exit` (a node past a ``break``/``return`` under a test that limits
the loop), :func:`off_training_branch` (a node on a branch that excludes the training
one), :func:`rebuilds_model` (a loop that builds its model anew each iteration).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import TYPE_CHECKING

from trainlint.analysis.model import (
    LOOP_NODES,
    NESTED_SCOPES,
    call_name,
    dotted,
    walk_local,
)
from trainlint.analysis.roles import Role
from trainlint.analysis.step_events import (  # (re-exported: the importers of steps use them)
    EPOCH_FUNCTION_NAMES,  # noqa: F401
    FLAG_COUNTER,  # noqa: F401
    FLAG_LOGGING,  # noqa: F401
    STEP_LOOP_TRIGGERS,  # noqa: F401
    backpropagated,  # noqa: F401
    backward_calls,
    backward_value,  # noqa: F401
    graph_uses,  # noqa: F401
    is_counter_guard,
    is_logging_guard,
)
from trainlint.analysis.step_paths import (  # (re-exported: the importers of steps use them)
    condition_literal,  # noqa: F401
)

if TYPE_CHECKING:
    from trainlint.analysis.model import FileModel


def after_limiting_exit(
    model: FileModel, node: ast.AST, stop: ast.AST, limits: Callable[[ast.If], bool] | None = None
) -> bool:
    """Is ``node`` preceded, in a block enclosing it (up to ``stop``, a step loop or step
    function, or ``node``'s own function), by an ``if`` that leaves early when ``limits``
    says it gates (default: rate-limit and logging guards)? ``if not should_log: return``
    or ``if step % n: continue`` before a read lets it run only on the steps that pass.
    """
    limits = limits or (lambda g: is_counter_guard(g.test) or is_logging_guard(g.test))
    cur: ast.AST = node
    for anc in model.ancestors(node):
        for field_name in ("body", "orelse", "finalbody"):
            block = getattr(anc, field_name, None)
            if not isinstance(block, list) or not any(s is cur for s in block):
                continue
            for stmt in block[: [id(s) for s in block].index(id(cur))]:
                if not (isinstance(stmt, ast.If) and stmt.body and not stmt.orelse):
                    continue
                last = stmt.body[-1]
                exits = isinstance(last, ast.Return) or (
                    isinstance(last, ast.Continue) and _innermost_loop(model, anc) is stop
                )
                if exits and limits(stmt):
                    return True
        if anc is stop or isinstance(anc, NESTED_SCOPES):
            return False
        cur = anc
    return False


def _innermost_loop(model: FileModel, node: ast.AST) -> ast.AST | None:
    """``node`` itself when it is a loop, else the loop around it in the same function."""
    for cur in (node, *model.ancestors(node)):
        if isinstance(cur, LOOP_NODES):
            return cur
        if isinstance(cur, NESTED_SCOPES):
            return None
    return None


def _constructed_module(model: FileModel, value: ast.AST) -> bool:
    """`Net(cfg)`, `GPTModel(cfg).bfloat16().to(device)`: an instance of a class (by the
    naming convention, when the class lives in another package) that is no torch object
    of a known other role (`nn.CrossEntropyLoss()` is a criterion)."""
    while (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and call_name(value) in ("to", "cuda", "bfloat16", "half", "float", "train", "eval")
    ):
        value = value.func.value
    if not (isinstance(value, ast.Call) and isinstance(value.func, (ast.Name, ast.Attribute))):
        return False
    found = model.roles.classify(value)
    if found and found[0] is not None:
        return found[0].role is Role.MODEL
    name = call_name(value) or ""
    qual = model.qualname(value.func) or ""
    return name[:1].isupper() and not qual.startswith("torch.")


def rebuilds_model(model: FileModel, loop: ast.AST) -> bool:
    """Does each iteration of ``loop`` build the model it runs (`net = Net(cfg)` inside
    the loop, then `net(x)`)? Then an iteration is a trial of its own (a batch-size
    probe, a benchmark sweep, one run of a search), not a step of one training run."""
    built: set[str] = set()
    for node in walk_local(loop):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and _constructed_module(model, node.value):
                built.add(target.id)
    if not built:
        return False
    return any(
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in built
        for node in walk_local(loop)
    )


def _branch_facts(model: FileModel, node: ast.AST, stop: ast.AST) -> dict[str, tuple[str, bool]]:
    """The `name == constant` tests that hold where ``node`` runs, up to ``stop``: name ->
    (constant as written, whether it equals). `if phase == "train": ... else: X` gives
    X {"phase": ('"train"', False)}."""
    facts: dict[str, tuple[str, bool]] = {}
    cur: ast.AST = node
    for anc in model.ancestors(node):
        if anc is stop or isinstance(anc, NESTED_SCOPES):
            break
        if isinstance(anc, ast.If):
            test = anc.test
            if (
                isinstance(test, ast.Compare)
                and len(test.ops) == 1
                and isinstance(test.ops[0], (ast.Eq, ast.NotEq, ast.Is, ast.IsNot))
                and isinstance(test.comparators[0], (ast.Constant, ast.Attribute))
                and (name := dotted(test.left)) is not None
            ):
                equal = isinstance(test.ops[0], (ast.Eq, ast.Is))
                in_body = any(cur is s for s in anc.body)
                facts.setdefault(name, (ast.unparse(test.comparators[0]), equal == in_body))
        cur = anc
    return facts


def _excludes(a: dict[str, tuple[str, bool]], b: dict[str, tuple[str, bool]]) -> bool:
    for name, (value, equal) in a.items():
        other = b.get(name)
        if other is None:
            continue
        if equal and other[1] and value != other[0]:
            return True  # phase == "valid" against phase == "train"
        if value == other[0] and equal != other[1]:
            return True  # phase == "train" against its else
    return False


def off_training_branch(model: FileModel, node: ast.AST, loop: ast.AST) -> bool:
    """Does ``node`` run only on iterations of ``loop`` that do not train: it sits under
    `phase == "valid"` while every backward of the loop sits under `phase == "train"`
    (or under the other arm of the same test)? One loop that serves both phases
    validates in those branches."""
    here = _branch_facts(model, node, loop)
    if not here:
        return False
    backs = [c for c in backward_calls(model) if any(a is loop for a in model.ancestors(c))]
    return bool(backs) and all(_excludes(here, _branch_facts(model, c, loop)) for c in backs)
