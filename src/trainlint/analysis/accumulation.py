"""Which statements accumulate a value across the iterations of a training loop."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence

from trainlint.analysis.arguments import parameter_for
from trainlint.analysis.assignments import single_value
from trainlint.analysis.flow import CUT_METHODS, Taint, defined_from, grad_enabled_at
from trainlint.analysis.hooks import ANSWERS
from trainlint.analysis.loaders import goes_over_data
from trainlint.analysis.model import LOOP_NODES, FileModel, FunctionNode, dotted, walk_local
from trainlint.analysis.step_events import backward_value
from trainlint.analysis.steps import Kind, backpropagated, backward_calls


def _container_root(node: ast.AST) -> ast.AST | None:
    """``totals["a"]`` -> ``totals``; ``self.metrics["x"]`` -> ``self.metrics``."""
    while isinstance(node, ast.Subscript):
        node = node.value
    return node if isinstance(node, (ast.Name, ast.Attribute)) else None


def _persists_across(model: FileModel, target: ast.AST, loop: ast.AST) -> bool:
    """Does the accumulator outlive one iteration of ``loop``: defined before it, an
    attribute (``self.x``, ``trainer.x``) or a module global?"""
    name = dotted(target)
    if name is None:
        return False
    if "." in name:
        return True
    fn = model.function_of(target)
    if fn is None:
        return True  # module-level name
    found = model.flow.definition(name, target)
    if found is None:
        return True  # a parameter or a global: lives outside the loop
    stmt, _ = found
    return not any(anc is loop for anc in model.ancestors(stmt)) and stmt is not loop


def _reset_per_update(
    model: FileModel, target: ast.AST, loop: ast.AST, loops: Sequence[ast.AST]
) -> bool:
    """``loop`` is a micro-batch loop (it backpropagates but steps no optimizer) inside a
    loop that does step, and the accumulator is made anew in that outer loop's body:
    it holds the sub-batches of one update, never more than the whole batch would."""
    by_node = {id(sl.node): sl for sl in model.steps.step_loops}
    inner = by_node.get(id(loop))
    if inner is None or inner.of(Kind.STEP):
        return False
    outer = loops[loops.index(loop) + 1 :]
    return not _leaves_as_tensor(model, target, loop) and any(
        id(lp) in by_node
        and by_node[id(lp)].of(Kind.STEP)
        and not _persists_across(model, target, lp)
        for lp in outer
    )


def _repeats_one_batch(
    model: FileModel, target: ast.AST, loop: ast.AST, loops: Sequence[ast.AST]
) -> bool:
    """``loop`` repeats the update on one batch a set number of times (``for _ in
    range(self.ppo_epochs):``, drawing no batch of its own) inside a loop over data, and
    the accumulator is made anew in that outer loop's body: it holds that many entries of
    one batch and is dropped with the next. A list reset per epoch around a loop over the
    loader is not this: its inner loop goes over data."""
    if not isinstance(loop, ast.For) or goes_over_data(loop):
        return False
    it = loop.iter
    if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range"):
        return False
    if any(
        isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id == "next"
        for sub in walk_local(loop)
    ):
        return False  # `batch = next(it)` inside: each repeat draws new data
    outer = loops[loops.index(loop) + 1 :]
    return any(goes_over_data(lp) and not _persists_across(model, target, lp) for lp in outer)


def _rebound_after(model: FileModel, read: ast.AST, end: tuple[int, int]) -> bool:
    """``read`` (a plain name) sees an assignment made after ``end``, not the accumulator
    (``outputs = torch.cat(outputs)`` then ``score(outputs)``)."""
    if not isinstance(read, ast.Name):
        return False
    found = model.flow.definition(read.id, read)
    stmt = found[0] if found is not None else None
    return stmt is not None and (getattr(stmt, "lineno", 0), getattr(stmt, "col_offset", 0)) > end


def _leaves_as_tensor(model: FileModel, target: ast.AST, loop: ast.AST) -> bool:
    """After ``loop``, is the accumulator handed as it is to a call that is neither a
    builtin nor a torch function (a logger, a tracker: ``writer.add_scalar("loss",
    total, step)``) or stored on an object? Then the sum of one update's graphs is kept
    past it, not read on the spot (``sum(losses).item()``, ``torch.cat(outputs)``)."""
    name = dotted(target)
    fn = model.function_of(loop)
    if name is None or fn is None:
        return False
    end = (getattr(loop, "end_lineno", 0) or 0, getattr(loop, "end_col_offset", 0) or 0)
    for node in walk_local(fn):
        if isinstance(node, ast.Call) and (node.lineno, node.col_offset) > end:
            if (model.qualname(node.func) or "").startswith(("builtins.", "torch.")):
                continue  # `sum(losses)`, `torch.cat(outputs)`: a new value, read on the spot
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                if dotted(arg) == name and not _rebound_after(model, arg, end):
                    return True
        elif isinstance(node, ast.Assign) and (node.lineno, node.col_offset) > end:
            if dotted(node.value) == name and any(
                isinstance(t, (ast.Attribute, ast.Subscript)) for t in node.targets
            ):
                return True
    return False


def _reset_with_each_update(model: FileModel, target: ast.AST, loops: Sequence[ast.AST]) -> bool:
    """In the body of an enclosing step loop, the branch that steps the optimizer
    (``if (i + 1) % n == 0:``) also rebinds the accumulator (``running_loss = 0``): it
    sums the micro-batches of one update, each already backpropagated, and starts over
    with the next."""
    name = dotted(target)
    ids = {id(lp) for lp in loops}
    if name is None or not ids:
        return False
    guards = [
        g
        for sl in model.steps.step_loops
        if id(sl.node) in ids
        for e in sl.of(Kind.STEP)
        if e.depth == 0
        for g, branch in e.guards
        if branch
    ]
    for guard in guards:
        # directly in the branch: a reset nested under a logging `if` comes less often
        for node in guard.body:
            if isinstance(node, ast.Assign) and any(dotted(t) == name for t in node.targets):
                return True
    return False


def _one_batch_unroll(model: FileModel, target: ast.AST, loop: ast.AST) -> bool:
    """``loop`` walks one dimension of a tensor (``for t in range(x.size(1))``: the time
    steps of one batch) and the accumulator is a local made in the same function before
    it: it holds at most one batch's unroll and is gone when the call returns."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return False
    it: ast.AST = loop.iter
    while isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "reversed":
        it = it.args[0] if it.args else it
    if not (
        isinstance(it, ast.Call)
        and isinstance(it.func, ast.Name)
        and it.func.id == "range"
        and len(it.args) == 1
    ):
        return False
    bound = it.args[0]
    by_size = (
        isinstance(bound, ast.Call)
        and isinstance(bound.func, ast.Attribute)
        and bound.func.attr == "size"
        and len(bound.args) == 1
    )
    by_shape = (
        isinstance(bound, ast.Subscript)
        and isinstance(bound.value, ast.Attribute)
        and bound.value.attr == "shape"
    )
    if not (by_size or by_shape):
        return False
    root = _container_root(target)
    name = dotted(root) if root is not None else None
    fn = model.function_of(loop)
    if name is None or "." in name or fn is None:
        return False
    found = model.flow.definition(name, loop)
    return (
        found is not None and isinstance(found[0], ast.Assign) and model.function_of(found[0]) is fn
    )


