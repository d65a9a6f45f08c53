"""Data loaders: which names hold the object a ``DataLoader(...)`` call builds, and
whether a training loop iterates it (directly, or after it was passed to a same-file
function as an argument).
"""

from __future__ import annotations

import ast

from trainlint.analysis.escapes import escapes, params_of
from trainlint.analysis.model import FileModel
from trainlint.analysis.roles import Key

DATA_LOADER = "torch.utils.data.DataLoader"

# Frameworks that take the loader over and shard/re-seed it themselves (accelerate's
# DataLoaderShard, Fabric's `setup_dataloaders`, ignite's `auto_dataloader`).
_HANDED_OVER = {"prepare", "prepare_data_loader", "setup_dataloaders", "setup",
                "auto_dataloader", "MpDeviceLoader"}


def bound_keys(model: FileModel, call: ast.Call) -> set[Key]:
    """Role keys of the names bound to the object ``call`` builds, also through
    ``x = Call(...) if cond else other``."""
    out: set[Key] = set()
    for key, bindings in model.roles.bindings.items():
        if any(b.call is call for b in bindings):
            out.add(key)
    node: ast.AST = call
    parent = model.parent_of(node)
    while isinstance(parent, (ast.IfExp, ast.BoolOp)) and node is not getattr(
        parent, "test", None
    ):
        node, parent = parent, model.parent_of(parent)
    targets: list[ast.expr] = []
    if isinstance(parent, ast.Assign) and parent.value is node:
        targets = parent.targets
    elif isinstance(parent, (ast.AnnAssign, ast.NamedExpr)) and parent.value is node:
        targets = [parent.target]
    for target in targets:
        if isinstance(target, (ast.Name, ast.Attribute)):
            bound = model.roles.key(target)
            if bound is not None:
                out.add(bound)
    return out


def refers(model: FileModel, expr: ast.AST, keys: set[Key], calls: list[ast.Call]) -> bool:
    """Is ``expr`` one of ``calls`` or a name/attribute bound to what they build?"""
    if any(expr is c for c in calls):
        return True
    if isinstance(expr, (ast.Name, ast.Attribute)):
        return model.roles.key(expr) in keys
    return False


def handed_over(model: FileModel, calls: list[ast.Call], keys: set[Key]) -> bool:
    """Is the loader passed to a framework call that takes it over (``accelerator.prepare``)?"""
    for method in _HANDED_OVER:
        for site in model.calls.get(method, ()):
            args = [*site.args, *(k.value for k in site.keywords)]
            if any(refers(model, a, keys, calls) for a in args):
                return True
    return False


def training_loops_over(model: FileModel, calls: list[ast.Call],
                        keys: set[Key]) -> list[ast.For | ast.AsyncFor]:
    """Step loops (loops that backpropagate or step an optimizer) whose iterable is the
    loader, or a parameter of a same-file function that some call site fills with it."""
    steps = model.steps
    training = steps.step_loop_ids
    esc = escapes(model)
    out: list[ast.For | ast.AsyncFor] = []
    for loop in model.loops:
        if not isinstance(loop, (ast.For, ast.AsyncFor)) or id(loop) not in training:
            continue
        refs = [n for n in ast.walk(loop.iter) if isinstance(n, (ast.Name, ast.Attribute,
                                                                ast.Call))]
        if any(refers(model, n, keys, calls) for n in refs):
            out.append(loop)
            continue
        fn = model.function_of(loop)
        if fn is None:
            continue
        params = set(params_of(fn))
        found = False
        for n in refs:
            if not (isinstance(n, ast.Name) and n.id in params):
                continue
            for site in model.call_sites.get(id(fn), ()):
                arg = esc.argument_for(site, fn, n.id)
                if arg is not None and refers(model, arg, keys, calls):
                    found = True
        if found:
            out.append(loop)
    return out
