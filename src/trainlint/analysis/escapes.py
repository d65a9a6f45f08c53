"""What escapes a process or thread: Ray remotes and actors, processes, pools, threads.

A *dispatch* is a place where a function is handed to another worker together with
its arguments: ``train.remote(model, opt)``, ``Actor.options(...).remote(model)``,
``Process(target=train, args=(model,))``, ``pool.map(train, [model] * 4)``,
``torch.multiprocessing.spawn(train, args=(model,))``, ``Thread(target=train)``,
``executor.submit(train, model)``, ``TorchTrainer(train_func, train_loop_config={"model":
model}).fit()``. For each dispatch the analysis knows the same-file
function that runs on the other side, which of its parameters receive which caller
expressions, and how it runs (start method, repeated in a loop, joined at once).

On the other side, :meth:`Escapes.trained` tells which of a function's parameters (and
``self`` attributes, and globals) it *trains*: optimizers it steps, and models whose
parameters such an optimizer holds, followed through same-file helpers by mapping
their parameters back to the arguments at each call site. Everything unresolved is
left out, so the rules built on this stay silent when they cannot decide.

It also answers the caller-side questions those rules ask: is an argument a model or
optimizer (through ``ray.put``), are weights loaded back or the name rebound after a
dispatch, is the object used afterwards, was ``share_memory()`` called, which start
method a process gets, and whether a node runs under ``with lock:``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from enum import Enum
from functools import cached_property
from typing import TYPE_CHECKING

from trainlint._record import Record
from trainlint.analysis.flow import grad_enabled_at
from trainlint.analysis.model import (
    FUNCTION_NODES,
    NESTED_SCOPES,
    call_name,
    dotted,
    keyword,
    walk_local,
)
from trainlint.analysis.roles import Role, parameter_owners
from trainlint.analysis.steps import Event, Kind
from trainlint.analysis.torch_table import COPYING_METHODS, SAME_OBJECT_METHODS, SHARING_WRAPPERS

if TYPE_CHECKING:
    from trainlint.analysis.model import FileModel, FunctionNode
    from trainlint.analysis.roles import Key

RAY_REMOTE = "ray.remote"
RAY_PUT = "ray.put"
PROCESS = "multiprocessing.Process"
# torch.multiprocessing.X is canonicalised to multiprocessing.X by the import table.
SPAWN = ("multiprocessing.spawn", "multiprocessing.start_processes")
GET_CONTEXT = "multiprocessing.get_context"
SET_START_METHOD = "multiprocessing.set_start_method"
THREAD = "threading.Thread"
FUNCTOOLS_PARTIAL = "functools.partial"
# `tune.with_parameters(fn, model=model)`: like a partial, its keywords reach `fn`.
TUNE_WITH_PARAMETERS = frozenset(
    {"ray.tune.with_parameters", "ray.tune.trainable.util.with_parameters"}
)
# Ray Train trainers (torch backends): `train_loop_per_worker` runs on every worker with
# `train_loop_config` pickled as its one argument; `trainer.fit()` runs them.
RAY_TRAINERS = frozenset(
    {
        "ray.train.torch.TorchTrainer",
        "ray.train.torch.torch_trainer.TorchTrainer",
        "ray.train.DataParallelTrainer",
        "ray.train.data_parallel_trainer.DataParallelTrainer",
        "ray.train.horovod.HorovodTrainer",
        "ray.train.horovod.horovod_trainer.HorovodTrainer",
    }
)
# After `trainer.fit()`, the driver restores trained weights through the result's
# checkpoint (`result.checkpoint`, `result.best_checkpoints`, `ckpt.get_model(model)`).
_CHECKPOINT_WORDS = frozenset(
    {
        "checkpoint",
        "best_checkpoints",
        "get_model",
        "get_checkpoint",
        "load_from_checkpoint",
        "from_checkpoint",
    }
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
_LOCK_WORDS = re.compile(r"lock|mutex|sem(aphore)?$|^sem_|cond(ition)?$", re.IGNORECASE)
# pool method -> how its arguments reach the function: "map" (one element per call),
# "starmap" (tuples unpacked), "apply" (args=, kwds=), "submit" (*args, **kwargs)
_POOL_METHODS = {
    "map": "map",
    "imap": "map",
    "imap_unordered": "map",
    "map_async": "map",
    "starmap": "starmap",
    "starmap_async": "starmap",
    "apply": "apply",
    "apply_async": "apply",
    "submit": "submit",
}
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)


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


class Dispatch(Record, frozen=True, eq=False):
    """One place where a function is handed to another process, thread or Ray worker."""

    __slots__ = (
        "via",
        "call",
        "target",
        "actor",
        "args",
        "receiver",
        "start_method",
        "repeated",
        "serial",
        "runs_at",
        "shared_attrs",
    )

    via: Via
    #: the creating call: ``f.remote(...)``, ``Process(...)``, ``pool.map(...)``, ``submit``
    call: ast.Call
    #: the same-file function that runs on the other side (an actor's ``__init__``)
    target: FunctionNode | None
    #: for actors and actor methods
    actor: ast.ClassDef | None
    #: target parameter -> caller expression it receives
    args: tuple[tuple[str, ast.expr], ...]
    #: ``obj`` of ``target=obj.method``: the ``self`` the workers share
    receiver: ast.expr | None
    #: processes: "fork", "spawn" or "forkserver"; None when it cannot be told
    start_method: str | None
    #: may run several times at once (a loop, a comprehension, a map over items)
    repeated: bool
    #: each worker is waited for before the next starts (``t.join()`` in the same
    #: iteration, ``submit(...).result()``, a single-worker pool)
    serial: bool
    #: where the workers actually run, when that is a later call (``trainer.fit()``)
    runs_at: ast.Call | None
    #: a ``Thread`` subclass constructed elsewhere in the project: the ``self``
    #: attributes every instance shares, each with whether it holds a model
    shared_attrs: tuple[tuple[str, bool], ...]

    def __init__(
        self,
        via: Via,
        call: ast.Call,
        target: FunctionNode | None,
        actor: ast.ClassDef | None = None,
        args: tuple[tuple[str, ast.expr], ...] = (),
        receiver: ast.expr | None = None,
        start_method: str | None = None,
        repeated: bool = False,
        serial: bool = False,
        runs_at: ast.Call | None = None,
        shared_attrs: tuple[tuple[str, bool], ...] = (),
    ) -> None:
        self.via = via
        self.call = call
        self.target = target
        self.actor = actor
        self.args = args
        self.receiver = receiver
        self.start_method = start_method
        self.repeated = repeated
        self.serial = serial
        self.runs_at = runs_at
        self.shared_attrs = shared_attrs

    @property
    def name(self) -> str:
        if self.via is Via.ACTOR and self.actor is not None:
            return self.actor.name
        return self.target.name if self.target is not None else "<unknown>"

    def arg(self, param: str) -> ast.expr | None:
        for name, expr in self.args:
            if name == param:
                return expr
        return None


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


def escapes(model: FileModel) -> Escapes:
    """The file's escape analysis, built once per FileModel on first use."""
    return model.memo(Escapes, Escapes)


