"""Escape analysis, part three: what a dispatched function trains, and on which object.

:class:`EscapeTraining` tells which of a target's parameters (and ``self`` attributes,
and globals) it trains, followed through same-file helpers, which caller objects those
are, and whether the caller loads weights back or uses the object after the dispatch.
"""

from __future__ import annotations

import ast
from functools import cached_property
from typing import TYPE_CHECKING

from trainlint.analysis.arguments import argument_at
from trainlint.analysis.escape_dispatches import (
    Dispatch,
    EscapeDispatches,
    source_pos,
)
from trainlint.analysis.escape_sites import (
    RAY_PUT,
    Touch,
    Via,
    params_of,
    root_name,
)
from trainlint.analysis.escape_targets import facts_of
from trainlint.analysis.flow import grad_enabled_at
from trainlint.analysis.model import (
    call_name,
    dotted,
    walk_local,
)
from trainlint.analysis.roles import Role, parameter_owners
from trainlint.analysis.steps import Event, Kind
from trainlint.analysis.torch_table import COPYING_METHODS

if TYPE_CHECKING:
    from trainlint.analysis.model import FunctionNode


def _end(node: ast.AST) -> tuple[int, int]:
    return (getattr(node, "end_lineno", 0) or 0, getattr(node, "end_col_offset", 0) or 0)


class EscapeTraining(EscapeDispatches):
    """What dispatched targets train, and what the caller does with those objects."""

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

    # -- what the other side trains ---------------------------------------------------------
    def trained(self, fn: FunctionNode) -> dict[str, Touch]:
        """Optimizers ``fn`` steps and models those optimizers hold, in ``fn``'s naming."""
        cached = self._trained.get(id(fn))
        if cached is not None:
            return cached
        facts = facts_of(fn)
        if facts is not None:  # another module's function: its summary says
            self._trained[id(fn)] = {
                p: Touch(p, ast.Name(id=p, ctx=ast.Load())) for p in facts.get("trains", ())
            }
            return self._trained[id(fn)]
        self._trained[id(fn)] = {}  # recursion guard
        out: dict[str, Touch] = {}
        for ev in self.events(fn, Kind.STEP):
            for touch in self.step_touches(fn, ev):
                out.setdefault(touch.name, touch)
        self._trained[id(fn)] = out
        return out

    def events(self, fn: FunctionNode, *kinds: Kind) -> list[Event]:
        """Step events of ``fn`` (helpers inlined), one per node and call chain."""
        if facts_of(fn) is not None:
            return []  # another module's function: no body here
        paths, _ = self.model.steps.function_paths(fn)
        seen: dict[tuple[int, ...], Event] = {}
        for path in paths:
            for ev in path:
                if ev.kind in kinds:
                    seen.setdefault((id(ev.node), *(id(c) for c in ev.chain)), ev)
        return sorted(seen.values(), key=lambda e: source_pos(e.chain[0] if e.chain else e.node))

    def step_touches(self, fn: FunctionNode, ev: Event) -> list[Touch]:
        """The optimizer a STEP event steps and the models it holds, named in ``fn``."""
        chain = ev.chain
        fs: list[FunctionNode] = [fn]
        for site in chain:
            callee = self.model.resolve_call(site)
            if callee is None:
                return []
            fs.append(callee)
        expr = stepped_optimizer(ev)
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
        root = root_name(node)
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
        return argument_at(self.model, site, fn, param)

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
            out |= self.trained_alongside(d) | self._forwarded_models(d)
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

    def _forwarded_models(self, d: Dispatch) -> set[str]:
        """:meth:`trained_alongside` for another module's function: the parameters its
        summary says it runs forward beside a step on an optimizer it received, where
        the argument is known here as a model."""
        facts = facts_of(d.target) if d.target is not None else None
        out = set()
        for param, arg in d.args:
            if facts is not None and param in facts.get("forwards", ()):
                obj = self.sent_object(arg, through_put=False)
                if obj is not None and self.roles.role(obj) is Role.MODEL:
                    out.add(param)
        return out

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
                        root = root_name(owner)
                        if root is not None and root.id in params:
                            out.add(root.id)
        return out

    def copies_before_training(self, fn: FunctionNode, param: str) -> ast.Call | None:
        """``param.to(device)``/``param.cuda()`` in ``fn`` before its first backward/step:
        the worker trains a new tensor, not the one it received."""
        events = self.events(fn, Kind.BACKWARD, Kind.STEP)
        if not events:
            return None
        first = min(source_pos(e.chain[0] if e.chain else e.node) for e in events)
        for node in walk_local(fn):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in COPYING_METHODS
                and (node.args or node.keywords or node.func.attr != "to")
                and dotted(node.func.value) == param
                and source_pos(node) < first
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

    def _later_or_same_loop(self, call: ast.Call, node: ast.AST) -> bool:
        """``node`` runs after ``call``: later in the file, wraps it
        (``model.load_state_dict(ray.get(f.remote(model)))``), or shares its loop."""
        if source_pos(node) > source_pos(call) or any(
            a is node for a in self.model.ancestors(call)
        ):
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
            if source_pos(node) > end:
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


def stepped_optimizer(ev: Event) -> ast.expr | None:
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
