"""FileModel: one per file, built once, shared by every rule.

The base layer (this module) indexes the tree in a single pass: parent links,
scopes and import aliases, calls by name, functions, classes and loops, and the
same-file call graph. Higher layers (:mod:`roles`, :mod:`steps`, :mod:`flow`) are
computed lazily on first use and cached on the model, so a rule pays only for
what some enabled rule asked for.
"""

from __future__ import annotations

import ast
import operator
from collections import defaultdict
from collections.abc import Callable, Iterator
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar, cast

from trainlint.analysis.hooks import ANSWERS
from trainlint.analysis.imports import (  # (FUNCTION_NODES: the analyses import it from here)
    FUNCTION_NODES,  # noqa: F401
    NESTED_SCOPES,
    SCOPE_NODES,
    ImportTable,
    canonical,
)
from trainlint.analysis.walk import (  # (the walks: the analyses import them from here)
    LEAVES,
    PLANS,
    Plan,
    children,
    nodes_in,
    plan_of,
    postorder,  # noqa: F401
    walk_local,  # noqa: F401
    walk_tree,  # noqa: F401
)
from trainlint.source import Source

if TYPE_CHECKING:
    from trainlint.analysis.flow import Flow
    from trainlint.analysis.roles import Roles
    from trainlint.analysis.steps import StepModel

LOOP_NODES = (ast.For, ast.AsyncFor, ast.While)
FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef

T = TypeVar("T")


def call_name(call: ast.Call) -> str | None:
    """The last component of the called expression: ``a.b.step()`` -> ``step``."""
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


_NAME = ast.Name


def dotted(node: ast.AST) -> str | None:
    """``self.opt.step`` -> "self.opt.step" for plain name/attribute chains, else None."""
    # (asked of most names and attributes of a file, by many analyses: no list for a name)
    if node.__class__ is _NAME:
        return node.id  # type: ignore[attr-defined,no-any-return]
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def keyword(call: ast.Call, name: str) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return None


def has_star_kwargs(call: ast.Call) -> bool:
    return any(kw.arg is None for kw in call.keywords)


