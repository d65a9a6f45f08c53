"""Hand-written learning-rate schedules: values stored into ``optimizer.param_groups``'
``"lr"`` inside training loops, and what they are worth at the loop's first iteration.

A write is ``opt.param_groups[k]["lr"] = V``, ``g["lr"] = V`` in ``for g in
opt.param_groups``, or a call to a same-file helper whose body does one of those with a
parameter (``set_lr(optimizer, lr)``), which counts as a write of the argument at the call.
"""

from __future__ import annotations

import ast

from trainlint._record import Record
from trainlint.analysis.arguments import arguments_for
from trainlint.analysis.arguments import parameter_names as params_of
from trainlint.analysis.constants import ConstantEvaluator, is_number
from trainlint.analysis.model import FUNCTION_NODES, FileModel, call_name, keyword, walk_tree

_UNKNOWN = None


class LrWrite(Record, frozen=True):
    """One place a loop sets the LR: the node to report and the value it stores."""

    __slots__ = ("node", "value")

    node: ast.AST  # the assignment, or the call to the setter helper
    value: ast.expr

    def __init__(self, node: ast.AST, value: ast.expr) -> None:
        self.node = node
        self.value = value


def _is_lr_key(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value == "lr"


def _group_of(model: FileModel, target: ast.Subscript) -> bool:
    """Is ``target`` (``X["lr"]``) the lr entry of a param group?"""
    if not _is_lr_key(target.slice):
        return False
    base = target.value
    if isinstance(base, ast.Subscript) and isinstance(base.value, ast.Attribute):
        return base.value.attr == "param_groups"
    if isinstance(base, ast.Name):
        for anc in model.ancestors(target):
            if isinstance(anc, FUNCTION_NODES):
                return False
            if isinstance(anc, ast.For) and _over_param_groups(anc):
                group: ast.expr = anc.target
                if isinstance(group, ast.Tuple) and len(group.elts) == 2:
                    group = group.elts[1]
                if isinstance(group, ast.Name) and group.id == base.id:
                    return True
    return False


def _over_param_groups(loop: ast.AST) -> bool:
    """``for g in opt.param_groups`` / ``for i, g in enumerate(opt.param_groups)``."""
    it = getattr(loop, "iter", None)
    if isinstance(it, ast.Call) and call_name(it) == "enumerate" and it.args:
        it = it.args[0]
    return isinstance(it, ast.Attribute) and it.attr == "param_groups"


def direct_writes(model: FileModel) -> list[tuple[ast.Assign, ast.expr]]:
    out = []
    for node in model.assignments:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Subscript) and _group_of(model, t) for t in node.targets
        ):
            out.append((node, node.value))
    return out


def lr_writes(model: FileModel) -> list[LrWrite]:
    """Direct writes, and calls to same-file setters that write one of their parameters."""
    out: list[LrWrite] = []
    setters: dict[int, int] = {}  # function id -> index of the parameter it stores
    for node, value in direct_writes(model):
        fn = model.function_of(node)
        params = params_of(fn) if fn is not None else []
        if (
            fn is not None
            and isinstance(value, ast.Name)
            and value.id in params
            and not any(
                isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == value.id for t in n.targets)
                for n in ast.walk(fn)
            )
        ):
            setters[id(fn)] = params.index(value.id)
            continue
        out.append(LrWrite(node, value))
    for fn in model.functions:
        index = setters.get(id(fn))
        if index is None:
            continue
        name = params_of(fn)[index]
        for site, arg in arguments_for(model, fn, name):
            out.append(LrWrite(site, arg))
    return out