def _bounded_key(model: FileModel, stmt: ast.Assign) -> bool:
    """``d[k] = v`` whose key is the same on every iteration of the enclosing loops (a
    constant, or names never rebound inside them): the entry is overwritten, the
    container does not grow."""
    target = stmt.targets[0]
    loops = model.enclosing_loops(stmt)
    if not isinstance(target, ast.Subscript) or not loops:
        return False
    names = set()
    for sub in ast.walk(target.slice):
        if isinstance(sub, ast.Name):
            names.add(sub.id)
        elif not isinstance(sub, (ast.Constant, ast.Tuple, ast.expr_context)):
            return False  # an attribute, a slice, a call, arithmetic: assume it varies
    return not any(
        isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store) and sub.id in names
        for lp in loops
        for sub in walk_local(lp)
    )


def _step_function_anchor(model: FileModel, stmt: ast.stmt, target: ast.AST) -> ast.AST | None:
    """Where to report when ``stmt`` runs once per training step (a step function, or
    a helper the step loop calls) and accumulates into something from outside that
    function (an attribute, a global, a parameter); else None."""
    fn = model.function_of(stmt)
    if fn is None or model.enclosing_loops(stmt):
        return None
    found_step = model.steps.per_step(stmt, limits=lambda g: False)
    name = dotted(target)
    if found_step is None or name is None:
        return None
    if "." not in name:
        found = model.flow.definition(name, stmt)
        if found is not None and found[0] is not fn:
            return None  # a list made inside the function: gone after the call
    return found_step[1]