def is_true(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def is_false(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


class FileModel:
    """Everything rules know about one file."""

    def __init__(self, tree: ast.Module, source: Source, path: str = "<string>") -> None:
        self.tree = tree
        self.source = source
        self.path = path
        self.imports = ImportTable()
        self.parent: dict[ast.AST, ast.AST] = {}
        self.calls: dict[str, list[ast.Call]] = defaultdict(list)
        self.functions: list[FunctionNode] = []
        self.classes: list[ast.ClassDef] = []
        self.loops: list[ast.For | ast.AsyncFor | ast.While] = []
        self.attributes: dict[str, list[ast.Attribute]] = defaultdict(list)
        self.assignments: list[ast.Assign | ast.AugAssign | ast.AnnAssign] = []
        self.withs: list[ast.With | ast.AsyncWith] = []
        #: f-strings and keyword arguments (class keywords included), in no set order:
        #: for whole-file scans that would otherwise walk every node of the tree again.
        self.fstrings: list[ast.JoinedStr] = []
        self.keywords: list[ast.keyword] = []
        self.named_exprs: list[ast.NamedExpr] = []
        #: `return` statements, in no set order (see returns_in)
        self.returns: list[ast.Return] = []
        self._scope_of: dict[ast.AST, ast.AST] = {}
        self._memo: dict[object, Any] = {}
        #: The oldest torch (major, minor) the file's project requires, from the nearest
        #: pyproject.toml's dependencies; None when unknown. Set by the engine.
        self.torch_pin: tuple[int, int] | None = None
        #: What the project index knows for this file (analysis.project); set by the engine.
        self.project: dict[str, Any] | None = None
        #: How the file's project splits its data across ranks (analysis.data_parallel):
        #: the facts some file of the project has; None when the view does not say.
        self.project_data: list[str] | None = None
        self._scope_chains: dict[int, list[ast.AST]] = {}
        self._qualnames: dict[int, str | None] = {}
        self._resolved: dict[tuple[int, str], str | None] = {}  # (scope, name) -> import
        self._index()

    def memo(self, key: object, build: Callable[[FileModel], T]) -> T:
        """A per-file analysis built once on first use and freed with this model.

        Analyses keyed on the model in a module-level cache would keep every model alive
        (their values point back at it); keeping them here frees them together.
        """
        try:
            return cast(T, self._memo[key])
        except KeyError:
            found = self._memo[key] = build(self)
            return found

    def forget_analyses(self) -> None:
        """Drop every analysis built so far (roles, flow, steps, memos, cached tables),
        keeping the indexing pass's tables: for a model about to be given a project view,
        which the analyses read."""
        for name in _CACHED:
            self.__dict__.pop(name, None)
        self._memo.clear()
        self._qualnames.clear()
        self._resolved.clear()

    def release(self) -> None:
        """Drop the tree, the tables and every analysis once the file's rules have run.

        Analyses point back at the model (``Roles.model``...), so a model left to itself
        is a reference cycle holding the whole tree: only the cycle collector could free
        it. Breaking the cycle here lets reference counting free the file at once.
        """
        self.__dict__.clear()

    # -- the single indexing pass ------------------------------------------------------
    def _index(self) -> None:
        # The hottest loop of a lint run (every node of every file), hence the local
        # aliases and the dispatch on the node's class. The visiting order (a stack,
        # children pushed in field order) is part of the contract: the unsorted tables
        # (classes, assignments, withs, attributes, an import rebound in one scope) are
        # in that order. Leaves are recorded where they are found, never pushed; they
        # touch only the order-free tables.
        parent = self.parent
        scope_of = self._scope_of
        imports = self.imports
        calls = self.calls
        attributes = self.attributes
        assignments = self.assignments
        tree = self.tree
        entries = _ENTRIES
        leaves = LEAVES
        # (a node's scope is recorded when it is found, so the stack holds bare nodes)
        scope_of[tree] = tree
        stack: list[ast.AST] = [tree]
        pop = stack.pop
        push = stack.append
        while stack:
            node = pop()
            scope = scope_of[node]
            cls = node.__class__
            try:
                kind, plan = entries[cls]
            except KeyError:
                kind, plan = _entry(cls)
            if kind:
                if kind == _K_ATTRIBUTE:
                    attributes[node.attr].append(node)  # type: ignore[attr-defined,arg-type]
                elif kind == _K_CALL:
                    func = node.func  # type: ignore[attr-defined]
                    if func.__class__ is ast.Attribute:
                        calls[func.attr].append(node)  # type: ignore[arg-type]
                    elif func.__class__ is ast.Name:
                        calls[func.id].append(node)  # type: ignore[arg-type]
                elif kind == _K_KEYWORD:
                    self.keywords.append(node)  # type: ignore[arg-type]
                elif kind == _K_ASSIGN:
                    assignments.append(node)  # type: ignore[arg-type]
                    if cls is ast.Assign:
                        for target in node.targets:  # type: ignore[attr-defined]
                            imports.add_targets(scope, target, node.value)  # type: ignore[attr-defined]
                    else:
                        imports.add_targets(scope, node.target, node.value)  # type: ignore[attr-defined]
                elif kind == _K_SCOPE:
                    if node is not tree:
                        self._index_scope(node, scope, push)
                        continue
                elif kind == _K_RETURN:
                    self.returns.append(node)  # type: ignore[arg-type]
                elif kind == _K_FSTRING:
                    self.fstrings.append(node)  # type: ignore[arg-type]
                elif kind == _K_IMPORT:
                    imports.add_import(scope, node)  # type: ignore[arg-type]
                elif kind == _K_LOOP:
                    self.loops.append(node)  # type: ignore[arg-type]
                    if cls is not ast.While:
                        imports.add_targets(scope, node.target)  # type: ignore[attr-defined]
                elif kind == _K_WITH:
                    self.withs.append(node)  # type: ignore[arg-type]
                    for item in node.items:  # type: ignore[attr-defined]
                        if item.optional_vars is not None:
                            imports.add_targets(scope, item.optional_vars)
                elif kind == _K_GLOBAL:
                    imports.add_global(scope, node.names)  # type: ignore[attr-defined]
                elif kind == _K_NAMED:
                    self.named_exprs.append(node)  # type: ignore[arg-type]
                    imports.add_targets(scope, node.target)  # type: ignore[attr-defined]
                elif kind == _K_EXCEPT:
                    if node.name:  # type: ignore[attr-defined]
                        imports.add_binding(scope, node.name)  # type: ignore[attr-defined]
            for name, many in plan:
                value: Any = getattr(node, name)  # (the parser sets every field)
                if value is None:
                    continue
                if many is False:
                    parent[value] = node
                    scope_of[value] = scope
                    if value.__class__ not in leaves:
                        push(value)
                    continue
                if many is None:  # (a field the grammar does not tell: check the value)
                    value = nodes_in(value)
                for item in value:
                    if item is not None:
                        parent[item] = node
                        scope_of[item] = scope
                        if item.__class__ not in leaves:
                            push(item)
        # Source order makes every later query deterministic.
        # (parsed calls, defs and loops all have a position: `_pos` without its defaults)
        for lst in calls.values():
            if len(lst) > 1:
                lst.sort(key=_POSITION)
        self.functions.sort(key=_POSITION)
        self.loops.sort(key=_POSITION)

    def _index_scope(self, node: ast.AST, scope: ast.AST, push: Callable[[ast.AST], None]) -> None:
        """A def, lambda or class inside ``scope``: its name, parameters and children."""
        imports = self.imports
        cls = node.__class__
        outer: list[ast.AST] = []  # direct children that belong to the enclosing scope
        if cls is ast.ClassDef:
            self.classes.append(node)  # type: ignore[arg-type]
            imports.add_binding(scope, node.name)  # type: ignore[attr-defined]
            outer = [*node.decorator_list, *node.bases]  # type: ignore[attr-defined]
        else:
            if cls is not ast.Lambda:
                self.functions.append(node)  # type: ignore[arg-type]
                imports.add_binding(scope, node.name)  # type: ignore[attr-defined]
                outer = node.decorator_list  # type: ignore[attr-defined]
            a = node.args  # type: ignore[attr-defined]
            names = [
                arg.arg
                for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg)
                if arg is not None
            ]
            if names:
                imports.bindings(node).others.update(names)
        # (The parameters' defaults and a class's keywords are children of the `arguments`
        # and `keyword` nodes, indexed in the def's own scope.)
        outer_ids = {id(c) for c in outer}
        parent = self.parent
        scope_of = self._scope_of
        for child in children(node):
            parent[child] = node
            scope_of[child] = scope if id(child) in outer_ids else node
            push(child)

    # -- structure ---------------------------------------------------------------------
    def parent_of(self, node: ast.AST) -> ast.AST | None:
        return self.parent.get(node)

    def ancestors(self, node: ast.AST) -> Iterator[ast.AST]:
        parent = self.parent
        cur = parent.get(node)
        while cur is not None:
            yield cur
            cur = parent.get(cur)

    def scope_of(self, node: ast.AST) -> ast.AST:
        return self._scope_of.get(node, self.tree)

    def indexed(self, node: ast.AST) -> bool:
        """Whether the indexing walk met ``node`` (nodes built later, e.g. stand-ins, were not)."""
        return node in self._scope_of

    def scopes_of(self, node: ast.AST) -> list[ast.AST]:
        """Enclosing scopes, innermost first, ending with the module."""
        return self.scope_chain(node).copy()

    def scope_chain(self, node: ast.AST) -> list[ast.AST]:
        """``scopes_of`` without the copy, for the model's own read-only lookups: the
        shared chain, which callers must not change."""
        first = self._scope_of.get(node, self.tree)
        chains = self._scope_chains
        chain = chains.get(id(first))
        if chain is None:
            chain = [first]
            while chain[-1] is not self.tree:
                chain.append(self.scope_of(chain[-1]))
            chains[id(first)] = chain
        return chain

    def function_of(self, node: ast.AST) -> FunctionNode | None:
        """The innermost def enclosing ``node`` (lambdas and classes are skipped over)."""
        for scope in self.scope_chain(node):
            if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return scope
            if isinstance(scope, ast.ClassDef):
                return None
        return None

    def class_of(self, func: ast.AST) -> ast.ClassDef | None:
        scope = self.scope_of(func)
        return scope if isinstance(scope, ast.ClassDef) else None

    def statement_of(self, node: ast.AST) -> ast.stmt:
        cur: ast.AST | None = node
        while cur is not None and not isinstance(cur, ast.stmt):
            cur = self.parent.get(cur)
        return cur if cur is not None else self.tree.body[0]

    # -- names -------------------------------------------------------------------------
    def qualname(self, node: ast.AST) -> str | None:
        """Resolve a name/attribute chain to a qualified name, or None if undecidable."""
        # Memoized for the file's own nodes only (their ids are stable while the model
        # lives); a node built by an analysis may reuse a freed node's id.
        key = id(node)
        if node in self._scope_of:
            try:
                return self._qualnames[key]
            except KeyError:
                found = self._qualnames[key] = self._qualname(node)
                return found
        return self._qualname(node)

    def _qualname(self, node: ast.AST) -> str | None:
        parts: list[str] = []
        cur = node
        while isinstance(cur, ast.Attribute):
            parts.append(cur.attr)
            cur = cur.value
        if not isinstance(cur, ast.Name):
            return None
        # a name means the same everywhere in its innermost scope: resolved once there
        key = (id(self._scope_of.get(cur, self.tree)), cur.id)
        try:
            base = self._resolved[key]
        except KeyError:
            base = self._resolved[key] = self.imports.resolve_name(cur.id, self.scope_chain(cur))
        if base is None:
            return None
        if parts:
            if base.startswith("builtins."):
                return None
            return canonical(base + "." + ".".join(reversed(parts)))
        return base

    def call_qualname(self, call: ast.Call) -> str | None:
        return self.qualname(call.func)

    def calls_to(self, *qualnames: str) -> list[ast.Call]:
        """Calls that resolve to any of ``qualnames``, however the function was imported."""
        wanted = set(qualnames)
        names = {q.rsplit(".", 1)[-1] for q in wanted}
        for b in self.imports.scopes.values():
            for local, q in b.imports.items():
                if q in wanted:
                    names.add(local)
        out = [c for n in names for c in self.calls.get(n, ()) if self.qualname(c.func) in wanted]
        out.sort(key=_pos)
        return out

    @cached_property
    def imports_training_library(self) -> bool:
        """Spelling-based guesses (``optimizer.step()``) are only trusted in files that
        import a training library; elsewhere ``opt``/``step`` mean something else."""
        return any(
            self.imports_module(m)
            for m in (
                "torch",
                "pytorch_lightning",
                "lightning",
                "accelerate",
                "transformers",
                "timm",
                "deepspeed",
                "torch_xla",
                "fairseq",
                "detectron2",
                "mmengine",
            )
        )

    def imports_module(self, prefix: str) -> bool:
        """Does the file import anything under ``prefix`` (e.g. "torch")?"""
        for b in self.imports.scopes.values():
            for q in b.imports.values():
                if q == prefix or q.startswith(prefix + "."):
                    return True
        return False

    # -- loops -------------------------------------------------------------------------
    def enclosing_loops(self, node: ast.AST) -> list[ast.For | ast.AsyncFor | ast.While]:
        """Loops whose *body* contains ``node``, innermost first, within one function."""
        loops: list[ast.For | ast.AsyncFor | ast.While] = []
        child = node
        for anc in self.ancestors(node):
            if isinstance(anc, NESTED_SCOPES):
                break
            if isinstance(anc, LOOP_NODES) and child in anc.body:  # (nodes compare by identity)
                loops.append(anc)
            child = anc
        return loops

    @cached_property
    def local_defs(self) -> dict[int, dict[str, FunctionNode]]:
        """Per scope: function names defined directly in it."""
        out: dict[int, dict[str, FunctionNode]] = defaultdict(dict)
        for fn in self.functions:
            out[id(self.scope_of(fn))][fn.name] = fn
        return out

    @cached_property
    def _assignments_by_scope(self) -> dict[int, list[ast.Assign | ast.AugAssign | ast.AnnAssign]]:
        out: dict[int, list[ast.Assign | ast.AugAssign | ast.AnnAssign]] = defaultdict(list)
        for stmt in sorted(self.assignments, key=_pos):
            out[id(self.scope_of(stmt))].append(stmt)
        return out

    def assignments_in(self, scope: ast.AST) -> list[ast.Assign | ast.AugAssign | ast.AnnAssign]:
        """The assignment statements of ``scope`` (the module, a def or a class) outside
        nested defs and classes, in source order: those ``walk_local(scope)`` meets,
        without walking it."""
        return self._assignments_by_scope.get(id(scope), [])

    @cached_property
    def _outermost_loops(self) -> dict[int, list[ast.For | ast.AsyncFor | ast.While]]:
        out: dict[int, list[ast.For | ast.AsyncFor | ast.While]] = {}
        for lp in self.loops:  # in source order
            owner: ast.AST = self.tree
            for anc in self.ancestors(lp):
                if isinstance(anc, LOOP_NODES):
                    break  # nested in a loop of its own scope
                if isinstance(anc, NESTED_SCOPES):
                    owner = anc
                    out.setdefault(id(owner), []).append(lp)
                    break
            else:
                out.setdefault(id(owner), []).append(lp)
        return out

    def outermost_loops(self, scope: ast.AST) -> list[ast.For | ast.AsyncFor | ast.While]:
        """The loops of ``scope`` (a def, lambda, class or the module) not inside another of
        its loops, in source order: every loop ``walk_local(scope)`` meets is in one."""
        return self._outermost_loops.get(id(scope), [])

    @cached_property
    def _returns_by_scope(self) -> dict[int, list[ast.Return]]:
        out: dict[int, list[ast.Return]] = defaultdict(list)
        for stmt in sorted(self.returns, key=_pos):
            out[id(self.scope_of(stmt))].append(stmt)
        return out

    def returns_in(self, fn: ast.AST) -> list[ast.Return]:
        """The ``return`` statements of def ``fn`` outside nested defs and classes, in
        source order: those ``walk_local(fn)`` meets, without walking it."""
        return self._returns_by_scope.get(id(fn), [])

    def methods(self, cls: ast.ClassDef) -> dict[str, FunctionNode]:
        return self.local_defs.get(id(cls), {})

    def class_named(self, name: str) -> ast.ClassDef | None:
        return self._module_classes.get(name)

    @cached_property
    def _module_classes(self) -> dict[str, ast.ClassDef]:
        """The first module-level class of each name, in the indexing order of ``classes``."""
        out: dict[str, ast.ClassDef] = {}
        for cls in self.classes:
            if self.scope_of(cls) is self.tree:
                out.setdefault(cls.name, cls)
        return out

    def resolve_call(self, call: ast.Call) -> FunctionNode | None:
        """The same-file function a call invokes, when that is certain enough."""
        found = self.resolve_def(call.func, at=call)
        return None if isinstance(found, ast.ClassDef) else found

    def resolve_def(
        self, expr: ast.AST, at: ast.AST | None = None, classes: bool = False
    ) -> FunctionNode | ast.ClassDef | None:
        """The same-file def a name (``train``) or ``self.m``/``cls.m`` refers to, seen from
        ``at`` (default: ``expr`` itself); with ``classes``, also a class of that name in
        the scope. None when an import or another binding of the name comes first."""
        where = at if at is not None else expr
        if isinstance(expr, ast.Name):
            for scope in self.scope_chain(where):
                if isinstance(scope, ast.ClassDef):
                    continue
                defs = self.local_defs.get(id(scope))
                if defs and expr.id in defs:
                    return defs[expr.id]
                if classes:
                    for klass in self.classes:
                        if klass.name == expr.id and self.scope_of(klass) is scope:
                            return klass
                b = self.imports.scopes.get(id(scope))
                if b is not None and (expr.id in b.others or expr.id in b.imports):
                    return None
            return None
        if (
            isinstance(expr, ast.Attribute)
            and isinstance(expr.value, ast.Name)
            and expr.value.id in ("self", "cls")
        ):
            cls = self.enclosing_class(where)
            return self.method_of(cls, expr.attr) if cls is not None else None
        return None

    def enclosing_class(self, node: ast.AST) -> ast.ClassDef | None:
        """The class whose method (possibly through nested functions) contains ``node``."""
        fn = self.function_of(node)
        while fn is not None:
            cls = self.class_of(fn)
            if cls is not None:
                return cls
            parent = self.parent_of(fn)
            fn = self.function_of(parent) if parent is not None else None
        return None

    def method_of(self, cls: ast.ClassDef, name: str) -> FunctionNode | None:
        """``name`` defined on ``cls`` or inherited from a same-file base class."""
        seen: set[int] = set()
        cur: ast.ClassDef | None = cls
        while cur is not None and id(cur) not in seen:
            seen.add(id(cur))
            method = self.methods(cur).get(name)
            if method is not None:
                return method
            cur = self.local_base(cur)
        return None

    def resolve_call_target_is_none(self, func: ast.AST) -> bool:
        """True unless ``func`` names a same-file function or class (those are not models
        by spelling: their bodies say what they are)."""
        if isinstance(func, ast.Name):
            if self.class_named(func.id) is not None:
                return False
            return not any(fn.name == func.id for fn in self.functions)
        return True

    def local_base(self, cls: ast.ClassDef) -> ast.ClassDef | None:
        """The first base class defined in this file, if any."""
        for base in cls.bases:
            if isinstance(base, ast.Name):
                found = self.class_named(base.id)
                if found is not None:
                    return found
        return None

    @cached_property
    def call_sites(self) -> dict[int, list[ast.Call]]:
        """Same-file function (by id) -> the calls that invoke it."""
        sites: dict[int, list[ast.Call]] = defaultdict(list)
        names = {fn.name for fn in self.functions}
        for name in names:
            for call in self.calls.get(name, ()):
                target = self.resolve_call(call)
                if target is not None:
                    sites[id(target)].append(call)
        return sites

    def callees(self, node: ast.AST) -> Iterator[tuple[ast.Call, FunctionNode]]:
        """Same-file functions called anywhere inside ``node`` (not inside nested defs)."""
        for sub in walk_local(node):
            if isinstance(sub, ast.Call):
                target = self.resolve_call(sub)
                if target is not None:
                    yield sub, target

    def loop_contexts(self, node: ast.AST, depth: int = 4) -> list[list[ast.AST]]:
        """Every way ``node`` runs inside a loop: chains of (loop | call site), innermost first.

        A node directly in a loop body gives ``[loop, ...]``; a node in a function
        called from a loop gives ``[call_site, loop, ...]``.
        """
        out: list[list[ast.AST]] = []
        self._loop_contexts(node, depth, [], out, set())
        return out

    def _loop_contexts(
        self,
        node: ast.AST,
        depth: int,
        prefix: list[ast.AST],
        out: list[list[ast.AST]],
        seen: set[int],
    ) -> None:
        loops = self.enclosing_loops(node)
        if loops:
            out.append([*prefix, *loops])
        if depth <= 0:
            return
        fn = self.function_of(node)
        if fn is None or id(fn) in seen:
            return
        seen = seen | {id(fn)}
        for site in self.call_sites.get(id(fn), ()):
            self._loop_contexts(site, depth - 1, [*prefix, *loops, site], out, seen)

    def in_loop(self, node: ast.AST) -> bool:
        return bool(self.loop_contexts(node))

    # -- lazily built higher layers ------------------------------------------------------
    @cached_property
    def roles(self) -> Roles:
        return ANSWERS.roles(self)

    @cached_property
    def flow(self) -> Flow:
        return ANSWERS.flow(self)

    @cached_property
    def steps(self) -> StepModel:
        return ANSWERS.steps(self)


_CACHED = tuple(n for n, v in vars(FileModel).items() if isinstance(v, cached_property))
# What the indexing pass records for a node, by its class.
(
    _K_SCOPE,
    _K_CALL,
    _K_ATTRIBUTE,
    _K_ASSIGN,
    _K_LOOP,
    _K_WITH,
    _K_IMPORT,
    _K_GLOBAL,
    _K_NAMED,
    _K_EXCEPT,
    _K_KEYWORD,
    _K_FSTRING,
    _K_RETURN,
) = range(1, 14)
_KIND: dict[type, int] = {
    **dict.fromkeys(SCOPE_NODES, _K_SCOPE),
    ast.Call: _K_CALL,
    ast.Attribute: _K_ATTRIBUTE,
    **dict.fromkeys((ast.Assign, ast.AugAssign, ast.AnnAssign), _K_ASSIGN),
    **dict.fromkeys(LOOP_NODES, _K_LOOP),
    ast.With: _K_WITH,
    ast.AsyncWith: _K_WITH,
    ast.Import: _K_IMPORT,
    ast.ImportFrom: _K_IMPORT,
    ast.Global: _K_GLOBAL,
    ast.Nonlocal: _K_GLOBAL,
    ast.NamedExpr: _K_NAMED,
    ast.ExceptHandler: _K_EXCEPT,
    ast.keyword: _K_KEYWORD,
    ast.JoinedStr: _K_FSTRING,
    ast.Return: _K_RETURN,
}
#: The indexing pass's dispatch, per class (memoized by ``_entry``): what it records of a
#: node (0: nothing) and its plan.
_ENTRIES: dict[type, tuple[int, Plan]] = {}


def _entry(cls: type) -> tuple[int, Plan]:
    plan = PLANS.get(cls)
    found = _ENTRIES[cls] = (_KIND.get(cls, 0), plan if plan is not None else plan_of(cls))
    return found


_POSITION = operator.attrgetter("lineno", "col_offset")


def _pos(node: ast.AST) -> tuple[int, int]:
    return (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))
