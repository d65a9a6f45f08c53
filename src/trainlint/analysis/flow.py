"""Values that carry autograd history, values cut from it, and where each came from.

A small abstract interpretation over one function: every expression evaluates to
GRAD (carries history: a model output, a loss, anything derived from them), CUT
(derived only from values cut off the graph by ``.detach()``, ``.item()``, ``.data``,
``float(...)``, a ``torch.tensor(...)`` re-wrap), DATA (batch data, constants) or
UNKNOWN. Names are followed to their last assignment before the use in the same
function. UNKNOWN absorbs CUT and DATA, so rules that need certainty stay silent.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterator
from enum import IntEnum
from typing import TYPE_CHECKING

from trainlint._record import Record
from trainlint.analysis.arguments import bind, receiver_skip
from trainlint.analysis.dominance import dominates
from trainlint.analysis.hooks import ANSWERS
from trainlint.analysis.model import FUNCTION_NODES, call_name, dotted, walk_local
from trainlint.analysis.roles import Role, is_module_class

if TYPE_CHECKING:
    from trainlint.analysis.model import FileModel


class Taint(IntEnum):
    # ordered by precedence when combining: any GRAD wins, then UNKNOWN, CUT, DATA
    DATA = 0
    CUT = 1
    UNKNOWN = 2
    GRAD = 3


class Value(Record, frozen=True):
    __slots__ = ("taint", "cuts")

    taint: Taint
    cuts: tuple[ast.AST, ...]  # where GRAD became CUT, for reporting

    def __init__(self, taint: Taint, cuts: tuple[ast.AST, ...] = ()) -> None:
        self.taint = taint
        self.cuts = cuts


DATA = Value(Taint.DATA)
UNKNOWN = Value(Taint.UNKNOWN)
GRAD = Value(Taint.GRAD)

CUT_METHODS = {"detach", "item", "tolist", "numpy"}
_NO_GRAD_RESULT = {
    "size",
    "dim",
    "numel",
    "shape",
    "argmax",
    "argmin",
    "eq",
    "ne",
    "gt",
    "lt",
    "ge",
    "le",
    "long",
    "int",
    "bool",
    "nonzero",
    "sign",
    "round",
    "floor",
    "ceil",
    "isnan",
    "isinf",
    "isfinite",
    "isclose",
    "isneginf",
    "isposinf",
    "logical_not",
    "logical_and",
    "logical_or",
    "signbit",
    "histc",
    "bincount",
    "argsort",
}
#: Tensor methods and torch functions whose result has no gradient (sizes, indices,
#: comparisons, counts), for analyses that read expressions themselves.
NO_GRAD_RESULTS = frozenset(_NO_GRAD_RESULT)
_LOADER_WORDS = ("loader", "batches", "dataset", "data_iter", "dataloader")
_MODEL_NAME = re.compile(
    r"^(model|net|network|encoder|decoder|backbone|generator|discriminator|policy|critic|"
    r"actor|classifier|student|teacher)$|^(model|net)_|_(model|net|encoder|decoder|backbone)$|"
    r"^(netG|netD|G|D)$"
)
_CRITERION_NAME = re.compile(
    r"^(criterion|crit|loss_fn|loss_func|lossfn|\w+_criterion|\w+_loss_fn)$"
)
_CONFIG_ROOTS = {
    "args",
    "cfg",
    "config",
    "conf",
    "hparams",
    "hp",
    "opts",
    "flags",
    "FLAGS",
    "params",
    "settings",
    "hyperparams",
}


def combine(values: list[Value]) -> Value:
    if not values:
        return DATA
    top = max(v.taint for v in values)
    cuts = tuple(c for v in values if v.taint is Taint.CUT for c in v.cuts)
    return Value(top, cuts if top is Taint.CUT else ())


def _add_definition(
    defs: dict[str, list[tuple[tuple[int, int], ast.AST, ast.AST]]],
    target: ast.AST,
    stmt: ast.AST,
    value: ast.AST,
) -> None:
    # A module-level function, not a recursive closure: that would be a reference cycle
    # holding the definitions (and through them the tree) until the cycle collector ran.
    name = dotted(target)
    if name is not None:
        defs[name].append(((stmt.lineno, stmt.col_offset), stmt, value))  # type: ignore[attr-defined]
    elif isinstance(target, (ast.Tuple, ast.List)):
        if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
            for t, v in zip(target.elts, value.elts, strict=True):
                _add_definition(defs, t, stmt, v)
        else:
            # `for x, y in loader`: every element comes from the same iterable; from a
            # call, each name remembers its position, so a helper returning
            # `loss, n_correct` can answer for each element apart
            starred = any(isinstance(t, ast.Starred) for t in target.elts)
            for i, t in enumerate(target.elts):
                if isinstance(value, _Marker):
                    inner = value
                elif isinstance(value, ast.Call) and not starred:
                    inner = _Marker(value, "unpack", index=i, arity=len(target.elts))
                else:
                    inner = _Marker(value, "unpack")
                _add_definition(defs, t, stmt, inner)


class Flow:
    """Per-file flow facts, computed lazily per function."""

    def __init__(self, model: FileModel) -> None:
        self.model = model
        self._defs: dict[int, dict[str, list[tuple[tuple[int, int], ast.AST, ast.AST]]]] = {}
        # parameter values while evaluating a same-file helper's return value
        self._env: list[tuple[ast.AST, dict[str, Value]]] = []
        self._budget = 0
        # value() outside helpers, per node: (value, height of its recursion, calls it
        # made); only answers that no depth or budget cut shaped (see value)
        self._values: dict[int, tuple[Value, int, int]] = {}
        self._deepest = 0  # the deepest depth the running value() reached
        self._cuts = 0  # depth or budget cuts so far
        # _defining_nodes' tables, built on first use
        self._owned: dict[int, list[ast.stmt]] | None = None
        self._walrus: set[int] = set()

    # -- definitions -----------------------------------------------------------------
    def _definitions(
        self, scope: ast.AST
    ) -> dict[str, list[tuple[tuple[int, int], ast.AST, ast.AST]]]:
        """name -> [(position, defining statement, value-or-marker)], in source order."""
        cached = self._defs.get(id(scope))
        if cached is not None:
            return cached
        defs: dict[str, list[tuple[tuple[int, int], ast.AST, ast.AST]]] = defaultdict(list)

        def add(target: ast.AST, stmt: ast.AST, value: ast.AST) -> None:
            _add_definition(defs, target, stmt, value)

        if isinstance(scope, FUNCTION_NODES):
            a = scope.args
            for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg):
                if arg is not None:
                    defs[arg.arg].append(((0, 0), scope, _Marker(scope, "param", arg.arg)))
        for node in self._defining_nodes(scope):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    add(t, node, node.value)
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                add(node.target, node, node.value)
            elif isinstance(node, ast.AugAssign):
                add(node.target, node, _Marker(node, "aug"))
            elif isinstance(node, (ast.For, ast.AsyncFor)):
                add(node.target, node, _Marker(node.iter, "iter"))
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    if item.optional_vars is not None:
                        add(item.optional_vars, node, _Marker(item.context_expr, "with"))
            elif isinstance(node, ast.NamedExpr):
                add(node.target, node, node.value)
        self._defs[id(scope)] = defs
        return defs

    def _defining_nodes(self, scope: ast.AST) -> Iterator[ast.AST] | list[ast.stmt]:
        """What ``_definitions`` looks at in ``scope``: its assignments, ``for`` and ``with``
        statements, in source order, from the model's tables (one sort per file instead of
        a walk per function); a walk of the scope where a ``:=`` may define a name too."""
        if self._owned is None:
            m = self.model
            stop = (*FUNCTION_NODES, ast.ClassDef, ast.Module)
            walrus: set[int] = set()
            for named in m.named_exprs:
                owner = m.parent_of(named)
                while owner is not None and not isinstance(owner, stop):
                    owner = m.parent_of(owner)
                walrus.add(id(owner if owner is not None else m.tree))
            owned: dict[int, list[ast.stmt]] = defaultdict(list)
            stmts: list[ast.stmt] = [*m.assignments, *m.withs]
            stmts += [lp for lp in m.loops if not isinstance(lp, ast.While)]
            stmts.sort(key=_position)  # statements: source order is walk_local's order
            for stmt in stmts:
                owned[id(m.scope_of(stmt))].append(stmt)
            self._owned = owned
            self._walrus = walrus
        if id(scope) in self._walrus or not isinstance(
            scope, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef)
        ):
            return walk_local(scope)
        return self._owned.get(id(scope), [])

    def definition(self, name: str, at: ast.AST) -> tuple[ast.AST, ast.AST] | None:
        """The last (statement, value) assigning ``name`` before ``at`` in its function."""
        scope = self.model.function_of(at) or self.model.tree
        defs = self._definitions(scope).get(name)
        if not defs:
            return None
        pos = (getattr(at, "lineno", 0), getattr(at, "col_offset", 0))
        # The statement that holds ``at`` does not define it (``x = f(x)``): the ancestors of
        # ``at``, looked up once, answer that for every candidate without walking each one.
        holders: set[int] | None = None
        for d in reversed(defs):
            if d[0] >= pos:
                continue
            stmt = d[1]
            if stmt is at:
                continue
            if not isinstance(stmt, _COMPOUND):
                if holders is None:
                    holders = {id(a) for a in self.model.ancestors(at)}
                if id(stmt) in holders:
                    continue
            return d[1], d[2]
        return None

    def definitions_before(self, name: str, at: ast.AST) -> list[tuple[ast.AST, ast.AST]]:
        """Every (statement, value) assigning ``name`` earlier in ``at``'s function, latest
        first: what may reach ``at`` when branches assign it differently (``loss = d["total"]``
        on one branch, ``loss = zeros(1)`` on the other)."""
        scope = self.model.function_of(at) or self.model.tree
        pos = (getattr(at, "lineno", 0), getattr(at, "col_offset", 0))
        holders = {id(a) for a in self.model.ancestors(at)}
        return [
            (d[1], d[2])
            for d in reversed(self._definitions(scope).get(name, ()))
            if d[0] < pos
            and d[1] is not at
            and (isinstance(d[1], _COMPOUND) or id(d[1]) not in holders)
        ]

    def reaching_definitions(self, name: str, at: ast.AST) -> list[tuple[ast.AST, ast.AST]]:
        """Every (statement, value) assigning ``name`` that may reach ``at``, latest first:
        the last assignment before it and, while that one sits on a branch ``at`` does not
        run through (``if c: loss = a + b`` / ``else: loss = a``), the ones before it, up
        to one that runs on every way to ``at`` or an ``if``/``else`` that assigns the name
        on both of its branches. Assignments later in a loop body are not followed."""
        out: list[tuple[ast.AST, ast.AST]] = []
        covered: dict[int, set[str]] = defaultdict(set)
        for stmt, value in self.definitions_before(name, at):
            out.append((stmt, value))
            if isinstance(value, _Marker) and value.kind == "param":
                break
            if dominates(self.model, stmt, at):
                break
            branch = self._enclosing_branch(stmt)
            if branch is not None:
                iff, field = branch
                covered[id(iff)].add(field)
                if len(covered[id(iff)]) == 2 and dominates(self.model, iff, at):
                    break
        return out

    def _enclosing_branch(self, stmt: ast.AST) -> tuple[ast.If, str] | None:
        """The ``if`` whose body or ``else`` block holds ``stmt`` directly, and which."""
        parent = self.model.parent_of(stmt)
        if isinstance(parent, ast.If):
            if any(s is stmt for s in parent.body):
                return parent, "body"
            if any(s is stmt for s in parent.orelse):
                return parent, "orelse"
        return None

    def joined_values(self, name: ast.Name) -> list[ast.expr] | None:
        """The values ``name`` may hold where it is read, when branches assign it
        differently (each an expression of its own branch); None when one assignment
        reaches it, or when one that reaches it is not a plain expression (a loop target,
        an unpacked element, an augmented assignment, a parameter)."""
        found = self.reaching_definitions(name.id, name)
        if len(found) < 2 or any(isinstance(v, _Marker) for _, v in found):
            return None
        if not all(isinstance(s, (ast.Assign, ast.AnnAssign)) for s, _ in found):
            return None
        return [v for _, v in found]  # type: ignore[misc]

    def branch_alternatives(self, stmt: ast.AST) -> list[ast.expr]:
        """The values the other branches of the ``if``/``elif``/``else`` chain around
        ``stmt`` (``x = value``, at the top of its branch) assign to the same name, at the
        top of theirs: what else ``x`` may hold after the chain (``agent = torch.load(p)``
        on one branch, ``agent = Agent(cfg)`` on the other). Empty when ``stmt`` is not
        such an assignment, or no other branch assigns the name."""
        if not (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
        ):
            return []
        name = stmt.targets[0].id
        branch = self._enclosing_branch(stmt)
        if branch is None:
            return []
        # climb to the head of an elif chain, then collect every branch below it
        head = branch[0]
        parent = self.model.parent_of(head)
        while isinstance(parent, ast.If) and parent.orelse == [head]:
            head, parent = parent, self.model.parent_of(parent)
        blocks: list[list[ast.stmt]] = []
        node: ast.If | None = head
        while node is not None:
            blocks.append(node.body)
            nested = node.orelse
            if len(nested) == 1 and isinstance(nested[0], ast.If):
                node = nested[0]
            else:
                blocks.append(nested)
                node = None
        out: list[ast.expr] = []
        for block in blocks:
            if any(s is stmt for s in block):
                continue
            for s in block:
                if (
                    isinstance(s, ast.Assign)
                    and len(s.targets) == 1
                    and isinstance(s.targets[0], ast.Name)
                    and s.targets[0].id == name
                ):
                    out.append(s.value)
        return out

    # -- evaluation ------------------------------------------------------------------
    def value(self, expr: ast.AST, depth: int = 0) -> Value:
        # Definition chains only go backwards in the file, so recursion ends; the budget
        # bounds the work one top-level question may cost on pathological code.
        if depth == 0:
            self._budget = 3000
        # A node's value outside a helper is a function of the node, but for the cuts:
        # the answer of an evaluation that made no cut is given again, with its calls
        # taken from the budget, where the same evaluation would make none either (the
        # terms of one loss share most of their definition chains, and rules ask again).
        key = id(expr)
        memo = (
            self._values
            if not self._env and (self.model.indexed(expr) or isinstance(expr, _Marker))
            else None
        )
        if memo is not None:
            hit = memo.get(key)
            if hit is not None and depth + hit[1] <= 40 and self._budget - hit[2] > 0:
                self._budget -= hit[2]
                self._deepest = max(self._deepest, depth + hit[1])
                return hit[0]
        outer, cuts, budget = self._deepest, self._cuts, self._budget
        self._deepest = depth
        found = self._value(expr, depth)
        if memo is not None and self._cuts == cuts:
            memo[key] = (found, self._deepest - depth, budget - self._budget)
        self._deepest = max(outer, self._deepest)
        return found

    def _value(self, expr: ast.AST, depth: int) -> Value:
        self._budget -= 1
        if depth > 40 or self._budget <= 0:
            self._cuts += 1
            return UNKNOWN
        d = depth + 1
        if isinstance(expr, _Marker):
            return self._marker(expr, d)
        if isinstance(expr, ast.Constant):
            return DATA
        if isinstance(expr, (ast.Name, ast.Attribute)) and not (
            isinstance(expr, ast.Attribute) and expr.attr == "data"
        ):
            name = dotted(expr)
            if name is not None:
                found = self.definition(name, expr)
                if found is not None:
                    return self.value(found[1], d)
                if isinstance(expr, ast.Attribute):
                    return self._attribute(expr, d)
                return UNKNOWN
            if isinstance(expr, ast.Attribute):
                return self._attribute(expr, d)
            return UNKNOWN
        if isinstance(expr, ast.Attribute):  # `.data`
            inner = self.value(expr.value, d)
            return _cut(inner, expr)
        if isinstance(expr, ast.Call):
            return self._call(expr, d)
        if isinstance(expr, (ast.BinOp,)):
            return combine([self.value(expr.left, d), self.value(expr.right, d)])
        if isinstance(expr, ast.UnaryOp):
            return self.value(expr.operand, d)
        if isinstance(expr, ast.Subscript):
            return self.value(expr.value, d)
        if isinstance(expr, ast.IfExp):
            return combine([self.value(expr.body, d), self.value(expr.orelse, d)])
        if isinstance(expr, (ast.Tuple, ast.List)):
            return combine([self.value(e, d) for e in expr.elts])
        if isinstance(expr, ast.Starred):
            return self.value(expr.value, d)
        if isinstance(expr, (ast.Compare, ast.BoolOp, ast.JoinedStr)):
            return DATA
        return UNKNOWN

    def _attribute(self, expr: ast.Attribute, d: int) -> Value:
        if expr.attr in ("shape", "dtype", "device", "requires_grad", "grad_fn", "is_leaf"):
            return DATA
        root = (dotted(expr) or "").split(".")
        if root[0] in _CONFIG_ROOTS or (
            root[0] == "self" and len(root) > 2 and root[1] in (_CONFIG_ROOTS)
        ):
            return DATA  # hyper-parameters: args.lr, cfg.model.dim, self.hparams.alpha
        base = self.value(expr.value, d)
        return base if base.taint is Taint.GRAD else UNKNOWN

    def _marker(self, marker: _Marker, d: int) -> Value:
        if marker.kind == "param":
            for fn, env in reversed(self._env):
                if fn is marker.node:
                    return env.get(marker.name, UNKNOWN)
            return UNKNOWN
        if marker.kind == "aug" and isinstance(marker.node, ast.AugAssign):
            # `loss += reg`: the new value is made of the old one and the added term
            aug = marker.node
            name = dotted(aug.target)
            before = self.definition(name, aug) if name is not None else None
            if before is None:
                return UNKNOWN
            return combine([self.value(before[1], d), self.value(aug.value, d)])
        if marker.kind == "unpack":
            if marker.index >= 0 and isinstance(marker.node, ast.Call):
                element = self._unpacked_element(marker.node, marker.index, marker.arity, d)
                if element is not None:
                    return element
            inner = self.value(marker.node, d)
            return inner if inner.taint in (Taint.GRAD, Taint.DATA) else UNKNOWN
        if marker.kind == "iter":
            it = marker.node
            text = (dotted(it) or "").lower()
            if isinstance(it, ast.Call) and call_name(it) in ("enumerate", "tqdm", "zip", "iter"):
                if it.args:
                    text = (dotted(it.args[0]) or "").lower()
                    if self.model.roles.role(it.args[0]) is Role.LOADER:
                        return DATA
            if isinstance(it, ast.Call) and call_name(it) == "range":
                return DATA
            if any(w in text for w in _LOADER_WORDS) or (
                isinstance(it, (ast.Name, ast.Attribute))
                and self.model.roles.role(it) is Role.LOADER
            ):
                return DATA
            return UNKNOWN
        return UNKNOWN

    def _call(self, call: ast.Call, d: int) -> Value:
        m = self.model
        func = call.func
        name = call_name(call)
        qual = m.qualname(func)
        args = [*call.args, *(k.value for k in call.keywords)]
        if isinstance(func, ast.Attribute) and name in CUT_METHODS:
            return _cut(self.value(func.value, d), call)
        if qual in ("builtins.float", "builtins.int") and call.args:
            return _cut(self.value(call.args[0], d), call)
        if qual in (
            "torch.tensor",
            "torch.as_tensor",
            "torch.Tensor",
            "torch.scalar_tensor",
            "torch.from_numpy",
        ):
            inner = combine([self.value(a, d) for a in call.args[:1]])
            if inner.taint in (Taint.GRAD, Taint.CUT):
                # the re-wrap is what silences autograd's "does not require grad" error
                return Value(Taint.CUT, (call,))
            return inner
        if qual is not None and qual.startswith("builtins."):
            return (
                combine([self.value(a, d) for a in args])
                if name in ("sum", "max", "min", "abs")
                else UNKNOWN
            )
        if self._is_model_call(func):
            return GRAD
        role = m.roles.role(func)
        if role is Role.CRITERION or (
            role is None
            and qual is None
            and _CRITERION_NAME.search((dotted(func) or "").rsplit(".", 1)[-1])
            and m.imports_training_library
        ):
            return combine([self.value(a, d) for a in args])
        if name in _NO_GRAD_RESULT and qual is not None and qual.startswith("torch."):
            # `torch.isnan(loss)`, `torch.argmax(out)`: a mask or an index, no history
            return _cut(combine([self.value(a, d) for a in call.args[:1]]), call)
        if isinstance(func, ast.Attribute):
            if name in _NO_GRAD_RESULT:
                # argmax & co. are not differentiable: on a model output they cut the graph
                return _cut(self.value(func.value, d), call)
            if qual is not None and (qual.startswith("torch.") or qual.startswith("numpy")):
                return combine([self.value(a, d) for a in args])
            recv = self.value(func.value, d)
            if recv.taint is Taint.GRAD:
                return GRAD
            if recv.taint in (Taint.CUT, Taint.DATA) and name not in ("forward", "__call__"):
                return combine([recv, *[self.value(a, d) for a in args]])
            return UNKNOWN
        if qual is not None and qual.startswith("torch."):
            return combine([self.value(a, d) for a in args])
        target = m.resolve_call(call)
        if target is not None:
            return self._helper(call, target, d)
        return UNKNOWN

    def _helper(
        self, call: ast.Call, fn: ast.AST, d: int, returned: list[ast.expr] | None = None
    ) -> Value:
        """Evaluate a same-file helper's return value (or the ``returned`` expressions of
        it) with its arguments bound; a cut inside the helper is reported at this call
        (SPEC §7)."""
        if any(f is fn for f, _ in self._env) or len(self._env) >= 3:
            return UNKNOWN
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return UNKNOWN
        env: dict[str, Value] = {}
        a = fn.args
        positional = [*a.posonlyargs, *a.args]
        for arg_node, default in zip(
            positional[len(positional) - len(a.defaults) :], a.defaults, strict=True
        ):
            if isinstance(default, ast.Constant):
                env[arg_node.arg] = DATA
        for pname, arg in bind(fn, call.args, call.keywords, receiver_skip(self.model, call, fn)):
            env[pname] = self.value(arg, d)
        returns = returned or [
            n.value for n in walk_local(fn) if isinstance(n, ast.Return) and n.value
        ]
        if not returns:
            return UNKNOWN
        self._env.append((fn, env))
        try:
            result = combine([self.value(r, d) for r in returns])
        finally:
            self._env.pop()
        if result.taint is Taint.CUT:
            return Value(Taint.CUT, (call,))
        return result

    def _unpacked_element(self, call: ast.Call, index: int, arity: int, d: int) -> Value | None:
        """``a, b = helper(...)`` where every ``return`` of the same-file helper is a tuple
        of ``arity`` elements: the value of element ``index`` alone (a loss next to a
        count read with ``.item()``); None when the helper's returns do not say."""
        fn = self.model.resolve_call(call)
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return None
        returns = [n.value for n in walk_local(fn) if isinstance(n, ast.Return)]
        if not returns or not all(
            isinstance(r, (ast.Tuple, ast.List))
            and len(r.elts) == arity
            and not any(isinstance(e, ast.Starred) for e in r.elts)
            for r in returns
        ):
            return None
        return self._helper(call, fn, d, [r.elts[index] for r in returns])  # type: ignore[union-attr]

    def terms(self, expr: ast.AST, depth: int = 0) -> list[ast.AST]:
        """Additive terms of a loss: ``a + w * b - c`` -> [a, b, c] (scaling by data
        kept out), following names to their definitions."""
        if depth > 6:
            return [expr]
        if isinstance(expr, ast.BinOp):
            if isinstance(expr.op, (ast.Add, ast.Sub)):
                return self.terms(expr.left, depth + 1) + self.terms(expr.right, depth + 1)
            if isinstance(expr.op, (ast.Mult, ast.Div)):
                left, right = self.value(expr.left), self.value(expr.right)
                if right.taint is Taint.DATA:
                    return self.terms(expr.left, depth + 1)
                if left.taint is Taint.DATA and isinstance(expr.op, ast.Mult):
                    return self.terms(expr.right, depth + 1)
            return [expr]
        if isinstance(expr, ast.Name):
            joined = self.joined_values(expr)
            if joined is not None:
                # a loss assigned on both branches of an if/else: the terms of each
                return [
                    t
                    for v in joined
                    for t in (self.terms(v, depth + 1) if isinstance(v, ast.BinOp) else [v])
                ]
            found = self.definition(expr.id, expr)
            if found is not None and isinstance(found[1], ast.BinOp):
                return self.terms(found[1], depth + 1)
        return [expr]

    def _is_parameter_or_attribute(self, func: ast.AST) -> bool:
        if isinstance(func, ast.Attribute):
            return isinstance(func.value, ast.Name) and func.value.id == "self"
        if isinstance(func, ast.Name):
            found = self.definition(func.id, func)
            return found is not None and isinstance(found[1], _Marker) and found[1].kind == "param"
        return False

    def _is_model_call(self, func: ast.AST) -> bool:
        if isinstance(func, ast.Name) and func.id == "self":
            cls = self.model.enclosing_class(func)
            return cls is not None and is_module_class(self.model, cls)
        if isinstance(func, (ast.Name, ast.Attribute)):
            role = self.model.roles.role(func)
            if role is Role.MODEL:
                return True
            # a parameter or `self.` attribute of unknown role spelled like a model
            return (
                role is None
                and self.model.qualname(func) is None
                and self._is_parameter_or_attribute(func)
                and self.model.imports_training_library
                and _MODEL_NAME.search((dotted(func) or "").rsplit(".", 1)[-1]) is not None
            )
        return False

    is_model_call = _is_model_call  # public name for rules (issue 13)