def accumulations(model: FileModel) -> Iterator[tuple[ast.stmt, ast.AST, ast.AST]]:
    """(statement, accumulator, accumulated value) for += / x = x + v / append / [k] =."""
    for node in model.assignments:
        if isinstance(node, ast.AugAssign) and isinstance(node.op, (ast.Add, ast.Sub)):
            target = _container_root(node.target)
            if target is not None:
                value = node.value
                if isinstance(value, (ast.List, ast.Tuple)) and len(value.elts) == 1:
                    value = value.elts[0]  # losses += [loss]
                yield node, target, value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            t = node.targets[0]
            v = node.value
            if (
                isinstance(t, (ast.Name, ast.Attribute))
                and isinstance(v, ast.BinOp)
                and (isinstance(v.op, ast.Add) and dotted(v.left) == dotted(t) is not None)
            ):
                yield node, t, v.right
            elif isinstance(t, ast.Subscript) and isinstance(t.value, (ast.Name, ast.Attribute)):
                yield node, t.value, v
    for name in ("append", "extend", "insert"):
        for call in model.calls.get(name, ()):
            func = call.func
            if not isinstance(func, ast.Attribute) or not call.args:
                continue
            parent = model.parent_of(call)
            if not isinstance(parent, ast.Expr):
                continue
            value = call.args[-1]
            if (
                name == "extend"
                and isinstance(value, (ast.List, ast.Tuple))
                and len(value.elts) == 1
            ):
                value = value.elts[0]
            root = _container_root(func.value)
            if root is not None:
                yield parent, root, value


def accumulations_across_steps(
    model: FileModel,
) -> Iterator[tuple[ast.stmt, ast.AST, ast.AST, ast.AST]]:
    """(statement, accumulator, accumulated value, where to report) for each accumulation
    that grows across the iterations of a training loop, or on every call of a step
    function into something from outside it."""
    training_loops = model.steps.step_loop_ids | {id(lp) for lp in model.steps.epoch_loops}
    for stmt, target, value in accumulations(model):
        fn = model.function_of(stmt)
        if fn is not None and fn.name in ("forward", "__call__", "_forward"):
            continue  # unrolling time steps inside forward builds the graph on purpose
        if isinstance(stmt, ast.Assign) and _bounded_key(model, stmt):
            continue  # `stats["loss"] = loss`: one entry, overwritten every step
        loops = model.enclosing_loops(stmt)
        # only a training loop's iterations count (a step loop, or an epoch loop
        # around one): a loop over blocks, time steps or denoising steps inside one
        # forward pass builds that pass's graph. The accumulator must outlive the
        # loop's iterations -- or the statement is in a step function (its body is
        # one iteration) and the accumulator comes from outside it (a parameter, an
        # attribute, a global)
        anchor: ast.AST = stmt
        if _reset_with_each_update(model, target, loops):
            continue
        if not any(
            id(lp) in training_loops
            and _persists_across(model, target, lp)
            and not _reset_per_update(model, target, lp, loops)
            and not _one_batch_unroll(model, target, lp)
            and not _repeats_one_batch(model, target, lp, loops)
            for lp in loops
        ):
            step_anchor = _step_function_anchor(model, stmt, target)
            if step_anchor is None:
                continue
            anchor = step_anchor
        yield stmt, target, value, anchor


# Tensor methods whose result keeps the receiver's autograd history (copies, views,
# reductions), and collectives that return their reduced input with its history
# (Horovod's `allreduce` is differentiable; `torch.distributed.all_reduce` works in
# place and returns no tensor, so it is not here).
_GRAPH_KEEPING_METHODS = frozenset(
    {"cpu", "cuda", "to", "float", "double", "half", "clone", "contiguous", "mean", "sum"}
    | {"view", "reshape", "flatten", "squeeze", "unsqueeze"}
)
_GRAPH_KEEPING_CALLS = frozenset({"allreduce"})


