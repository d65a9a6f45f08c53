"""TL203 warmup-starts-at-zero."""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Iterator

from trainlint.analysis.model import FileModel, call_name, keyword, walk_local
from trainlint.analysis.schedules import lambda_arg, lambda_body, scheduler_calls
from trainlint.rules.base import Invalid, Report, Rule, Valid

POS = object()  # an unknown quantity known to be > 0
NONNEG = object()  # an unknown quantity >= 0 (a warmup length: it may well be 0)


def _num(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _zero(v: object) -> bool:
    return _num(v) and v == 0


def _pos(v: object) -> bool:
    return v is POS or (_num(v) and v > 0)  # type: ignore[operator]


def _nonneg(v: object) -> bool:
    return v is NONNEG or v is POS or (_num(v) and v >= 0)  # type: ignore[operator]


class _Eval:
    """Evaluates a warmup multiplier at step 0. A length or total that cannot be resolved
    to a constant is only known to be >= 0 (a warmup that defaults to 0 is common), except
    as a divisor: code that divides by it only runs when it is not 0."""

    def __init__(self, model: FileModel) -> None:
        self.model = model

    def expr(self, node: ast.AST, env: dict[str, object]) -> object:
        if isinstance(node, ast.Constant):
            return node.value if _num(node.value) or isinstance(node.value, bool) else None
        if isinstance(node, ast.Name):
            return env[node.id] if node.id in env else self._resolve(node)
        if isinstance(node, ast.Attribute):
            return self._attribute_default(node.attr)
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
                return self._minmax(name, args)
            if name in ("cos", "exp") and len(args) == 1 and _zero(args[0]):
                return 1.0
            return None
        return None

    def _resolve(self, node: ast.Name) -> object:
        """A free name: a numeric constant assigned in an enclosing scope, or a parameter's
        constant default; anything else is an unknown length (>= 0)."""
        scopes: list[ast.AST] = [a for a in self.model.ancestors(node)
                                 if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef))]
        scopes.append(self.model.tree)
        for scope in scopes:
            if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = scope.args
                positional = [*a.posonlyargs, *a.args]
                defaults: dict[str, ast.expr | None] = dict.fromkeys(
                    x.arg for x in [*positional, *a.kwonlyargs])
                for arg, default in zip(positional[len(positional) - len(a.defaults):],
                                        a.defaults, strict=True):
                    defaults[arg.arg] = default
                for arg, kw_default in zip(a.kwonlyargs, a.kw_defaults, strict=True):
                    defaults[arg.arg] = kw_default
                if node.id in defaults:
                    given = defaults[node.id]
                    value = self.expr(given, {}) if isinstance(given, ast.Constant) else None
                    return value if _num(value) else NONNEG
            values = [n.value for n in walk_local(scope) if isinstance(n, ast.Assign)
                      and any(isinstance(t, ast.Name) and t.id == node.id for t in n.targets)]
            if values:
                last = values[-1]
                if isinstance(last, ast.Constant) and _num(last.value):
                    return last.value
                return NONNEG
        return NONNEG

    def _attribute_default(self, attr: str) -> object:
        """``config.warmup_epochs``: the file's own default for that setting, from an
        ``add_argument("--warmup-epochs", default=10)`` or a config class field
        ``warmup_epochs: int = 10``. Several different defaults, or none: unknown."""
        found: set[object] = set()
        flag = "--" + attr.replace("_", "-")
        for node in ast.walk(self.model.tree):
            if isinstance(node, ast.Call) and call_name(node) == "add_argument":
                names = {a.value for a in node.args if isinstance(a, ast.Constant)}
                if flag in names or "--" + attr in names:
                    default = keyword(node, "default")
                    found.add(default.value if isinstance(default, ast.Constant) else None)
            elif isinstance(node, ast.ClassDef):
                for stmt in node.body:
                    target = stmt.target if isinstance(stmt, ast.AnnAssign) else (
                        stmt.targets[0] if isinstance(stmt, ast.Assign)
                        and len(stmt.targets) == 1 else None
                    )
                    value = getattr(stmt, "value", None)
                    if isinstance(target, ast.Name) and target.id == attr and value is not None:
                        found.add(value.value if isinstance(value, ast.Constant) else None)
        if len(found) == 1:
            (value,) = found
            if _num(value):
                return value
        if found and all(_num(v) and v > 0 for v in found):  # type: ignore[operator]
            return POS
        return NONNEG

    @staticmethod
    def _minmax(name: str, args: list[object]) -> object:
        if all(_num(a) for a in args):
            return (min if name == "min" else max)(args)  # type: ignore[type-var]
        if not all(_nonneg(a) for a in args):
            return None
        if name == "min":
            if any(_zero(a) for a in args):
                return 0
            return POS if all(_pos(a) for a in args) else NONNEG
        return POS if any(_pos(a) for a in args) else NONNEG

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
        if isinstance(op, (ast.Div, ast.FloorDiv)):
            if b is NONNEG:
                b = POS  # it divides by the length, so the length is not 0 when this runs
            if _zero(a) and _pos(b):
                return 0
            if isinstance(op, ast.Div) and _pos(a) and _pos(b):
                return POS
            return NONNEG if _nonneg(a) and _pos(b) else None
        if isinstance(op, ast.Mult):
            if (_zero(a) and _nonneg(b)) or (_zero(b) and _nonneg(a)):
                return 0
            if _pos(a) and _pos(b):
                return POS
            return NONNEG if _nonneg(a) and _nonneg(b) else None
        if isinstance(op, ast.Add) and _nonneg(a) and _nonneg(b):
            return POS if _pos(a) or _pos(b) else NONNEG
        return None

    @staticmethod
    def _compare(op: ast.cmpop, a: object, b: object) -> object:
        if _num(a) and _num(b):
            return {
                ast.Lt: a < b, ast.LtE: a <= b, ast.Gt: a > b,  # type: ignore[operator]
                ast.GtE: a >= b, ast.Eq: a == b, ast.NotEq: a != b,  # type: ignore[operator]
            }.get(type(op))
        if _zero(a) and b is POS:
            return {ast.Lt: True, ast.LtE: True, ast.Gt: False, ast.GtE: False,
                    ast.Eq: False, ast.NotEq: True}.get(type(op))
        if a is POS and _zero(b):
            return {ast.Lt: False, ast.LtE: False, ast.Gt: True, ast.GtE: True,
                    ast.Eq: False, ast.NotEq: True}.get(type(op))
        if _zero(a) and b is NONNEG:
            return {ast.LtE: True, ast.Gt: False}.get(type(op))
        if a is NONNEG and _zero(b):
            return {ast.GtE: True, ast.Lt: False}.get(type(op))
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
    with a non-zero warmup. Simple lambdas and `def`s are evaluated at step 0 statically. A
    warmup length that cannot be resolved to a constant may be 0 (the usual default), so
    it is reported only when the multiplier is 0 whatever the length (`step / warmup`
    divides by it, so it is not 0 when it runs), or when the length is provably
    positive.

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
    message = (
        "the LR multiplier is 0 at step 0: the first update uses LR 0; start the warmup "
        "above 0, e.g. `(step + 1) / warmup`"
    )
    triggers = ("LambdaLR", "LinearLR", "_with_warmup")
    test_files = False  # tests build schedules to test something else than the first LR
    confirm_with = "assert_lr_schedule"
    valid = [
        "import torch\nS = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))\n",
        "from torch.optim.lr_scheduler import LinearLR\ns = LinearLR(opt, start_factor=0.1, total_iters=5)\n",
        "from torch.optim.lr_scheduler import LambdaLR\ns = LambdaLR(opt, lambda epoch: 0.95 ** epoch)\n",
        "from transformers import get_linear_schedule_with_warmup\n"
        "s = get_linear_schedule_with_warmup(opt, num_warmup_steps=0, num_training_steps=n)\n",
        # unknown multiplier: silent
        "import torch\ns = torch.optim.lr_scheduler.LambdaLR(opt, make_lambda(cfg))\n",
        # a warmup branch whose length is the caller's (it may be 0): not provably
        # taken at step 0
        """
import math
from torch.optim.lr_scheduler import LambdaLR

def cosine_with_warmup(optimizer, num_warmup_steps, num_training_steps):
    def lr_lambda(step):
        if step < num_warmup_steps:
            return step / max(1, num_warmup_steps)
        progress = (step - num_warmup_steps) / max(1, num_training_steps - num_warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return LambdaLR(optimizer, lr_lambda)
""",
        # a warmup that defaults to 0
        """
from torch.optim.lr_scheduler import LambdaLR

def build(optimizer, warmup_steps=0):
    return LambdaLR(optimizer, lambda s: s / warmup_steps if s < warmup_steps else 1.0)
""",
        # a command-line warmup whose default is 0
        """
import argparse
from torch.optim.lr_scheduler import LambdaLR

parser = argparse.ArgumentParser()
parser.add_argument("--warmup-steps", type=int, default=0)
args = parser.parse_args()
sched = LambdaLR(opt, lambda s: s / args.warmup_steps if s < args.warmup_steps else 1.0)
""",
        # a configured warmup length: 0 by default in most trainers
        "from transformers import get_linear_schedule_with_warmup\n"
        "s = get_linear_schedule_with_warmup(opt, args.warmup_steps, args.max_steps)\n",
        # a test building a schedule for something else than its first value
        Valid(
            "from torch.optim.lr_scheduler import LambdaLR\n"
            "sched = LambdaLR(opt, lr_lambda=lambda epoch: epoch ** 0.65)\n",
            path="tests/test_sync.py",
        ),
        # no torch
        "def LambdaLR(o, f):\n    return f\ns = LambdaLR(opt, lambda s: s / 10)\n",
    ]
    invalid = [
        # dividing by the warmup length proves it is not 0
        Invalid(
            "import torch.optim.lr_scheduler as sched\n"
            "s = sched.LambdaLR(opt, lambda step: step / warmup_steps)\n",
            line=2,
        ),
        # a warmup parameter without default, divided by: provably > 0 when it runs
        Invalid(
            """
import torch

def get_lr_scheduler(optimizer, warmup_steps, max_steps):
    warm = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: step / warmup_steps)
    cos = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max_steps - warmup_steps)
    return torch.optim.lr_scheduler.SequentialLR(optimizer, [warm, cos], milestones=[warmup_steps])
""",
            line=4,
        ),
        Invalid(
            """
from torch.optim.lr_scheduler import LambdaLR
import math

warmup_epochs = 5
total_epochs = 100

def lr_lambda(epoch):
    if epoch < warmup_epochs:
        return epoch / warmup_epochs
    progress = (epoch - warmup_epochs) / (total_epochs - warmup_epochs)
    return 0.5 * (1 + math.cos(math.pi * progress))

scheduler = LambdaLR(optimizer, lr_lambda)
""",
            line=13,
        ),
        Invalid(
            "from torch.optim.lr_scheduler import LinearLR\n"
            "s = LinearLR(opt, start_factor=0.0, total_iters=1000)\n",
            line=2,
        ),
        Invalid(
            "from transformers import get_cosine_schedule_with_warmup as cosine\n"
            "s = cosine(opt, num_warmup_steps=500, num_training_steps=total)\n",
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
                        "with a ValueError at construction; older versions train at LR 0); "
                        "use a small positive `start_factor`",
                    )
            elif qual.startswith("transformers") and _WARMUP_FACTORIES.match(cls):
                warm = keyword(call, "num_warmup_steps")
                if warm is None and len(call.args) > 1:
                    warm = call.args[1]
                if warm is None or not _pos(_Eval(model).expr(warm, {})):
                    continue  # a warmup of 0 (the usual default) starts at the full LR
                yield self.report(
                    call,
                    f"`{cls}` starts warmup at LR 0: the first update does nothing, and the "
                    "LR stays 0 if `scheduler.step()` is never reached; step it after every "
                    "`optimizer.step()`",
                )

    @staticmethod
    def _zero(value: object) -> bool:
        return _num(value) and math.isclose(value, 0.0, abs_tol=0.0)  # type: ignore[arg-type]
