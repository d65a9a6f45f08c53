"""Escape analysis, part one: what a file's names hold and which definitions they are.

:class:`EscapeSites` indexes the objects names hold (pools, contexts, locks, ``ray.put``
refs, remote functions and actor handles), resolves a callable to its same-file
definition, binds a dispatch's arguments to the target's parameters, and unwraps
copies and aliases. The record :class:`Touch` and the constants naming Ray,
multiprocessing and threading live here. :mod:`escapes` builds on it.
"""

from __future__ import annotations

import ast
from enum import Enum
from typing import TYPE_CHECKING

from trainlint._record import Record
from trainlint.analysis.arguments import bind, is_static
from trainlint.analysis.arguments import parameter_names as params_of
from trainlint.analysis.escape_targets import facts_of, foreign_worker
from trainlint.analysis.model import (
    NESTED_SCOPES,
    call_name,
    keyword,
)
from trainlint.analysis.torch_table import SAME_OBJECT_METHODS, SHARING_WRAPPERS

if TYPE_CHECKING:
    from trainlint.analysis.model import FileModel, FunctionNode
    from trainlint.analysis.roles import Key

RAY_REMOTE = "ray.remote"


RAY_PUT = "ray.put"


PROCESS = "multiprocessing.Process"


# torch.multiprocessing.X is canonicalised to multiprocessing.X by the import table.
SPAWN = ("multiprocessing.spawn", "multiprocessing.start_processes")


GET_CONTEXT = "multiprocessing.get_context"


THREAD = "threading.Thread"


FUNCTOOLS_PARTIAL = "functools.partial"


# `tune.with_parameters(fn, model=model)`: like a partial, its keywords reach `fn`.
TUNE_WITH_PARAMETERS = frozenset(
    {"ray.tune.with_parameters", "ray.tune.trainable.util.with_parameters"}
)


_PROCESS_POOLS = {
    "multiprocessing.Pool",
    "multiprocessing.pool.Pool",
    "concurrent.futures.ProcessPoolExecutor",
    "concurrent.futures.process.ProcessPoolExecutor",
}


_THREAD_POOLS = {
    "multiprocessing.pool.ThreadPool",
    "multiprocessing.dummy.Pool",
    "concurrent.futures.ThreadPoolExecutor",
    "concurrent.futures.thread.ThreadPoolExecutor",
}


LOCKS = {
    "threading.Lock",
    "threading.RLock",
    "threading.Semaphore",
    "threading.BoundedSemaphore",
    "threading.Condition",
    "multiprocessing.Lock",
    "multiprocessing.RLock",
    "multiprocessing.Semaphore",
    "multiprocessing.BoundedSemaphore",
}


COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)


class Via(Enum):
    REMOTE = "Ray remote function"
    ACTOR = "Ray actor"
    ACTOR_METHOD = "Ray actor method"
    PROCESS = "process"
    POOL = "process pool"
    SPAWN = "torch.multiprocessing.spawn"
    THREAD = "thread"
    THREAD_POOL = "thread pool"
    RAY_TRAIN = "Ray Train worker loop"


class Touch(Record, frozen=True):
    """An object a dispatched function trains, named in that function's own terms."""

    __slots__ = ("name", "node")

    name: str  # dotted: a parameter (`model`, `model.encoder`), `self.x`, or a global
    node: ast.expr  # an expression for it, where the name is valid (for role lookups)

    def __init__(self, name: str, node: ast.expr) -> None:
        self.name = name
        self.node = node

    @property
    def root(self) -> str:
        return self.name.split(".", 1)[0]


def root_name(node: ast.AST) -> ast.Name | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node if isinstance(node, ast.Name) else None


