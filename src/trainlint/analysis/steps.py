"""Training-step structure: step events, step loops, iteration paths, rate-limit guards.

For every loop that performs a backward or an optimizer step (directly, in a nested
loop, or through same-file helpers), the model lists the *paths* one iteration can
take through its body: sequences of step events (backward, optimizer step,
zero-grad, gradient read or clip, scheduler step, scaler unscale/update) in program
order. ``if``/``else`` branches fork paths; ``continue``/``break``/``return`` end
them; helpers are inlined, each event remembering the call sites it came through so
rules can report where SPEC §7 says. Rules then read like sentences over paths.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from functools import cached_property
from typing import TYPE_CHECKING

from trainlint.analysis.flow import Taint
from trainlint.analysis.hooks import ANSWERS
from trainlint.analysis.model import (
    LOOP_NODES,
    NESTED_SCOPES,
    call_name,
    dotted,
    keyword,
    postorder,
    walk_local,
)
from trainlint.analysis.roles import Role, Roles, is_module_class
from trainlint.analysis.step_branches import (  # (re-exported: the importers of steps use them)
    after_limiting_exit,  # noqa: F401
    off_training_branch,  # noqa: F401
    rebuilds_model,  # noqa: F401
)
from trainlint.analysis.step_events import (  # (re-exported: the importers of steps use them)  # (re-exported: the importers of steps use them)
    EPOCH_FUNCTION_NAMES,  # noqa: F401
    FLAG_COUNTER,  # noqa: F401
    FLAG_LOGGING,  # noqa: F401
    MAX_INLINE_DEPTH,
    STEP_FUNCTION_NAMES,
    STEP_LOOP_TRIGGERS,  # noqa: F401
    Event,
    Kind,
    Loop,
    Path,
    StepLoop,
    backpropagated,  # noqa: F401
    backward_calls,  # noqa: F401
    backward_value,  # noqa: F401
    graph_uses,  # noqa: F401
    is_backward,
    is_counter_guard,
    is_logging_guard,
)
from trainlint.analysis.step_paths import (  # (re-exported: the importers of steps use them)
    CALLEES,
    EVENT_NODES,
    Foreign,
    NodeEvent,
    PathWalker,
    condition_literal,  # noqa: F401
)

if TYPE_CHECKING:
    from trainlint.analysis.model import FileModel, FunctionNode


def _is_inf(node: ast.AST | None) -> bool:
    if node is None:
        return False
    if isinstance(node, ast.Call) and call_name(node) == "float" and node.args:
        a = node.args[0]
        return isinstance(a, ast.Constant) and str(a.value).lower() in ("inf", "+inf", "infinity")
    if isinstance(node, ast.Attribute) and node.attr == "inf":
        return True
    if isinstance(node, ast.Name) and node.id == "inf":
        return True
    return False


_EVENT_CALLS = {
    "backward",
    "manual_backward",
    "step",
    "optimizer_step",
    "zero_grad",
    "eval",
    "train",
    "unscale_",
    "update",
    "clip_grad_norm_",
    "clip_grad_value_",
    "clip_grad_norm",
    "clip_gradients",
    "clip_grads_with_norm_",
    "get_total_norm",
}
_CLIP_NAMES = {
    "clip_grad_norm_",
    "clip_grad_value_",
    "clip_grad_norm",
    "clip_gradients",
    "clip_grads_with_norm_",
}
#: the methods whose calls `classify` may make a BACKWARD or STEP event (a bare name may be
#: an alias of torch's, so only attribute calls are screened by name)
_OWN_STEP_METHODS = frozenset({"backward", "manual_backward", "step", "optimizer_step"})
#: the nodes walk_local does not enter (that can hold a call)
_LOCAL_STOPS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_READ_NAMES = {"get_total_norm", "get_grad_norm", "grad_norm"}
_ZEROING_METHODS = {"zero_", "detach_", "requires_grad_", "fill_"}


class StepModel:
    """Step loops of one file with their iteration paths; built lazily, once."""

    def __init__(self, model: FileModel) -> None:
        self.model = model
        self._fn_paths: dict[int, tuple[list[Path], bool]] = {}
        self._in_progress: set[int] = set()
        self._own_step: dict[int, bool] = {}
        self.test_keys: dict[int, tuple[str, bool]] = {}  # If node id -> its condition
        self._may_train_cache: dict[int, bool] = {}
        self._node_events_cache: dict[int, list[NodeEvent]] = {}

    @property
    def roles(self) -> Roles:
        """The file's roles, built when a question needs them: the cheap ones
        (``_may_train``) do not."""
        return self.model.roles

    # -- event classification --------------------------------------------------------
    def classify(self, node: ast.AST) -> Event | None:
        """The event a single node is, if any (no chain/guards yet)."""
        m = self.model
        if isinstance(node, ast.Call):
            name = call_name(node)
            func = node.func
            if isinstance(func, ast.Name) and name not in _CLIP_NAMES:
                qual = m.qualname(func)  # `from torch.nn.utils import clip_grad_norm_ as clip`
                if qual is not None and qual.startswith("torch."):
                    name = qual.rsplit(".", 1)[-1]
            if name in ("backward", "manual_backward") and is_backward(m, node):
                return Event(Kind.BACKWARD, node)
            if name == "zero_grad" and isinstance(func, ast.Attribute):
                return Event(Kind.ZERO, node, dotted(func.value) or "<expr>")
            if (
                name in _ZEROING_METHODS
                and isinstance(func, ast.Attribute)
                and _mentions_grad(func.value)
                and name != "requires_grad_"
            ):
                return Event(Kind.ZERO, node, None)
            if name == "step" and isinstance(func, ast.Attribute):
                recv = func.value
                role = self.roles.role(recv, by_name=True)
                if role is Role.OPTIMIZER:
                    return Event(Kind.STEP, node, dotted(recv) or "<expr>")
                if role is Role.SCALER and node.args:
                    return Event(Kind.STEP, node, dotted(node.args[0]) or "<expr>", scaled=True)
                if role is Role.SCHEDULER:
                    return Event(Kind.SCHED, node, dotted(recv) or "<expr>")
                return None
            if name == "optimizer_step" and node.args:
                return Event(Kind.STEP, node, dotted(node.args[0]) or "<expr>")
            if (
                name in ("eval", "train")
                and isinstance(func, ast.Attribute)
                and self._is_model(func.value)
            ):
                mode_arg = node.args[0] if node.args else keyword(node, "mode")
                training = name == "train" and not (
                    isinstance(mode_arg, ast.Constant) and mode_arg.value is False
                )
                if name == "eval" and (node.args or node.keywords):
                    return None
                return Event(Kind.TRAIN if training else Kind.EVAL, node, dotted(func.value))
            if name == "unscale_":
                return Event(Kind.UNSCALE, node, dotted(node.args[0]) if node.args else None)
            if (
                name == "update"
                and isinstance(func, ast.Attribute)
                and (self.roles.role(func.value, by_name=True) is Role.SCALER)
            ):
                return Event(Kind.UPDATE, node, dotted(func.value))
            if name in _CLIP_NAMES:
                bound = _clip_bound(node, name)
                if (
                    name == "clip_grad_norm"
                    and m.qualname(func) is None
                    and not isinstance(func, ast.Attribute)
                ):
                    return None
                kind = Kind.READ if _is_inf(bound) else Kind.CLIP
                return Event(kind, node)
            if name in _READ_NAMES and (
                (m.qualname(func) or "").startswith("torch.") or name == "get_total_norm"
            ):
                return Event(Kind.READ, node)
            return None
        if isinstance(node, ast.Attribute) and node.attr == "grad":
            return self._grad_attribute(node)
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Attribute) and t.attr == "grad" for t in targets):
                value = node.value
                if (
                    value is None
                    or (isinstance(value, ast.Constant) and value.value is None)
                    or (isinstance(value, ast.Call) and call_name(value) in ("zeros_like", "zeros"))
                ):
                    return Event(Kind.ZERO, node, None)
                # `p.grad = g`: gradients written by hand play the part of a backward
                return Event(Kind.BACKWARD, node, None)
        if isinstance(node, ast.Delete) and any(
            isinstance(t, ast.Attribute) and t.attr == "grad" for t in node.targets
        ):
            return Event(Kind.ZERO, node, None)
        return None

    def _is_model(self, expr: ast.AST) -> bool:
        """Receivers of `.train()`/`.eval()` that are modules (not `trainer.train()`)."""
        if self.roles.role(expr) is Role.MODEL:
            return True
        name = dotted(expr)
        if name is None:
            return False
        if name == "self":
            cls = self.model.enclosing_class(expr)
            return cls is not None and is_module_class(self.model, cls)
        last = name.rsplit(".", 1)[-1].lower()
        if any(w in last for w in ("trainer", "engine", "runner", "learner", "loop")):
            return False
        return self.model.imports_training_library and any(
            w in last
            for w in (
                "model",
                "net",
                "encoder",
                "decoder",
                "backbone",
                "module",
                "generator",
                "discriminator",
                "policy",
                "critic",
                "actor",
            )
        )

    is_model = _is_model  # public name for rules (issue 13)

    def _grad_attribute(self, node: ast.Attribute) -> Event | None:
        if not isinstance(node.ctx, ast.Load):
            return None
        parent = self.model.parent_of(node)
        if isinstance(parent, ast.Call) and parent.func is node:
            return None  # torch.autograd.grad(...) or x.grad(...)
        if self.model.qualname(node) is not None:
            return None  # a module attribute (torch.autograd.grad), not a tensor's .grad
        # `p.grad is None`, `if p.grad:`: existence checks, not statistics
        if isinstance(parent, ast.Compare) and all(
            isinstance(op, (ast.Is, ast.IsNot)) for op in parent.ops
        ):
            return None
        if isinstance(parent, (ast.If, ast.While, ast.BoolOp, ast.UnaryOp)):
            return None
        # `p.grad.zero_()` and friends are zeroing, classified on the call
        cur: ast.AST = node
        while isinstance(parent, ast.Attribute):
            cur, parent = parent, self.model.parent_of(parent)
        if (
            isinstance(parent, ast.Call)
            and parent.func is cur
            and call_name(parent) in (_ZEROING_METHODS)
        ):
            return None
        if isinstance(parent, ast.Assign) and any(t is cur for t in parent.targets):
            return None
        return Event(Kind.READ, node)

    def _node_events(self, node: ast.AST) -> list[NodeEvent]:
        """The nodes of ``node`` (in ``postorder``) the walker acts on: (node, its event,
        the same-file helper a non-event call runs). Memoised per node: a nested loop's
        body and a helper called from several sites are walked again for every path
        enumeration that reaches them, and classifying is pure."""
        key = id(node)
        found = self._node_events_cache.get(key)
        if found is None:
            found = []
            resolve = self.model.resolve_call
            for sub in postorder(node):
                if sub.__class__ not in EVENT_NODES:
                    continue
                ev = self.classify(sub)
                fn = resolve(sub) if ev is None and isinstance(sub, ast.Call) else None
                if (
                    ev is not None
                    or fn is not None
                    or (sub.__class__ is ast.Call and sub.func.__class__ in CALLEES)
                ):  # type: ignore[attr-defined]
                    # (a call of neither: maybe another file's function, see PathWalker)
                    found.append((sub, ev, fn))
            self._node_events_cache[key] = found
        return found

    # -- paths -----------------------------------------------------------------------------
    @cached_property
    def _foreign(self) -> Foreign | None:
        """How the walker follows calls into other files: when the project view names
        some (analysis.effects)."""
        view = self.model.project
        if not view or not view.get("calls"):
            return None
        return ANSWERS.foreign_paths

    def body_paths(self, stmts: list[ast.stmt], depth: int = 0) -> tuple[list[Path], bool]:
        """Paths through a statement list. Returns (paths, precise)."""
        walker = PathWalker(self, depth, foreign=self._foreign)
        paths = walker.run(stmts)
        return paths, walker.precise

    def function_paths(self, fn: FunctionNode) -> tuple[list[Path], bool]:
        cached = self._fn_paths.get(id(fn))
        if cached is not None:
            return cached
        if id(fn) in self._in_progress:
            return [()], False
        self._in_progress.add(id(fn))
        result = self.body_paths(fn.body)
        self._in_progress.discard(id(fn))
        self._fn_paths[id(fn)] = result
        return result

    # -- loops -------------------------------------------------------------------------------
    @cached_property
    def _loop_paths(self) -> dict[int, tuple[list[Path], bool]]:
        out: dict[int, tuple[list[Path], bool]] = {}
        for loop in self.model.loops:
            if self._may_train(loop):
                out[id(loop)] = self.body_paths(loop.body)
        return out

    def loop_paths(self, loop: Loop) -> tuple[list[Path], bool]:
        return self._loop_paths.get(id(loop)) or ([()], True)

    @cached_property
    def _may_train_owners(self) -> set[int]:
        """The nodes (by id) whose walk_local meets something `_may_train` stops at: a
        call named like an event, a call that may resolve to a same-file function or to
        a project function the view names, a `.grad`. Found from the model's tables: for most loops and functions of a file
        there is none, and `_may_train` need not walk them."""
        m = self.model
        names = _EVENT_CALLS | {fn.name for fn in m.functions}
        calls = m.project.get("calls") if m.project else None
        if calls:
            # another file's function that trains (`loss = train_step(model, opt, b)`)
            names = names | {key.rsplit(".", 1)[-1] for key in calls}
        found: list[ast.AST] = [c for n in names for c in m.calls.get(n, ())]
        found.extend(m.attributes.get("grad", ()))
        owners: set[int] = set()
        for sub in found:
            for anc in m.ancestors(sub):
                owners.add(id(anc))
                if isinstance(anc, _LOCAL_STOPS):
                    break  # walk_local enters no further: its own walk starts here
        return owners

    def _may_train(self, node: ast.AST, depth: int = 0) -> bool:
        """Cheap test before enumerating paths: does the loop (or a same-file function it
        calls) contain anything that can be a step event?"""
        key = id(node)
        cached = self._may_train_cache.get(key)
        if cached is not None:
            return cached
        if key not in self._may_train_owners:
            # nothing the walk below can stop at: it would only find False
            self._may_train_cache[key] = False
            return False
        self._may_train_cache[key] = False  # recursion guard
        found = False
        for sub in walk_local(node):
            if isinstance(sub, ast.Call):
                name = call_name(sub)
                if name in _EVENT_CALLS:
                    found = True
                    break
                if depth < MAX_INLINE_DEPTH:
                    target = self.model.resolve_call(sub)
                    if target is not None and self._may_train(target, depth + 1):
                        found = True
                        break
                if self._foreign is not None:
                    if ANSWERS.resolve_foreign(self.model, sub) is not None:
                        found = True
                        break
            elif isinstance(sub, ast.Attribute) and sub.attr == "grad":
                found = True
                break
        self._may_train_cache[key] = found
        return found

    @cached_property
    def statement_loops(self) -> list[ast.For | ast.AsyncFor | ast.While]:
        """The step loops that are loop statements (not step functions), in order."""
        return [sl.node for sl in self.step_loops if isinstance(sl.node, LOOP_NODES)]

    @cached_property
    def step_loops(self) -> list[StepLoop]:
        """Loops whose own iteration (not a nested loop's) backpropagates or steps, plus
        step functions (``train_step`` & co.) that no loop in this file calls."""
        out: list[StepLoop] = []
        if not self.model.imports_training_library:
            return out  # `job.backward()` in a file that never imports torch is not training
        for loop in self.model.loops:
            paths, precise = self.loop_paths(loop)
            own = [e for p in paths for e in p if e.depth == 0]
            if any(e.kind in (Kind.BACKWARD, Kind.STEP) for e in own):
                out.append(StepLoop(loop, paths, precise, self._epoch_loops_of(loop)))
        called_in_loop = set()
        for sl in out:
            for e in sl.events:
                for site in e.chain:
                    target = self.model.resolve_call(site)
                    if target is not None:
                        called_in_loop.add(id(target))
        for fn in self.model.functions:
            if not STEP_FUNCTION_NAMES.match(fn.name):
                continue  # tested first: the name is cheap, the loop contexts are not
            if id(fn) in called_in_loop or self.model.loop_contexts(fn.body[0] if fn.body else fn):
                continue
            paths, precise = self.function_paths(fn)
            own = [e for p in paths for e in p if e.depth == 0]
            if any(e.kind in (Kind.BACKWARD, Kind.STEP) for e in own):
                out.append(StepLoop(fn, paths, precise))
        return out

    def step_loop_of(self, node: ast.AST) -> StepLoop | None:
        return self._step_loops_by_node.get(id(node))

    @cached_property
    def _step_loops_by_node(self) -> dict[int, StepLoop]:
        out: dict[int, StepLoop] = {}
        for sl in self.step_loops:
            out.setdefault(id(sl.node), sl)  # (the first, as a scan in order would find)
        return out

    @cached_property
    def step_loop_ids(self) -> set[int]:
        return {id(sl.node) for sl in self.step_loops}

    def _epoch_loops_of(self, loop: Loop) -> list[ast.AST]:
        out: list[ast.AST] = []
        for ctx in self.model.loop_contexts(loop, depth=4):
            out.extend(n for n in ctx if isinstance(n, LOOP_NODES))
        return out

    @cached_property
    def epoch_loops(self) -> list[Loop]:
        """Loops that enclose a step loop (directly or by calling a function that has one)."""
        ids = set()
        out = []
        for sl in self.step_loops:
            for e in sl.epoch_loops:
                if id(e) not in ids and id(e) not in self.step_loop_ids:
                    ids.add(id(e))
                    out.append(e)
        if self._foreign is not None and self.model.imports_training_library:
            # a loop around a call of another file's function that has a step loop
            # (`train_one_epoch(...)` in engine.py)
            for loop in self.model.loops:
                if id(loop) in ids or id(loop) in self.step_loop_ids:
                    continue
                paths, _ = self.loop_paths(loop)
                if any(
                    e.via is not None and e.depth > 0 and e.kind in (Kind.BACKWARD, Kind.STEP)
                    for p in paths
                    for e in p
                ):
                    ids.add(id(loop))
                    out.append(loop)
        return sorted(out, key=_pos)  # type: ignore[arg-type]

    def anchor(self, event: Event) -> ast.AST:
        """Where a finding about ``event`` is reported (SPEC §7): at the node when it lies
        in the step body or in a function with a backward/step of its own; else at the
        call, in the innermost such function, of the helper that leads to it."""
        chain = event.chain
        if not chain:
            return event.node
        called = [self.model.resolve_call(site) for site in chain]
        if self._has_own_step(called[-1]):
            return event.node
        for i in range(len(chain) - 1, 0, -1):
            if self._has_own_step(called[i - 1]):
                return chain[i]
        return chain[0]

    def per_step(
        self,
        node: ast.AST,
        limits: Callable[[ast.If], bool] | None = None,
        *,
        per_item: bool = False,
    ) -> tuple[StepLoop, ast.AST] | None:
        """If ``node`` runs on every iteration of a step loop, (that loop, report anchor).

        Every iteration means: in the loop body (nested plain loops included) or in
        same-file helpers called from it, not in an ``except`` handler, and not under an
        ``if`` for which ``limits`` says "this gates it" (default: rate-limit guards).
        With ``per_item``, a loop over the step's own tensors (`for out in outputs`)
        runs on every step too, many times.
        """
        limits = limits or (lambda g: is_counter_guard(g.test) or is_logging_guard(g.test))
        for ctx in self.model.loop_contexts(node):
            chain: list[ast.AST] = [node, *[n for n in ctx if isinstance(n, ast.Call)]]
            loops = [n for n in ctx if isinstance(n, LOOP_NODES)]
            step_loop = None
            for lp in loops:
                sl = self.step_loop_of(lp)
                if sl is not None:
                    step_loop = sl
                    break
                if id(lp) in {id(e) for e in self.epoch_loops} or not (
                    _over_parameters(lp) or (per_item and self.over_step_tensors(lp))
                ):
                    # per epoch, or many times per step in a loop of its own (an RL
                    # rollout, a beam search): not what "every training step" means
                    break
            if step_loop is None:
                continue
            if self._gated(chain, step_loop.node, limits):
                continue
            return step_loop, self._anchor_chain(chain)
        # a step function that no loop in this file calls: its body is one step
        fn = self.model.function_of(node)
        if fn is not None:
            sl = self.step_loop_of(fn)
            if sl is not None and not self._gated([node], fn, limits):
                return sl, node
        return None

    def over_step_tensors(self, loop: ast.AST) -> bool:
        """Does ``loop`` walk the items of a tensor that carries this step's graph (`for
        mask, out in zip(masks, outputs)` after `outputs = net(images)`): one iteration
        per sample, box or image of the batch?"""
        it = getattr(loop, "iter", None)
        if isinstance(it, ast.Call) and call_name(it) in ("zip", "enumerate"):
            parts: list[ast.expr] = list(it.args)
        elif it is not None:
            parts = [it]
        else:
            return False
        flow = self.model.flow
        return any(
            isinstance(p, (ast.Name, ast.Attribute)) and flow.value(p).taint is Taint.GRAD
            for p in parts
        )

    def _gated(self, chain: list[ast.AST], loop: ast.AST, limits: Callable[[ast.If], bool]) -> bool:
        for item in chain:
            for anc in self.model.ancestors(item):
                if anc is loop or isinstance(anc, NESTED_SCOPES):
                    break
                if isinstance(anc, ast.If) and limits(anc):
                    return True
                if isinstance(anc, ast.ExceptHandler):
                    return True
        return False

    def _anchor_chain(self, chain: list[ast.AST]) -> ast.AST:
        """``chain`` is [node, innermost call site, ..., call site in the loop body]."""
        sites = [c for c in chain[1:] if isinstance(c, ast.Call)]
        if not sites:
            return chain[0]
        ev = Event(Kind.READ, chain[0], chain=tuple(reversed(sites)))  # outermost first
        return self.anchor(ev)

    @cached_property
    def _own_step_scopes(self) -> set[int]:
        """The defs, lambdas and classes (by id) whose own code, as walk_local meets it,
        has a call that `classify` makes a backward or a step: found from the few calls
        that can be one (by method name, or a bare name imported from torch under that
        name), not by walking every function."""
        m = self.model
        names = set(_OWN_STEP_METHODS)
        for b in m.imports.scopes.values():
            for local, q in b.imports.items():
                if q.startswith("torch.") and q.rsplit(".", 1)[-1] in _OWN_STEP_METHODS:
                    names.add(local)
        out: set[int] = set()
        for name in names:
            for call in m.calls.get(name, ()):
                ev = self.classify(call)
                if ev is None or ev.kind not in (Kind.BACKWARD, Kind.STEP):
                    continue
                for anc in m.ancestors(call):
                    if isinstance(anc, _LOCAL_STOPS):
                        out.add(id(anc))  # walk_local stops at the first of these
                        break
        return out

    def _has_own_step(self, fn: ast.AST | None) -> bool:
        if fn is None:
            return False
        if isinstance(fn, _LOCAL_STOPS):
            return id(fn) in self._own_step_scopes
        cached = self._own_step.get(id(fn))
        if cached is None:
            cached = False
            for node in walk_local(fn):
                if isinstance(node, ast.Call):
                    ev = self.classify(node)
                    if ev is not None and ev.kind in (Kind.BACKWARD, Kind.STEP):
                        cached = True
                        break
            self._own_step[id(fn)] = cached
        return cached

    has_own_step = _has_own_step  # public name for rules (issue 13)

    @cached_property
    def trains(self) -> bool:
        """Whether anything in this file is a training step: a step loop or step
        function, or a def, lambda or class whose own code backpropagates or steps. When
        not, ``per_step`` answers None and ``has_own_step`` False for every node, and a
        rule about what happens inside a step can stop before asking them."""
        return bool(self.step_loops) or bool(self._own_step_scopes)

    #: public names for the step walker (step_paths) and the effects summary
    node_events = _node_events
    may_train = _may_train


def _over_parameters(loop: ast.AST) -> bool:
    """``for p in model.parameters()`` / ``for group in opt.param_groups``: per-step work."""
    it = getattr(loop, "iter", None)
    if it is None:
        return False
    for sub in ast.walk(it):
        if isinstance(sub, ast.Attribute) and sub.attr in (
            "parameters",
            "named_parameters",
            "param_groups",
            "buffers",
            "modules",
            "named_modules",
            "children",
        ):
            return True
    return False


def _mentions_grad(node: ast.AST) -> bool:
    cur = node
    while isinstance(cur, (ast.Attribute, ast.Call, ast.Subscript)):
        if isinstance(cur, ast.Attribute) and cur.attr == "grad":
            return True
        cur = cur.func if isinstance(cur, ast.Call) else cur.value
    return False


def _clip_bound(call: ast.Call, name: str) -> ast.AST | None:
    for kw in call.keywords:
        if kw.arg in ("max_norm", "clip_value", "gradient_clip_val", "max_value"):
            return kw.value
    if len(call.args) >= 2:
        return call.args[1]
    return None


def _pos(node: ast.AST) -> tuple[int, int]:
    return (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))


# The answers this module gives to lower layers (see analysis.hooks).
ANSWERS.steps = StepModel