class FirstStep(ConstantEvaluator):
    """The value of an expression at the first iteration of the loops around it: loop
    counters take their first value, names set earlier in the loop body their value then,
    and calls to same-file functions are evaluated with their arguments."""

    def __init__(self, model: FileModel, depth: int = 0) -> None:
        super().__init__(model)
        self.depth = depth

    def expr(self, node: ast.AST, env: dict[str, object]) -> object:
        if isinstance(node, ast.Subscript):
            key = counter_key(node)
            return env.get(key) if key is not None else None
        if isinstance(node, ast.Call) and self.depth < 3:
            fn = self.model.resolve_call(node)
            if (
                isinstance(fn, ast.FunctionDef)
                and not node.keywords
                and not any(isinstance(a, ast.Starred) for a in node.args)
            ):
                params = params_of(fn)
                if isinstance(node.func, ast.Attribute) and self.model.class_of(fn) is not None:
                    params = params[1:]
                if len(node.args) <= len(params):
                    inner = {p: self.expr(a, env) for p, a in zip(params, node.args, strict=False)}
                    return FirstStep(self.model, self.depth + 1).function(fn, inner)
        return super().expr(node, env)

    def _resolve(self, node: ast.Name) -> object:
        """Also ``a, b = 2000, 0.1`` at module level (nanoGPT-style settings)."""
        values = [
            elt.value
            for st in self.model.tree.body
            if isinstance(st, ast.Assign)
            for t in st.targets
            if isinstance(t, ast.Tuple)
            and isinstance(st.value, ast.Tuple)
            and len(t.elts) == len(st.value.elts)
            for name, elt in zip(t.elts, st.value.elts, strict=True)
            if isinstance(name, ast.Name) and name.id == node.id and isinstance(elt, ast.Constant)
        ]
        found = super()._resolve(node)
        fn = self.model.function_of(node)
        local = (
            fn is not None
            and any(
                isinstance(n, ast.Name) and n.id == node.id and isinstance(n.ctx, ast.Store)
                for n in ast.walk(fn)
            )
            or (fn is not None and node.id in params_of(fn))
        )
        if len(values) == 1 and is_number(values[0]) and not is_number(found) and not local:
            return values[0]
        return found


def first_iteration_env(
    model: FileModel, node: ast.AST, offset: int = 0
) -> tuple[dict[str, object], bool] | None:
    """Names known at ``node``'s statement during the first iteration of its innermost
    loop (within its function): the loop counters' first values, and what the statements
    before it in the loop body assign. Also whether some counter is known at all. None when
    ``node`` is not in a loop, or a guard around it is false on the first iteration.
    ``offset`` shifts every counter (1: a later iteration, to tell a warmup from a 0
    chosen on purpose)."""
    stmt = model.statement_of(node)
    loops = [loop for loop in model.enclosing_loops(stmt) if not _over_param_groups(loop)]
    if not loops:
        return None
    env: dict[str, object] = {}
    counted = False
    ev = FirstStep(model)
    for loop in reversed(loops):  # outermost first
        first = _first_values(model, loop, ev)
        if first:
            counted = True
            env.update({k: v + offset for k, v in first.items()})  # type: ignore[operator]
    # counters kept by hand: `it = 0` before a loop, `it += 1` in it
    for loop in loops:
        for name, value in _hand_counters(model, loop, stmt).items():
            if name not in env:
                env[name] = value + offset  # type: ignore[operator]
                counted = True
    inner = loops[0]
    # statements before `stmt` in the loop body, along the blocks that lead to it
    chain: list[ast.AST] = []
    cur: ast.AST = stmt
    for anc in model.ancestors(stmt):
        chain.append(cur)
        if anc is inner:
            break
        cur = anc
    chain.reverse()  # from the loop body's statement down to `stmt`
    block: list[ast.stmt] = inner.body
    for step_node in chain:
        for s in block:
            if s is step_node:
                break
            _assign_into(s, env, ev)
        if step_node is stmt:
            break
        if isinstance(step_node, ast.If):
            test = ev.expr(step_node.test, env)
            nxt = chain[chain.index(step_node) + 1]
            in_body = any(s is nxt for s in step_node.body)
            if isinstance(test, bool) and test != in_body:
                return None  # not taken on the first iteration
            block = step_node.body if in_body else step_node.orelse
        elif isinstance(step_node, (ast.With, ast.AsyncWith, ast.For, ast.AsyncFor, ast.Try)):
            nxt = chain[chain.index(step_node) + 1]
            for field in ("body", "orelse", "finalbody"):
                b = getattr(step_node, field, None)
                if isinstance(b, list) and any(s is nxt for s in b):
                    block = b
                    break
        else:
            return None
    return env, counted


def _assign_into(s: ast.stmt, env: dict[str, object], ev: ConstantEvaluator) -> None:
    if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name):
        env[s.targets[0].id] = ev.expr(s.value, env)
        return
    for sub in ast.walk(s):  # anything else bound here is unknown from now on
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
            env[sub.id] = _UNKNOWN


