"""Settings: what a configuration value read as ``cfg.warmup_epochs`` (or ``CONFIG["k"]``)
holds when nothing in the project changes it.

A training script often reads its lengths from a config object built in another module:
a dataclass (``warmup_epochs: int = 5``), a plain class whose ``__init__`` stores
constants, a ``SimpleNamespace(...)``/``EasyDict(...)`` or a module-level dict literal.
Each file's :func:`summary` (plain data, from the tree alone) says which defaults it
declares and which settings it may change; :func:`merge` joins the summaries of a
project; :func:`view` gives a file the values of the settings it reads.

A setting is decided only when the whole project agrees: one default (or defaults that are
all positive), and no file that could give it another value: an attribute or key store,
a keyword of that name in any call, a command-line flag of that name (the user's command
line decides it), a ``setattr``/``__dict__.update`` with a computed name, or a class whose
instances are built from a ``**`` splat or handed to a parser (``HfArgumentParser(C)``,
``tyro.cli(C)``, ``OmegaConf.structured(C)``). Anything else stays unknown: precision
first.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from trainlint.analysis.arguments import default_of, parameter_names
from trainlint.analysis.walk import walk_tree

if TYPE_CHECKING:
    from trainlint.analysis.model import FileModel

#: Calls whose keywords declare a namespace's values rather than change a setting.
NAMESPACE_CALLS = frozenset({"SimpleNamespace", "Namespace", "EasyDict", "edict", "dict", "Box"})
#: The value of a setting that every default gives as a positive number, but not the same.
POSITIVE = "+"


def _number(node: ast.AST | None) -> float | int | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _number(node.operand)
        return -inner if inner is not None else None
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, (int, float))
        and not isinstance(node.value, bool)
    ):
        return node.value
    return None


def _last_name(func: ast.AST) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _field_value(value: ast.AST | None) -> ast.AST | None:
    """``x: int = 5`` or ``x: int = field(default=5)``: the default's expression."""
    if isinstance(value, ast.Call) and _last_name(value.func) == "field":
        for k in value.keywords:
            if k.arg == "default":
                return k.value
        return None
    return value


#: Names a file that evaluates learning-rate multipliers or writes LRs by hand uses:
#: only such a file is given settings and constructor arguments in its view.
CONSUMERS = frozenset({"param_groups", "LambdaLR", "MultiplicativeLR", "lr_lambda"})
#: The nodes :meth:`_Collector.node` looks at.
_NODE_TYPES = frozenset({ast.Attribute, ast.Subscript, ast.Call})