def _graph_carried(value: ast.AST) -> ast.AST:
    """The name whose graph ``value`` passes on where it is one wrapped in history-keeping
    steps: ``val * n`` -> ``val``, ``hvd.allreduce(val.cpu())`` -> ``val``; else
    ``value`` itself."""
    for _ in range(8):
        if isinstance(value, ast.BinOp) and isinstance(value.left, ast.Name):
            value = value.left  # `self.sum += val * n`: the product keeps val's graph
        elif isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
            func = value.func
            if func.attr in _GRAPH_KEEPING_METHODS:
                value = func.value
            elif func.attr in _GRAPH_KEEPING_CALLS and value.args:
                value = value.args[0]
            else:
                break
        else:
            break
    return value


def kept_parameters(model: FileModel, fn: FunctionNode) -> dict[str, str]:
    """The parameters ``fn`` accumulates into something that outlives the call (an
    attribute, a global, a container it was handed), with that accumulator as written:
    ``def update(self, loss): self.history.append(loss)`` -> ``{"loss": "self.history"}``.
    A dict entry overwritten under one key does not grow and is not counted."""
    return _kept_by_function(model).get(id(fn), {})


def _kept_by_function(model: FileModel) -> dict[int, dict[str, str]]:
    """``kept_parameters`` of every function of the file that keeps one (by id)."""

    def build(m: FileModel) -> dict[int, dict[str, str]]:
        out: dict[int, dict[str, str]] = {}
        for stmt, target, value in accumulations(m):
            owner = m.function_of(stmt)
            if owner is None or m.enclosing_loops(stmt):
                continue
            value = _graph_carried(value)
            if not isinstance(value, ast.Name):
                continue
            params = {
                a.arg for a in (*owner.args.posonlyargs, *owner.args.args, *owner.args.kwonlyargs)
            } - {"self", "cls"}
            name = dotted(target)
            found = m.flow.definition(value.id, value)
            if (
                value.id not in params
                or name is None
                or (found is not None and found[0] is not owner)
            ):
                continue  # not the parameter as passed (rebound before)
            if isinstance(stmt, ast.Assign) and _bounded_key(m, stmt):
                continue
            found = m.flow.definition(name.split(".", 1)[0], stmt)
            if found is not None and found[0] is not owner and m.function_of(found[0]) is owner:
                continue  # a container made in the call: gone after it
            out.setdefault(id(owner), {})[value.id] = name
        return out

    return model.memo(kept_parameters, build)


def kept_by_calls(model: FileModel) -> Iterator[tuple[ast.Call, ast.expr, str, str]]:
    """(call, argument, accumulator, callee) for each call that hands a value to a
    function keeping it past the call (the accumulator in the caller's terms where it
    can be named: `meter.history` for `self.history`): a same-file function or method, or one of another
    project file (the project index's view): `meter.update(loss)` where `update` does
    `self.history.append(loss)`."""
    view_calls = model.project.get("calls") if model.project else None
    if not view_calls and not _kept_by_function(model):
        return  # no function here keeps a parameter, and the view knows none elsewhere
    for calls in model.calls.values():
        for call in calls:
            fn = model.resolve_call(call) or _method_of_instance(model, call)
            if fn is not None:
                kept = kept_parameters(model, fn)
                if not kept:
                    continue
                a = fn.args
                params = [x.arg for x in (*a.posonlyargs, *a.args)]
                receiver: ast.expr | None = None
                if isinstance(call.func, ast.Attribute) and params[:1] in (["self"], ["cls"]):
                    params = params[1:]
                    receiver = call.func.value
                entry: dict = {"params": params, "fn": fn.name}
            elif view_calls:
                found = ANSWERS.resolve_foreign(model, call)
                if found is None or not found[0].get("keeps"):
                    continue
                entry, receiver = found
                kept = entry["keeps"]
            else:
                continue
            for name, accumulator in kept.items():
                arg = ANSWERS.foreign_argument(entry, call, name)
                if arg is None:
                    continue
                root, dot, rest = accumulator.partition(".")
                if root in entry["params"] or root in entry.get("kwonly", ()):
                    # `add(buf, x)`: the caller's container is the accumulator; one made
                    # afresh in each iteration is gone with it
                    holder = ANSWERS.foreign_argument(entry, call, root)
                    step = model.steps.per_step(call)
                    loop = step[0].node if step is not None else None
                    if (
                        holder is None
                        or not isinstance(loop, LOOP_NODES)
                        or not (_persists_across(model, holder, loop))
                    ):
                        continue
                    accumulator = f"{dotted(holder) or root}{dot}{rest}"
                elif root == "self" and receiver is not None and dotted(receiver):
                    accumulator = f"{dotted(receiver)}{dot}{rest}"  # in the caller's terms
                yield call, arg, accumulator, entry["fn"]


