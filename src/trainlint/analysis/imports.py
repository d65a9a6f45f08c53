"""Import aliases -> qualified names, scope-aware, without any libcst metadata provider.

``import torch.optim as optim; optim.lr_scheduler.StepLR`` resolves to
``torch.optim.lr_scheduler.StepLR``. A name rebound locally (a parameter, an
assignment, a loop target) shadows the import and stays unresolved, so
``def f(torch): torch.load(x)`` is not ``torch.load``.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Iterator

Scope = ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef
FUNCTION_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
SCOPE_NODES = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
#: the scopes a walk within one function stops at (one tuple, not one built per test)
NESTED_SCOPES = (*FUNCTION_NODES, ast.ClassDef)

_BUILTINS = frozenset(dir(builtins))

# Public spellings that re-export the same object under a longer module path.
_CANONICAL_PREFIXES = (
    ("torch.nn.utils.clip_grad.", "torch.nn.utils."),
    ("torch.nn.modules.module.Module", "torch.nn.Module"),
    ("torch.nn.modules.", "torch.nn."),
    ("torch.cuda.amp.grad_scaler.", "torch.cuda.amp."),
    ("torch.amp.grad_scaler.", "torch.amp."),
    ("torch.cuda.amp.autocast_mode.", "torch.cuda.amp."),
    ("torch.amp.autocast_mode.", "torch.amp."),
    ("torch.autograd.anomaly_mode.", "torch.autograd."),
    ("torch.autograd.grad_mode.", "torch.autograd."),
    ("torch.serialization.", "torch."),
    ("torch.utils.data.dataloader.", "torch.utils.data."),
    ("torch.utils.data.distributed.", "torch.utils.data."),
    ("torch.nn.parallel.distributed.", "torch.nn.parallel."),
    ("lightning.pytorch.", "pytorch_lightning."),
    ("multiprocessing.context.", "multiprocessing."),
    ("torch.multiprocessing.", "multiprocessing."),
)


_PREFIXES = tuple(prefix for prefix, _ in _CANONICAL_PREFIXES)


def canonical(qualname: str) -> str:
    if not qualname.startswith(_PREFIXES):  # (most names: one test in C)
        return qualname
    for prefix, repl in _CANONICAL_PREFIXES:
        if qualname.startswith(prefix):
            rest = qualname[len(prefix) :]
            if prefix.endswith(".") or not rest or rest.startswith("."):
                # torch.nn.modules.linear.Linear -> torch.nn.Linear
                if prefix == "torch.nn.modules.":
                    rest = rest.split(".", 1)[-1] if "." in rest else rest
                return repl + rest
    return qualname


class _Bindings:
    """Names bound in one scope: imports (name -> qualname) and everything else."""

    __slots__ = ("imports", "others", "globals")

    def __init__(self) -> None:
        self.imports: dict[str, str] = {}
        self.others: set[str] = set()
        self.globals: set[str] = set()


def _target_names(target: ast.AST) -> Iterator[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for elt in target.elts:
            yield from _target_names(elt)
    elif isinstance(target, ast.Starred):
        yield from _target_names(target.value)


def _is_none(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


class ImportTable:
    """Per-scope bindings collected once; resolves expressions to qualified names."""

    def __init__(self) -> None:
        self.scopes: dict[int, _Bindings] = {}

    def bindings(self, scope: ast.AST) -> _Bindings:
        b = self.scopes.get(id(scope))
        if b is None:
            b = self.scopes[id(scope)] = _Bindings()
        return b

    # -- collection (called by the model's single indexing pass) ------------------
    def add_import(self, scope: ast.AST, node: ast.Import | ast.ImportFrom) -> None:
        b = self.bindings(scope)
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    b.imports[alias.asname] = canonical(alias.name)
                else:
                    top = alias.name.split(".", 1)[0]
                    b.imports[top] = top
        else:
            module = ("." * node.level) + (node.module or "")
            for alias in node.names:
                if alias.name == "*":
                    continue
                full = (
                    f"{module}.{alias.name}"
                    if module and not module.endswith(".")
                    else (module + alias.name)
                )
                b.imports[alias.asname or alias.name] = canonical(full)

    def add_binding(self, scope: ast.AST, name: str, value: ast.AST | None = None) -> None:
        if value is not None and _is_none(value):
            return  # `torch = None` fallback after a failed import keeps the import meaning
        self.bindings(scope).others.add(name)

    def add_targets(self, scope: ast.AST, target: ast.AST, value: ast.AST | None = None) -> None:
        cls = target.__class__
        if cls is ast.Attribute or cls is ast.Subscript:
            return  # (binds no name: most targets that are not a plain name)
        if value is not None and _is_none(value):
            return  # (see add_binding)
        if cls is ast.Name:
            self.bindings(scope).others.add(target.id)  # type: ignore[attr-defined]
            return
        for name in _target_names(target):
            self.add_binding(scope, name)

    def add_global(self, scope: ast.AST, names: list[str]) -> None:
        self.bindings(scope).globals.update(names)

    # -- resolution ----------------------------------------------------------------
    def resolve_name(self, name: str, scopes: list[ast.AST]) -> str | None:
        """Resolve ``name`` seen in ``scopes`` (innermost first, module last)."""
        innermost = True
        for scope in scopes:
            b = self.scopes.get(id(scope))
            if isinstance(scope, ast.ClassDef) and not innermost:
                continue  # class bodies are not visible from their methods
            innermost = False
            if b is None:
                continue
            if name in b.globals:
                return self.resolve_name(name, scopes[-1:])
            if name in b.others:
                return None
            if name in b.imports:
                return b.imports[name]
        if name in _BUILTINS:
            return f"builtins.{name}"
        return None