def may_dispatch_processes(model: FileModel) -> bool:
    """False when ``escapes(model).process_dispatches`` is certainly empty, told from the
    call table alone (no escape analysis, no role bindings): no call creates a
    ``Process`` or spawns workers, and no call has a pool method's name."""
    calls = model.calls
    return bool(
        calls.get("Process")
        or model.calls_to(PROCESS, *SPAWN)
        or any(
            isinstance(c.func, ast.Attribute) and c.args
            for method in _POOL_METHODS
            for c in calls.get(method, ())
        )
    )


def params_of(fn: ast.AST) -> list[str]:
    if not isinstance(fn, FUNCTION_NODES):
        return []
    a = fn.args
    return [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]


def _positional(fn: FunctionNode) -> list[str]:
    return [x.arg for x in (*fn.args.posonlyargs, *fn.args.args)]


def _is_static(fn: FunctionNode) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)


def _pos(node: ast.AST) -> tuple[int, int]:
    return (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))


def _end(node: ast.AST) -> tuple[int, int]:
    return (getattr(node, "end_lineno", 0) or 0, getattr(node, "end_col_offset", 0) or 0)


def _root_name(node: ast.AST) -> ast.Name | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node if isinstance(node, ast.Name) else None


def _literal_str(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _target_names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _elements(model: FileModel, expr: ast.expr) -> list[ast.expr] | None:
    """The items an iterable literal yields: ``[a, b]``, ``[a] * n``, a comprehension's
    element, ``itertools.repeat(a, n)``; None when they cannot be listed."""
    if isinstance(expr, (ast.List, ast.Tuple, ast.Set)):
        if any(isinstance(e, ast.Starred) for e in expr.elts):
            return None
        return list(expr.elts)
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mult):
        for side in (expr.left, expr.right):
            if isinstance(side, (ast.List, ast.Tuple)):
                return _elements(model, side)
        return None
    if isinstance(expr, (ast.ListComp, ast.GeneratorExp, ast.SetComp)):
        return [expr.elt]
    if isinstance(expr, ast.Call) and expr.args and model.qualname(expr.func) == "itertools.repeat":
        return [expr.args[0]]
    return None