_NO_GRAD = {
    "torch.no_grad",
    "torch.inference_mode",
    "torch.autograd.no_grad",
    "torch.autograd.inference_mode",
}
_ENABLE_GRAD = {"torch.enable_grad", "torch.autograd.enable_grad"}
_SET_GRAD = {"torch.set_grad_enabled", "torch.autograd.set_grad_enabled"}


def grad_mode_of(model: FileModel, expr: ast.AST) -> bool | None:
    """False for a no-grad context/decorator expression, True for enable-grad, else None."""
    target = expr.func if isinstance(expr, ast.Call) else expr
    qual = model.qualname(target)
    if qual in _NO_GRAD:
        if (
            isinstance(expr, ast.Call)
            and qual.endswith("inference_mode")
            and expr.args
            and (isinstance(expr.args[0], ast.Constant) and expr.args[0].value is False)
        ):
            return True
        return False
    if qual in _ENABLE_GRAD:
        return True
    if qual in _SET_GRAD and isinstance(expr, ast.Call) and expr.args:
        arg = expr.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, bool):
            return arg.value
    return None


def grad_enabled_at(
    model: FileModel, node: ast.AST, _depth: int = 0
) -> tuple[bool, ast.AST | None]:
    """Is grad mode on at ``node``, judging by enclosing `with` blocks and decorators
    within its function? Returns (enabled, the disabling context or decorator)."""
    for anc in model.ancestors(node):
        if isinstance(anc, (ast.With, ast.AsyncWith)):
            for item in reversed(anc.items):
                mode = grad_mode_of(model, item.context_expr)
                if mode is not None:
                    return mode, item.context_expr if mode is False else None
        if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for dec in anc.decorator_list:
                mode = grad_mode_of(model, dec)
                if mode is not None:
                    return mode, dec if mode is False else None
            # A helper only ever called under no_grad runs without recording.
            sites = model.call_sites.get(id(anc), [])
            if sites and _depth < 3:
                modes = [grad_enabled_at(model, s, _depth + 1) for s in sites]
                if all(not enabled for enabled, _ in modes):
                    return False, modes[0][1]
            return True, None
        if isinstance(anc, (ast.Lambda, ast.ClassDef)):
            return True, None
    return True, None


