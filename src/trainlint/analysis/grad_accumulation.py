"""Gradient accumulation: the count an optimizer step waits for, names that say they
hold it, and the places the summed gradients are divided by it instead of the loss
(the step branch rescales them, or the learning rate is divided by the count)."""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from trainlint.analysis.arguments import argument_at, call_sites, positional_names
from trainlint.analysis.model import FileModel, call_name, dotted, walk_tree
from trainlint.analysis.steps import Kind

if TYPE_CHECKING:
    from trainlint.analysis.steps import Event


def accumulation_divisor(test: ast.AST) -> ast.AST | None:
    """The count a guard's test waits for: ``accum`` in ``if (i + 1) % accum == 0``."""
    for sub in ast.walk(test):
        if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Mod):
            return sub.right
    return None


def accumulation_divisor_at(model: FileModel, test: ast.AST, depth: int = 2) -> ast.AST | None:
    """:func:`accumulation_divisor` of a guard whose test may be a boolean computed before
    it: ``is_grad_step = (i + 1) % accum == 0`` then ``if is_grad_step:`` (or ``if
    is_grad_step and ...``) waits for ``accum``, read from the name's defining test."""
    found = accumulation_divisor(test)
    if found is not None or depth <= 0:
        return found
    for sub in ast.walk(test):
        if not isinstance(sub, ast.Name):
            continue
        definition = model.flow.definition(sub.id, sub)
        if definition is None or not isinstance(definition[1], ast.expr):
            continue
        found = accumulation_divisor_at(model, definition[1], depth - 1)
        if found is not None:
            return found
    return None


def names_accumulation_count(node: ast.AST) -> bool:
    """A name in ``node`` says it holds the accumulation count (``grad_accum_steps``,
    ``args.update_freq``)."""
    for sub in ast.walk(node):
        name = (
            sub.id
            if isinstance(sub, ast.Name)
            else sub.attr
            if isinstance(sub, ast.Attribute)
            else ""
        )
        low = name.lower()
        if "accum" in low or "update_freq" in low or "grad_acc" in low or "iters_to_acc" in low:
            return True
    return False


_RESCALE = re.compile(
    r"(?<!un)(scale|multiply|mul|div|divide|normali[sz]e|average|avg)_?grad", re.IGNORECASE
)


def rescales_grads(model: FileModel, guard: ast.If, depth: int = 0) -> bool:
    """Inside the step branch, the accumulated gradients are divided before the step:
    a ``scale_grads(model, 1 / n)``-style helper, ``p.grad.div_(n)``, ``p.grad /= n``,
    ``torch._foreach_div_(grads, n)``."""
    for node in (n for stmt in guard.body for n in walk_tree(stmt)):
        if (
            isinstance(node, ast.AugAssign)
            and isinstance(node.op, (ast.Div, ast.Mult))
            and (_mentions_grad(node.target))
        ):
            return True
        if not isinstance(node, ast.Call):
            continue
        name = call_name(node) or ""
        if _RESCALE.search(name):
            return True
        if (
            name in ("div_", "mul_")
            and isinstance(node.func, ast.Attribute)
            and _mentions_grad(node.func.value)
        ):
            return True
        if name in ("_foreach_div_", "_foreach_mul_") and node.args and _names_grads(node.args[0]):
            return True  # `torch._foreach_div_(grads, n)` over the gradient list
        if depth == 0:
            fn = model.resolve_call(node)
            if fn is not None:
                wrapper = ast.If(test=ast.Constant(True), body=fn.body, orelse=[])
                if rescales_grads(model, wrapper, 1):
                    return True
    return False


def _mentions_grad(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "grad" for n in ast.walk(node))


def _names_grads(node: ast.AST) -> bool:
    return _mentions_grad(node) or "grad" in (dotted(node) or "").lower()


_LR_NAME = re.compile(r"(^|_)(lr|learning_rate)($|_)", re.IGNORECASE)


