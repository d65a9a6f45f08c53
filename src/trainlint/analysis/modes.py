"""Which modules an `eval()` switches, whether training updates them, and whether a path trains before switching them back."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from trainlint.analysis.arguments import argument_at, call_sites, parameter_names, positional_names
from trainlint.analysis.model import (
    NESTED_SCOPES,
    FileModel,
    FunctionNode,
    call_name,
    dotted,
    is_false,
    walk_local,
)
from trainlint.analysis.roles import Role, parameter_owners
from trainlint.analysis.steps import Event, Kind


def same_module(a: str | None, b: str | None) -> bool:
    """Could ``a`` and ``b`` name the same module (one contains the other; None: unknown)?"""
    if a is None or b is None:
        return True
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def trains_before_restore(events: list[tuple[Event, str | None]], target: str | None) -> bool:
    """Does a backward or optimizer step come, in ``events``, before ``target``'s `train()`?"""
    for e, name in events:
        if e.kind is Kind.TRAIN and same_module(name, target):
            return False
        if e.kind is Kind.EVAL and same_module(name, target):
            continue
        if e.kind in (Kind.BACKWARD, Kind.STEP):
            return True
    return False


def restores_before_end(events: list[tuple[Event, str | None]], target: str | None) -> bool:
    """Is ``target`` switched back with `train()` somewhere in ``events``?"""
    return any(e.kind is Kind.TRAIN and same_module(n, target) for e, n in events)


def left_in_eval(
    rest: list[tuple[Event, str | None]],
    paths: list[tuple[Event, ...]],
    names: list[tuple[str | None, ...]],
    target: str | None,
) -> bool:
    """After an `eval()` of ``target``, does training come before its `train()`? ``rest``
    is what follows the `eval()` on its path through the loop; ``paths`` are all the
    loop's paths and ``names`` their events' targets. Either later on the same path, or
    in the next iteration: ``rest`` never restores it and some path trains first."""
    return trains_before_restore(rest, target) or any(
        trains_before_restore(list(zip(p, n, strict=True)), target) is True
        and not restores_before_end(rest, target)
        for p, n in zip(paths, names, strict=True)
    )


#: Modules that are copies of the trained one or frozen on purpose: an EMA/SWA average,
#: a distillation teacher, an RL target network, a frozen reference model.
_COPY_WORD = re.compile(
    r"(^|_)(ema|teacher|frozen|averaged|swa|shadow|target|ref|reference)(_|$)", re.IGNORECASE
)
_COPY_CALLS = re.compile(r"deepcopy|AveragedModel|EMA|Ema|clone_model|copy_model")


def resolved_target(model: FileModel, e: Event) -> str | None:
    """The module ``e`` acts on, as the loop whose path holds it names it."""
    return resolve_through_calls(model, e.target, e.chain)


def resolve_through_calls(
    model: FileModel, target: str | None, chain: tuple[ast.Call, ...]
) -> str | None:
    """``target`` with helper parameters replaced by the arguments at the calls that
    inlined the helper (``validate(net)`` with ``def validate(model)``: ``model`` is
    ``net``); None when an argument is not a plain name."""
    for site in reversed(chain):
        if target is None:
            return None
        fn = model.resolve_call(site)
        if fn is None:
            return target
        root, _, rest = target.partition(".")
        params = positional_names(fn)
        if params and params[0] in ("self", "cls") and isinstance(site.func, ast.Attribute):
            if root == params[0]:
                recv = dotted(site.func.value)
                target = None if recv is None else recv + ("." + rest if rest else "")
                continue
        if root in parameter_names(fn):
            arg = argument_at(model, site, fn, root)
            if arg is None:
                return None
        else:
            continue  # a global or `self.x` of the same object: same name outside
        base = dotted(arg)
        target = None if base is None else base + ("." + rest if rest else "")
    return target


def eval_targets(model: FileModel, e: Event, resolved: str | None) -> list[str | None]:
    """The modules an ``eval()`` switches: ``for net, tag in ((ema, "ema"), (model,
    "live")): net.eval()`` switches each element of the literal it loops over."""
    if e.target is None or "." in e.target:
        return [resolved]
    for anc in model.ancestors(e.node):
        if isinstance(anc, NESTED_SCOPES):
            break
        if not isinstance(anc, (ast.For, ast.AsyncFor)) or not isinstance(
            anc.iter, (ast.Tuple, ast.List)
        ):
            continue
        pos = _binding_position(anc.target, e.target)
        if pos is None:
            continue
        out: list[str | None] = []
        for elt in anc.iter.elts:
            for i in pos:
                if not isinstance(elt, (ast.Tuple, ast.List)) or i >= len(elt.elts):
                    break
                elt = elt.elts[i]
            # a module the step model does not see as one: its `train()` calls are not
            # events either, so whether it is restored cannot be told
            if model.steps.is_model(elt):
                out.append(resolve_through_calls(model, dotted(elt), e.chain))
        return out
    return [resolved]


