"""Where a dispatched object goes after the function that dispatched it returns.

TL501 and TL502 ask whether the parent uses a model after workers trained a copy of it.
When the dispatch sits in a helper (``launch(model, shards)``) or a trainer method
(``Trainer.fit()``) that never looks at the model again, the use that matters is in the
*caller*: ``launch(model, shards); evaluate(model)`` or ``trainer.fit();
torch.save(trainer.model.state_dict(), ...)``.

The question is asked in the dispatching function's own terms (``model``, a parameter;
``self.model``, an attribute of the receiver) and mapped onto each call site: a
parameter becomes the argument passed there, ``self.attr`` becomes ``receiver.attr``.
Same-file callers are followed up to :data:`MAX_CALLER_DEPTH` calls (a caller that only
hands its own parameter on asks its callers in turn; cycles are cut). Callers in other
files of the project answer through the index: each file's summary lists, per call to a
project function or method, the slots whose object the caller reads afterwards
(:func:`reads_after_calls`), and the dispatching file's view holds them
(``view["after"]``, read by :func:`used_by_callers`).

A caller that loads weights back into the object, rebinds it, or calls
``share_memory()`` anywhere in its scope counts as no use (the sharing is deliberate or
the weights come back); a call site this module cannot map says nothing.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainlint.analysis.arguments import argument_at, call_sites, parameter_names
from trainlint.analysis.escapes import escapes
from trainlint.analysis.model import dotted, walk_local
from trainlint.analysis.project_modules import absolute

if TYPE_CHECKING:
    from trainlint.analysis.escapes import Dispatch, Escapes
    from trainlint.analysis.model import FileModel, FunctionNode

#: how many same-file callers up a dispatched object is followed
MAX_CALLER_DEPTH = 3
#: a slot: ``("arg", parameter, rest)`` or ``("self", "", rest)``; rest is ``.encoder``-like
Slot = tuple[str, str, str]


def _pos(node: ast.AST) -> tuple[int, int]:
    return (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))


def _end(node: ast.AST) -> tuple[int, int]:
    return (getattr(node, "end_lineno", 0) or 0, getattr(node, "end_col_offset", 0) or 0)


def _slots(model: FileModel, fn: FunctionNode, names: set[str]) -> list[Slot]:
    """``names`` (dotted, in ``fn``'s terms) as what a caller can see of them."""
    params = parameter_names(fn)
    method = model.class_of(fn) is not None and params[:1] == ["self"]
    out: list[Slot] = []
    for name in sorted(names):
        root, _, rest = name.partition(".")
        rest = f".{rest}" if rest else ""
        if method and root == "self":
            if rest:
                out.append(("self", "", rest))
        elif root in params and not (method and root == params[0]):
            out.append(("arg", root, rest))
    return out


def _value_of(model: FileModel, recv: ast.expr) -> ast.AST | None:
    """What ``recv`` holds at its use: its reaching assignment's value for a name."""
    if isinstance(recv, ast.Name):
        found = model.flow.definition(recv.id, recv)
        return found[1] if found is not None else None
    return recv


def _caller_names(esc: Escapes, site: ast.Call, fn: FunctionNode, slots: list[Slot]) -> set[str]:
    """The caller's dotted names for ``slots`` at ``site``; empty when one cannot be told."""
    out: set[str] = set()
    for kind, param, rest in slots:
        if kind == "arg":
            arg = argument_at(esc.model, site, fn, param)
            name = dotted(esc.unwrap(arg)) if arg is not None else None
        else:
            func = site.func
            name = dotted(func.value) if isinstance(func, ast.Attribute) else None
        if name is not None:
            out.add(name + rest)
    return out


def shares_in_scope(model: FileModel, node: ast.AST) -> bool:
    """A ``share_memory()``/``share_memory_()`` call in the function around ``node`` (or
    the module, at top level): the caller shares on purpose, whatever it shares."""
    scope = model.function_of(node) or model.tree
    for name in ("share_memory", "share_memory_"):
        for call in model.calls.get(name, ()):
            if (model.function_of(call) or model.tree) is scope:
                return True
    return False


def used_by_callers(
    esc: Escapes, node: ast.AST, names: set[str], depth: int = 0, seen: frozenset[int] = frozenset()
) -> bool:
    """Some caller of the function around ``node`` reads one of ``names`` (named in that
    function's terms) after the call returns, without loading weights back into it,
    rebinding it or sharing memory: in this file (followed up to ``MAX_CALLER_DEPTH``
    calls) or, through the project view, in another."""
    model = esc.model
    fn = model.function_of(node)
    if fn is None or id(fn) in seen or depth > MAX_CALLER_DEPTH:
        return False
    slots = _slots(model, fn, names)
    if not slots:
        return False
    if _foreign_reads(model, fn, slots):
        return True
    seen = seen | {id(fn)}
    for site in call_sites(model, fn):
        mapped = _caller_names(esc, site, fn, slots)
        if not mapped or shares_in_scope(model, site) or esc.loaded_back(site, mapped):
            continue
        if esc.used_after(site, mapped, loops=False):
            return True
        if used_by_callers(esc, site, mapped, depth + 1, seen):
            return True
    return False


def _qualified(model: FileModel, fn: FunctionNode) -> str | None:
    """``fn``'s name in its module's summary: ``launch`` or ``Trainer.fit`` (top level)."""
    cls = model.class_of(fn)
    if cls is None:
        return fn.name if model.scope_of(fn) is model.tree else None
    return f"{cls.name}.{fn.name}" if model.scope_of(cls) is model.tree else None


def _foreign_reads(model: FileModel, fn: FunctionNode, slots: list[Slot]) -> bool:
    view = getattr(model, "project", None) or {}
    key = _qualified(model, fn)
    read = set(view.get("after", {}).get(key, ())) if key is not None else set()
    if not read:
        return False
    for kind, param, rest in slots:
        if kind == "arg" and param in read:
            return True
        if kind == "self" and "self." + rest[1:].split(".", 1)[0] in read:
            return True
    return False


# -- the summary side: what a file's calls into other modules leave to be read ----------------


def _loads(
    model: FileModel, scope: ast.AST, memo: dict[int, list[tuple[Any, str]]]
) -> list[tuple[Any, str]]:
    """(position, dotted name) of every name and attribute the scope reads, once per scope."""
    found = memo.get(id(scope))
    if found is None:
        found = memo[id(scope)] = [
            (_pos(sub), name)
            for sub in walk_local(scope)
            if isinstance(sub, (ast.Name, ast.Attribute))
            and isinstance(sub.ctx, ast.Load)
            and (name := dotted(sub)) is not None
        ]
    return found


def _read_after(loads: list[tuple[Any, str]], end: tuple[int, int], name: str) -> list[str]:
    """The reads of ``name`` (or of an attribute of it) after ``end``."""
    prefix = name + "."
    return [d for p, d in loads if p > end and (d == name or d.startswith(prefix))]


def reads_after_calls(
    model: FileModel, module: str, is_pkg: bool, project: Callable[[str], bool]
) -> list[list[Any]]:
    """``[callee qualname, slots]`` for each call in the file to a function or method of
    another project module whose argument (slot: position or keyword) or receiver
    attribute (slot: ``self.attr``) the caller reads after the call returns: the index
    hands them to the callee's file (``view["after"]``). ``project`` says whether an
    absolute qualname may name a project function (the summary's judgement). The escape
    analysis is built only for a file that makes such a call."""
    out: list[list[Any]] = []
    instances = _instance_names(model, module, is_pkg, project)
    esc: Escapes | None = None
    memo: dict[int, list[tuple[Any, str]]] = {}
    for calls in model.calls.values():
        for site in calls:
            callee = _callee(model, site, module, is_pkg, project, instances)
            if callee is None or shares_in_scope(model, site):
                continue
            esc = esc or escapes(model)
            loads = _loads(model, model.function_of(site) or model.tree, memo)
            end = _end(model.statement_of(site))
            slots: list[Any] = []
            given: list[tuple[int | str, ast.expr]] = [
                *((i, a) for i, a in enumerate(site.args) if not isinstance(a, ast.Starred)),
                *((k.arg, k.value) for k in site.keywords if k.arg is not None),
            ]
            for where, arg in given:
                # only what may be a model or optimizer (not a loader, a lock, a pool)
                obj = esc.sent_object(arg, through_put=False)
                arg_name = dotted(obj) if obj is not None else None
                if (
                    arg_name is not None
                    and _read_after(loads, end, arg_name)
                    and not esc.loaded_back(site, {arg_name})
                ):
                    slots.append(where)
            func = site.func
            recv = dotted(func.value) if callee[1] and isinstance(func, ast.Attribute) else None
            if recv is not None:
                attrs = {d[len(recv) + 1 :].split(".", 1)[0] for d in _read_after(loads, end, recv)}
                attrs.discard("")
                slots.extend(
                    f"self.{a}" for a in sorted(attrs) if not esc.loaded_back(site, {f"{recv}.{a}"})
                )
            if slots:
                out.append([callee[0], slots])
    out.sort(key=repr)
    return out


def _instance_names(
    model: FileModel, module: str, is_pkg: bool, project: Callable[[str], bool]
) -> set[str]:
    """Names the file assigns an instance of a project class (``trainer = Trainer(...)``):
    the only receivers whose method calls may reach another module's method."""
    out: set[str] = set()
    for node in model.assignments:
        value = node.value
        if not isinstance(node, ast.Assign) or not isinstance(value, ast.Call):
            continue
        qual = model.qualname(value.func)
        if qual is not None and project(absolute(qual, module, is_pkg)):
            out.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return out


def _callee(
    model: FileModel,
    site: ast.Call,
    module: str,
    is_pkg: bool,
    project: Callable[[str], bool],
    instances: set[str],
) -> tuple[str, bool] | None:
    """(the project qualname ``site`` calls, whether it is a method on an instance)."""
    func = site.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        if func.value.id in instances:
            return _method_callee(model, func, module, is_pkg, project)
    qual = model.qualname(func)
    if qual is not None:
        full = absolute(qual, module, is_pkg)
        return (full, False) if project(full) else None
    return None


def _method_callee(
    model: FileModel,
    func: ast.Attribute,
    module: str,
    is_pkg: bool,
    project: Callable[[str], bool],
) -> tuple[str, bool] | None:
    if not isinstance(func.value, ast.Name):
        return None
    value = _value_of(model, func.value)
    if not isinstance(value, ast.Call):
        return None
    cls = model.qualname(value.func)
    if cls is None or not project(full := absolute(cls, module, is_pkg)):
        return None
    return f"{full}.{func.attr}", True


def left_on_a_copy(esc: Escapes, d: Dispatch, *, through_put: bool = True) -> set[str]:
    """Names (in the dispatcher's terms) of the models/optimizers ``d`` trains on a copy
    that the dispatcher reads afterwards (:meth:`Escapes.trained_on_a_copy`) or, when it
    does not, one of its callers reads after it returns, with no weights loaded back."""
    names = esc.trained_on_a_copy(d, d.call, through_put=through_put)
    if names:
        return names
    names = esc.caller_names(esc.trained_objects(d, through_put=through_put))
    if not names or esc.loaded_back(d.call, names) or not used_by_callers(esc, d.call, names):
        return set()
    return names