class _Marker(ast.AST):
    """Stands for a value defined by something other than an expression."""

    def __init__(
        self, node: ast.AST, kind: str, name: str = "", index: int = -1, arity: int = 0
    ) -> None:
        super().__init__()
        self.node = node
        self.kind = kind
        self.name = name
        self.index = index  # for "unpack": the target's position, -1 when not known
        self.arity = arity


def unpacked_from(value: ast.AST) -> tuple[ast.Call, int, int] | None:
    """For a value :meth:`Flow.definition` gives: (the call, the target's position, the
    number of targets) when the name is one element of a call's unpacked result
    (``a, b = f(x)``); None otherwise."""
    if isinstance(value, _Marker) and value.kind == "unpack" and value.index >= 0:
        if isinstance(value.node, ast.Call):
            return value.node, value.index, value.arity
    return None


def iterated_from(value: ast.AST) -> ast.AST | None:
    """For a value :meth:`Flow.definition` gives: the iterated expression when the name
    is a ``for`` loop's target (``for row in probs``); None otherwise."""
    if isinstance(value, _Marker) and value.kind == "iter":
        return value.node
    return None


def is_parameter(value: ast.AST) -> bool:
    """Whether a value :meth:`Flow.definition` gives is the function's parameter itself."""
    return isinstance(value, _Marker) and value.kind == "param"


def defined_from(value: ast.AST) -> ast.AST | None:
    """For a value :meth:`Flow.definition` gives that is not an expression itself: the
    expression it was taken from (the iterable of a ``for``, the unpacked call, the
    context manager of a ``with``); None for a parameter or an augmented assignment."""
    if isinstance(value, _Marker) and value.kind in ("iter", "unpack", "with"):
        return value.node
    return None


def _position(node: ast.AST) -> tuple[int, int]:
    return (node.lineno, node.col_offset)  # type: ignore[attr-defined]


def _cut(inner: Value, node: ast.AST) -> Value:
    if inner.taint is Taint.GRAD:
        return Value(Taint.CUT, (node,))
    return inner


# Compound statements define names (a loop target, a `with ... as`), they do not "contain"
# the use of one in their body.
_COMPOUND = (
    ast.For,
    ast.AsyncFor,
    ast.While,
    ast.With,
    ast.AsyncWith,
    ast.If,
    ast.Try,
    *FUNCTION_NODES,
)


# The answers this module gives to lower layers (see analysis.hooks).
ANSWERS.flow = Flow