def _method_of_instance(model: FileModel, call: ast.Call) -> FunctionNode | None:
    """`meter.update(x)` with `meter = Meter()` assigned once, `Meter` a class of this file."""
    func = call.func
    if not isinstance(func, ast.Attribute) or not isinstance(func.value, ast.Name):
        return None
    value = single_value(model, func.value)
    if not isinstance(value, ast.Call):
        return None
    ctor = value.func
    if not isinstance(ctor, ast.Name) or model.qualname(ctor) is not None:
        return None
    cls = model.class_named(ctor.id)
    return model.method_of(cls, func.attr) if cls is not None else None


def value_names(expr: ast.AST) -> tuple[set[str], bool]:
    """Dotted names read by an expression, and whether it calls anything."""

    names: set[str] = set()
    has_call = False
    stack = [expr]
    while stack:
        sub = stack.pop()
        if isinstance(sub, ast.Call):
            has_call = True
        if isinstance(sub, (ast.Name, ast.Attribute)):
            name = dotted(sub)
            if name:
                parts = name.split(".")
                names.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
                continue
        if isinstance(sub, ast.Subscript):
            stack.append(sub.value)  # `y[i]` reads y's graph; the index carries none
            continue
        stack.extend(ast.iter_child_nodes(sub))
    return names, has_call


def backpropagated_later(model: FileModel, name: str, after: ast.AST) -> bool:
    """``total.backward()`` after the loop, or a loss built from the accumulator
    (``loss = (torch.stack(buf.log_probs) * adv).mean(); loss.backward()``):
    accumulating the graph was the point."""
    fn = model.function_of(after)
    by_function = model.memo(_backward_calls_by_function, _backward_calls_by_function)
    for call in by_function.get(id(fn), ()):
        value = backward_value(model, call)
        if _latest_entry_of(value, name):
            continue  # `losses[-1].backward()`: one step's loss, not the whole history
        seen: set[str] = set()
        todo = [value] if value is not None else []
        while todo and len(seen) < 16:  # the loss and the names it is built from
            names = value_names(todo.pop())[0]
            if name in names:
                return True
            for n in names - seen:
                seen.add(n)
                found = model.flow.definition(n, call) if "." not in n else None
                if found is not None and isinstance(found[1], ast.expr):
                    todo.append(found[1])
    return False


def _backward_calls_by_function(model: FileModel) -> dict[int, list[ast.Call]]:
    """The file's backward calls grouped by their enclosing def (the id of None for the
    module), in the order ``backward_calls`` gives them."""
    out: dict[int, list[ast.Call]] = {}
    for call in backward_calls(model):
        out.setdefault(id(model.function_of(call)), []).append(call)
    return out


def defined_without_grad(model: FileModel, value: ast.AST) -> bool:
    """``value`` names something last assigned where grad mode is off (under
    ``torch.no_grad()``): it carries no graph, whatever computed it."""
    name = dotted(value) if isinstance(value, (ast.Name, ast.Attribute)) else None
    if name is None:
        return False
    found = model.flow.definition(name, value)
    return found is not None and not grad_enabled_at(model, found[0])[0]


def _backpropagated_names(model: FileModel, fn: FunctionNode) -> set[str]:
    """The local names (parameters included) ``fn`` calls backward on, directly or through
    a value made from them (``with amp.scale_loss(loss, opt) as scaled:
    scaled.backward()``)."""
    by_function = model.memo(_backward_calls_by_function, _backward_calls_by_function)
    found: set[str] = set()
    for call in by_function.get(id(fn), ()):
        start = backward_value(model, call)
        todo: list[ast.AST] = [start] if start is not None else []
        budget = 8
        while todo and budget > 0:
            budget -= 1
            names = {n for n in value_names(todo.pop())[0] if "." not in n}
            found |= names
            for n in names:
                there = model.flow.definition(n, call)
                origin = defined_from(there[1]) if there is not None else None
                if origin is not None:
                    todo.append(origin)
    return found