class Escapes:
    """Dispatches of one file and what their targets train; computed lazily, once."""

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
            return ("context", _literal_str(arg))
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
                return _literal_str(func.value.args[0] if func.value.args else None) or "unknown"
        return None

    # -- definitions ---------------------------------------------------------------------
    def resolve_def(self, expr: ast.AST) -> FunctionNode | ast.ClassDef | None:
        """The same-file def or class a name (``train``, ``self.worker``) refers to."""
        m = self.model
        if isinstance(expr, ast.Name):
            for scope in m.scopes_of(expr):
                if isinstance(scope, ast.ClassDef):
                    continue
                fn = m._local_defs.get(id(scope), {}).get(expr.id)
                if fn is not None:
                    return fn
                for klass in m.classes:
                    if klass.name == expr.id and m.scope_of(klass) is scope:
                        return klass
                b = m.imports._scopes.get(id(scope))
                if b is not None and (expr.id in b.others or expr.id in b.imports):
                    return None
            return None
        if (
            isinstance(expr, ast.Attribute)
            and isinstance(expr.value, ast.Name)
            and expr.value.id in ("self", "cls")
        ):
            cls = m.enclosing_class(expr)
            return m.method_of(cls, expr.attr) if cls is not None else None
        return None

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
    @staticmethod
    def bind(
        fn: FunctionNode, args: list[ast.expr], keywords: list[ast.keyword], skip: int = 0
    ) -> tuple[tuple[str, ast.expr], ...]:
        """Parameter -> argument, for a call ``fn(*args, **keywords)`` that skips the first
        ``skip`` positional parameters (``self``, a spawned worker's rank)."""
        positional = _positional(fn)[skip:]
        out: list[tuple[str, ast.expr]] = []
        for i, arg in enumerate(args):
            if isinstance(arg, ast.Starred) or i >= len(positional):
                break
            out.append((positional[i], arg))
        named = set(params_of(fn))
        for kw in keywords:
            if kw.arg is not None and kw.arg in named:
                out.append((kw.arg, kw.value))
        return tuple(out)

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
            method = self.model.class_of(found) is not None and not _is_static(found)
            return found, 1 if method and recv is not None else 0, [], [], recv
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            # `obj.method` where `obj = Cls(...)` is an instance of a same-file class
            found_def = self.model.flow.definition(expr.value.id, expr)
            value = found_def[1] if found_def is not None else None
            if isinstance(value, ast.Call):
                owner = self.resolve_def(value.func)
                if isinstance(owner, ast.ClassDef):
                    bound = self.model.methods(owner).get(expr.attr)
                    if bound is not None and not _is_static(bound):
                        return bound, 1, [], [], expr.value
        return None, 0, [], [], None

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

    # -- dispatches --------------------------------------------------------------------------
    @cached_property
    def remote_dispatches(self) -> list[Dispatch]:
        out = []
        for call in self.model.calls.get("remote", ()):
            resolved = self._resolve_remote(call)
            if resolved is None:
                continue
            via, fn, cls = resolved
            args: tuple[tuple[str, ast.expr], ...] = ()
            if fn is not None:
                args = self.bind(fn, list(call.args), call.keywords, 0 if via is Via.REMOTE else 1)
            out.append(Dispatch(via, call, fn, cls, args, repeated=self._repeated(call)))
        return out

    @cached_property
    def ray_train_dispatches(self) -> list[Dispatch]:
        """``TorchTrainer(train_loop_per_worker, train_loop_config={"model": model})`` (and
        the other Ray Train trainers) that some ``trainer.fit()`` runs. Each worker gets a
        pickled copy of the config: its entries are bound as ``config["model"]`` to the
        worker function's config parameter, keywords of ``functools.partial`` and
        ``tune.with_parameters`` to theirs."""
        out = []
        for call in self.model.calls_to(*RAY_TRAINERS):
            target = keyword(call, "train_loop_per_worker") or (call.args[0] if call.args else None)
            fn, skip, pre, kws, recv = self._callable(target)
            if fn is None:
                continue
            bound = list(self.bind(fn, pre, kws, skip))
            taken = {p for p, _ in bound}
            free = [p for p in _positional(fn)[skip + len(pre) :] if p not in taken]
            config = self._dict_literal(keyword(call, "train_loop_config"))
            if free and config is not None:
                bound.extend(
                    (f"{free[0]}[{kw.arg!r}]", kw.value) for kw in self._dict_items(config)
                )
            out.append(
                Dispatch(
                    Via.RAY_TRAIN,
                    call,
                    fn,
                    None,
                    tuple(bound),
                    recv,
                    repeated=self._repeated(call),
                    runs_at=self._fit_call(call),
                )
            )
        return out

    def _dict_literal(self, expr: ast.expr | None) -> ast.expr | None:
        """A dict display (or ``dict(...)``) itself or the one a name was last bound to,
        when nothing stores further entries into that name (``config["model"] = m``)."""
        if isinstance(expr, ast.Name):
            found = self.model.flow.definition(expr.id, expr)
            if found is None or not isinstance(found[1], ast.expr):
                return None
            scope = self._scope(expr)
            for node in walk_local(scope):
                if (
                    isinstance(node, ast.Subscript)
                    and isinstance(node.ctx, ast.Store)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == expr.id
                ):
                    return None
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("update", "setdefault")
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == expr.id
                ):
                    return None
            expr = found[1]
        if isinstance(expr, ast.Dict) or (
            isinstance(expr, ast.Call) and call_name(expr) == "dict" and not expr.args
        ):
            return expr
        return None

    def _fit_call(self, call: ast.Call) -> ast.Call | None:
        """``TorchTrainer(...).fit()``, or the first ``trainer.fit()`` after
        ``trainer = TorchTrainer(...)`` in the same scope."""
        m = self.model
        parent = m.parent_of(call)
        if isinstance(parent, ast.Attribute) and parent.attr == "fit":
            grand = m.parent_of(parent)
            return grand if isinstance(grand, ast.Call) else None
        stmt = m.statement_of(call)
        if not (
            isinstance(stmt, ast.Assign)
            and stmt.value is call
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
        ):
            return None
        name = stmt.targets[0].id
        scope = self._scope(call)
        fits = [
            c
            for c in m.calls.get("fit", ())
            if isinstance(c.func, ast.Attribute)
            and isinstance(c.func.value, ast.Name)
            and c.func.value.id == name
            and self._scope(c) is scope
            and _pos(c) > _pos(call)
        ]
        return min(fits, key=_pos) if fits else None

    def config_entry(self, fn: FunctionNode, node: ast.AST) -> str | None:
        """``config["model"]`` when the local at the root of ``node`` was taken from an entry
        of ``fn``'s parameter ``config`` (``model = prepare_model(config["model"])``,
        ``config.get("model")``)."""
        params = set(params_of(fn))
        root = _root_name(node)
        for _ in range(8):
            if root is None or root.id in params:
                return None
            found = self.model.flow.definition(root.id, root)
            if found is None or not isinstance(found[1], ast.expr):
                return None
            if self.model.function_of(found[0]) is not fn:
                return None
            value = self.unwrap(found[1])
            key: str | None = None
            base: ast.expr | None = None
            if isinstance(value, ast.Subscript):
                base, key = value.value, _literal_str(value.slice)
            elif (
                isinstance(value, ast.Call)
                and call_name(value) == "get"
                and isinstance(value.func, ast.Attribute)
                and value.args
            ):
                base, key = value.func.value, _literal_str(value.args[0])
            if isinstance(base, ast.Name) and base.id in params and key is not None:
                return f"{base.id}[{key!r}]"
            root = value if isinstance(value, ast.Name) else None
        return None

    def restores_checkpoint(self, call: ast.Call) -> bool:
        """After ``call`` in its scope, the driver reaches for a Ray Train checkpoint
        (``result.checkpoint``, ``best_checkpoints``, ``get_model``): trained weights may
        come back through it, so the driver's model cannot be called untrained."""
        scope = self._scope(call)
        for node in walk_local(scope):
            word = (
                node.attr
                if isinstance(node, ast.Attribute)
                else (node.id if isinstance(node, ast.Name) else None)
            )
            if word in _CHECKPOINT_WORDS and _pos(node) > _pos(call):
                return True
        return False

    @cached_property
    def process_dispatches(self) -> list[Dispatch]:
        m = self.model
        out = []
        creations = [
            *m.calls_to(PROCESS),
            *(c for c in m.calls.get("Process", ()) if self._context_attr(c.func, "Process")),
        ]
        for call in sorted(set(creations), key=_pos):
            target = keyword(call, "target") or (call.args[1] if len(call.args) > 1 else None)
            fn, skip, pre, kws, recv = self._callable(target)
            if fn is None:
                continue
            args = [
                *pre,
                *self._tuple_items(
                    keyword(call, "args") or (call.args[3] if len(call.args) > 3 else None)
                ),
            ]
            kwargs = [*kws, *self._dict_items(keyword(call, "kwargs"))]
            ctx = self._context_attr(call.func, "Process")
            method = self.file_start_method if ctx in (None, "default") else ctx
            out.append(
                Dispatch(
                    Via.PROCESS,
                    call,
                    fn,
                    None,
                    self.bind(fn, args, kwargs, skip),
                    recv,
                    method if method != "unknown" else None,
                    self._repeated(call),
                )
            )
        for call in m.calls_to(*SPAWN):
            target = call.args[0] if call.args else keyword(call, "fn")
            fn, skip, pre, kws, recv = self._callable(target)
            if fn is None:
                continue
            args = [
                *pre,
                *self._tuple_items(
                    keyword(call, "args") or (call.args[1] if len(call.args) > 1 else None)
                ),
            ]
            method = _literal_str(keyword(call, "start_method")) or (
                "spawn" if keyword(call, "start_method") is None else None
            )
            # the worker's first parameter is its rank
            out.append(
                Dispatch(
                    Via.SPAWN,
                    call,
                    fn,
                    None,
                    self.bind(fn, args, kws, skip + 1),
                    recv,
                    method,
                    True,
                )
            )
        out.extend(self._pool_dispatches("pool"))
        return sorted(out, key=lambda d: _pos(d.call))

    @cached_property
    def thread_dispatches(self) -> list[Dispatch]:
        out = []
        for call in self.model.calls_to(THREAD):
            target = keyword(call, "target") or (call.args[1] if len(call.args) > 1 else None)
            fn, skip, pre, kws, recv = self._callable(target)
            if fn is None:
                continue
            args = [
                *pre,
                *self._tuple_items(
                    keyword(call, "args") or (call.args[3] if len(call.args) > 3 else None)
                ),
            ]
            kwargs = [
                *kws,
                *self._dict_items(
                    keyword(call, "kwargs") or (call.args[4] if len(call.args) > 4 else None)
                ),
            ]
            out.append(
                Dispatch(
                    Via.THREAD,
                    call,
                    fn,
                    None,
                    self.bind(fn, args, kwargs, skip),
                    recv,
                    None,
                    self._repeated(call),
                    self._joined_at_once(call),
                )
            )
        out.extend(self._pool_dispatches("threadpool"))
        out.extend(self._thread_subclass_dispatches())
        return sorted(out, key=lambda d: _pos(d.call))

    def _thread_subclass_dispatches(self) -> list[Dispatch]:
        """``class Worker(threading.Thread)`` with a ``run()``: each ``Worker(...)`` built
        in this file runs ``run`` on a thread of its own; its arguments reach ``run``
        as the ``self`` attributes ``__init__`` stores them in (``args`` holds them as
        ``self.model`` -> caller expression). Built only in other files of the project,
        the call sites there say which attributes every instance shares."""
        m = self.model
        out: list[Dispatch] = []
        for cls in m.classes:
            methods = m.methods(cls)
            run = methods.get("run")
            if run is None or not self.is_thread_class(cls):
                continue
            init = methods.get("__init__")
            stored = self._stored_params(init) if init is not None else {}
            sites = [c for c in m.calls.get(cls.name, ()) if self.resolve_def(c.func) is cls]
            for call in sites:
                bound = (
                    self.bind(init, list(call.args), list(call.keywords), 1)
                    if (init is not None)
                    else ()
                )
                attrs = tuple((attr, expr) for p, expr in bound for attr in stored.get(p, ()))
                out.append(
                    Dispatch(
                        Via.THREAD,
                        call,
                        run,
                        None,
                        attrs,
                        None,
                        None,
                        self._repeated(call),
                        self._joined_at_once(call),
                    )
                )
            if sites or init is None or m.scope_of(cls) is not m.tree:
                continue
            view = getattr(m, "project", None) or {}
            facts = view.get("params", {}).get(f"{cls.name}.__init__", {})
            shared = tuple(
                (attr, fact[0] == Role.MODEL.value)
                for p, fact in sorted(facts.items())
                if len(fact) > 4 and fact[4]
                for attr in stored.get(p, ())
            )
            if shared:
                site = ast.copy_location(ast.Call(ast.Name(cls.name, ast.Load()), [], []), cls)
                out.append(
                    Dispatch(Via.THREAD, site, run, None, (), None, None, True, shared_attrs=shared)
                )
        return out

    def is_thread_class(self, cls: ast.ClassDef, seen: frozenset[int] = frozenset()) -> bool:
        """``cls`` subclasses ``threading.Thread``: directly, through a class of this file,
        or through a project class another module defines (the index says so); an
        inheritance cycle or a base that cannot be resolved says no."""
        if id(cls) in seen:
            return False
        view = getattr(self.model, "project", None) or {}
        for base in cls.bases:
            qual = self.model.qualname(base)
            if qual == THREAD or (
                qual is not None and (view.get("refs", {}).get(qual) or [""])[0] == "thread"
            ):
                return True
            found = self.resolve_def(base)
            if isinstance(found, ast.ClassDef) and self.is_thread_class(found, seen | {id(cls)}):
                return True
        return False

    def _stored_params(self, init: FunctionNode) -> dict[str, list[str]]:
        """``__init__`` parameter -> the ``self.x`` names it is stored in."""
        params = set(params_of(init)) - {"self"}
        out: dict[str, list[str]] = {}
        for node in walk_local(init):
            if not isinstance(node, ast.Assign):
                continue
            for t in node.targets:
                pairs = (
                    list(zip(t.elts, node.value.elts, strict=False))
                    if isinstance(t, ast.Tuple) and isinstance(node.value, ast.Tuple)
                    else [(t, node.value)]
                )
                for target, value in pairs:
                    name = dotted(target) if isinstance(target, ast.Attribute) else None
                    value = self.unwrap(value)
                    if (
                        name is not None
                        and name.startswith("self.")
                        and name.count(".") == 1
                        and isinstance(value, ast.Name)
                        and value.id in params
                    ):
                        out.setdefault(value.id, []).append(name)
        return out

    def _pool_dispatches(self, kind: str) -> list[Dispatch]:
        out = []
        for method, style in _POOL_METHODS.items():
            for call in self.model.calls.get(method, ()):
                func = call.func
                if not isinstance(func, ast.Attribute) or not call.args:
                    continue
                held = self.held(func.value) or (
                    self._object_of(func.value) if isinstance(func.value, ast.Call) else None
                )
                if held is None or held[0] != kind:
                    continue
                fn, skip, pre, kws, recv = self._callable(call.args[0])
                if fn is None:
                    continue
                rest = call.args[1:]
                args: list[ast.expr] = list(pre)
                kwargs: list[ast.keyword] = list(kws)
                repeated = self._repeated(call)
                if style == "map":
                    repeated = True
                    for iterable in rest:
                        items = _elements(self.model, iterable)
                        if not items or not self._all_same(items):
                            break
                        args.append(items[0])
                elif style == "starmap" and rest:
                    items = _elements(self.model, rest[0])
                    if items and self._all_same(items):
                        args.extend(self._tuple_items(items[0]))
                    repeated = True
                elif style == "apply":
                    args.extend(
                        self._tuple_items(keyword(call, "args") or (rest[0] if rest else None))
                    )
                    kwargs.extend(
                        self._dict_items(
                            keyword(call, "kwds") or (rest[1] if len(rest) > 1 else None)
                        )
                    )
                else:  # submit(f, *args, **kwargs)
                    args.extend(rest)
                    kwargs.extend(k for k in call.keywords if k.arg is not None)
                serial = (len(held) > 1 and held[1] == 1) or self._joined_at_once(call)
                via = Via.POOL if kind == "pool" else Via.THREAD_POOL
                out.append(
                    Dispatch(
                        via,
                        call,
                        fn,
                        None,
                        self.bind(fn, args, kwargs, skip),
                        recv,
                        None,
                        repeated,
                        serial,
                    )
                )
        return out

    def _all_same(self, items: list[ast.expr]) -> bool:
        names = {dotted(i) for i in items}
        return len(names) == 1 or len(items) == 1

    @cached_property
    def file_start_method(self) -> str | None:
        """ "spawn" when the file selects spawn or forkserver anywhere (SPEC: not reported
        then), "fork" when it selects nothing else, None when the choice is not a literal."""
        methods: set[str] = set()
        for call in self.model.calls_to(SET_START_METHOD, GET_CONTEXT):
            arg = call.args[0] if call.args else keyword(call, "method")
            if arg is None:
                continue  # get_context(): the default context
            value = _literal_str(arg)
            if value is None:
                return None
            methods.add(value)
        if methods & {"spawn", "forkserver"}:
            return "spawn"
        return "fork"

    # -- how a dispatch runs ----------------------------------------------------------------
    def _repeated(self, call: ast.Call) -> bool:
        for anc in self.model.ancestors(call):
            if isinstance(anc, _COMPREHENSIONS):
                return True
            if isinstance(anc, NESTED_SCOPES):
                break
        return bool(self.model.loop_contexts(call))

    def repeated_at_once(self, call: ast.Call) -> bool:
        """``call`` runs several times (a loop, a comprehension) and no iteration waits
        for what it started before the next begins."""
        return self._repeated(call) and not self._joined_at_once(call)

    def _joined_at_once(self, call: ast.Call) -> bool:
        """The worker is waited for in the same iteration that starts it."""
        m = self.model
        parent = m.parent_of(call)
        if isinstance(parent, ast.Attribute) and parent.attr in ("result", "get", "join"):
            return True
        stmt = m.statement_of(call)
        if not (
            isinstance(stmt, ast.Assign)
            and stmt.value is call
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
        ):
            return False
        name = stmt.targets[0].id
        loops = m.enclosing_loops(call)
        if not loops:
            return False
        region = loops[0]
        for wait in ("join", "result", "get"):
            for other in m.calls.get(wait, ()):
                recv = other.func.value if isinstance(other.func, ast.Attribute) else None
                if (
                    isinstance(recv, ast.Name)
                    and recv.id == name
                    and any(a is region for a in m.ancestors(other))
                ):
                    return True
        return False

    def same_object(self, arg: ast.AST) -> bool:
        """Is ``arg`` the same object every time its dispatch runs: a name that no loop or
        comprehension around it rebinds (not ``Net()``, not the loop variable)?"""
        m = self.model
        name = dotted(arg) if isinstance(arg, (ast.Name, ast.Attribute)) else None
        if name is None:
            return False
        root = name.split(".", 1)[0]
        for anc in m.ancestors(arg):  # `target=lambda: f(model)`: judged where the lambda is
            if isinstance(anc, ast.Lambda):
                arg = anc
            elif isinstance(anc, NESTED_SCOPES):
                break
        for anc in m.ancestors(arg):
            if isinstance(anc, NESTED_SCOPES):
                break
            if isinstance(anc, _COMPREHENSIONS):
                if any(root in _target_names(g.target) for g in anc.generators):
                    return False
        for loop in m.enclosing_loops(arg):
            if isinstance(loop, (ast.For, ast.AsyncFor)) and root in _target_names(loop.target):
                return False
            for sub in walk_local(loop):
                if isinstance(sub, ast.Assign) and any(
                    root in _target_names(t) for t in sub.targets
                ):
                    return False
                if isinstance(sub, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) and (
                    root in _target_names(sub.target)
                ):
                    return False
                if isinstance(sub, (ast.With, ast.AsyncWith)) and any(
                    i.optional_vars is not None and root in _target_names(i.optional_vars)
                    for i in sub.items
                ):
                    return False
        return True

    # -- what the other side trains ---------------------------------------------------------
    def trained(self, fn: FunctionNode) -> dict[str, Touch]:
        """Optimizers ``fn`` steps and models those optimizers hold, in ``fn``'s naming."""
        cached = self._trained.get(id(fn))
        if cached is not None:
            return cached
        self._trained[id(fn)] = {}  # recursion guard
        out: dict[str, Touch] = {}
        for ev in self.events(fn, Kind.STEP):
            for touch in self.step_touches(fn, ev):
                out.setdefault(touch.name, touch)
        self._trained[id(fn)] = out
        return out

    def events(self, fn: FunctionNode, *kinds: Kind) -> list[Event]:
        """Step events of ``fn`` (helpers inlined), one per node and call chain."""
        paths, _ = self.model.steps.function_paths(fn)
        seen: dict[tuple[int, ...], Event] = {}
        for path in paths:
            for ev in path:
                if ev.kind in kinds:
                    seen.setdefault((id(ev.node), *(id(c) for c in ev.chain)), ev)
        return sorted(seen.values(), key=lambda e: _pos(e.chain[0] if e.chain else e.node))

    def step_touches(self, fn: FunctionNode, ev: Event) -> list[Touch]:
        """The optimizer a STEP event steps and the models it holds, named in ``fn``."""
        chain = ev.chain
        fs: list[FunctionNode] = [fn]
        for site in chain:
            callee = self.model.resolve_call(site)
            if callee is None:
                return []
            fs.append(callee)
        expr = _stepped(ev)
        level = len(chain)
        out: list[Touch] = []
        while expr is not None:
            for cand in (expr, *self._owners(expr)):
                touch = self._lift(cand, level, fs, chain)
                if touch is not None:
                    out.append(touch)
            # Seen from the caller, the optimizer may be bound there with known owners.
            name = dotted(expr)
            if level == 0 or name is None or "." in name or name not in params_of(fs[level]):
                break
            expr = self.argument_for(chain[level - 1], fs[level], name)
            expr = self.unwrap(expr) if expr is not None else None
            level -= 1
        return out

    def _owners(self, expr: ast.expr) -> list[ast.expr]:
        binding = self.roles.lookup(expr)
        if binding is None or binding.role is not Role.OPTIMIZER or binding.call is None:
            return []
        return parameter_owners(binding.call)

    def local_to(self, node: ast.AST, fn: ast.AST) -> bool:
        """Is the name at the root of ``node`` bound in ``fn`` (a parameter or a local)?"""
        root = _root_name(node)
        if root is None:
            return True
        if root.id in ("self", "cls"):
            return True
        key = self.roles.key(root)
        return key is not None and key[1] == id(fn)

    def _lift(
        self, node: ast.expr, level: int, fs: list[FunctionNode], chain: tuple[ast.Call, ...]
    ) -> Touch | None:
        """Rename ``node`` (valid in ``fs[level]``) into ``fs[0]``'s terms through the call
        sites of ``chain``; None for a helper's own local."""
        name = dotted(node)
        if name is None:
            return None
        home = self.model.function_of(node)
        if home is not fs[level] and not name.startswith(("self.", "cls.")):
            # Seen in another function (an optimizer built in __init__ from its parameter):
            # only a module global or closure variable means the same object here.
            if home is None or not self.local_to(node, home):
                return Touch(name, node)
            return None
        for _ in range(32):
            fn = fs[level]
            if name.startswith(("self.", "cls.")):
                if level == 0:
                    return Touch(name, node)
                site = chain[level - 1]
                if not (
                    isinstance(site.func, ast.Attribute)
                    and isinstance(site.func.value, ast.Name)
                    and site.func.value.id in ("self", "cls")
                ):
                    return None  # another object's attribute
                level -= 1
                continue
            if not self.local_to(node, fn):
                return Touch(name, node)  # a global or closure: one object at every level
            root, _, rest = name.partition(".")
            if root not in params_of(fn):
                # `ddp = DDP(model)`, `net = model.to(dev)`: a local alias of another name
                alias = self._alias(node)
                base = dotted(alias) if alias is not None else None
                if alias is None or base is None:
                    return Touch(name, node) if level == 0 else None
                name = f"{base}.{rest}" if rest else base
                node = alias
                continue
            if level == 0:
                return Touch(name, node)
            arg = self.argument_for(chain[level - 1], fn, root)
            if arg is None:
                return None
            arg = self.unwrap(arg)
            base = dotted(arg)
            if base is None:
                return None
            name = f"{base}.{rest}" if rest else base
            node = arg
            level -= 1
        return None

    def _alias(self, node: ast.AST) -> ast.expr | None:
        """The name/attribute a local was last assigned from, through pass-through calls."""
        root = _root_name(node)
        if root is None:
            return None
        found = self.model.flow.definition(root.id, root)
        if found is None:
            return None
        stmt, value = found
        if not isinstance(stmt, (ast.Assign, ast.AnnAssign)) or not isinstance(value, ast.expr):
            return None
        value = self.unwrap(value)
        return value if isinstance(value, (ast.Name, ast.Attribute)) else None

    def argument_for(self, site: ast.Call, fn: FunctionNode, param: str) -> ast.expr | None:
        """The caller's expression that ``fn``'s parameter ``param`` receives at ``site``."""
        bound_method = isinstance(site.func, ast.Attribute) and self.model.class_of(fn) is not None
        skip = 1 if bound_method and not _is_static(fn) else 0
        for name, arg in self.bind(fn, list(site.args), site.keywords, skip):
            if name == param:
                return arg
        return None

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

    def trained_params(self, d: Dispatch) -> set[str]:
        """Parameters of the dispatched function whose object the other side trains."""
        if d.via is Via.ACTOR:
            if d.actor is None:
                return set()
            return self.actor_trained(d.actor) | self.trained_alongside(d)
        if d.target is None:
            return set()
        params = set(params_of(d.target))
        trained = self.trained(d.target).values()
        out = {t.root for t in trained if t.root in params}
        if d.via is Via.REMOTE:
            out |= self.trained_alongside(d)
        if d.via is Via.RAY_TRAIN:
            for t in trained:
                entry = self.config_entry(d.target, t.node)
                if entry is not None:
                    out.add(entry)
        return out

    def trained_objects(self, d: Dispatch, *, through_put: bool) -> list[ast.expr]:
        """The caller's models/optimizers that the dispatched function trains."""
        trained = self.trained_params(d)
        out = []
        for param, arg in d.args:
            if param in trained:
                obj = self.sent_object(arg, through_put=through_put)
                if obj is not None:
                    out.append(obj)
        return out

    def trained_on_a_copy(self, d: Dispatch, runs: ast.Call, *, through_put: bool) -> set[str]:
        """Names of the caller's models/optimizers that ``d`` trains on a pickled copy and
        the caller reads after ``runs`` (the dispatch, or the ``fit()`` that runs it) without
        loading weights back or rebinding them; empty when nothing is left behind."""
        sent = self.trained_objects(d, through_put=through_put)
        if not sent:
            return set()
        names = self.caller_names(sent)
        if self.loaded_back(runs, names) or not self.used_after(runs, names, loops=True):
            return set()
        return names

    def trained_alongside(self, d: Dispatch) -> set[str]:
        """Parameters that receive a model the caller knows as one (built there, annotated
        ``nn.Module``, or a model at every call site through the project index) when the
        other side steps an optimizer that is itself a parameter (for an actor: one its
        ``__init__`` stores on ``self``): which models that optimizer holds cannot be
        told, so a model it runs forward on with autograd recording, in a function that
        backpropagates, counts as the one the step trains."""
        if d.via is Via.ACTOR and d.actor is not None:
            methods = self.model.methods(d.actor)
            init = methods.get("__init__")
            stored = self._stored_params(init) if init is not None else {}
            names = {p: stored.get(p, []) for p, _ in d.args}
            fns = [f for f in methods.values() if f is not init]
        elif d.target is not None:
            names = {p: [p] for p in params_of(d.target)}
            fns = [d.target]
        else:
            return set()
        received = {n for ns in names.values() for n in ns}
        if not any(
            len(ts) == 1 and ts[0].name in received
            for f in fns
            for ts in (self.step_touches(f, ev) for ev in self.events(f, Kind.STEP))
        ):
            return set()  # no step, or one whose optimizer's models are known
        learning = [f for f in fns if self.events(f, Kind.BACKWARD)]
        out = set()
        for param, arg in d.args:
            obj = self.sent_object(arg, through_put=False)
            if obj is None or self.roles.role(obj) is not Role.MODEL:
                continue
            if any(
                self._forwards(f, call, name)
                for name in names.get(param, ())
                for f in learning
                for call in walk_local(f)
            ):
                out.add(param)
        return out

    def _forwards(self, fn: FunctionNode, call: ast.AST, name: str) -> bool:
        """``call`` is ``name(x)`` / ``name.forward(x)`` in ``fn`` with autograd on, where
        ``name`` is ``fn``'s own parameter or a ``self`` attribute."""
        if not isinstance(call, ast.Call):
            return False
        func = call.func
        target = func.value if isinstance(func, ast.Attribute) and func.attr == "forward" else func
        if dotted(target) != name or not isinstance(target, (ast.Name, ast.Attribute)):
            return False
        if isinstance(target, ast.Name) and not self.local_to(target, fn):
            return False
        return grad_enabled_at(self.model, call)[0]

    def actor_trained(self, cls: ast.ClassDef) -> set[str]:
        """``__init__`` parameters of an actor whose objects some method trains: stored on
        ``self`` and stepped (or held by an optimizer that is stepped) by any method."""
        methods = self.model.methods(cls)
        init = methods.get("__init__")
        if init is None:
            return set()
        params = set(params_of(init)) - {"self", "cls"}
        names: set[str] = set()
        for method in methods.values():
            names.update(self.trained(method))
        out = {n.split(".", 1)[0] for n in names if n.split(".", 1)[0] in params}
        attrs = {n.split(".")[1] for n in names if n.startswith("self.") and n.count(".") >= 1}
        for node in walk_local(init):
            if not isinstance(node, ast.Assign):
                continue
            for t in node.targets:
                if not (
                    isinstance(t, ast.Attribute)
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "self"
                    and t.attr in attrs
                ):
                    continue
                value = self.unwrap(node.value)
                if isinstance(value, ast.Name) and value.id in params:
                    out.add(value.id)
                elif isinstance(value, ast.Call):
                    for owner in parameter_owners(value):
                        root = _root_name(owner)
                        if root is not None and root.id in params:
                            out.add(root.id)
        return out

    def copies_before_training(self, fn: FunctionNode, param: str) -> ast.Call | None:
        """``param.to(device)``/``param.cuda()`` in ``fn`` before its first backward/step:
        the worker trains a new tensor, not the one it received."""
        events = self.events(fn, Kind.BACKWARD, Kind.STEP)
        if not events:
            return None
        first = min(_pos(e.chain[0] if e.chain else e.node) for e in events)
        for node in walk_local(fn):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in COPYING_METHODS
                and (node.args or node.keywords or node.func.attr != "to")
                and dotted(node.func.value) == param
                and _pos(node) < first
            ):
                return node
        return None

    # -- the caller's side --------------------------------------------------------------------
    def sent_object(self, arg: ast.expr, *, through_put: bool = True) -> ast.expr | None:
        """The caller's object an argument carries (``ray.put(model)`` followed), when the
        caller keeps a name for it and nothing says it is anything but a model or an
        optimizer. Callers ask only about parameters the other side trains, so an
        imported ``Net()`` with no local evidence counts by what is done to it there."""
        expr = self.unwrap(arg)
        if through_put:
            held = self.held(expr)
            if held is not None and held[0] == "put" and isinstance(held[1], ast.expr):
                expr = self.unwrap(held[1])
        if not isinstance(expr, (ast.Name, ast.Attribute)) or dotted(expr) is None:
            return None  # `Net()` built inline: the caller keeps no reference to it
        if self.held(expr) is not None:
            return None  # a pool, lock, object ref...: not a model
        if self.roles.role(expr) in (Role.MODEL, Role.OPTIMIZER, None):
            return expr
        return None

    def caller_names(self, sent: list[ast.expr]) -> set[str]:
        """Dotted names whose weights a dispatch was meant to change: the objects sent and
        the models a sent optimizer holds."""
        names = set()
        for expr in sent:
            name = dotted(expr)
            if name is not None:
                names.add(name)
            for owner in self._owners(expr):
                owner_name = dotted(self.unwrap(owner))
                if owner_name is not None:
                    names.add(owner_name)
        return names

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

    def _later_or_same_loop(self, call: ast.Call, node: ast.AST) -> bool:
        """``node`` runs after ``call``: later in the file, wraps it
        (``model.load_state_dict(ray.get(f.remote(model)))``), or shares its loop."""
        if _pos(node) > _pos(call) or any(a is node for a in self.model.ancestors(call)):
            return True
        loops = self.model.enclosing_loops(call)
        return bool(loops) and any(a is loops[0] for a in self.model.ancestors(node))

    def loaded_back(self, call: ast.Call, names: set[str]) -> bool:
        """After the dispatch (or in the same loop), the caller loads weights into one of
        ``names`` or rebinds it (``model = ray.get(ref)``)."""
        m = self.model
        scope = self._scope(call)
        for load in m.calls.get("load_state_dict", ()):
            if (
                isinstance(load.func, ast.Attribute)
                and self._scope(load) is scope
                and self._matches(dotted(self.unwrap(load.func.value)), names)
                and self._later_or_same_loop(call, load)
            ):
                return True
        stmt = m.statement_of(call)
        for node in self._assignments_by_scope().get(id(scope), ()):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if not any(
                names
                & {dotted(t) for t in ast.walk(tgt) if isinstance(t, (ast.Name, ast.Attribute))}
                for tgt in targets
            ):
                continue
            if node is stmt or self._later_or_same_loop(call, node):
                return True
        return False

    def used_after(self, call: ast.Call, names: set[str], *, loops: bool) -> bool:
        """The caller reads one of ``names`` after the dispatch. With ``loops``, a read
        elsewhere in the loop around the dispatch counts too (the next iteration sees
        the unchanged model); sending it again, to a remote or ``ray.put``, does not:
        a sweep deliberately gives every trial the same initial weights."""
        m = self.model
        enclosing = m.enclosing_loops(call)
        loop = enclosing[0] if loops and enclosing else None
        end = _end(m.statement_of(call))
        for node in walk_local(self._scope(call)):
            if not (
                isinstance(node, (ast.Name, ast.Attribute))
                and isinstance(node.ctx, ast.Load)
                and self._matches(dotted(node), names)
            ):
                continue
            if _pos(node) > end:
                return True
            if loop is not None and self._in_loop_not_resent(node, loop):
                return True
        return False

    def _in_loop_not_resent(self, node: ast.AST, loop: ast.AST) -> bool:
        inside = False
        for anc in self.model.ancestors(node):
            if isinstance(anc, ast.Call) and (
                call_name(anc) == "remote" or self.model.qualname(anc.func) == RAY_PUT
            ):
                return False
            if anc is loop:
                inside = True
                break
        return inside

    def shares_memory(self, names: set[str]) -> bool:
        """``model.share_memory()`` (or ``p.share_memory_()`` over its parameters), or a
        share on something this file cannot tell apart from it."""
        m = self.model
        for call in m.calls.get("share_memory", ()):
            func = call.func
            if not isinstance(func, ast.Attribute):
                continue
            recv = self.unwrap(func.value)
            if self._matches(dotted(recv), names):
                return True
            stmt = m.statement_of(call)
            if isinstance(stmt, ast.Assign) and any(
                self._matches(dotted(t), names) for t in stmt.targets
            ):
                return True  # model = Net().share_memory()
            root = _root_name(recv)
            if root is not None and root.id in params_of(m.function_of(call) or m.tree):
                return True  # a helper sharing whatever it is given
        for call in m.calls.get("share_memory_", ()):
            for loop in m.enclosing_loops(call):
                if isinstance(loop, (ast.For, ast.AsyncFor)) and any(
                    isinstance(sub, ast.Attribute)
                    and sub.attr in ("parameters", "named_parameters")
                    and self._matches(dotted(sub.value), names)
                    for sub in ast.walk(loop.iter)
                ):
                    return True
        return False

    # -- threads -------------------------------------------------------------------------------
    def one_at_a_time(self, ds: list[Dispatch]) -> bool:
        """Dispatches of one function, none in a loop, where every worker but the last is
        waited for (``t1.join()``, ``f.result()``) in the same scope before the next one
        is created: however many there are, two never run at once."""
        if any(d.repeated for d in ds):
            return False
        m = self.model
        ordered = sorted(ds, key=lambda d: _pos(d.call))
        for first, then in zip(ordered, ordered[1:], strict=False):
            stmt = m.statement_of(first.call)
            if not (
                isinstance(stmt, ast.Assign)
                and stmt.value is first.call
                and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)
            ):
                return False
            name, scope = stmt.targets[0].id, self._scope(first.call)
            if self._scope(then.call) is not scope or not any(
                isinstance(c.func, ast.Attribute)
                and isinstance(c.func.value, ast.Name)
                and c.func.value.id == name
                and self._scope(c) is scope
                and _pos(first.call) < _pos(c) < _pos(then.call)
                for wait in ("join", "result")
                for c in m.calls.get(wait, ())
            ):
                return False
        return True

    def unlocked_training(
        self, fn: FunctionNode, ds: list[Dispatch]
    ) -> Iterator[tuple[ast.AST, str, str]]:
        """(node, what, on what) for each forward, backward and optimizer step that ``fn``,
        run by the thread dispatches ``ds``, makes on an object the threads share,
        outside ``with lock:``. Nothing when ``fn`` neither backpropagates nor steps
        (inference writes no parameters) or takes a lock by hand (``acquire()``)."""
        model = self.model
        events = self.events(fn, Kind.BACKWARD, Kind.STEP)
        if not events:
            return
        helpers = [
            fn,
            *(h for e in events for c in e.chain if (h := model.resolve_call(c)) is not None),
        ]
        if self.acquires(helpers):
            return  # manual acquire()/release(): the locked region cannot be told
        sharing = ThreadSharing(self, fn, ds)
        forwards = [
            (c, name)
            for c in walk_local(fn)
            if isinstance(c, ast.Call) and (name := sharing.forwarded(c)) is not None
        ]
        steps: list[tuple[Event, str]] = []
        held_models: list[str] = []
        for e in events:
            if e.kind is Kind.STEP:
                touches = self.step_touches(fn, e)
                shared = [t.name for t in touches if sharing.is_shared(t)]
                if shared:
                    steps.append((e, shared[0]))
                    # the models the optimizer holds name what a backward races on
                    held_models.extend(t.name for t in touches[1:] if sharing.is_shared(t))
        if not forwards and not steps:
            return
        label = f"`{(forwards[0][1] if forwards else (held_models or [steps[0][1]])[0])}`"
        step_names = {id(e): name for e, name in steps}
        found: list[tuple[ast.AST, str, str]] = [
            (call, "forward", f"`{name}`") for call, name in forwards if not self.under_lock(call)
        ]
        for e in events:
            if e.kind is Kind.STEP and id(e) not in step_names:
                continue
            if self.under_lock(e.node) or any(self.under_lock(c) for c in e.chain):
                continue
            if e.kind is Kind.BACKWARD:
                found.append((model.steps.anchor(e), "`backward()`", label))
            else:
                found.append((model.steps.anchor(e), "optimizer step", f"`{step_names[id(e)]}`"))
        yield from sorted(found, key=lambda f: _pos(f[0]))

    # -- locks ---------------------------------------------------------------------------------
    def is_lock(self, expr: ast.expr) -> bool:
        """A ``threading.Lock/RLock`` (or semaphore, condition) object; an unresolvable
        name spelled like one counts too, so that an unknown lock keeps the rule silent.
        A lock built in the ``with`` itself (``with threading.Lock():``) excludes nothing."""
        if isinstance(expr, ast.Call):
            if self.model.qualname(expr.func) in LOCKS:
                return False
            factory = dotted(expr.func) or ""
            return bool(_LOCK_WORDS.search(factory.rsplit(".", 1)[-1]))
        held = self.held(expr)
        if held is not None:
            return held[0] == "lock"
        if self.roles.lookup(expr) is not None:
            return False  # a model, optimizer, loader...: known not to be a lock
        name = dotted(expr)
        return name is not None and bool(_LOCK_WORDS.search(name.rsplit(".", 1)[-1]))

    def under_lock(self, node: ast.AST) -> bool:
        """Inside the body of ``with lock:`` within its own function."""
        child: ast.AST = node
        for anc in self.model.ancestors(node):
            if isinstance(anc, NESTED_SCOPES):
                return False
            if isinstance(anc, (ast.With, ast.AsyncWith)) and any(s is child for s in anc.body):
                if any(self.is_lock(item.context_expr) for item in anc.items):
                    return True
            child = anc
        return False

    def acquires(self, fns: list[FunctionNode]) -> bool:
        """Manual ``lock.acquire()``: the locked region cannot be told, so stay silent."""
        ids = {id(f) for f in fns}
        return any(
            id(self.model.function_of(c)) in ids for c in self.model.calls.get("acquire", ())
        )