def _first_values(model: FileModel, loop: ast.AST, ev: ConstantEvaluator) -> dict[str, object]:
    if not isinstance(loop, (ast.For, ast.AsyncFor)) or not isinstance(loop.iter, ast.Call):
        return {}
    it, name = loop.iter, call_name(loop.iter)
    if name == "range" and it.args and isinstance(loop.target, ast.Name):
        start = ev.expr(it.args[0], {}) if len(it.args) > 1 else 0
        return {loop.target.id: start} if is_number(start) else {}
    if (
        name == "enumerate"
        and isinstance(loop.target, ast.Tuple)
        and loop.target.elts
        and isinstance(loop.target.elts[0], ast.Name)
    ):
        start_node = keyword(it, "start") or (it.args[1] if len(it.args) > 1 else None)
        start = 0 if start_node is None else ev.expr(start_node, {})
        return {loop.target.elts[0].id: start} if is_number(start) else {}
    return {}


def _hand_counters(model: FileModel, loop: ast.AST, stmt: ast.stmt) -> dict[str, object]:
    """`step = 0` right before the loop (same block) and `step += 1` directly in its body:
    the value `stmt` sees on the first iteration."""
    counters = _loop_counters(model, loop)
    if not counters:
        return {}
    body = loop.body  # type: ignore[attr-defined]
    top = _body_statement(model, loop, stmt)
    out: dict[str, object] = {}
    for name, (first, inc) in counters.items():
        if any(s is inc for s in body):
            if top is not None and body.index(inc) < body.index(top):
                first = first + inc.value.value  # type: ignore[operator,attr-defined]
        elif not _after(inc, stmt):
            continue  # incremented somewhere nested before the write: cannot tell
        out[name] = first
    return out


def _loop_counters(model: FileModel, loop: ast.AST) -> dict[str, tuple[object, ast.AugAssign]]:
    """The loop's counters kept by hand, whatever statement asks: name -> (its value
    before the loop, its one `+= number` inside). Asked for each assignment in the loop,
    and each ask would walk the whole loop body: once per loop."""
    return model.memo(("hand counters", id(loop)), lambda m: _counters_of(m, loop))


def _counters_of(model: FileModel, loop: ast.AST) -> dict[str, tuple[object, ast.AugAssign]]:
    out: dict[str, tuple[object, ast.AugAssign]] = {}
    parent = model.parent_of(loop)
    block = None
    for field in ("body", "orelse", "finalbody"):
        b = getattr(parent, field, None)
        if isinstance(b, list) and any(s is loop for s in b):
            block = b
    if block is None:
        return out
    before = block[: next(i for i, s in enumerate(block) if s is loop)]
    inits: dict[str, object] = _entry_inits(model, loop)
    for s in before:
        if isinstance(s, ast.Assign) and len(s.targets) == 1:
            key = counter_key(s.targets[0])
            v = s.value
            if key is not None:
                inits[key] = (
                    v.value if isinstance(v, ast.Constant) and is_number(v.value) else _UNKNOWN
                )
            if isinstance(s.targets[0], ast.Name):
                # `state = {"iter_num": 0, ...}`: its entries start there
                name = s.targets[0].id
                for k in [k for k in inits if k.startswith(name + "[")]:
                    del inits[k]
                inits.update(_dict_entries(name, v))
        elif isinstance(s, ast.Expr) and isinstance(s.value, ast.Call):
            # `fabric.load(resume, state)`: whatever the call puts in `state` is unknown
            for arg in s.value.args:
                if isinstance(arg, ast.Name):
                    inits.update({k: _UNKNOWN for k in inits if k.startswith(arg.id + "[")})
    known = {name: init for name, init in inits.items() if init is not _UNKNOWN}
    if not known:
        return out
    # the `+= number` of each: from the file's assignments, those inside the loop's body
    incs: dict[str, list[ast.AugAssign]] = {}
    for a in model.assignments:
        if (
            isinstance(a, ast.AugAssign)
            and isinstance(a.op, ast.Add)
            and isinstance(a.value, ast.Constant)
            and is_number(a.value.value)
            and (key := counter_key(a.target)) in known
            and _body_statement(model, loop, a) is not None
        ):
            incs.setdefault(key, []).append(a)
    inside: list[ast.AST] | None = None  # the body's nodes: walked only for a candidate
    for name, init in known.items():
        found = incs.get(name, ())
        if len(found) != 1:
            continue
        if inside is None:
            inside = [n for s in loop.body for n in walk_tree(s)]  # type: ignore[attr-defined]
        others = [
            n
            for n in inside
            if isinstance(n, (ast.Name, ast.Subscript))
            and isinstance(n.ctx, ast.Store)
            and counter_key(n) == name
        ]
        if "[" in name and _dict_escapes_in(model, name.split("[", 1)[0], loop):
            continue  # the dict is handed to a call in the loop, which may move the counter
        if len(others) != 1:
            continue
        out[name] = (init, found[0])
    return out