def _binding_position(target: ast.AST, name: str) -> list[int] | None:
    if isinstance(target, ast.Name):
        return [] if target.id == name else None
    if isinstance(target, (ast.Tuple, ast.List)):
        for i, t in enumerate(target.elts):
            inner = _binding_position(t, name)
            if inner is not None:
                return [i, *inner]
    return None


def switched_by_flag(model: FileModel, node: ast.AST) -> bool:
    """``X.train() if flag else X.eval()`` (or the other way round): the mode follows the
    flag, and the training call passes True."""
    parent = model.parent_of(node)
    if not isinstance(parent, ast.IfExp):
        return False
    other = parent.body if parent.orelse is node else parent.orelse
    return isinstance(other, ast.Call) and call_name(other) == "train"


def copy_or_frozen(model: FileModel, node: ast.AST, target: str | None, frozen: set[str]) -> bool:
    """Is ``target`` a module training does not update: a copy of the trained model (an
    EMA/SWA average, a `deepcopy`, a model rebuilt in the loop from a state dict), a
    teacher or target network, or a module frozen with `requires_grad_(False)`?"""
    if target is None:
        return False
    if any(_COPY_WORD.search(part) for part in target.split(".")):
        return True
    if target in frozen:
        return True
    if "." in target:
        return False
    found = model.flow.definition(target, node)
    if found is None or not isinstance(found[0], ast.Assign):
        return False
    stmt, value = found
    if isinstance(value, ast.Call) and _COPY_CALLS.search(call_name(value) or ""):
        return True
    # bound afresh inside a loop that also runs the eval(): a new object every time
    fn = model.function_of(node)
    loops = {id(lp) for lp in model.enclosing_loops(node)}
    rewraps = any(isinstance(sub, ast.Name) and sub.id == target for sub in ast.walk(value))
    return (
        isinstance(value, ast.Call)
        and not rewraps
        and model.function_of(stmt) is fn
        and any(id(anc) in loops for anc in model.ancestors(stmt))
    )


def frozen_modules(model: FileModel) -> set[str]:
    """Modules the file freezes whole: ``X.requires_grad_(False)``, or ``p.requires_grad =
    False`` / ``p.requires_grad_(False)`` for every ``p`` of a loop over ``X.parameters()``
    (not under an ``if``: freezing some parameters leaves the module trained). A module
    with something unfrozen again (``X.head.requires_grad_(True)``) is not frozen."""
    frozen: set[str] = set()
    unfrozen: set[str] = set()
    for call in model.calls.get("requires_grad_", ()):
        if not isinstance(call.func, ast.Attribute):
            continue
        off = bool(call.args) and is_false(call.args[0])
        names = _frozen_owners(model, call, dotted(call.func.value))
        (frozen if off else unfrozen).update(names)
    for node in model.assignments:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Attribute)
            and node.targets[0].attr == "requires_grad"
            and isinstance(node.value, ast.Constant)
        ):
            names = _frozen_owners(model, node, dotted(node.targets[0].value))
            (frozen if node.value.value is False else unfrozen).update(names)
    return {f for f in frozen if not any(u == f or u.startswith(f + ".") for u in unfrozen)}


def _frozen_owners(model: FileModel, node: ast.AST, name: str | None) -> list[str]:
    """The module a ``requires_grad`` change at ``node`` on ``name`` applies to: ``name``
    itself, or ``X`` when ``name`` is the loop variable of ``for p in X.parameters()``
    and the change is unconditional in that loop."""
    if name is None:
        return []
    conditional = False
    for anc in model.ancestors(node):
        if isinstance(anc, NESTED_SCOPES):
            break
        if isinstance(anc, (ast.If, ast.IfExp)):
            conditional = True
        if isinstance(anc, (ast.For, ast.AsyncFor)):
            bound = (
                anc.target.elts[-1]
                if isinstance(anc.target, ast.Tuple) and (anc.target.elts)
                else anc.target
            )
            if isinstance(bound, ast.Name) and bound.id == name:
                return [] if conditional else _parameters_owner(anc.iter)
            break
    return [name]


