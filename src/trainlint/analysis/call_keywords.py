"""The keyword arguments a call receives, also those that arrive through ``**opts`` where
``opts`` is a dict display or a ``dict(...)`` of keywords bound once before the call in its
function and never changed there: ``opts = dict(batch_size=64, num_workers=4)`` then
``DataLoader(ds, shuffle=True, **opts)`` receives no ``sampler``."""

from __future__ import annotations

import ast

from trainlint.analysis.model import FileModel, walk_local

# Methods that change a dict in place: after one of them its keys are not the literal's.
_MUTATORS = frozenset({"update", "setdefault", "pop", "popitem", "clear", "__setitem__"})


def expanded_keywords(model: FileModel, call: ast.Call) -> dict[str, ast.expr] | None:
    """Every keyword ``call`` receives, by name, with ``**name`` expanded where its dict
    can be read; None when some ``**`` part cannot be (a parameter, a dict built by a
    call, one changed in place, a key that is not a plain string)."""
    out: dict[str, ast.expr] = {}
    for kw in call.keywords:
        if kw.arg is not None:
            out[kw.arg] = kw.value
            continue
        entries = dict_entries(model, kw.value)
        if entries is None:
            return None
        out.update(entries)
    return out


def dict_entries(model: FileModel, expr: ast.expr) -> dict[str, ast.expr] | None:
    """The entries of the dict ``expr`` holds, by key, when it is a literal (or a name
    bound once to one in its scope and not changed in place); else None."""
    if isinstance(expr, ast.Name):
        found = model.flow.definitions_before(expr.id, expr)
        if len(found) != 1 or not isinstance(found[0][0], ast.Assign):
            return None  # a parameter, a loop variable, or bound on several paths
        if _changed_in_place(model, expr):
            return None
        expr = found[0][1]  # type: ignore[assignment]
    if isinstance(expr, ast.Dict):
        out: dict[str, ast.expr] = {}
        for key, value in zip(expr.keys, expr.values, strict=True):
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                return None  # `{**base, ...}` or a computed key
            out[key.value] = value
        return out
    if (
        isinstance(expr, ast.Call)
        and model.qualname(expr.func) == "builtins.dict"
        and not expr.args
        and all(kw.arg is not None for kw in expr.keywords)
    ):
        return {kw.arg: kw.value for kw in expr.keywords if kw.arg is not None}
    return None


def _changed_in_place(model: FileModel, name: ast.Name) -> bool:
    """Is the dict bound to ``name`` written through that name anywhere in its scope
    (``opts["sampler"] = s``, ``opts.update(...)``, ``del opts[k]``)?"""
    scope = model.scope_of(name)
    nodes = walk_local(scope) if not isinstance(scope, ast.Module) else ast.walk(scope)
    for node in nodes:
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id == name.id
            and isinstance(node.ctx, (ast.Store, ast.Del))
        ):
            return True
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == name.id
            and node.attr in _MUTATORS
        ):
            return True
    return False
