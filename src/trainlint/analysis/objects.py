"""One query: where an object goes and what is called on it.

An object is named by the call that builds it (``StepLR(opt, 10)``,
``DistributedSampler(ds)``, ``GradScaler()``). Within one file, across its functions,
the query knows

- the names bound to it (:meth:`Objects.keys`): locals, globals and ``self.x`` across a
  class's methods, through ``x = A(...) if cond else None`` and tuple unpacking;
- whether an expression refers to it (:meth:`Objects.refers`), and the method calls made
  on it (:meth:`Objects.method_calls`);
- whether it leaves sight (:meth:`Objects.escapes`): passed to a call, returned, stored in
  a container or under another name, so that someone else may call its methods;
- where it flows (:meth:`Objects.fate`): followed through assignments, ``self``
  attributes, returns into same-file callers and arguments of same-file functions, does
  it reach a call of a given method, escape, or neither;
- which caller argument a parameter receives (:meth:`Objects.arguments_for`);
- the dispatches to threads, processes and Ray remotes (:attr:`Objects.escape_analysis`,
  the :class:`~trainlint.analysis.escapes.Escapes` of the file).

Cross-file uses come from the project index; until then a value handed to a function of
another file counts as escaping, so rules built on this stay silent.
"""

from __future__ import annotations

import ast
from enum import Enum
from typing import TYPE_CHECKING

from trainlint._record import Record
from trainlint.analysis.arguments import arguments_for, parameter_for
from trainlint.analysis.escapes import Escapes, escapes
from trainlint.analysis.model import walk_local, walk_tree

if TYPE_CHECKING:
    from collections.abc import Iterable

    from trainlint.analysis.model import FileModel, FunctionNode
    from trainlint.analysis.roles import Key


class Fate(Enum):
    """Where an object's value ends up, seen from the file."""

    CALLED = "called"  # the method asked about is called on it
    ESCAPES = "escapes"  # it leaves sight: whoever receives it may call the method
    NEVER = "never"  # it stays in sight and the method is never called


class Obj(Record, frozen=True):
    """One or more constructions taken together (a sampler and the loaders holding it)
    and the names bound to any of them."""

    __slots__ = ("calls", "keys")

    calls: tuple[ast.Call, ...]
    keys: frozenset[Key]

    def __init__(self, calls: tuple[ast.Call, ...], keys: frozenset[Key]) -> None:
        self.calls = calls
        self.keys = keys

    def __or__(self, other: Obj) -> Obj:
        return Obj((*self.calls, *other.calls), self.keys | other.keys)


def objects(model: FileModel) -> Objects:
    """The file's object query, built once per FileModel on first use."""
    return model.memo(Objects, Objects)


