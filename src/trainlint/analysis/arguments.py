"""What a function's parameter holds, read from the calls that fill it.

The one place to ask "which value does parameter ``p`` of ``fn`` hold at its callers".
Rules and meaning-layer analyses ask here instead of mapping call arguments themselves:

* :func:`bind`: parameter -> argument expression for one call, given the callee's
  definition (positional after a bound receiver, keywords; a ``*args`` splat ends the
  positional mapping, since what it spreads is unknown);
* :func:`argument_at`: the expression one call passes for one parameter (not its default);
  :func:`parameter_for`, the reverse: which parameter an argument of a call fills;
* :func:`passed_for`, :func:`passed_at`: the same, when only the callee's parameter
  names or the parameter's position are known (a function in another file, read from
  its summary);
* :func:`call_sites`: the calls of a function in its own file: by name, as
  ``self.method()``, and as ``obj.method()`` on an instance of its class built here;
* :func:`arguments_for`: (call, expression) for each same-file call that passes it;
* :func:`arguments_at_callers`: the complete answer: every expression any same-file call
  passes (its default where a call leaves it out), followed up through callers that only
  hand on a parameter of their own (at most :data:`MAX_CALLER_DEPTH` calls up, cycles
  cut), or ``None`` when that cannot be known (a splat that may hold it, the function
  handed around as a value, too deep);
* :func:`foreign_fact`: what callers in other files pass, as the project view records it
  (the facts the index joined from their summaries under ``view["params"]``).
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Any

from trainlint.analysis.model import keyword, walk_local

if TYPE_CHECKING:
    from trainlint.analysis.model import FileModel, FunctionNode

#: how many callers up :func:`arguments_at_callers` follows a parameter handed on
MAX_CALLER_DEPTH = 3


def parameter_names(fn: ast.AST) -> list[str]:
    """The named parameters of a def or lambda: positional-only, positional, keyword-only."""
    a = getattr(fn, "args", None)
    if not isinstance(a, ast.arguments):
        return []
    return [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]


def positional_names(fn: ast.AST) -> list[str]:
    a = getattr(fn, "args", None)
    if not isinstance(a, ast.arguments):
        return []
    return [x.arg for x in (*a.posonlyargs, *a.args)]


def is_static(fn: ast.AST) -> bool:
    decorators = getattr(fn, "decorator_list", ())
    return any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in decorators)


def receiver_skip(model: FileModel, call: ast.Call, fn: FunctionNode) -> int:
    """1 when ``call`` fills ``fn``'s first parameter itself: a method reached through a
    receiver (``self.step(x)``, ``trainer.fit(x)``) or an ``__init__`` through its class
    (``Trainer(x)``); 0 otherwise."""
    if is_construction(model, call, fn):
        return 1
    method = isinstance(call.func, ast.Attribute) and model.class_of(fn) is not None
    return 1 if method and not is_static(fn) else 0


def is_construction(model: FileModel, call: ast.Call, fn: FunctionNode) -> bool:
    """Is ``call`` a construction (``Trainer(...)``) of a module-level class whose
    ``__init__`` (its own or inherited from a base defined here) is ``fn``?"""
    if fn.name != "__init__" or not isinstance(call.func, ast.Name):
        return False
    cls = model.class_named(call.func.id)
    return cls is not None and model.method_of(cls, "__init__") is fn


def bind(
    fn: ast.AST, args: list[ast.expr], keywords: list[ast.keyword], skip: int = 0
) -> tuple[tuple[str, ast.expr], ...]:
    """Parameter -> argument, for a call ``fn(*args, **keywords)`` that skips the first
    ``skip`` positional parameters (``self``, a spawned worker's rank)."""
    positional = positional_names(fn)[skip:]
    out: list[tuple[str, ast.expr]] = []
    for i, arg in enumerate(args):
        if isinstance(arg, ast.Starred) or i >= len(positional):
            break
        out.append((positional[i], arg))
    named = set(parameter_names(fn))
    for kw in keywords:
        if kw.arg is not None and kw.arg in named:
            out.append((kw.arg, kw.value))
    return tuple(out)


def argument_at(model: FileModel, call: ast.Call, fn: FunctionNode, param: str) -> ast.expr | None:
    """The expression ``call`` passes for ``fn``'s parameter ``param``; None when it passes
    none that can be seen (left to its default, or inside a splat)."""
    for name, arg in bind(fn, list(call.args), call.keywords, receiver_skip(model, call, fn)):
        if name == param:
            return arg
    return None


def parameter_for(model: FileModel, call: ast.Call, fn: FunctionNode, arg: ast.AST) -> str | None:
    """The reverse question: which parameter of ``fn`` the argument node ``arg`` of
    ``call`` fills (None for one that lands in ``*args``/``**kwargs`` or after a splat)."""
    for name, given in bind(fn, list(call.args), call.keywords, receiver_skip(model, call, fn)):
        if given is arg:
            return name
    return None


def passed_for(call: ast.Call, positional: list[str], name: str) -> ast.expr | None:
    """What ``call`` passes for the parameter ``name`` of a callee whose positional
    parameters (after any receiver) are ``positional``: by position unless a splat comes
    first, else by keyword."""
    return passed_at(call, positional.index(name) if name in positional else -1, name)


def passed_at(call: ast.Call, index: int, name: str) -> ast.expr | None:
    """What ``call`` passes for the parameter ``name`` at position ``index`` (counted after
    any receiver; -1 for keyword-only): the positional argument there unless a splat comes
    first, else the keyword."""
    if 0 <= index < len(call.args) and not any(
        isinstance(a, ast.Starred) for a in call.args[: index + 1]
    ):
        return call.args[index]
    return keyword(call, name)


def _instance_class(model: FileModel, recv: ast.expr) -> ast.ClassDef | None:
    """The same-file class ``recv`` (``trainer`` assigned ``Trainer(...)``, or
    ``Trainer(...)`` itself) is an instance of."""
    value: ast.AST | None = recv
    if isinstance(recv, ast.Name):
        found = model.flow.definition(recv.id, recv)
        value = found[1] if found is not None else None
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
        return model.class_named(value.func.id)
    return None


def call_sites(
    model: FileModel, fn: FunctionNode, *, instances: bool = True, constructions: bool = False
) -> list[ast.Call]:
    """Calls of ``fn`` in its own file: by name and as ``self.method(...)`` (the file
    model's call graph); with ``instances`` also as ``obj.method(...)`` on an instance of
    its class (or of a subclass defined here) built in the file; with ``constructions``,
    for an ``__init__``, the constructions of its class (``Trainer(...)``)."""
    sites = list(model.call_sites.get(id(fn), ()))
    cls = model.class_of(fn)
    if cls is None:
        return sites
    if constructions and fn.name == "__init__":
        for call in model.calls.get(cls.name, ()):
            if is_construction(model, call, fn) and not any(s is call for s in sites):
                sites.append(call)
    if not instances:
        return sites
    for call in model.calls.get(fn.name, ()):
        func = call.func
        if not isinstance(func, ast.Attribute) or any(s is call for s in sites):
            continue
        if isinstance(func.value, ast.Name) and func.value.id in ("self", "cls"):
            continue  # (resolved by call_sites when it is this class's method)
        owner = _instance_class(model, func.value)
        if owner is not None and model.method_of(owner, fn.name) is fn:
            sites.append(call)
    return sites


def arguments_for(
    model: FileModel, fn: FunctionNode, param: str, *, instances: bool = False
) -> list[tuple[ast.Call, ast.expr]]:
    """(call, caller expression) for each same-file call of ``fn`` that passes ``param``;
    calls that leave it out are not listed."""
    out = []
    for site in call_sites(model, fn, instances=instances):
        arg = argument_at(model, site, fn, param)
        if arg is not None:
            out.append((site, arg))
    return out


def default_of(fn: ast.AST, param: str) -> ast.expr | None:
    """The default value of ``fn``'s parameter ``param``, if it has one."""
    a = getattr(fn, "args", None)
    if not isinstance(a, ast.arguments):
        return None
    positional = [*a.posonlyargs, *a.args]
    with_default = positional[len(positional) - len(a.defaults) :]
    for p, d in zip(with_default, a.defaults, strict=True):
        if p.arg == param:
            return d
    for p, kd in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        if p.arg == param:
            return kd
    return None


def rebinds(fn: ast.AST, name: str) -> bool:
    """Does ``fn`` assign ``name`` in its own body (then the parameter's value may be gone
    where it is read)?"""
    return any(
        isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Load)
        for n in walk_local(fn)
    )