def _parameters_owner(it: ast.AST) -> list[str]:
    """``X`` in ``X.parameters()`` (through ``enumerate``/``named_parameters``)."""
    while isinstance(it, ast.Call) and call_name(it) == "enumerate" and it.args:
        it = it.args[0]
    if (
        isinstance(it, ast.Call)
        and isinstance(it.func, ast.Attribute)
        and it.func.attr in ("parameters", "named_parameters")
    ):
        name = dotted(it.func.value)
        return [name] if name is not None else []
    return []


def restores_saved_mode(model: FileModel, e: Event) -> bool:
    """Does the scope of the `eval()` ``e`` put its module back in the mode it saved
    before: ``was_training = net.training; net.eval(); ...; if was_training:
    net.train()``? Inside a training loop the saved mode is training, so the branch
    that restores it is the one that runs."""
    fn = model.function_of(e.node)
    if fn is None or e.target is None:
        return False
    saved = _saved_mode_flags(model, fn)
    if not saved:
        return False
    for call in model.calls.get("train", ()):
        if (
            call.lineno > getattr(e.node, "lineno", 0)
            and isinstance(call.func, ast.Attribute)
            and dotted(call.func.value) == e.target
            and model.function_of(call) is fn
        ):
            for anc in model.ancestors(call):
                if anc is fn:
                    break
                if isinstance(anc, ast.If) and _mentions(anc.test, saved):
                    return True
    return False


def _saved_mode_flags(model: FileModel, fn: ast.AST) -> set[str]:
    """Names bound in ``fn`` to a module's mode (``flag = net.training``; also the
    bound method ``net.train``, which is always true and so always restores)."""
    out: set[str] = set()
    for node in model.assignments:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr in ("training", "train")
            and model.function_of(node) is fn
        ):
            out.add(node.targets[0].id)
    return out


def _mentions(test: ast.AST, names: set[str]) -> bool:
    return any(isinstance(sub, ast.Name) and sub.id in names for sub in ast.walk(test))


def training_ends_after(
    model: FileModel, node: ast.AST, loop: ast.AST, target: str | None = None
) -> bool:
    """Does a `break` out of ``loop`` (or a `return`) follow ``node`` in its block or an
    enclosing block of the loop body, with no loop in between: an `eval()` right before
    an early-stopping `break` leaves a model that is no longer trained. A `break` out of
    an inner loop counts when ``loop`` builds ``target`` afresh each iteration (one
    training run per iteration, each on a new model)."""
    for parent, after in _rest_of_blocks(model, node, loop):
        if any(isinstance(s, (ast.Return, ast.Raise)) for s in after):
            return True
        if parent is loop and any(isinstance(s, ast.Break) for s in after):
            return True
        if parent is not loop and any(isinstance(s, ast.Break) for s in after):
            inner = _innermost_loop(model, parent)
            return inner is loop or (inner is not None and _rebuilt_in(model, loop, inner, target))
    return False


def _rest_of_blocks(
    model: FileModel, node: ast.AST, loop: ast.AST
) -> Iterator[tuple[ast.AST, list[ast.stmt]]]:
    """(block owner, the statements after ``node``'s statement in that block) for each
    block that encloses it, innermost first, up to ``loop``'s body; the climb stops at a
    nested def, class or lambda (nothing more) and after an inner loop (whose next
    iteration may come first)."""
    stmt: ast.AST = model.statement_of(node)
    while stmt is not loop:
        parent = model.parent_of(stmt)
        if parent is None or isinstance(parent, NESTED_SCOPES):
            return
        for field in ("body", "orelse", "finalbody"):
            block = getattr(parent, field, None)
            if isinstance(block, list) and stmt in block:
                yield parent, block[block.index(stmt) + 1 :]
        if isinstance(parent, (ast.For, ast.AsyncFor, ast.While)):
            return
        stmt = parent


def _rebuilt_in(model: FileModel, loop: ast.AST, inner: ast.AST, target: str | None) -> bool:
    """Is ``target`` bound in ``loop``'s body, before ``inner``, to a new object (a call
    that does not take ``target`` itself)?"""
    if target is None or "." in target:
        return False
    for node in model.assignments:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == target for t in node.targets)
            and isinstance(node.value, ast.Call)
            and node.lineno < getattr(inner, "lineno", 0)
            and not any(isinstance(n, ast.Name) and n.id == target for n in ast.walk(node.value))
            and any(a is loop for a in model.ancestors(node))
            and _innermost_loop(model, node) is loop
        ):
            return True
    return False