def lr_divided_by_count(model: FileModel, divisors: list[ast.AST | None]) -> bool:
    """The learning rate is divided by the accumulation count somewhere in the file
    (``lr=base_lr / accum``, ``args.lr /= args.grad_accum``): the sum is what it expects."""
    dumps = {ast.dump(d) for d in divisors if d is not None}
    return any(
        ast.dump(expr) in dumps or names_accumulation_count(expr)
        for expr in model.memo(_lr_divisors, _lr_divisors)
    )


def _lr_divisors(model: FileModel) -> list[ast.AST]:
    """What the file divides a learning rate by (``lr=base_lr / X``, ``args.lr /= X``),
    collected once per file from the model's assignment and keyword tables (only whether
    one matches counts, not which comes first)."""
    out: list[ast.AST] = []
    nodes: list[ast.AST] = [*model.assignments, *model.keywords]
    for node in nodes:
        if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Div):
            if _LR_NAME.search((dotted(node.target) or "").rsplit(".", 1)[-1]):
                out.append(node.value)
        pairs: list[tuple[str, ast.AST]] = []
        if isinstance(node, ast.Assign):
            pairs = [((dotted(t) or "").rsplit(".", 1)[-1], node.value) for t in node.targets]
        elif isinstance(node, ast.keyword) and node.arg:
            pairs = [(node.arg, node.value)]
        for name, value in pairs:
            if _LR_NAME.search(name) and isinstance(value, ast.BinOp) and isinstance(value.op, ast.Div):
                out.append(value.right)
    return out


def cleared_before_backward(
    paths: Sequence[Sequence[Event]], backward: Event, divisors: list[ast.AST]
) -> bool:
    """A zero-grad waiting for the same count as the step comes *before* ``backward`` in
    its iteration (``if (i + 1) % n == 0: opt.zero_grad()`` then ``loss.backward()``
    then the guarded step): the earlier micro-batches' gradients are wiped right before
    the step's own backward, so each update uses one micro-batch and nothing is summed.
    ``paths`` are a step loop's iteration paths (lists of step events)."""
    dumps = {ast.dump(d) for d in divisors}
    for path in paths:
        for event in path:
            if event is backward:
                break
            if event.kind is Kind.ZERO and any(
                branch
                and (d := accumulation_divisor(g.test)) is not None
                and ast.dump(d) in dumps
                for g, branch in event.guards
            ):
                return True
    return False


def divided_by_callers(
    model: FileModel, at: ast.AST, value: ast.AST, divisors: Sequence[ast.AST], depth: int = 2
) -> bool:
    """``value`` (what reaches backward at ``at``) is a parameter of its function, and every
    same-file caller hands it an argument it divided by the accumulation count first:
    ``out["loss"] /= accum_steps`` then ``self.backward_step(out["loss"])``."""
    fn = model.function_of(at)
    if not isinstance(value, ast.Name) or not isinstance(
        fn, (ast.FunctionDef, ast.AsyncFunctionDef)
    ):
        return False
    if value.id not in positional_names(fn):
        return False
    sites = call_sites(model, fn, instances=False)
    if not sites:
        return False
    dumps = {ast.dump(d) for d in divisors}
    for site in sites:
        arg = argument_at(model, site, fn, value.id)
        if arg is None or not (
            _divides(model, site, arg, dumps)
            or (depth > 0 and divided_by_callers(model, site, arg, divisors, depth - 1))
        ):
            return False
    return True


def _divides(model: FileModel, site: ast.AST, arg: ast.AST, dumps: set[str]) -> bool:
    def by_count(node: ast.AST) -> bool:
        return ast.dump(node) in dumps or names_accumulation_count(node)

    for sub in ast.walk(arg):
        if isinstance(sub, ast.BinOp) and isinstance(sub.op, (ast.Div, ast.Mult)):
            if by_count(sub.right) or by_count(sub.left):
                return True
    scope = model.function_of(site) or model.tree
    target = ast.dump(arg)
    for node in walk_tree(scope):
        if (
            isinstance(node, ast.AugAssign)
            and isinstance(node.op, (ast.Div, ast.Mult))
            and ast.dump(node.target).replace("Store()", "Load()") == target
            and by_count(node.value)
        ):
            return True
    return False