def literal_str(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


class EscapeSites:
    """What names hold and which definitions they are; the base of the escape analysis."""

    def __init__(self, model: FileModel) -> None:
        self.model = model
        self.roles = model.roles
        self._trained: dict[int, dict[str, Touch]] = {}
        # Objects names hold, by role key: ("pool"|"threadpool", workers), ("context",
        # method), ("lock",), ("put", expr), ("remote", def), ("actor", class).
        self._held: dict[Key, tuple[object, ...]] = {}
        self._ambiguous: set[Key] = set()
        # Actor handles (`h = Actor.remote()`) need the remote wrappers (`Actor =
        # ray.remote(Cls)`) of the previous pass: two passes, each reading the last.
        for _ in range(2):
            self._held, self._ambiguous = self._index_held()

    # -- what names hold ------------------------------------------------------------------
    def _index_held(self) -> tuple[dict[Key, tuple[object, ...]], set[Key]]:
        held: dict[Key, tuple[object, ...]] = {}
        ambiguous: set[Key] = set()
        pairs: list[tuple[ast.AST, ast.AST]] = []
        for node in self.model.assignments:
            if isinstance(node, ast.Assign):
                pairs.extend((t, node.value) for t in node.targets)
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                pairs.append((node.target, node.value))
            elif isinstance(node, ast.AugAssign):
                pairs.append((node.target, node))
        for w in self.model.withs:
            for item in w.items:
                if item.optional_vars is not None:
                    pairs.append((item.optional_vars, item.context_expr))
        for target, value in pairs:
            if not isinstance(target, (ast.Name, ast.Attribute)):
                continue
            key = self.roles.key(target)
            if key is None:
                continue
            if isinstance(value, ast.Constant) and value.value is None:
                continue  # `pool = None` placeholders do not change what the name holds
            obj = self._object_of(value) if isinstance(value, ast.expr) else None
            if obj is None or held.get(key, obj) != obj:
                ambiguous.add(key)
            else:
                held[key] = obj
        return held, ambiguous

    def _object_of(self, value: ast.expr) -> tuple[object, ...] | None:
        if not isinstance(value, ast.Call):
            return None
        m = self.model
        qual = m.qualname(value.func)
        if qual in _PROCESS_POOLS or self._context_attr(value.func, "Pool"):
            return ("pool",)
        if qual in _THREAD_POOLS:
            workers = (
                keyword(value, "max_workers")
                or keyword(value, "processes")
                or (value.args[0] if value.args else None)
            )
            one = isinstance(workers, ast.Constant) and workers.value == 1
            return ("threadpool", 1 if one else None)
        if qual == GET_CONTEXT:
            arg = value.args[0] if value.args else keyword(value, "method")
            if arg is None:
                return ("context", "default")
            return ("context", literal_str(arg))
        if qual in LOCKS:
            return ("lock",)
        if qual == RAY_PUT and value.args:
            return ("put", value.args[0])
        wrapped = self._remote_wrapper(value)
        if wrapped is not None:
            return ("remote", wrapped)
        if call_name(value) == "remote":
            resolved = self._resolve_remote(value)
            if resolved is not None and resolved[0] is Via.ACTOR:
                return ("actor", resolved[2])
        return None

    def held(self, expr: ast.AST) -> tuple[object, ...] | None:
        """What a name/attribute holds, when every binding agrees."""
        if not isinstance(expr, (ast.Name, ast.Attribute)):
            return None
        key = self.roles.key(expr)
        if key is None or key in self._ambiguous:
            return None
        return self._held.get(key)

    def _context_attr(self, func: ast.AST, attr: str) -> str | None:
        """``ctx.Process``/``ctx.Pool`` on a ``get_context(...)`` object: its method."""
        if isinstance(func, ast.Attribute) and func.attr == attr:
            held = self.held(func.value)
            if held is not None and held[0] == "context":
                method = held[1]
                return method if isinstance(method, str) else "unknown"
            if isinstance(func.value, ast.Call) and self.model.qualname(func.value.func) == (
                GET_CONTEXT
            ):
                return literal_str(func.value.args[0] if func.value.args else None) or "unknown"
        return None

    # -- definitions ---------------------------------------------------------------------
    def resolve_def(self, expr: ast.AST) -> FunctionNode | ast.ClassDef | None:
        """The same-file def or class a name (``train``, ``self.worker``) refers to."""
        return self.model.resolve_def(expr, classes=True)

    def _is_ray_remote(self, expr: ast.AST) -> bool:
        return self.model.qualname(expr) == RAY_REMOTE

    def is_remote_def(self, node: ast.AST) -> bool:
        """Decorated ``@ray.remote`` / ``@ray.remote(num_gpus=1)`` / ``@remote``."""
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return False
        for dec in node.decorator_list:
            target = dec.func if isinstance(dec, ast.Call) else dec
            if self._is_ray_remote(target):
                return True
        return False

    def _remote_wrapper(self, call: ast.Call) -> FunctionNode | ast.ClassDef | None:
        """``ray.remote(f)`` or ``ray.remote(num_gpus=1)(f)``: the wrapped local def."""
        func = call.func
        if self._is_ray_remote(func) and len(call.args) == 1 and not call.keywords:
            return self.resolve_def(call.args[0])
        if isinstance(func, ast.Call) and self._is_ray_remote(func.func) and len(call.args) == 1:
            return self.resolve_def(call.args[0])
        return None

    def _remote_target(self, expr: ast.AST) -> FunctionNode | ast.ClassDef | None:
        if isinstance(expr, ast.Call):
            return self._remote_wrapper(expr)
        held = self.held(expr)
        if held is not None and held[0] == "remote":
            return held[1]  # type: ignore[return-value]
        found = self.resolve_def(expr)
        if found is not None and self.is_remote_def(found):
            return found
        # a `@ray.remote` function another module of the project defines
        foreign = foreign_worker(self.model, expr)
        if foreign is not None and (facts_of(foreign) or {}).get("remote"):
            return foreign
        return None

    def _resolve_remote(
        self, call: ast.Call
    ) -> tuple[Via, FunctionNode | None, ast.ClassDef | None] | None:
        func = call.func
        if not isinstance(func, ast.Attribute) or func.attr != "remote":
            return None
        recv = func.value
        # `f.options(num_gpus=1).remote(...)` dispatches `f`
        if (
            isinstance(recv, ast.Call)
            and call_name(recv) == "options"
            and isinstance(recv.func, ast.Attribute)
        ):
            recv = recv.func.value
        target = self._remote_target(recv)
        if isinstance(target, ast.ClassDef):
            return Via.ACTOR, self.model.methods(target).get("__init__"), target
        if target is not None:
            return Via.REMOTE, target, None
        if isinstance(recv, ast.Attribute):  # handle.method.remote(...)
            held = self.held(recv.value)
            if held is not None and held[0] == "actor" and isinstance(held[1], ast.ClassDef):
                method = self.model.methods(held[1]).get(recv.attr)
                if method is not None:
                    return Via.ACTOR_METHOD, method, held[1]
        return None

    # -- argument binding ------------------------------------------------------------------
    # (the one parameter -> argument mapping, shared with every other analysis)
    bind = staticmethod(bind)

    def _callable(
        self, expr: ast.expr | None
    ) -> tuple[FunctionNode | None, int, list[ast.expr], list[ast.keyword], ast.expr | None]:
        """A dispatched callable: (function, parameters to skip, pre-bound positional and
        keyword arguments of a ``functools.partial``, the bound ``self`` receiver)."""
        if expr is None:
            return None, 0, [], [], None
        if isinstance(expr, ast.Call) and self.model.qualname(expr.func) == FUNCTOOLS_PARTIAL:
            if not expr.args:
                return None, 0, [], [], None
            fn, skip, pre, kws, recv = self._callable(expr.args[0])
            return fn, skip, [*pre, *expr.args[1:]], [*kws, *expr.keywords], recv
        if isinstance(expr, ast.Call) and self.model.qualname(expr.func) in TUNE_WITH_PARAMETERS:
            if len(expr.args) != 1:
                return None, 0, [], [], None
            fn, skip, pre, kws, recv = self._callable(expr.args[0])
            return fn, skip, pre, [*kws, *expr.keywords], recv
        if (
            isinstance(expr, ast.Lambda)
            and isinstance(expr.body, ast.Call)
            and not (params_of(expr) or expr.args.vararg or expr.args.kwarg)
        ):
            # `target=lambda: train(model, opt, shard)`: the call's arguments, as bound
            fn, skip, pre, kws, recv = self._callable(expr.body.func)
            return fn, skip, [*pre, *expr.body.args], [*kws, *expr.body.keywords], recv
        found = self.resolve_def(expr)
        if isinstance(found, (ast.FunctionDef, ast.AsyncFunctionDef)):
            recv = expr.value if isinstance(expr, ast.Attribute) else None
            method = self.model.class_of(found) is not None and not is_static(found)
            return found, 1 if method and recv is not None else 0, [], [], recv
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            # `obj.method` where `obj = Cls(...)` is an instance of a same-file class
            found_def = self.model.flow.definition(expr.value.id, expr)
            value = found_def[1] if found_def is not None else None
            if isinstance(value, ast.Call):
                owner = self.resolve_def(value.func)
                if isinstance(owner, ast.ClassDef):
                    bound = self.model.methods(owner).get(expr.attr)
                    if bound is not None and not is_static(bound):
                        return bound, 1, [], [], expr.value
        return None, 0, [], [], None

    def _process_callable(
        self, expr: ast.expr | None
    ) -> tuple[FunctionNode | None, int, list[ast.expr], list[ast.keyword], ast.expr | None]:
        """:meth:`_callable`, or an imported function whose file says what it trains (a
        stand-in definition, see ``analysis.escape_targets``): process targets only."""
        found = self._callable(expr)
        if found[0] is None and isinstance(expr, (ast.Name, ast.Attribute)):
            foreign = foreign_worker(self.model, expr)
            if foreign is not None:
                return foreign, 0, [], [], None
        return found

    @staticmethod
    def _tuple_items(node: ast.expr | None) -> list[ast.expr]:
        if isinstance(node, (ast.Tuple, ast.List)) and not any(
            isinstance(e, ast.Starred) for e in node.elts
        ):
            return list(node.elts)
        return []

    @staticmethod
    def _dict_items(node: ast.expr | None) -> list[ast.keyword]:
        if isinstance(node, ast.Dict):
            return [
                ast.keyword(arg=k.value, value=v)
                for k, v in zip(node.keys, node.values, strict=True)
                if isinstance(k, ast.Constant) and isinstance(k.value, str)
            ]
        if isinstance(node, ast.Call) and call_name(node) == "dict" and not node.args:
            return [k for k in node.keywords if k.arg is not None]
        return []

    # -- how a dispatch runs ----------------------------------------------------------------
    def _repeated(self, call: ast.Call) -> bool:
        for anc in self.model.ancestors(call):
            if isinstance(anc, COMPREHENSIONS):
                return True
            if isinstance(anc, NESTED_SCOPES):
                break
        return bool(self.model.loop_contexts(call))

    def local_to(self, node: ast.AST, fn: ast.AST) -> bool:
        """Is the name at the root of ``node`` bound in ``fn`` (a parameter or a local)?"""
        root = root_name(node)
        if root is None:
            return True
        if root.id in ("self", "cls"):
            return True
        key = self.roles.key(root)
        return key is not None and key[1] == id(fn)

    def unwrap(self, expr: ast.expr) -> ast.expr:
        """``model.to(dev)``, ``DDP(model)``, ``torch.compile(model)`` -> ``model``."""
        for _ in range(8):
            if not isinstance(expr, ast.Call):
                return expr
            func = expr.func
            if isinstance(func, ast.Attribute) and func.attr in SAME_OBJECT_METHODS:
                expr = func.value
            elif expr.args and self.model.qualname(func) in SHARING_WRAPPERS:
                expr = expr.args[0]
            else:
                return expr
        return expr

    def _scope(self, node: ast.AST) -> ast.AST:
        return self.model.function_of(node) or self.model.tree

    def _assignments_by_scope(self) -> dict[int, list[ast.Assign | ast.AugAssign | ast.AnnAssign]]:
        """The file's assignments grouped by :meth:`_scope` (in the table's order), once."""

        def build(model: FileModel) -> dict[int, list[ast.Assign | ast.AugAssign | ast.AnnAssign]]:
            out: dict[int, list[ast.Assign | ast.AugAssign | ast.AnnAssign]] = {}
            for node in model.assignments:
                out.setdefault(id(self._scope(node)), []).append(node)
            return out

        return self.model.memo(("escapes-assignments-by-scope",), build)

    @staticmethod
    def _matches(name: str | None, names: set[str]) -> bool:
        return name is not None and any(name == n or name.startswith(n + ".") for n in names)