def _innermost_loop(model: FileModel, node: ast.AST) -> ast.AST | None:
    if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
        return node
    for anc in model.ancestors(node):
        if isinstance(anc, (ast.For, ast.AsyncFor, ast.While)):
            return anc
        if isinstance(anc, NESTED_SCOPES):
            return None
    return None


def optimized_modules(model: FileModel) -> set[str] | None:
    """The modules whose parameters the file's optimizers update, as the file names them
    (``head`` for ``SGD(head.parameters())``; every plain argument of a project factory
    ``make_optimizer(cfg, head)``); None when some optimizer stepped in the file was not
    built here or its parameters cannot be told."""
    return model.memo(optimized_modules, _optimized_modules)


def _optimized_modules(model: FileModel) -> set[str] | None:
    roles = model.roles
    owners: set[str] = set()
    built: list = []
    for call in model.calls.get("step", ()):
        if not isinstance(call.func, ast.Attribute):
            continue
        recv = call.func.value
        if roles.role(recv, by_name=True) is not Role.OPTIMIZER:
            continue
        b = roles.lookup(recv)
        if (b is None or isinstance(b.node, ast.arg)) and _called_parameter(model, recv):
            continue  # handed in by this file's own calls: its constructions below
        if b is None or b.call is None:
            return None
        built.append(b)
    # every construction of the file counts too: more owners, fewer modules left out
    built += [b for _, b in roles.all_of(Role.OPTIMIZER)]
    if not built or any(b.call is None for b in built):
        return None
    for b in built:
        found = [dotted(o) for o in parameter_owners(b.call)]
        if not found:
            q = model.qualname(b.call.func) or call_name(b.call) or ""
            last = q.rsplit(".", 1)[-1]
            if q.startswith("torch.") or last[:1].isupper() or not b.call.args:
                # an optimizer class given a parameter list built elsewhere, not a
                # factory given the module: cannot tell whose parameters
                return None
            found = [dotted(a) for a in (*b.call.args, *(k.value for k in b.call.keywords))]
        mapped = _through_call_sites(model, b.call, found)
        if mapped is None:
            return None
        owners.update(mapped)
    return owners


def _through_call_sites(
    model: FileModel, call: ast.Call, found: list[str | None]
) -> list[str] | None:
    """``found`` as the callers name them: a parameter of the function that builds the
    optimizer (``def make(module): return SGD(module.parameters())``) stands for every
    argument passed for it in this file; None when one cannot be told."""
    fn = model.function_of(call)
    params = parameter_names(fn) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
    out: list[str] = []
    for name in found:
        if name is None:
            return None
        root, _, rest = name.partition(".")
        if root not in params or root in ("self", "cls") or fn is None:
            out.append(name)
            continue
        sites = call_sites(model, fn, instances=False)
        if not sites:
            return None
        for site in sites:
            arg = argument_at(model, site, fn, root)
            base = dotted(arg) if arg is not None else None
            if base is None:
                return None
            out.append(base + ("." + rest if rest else ""))
    return out


def _called_parameter(model: FileModel, expr: ast.AST) -> bool:
    """``expr`` is a parameter of a function this file calls (by its plain name)."""
    if not isinstance(expr, ast.Name):
        return False
    fn = model.function_of(expr)
    if fn is None or not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    params = {a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)}
    return expr.id in params and fn.name in model.calls


def outside_optimizers(model: FileModel, target: str | None) -> bool:
    """Is ``target`` a module no optimizer of the file updates (a frozen backbone under
    a linear probe: only the head's parameters are optimized)?"""
    if target is None:
        return False
    owners = optimized_modules(model)
    if owners is None:
        return False
    last = target.rsplit(".", 1)[-1]
    # `self.model` and a local `model` may be one object: a shared last name counts
    return not any(same_module(target, o) or o.rsplit(".", 1)[-1] == last for o in owners)


def restored_or_ended(model: FileModel, node: ast.AST, loop: ast.AST, target: str | None) -> bool:
    """After ``node``, does every way through the rest of ``loop``'s body reach
    ``target.train()``, or leave the loop (`return`, `raise`, a `break` of it), before the
    iteration ends? Statements only: an `if` counts when both branches do."""
    if target is None:
        return False
    return any(
        _block_settles(after, loop, target) for _, after in _rest_of_blocks(model, node, loop)
    )