class _ValueReads:
    """The names and attribute names a file reads other than as a call's callee, each
    name with the nodes that read it (a read shadowed by a local binding of the same name
    in a function around it is another object, not the function)."""

    def __init__(self, model: FileModel) -> None:
        self.model = model
        self.names: dict[str, list[ast.Name]] = {}
        self.attrs: set[str] = set()
        self._bound: dict[int, set[str]] = {}
        for node in ast.walk(model.tree):
            if not isinstance(node, (ast.Name, ast.Attribute)) or not isinstance(node.ctx, ast.Load):
                continue
            parent = model.parent_of(node)
            if isinstance(parent, ast.Call) and parent.func is node:
                continue
            if isinstance(node, ast.Name):
                self.names.setdefault(node.id, []).append(node)
            else:
                self.attrs.add(node.attr)

    def bound_in(self, scope: ast.AST) -> set[str]:
        found = self._bound.get(id(scope))
        if found is None:
            found = set(parameter_names(scope))
            for n in walk_local(scope):
                if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
                    found.add(n.id)
                elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    found.add(n.name)
                elif isinstance(n, (ast.Import, ast.ImportFrom)):
                    found.update((a.asname or a.name).split(".")[0] for a in n.names)
            self._bound[id(scope)] = found
        return found

    def reads_function(self, fn: FunctionNode) -> bool:
        home = self.model.scope_of(fn)
        for node in self.names.get(fn.name, ()):
            for scope in self.model.scope_chain(node):
                if scope is home or scope is self.model.tree:
                    return True  # no function between binds the name: the read is `fn`
                if isinstance(scope, ast.ClassDef):
                    continue  # class bodies do not scope the functions inside them
                if fn.name in self.bound_in(scope):
                    break  # a local of the same name: another object
        return False