def _stepped(ev: Event) -> ast.expr | None:
    """The optimizer expression of a STEP event: ``opt.step()``, ``scaler.step(opt)``,
    ``xm.optimizer_step(opt)``."""
    call = ev.node
    if not isinstance(call, ast.Call):
        return None
    name = call_name(call)
    if name == "step" and isinstance(call.func, ast.Attribute):
        if ev.scaled:
            return call.args[0] if call.args else None
        return call.func.value
    if name == "optimizer_step" and call.args:
        return call.args[0]
    return None


class ThreadSharing:
    """Which objects, named in a thread function's terms, every thread shares."""

    def __init__(self, esc: Escapes, fn: FunctionNode, ds: list[Dispatch]) -> None:
        self.esc = esc
        self.fn = fn
        self.params = set(params_of(fn))
        self.shared_params: set[str] = set()
        self.model_params: set[str] = set()
        for p in self.params:
            args = [d.arg(p) for d in ds]
            if any(a is None for a in args):
                continue
            exprs = [a for a in args if a is not None]
            if len({dotted(a) for a in exprs}) == 1 and all(esc.same_object(a) for a in exprs):
                self.shared_params.add(p)
                obj = esc.sent_object(exprs[0], through_put=False)
                if obj is not None and esc.roles.role(obj) is Role.MODEL:
                    self.model_params.add(p)
        # `self` attributes a Thread subclass's constructor stores its arguments in
        self.shared_attrs: set[str] = set()
        for attr in {n for d in ds for n, _ in d.args if n.startswith("self.")}:
            args = [d.arg(attr) for d in ds]
            exprs = [a for a in args if a is not None]
            if (
                len(exprs) == len(args)
                and len({dotted(a) for a in exprs}) == 1
                and all(esc.same_object(a) for a in exprs)
            ):
                self.shared_attrs.add(attr)
                obj = esc.sent_object(exprs[0], through_put=False)
                if obj is not None and esc.roles.role(obj) is Role.MODEL:
                    self.model_params.add(attr)
        for d in ds:
            for attr, is_model in d.shared_attrs:
                self.shared_attrs.add(attr)
                if is_model:
                    self.model_params.add(attr)
        receivers = [d.receiver for d in ds]
        self.self_shared = (
            all(r is not None for r in receivers)
            and len({dotted(r) for r in receivers if r is not None}) == 1
            and all(esc.same_object(r) for r in receivers if r is not None)
        )
        self.trained = esc.trained(fn)

    def is_shared(self, touch: Touch) -> bool:
        root = touch.root
        if root in ("self", "cls"):
            return self.self_shared or any(
                touch.name == a or touch.name.startswith(a + ".") for a in self.shared_attrs
            )
        if root in self.params:
            return root in self.shared_params
        # a module global or closure variable is one object for every thread
        return not self.esc.local_to(touch.node, self.fn)

    def forwarded(self, call: ast.Call) -> str | None:
        """The shared model ``call`` runs forward (``model(x)``, ``self.net.forward(x)``)
        with autograd recording, or None."""
        func = call.func
        target = func.value if isinstance(func, ast.Attribute) and func.attr == "forward" else func
        if not isinstance(target, (ast.Name, ast.Attribute)):
            return None
        name = dotted(target)
        if name is None or not self.is_shared(Touch(name, target)):
            return None
        # `model(x)` itself, not `model.parameters()` or `model.train()`
        is_model = (
            self.esc.roles.role(target) is Role.MODEL
            or name in self.trained
            or (name in self.model_params)
        )
        if not is_model or self.esc.roles.role(target) is Role.OPTIMIZER:
            return None
        if not grad_enabled_at(self.esc.model, call)[0]:
            return None  # inference under no_grad/inference_mode writes nothing
        return name