class _Collector:
    def __init__(self) -> None:
        self.defaults: dict[str, list[list[Any]]] = {}  # name -> [[class or "", value]]
        self.changed: set[str] = set()
        self.open: set[str] = set()
        self.reads: set[str] = set()
        self.dynamic = False
        # the nodes that declare defaults (a store in `__init__`, a module literal): ids
        self.declared: set[int] = set()
        self.classes: list[str] = []
        self.cls_splat = False
        self.passed: dict[str, list[dict[str, object]]] = {}  # class name -> call sites

    def default(self, name: str, owner: str, value: ast.AST | None) -> None:
        self.defaults.setdefault(name, []).append([owner, _number(value)])

    def class_body(self, cls: ast.ClassDef) -> None:
        for stmt in cls.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                if stmt.value is not None:
                    self.default(stmt.target.id, cls.name, _field_value(stmt.value))
            elif (
                isinstance(stmt, ast.Assign)
                and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)
            ):
                self.default(stmt.targets[0].id, cls.name, stmt.value)
            elif isinstance(stmt, ast.FunctionDef) and stmt.name == "__init__":
                self.init(cls.name, stmt)

    def init(self, owner: str, fn: ast.FunctionDef) -> None:
        """``self.x = 5`` or ``self.x = x`` (a parameter with a constant default) in a
        plain config class's ``__init__``: defaults. Any other store there changes ``x``."""
        params = {p: default_of(fn, p) for p in parameter_names(fn)}
        for stmt in fn.body:
            if (
                isinstance(stmt, ast.Assign)
                and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Attribute)
                and isinstance(stmt.targets[0].value, ast.Name)
                and stmt.targets[0].value.id == "self"
            ):
                name, value = stmt.targets[0].attr, stmt.value
                if isinstance(value, ast.Name) and value.id in params:
                    self.default(name, owner, params[value.id])
                else:
                    self.default(name, owner, value)
                self.declared.add(id(stmt.targets[0]))

    def module_literal(self, stmt: ast.Assign) -> None:
        """``CONFIG = {"warmup": 5}`` / ``CFG = SimpleNamespace(warmup=5)`` at the top level."""
        value = stmt.value
        if isinstance(value, ast.Dict):
            for k, v in zip(value.keys, value.values, strict=True):
                if isinstance(k, ast.Constant) and isinstance(k.value, str):
                    self.default(k.value, "", v)
            self.declared.add(id(value))
        elif isinstance(value, ast.Call) and _last_name(value.func) in NAMESPACE_CALLS:
            for kw in value.keywords:
                if kw.arg is not None:
                    self.default(kw.arg, "", kw.value)
            self.declared.add(id(value))

    def node(self, node: ast.AST) -> None:
        if isinstance(node, ast.Attribute):
            if isinstance(node.ctx, ast.Load):
                self.reads.add(node.attr)
            elif id(node) not in self.declared:
                self.changed.add(node.attr)
        elif isinstance(node, ast.Subscript):
            key = node.slice
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                if isinstance(node.ctx, ast.Load):
                    self.reads.add(key.value)
                else:
                    self.changed.add(key.value)
        elif isinstance(node, ast.Call):
            self.call(node)

    def arguments(self, call: ast.Call, name: str, constants: dict[str, object]) -> None:
        """``Cls(opt, 0, start_step=init_step)``: what a constructor call passes, by
        keyword or position (``"0"`` is the first after ``self``), as numbers (a name
        bound once in the function to a number counts) or None."""
        passed: dict[str, object] = {}
        if any(isinstance(a, ast.Starred) for a in call.args) or any(
            k.arg is None for k in call.keywords
        ):
            passed["*"] = None
        pairs = [(str(i), a) for i, a in enumerate(call.args)]
        pairs += [(k.arg, k.value) for k in call.keywords if k.arg is not None]
        for key, arg in pairs:
            value = _number(arg)
            if value is None and isinstance(arg, ast.Name):
                value = constants.get(arg.id)  # type: ignore[assignment]
            passed[key] = value
        self.passed.setdefault(name, []).append(passed)

    def call(self, call: ast.Call) -> None:
        name = _last_name(call.func)
        declared = id(call) in self.declared
        if name == "add_argument":
            for a in call.args:
                if isinstance(a, ast.Constant) and isinstance(a.value, str):
                    self.changed.add(a.value.lstrip("-").replace("-", "_"))
            for k in call.keywords:
                if k.arg == "dest" and isinstance(k.value, ast.Constant):
                    self.changed.add(str(k.value.value))
            return
        if name == "setattr" and len(call.args) >= 2:
            key = call.args[1]
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                self.changed.add(key.value)
            else:
                self.dynamic = True
        if name == "update" and isinstance(call.func, ast.Attribute):
            for arg in call.args:  # `cfg.update({"warmup": 3})`
                if isinstance(arg, ast.Dict):
                    self.changed.update(
                        k.value
                        for k in arg.keys
                        if isinstance(k, ast.Constant) and isinstance(k.value, str)
                    )
            base = call.func.value
            if (isinstance(base, ast.Attribute) and base.attr == "__dict__") or (
                isinstance(base, ast.Call) and _last_name(base.func) == "vars"
            ):
                self.dynamic = True
        for k in call.keywords:
            if k.arg is None:
                if name == "cls":
                    self.cls_splat = True
                elif name[:1].isupper():
                    self.open.add(name)
            elif not declared:
                self.changed.add(k.arg)
        for a in [*call.args, *(k.value for k in call.keywords)]:
            handed = _last_name(a) if isinstance(a, (ast.Name, ast.Attribute)) else ""
            if handed[:1].isupper():
                self.open.add(handed)  # a class handed to a parser or a loader


