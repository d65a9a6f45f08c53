"""TL203 warmup-starts-at-zero."""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Iterator

from trainlint.analysis.model import FileModel, call_name, keyword
from trainlint.analysis.schedules import lambda_arg, lambda_body, scheduler_calls
from trainlint.rules.base import Invalid, Report, Rule

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
    body = lambda_body(model, node)
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
        for call in scheduler_calls(model):
            qual = model.qualname(call.func) or ""
            cls = qual.rsplit(".", 1)[-1]
            if cls == "LambdaLR":
                arg = lambda_arg(call)
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