def _block_settles(stmts: list[ast.stmt], loop: ast.AST, target: str) -> bool:
    return any(_settles(s, loop, target) for s in stmts)


def _settles(stmt: ast.stmt, loop: ast.AST, target: str) -> bool:
    if isinstance(stmt, (ast.Return, ast.Raise)):
        return True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        func = stmt.value.func
        return (
            isinstance(func, ast.Attribute)
            and func.attr == "train"
            and not stmt.value.args
            and dotted(func.value) == target
        )
    if isinstance(stmt, ast.If):
        return bool(stmt.orelse) and all(
            _block_settles(b, loop, target) for b in (stmt.body, stmt.orelse)
        )
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return _block_settles(stmt.body, loop, target)
    return False


# A framework's validation hooks: `train_validation_begin`, `on_validation_start`, ...
_BEGIN_HOOK = re.compile(r"^(?P<stem>\w*(valid|eval|test)\w*?)_(begin|start)$")
_END_SUFFIXES = ("_end", "_stop", "_finish", "_done")
_PER_STEP_HOOK = re.compile(r"step|batch|iter")


def hooks_left_in_eval(model: FileModel) -> list[ast.Call]:
    """`eval()` calls in a validation begin hook (``train_validation_begin``,
    ``on_validation_start``) of a class that trains (a method backpropagates or steps)
    and sets train mode in some other hook, where the matching end hook (``*_end``,
    ``*_stop``; its own or a same-file base's) does not call `train()` and no per-step
    hook does: the framework that drives the hooks (its loop in another module) comes
    back to train mode only at the next epoch's begin hook, so a validation run in the
    middle of an epoch leaves the rest of it training in eval mode. An epoch-level
    validation hook (``on_validation_epoch_start``) runs between epochs and stays silent,
    as does a class with a base of another file (the end hook may be there)."""

    def build(m: FileModel) -> list[ast.Call]:
        out: list[ast.Call] = []
        if not m.imports_training_library:
            return out
        for cls in m.classes:
            methods = _class_methods(m, cls)
            if methods is None:
                continue
            kinds = {name: _mode_kinds(m, fn) for name, fn in methods.items()}
            if not any(k & {Kind.BACKWARD, Kind.STEP} for k in kinds.values()):
                continue
            for name, fn in m.methods(cls).items():
                hook = _BEGIN_HOOK.match(name)
                if hook is None or "epoch" in name or Kind.EVAL not in kinds[name]:
                    continue  # (a validation epoch runs between epochs: the next restores)
                stem = hook.group("stem")
                ends = [stem + s for s in _END_SUFFIXES if stem + s in methods]
                if any(Kind.TRAIN in kinds[e] for e in ends):
                    continue
                restorers = [n for n, k in kinds.items() if Kind.TRAIN in k and n != name]
                if not restorers or any(_PER_STEP_HOOK.search(n) for n in restorers):
                    continue
                out.extend(
                    n
                    for n in walk_local(fn)
                    if isinstance(n, ast.Call) and _kind(m, n) is Kind.EVAL
                )
        return out

    return model.memo(hooks_left_in_eval, build)


def _class_methods(model: FileModel, cls: ast.ClassDef) -> dict[str, FunctionNode] | None:
    """The methods of ``cls`` and its same-file bases (the nearest definition of each
    name); None when a base is not a class of this file."""
    out: dict[str, FunctionNode] = {}
    seen: set[int] = set()
    cur: ast.ClassDef | None = cls
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        bases = [b for b in cur.bases if not (isinstance(b, ast.Name) and b.id == "object")]
        if len(bases) > 1:
            return None
        for name, fn in model.methods(cur).items():
            out.setdefault(name, fn)
        if not bases:
            return out
        base = model.local_base(cur)
        if base is None:
            return None
        cur = base
    return out


def _mode_kinds(model: FileModel, fn: FunctionNode) -> set[Kind]:
    kinds: set[Kind] = set()
    for n in walk_local(fn):
        if isinstance(n, ast.Call):
            k = _kind(model, n)
            if k is not None:
                kinds.add(k)
    return kinds


def _kind(model: FileModel, call: ast.Call) -> Kind | None:
    e = model.steps.classify(call)
    return e.kind if e is not None else None
