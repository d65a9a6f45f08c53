"""What an expression is worth statically: a literal it is bound to, or its value at a step."""

from __future__ import annotations

import ast
import math

from trainlint.analysis.arguments import default_of, parameter_names, positional_names
from trainlint.analysis.model import FileModel, call_name, dotted, keyword
from trainlint.analysis.settings import POSITIVE as POSITIVE_SETTING

POS = object()  # an unknown quantity known to be > 0
NONNEG = object()  # an unknown quantity >= 0 (a warmup length: it may well be 0)

# `math` functions and constants worth evaluating: a schedule written with them
# (`0.5 * (1 + math.cos(math.pi * t))`) is a number at step 0 like any other.
_MATH_FUNCTIONS = {
    "cos",
    "sin",
    "tan",
    "exp",
    "log",
    "log2",
    "log10",
    "log1p",
    "expm1",
    "sqrt",
    "pow",
    "floor",
    "ceil",
    "trunc",
    "fabs",
    "tanh",
    "atan",
    "radians",
    "degrees",
}
_MATH_CONSTANTS = {"pi", "e", "tau", "inf"}


def is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_zero(v: object) -> bool:
    return is_number(v) and v == 0


def is_positive(v: object) -> bool:
    return v is POS or (is_number(v) and v > 0)  # type: ignore[operator]


def is_nonneg(v: object) -> bool:
    return v is NONNEG or v is POS or (is_number(v) and v >= 0)  # type: ignore[operator]