def _body_statement(model: FileModel, loop: ast.AST, stmt: ast.AST) -> ast.stmt | None:
    """The statement of the loop's body that is or holds ``stmt`` (None: it is not in the
    body)."""
    body = loop.body  # type: ignore[attr-defined]
    cur: ast.AST | None = stmt
    while cur is not None and cur is not loop:
        parent = model.parent_of(cur)
        if parent is loop:
            return cur if any(s is cur for s in body) else None  # type: ignore[return-value]
        cur = parent
    return None


def counter_key(node: ast.AST) -> str | None:
    """How a loop counter is named in an environment: ``it``, or ``state['iter_num']`` for
    an entry of a dict held by a plain name (litgpt keeps its counter in ``state``)."""
    if isinstance(node, ast.Name):
        return node.id
    if (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name)
        and isinstance(node.slice, ast.Constant)
        and isinstance(node.slice.value, str)
    ):
        return f"{node.value.id}[{node.slice.value!r}]"
    return None


def _dict_entries(name: str, value: ast.expr) -> dict[str, object]:
    """``{"iter_num": 0, ...}`` bound to ``name``: the numeric entries, keyed for the env."""
    if not isinstance(value, ast.Dict):
        return {}
    out: dict[str, object] = {}
    for k, v in zip(value.keys, value.values, strict=True):
        if isinstance(k, ast.Constant) and isinstance(k.value, str):
            out[f"{name}[{k.value!r}]"] = (
                v.value if isinstance(v, ast.Constant) and is_number(v.value) else _UNKNOWN
            )
    return out


def _entry_inits(model: FileModel, loop: ast.AST) -> dict[str, object]:
    """Entries of a dict parameter of the loop's function, when every same-file call
    passes a name last bound to a dict display that holds the entry as a number
    (litgpt: ``state = {"iter_num": 0, ...}`` then ``fit(state=state)``)."""
    fn = model.function_of(loop)
    if fn is None:
        return {}
    sites = model.call_sites.get(id(fn), ())
    out: dict[str, object] = {}
    for param in params_of(fn):
        found = arguments_for(model, fn, param)
        if not found or len(found) != len(sites):
            continue
        agreed: dict[str, object] | None = None
        for _, arg in found:
            entries: dict[str, object] = {}
            if isinstance(arg, ast.Name):
                d = model.flow.definition(arg.id, arg)
                if d is not None and isinstance(d[1], ast.expr):
                    entries = _dict_entries(param, d[1])
                    if _filled_between(model, arg.id, d[0], arg):
                        entries = {}
            agreed = (
                entries
                if agreed is None
                else {k: v for k, v in agreed.items() if entries.get(k, _UNKNOWN) == v}
            )
        out.update(agreed or {})
    return out


def _filled_between(model: FileModel, name: str, start: ast.AST, end: ast.AST) -> bool:
    """Between the dict's binding and the call, is it written into or handed to a call
    outside an ``if`` (resuming from a checkpoint under ``if resume:`` is not the run
    that starts from scratch)?"""
    scope = model.function_of(end) or model.tree
    lo, hi = (getattr(start, "lineno", 0), getattr(end, "lineno", 0))
    for node in walk_tree(scope):
        line = getattr(node, "lineno", 0)
        if not lo < line < hi:
            continue
        if any(
            isinstance(a, ast.If) for a in model.ancestors(node) if getattr(a, "lineno", 0) > lo
        ):
            continue
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id == name
        ):
            return True
        if isinstance(node, ast.Call) and any(
            isinstance(a, ast.Name) and a.id == name for a in node.args
        ):
            return True
    return False


def _dict_escapes_in(model: FileModel, name: str, loop: ast.AST) -> bool:
    """The dict is passed whole to a call inside the loop (``fabric.save(path, state)``
    only reads it, but a callee could write the counter: stay silent unless it is a
    known reader)."""
    for node in walk_tree(loop):
        if isinstance(node, ast.Call) and any(
            isinstance(a, ast.Name) and a.id == name
            for a in [*node.args, *(k.value for k in node.keywords)]
        ):
            if call_name(node) not in _READERS:
                return True
    return False


# Calls that only read a state dict they are given (checkpointing, logging).
_READERS = frozenset({"save", "log_dict", "log", "print", "dump", "save_checkpoint"})


def _after(a: ast.AST, b: ast.AST) -> bool:
    return (getattr(a, "lineno", 0), getattr(a, "col_offset", 0)) > (
        getattr(b, "lineno", 0),
        getattr(b, "col_offset", 0),
    )
