"""Expressions that build `nn.Module`s: one module construction, or a plain ``list``,
``tuple`` or ``dict`` of freshly built ones. Parameter-free data transforms do not count:
nothing of theirs can be missing from `.parameters()` or `state_dict()`."""

from __future__ import annotations

import ast

from trainlint.analysis.model import FileModel, call_name
from trainlint.analysis.roles import Role


def is_module_construction(model: FileModel, node: ast.AST) -> bool:
    """``node`` is a call that builds one module (not a parameter-free transform)."""
    if not isinstance(node, ast.Call):
        return False
    found = model.roles.classify(node)
    return (
        len(found) == 1
        and found[0] is not None
        and found[0].role is Role.MODEL
        and (found[0].call is node)
        and not _is_transform(model, node)
    )


_TRANSFORM_PREFIXES = ("torchaudio.transforms.", "torchvision.transforms.")


def _is_transform(model: FileModel, call: ast.Call, depth: int = 0) -> bool:
    """A parameter-free data transform: a torchaudio/torchvision transform, or a
    same-file module whose only submodules are such transforms. Nothing of it can be
    missing from `.parameters()` or `state_dict()`."""
    if (model.qualname(call.func) or "").startswith(_TRANSFORM_PREFIXES):
        return True
    if depth > 0 or not isinstance(call.func, ast.Name) or model.qualname(call.func):
        return False
    cls = model.class_named(call.func.id)
    if cls is None or model.local_base(cls) is not None:
        return False
    built = []
    for node in ast.walk(cls):
        if isinstance(node, ast.Call) and call_name(node) in (
            "Parameter",
            "register_parameter",
            "register_buffer",
            "add_module",
        ):
            return False
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and any(
                isinstance(t, ast.Attribute)
                and isinstance(t.value, ast.Name)
                and t.value.id == "self"
                for t in node.targets
            )
        ):
            built.append(node.value)
    return bool(built) and all(_is_transform(model, b, depth + 1) for b in built)


def holds_module_construction(model: FileModel, node: ast.AST) -> bool:
    """``node`` builds one module, or is a local name whose every assignment before it
    does (``block = nn.Conv1d(...)`` then ``self.blocks.append(block)``): what a list
    collects is usually built a line earlier, under a name."""
    if is_module_construction(model, node):
        return True
    if not isinstance(node, ast.Name) or model.function_of(node) is None:
        return False
    found = model.flow.definitions_before(node.id, node)
    return bool(found) and all(
        isinstance(stmt, ast.Assign) and is_module_construction(model, value)
        for stmt, value in found
    )


def module_elements(model: FileModel, value: ast.AST) -> str | None:
    """ "list" or "dict" when ``value`` builds a plain container of freshly built modules."""
    if (
        isinstance(value, ast.Call)
        and call_name(value) in ("list", "tuple", "dict")
        and (model.qualname(value.func) or "").startswith("builtins.")
        and len(value.args) == 1
        and not value.keywords
    ):
        inner = module_elements(model, value.args[0])
        if inner is None and isinstance(value.args[0], ast.GeneratorExp):
            return "list" if is_module_construction(model, value.args[0].elt) else None
        return inner
    if isinstance(value, (ast.List, ast.Tuple)):
        if value.elts and all(is_module_construction(model, e) for e in value.elts):
            return "list"
        return None
    if isinstance(value, ast.ListComp):
        return "list" if is_module_construction(model, value.elt) else None
    if isinstance(value, ast.Dict):
        if (
            value.values
            and all(k is not None for k in value.keys)
            and all(is_module_construction(model, v) for v in value.values)
        ):
            return "dict"
        return None
    if isinstance(value, ast.DictComp):
        return "dict" if is_module_construction(model, value.value) else None
    return None


def is_plain_container(model: FileModel, value: ast.AST) -> bool:
    """``value`` builds a plain Python container: a display, a comprehension, or a call
    of builtin ``list``/``tuple``/``dict``. Modules inside it are not registered."""
    if isinstance(value, (ast.List, ast.Tuple, ast.Dict, ast.ListComp, ast.DictComp)):
        return True
    return (
        isinstance(value, ast.Call)
        and call_name(value) in ("list", "tuple", "dict")
        and (model.qualname(value.func) or "").startswith("builtins.")
    )


def rebound_to_registered(model: FileModel, method: ast.AST, stmt: ast.stmt, attr: str) -> bool:
    """The plain container that ``stmt`` stores in ``self.<attr>`` is only a builder:
    a later assignment of the same method rebinds ``self.<attr>`` to something that is
    not a plain container (``nn.ModuleList(self.<attr>)``, ``nn.Sequential(*...)``), so
    the modules end up registered after all."""
    seen = False
    for other in model.assignments_in(method):
        if other is stmt:
            seen = True
            continue
        if not seen or not isinstance(other, (ast.Assign, ast.AnnAssign)):
            continue
        targets = other.targets if isinstance(other, ast.Assign) else [other.target]
        if other.value is None:
            continue
        for target in targets:
            if (
                isinstance(target, ast.Attribute)
                and target.attr == attr
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
            ):
                if isinstance(other.value, ast.BinOp) or is_plain_container(model, other.value):
                    break  # still a plain container (`self.x = self.x + [...]`)
                return True  # a wrapper call, or a value we cannot see: not a plain list
    return False
