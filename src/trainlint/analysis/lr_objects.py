"""Learning-rate objects written by hand: a class whose method writes the LR into its
optimizer's param groups (Megatron's ``AnnealingLR.step()``), and what that write stores
the first time it runs, when the constructor calls the method before any update.

The constructor is run statically: its parameters take the constants every call site
passes (in this file, or in the project: the ``arguments`` of the view, see
:mod:`trainlint.analysis.settings`), else their defaults; ``self`` attributes are tracked
through the constructor and the methods it calls (``self.num_iters = last_iter`` then
``self.step(self.num_iters)``, whose ``self.get_lr()`` reads it back). A guard that turns
the warmup on (``if self.warmup_iter > 0 and ...``) is taken as on: the write is judged
for the run that warms up.
"""

from __future__ import annotations

import ast

from trainlint._record import Record
from trainlint.analysis.arguments import arguments_at_callers, bind, default_of, positional_names
from trainlint.analysis.constants import (
    NONNEG,
    POS,
    ConstantEvaluator,
    is_number,
    positive_test,
)
from trainlint.analysis.lr_assignments import direct_writes
from trainlint.analysis.model import FileModel, dotted

#: Methods followed from the constructor, nested (``step`` -> ``get_lr``).
MAX_DEPTH = 3
_UNKNOWN = None


class ConstructionWrite(Record, frozen=True):
    """A write into the param groups' ``"lr"`` made while the object is built: its value
    then, and at the method's next plain call (a schedule grows from 0; a group held at 0
    on purpose stays 0)."""

    __slots__ = ("node", "first", "later")

    node: ast.Assign
    first: object
    later: object

    def __init__(self, node: ast.Assign, first: object, later: object) -> None:
        self.node = node
        self.first = first
        self.later = later


def construction_writes(model: FileModel) -> list[ConstructionWrite]:
    return model.memo(construction_writes, _construction_writes)


def _construction_writes(model: FileModel) -> list[ConstructionWrite]:
    writes = direct_writes(model)
    if not writes:
        return []
    out: list[ConstructionWrite] = []
    for cls in model.classes:
        methods = {s.name: s for s in cls.body if isinstance(s, ast.FunctionDef)}
        init = methods.get("__init__")
        if init is None:
            continue
        writers = {
            name: [w for w, _ in writes if model.function_of(w) is fn]
            for name, fn in methods.items()
        }
        writers = {name: ws for name, ws in writers.items() if ws and name != "__init__"}
        if not writers:
            continue
        run = _Run(model, methods)
        env = _parameters(model, cls, init)
        for stmt in init.body:
            call = _self_call(stmt)
            if call is not None and call.func.attr in writers:  # type: ignore[attr-defined]
                first = run.call(call, env, collect=True)
                later = run.call(ast.Call(call.func, [], []), env, collect=True)
                for node in writers[call.func.attr]:  # type: ignore[attr-defined]
                    if id(node) in first and id(node) in later:
                        out.append(ConstructionWrite(node, first[id(node)], later[id(node)]))
                break
            if not run.execute([stmt], env):
                break
    return out


def _self_call(stmt: ast.stmt) -> ast.Call | None:
    """``self.step(...)`` as a statement."""
    if (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Call)
        and isinstance(stmt.value.func, ast.Attribute)
        and isinstance(stmt.value.func.value, ast.Name)
        and stmt.value.func.value.id == "self"
    ):
        return stmt.value
    return None


def _parameters(model: FileModel, cls: ast.ClassDef, init: ast.FunctionDef) -> dict[str, object]:
    """The constructor's parameters: the constant every call site agrees on (this file's
    ``Cls(...)`` calls, or the project's), else the parameter's constant default, else
    unknown (>= 0 for a number)."""
    a = init.args
    positional = [p.arg for p in (*a.posonlyargs, *a.args)][1:]  # without self
    names = [*positional, *(p.arg for p in a.kwonlyargs)]
    ev = ConstantEvaluator(model)
    env: dict[str, object] = {}
    defaults = dict(zip(positional[len(positional) - len(a.defaults) :], a.defaults, strict=True))
    defaults.update(
        (p.arg, d) for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None
    )
    project = ((model.project or {}).get("arguments") or {}).get(cls.name, {})
    for i, name in enumerate(names):
        # what this file's constructions pass (their default where they leave it out)
        passed = arguments_at_callers(model, init, name)
        values: list[object] = (
            [_UNKNOWN] if passed is None else [ev.expr(arg, {}) for arg in passed]
        )
        given = project.get(name, project.get(str(i)) if i < len(positional) else None)
        if given is not None:
            values.append(given)
        if values and all(is_number(v) for v in values) and len(set(values)) == 1:  # type: ignore[arg-type]
            env[name] = values[0]
        elif not values and name in defaults:
            d = ev.expr(defaults[name], {})
            env[name] = (
                d if is_number(d) or isinstance(d, bool) else _default_object(defaults[name])
            )
        else:
            env[name] = NONNEG
    return env


def _default_object(node: ast.AST) -> object:
    """A default that is no number: None stays None (``step_num=None``), else unknown."""
    return _NONE if isinstance(node, ast.Constant) and node.value is None else _UNKNOWN


class _NoneValue:
    """The value None, told apart from an unknown value (which is also Python's None)."""


_NONE = _NoneValue()


