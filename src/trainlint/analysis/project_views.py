"""Reading the project's view from one file's analysis: roles known from other files.

:func:`apply_view` hands a file's model the facts the index gathered for it (what
imported factories return, what callers pass to its functions and constructors, which
classes of other files a name is); :func:`foreign_binding` answers "which role does
this expression hold" from them, as a :class:`~trainlint.analysis.project_summary.ForeignBinding`.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from trainlint.analysis.arguments import foreign_fact, parameter_names
from trainlint.analysis.hooks import ANSWERS
from trainlint.analysis.model import dotted, walk_local
from trainlint.analysis.project_summary import (
    Fact,
    ForeignBinding,
    keyword_read,
)
from trainlint.analysis.roles import Binding, Role

if TYPE_CHECKING:
    from trainlint.analysis.model import FileModel

# -- reading a view from the analysis ---------------------------------------------------------


def apply_view(model: FileModel, view: dict | None) -> None:
    """Give ``model`` its project view: star-imported names become imports, and roles
    may ask :func:`foreign_binding`. The data-split facts (``data``) are kept apart: a
    view that holds nothing else leaves ``model.project`` None, as it was without them."""
    model.project_data = view.get("data") if view else None
    if view and "data" in view:
        view = {k: v for k, v in view.items() if k != "data"}
        if not any(view.values()):
            view = None
    model.project = view
    if not view:
        return
    b = model.imports.bindings(model.tree)
    for name, qual in view["stars"].items():
        if name not in b.imports and name not in b.others:
            b.imports[name] = qual


def without_facts(view: dict | None) -> bool:
    """Does ``view`` say nothing about the file's names and calls (None, or only the
    project's data-split facts)? Then the file's own summary is the best view it has."""
    return view is None or set(view) <= {"refs", "stars", "params", "data"} and not (
        view["refs"] or view["stars"] or view["params"]
    )


def with_data(own: dict, view: dict | None) -> dict:
    """``own`` (a file's view of itself) with the data-split facts ``view`` carries."""
    return {**own, "data": view["data"]} if view and "data" in view else own


_FACT_WORDS = {
    "scheduler": b" lr_scheduler Scheduler schedule step(",
    "optimizer": b" optim Optimizer step(",
    "model": b" Module model",
    "thread": b" Thread threading",
}


def view_words(view: dict) -> bytes:
    """Trigger words the view's facts stand for: a file that steps a scheduler made in
    another file never spells `lr_scheduler`, one fed a softmax never spells `softmax`."""
    words = b" torch" if view["stars"] else b""
    if view.get("calls"):  # another file's function runs step events here
        words += b" backward step( zero_grad .grad eval( train( torch"
        if any("keeps" in e for e in view["calls"].values()):
            words += b" append +="  # and keeps what the file passes it (TL302)
    for fact in (
        *view["refs"].values(),
        *(f for p in view["params"].values() for f in p.values()),
        *(f for a in view.get("attrs", {}).values() for f in a.values()),
    ):
        words += _FACT_WORDS.get(fact[0], b"")
        if fact[3]:
            words += b" softmax"
    return words


def _binding(fact: Fact, node: ast.AST, call: ast.Call | None = None) -> ForeignBinding | None:
    try:
        role = Role(fact[0])
    except ValueError:
        return None
    return ForeignBinding(
        role, fact[1], call, node, cls=fact[1], unit=fact[2], softmax=bool(fact[3])
    )


def foreign_binding(model: FileModel, expr: ast.AST) -> Binding | None:
    """The role of ``expr`` known from outside its file's statements: a call to a project
    factory or class, or a parameter (from its annotation, or from every call site)."""
    if isinstance(expr, ast.Call):
        view = getattr(model, "project", None)
        if not view:
            return None
        q = model.qualname(expr.func)
        fact = view["refs"].get(q) if q is not None else None
        return _binding(fact, expr, expr) if fact is not None else _kwargs_binding(model, expr)
    if isinstance(expr, ast.Name):
        return _parameter_binding(model, expr)
    if isinstance(expr, ast.Attribute):
        fact = _chain_fact(model, expr, 0)
        return _binding(fact, expr) if fact is not None and fact[0] != "instance" else None
    if isinstance(expr, (ast.Subscript, ast.Call)):
        return _kwargs_binding(model, expr)
    return None


def _kwargs_binding(model: FileModel, expr: ast.Subscript | ast.Call) -> Binding | None:
    """``kwargs["scheduler"]`` / ``kwargs.get("scheduler")`` in a function with
    ``**kwargs``: the facts of the keyword at every call site."""
    read = keyword_read(expr)
    if read is None:
        return None
    base, key = read
    fn = model.function_of(expr)
    view = getattr(model, "project", None)
    if fn is None or not view or fn.args.kwarg is None or fn.args.kwarg.arg != base:
        return None
    fact = foreign_fact(model, fn, f'{base}["{key}"]')  # the summaries key `**kwargs` entries so
    return _binding(fact, expr) if fact is not None else None


#: Names followed back through single assignments (``t = ctx.training``).
_MAX_CHAIN_NAMES = 4


def _chain_fact(model: FileModel, expr: ast.Attribute, depth: int) -> Fact | None:
    """``ctx.training.scheduler``, ``ctx`` a parameter every call site fills with an
    instance of one project class (or a name assigned once from such a chain): the
    fact the view's attribute facts give the chain's end; None when a link of the
    chain is assigned in this file or says nothing."""
    view = getattr(model, "project", None)
    if not view or not view.get("attrs"):
        return None
    attrs: list[str] = []
    node: ast.expr = expr
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    attrs.reverse()
    assigned = _assigned_chains(model)
    if any(".".join([node.id, *attrs[: i + 1]]) in assigned for i in range(len(attrs))):
        return None
    fact = _root_fact(model, node, view, depth)
    for attr in attrs:
        if fact is None or fact[0] != "instance":
            return None
        fact = view["attrs"].get(fact[1], {}).get(attr)
    return fact


def _root_fact(model: FileModel, name: ast.Name, view: dict, depth: int) -> Fact | None:
    fn = model.function_of(name)
    if fn is None:
        return None
    stores = _stores(model, fn).get(name.id, [])
    if name.id in parameter_names(fn):
        if stores:
            return None  # rebound in the function
        cls = model.class_of(fn)
        if (cls if cls is not None else fn) is None or model.scope_of(
            cls if cls is not None else fn
        ) is not model.tree:
            return None
        key = f"{cls.name}.{fn.name}" if cls is not None else fn.name
        qual = view["instances"].get(key, {}).get(name.id)
        return ["instance", qual, None, False] if qual is not None else None
    if len(stores) != 1 or depth >= _MAX_CHAIN_NAMES:
        return None
    value = stores[0]
    if isinstance(value, ast.Attribute):
        return _chain_fact(model, value, depth + 1)
    if isinstance(value, ast.Name):
        return _root_fact(model, value, view, depth + 1)
    return None


def _stores(model: FileModel, fn: ast.AST) -> dict[str, list[ast.expr | None]]:
    """name -> the values the function assigns it (None: not a plain ``name = value``:
    a loop or ``with`` target, an unpacking, an augmented assignment, a walrus)."""

    def build(m: FileModel) -> dict[int, dict[str, list[ast.expr | None]]]:
        return {}

    memo = model.memo(_stores, build)
    found = memo.get(id(fn))
    if found is not None:
        return found
    out: dict[str, list[ast.expr | None]] = {}
    plain: set[int] = set()
    for node in walk_local(fn):
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            out.setdefault(node.targets[0].id, []).append(node.value)
            plain.add(id(node.targets[0]))
    for node in walk_local(fn):
        if (
            isinstance(node, ast.Name)
            and isinstance(node.ctx, (ast.Store, ast.Del))
            and (id(node) not in plain)
        ):
            out.setdefault(node.id, []).append(None)
    memo[id(fn)] = out
    return out


def _assigned_chains(model: FileModel) -> set[str]:
    """Every dotted name the file assigns or deletes (``t.scheduler = ...``)."""

    def build(m: FileModel) -> set[str]:
        out: set[str] = set()
        for node in ast.walk(m.tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
                name = dotted(node)
                if name is not None:
                    out.add(name)
        return out

    return model.memo(_assigned_chains, build)


_ANNOTATION_ROLES = {
    "torch.nn.Module": Role.MODEL,
    "torch.optim.Optimizer": Role.OPTIMIZER,
    "torch.optim.optimizer.Optimizer": Role.OPTIMIZER,
    "torch.optim.lr_scheduler.LRScheduler": Role.SCHEDULER,
    "torch.optim.lr_scheduler._LRScheduler": Role.SCHEDULER,
}


def _parameter_binding(model: FileModel, name: ast.Name) -> Binding | None:
    fn = model.function_of(name)
    if fn is None:
        return None
    a = fn.args
    param = next((x for x in (*a.posonlyargs, *a.args, *a.kwonlyargs) if x.arg == name.id), None)
    if param is None:
        return None
    fact = foreign_fact(model, fn, name.id)  # what callers in other files pass
    if fact is not None:
        return _binding(fact, param)
    if param.annotation is not None:
        q = model.qualname(param.annotation)
        role = _ANNOTATION_ROLES.get(q or "")
        if role is not None:
            return ForeignBinding(role, q, None, param)
    return None


# The answers this module gives to lower layers (see analysis.hooks).
ANSWERS.foreign_binding = foreign_binding