def escapes_as_value(model: FileModel, fn: FunctionNode) -> bool:
    """Is ``fn`` named anywhere in its file other than as the callee of a call (handed to
    ``map``, stored, returned, passed as a callback, a decorator)? Then calls this file
    cannot see may fill its parameters. A method is judged by its attribute name (any
    ``x.name`` read counts); a function by the reads of its name that are not shadowed
    by a local of the same name."""
    reads = model.memo(_ValueReads, _ValueReads)
    if model.class_of(fn) is not None:
        return fn.name in reads.attrs
    return reads.reads_function(fn)


def _splat_may_hold(model: FileModel, call: ast.Call, fn: FunctionNode, param: str) -> bool:
    """Could a ``*args`` or ``**kwargs`` splat of ``call`` fill ``param``?"""
    if any(kw.arg is None for kw in call.keywords):
        return True
    positional = positional_names(fn)[receiver_skip(model, call, fn) :]
    if param not in positional:
        return False
    i = positional.index(param)
    return any(isinstance(a, ast.Starred) for a in call.args[: i + 1])


def arguments_at_callers(
    model: FileModel,
    fn: FunctionNode,
    param: str,
    *,
    depth: int = MAX_CALLER_DEPTH,
    _seen: frozenset[int] = frozenset(),
) -> list[ast.expr] | None:
    """Every expression a same-file call of ``fn`` passes for ``param``: the argument, or
    ``fn``'s default where a call leaves it out. An argument that is itself a parameter of
    the calling function, never rebound there, is replaced by what that function's
    callers pass, up to ``depth`` calls up (a cycle or the limit is unknown). ``None``
    when the answer cannot be complete: a call may fill it through a splat, a call leaves
    it out and it has no default, ``fn`` is handed around as a value, or a caller's
    parameter cannot be followed. An empty list: no call in this file."""
    if id(fn) in _seen or depth < 0 or param not in parameter_names(fn):
        return None
    if escapes_as_value(model, fn):
        return None
    seen = _seen | {id(fn)}
    out: list[ast.expr] = []
    for site in call_sites(model, fn, constructions=True):
        if _splat_may_hold(model, site, fn, param):
            return None
        arg = argument_at(model, site, fn, param) or default_of(fn, param)
        if arg is None:
            return None
        caller = model.function_of(site)
        if (
            isinstance(arg, ast.Name)
            and caller is not None
            and arg.id in parameter_names(caller)
            and not rebinds(caller, arg.id)
        ):
            if depth == 0:
                return None
            found = arguments_at_callers(model, caller, arg.id, depth=depth - 1, _seen=seen)
            if not found:  # unknown, or a helper nobody here calls: its callers elsewhere
                return None
            out.extend(found)
            continue
        out.append(arg)
    return out


def foreign_facts(model: FileModel, fn: FunctionNode) -> dict[str, Any]:
    """What callers in other files of the project pass for ``fn``'s parameters, as the
    project view records it: parameter (or ``kwargs["key"]``) -> a role fact or a project
    class instance that every such call agrees on. Empty without a view and for a
    function nested in another (no other file can call it by name)."""
    view = getattr(model, "project", None)
    if not view:
        return {}
    cls = model.class_of(fn)
    if cls is not None:
        if model.scope_of(cls) is not model.tree:
            return {}
        key = f"{cls.name}.{fn.name}"
    elif model.scope_of(fn) is model.tree:
        key = fn.name
    else:
        return {}
    found: dict[str, Any] = view.get("params", {}).get(key, {})
    return found


def foreign_fact(model: FileModel, fn: FunctionNode, param: str) -> Any:
    """:func:`foreign_facts` for one parameter; None when the view knows nothing."""
    return foreign_facts(model, fn).get(param)