class _Run(ConstantEvaluator):
    """Runs the statements of a class's methods on an environment of names and ``self.x``
    attributes (keyed ``"self.x"``), and takes the values the LR writes store."""

    def __init__(self, model: FileModel, methods: dict[str, ast.FunctionDef]) -> None:
        super().__init__(model)
        self.methods = methods
        self.depth = 0
        self.taken: dict[int, object] | None = None

    # -- expressions ----------------------------------------------------------------
    def expr(self, node: ast.AST, env: dict[str, object]) -> object:
        if isinstance(node, ast.Attribute):
            text = dotted(node)
            if text is not None and text in env:
                return env[text]
        if isinstance(node, ast.Name) and node.id in env:
            return env[node.id]
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            op = node.ops[0]
            if isinstance(op, (ast.Is, ast.IsNot)):
                right = node.comparators[0]
                if isinstance(right, ast.Constant) and right.value is None:
                    left = self.expr(node.left, env)
                    if left is _NONE or is_number(left) or left in (POS, NONNEG):
                        return (left is _NONE) == isinstance(op, ast.Is)
                return None
        if isinstance(node, ast.BoolOp):
            values = [self.expr(v, env) for v in node.values]
            decisive = isinstance(node.op, ast.Or)  # `False and ...`, `True or ...`
            if any(v is decisive for v in values):
                return decisive
            return (not decisive) if all(isinstance(v, bool) for v in values) else None
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "self"
            and node.func.attr in self.methods
        ):
            result = self.call(node, env, collect=False)
            return result.get(0) if isinstance(result, dict) else None
        if isinstance(node, ast.Subscript):
            return None
        return super().expr(node, env)

    def call(self, call: ast.Call, env: dict[str, object], collect: bool) -> dict[int, object]:
        """Run ``self.m(args)`` on a copy of ``env`` (whose ``self.x`` it updates); the LR
        writes it reaches (by id) and, under key 0, what it returns."""
        fn = self.methods[call.func.attr]  # type: ignore[attr-defined]
        if self.depth >= MAX_DEPTH or any(isinstance(a, ast.Starred) for a in call.args):
            return {}
        positional = positional_names(fn)[1:]
        local = {k: v for k, v in env.items() if k.startswith("self.")}
        for name in positional:
            default = default_of(fn, name)
            local[name] = self.expr(default, {}) if default is not None else _UNKNOWN
            if default is not None and local[name] is None:
                local[name] = _default_object(default)
        for name, arg in bind(fn, call.args, call.keywords, 1):
            if name in positional:
                local[name] = self.expr(arg, env)
        outer, self.taken = self.taken, {}
        self.depth += 1
        try:
            self.execute(fn.body, local)
        finally:
            self.depth -= 1
        taken, self.taken = self.taken, outer
        if not collect and outer is not None:
            outer.update(taken)  # writes reached through a helper are the caller's too
        env.update((k, v) for k, v in local.items() if k.startswith("self."))
        if "return" in local:
            taken[0] = local["return"]
        return taken

    # -- statements -----------------------------------------------------------------
    def execute(self, stmts: list[ast.stmt], env: dict[str, object]) -> bool:
        """Run ``stmts``; False once a ``return`` (its value in ``env["return"]``) or a
        statement that cannot be followed ends the run."""
        for stmt in stmts:
            if isinstance(stmt, ast.Return):
                env["return"] = self.expr(stmt.value, env) if stmt.value is not None else _NONE
                return False
            if isinstance(stmt, ast.Assign):
                if self.taken is not None and any(
                    isinstance(t, ast.Subscript) for t in stmt.targets
                ):
                    self.taken[id(stmt)] = self.expr(stmt.value, env)
                value = self.expr(stmt.value, env)
                for t in stmt.targets:
                    key = dotted(t) if isinstance(t, (ast.Name, ast.Attribute)) else None
                    if key is not None:
                        env[key] = value
                continue
            if isinstance(stmt, ast.AugAssign):
                key = dotted(stmt.target)
                if key is not None:
                    env[key] = self._binop(
                        stmt.op, self.expr(stmt.target, env), self.expr(stmt.value, env)
                    )
                continue
            if isinstance(stmt, ast.If):
                if not self._branch(stmt, env):
                    return False
                continue
            if isinstance(stmt, ast.For):
                # the groups' loop: its body once, the group itself unknown
                body_env = dict(env)
                self.execute(stmt.body, body_env)
                continue
            if isinstance(stmt, ast.Expr):
                if isinstance(stmt.value, ast.Call):
                    self.expr(stmt.value, env)
                continue
            if isinstance(stmt, (ast.Pass, ast.Assert)):
                continue
            return False
        return True

    def _branch(self, stmt: ast.If, env: dict[str, object]) -> bool:
        test = self.expr(stmt.test, env)
        if not isinstance(test, bool):
            on = self._warmup_on(stmt.test, env)
            if on is not None:
                test = self.expr(stmt.test, on)
                if test is True:
                    env.update(on)
        if isinstance(test, bool):
            return self.execute(stmt.body if test else stmt.orelse, env)
        # unknown: each branch's writes are taken; what either assigns is unknown after
        for block in (stmt.body, stmt.orelse):
            scratch = dict(env)
            self.execute(block, scratch)
            for key in scratch:
                if key != "return" and scratch[key] is not env.get(key, object()):
                    env[key] = _UNKNOWN
        return True

    def _warmup_on(self, test: ast.expr, env: dict[str, object]) -> dict[str, object] | None:
        """``X > 0 and ...`` on an unknown length X: the environment where X is on."""
        tests = (
            test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
        )
        on = dict(env)
        for t in tests:
            for sub in ast.walk(t):
                text = dotted(sub) if isinstance(sub, (ast.Name, ast.Attribute)) else None
                if text and positive_test(t, text) and self.expr(sub, env) in (NONNEG, None):
                    on[text] = POS
        return on if on != env else None
