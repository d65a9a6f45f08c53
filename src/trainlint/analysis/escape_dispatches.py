"""Escape analysis, part two: where a function is handed to another worker.

:class:`EscapeDispatches` finds the dispatches of a file: Ray remotes and actors, Ray
Train trainers, ``multiprocessing`` processes and spawns, threads and thread
subclasses, process and thread pools, with how each runs (start method, repeated in
a loop, joined at once), each as a :class:`Dispatch`.
"""

from __future__ import annotations

import ast
from functools import cached_property
from typing import TYPE_CHECKING

from trainlint._record import Record
from trainlint.analysis.arguments import foreign_facts
from trainlint.analysis.arguments import parameter_names as params_of
from trainlint.analysis.arguments import positional_names as positional_params
from trainlint.analysis.escape_sites import (
    COMPREHENSIONS,
    GET_CONTEXT,
    PROCESS,
    SPAWN,
    THREAD,
    EscapeSites,
    Via,
    literal_str,
    root_name,
)
from trainlint.analysis.model import (
    NESTED_SCOPES,
    call_name,
    dotted,
    keyword,
    walk_local,
)
from trainlint.analysis.roles import Role

if TYPE_CHECKING:
    from trainlint.analysis.model import FileModel, FunctionNode

SET_START_METHOD = "multiprocessing.set_start_method"


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


# pool method -> how its arguments reach the function: "map" (one element per call),
# "starmap" (tuples unpacked), "apply" (args=, kwds=), "submit" (*args, **kwargs)
POOL_METHODS = {
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


def source_pos(node: ast.AST) -> tuple[int, int]:
    return (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))


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


class EscapeDispatches(EscapeSites):
    """The dispatches of one file (see the module docstring)."""

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
            free = [p for p in positional_params(fn)[skip + len(pre) :] if p not in taken]
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
        name = _bound_to_name(m, call)
        if name is None:
            return None
        scope = self._scope(call)
        fits = [
            c
            for c in m.calls.get("fit", ())
            if isinstance(c.func, ast.Attribute)
            and isinstance(c.func.value, ast.Name)
            and c.func.value.id == name
            and self._scope(c) is scope
            and source_pos(c) > source_pos(call)
        ]
        return min(fits, key=source_pos) if fits else None

    def config_entry(self, fn: FunctionNode, node: ast.AST) -> str | None:
        """``config["model"]`` when the local at the root of ``node`` was taken from an entry
        of ``fn``'s parameter ``config`` (``model = prepare_model(config["model"])``,
        ``config.get("model")``)."""
        params = set(params_of(fn))
        root = root_name(node)
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
                base, key = value.value, literal_str(value.slice)
            elif (
                isinstance(value, ast.Call)
                and call_name(value) == "get"
                and isinstance(value.func, ast.Attribute)
                and value.args
            ):
                base, key = value.func.value, literal_str(value.args[0])
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
            if word in _CHECKPOINT_WORDS and source_pos(node) > source_pos(call):
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
        for call in sorted(set(creations), key=source_pos):
            target = keyword(call, "target") or (call.args[1] if len(call.args) > 1 else None)
            fn, skip, pre, kws, recv = self._process_callable(target)
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
            fn, skip, pre, kws, recv = self._process_callable(target)
            if fn is None:
                continue
            args = [
                *pre,
                *self._tuple_items(
                    keyword(call, "args") or (call.args[1] if len(call.args) > 1 else None)
                ),
            ]
            method = literal_str(keyword(call, "start_method")) or (
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
        return sorted(out, key=lambda d: source_pos(d.call))

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
        return sorted(out, key=lambda d: source_pos(d.call))

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
            facts = foreign_facts(m, init)  # what other files' constructions pass
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
        for method, style in POOL_METHODS.items():
            for call in self.model.calls.get(method, ()):
                func = call.func
                if not isinstance(func, ast.Attribute) or not call.args:
                    continue
                held = self.held(func.value) or (
                    self._object_of(func.value) if isinstance(func.value, ast.Call) else None
                )
                if held is None or held[0] != kind:
                    continue
                fn, skip, pre, kws, recv = (
                    self._process_callable(call.args[0])
                    if kind == "pool"
                    else self._callable(call.args[0])
                )
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
            value = literal_str(arg)
            if value is None:
                return None
            methods.add(value)
        if methods & {"spawn", "forkserver"}:
            return "spawn"
        return "fork"

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
        name = _bound_to_name(m, call)
        if name is None:
            return False
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
            if isinstance(anc, COMPREHENSIONS):
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


def _bound_to_name(m: FileModel, call: ast.Call) -> str | None:
    """The name ``call``'s result is bound to (``name = call``), None for any other use."""
    stmt = m.statement_of(call)
    if (
        isinstance(stmt, ast.Assign)
        and stmt.value is call
        and len(stmt.targets) == 1
        and isinstance(stmt.targets[0], ast.Name)
    ):
        return stmt.targets[0].id
    return None
