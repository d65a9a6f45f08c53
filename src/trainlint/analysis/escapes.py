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

The analysis is one class built in layers, one module each: :mod:`escape_sites` (what
names hold), :mod:`escape_dispatches` (where work is handed over),
:mod:`escape_training` (what the target trains) and this module (sharing and locks).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

from trainlint.analysis.escape_dispatches import (
    POOL_METHODS,
    Dispatch,
    source_pos,
)
from trainlint.analysis.escape_sites import (  # (re-exported: the importers of escapes use them)
    LOCKS,
    PROCESS,
    SPAWN,
    Touch,
    Via,  # noqa: F401
    params_of,
    root_name,
)
from trainlint.analysis.escape_training import (
    EscapeTraining,
)
from trainlint.analysis.flow import grad_enabled_at
from trainlint.analysis.model import (
    NESTED_SCOPES,
    dotted,
    walk_local,
)
from trainlint.analysis.roles import Role
from trainlint.analysis.steps import Event, Kind

if TYPE_CHECKING:
    from trainlint.analysis.model import FileModel, FunctionNode

_LOCK_WORDS = re.compile(r"lock|mutex|sem(aphore)?$|^sem_|cond(ition)?$", re.IGNORECASE)


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
            for method in POOL_METHODS
            for c in calls.get(method, ())
        )
    )


class Escapes(EscapeTraining):
    """Dispatches of one file and what their targets train; computed lazily, once."""

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
            root = root_name(recv)
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
        ordered = sorted(ds, key=lambda d: source_pos(d.call))
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
                and source_pos(first.call) < source_pos(c) < source_pos(then.call)
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
        # forwards in `fn` and in the methods it reaches on the same `self`
        forwards = [
            (c, name, chain)
            for f, chain in self.self_helpers(fn)
            for c in walk_local(f)
            if isinstance(c, ast.Call)
            and (name := sharing.forwarded(c)) is not None
            and (f is fn or name.startswith("self."))
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
        found: list[tuple[ast.AST, str, str]] = []
        for e in events:
            if e.kind is Kind.STEP and id(e) not in step_names:
                continue
            if self.under_lock(e.node) or any(self.under_lock(c) for c in e.chain):
                continue
            if e.kind is Kind.BACKWARD:
                found.append((model.steps.anchor(e), "`backward()`", label))
            else:
                found.append((model.steps.anchor(e), "optimizer step", f"`{step_names[id(e)]}`"))
        if not found:
            # every backward and step holds the lock: a forward alone writes nothing shared
            # (gradients as values through `torch.autograd.grad`, applied under the lock)
            return
        unlocked = [
            (call, "forward", f"`{name}`")
            for call, name, chain in forwards
            if not self.under_lock(call) and not any(self.under_lock(c) for c in chain)
        ]
        yield from sorted([*unlocked, *found], key=lambda f: source_pos(f[0]))

    def self_helpers(
        self, fn: FunctionNode, depth: int = 3
    ) -> list[tuple[FunctionNode, tuple[ast.Call, ...]]]:
        """``fn`` and the methods it reaches through ``self.method(...)`` calls (up to
        ``depth`` calls deep, each method once: cycles cut), each with the calls leading
        to it: a thread target's helpers run on the same ``self``."""
        out: list[tuple[FunctionNode, tuple[ast.Call, ...]]] = [(fn, ())]
        seen = {id(fn)}
        frontier = out[:]
        for _ in range(depth):
            nxt = []
            for f, chain in frontier:
                for call, callee in self.model.callees(f):
                    func = call.func
                    if (
                        id(callee) in seen
                        or not isinstance(func, ast.Attribute)
                        or not isinstance(func.value, ast.Name)
                        or func.value.id != "self"
                    ):
                        continue
                    seen.add(id(callee))
                    nxt.append((callee, (*chain, call)))
            out.extend(nxt)
            frontier = nxt
        return out

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