def _uncut_names(expr: ast.AST) -> set[str]:
    """The plain names ``expr`` reads other than through a cut (``loss.item() * n`` reads
    ``n`` only: the loss leaves its graph behind)."""
    found: set[str] = set()
    stack = [expr]
    while stack:
        sub = stack.pop()
        if isinstance(sub, ast.Call):
            func = sub.func
            if (isinstance(func, ast.Attribute) and func.attr in CUT_METHODS) or (
                isinstance(func, ast.Name) and func.id in ("float", "int")
            ):
                continue
        if isinstance(sub, ast.Name):
            found.add(sub.id)
        stack.extend(ast.iter_child_nodes(sub))
    return found


def returns_backpropagated(model: FileModel, fn: FunctionNode) -> bool:
    """Does ``fn`` return (uncut) a value it calls backward on: a per-batch step that
    ends in ``return loss`` after ``loss.backward()``. Its caller receives that batch's
    graph."""
    backpropagated = _backpropagated_names(model, fn)
    if not backpropagated:
        return False
    for ret in model.returns_in(fn):
        if ret.value is None:
            continue
        for name in _uncut_names(ret.value) & backpropagated:
            # the definition the return sees: `loss = loss.item()` before it returns a number
            found = model.flow.definition(name, ret)
            if found is None or not _is_cut(found[1]):
                return True
    return False


def _is_cut(value: ast.AST) -> bool:
    """``x.item()``, ``x.detach()``, ``float(x)``: a value with no graph, whatever ``x``."""
    if not isinstance(value, ast.Call):
        return False
    func = value.func
    return (isinstance(func, ast.Attribute) and func.attr in CUT_METHODS) or (
        isinstance(func, ast.Name) and func.id in ("float", "int")
    )


def backpropagated_by_helper(model: FileModel, value: ast.AST) -> bool:
    """Does ``value`` carry a graph because a same-file helper backpropagates it: it is
    that helper's result built from what it backpropagates (``total += self.train_step(b)``
    where ``train_step`` returns the loss it called backward on; ``self._backward(loss,
    opt)`` returning ``loss * n``), or a name the same function hands to such a helper
    (``self._backward(loss, opt); total += loss``)."""
    if isinstance(value, ast.Call):
        fn = model.resolve_call(value)
        if fn is not None:
            return returns_backpropagated(model, fn)
        found = ANSWERS.resolve_foreign(model, value)  # another project file's function
        return found is not None and bool(found[0].get("returns_graph"))
    if not isinstance(value, ast.Name):
        return False
    here = model.flow.definition(value.id, value)
    fn = model.function_of(value)
    if here is None or fn is None:
        return False
    if isinstance(here[1], ast.Call) and backpropagated_by_helper(model, here[1]):
        return True  # `loss = train_step(batch)`: the step's loss, with its graph
    for call in walk_local(fn):
        if not isinstance(call, ast.Call) or (call.lineno, call.col_offset) > (
            value.lineno,
            value.col_offset,
        ):
            continue
        for arg in call.args:
            if not (isinstance(arg, ast.Name) and arg.id == value.id):
                continue
            there = model.flow.definition(arg.id, arg)
            helper = model.resolve_call(call)
            if there is None or there[0] is not here[0] or helper is None:
                continue
            if parameter_for(model, call, helper, arg) in _backpropagated_names(model, helper):
                return True
    return False


def _latest_entry_of(value: ast.AST | None, name: str) -> bool:
    """``value`` is ``name[-1]``: the entry appended last."""
    if not isinstance(value, ast.Subscript) or dotted(value.value) != name:
        return False
    index = value.slice
    return (
        isinstance(index, ast.UnaryOp)
        and isinstance(index.op, ast.USub)
        and isinstance(index.operand, ast.Constant)
        and index.operand.value == 1
    )


def carries_graph(model: FileModel, value: ast.AST, accumulator: ast.AST) -> bool:
    """Does the accumulated ``value`` hold an autograd graph: the flow says so, or the
    step backpropagates it (or its ``["loss"]`` entry), or backpropagates the
    accumulator's latest entry (``losses.append(f(x)); losses[-1].backward()``),
    whatever computed it -- a loss function handed in as a parameter included."""
    if model.flow.value(value).taint is Taint.GRAD or backpropagated(model, value):
        return True
    if backpropagated_by_helper(model, value):
        return True
    name = dotted(accumulator)
    fn = model.function_of(value)
    return name is not None and any(
        model.function_of(call) is fn and _latest_entry_of(backward_value(model, call), name)
        for call in backward_calls(model)
    )