def summary(
    tree: ast.Module, model: FileModel | None = None, text: str | None = None
) -> dict[str, Any] | None:
    """A file's settings as plain data: ``defaults`` (name -> [[class, number or None]]),
    ``changed`` (names it may change), ``open`` (classes it builds from splats or hands to
    parsers), ``passed`` (constructor arguments), ``dynamic``; and, for a file that
    evaluates schedules (see ``CONSUMERS``), ``reads`` and ``classes``. With the file's
    model, its tables of calls and assignments serve (no walk of the tree, except the
    reads of a file whose ``text`` names a consumer)."""
    c = _Collector()
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            if isinstance(stmt.targets[0], ast.Name):
                c.module_literal(stmt)
    if model is None:
        _walk(c, tree)
    else:
        _tables(c, model)
        if text is None:
            _reads(c, tree)
        elif any(word in text for word in CONSUMERS):
            _reads_from_tables(c, model, text)
    if c.cls_splat:  # `cls(**loaded)` in a classmethod: its class (this file's) is open
        c.open.update(c.classes)
    # Only a file that evaluates schedules asks for values: the others' views stay as
    # they were (a view that changes as the project's files come in costs a re-lint)
    consumer = not CONSUMERS.isdisjoint(c.reads)
    if not (c.defaults or c.changed or c.open or c.dynamic or c.passed or consumer):
        return None
    out: dict[str, Any] = {
        "defaults": c.defaults,
        "changed": sorted(c.changed),
        "open": sorted(c.open),
    }
    if consumer:
        out["reads"] = sorted(c.reads)
        if c.classes:
            out["classes"] = sorted(set(c.classes))
    if c.passed:
        out["passed"] = c.passed
    if c.dynamic:
        out["dynamic"] = True
    return out


def _walk(c: _Collector, tree: ast.Module) -> None:
    """Everything from one walk of the tree (a file without a model): a class is met
    before its statements, so the stores its ``__init__`` declares are known when they
    come."""
    stores: dict[str, int] = {}  # how often each plain name is bound in the file
    numbers: dict[str, object] = {}  # `first_step = 0`: names assigned a number
    built: list[tuple[ast.Call, str]] = []  # calls of capitalised names (constructions)
    node_types = _NODE_TYPES
    for node in walk_tree(tree):
        kind = type(node)
        if kind is ast.Name:
            if type(node.ctx) is not ast.Load:  # type: ignore[attr-defined]
                stores[node.id] = stores.get(node.id, 0) + 1  # type: ignore[attr-defined]
            elif node.id in CONSUMERS:  # type: ignore[attr-defined]
                c.reads.add(node.id)  # type: ignore[attr-defined]
        elif kind is ast.ClassDef:
            c.class_body(node)  # type: ignore[arg-type]
            c.classes.append(node.name)  # type: ignore[attr-defined]
        elif kind is ast.Assign:
            target = node.targets[0]  # type: ignore[attr-defined]
            if type(target) is ast.Name and len(node.targets) == 1:  # type: ignore[attr-defined]
                value = _number(node.value)  # type: ignore[attr-defined]
                if value is not None:
                    numbers[target.id] = value
        elif kind in node_types:
            c.node(node)
            if kind is ast.Call:
                name = _last_name(node.func)  # type: ignore[attr-defined]
                if name[:1].isupper():
                    built.append((node, name))  # type: ignore[arg-type]
    # a name bound once in the file, to a number, stands for it at the constructions
    constants = {n: v for n, v in numbers.items() if stores.get(n) == 1}
    for call, name in built:
        c.arguments(call, name, constants)


def _tables(c: _Collector, model: FileModel) -> None:
    """The same from the model's tables: its classes, assignments and calls."""
    for cls in model.classes:
        c.class_body(cls)
        c.classes.append(cls.name)
    stores: dict[str, int] = {}
    numbers: dict[str, object] = {}
    for node in model.assignments:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            for sub in ast.walk(target) if not isinstance(target, ast.Name) else (target,):
                if isinstance(sub, ast.Name):
                    stores[sub.id] = stores.get(sub.id, 0) + 1
                elif isinstance(sub, (ast.Attribute, ast.Subscript)):
                    c.node(sub)
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            value = _number(node.value)
            if isinstance(target, ast.Name) and value is not None:
                numbers[target.id] = value
    constants = {n: v for n, v in numbers.items() if stores.get(n) == 1}
    for name, calls in model.calls.items():
        for call in calls:
            c.call(call)
            if name[:1].isupper():
                c.arguments(call, _last_name(call.func), constants)