class ConstantEvaluator:
    """Evaluates a warmup multiplier at step 0. A length or total that cannot be resolved
    to a constant is only known to be >= 0 (a warmup that defaults to 0 is common), except
    as a divisor: code that divides by it only runs when it is not 0."""

    def __init__(self, model: FileModel) -> None:
        self.model = model

    def expr(self, node: ast.AST, env: dict[str, object]) -> object:
        if isinstance(node, ast.Constant):
            return node.value if is_number(node.value) or isinstance(node.value, bool) else None
        if isinstance(node, ast.Name):
            if node.id in env:
                return env[node.id]
            return POS if self.tested_positive(node) else self._resolve(node)
        if isinstance(node, ast.Attribute):
            qual = self.model.qualname(node)
            if qual is not None and qual.startswith("math.") and qual[5:] in _MATH_CONSTANTS:
                return float(getattr(math, qual[5:]))
            if self.tested_positive(node):
                return POS
            return self._attribute_default(node.attr)
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, (ast.Name, ast.Attribute))
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)
        ):
            return self.project_setting(node.slice.value)  # `CONFIG["warmup_steps"]`
        if isinstance(node, ast.UnaryOp):
            v = self.expr(node.operand, env)
            if isinstance(node.op, ast.USub) and is_number(v):
                return -v  # type: ignore[operator]
            if isinstance(node.op, ast.Not) and isinstance(v, bool):
                return not v
            return None
        if isinstance(node, ast.BinOp):
            return self._binop(node.op, self.expr(node.left, env), self.expr(node.right, env))
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            return self._compare(
                node.ops[0], self.expr(node.left, env), self.expr(node.comparators[0], env)
            )
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
            qual = self.model.qualname(node.func) or ""
            if qual in ("pow", "builtins.pow") and len(args) == 2:
                return self._binop(ast.Pow(), args[0], args[1])
            if (
                qual.startswith("math.")
                and qual[5:] in _MATH_FUNCTIONS
                and args
                and all(is_number(a) for a in args)
            ):
                try:
                    return getattr(math, qual[5:])(*args)
                except (ValueError, OverflowError, TypeError):
                    return None
            if name in ("cos", "exp") and len(args) == 1 and is_zero(args[0]):
                return 1.0
            return None
        return None

    def tested_positive(self, node: ast.AST) -> bool:
        """Is ``node`` (a name or attribute chain) inside the body of an ``if X > 0:`` (or
        ``X >= 1``, ``0 < X``) on the same expression? A default of 0 does not hold there."""
        text = dotted(node)
        if text is None:
            return False
        child: ast.AST = node
        for anc in self.model.ancestors(node):
            if isinstance(anc, ast.If) and any(child is s for s in anc.body):
                if positive_test(anc.test, text):
                    return True
            child = anc
        return False

    def _resolve(self, node: ast.Name) -> object:
        """A free name: a numeric constant assigned in an enclosing scope, or a parameter's
        constant default; anything else is an unknown length (>= 0)."""
        scopes: list[ast.AST] = [
            a
            for a in self.model.ancestors(node)
            if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef))
        ]
        scopes.append(self.model.tree)
        for scope in scopes:
            if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.id in parameter_names(scope):
                    given = default_of(scope, node.id)
                    value = self.expr(given, {}) if isinstance(given, ast.Constant) else None
                    return value if is_number(value) else NONNEG
            values = [
                n.value
                for n in self.model.assignments_in(scope)
                if isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == node.id for t in n.targets)
            ]
            if values:
                last = values[-1]
                if isinstance(last, ast.Constant) and is_number(last.value):
                    return last.value
                return NONNEG
        return NONNEG

    def _attribute_default(self, attr: str) -> object:
        """``config.warmup_epochs``: the file's own default for that setting, from an
        ``add_argument("--warmup-epochs", default=10)`` or a config class field
        ``warmup_epochs: int = 10``. Several different defaults, or none: unknown."""
        found: set[object] = set()
        flag = "--" + attr.replace("_", "-")
        # the model's call and class tables, not a walk of the whole tree per attribute
        # (`found` is a set: the order the nodes come in does not matter)
        for node in self.model.calls.get("add_argument", ()):
            names = {a.value for a in node.args if isinstance(a, ast.Constant)}
            if flag in names or "--" + attr in names:
                default = keyword(node, "default")
                found.add(default.value if isinstance(default, ast.Constant) else None)
        for cls in self.model.classes:
            for stmt in cls.body:
                target = (
                    stmt.target
                    if isinstance(stmt, ast.AnnAssign)
                    else (
                        stmt.targets[0]
                        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                        else None
                    )
                )
                value = getattr(stmt, "value", None)
                if isinstance(target, ast.Name) and target.id == attr and value is not None:
                    found.add(value.value if isinstance(value, ast.Constant) else None)
        if len(found) == 1:
            (value,) = found
            if is_number(value):
                return value
        if found and all(is_number(v) and v > 0 for v in found):  # type: ignore[operator]
            return POS
        if not found:
            return self.project_setting(attr)
        return NONNEG

    def project_setting(self, name: str) -> object:
        """A setting this file does not declare: the project's default for it, when the
        project decides it (see :mod:`trainlint.analysis.settings`); else unknown."""
        view = self.model.project
        value = (view.get("settings") or {}).get(name) if view else None
        if value == POSITIVE_SETTING:
            return POS
        return value if is_number(value) else NONNEG

    @staticmethod
    def _minmax(name: str, args: list[object]) -> object:
        if all(is_number(a) for a in args):
            return (min if name == "min" else max)(args)  # type: ignore[type-var]
        if not all(is_nonneg(a) for a in args):
            return None
        if name == "min":
            if any(is_zero(a) for a in args):
                return 0
            return POS if all(is_positive(a) for a in args) else NONNEG
        return POS if any(is_positive(a) for a in args) else NONNEG

    @staticmethod
    def _binop(op: ast.operator, a: object, b: object) -> object:
        if is_number(a) and is_number(b):
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
            if is_zero(a) and is_positive(b):
                return 0
            if isinstance(op, ast.Div) and is_positive(a) and is_positive(b):
                return POS
            return NONNEG if is_nonneg(a) and is_positive(b) else None
        if isinstance(op, ast.Mult):
            if (is_zero(a) and is_nonneg(b)) or (is_zero(b) and is_nonneg(a)):
                return 0
            if is_positive(a) and is_positive(b):
                return POS
            return NONNEG if is_nonneg(a) and is_nonneg(b) else None
        if isinstance(op, ast.Add) and is_nonneg(a) and is_nonneg(b):
            return POS if is_positive(a) or is_positive(b) else NONNEG
        return None

    @staticmethod
    def _compare(op: ast.cmpop, a: object, b: object) -> object:
        if is_number(a) and is_number(b):
            return {
                ast.Lt: a < b,
                ast.LtE: a <= b,
                ast.Gt: a > b,  # type: ignore[operator]
                ast.GtE: a >= b,
                ast.Eq: a == b,
                ast.NotEq: a != b,  # type: ignore[operator]
            }.get(type(op))
        if is_zero(a) and b is POS:
            return {
                ast.Lt: True,
                ast.LtE: True,
                ast.Gt: False,
                ast.GtE: False,
                ast.Eq: False,
                ast.NotEq: True,
            }.get(type(op))
        if a is POS and is_zero(b):
            return {
                ast.Lt: False,
                ast.LtE: False,
                ast.Gt: True,
                ast.GtE: True,
                ast.Eq: False,
                ast.NotEq: True,
            }.get(type(op))
        if is_zero(a) and b is NONNEG:
            return {ast.LtE: True, ast.Gt: False}.get(type(op))
        if a is NONNEG and is_zero(b):
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
            if (
                isinstance(stmt, ast.Assign)
                and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)
            ):
                env[stmt.targets[0].id] = self.expr(stmt.value, env)
                continue
            if isinstance(stmt, (ast.Expr, ast.Pass)):
                continue  # docstrings
            return None
        return _FALLTHROUGH


_FALLTHROUGH = object()


def literal_value(model: FileModel, node: ast.AST) -> object:
    """A literal, or a name bound to one: a parameter default or an assignment."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List)):
        return [literal_value(model, e) for e in node.elts]
    if not isinstance(node, ast.Name):
        return None
    fn = model.function_of(node)
    if fn is not None and node.id in positional_names(fn):
        default = default_of(fn, node.id)
        if default is not None:
            return literal_value(model, default)
    found = model.flow.definition(node.id, node)
    if found is not None and isinstance(found[1], (ast.Constant, ast.Tuple, ast.List)):
        return literal_value(model, found[1])
    return None


def positive_test(test: ast.AST, text: str) -> bool:
    """``text > 0``, ``text >= 1`` or ``0 < text``, alone or in an ``and``."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return any(positive_test(v, text) for v in test.values)
    if not isinstance(test, ast.Compare) or len(test.ops) != 1:
        return False
    left, op, right = test.left, test.ops[0], test.comparators[0]
    if isinstance(op, (ast.Lt, ast.LtE)):
        left, right = right, left
        op = ast.Gt() if isinstance(test.ops[0], ast.Lt) else ast.GtE()
    if dotted(left) != text or not isinstance(right, ast.Constant):
        return False
    bound = right.value
    if not is_number(bound):
        return False
    return (isinstance(op, ast.Gt) and bound >= 0) or (isinstance(op, ast.GtE) and bound > 0)