class Objects:
    def __init__(self, model: FileModel) -> None:
        self.model = model
        self.roles = model.roles
        self._bound_by_call: dict[int, set[Key]] | None = None
        self._functions_by_id: dict[int, ast.AST] | None = None
        self._load_index: dict[int, tuple[dict[Key, list[ast.AST]], dict[object, list[ast.AST]]]] = {}

    @property
    def escape_analysis(self) -> Escapes:
        """Dispatches to threads, processes and Ray remotes, and what their targets train."""
        return escapes(self.model)

    # -- names -----------------------------------------------------------------------------
    def keys(self, call: ast.Call) -> set[Key]:
        """Role keys of the names bound to the object ``call`` builds, including
        ``sampler = DistributedSampler(ds) if distributed else None``."""
        model = self.model
        out: set[Key] = set(self._bound_keys().get(id(call), ()))
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
                bound = self.roles.key(target)
                if bound is not None:
                    out.add(bound)
        return out

    def _bound_keys(self) -> dict[int, set[Key]]:
        """The role keys bound to each construction (by the call's id), indexed once so
        that asking about every loader or sampler of a file stays linear in its size."""
        if self._bound_by_call is None:
            index: dict[int, set[Key]] = {}
            for key, bindings in self.roles.bindings.items():
                for b in bindings:
                    if b.call is not None:
                        index.setdefault(id(b.call), set()).add(key)
            self._bound_by_call = index
        return self._bound_by_call

    def reads(self, target: ast.AST, key: Key) -> list[ast.AST]:
        """The reads of ``key`` other than ``target``, in ``walk_tree`` order: for a local,
        in its function; for ``self.x``, of ``x`` in any class; else in the whole file."""
        model = self.model
        if key[0] == "name":
            if self._functions_by_id is None:
                self._functions_by_id = {id(f): f for f in model.functions}
            scope = self._functions_by_id.get(key[1], model.tree)
            nodes = self._loads(scope)[0].get(key, ())
        elif key[0] == "attr":  # `self.x`: a read of `x` through the same attribute name
            nodes = self._loads(model.tree)[1].get(key[2], ())
        else:
            nodes = self._loads(model.tree)[0].get(key, ())
        return [node for node in nodes if node is not target]

    def _loads(self, scope: ast.AST) -> tuple[dict[Key, list[ast.AST]], dict[object, list[ast.AST]]]:
        """Reads of names and attributes under ``scope`` by role key, and the attribute reads
        by attribute name, in ``walk_tree`` order: one walk per scope asked about, however
        many objects are followed through it."""
        found = self._load_index.get(id(scope))
        if found is None:
            by_key: dict[Key, list[ast.AST]] = {}
            by_attr: dict[object, list[ast.AST]] = {}
            key_of = self.roles.key
            for node in walk_tree(scope):  # (no contexts: the loads are found by their names)
                if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load):
                    k = key_of(node)
                    if k is None:
                        continue
                    by_key.setdefault(k, []).append(node)
                    if k[0] == "attr":
                        by_attr.setdefault(k[2], []).append(node)
            found = self._load_index[id(scope)] = (by_key, by_attr)
        return found

    def of(self, *calls: ast.Call) -> Obj:
        keys: set[Key] = set()
        for call in calls:
            keys |= self.keys(call)
        return Obj(tuple(calls), frozenset(keys))

    def refers(self, expr: ast.AST, obj: Obj) -> bool:
        """Is ``expr`` one of the constructions or a name bound to it?"""
        if any(expr is c for c in obj.calls):
            return True
        if isinstance(expr, (ast.Name, ast.Attribute)):
            return self.roles.key(expr) in obj.keys
        return False

    def references(self, obj: Obj) -> list[ast.expr]:
        """Every read of a name bound to the object, in the whole file."""
        model = self.model
        last = {str(k[-1]).rsplit(".", 1)[-1] for k in obj.keys}
        candidates: list[ast.expr] = [a for name in last for a in model.attributes.get(name, ())]
        candidates += [n for n in ast.walk(model.tree) if isinstance(n, ast.Name) and n.id in last]
        return [
            n
            for n in candidates
            if isinstance(getattr(n, "ctx", None), ast.Load) and self.roles.key(n) in obj.keys
        ]

    def method_calls(self, method: str, obj: Obj | None = None) -> Iterable[ast.Call]:
        """Calls ``x.method(...)``; with ``obj``, only those whose receiver refers to it."""
        for call in self.model.calls.get(method, ()):
            func = call.func
            if obj is None or (isinstance(func, ast.Attribute) and self.refers(func.value, obj)):
                yield call

    def passed_to(self, obj: Obj, methods: Iterable[str]) -> bool:
        """Is the object an argument of ``x.m(...)`` for one of ``methods``
        (``accelerator.prepare(loader)``)?"""
        return any(
            self.refers(a, obj)
            for method in methods
            for call in self.model.calls.get(method, ())
            for a in call.args
        )

    # -- leaving sight ---------------------------------------------------------------------
    def escapes(self, obj: Obj) -> bool:
        """Does the object leave our sight (passed to a call, returned, stored elsewhere,
        put in a container)? Then whoever receives it may call any of its methods. Method
        calls on it and tests of it (``if scaler is not None``) keep it in sight."""
        if not obj.keys:
            return True
        for node in self.references(obj):
            parent = self.model.parent_of(node)
            if isinstance(parent, ast.Attribute) and parent.value is node:
                continue  # scaler.scale(...), scaler.step(...), scaler.state_dict()
            if self.tested_only(node):
                continue  # `if scaler is not None:`, `use_amp = scaler is not None`
            return True
        return False

    def tested_only(self, node: ast.AST) -> bool:
        """Is ``node`` only tested (compared, negated, or an ``if``/``while`` condition), so
        that the object itself goes nowhere? ``x = scaler or other`` hands it on."""
        model = self.model
        cur, parent = node, model.parent_of(node)
        if isinstance(parent, ast.Compare):
            return True
        while isinstance(parent, (ast.BoolOp, ast.UnaryOp)):
            if isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.Not):
                return True
            cur, parent = parent, model.parent_of(parent)
        if isinstance(parent, (ast.If, ast.While, ast.IfExp, ast.Assert)):
            return parent.test is cur
        return isinstance(parent, ast.comprehension) and any(c is cur for c in parent.ifs)

    # -- passes ----------------------------------------------------------------------------
    def arguments_for(self, fn: FunctionNode, param: str) -> list[tuple[ast.Call, ast.expr]]:
        """(call site, caller expression) for each same-file call of ``fn`` that passes
        its parameter ``param`` (asked of :func:`analysis.arguments.arguments_for`)."""
        return arguments_for(self.model, fn, param)

    # -- where a value flows -----------------------------------------------------------------
    def fate(self, expr: ast.AST, method: str) -> Fate:
        """Follow a value (a construction) through the file: is ``method`` called on it,
        does it escape, or neither?"""
        return _Flow(self.model, method).of(expr, 0)