def _reads(c: _Collector, tree: ast.Module) -> None:
    """The names read as attributes or constant keys, and the consumer names used."""
    for node in walk_tree(tree):
        kind = type(node)
        if kind is ast.Attribute:
            if type(node.ctx) is ast.Load:  # type: ignore[attr-defined]
                c.reads.add(node.attr)  # type: ignore[attr-defined]
        elif kind is ast.Name:
            if node.id in CONSUMERS:  # type: ignore[attr-defined]
                c.reads.add(node.id)  # type: ignore[attr-defined]
        elif kind is ast.Subscript:
            key = node.slice  # type: ignore[attr-defined]
            if type(key) is ast.Constant and isinstance(key.value, str):
                if type(node.ctx) is ast.Load:  # type: ignore[attr-defined]
                    c.reads.add(key.value)


#: ``x["key"]`` in a file's text: a constant key it may read (a store counts too: the
#: reads only widen the view a consumer gets, they decide nothing)
_KEY = re.compile(r"""\[\s*(['"])(\w+)\1\s*\]""")


def _reads_from_tables(c: _Collector, model: FileModel, text: str) -> None:
    """``_reads`` from the model's tables and the text, with no walk of the tree: the
    attributes the file loads, the consumer names it spells, its constant keys."""
    for attr, nodes in model.attributes.items():
        if any(type(n.ctx) is ast.Load for n in nodes):
            c.reads.add(attr)
    c.reads.update(word for word in CONSUMERS if word in text)
    c.reads.update(m.group(2) for m in _KEY.finditer(text))


class ProjectSettings:
    """The settings of one project, joined file by file (a run adds summaries as it goes:
    each is taken once, and a view asks only for the names its file reads)."""

    def __init__(self) -> None:
        self.defaults: dict[str, list[list[Any]]] = {}
        self.changed: set[str] = set()
        self.open: set[str] = set()
        self.dynamic = False
        self.passed: dict[str, list[dict[str, Any]]] = {}

    def add(self, file_summary: dict[str, Any] | None) -> None:
        if not file_summary:
            return
        self.dynamic = self.dynamic or bool(file_summary.get("dynamic"))
        for name, found in file_summary["defaults"].items():
            self.defaults.setdefault(name, []).extend(found)
        self.changed.update(file_summary["changed"])
        self.open.update(file_summary["open"])
        for name, sites in file_summary.get("passed", {}).items():
            self.passed.setdefault(name, []).extend(sites)

    def value(self, name: str) -> Any:
        """A number, ``POSITIVE``, or None (undecided)."""
        found = self.defaults.get(name)
        if self.dynamic or not found or name in self.changed:
            return None
        if any(owner in self.open for owner, _ in found):
            return None
        values = {v for _, v in found}
        if None in values:
            return None
        if len(values) == 1:
            return values.pop()
        return POSITIVE if all(v > 0 for v in values) else None

    def passed_to(self, cls: str) -> dict[str, Any]:
        """The arguments every construction of ``cls`` in the project passes as the same
        number (by keyword, or ``"0"``... by position); nothing when any site splats."""
        sites = self.passed.get(cls, ())
        if not sites or any("*" in site for site in sites):
            return {}
        keys = set(sites[0]).intersection(*sites[1:])
        out: dict[str, Any] = {}
        for key in keys:
            values = {site[key] for site in sites}
            if len(values) == 1 and None not in values:
                out[key] = values.pop()
        return out

    def view(self, file_summary: dict[str, Any] | None) -> dict[str, Any]:
        """A file's part: ``settings`` (the decided settings it reads) and ``arguments``
        (for each class it defines, the numbers all its constructions agree on)."""
        if not file_summary:
            return {}
        settings: dict[str, Any] = {}
        for name in file_summary.get("reads", ()):
            value = self.value(name)
            if value is not None:
                settings[name] = value
        arguments = {}
        for cls in file_summary.get("classes", ()):
            passed = self.passed_to(cls)
            if passed:
                arguments[cls] = passed
        out: dict[str, Any] = {}
        if settings:
            out["settings"] = settings
        if arguments:
            out["arguments"] = arguments
        return out


def merge(summaries: Iterable[dict[str, Any] | None]) -> dict[str, Any]:
    """The decided settings of a project, all at once: name -> a number or ``POSITIVE``."""
    joined = ProjectSettings()
    for s in summaries:
        joined.add(s)
    return {n: v for n in joined.defaults if (v := joined.value(n)) is not None}