class _Flow:
    """The walk behind :meth:`Objects.fate`, for one method name."""

    def __init__(self, model: FileModel, method: str) -> None:
        self.model = model
        self.method = method

    def of(self, expr: ast.AST, depth: int) -> Fate:
        model = self.model
        if depth > 6:
            return Fate.ESCAPES
        cur = expr
        parent = model.parent_of(cur)
        # climb out of containers and wrappers that keep the object
        while isinstance(
            parent, (ast.Tuple, ast.List, ast.Dict, ast.Set, ast.Starred, ast.keyword)
        ):
            grand = model.parent_of(parent)
            if (
                isinstance(parent, (ast.Tuple, ast.List))
                and isinstance(grand, ast.Assign)
                and (grand.value is parent)
            ):
                break  # `a, b = x, y` unpacks element-wise: handled below
            cur, parent = parent, grand
            if isinstance(parent, (ast.Assign, ast.AnnAssign)) and cur is not expr:
                return Fate.ESCAPES  # stored in a container
        if isinstance(parent, ast.Return):
            return self._returned(parent, cur, expr, depth)
        if isinstance(parent, ast.Call) and cur is not parent.func:
            return self._into_call(parent, cur, depth)
        if isinstance(parent, (ast.Assign, ast.AnnAssign)) and parent.value is cur:
            targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
            verdicts = []
            for t in targets:
                if isinstance(t, (ast.Tuple, ast.List)) and isinstance(cur, (ast.Tuple, ast.List)):
                    for te, ve in zip(t.elts, cur.elts, strict=False):
                        if ve is expr or any(s is expr for s in ast.walk(ve)):
                            verdicts.append(self._name(te, depth))
                elif isinstance(t, (ast.Name, ast.Attribute)):
                    verdicts.append(self._name(t, depth))
                else:
                    verdicts.append(Fate.ESCAPES)
            return _merge(verdicts)
        if isinstance(parent, ast.Expr):
            return Fate.NEVER
        return Fate.ESCAPES  # a `with`, walrus, lambda, conditional: out of sight

    def _name(self, target: ast.AST, depth: int) -> Fate:
        """A name/attribute now holds the object: is the method called or is it handed on?"""
        model = self.model
        key = model.roles.key(target)
        if key is None:
            return Fate.ESCAPES
        if key[0] == "dotted" and not str(key[1]).startswith("self."):
            return Fate.ESCAPES  # someone else's attribute
        if key[0] == "attr" and self._called_through_instance(str(key[2])):
            return Fate.CALLED
        verdicts = []
        for ref in self._references(target, key):
            parent = model.parent_of(ref)
            if isinstance(parent, ast.Attribute) and parent.value is ref:
                grand = model.parent_of(parent)
                if (
                    isinstance(grand, ast.Call)
                    and grand.func is parent
                    and (parent.attr == self.method)
                ):
                    return Fate.CALLED
                continue  # other methods (get_last_lr(), state_dict()), attributes
            if isinstance(
                parent,
                (ast.Compare, ast.If, ast.BoolOp, ast.UnaryOp, ast.FormattedValue, ast.JoinedStr),
            ):
                continue
            if isinstance(parent, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and ref in (
                parent.targets if isinstance(parent, ast.Assign) else [parent.target]
            ):
                continue
            verdicts.append(self.of(ref, depth + 1))
        return _merge(verdicts)

    def _manual_lightning(self, fn: ast.AST) -> bool:
        """``fn``'s class sets ``self.automatic_optimization = False`` and the file never
        asks for ``lr_schedulers()``: nothing but this file could step a scheduler."""
        model = self.model
        if model.calls.get("lr_schedulers"):
            return False
        cls = model.class_of(fn)
        for node in model.assignments:
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Attribute)
                and node.targets[0].attr == "automatic_optimization"
                and isinstance(node.value, ast.Constant)
                and node.value.value is False
                and cls is not None
                and model.enclosing_class(node) is cls
            ):
                return True
        return False

    def _called_through_instance(self, attr: str) -> bool:
        """``model.scheduler.step()`` outside the class that sets ``self.scheduler``: the
        attribute is reached through an instance (a parameter, a local), whose class the
        file cannot always tell; the method called on it counts."""
        for call in self.model.calls.get(self.method, ()):
            func = call.func
            if (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Attribute)
                and func.value.attr == attr
                and not (
                    isinstance(func.value.value, ast.Name)
                    and func.value.value.id in ("self", "cls")
                )
            ):
                return True
        return False

    def _references(self, target: ast.AST, key: Key) -> list[ast.AST]:
        return objects(self.model).reads(target, key)

    def _returned(self, ret: ast.Return, cur: ast.AST, expr: ast.AST, depth: int) -> Fate:
        model = self.model
        fn = model.function_of(ret)
        if fn is not None and fn.name == "configure_optimizers" and self._manual_lightning(fn):
            # Lightning steps returned schedulers only under automatic optimization;
            # under manual optimization `self.lr_schedulers()` hands them back to step
            return Fate.NEVER
        if fn is None or fn.name.startswith("configure_") or fn.name.startswith("_configure"):
            return Fate.ESCAPES  # a framework hook: the framework takes it
        sites = model.call_sites.get(id(fn), [])
        if not sites:
            return Fate.ESCAPES  # called from outside this file
        index = None
        value = ret.value
        if isinstance(value, (ast.Tuple, ast.List)) and value is not cur:
            return Fate.ESCAPES
        if isinstance(value, (ast.Tuple, ast.List)):
            for i, elt in enumerate(value.elts):
                if elt is expr or any(s is expr for s in ast.walk(elt)):
                    index = i
        verdicts = []
        for site in sites:
            parent = model.parent_of(site)
            if isinstance(parent, ast.Assign) and parent.value is site and len(parent.targets) == 1:
                t = parent.targets[0]
                if (
                    index is not None
                    and isinstance(t, (ast.Tuple, ast.List))
                    and (index < len(t.elts))
                ):
                    verdicts.append(self._name(t.elts[index], depth + 1))
                elif index is None and isinstance(t, (ast.Name, ast.Attribute)):
                    verdicts.append(self._name(t, depth + 1))
                else:
                    verdicts.append(Fate.ESCAPES)
            else:
                verdicts.append(self.of(site, depth + 1) if index is None else Fate.ESCAPES)
        return _merge(verdicts)

    def _into_call(self, call: ast.Call, arg: ast.AST, depth: int) -> Fate:
        model = self.model
        target = model.resolve_call(call)
        if target is None:
            return Fate.ESCAPES  # cross-file calls: the project index will resolve these
        name = parameter_for(model, call, target, arg)
        if name is None:
            return Fate.ESCAPES
        # closures count: ignite's `create_trainer(..., lr_scheduler)` steps it in the nested
        # `train_step(engine, batch)` it hands to the Engine
        for node in ast.walk(target):
            if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load):
                parent = model.parent_of(node)
                if isinstance(parent, ast.Attribute) and parent.attr == self.method:
                    return Fate.CALLED
        # not called directly: follow its uses inside the helper
        verdicts = []
        for node in walk_local(target):
            if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load):
                parent = model.parent_of(node)
                if isinstance(parent, ast.Attribute):
                    continue
                if isinstance(parent, (ast.Compare, ast.If, ast.BoolOp, ast.UnaryOp)):
                    continue
                verdicts.append(self.of(node, depth + 1))
        return _merge(verdicts)


def _merge(verdicts: list[Fate]) -> Fate:
    if Fate.CALLED in verdicts:
        return Fate.CALLED
    if Fate.ESCAPES in verdicts:
        return Fate.ESCAPES
    return Fate.NEVER
