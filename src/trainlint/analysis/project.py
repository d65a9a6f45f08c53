"""The project index: what each module of the linted tree does, summarised, across files.

A run lints each file once and, on the way, takes a small *summary* of it (plain
data: JSON- and pickle-ready, cached by the file's bytes): its module name, its
module-level imports (relative ones made absolute), star imports, and per function
and class only what other files can use:

* what a function returns, when that is a scheduler, optimizer or model built inside
  it (with the scheduler's class and the unit its length counts in);
* which of its parameters a function or constructor takes (to map call sites);
* whether a class is a ``threading.Thread`` and whether its ``forward`` returns a
  softmax;
* the calls it makes to functions and classes of the project, with the roles of the
  arguments it passes (``Trainer(model, opt, StepLR(opt, 30))``).

:class:`ProjectIndex` merges the summaries and gives every file its *view*: the facts
about the names it imports and about the parameters of its own functions (from the
call sites anywhere in the project). The view is all a file's lint may read from the
index, so a file's cached findings are keyed on its bytes and on its view's digest:
editing one module re-lints it and the files whose view it changes, nothing else.
No tree and no per-file model outlives its file.
"""

from __future__ import annotations

import ast
import re
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainlint._record import Record
from trainlint.analysis import checkpoints
from trainlint.analysis.checkpoints import WORDS as CHECKPOINT_WORDS
from trainlint.analysis.model import walk_tree
from trainlint.analysis.roles import Binding, Role
from trainlint.analysis.torch_table import SAME_OBJECT_METHODS

if TYPE_CHECKING:
    from trainlint.analysis.model import FileModel

#: Files without any of these bytes have nothing to say to other files beyond their
#: imports: no model is built just for their summary.
SUMMARY_WORDS = (b"schedul", b"optim.", b"softmax", b"Thread", b"Optimizer", b"import optim")
#: Files with any of these (and none of the above) get a model for their step effects
#: only (analysis.effects).
EFFECT_WORDS = (
    b"backward",
    b"zero_grad",
    b"step(",
    b"eval(",
    b"train(",
    b"clip_grad",
    b".grad",
    b".append(",
    b"+=",
    *CHECKPOINT_WORDS,  # saves and loads are summarised from the model (analysis.checkpoints)
)
#: Star imports pass on these libraries' names (``from common import *`` where
#: ``common`` does ``import torch``).
_EXPORTED_LIBRARIES = (
    "torch",
    "torchvision",
    "transformers",
    "accelerate",
    "lightning",
    "pytorch_lightning",
    "timm",
    "ray",
    "threading",
    "multiprocessing",
)
#: Resolution hops through re-exports and star imports.
MAX_HOPS = 6
#: Calls across files followed from one function (a -> b -> c -> d).
MAX_EFFECT_DEPTH = 4
_THREAD_BASES = ("threading.Thread",)

Fact = list[Any]  # [kind, cls/qualname, unit, extra] (a list: it round-trips through JSON)


class ForeignBinding(Binding, frozen=True):
    """A role known from another file (a factory's return, a constructor's call sites)
    or from a parameter's annotation: there is no construction call in this file.
    ``softmax``: for models, the class's ``forward`` returns a softmax output."""

    __slots__ = ("cls", "unit", "softmax")

    def __init__(
        self,
        role: Role,
        qualname: str | None,
        call: ast.Call | None,
        node: ast.AST,
        cls: str | None = None,
        unit: str | None = None,
        softmax: bool = False,
    ) -> None:
        super().__init__(role, qualname, call, node)
        self.cls = cls
        self.unit = unit
        self.softmax = softmax

    # by all seven fields (Binding's own compare its four)
    __eq__ = Record.__eq__
    __hash__ = Record._hash


# -- module names ---------------------------------------------------------------------------


@lru_cache(maxsize=4096)
def _package_root(directory: str) -> tuple[str, tuple[str, ...]]:
    """(root, package parts) of a directory: the parts are the packages (directories
    with an ``__init__.py``) from the root down to ``directory``."""
    d = Path(directory)
    if not (d / "__init__.py").is_file():
        return directory, ()
    root, parts = _package_root(str(d.parent))
    return root, (*parts, d.name)


def module_of(path: str | Path) -> tuple[str, str, bool]:
    """(root, dotted module name, is a package ``__init__``) of a source file."""
    p = Path(path).absolute()
    root, parts = _package_root(str(p.parent))
    is_pkg = p.name == "__init__.py"
    if not is_pkg:
        parts = (*parts, p.stem)
    return root, ".".join(parts), is_pkg


def absolute(raw: str, module: str, is_pkg: bool) -> str:
    """``.sched.make`` seen in ``pkg.train`` -> ``pkg.sched.make``."""
    if not raw.startswith("."):
        return raw
    level = len(raw) - len(raw.lstrip("."))
    base = module.split(".") if module else []
    if not is_pkg:
        base = base[:-1]
    if level > 1:
        base = base[: max(0, len(base) - (level - 1))]
    rest = raw[level:]
    return ".".join([*base, rest] if rest else base)


_IMPORT_LINE = re.compile(
    rb"[ \t]*(?:from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]*(\(?)([\w, \t*]*)"
    rb"|import[ \t]+([\w., \t]+))"
)
_COMMENT = re.compile(rb"#[^\n]*")


def imported_names(data: bytes, module: str, is_pkg: bool) -> dict[str, set[str] | None]:
    """The modules a file's import lines may name, each with the names imported from it
    (None: the module itself, or all of it): ``from pkg import sched`` names ``pkg``
    (for ``sched``) and ``pkg.sched`` (None), either of which may be the module; ``import
    m`` and ``from m import *`` name all of ``m``. Read from the bytes before any parse,
    a parenthesised list over several lines included: to order the files of a run and
    to leave out of a summary what no file imports, never to judge one (a line the
    pattern misses costs time only, see ``runner.run``)."""
    out: dict[str, set[str] | None] = {}

    def name(base: str, imported: str) -> None:
        if imported == "*":
            out[base] = None
            return
        out[f"{base}.{imported}" if base else imported] = None
        names = out.setdefault(base, set())
        if names is not None:
            names.add(imported)

    pos = data.find(b"import")
    while pos != -1:  # only the lines that spell `import`, each matched from its start
        start = data.rfind(b"\n", 0, pos) + 1
        end = data.find(b"\n", pos)
        end = len(data) if end == -1 else end
        m = _IMPORT_LINE.match(data, start, end)
        listed: bytes | None
        if m is not None and m.group(2) and b")" not in data[m.end() : end]:
            close = data.find(b")", end)  # `from m import (` and a list over lines
            end = len(data) if close == -1 else close
            listed = _COMMENT.sub(b"", data[m.start(3) : end])
        elif m is not None and data[m.end() : end].rstrip(b" \t\r") == b"\\":
            while data[:end].rstrip(b" \t\r").endswith(b"\\") and end < len(data):
                nxt = data.find(b"\n", end + 1)  # `from m import a, \` and more lines
                end = len(data) if nxt == -1 else nxt
            listed = data[m.start(3) : end].replace(b"\\", b" ")
        else:
            listed = m.group(3) if m is not None else None
        pos = data.find(b"import", end)
        if m is None:
            continue
        if m.group(4) is not None:
            for part in m.group(4).split(b","):
                words = part.split()
                if words:
                    out[words[0].decode("ascii", "replace")] = None
            continue
        base = absolute(m.group(1).decode("ascii", "replace"), module, is_pkg)
        out.setdefault(base, set())
        for part in (listed or b"").split(b","):
            words = part.split()
            if words:
                name(base, words[0].decode("ascii", "replace"))
    return out


def import_graph(
    files: list[tuple[Path, tuple[str, str, bool] | None]], read: Callable[[Path], bytes | str]
) -> list[dict[int, set[str] | None]]:
    """For each of ``files`` (path, module), the files of the list its import lines may
    name (:func:`imported_names`), by position, each with the names it imports from
    that file (None: all of it). ``read`` gives a file's bytes (a str: it cannot be
    read)."""
    where: dict[tuple[str, str], int] = {}
    for k, (_, mod) in enumerate(files):
        if mod is not None:
            where.setdefault((mod[0], mod[1]), k)
    graph: list[dict[int, set[str] | None]] = []
    for path, mod in files:
        found: dict[int, set[str] | None] = {}
        if mod is not None and len(where) > 1:
            data = read(path)
            if not isinstance(data, str):
                for name, names in sorted(imported_names(data, mod[1], mod[2]).items()):
                    dep = where.get((mod[0], name))
                    if dep is not None:
                        found[dep] = names
        graph.append(found)
    return graph


def import_order(deps: list[list[int]]) -> list[int]:
    """The positions of the files whose imports are ``deps`` (:func:`import_graph`) with
    every file after the files it imports, depth first in the given order; an import
    cycle is cut where it closes."""
    order: list[int] = []
    state = [0] * len(deps)  # 0 new, 1 on the stack, 2 placed
    for start in range(len(deps)):
        if state[start]:
            continue
        stack = [(start, iter(deps[start]))]
        state[start] = 1
        while stack:
            k, todo = stack[-1]
            nxt = next((d for d in todo if not state[d]), None)
            if nxt is None:
                stack.pop()
                state[k] = 2
                order.append(k)
            else:
                state[nxt] = 1
                stack.append((nxt, iter(deps[nxt])))
    return order


# -- summaries --------------------------------------------------------------------------------


def summarize(
    model: FileModel | None,
    tree: ast.Module,
    info: tuple[str, str, bool],
    facts: bool = True,
    keep: frozenset[str] | None = None,
    within: frozenset[str] | None = None,
    text: str | None = None,
) -> dict:
    """The summary of one file (``model`` None: only what the tree's top level says;
    ``facts`` False: the model is there for the step effects only, the file has none of
    the words the role facts need). ``keep``, when given, names the top-level functions
    and classes the other files of the run import (by their bytes): the others' returns,
    kept parameters and effects, which only a caller in another file reads, are left
    out (their entries say ``"lean"``; see :attr:`ProjectIndex.lean_read`). ``within``,
    when given, names the top-level modules of the run under the file's root: calls into
    any other top-level module (``gym.make``, ``wandb.init``) name nothing the index can
    resolve, so their argument facts are not taken, and the summary lists those modules
    under ``"outside"`` (a run that has one of them must summarise the file again).
    ``text``: the file's source, when known: with no model, a class whose ``__init__``
    keeps a parameter is walked for walruses only when the text spells a ``:=``."""
    root, module, is_pkg = info
    fm = model if facts else None
    imports: dict[str, list[str]] = {}
    stars: list[str] = []
    exported: dict[str, str] = {}
    defs: list[str] = []
    for stmt in tree.body:
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                local = alias.asname or alias.name.split(".", 1)[0]
                target = alias.name if alias.asname else local
                imports[local] = [target, target]
                if target.split(".", 1)[0] in _EXPORTED_LIBRARIES:
                    exported[local] = target
        elif isinstance(stmt, ast.ImportFrom):
            raw_mod = "." * stmt.level + (stmt.module or "")
            for alias in stmt.names:
                if alias.name == "*":
                    stars.append(absolute(raw_mod, module, is_pkg))
                    continue
                raw = (
                    f"{raw_mod}.{alias.name}"
                    if not raw_mod.endswith(".")
                    else (raw_mod + alias.name)
                )
                full = absolute(raw, module, is_pkg)
                imports[alias.asname or alias.name] = [raw, full]
                if full.split(".", 1)[0] in _EXPORTED_LIBRARIES:
                    exported[alias.asname or alias.name] = full
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defs.append(stmt.name)
    functions: dict[str, dict] = {}
    classes: dict[str, dict] = {}
    outside: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions[stmt.name] = _function(
                model,
                fm,
                stmt,
                module,
                is_pkg,
                stmt.name,
                keep is not None and stmt.name not in keep,
            )
        elif isinstance(stmt, ast.ClassDef):
            cls: dict[str, Any] = {
                "bases": [b for b in (_base(model, x, module, is_pkg) for x in stmt.bases) if b]
            }
            for item in stmt.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    functions[f"{stmt.name}.{item.name}"] = _function(
                        model,
                        fm,
                        item,
                        module,
                        is_pkg,
                        f"{stmt.name}.{item.name}",
                        keep is not None and stmt.name not in keep,
                    )
                    if item.name == "forward" and fm is not None and _returns_softmax(fm, item):
                        cls["softmax"] = True
            if fm is not None and any(b in _THREAD_BASES for b in cls["bases"]):
                cls["thread"] = True
            attrs = _init_attributes(stmt, model, text)
            if attrs:
                cls["attrs"] = attrs
            classes[stmt.name] = cls
    out = {
        "root": root,
        "module": module,
        "pkg": is_pkg,
        "imports": imports,
        "stars": stars,
        "exported": exported,
        "defs": defs,
        "functions": functions,
        "classes": classes,
        "calls": _calls(fm, module, is_pkg, within, outside) if fm is not None else [],
    }
    if outside:
        out["outside"] = sorted(outside)
    uses = _uses(model, imports, module) if model is not None else []
    if uses:
        out["uses"] = uses
    ck = checkpoints.summary(model) if model is not None else None
    if ck:
        out["ckpt"] = ck
    if keep is not None:
        out["lean"] = sorted(keep)
    return out


def bare_summary(module: tuple[str, str, bool]) -> dict[str, Any]:
    """The summary of a file with nothing to say (unreadable, too large, not parsed)."""
    root, name, is_pkg = module
    return {
        "root": root,
        "module": name,
        "pkg": is_pkg,
        "imports": {},
        "stars": [],
        "exported": {},
        "defs": [],
        "functions": {},
        "classes": {},
        "calls": [],
    }


def _uses(model: FileModel, imports: dict[str, list[str]], module: str) -> list[str]:
    """What the file calls through its imports, spelled as its lint resolves it
    (``.engine.train_step``), and ``?.m`` for a method ``m`` called on a name or ``self``
    attribute assigned an imported class's instance somewhere in the file: the view
    carries the effects of these functions only."""
    from trainlint.analysis.effects import not_project

    own = module.split(".", 1)[0]
    imports = {
        k: v
        for k, v in imports.items()
        if _project_candidate(v[1]) and not not_project(v[0], v[1], own)
    }
    if not imports:
        return []
    out: set[str] = set()
    built: set[str] = set()  # names and `self.x` assigned a call of an imported name
    methods: list[tuple[str, str]] = []
    for assign in model.assignments:
        if (
            isinstance(assign, ast.Assign)
            and isinstance(assign.value, ast.Call)
            and _head(assign.value.func) in imports
        ):
            for t in assign.targets:
                name = _receiver(t)
                if name is not None:
                    built.add(name)
    for calls in model.calls.values():
        for node in calls:
            func = node.func
            if func.__class__ is ast.Name:  # (most calls: no chain to walk)
                if func.id in imports:
                    out.add(imports[func.id][0])
                continue
            parts: list[str] = []
            while func.__class__ is ast.Attribute:
                parts.append(func.attr)
                func = func.value
            if func.__class__ is not ast.Name:
                continue
            head = func.id
            if head in imports:
                out.add(".".join([imports[head][0], *reversed(parts)]))
            elif not built:
                continue  # (no receiver a method call could be on)
            elif len(parts) == 1 and head != "self":
                methods.append((head, parts[0]))  # `tracker.record(...)`
            elif len(parts) == 2 and head == "self":
                methods.append((f"self.{parts[1]}", parts[0]))  # `self.tracker.record(...)`
    out.update(f"?.{m}" for recv, m in methods if recv in built)
    return sorted(out)


def _init_attributes(
    cls: ast.ClassDef, model: FileModel | None, text: str | None = None
) -> dict[str, str]:
    """``self.x = x`` in the class's ``__init__``: attribute -> the constructor parameter
    it keeps (only an attribute assigned nowhere else in the class, from a parameter
    the constructor never rebinds)."""
    init = next(
        (s for s in cls.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None
    )
    if init is None:
        return {}
    a = init.args
    params = {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)}
    kept: dict[str, str] = {}
    for stmt in init.body:
        if (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.value, ast.Name)
            and stmt.value.id in params
        ):
            t = stmt.targets[0]
            if (
                isinstance(t, ast.Attribute)
                and isinstance(t.value, ast.Name)
                and (t.value.id == "self")
            ):
                kept[t.attr] = stmt.value.id
    if not kept:
        return {}
    counts: dict[str, int] = {}
    rebound: set[str] = set()
    for target in _class_targets(cls, model, text):
        for n in walk_tree(target):
            if isinstance(n, ast.Name) and n.id in params:
                rebound.add(n.id)
            elif (
                isinstance(n, ast.Attribute)
                and isinstance(n.value, ast.Name)
                and (n.value.id == "self")
            ):
                counts[n.attr] = counts.get(n.attr, 0) + 1
    return {k: v for k, v in sorted(kept.items()) if counts.get(k) == 1 and v not in rebound}


_BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases")


def _class_targets(
    cls: ast.ClassDef, model: FileModel | None, text: str | None = None
) -> Iterator[ast.expr]:
    """Every target anything in ``cls`` assigns to (its methods' too): of assignments,
    ``for`` loops and ``with`` items, found through the statements alone, and of
    walruses, which only the model's table finds without walking every expression
    (none where ``text``, the file's source, spells no ``:=``)."""
    end = getattr(cls, "end_lineno", None) or cls.lineno
    if model is not None:
        # the model's tables, by line: a statement lies in the class exactly when it
        # starts within the class's lines (no statement shares its first or last line)
        lines, targets = _statement_targets(model)
        yield from targets[bisect_left(lines, cls.lineno) : bisect_right(lines, end)]
    else:
        todo: list[ast.AST] = list(reversed(cls.body))
        while todo:
            node = todo.pop()
            if isinstance(node, ast.Assign):
                yield from node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor)):
                yield node.target
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                yield from (i.optional_vars for i in node.items if i.optional_vars)
            for field in _BLOCKS:
                block = getattr(node, field, None)
                if block:
                    todo.extend(reversed(block))
    if model is None:
        walrus: Iterable[ast.AST] = (
            (n for n in walk_tree(cls) if isinstance(n, ast.NamedExpr))
            if text is None or ":=" in text
            else ()
        )
    else:
        # (the class's decorators are its own; its lines hold nothing outside it)
        first = min([d.lineno for d in cls.decorator_list] + [cls.lineno])
        walrus = (n for n in model.named_exprs if first <= n.lineno <= end)
    for node in walrus:
        yield node.target  # type: ignore[attr-defined]


def _statement_targets(model: FileModel) -> tuple[list[int], list[ast.expr]]:
    """The targets of every assignment, ``for`` and ``with`` statement of the file, by the
    statement's first line (the lines, sorted, and the targets in the same order)."""

    def build(m: FileModel) -> tuple[list[int], list[ast.expr]]:
        found: list[tuple[int, ast.expr]] = []
        for node in m.assignments:
            if isinstance(node, ast.Assign):
                found.extend((node.lineno, t) for t in node.targets)
            else:
                found.append((node.lineno, node.target))
        for loop in m.loops:
            if not isinstance(loop, ast.While):
                found.append((loop.lineno, loop.target))
        for w in m.withs:
            found.extend((w.lineno, i.optional_vars) for i in w.items if i.optional_vars)
        found.sort(key=lambda lt: lt[0])
        return [line for line, _ in found], [t for _, t in found]

    return model.memo(_statement_targets, build)


def _head(func: ast.expr) -> str | None:
    while func.__class__ is ast.Attribute:
        func = func.value  # type: ignore[attr-defined]
    return func.id if func.__class__ is ast.Name else None  # type: ignore[attr-defined]


def _receiver(target: ast.expr) -> str | None:
    if isinstance(target, ast.Name):
        return target.id
    if (
        isinstance(target, ast.Attribute)
        and isinstance(target.value, ast.Name)
        and (target.value.id == "self")
    ):
        return f"self.{target.attr}"
    return None


def _base(model: FileModel | None, node: ast.expr, module: str, is_pkg: bool) -> str | None:
    if model is not None:
        q = model.qualname(node)
        if q is not None:
            return absolute(q, module, is_pkg)
    return node.id if isinstance(node, ast.Name) else None


def _function(
    model: FileModel | None,
    full: FileModel | None,
    fn: ast.FunctionDef | ast.AsyncFunctionDef,
    module: str,
    is_pkg: bool,
    qualname: str,
    lean: bool = False,
) -> dict:
    a = fn.args
    out: dict[str, Any] = {"params": [x.arg for x in (*a.posonlyargs, *a.args)]}
    if a.kwonlyargs:
        out["kwonly"] = [x.arg for x in a.kwonlyargs]
    if a.kwarg is not None and full is not None:
        keys = _kwargs_keys(fn, a.kwarg.arg)
        if keys:  # `kwargs["scheduler"]` / `kwargs.get("scheduler")`: call sites say what
            out["kwarg"] = [a.kwarg.arg, keys]
    if lean:  # (the parameters and **kwargs keys stay: the file's own calls fill them)
        out["lean"] = True
        return out
    if full is not None:
        ret = _returned_fact(full, fn)
        if ret is not None:
            out["returns"] = ret
    if model is not None:
        from trainlint.analysis.accumulation import kept_parameters

        kept = kept_parameters(model, fn)
        if kept:  # `self.history.append(loss)`: what a caller passes there is kept
            out["keeps"] = kept
        if model.imports_training_library and fn.name != "__init__":  # (never followed)
            from trainlint.analysis.effects import effects_of

            effects = effects_of(model, fn, qualname, module, is_pkg)
            if effects is not None:
                out["effects"] = effects
    return out


def _kwargs_keys(fn: ast.AST, kwarg: str) -> list[str]:
    """The constant keys ``fn`` reads from its ``**kwarg``."""
    from trainlint.analysis.model import walk_local

    return sorted(
        {
            read[1]
            for node in walk_local(fn)
            if (read := _keyword_read(node)) is not None and read[0] == kwarg
        }
    )


def _keyword_read(node: ast.AST) -> tuple[str, str] | None:
    """``kwargs["scheduler"]``, ``kwargs.get("scheduler")`` or ``kwargs.pop(...)``:
    (the mapping's name, the constant key); None for anything else."""
    if isinstance(node, ast.Subscript):
        base, key = node.value, node.slice
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and (node.func.attr in ("get", "pop") and node.args)
    ):
        base, key = node.func.value, node.args[0]
    else:
        return None
    if isinstance(base, ast.Name) and isinstance(key, ast.Constant) and isinstance(key.value, str):
        return base.id, key.value
    return None


def fact_of(model: FileModel, binding: Binding | None) -> Fact | None:
    """A role binding as plain data: [role, class, unit, softmax]."""
    if binding is None or binding.role not in (Role.SCHEDULER, Role.OPTIMIZER, Role.MODEL):
        return None
    if isinstance(binding, ForeignBinding):
        return [binding.role.value, binding.cls, binding.unit, binding.softmax]
    cls = (binding.qualname or "").rsplit(".", 1)[-1] or None
    unit = None
    if binding.role is Role.SCHEDULER:
        from trainlint.analysis.schedule_units import sized_in_iterations
        from trainlint.analysis.schedules import schedule_of

        sched = schedule_of(model, binding) if binding.call is not None else None
        if sched is not None:
            cls, unit = sched.cls, sched.unit
            if unit == "epoch" and sized_in_iterations(model, sched):
                unit = "iteration"
    return [binding.role.value, cls, unit, False]


def _returned_fact(model: FileModel, fn: ast.AST) -> Fact | None:
    facts: list[Fact] = []
    for node in model.returns_in(fn):
        if node.value is None or not isinstance(node.value, (ast.Call, ast.Name, ast.Attribute)):
            return None
        found = model.roles.classify(node.value)
        fact = fact_of(model, found[0]) if len(found) == 1 else None
        if fact is None:
            return None
        facts.append(fact)
    if not facts:
        return None
    if any(f[0] != facts[0][0] for f in facts):
        return None
    if any(f != facts[0] for f in facts):
        return [facts[0][0], None, None, False]  # same role, different kinds: no unit
    return facts[0]


def _returns_softmax(model: FileModel, forward: ast.AST) -> bool:
    from trainlint.analysis.softmax import softmax_sources

    returns = model.returns_in(forward)
    return bool(returns) and all(
        r.value is not None and softmax_sources(model, r.value) for r in returns
    )


def _project_candidate(qual: str) -> bool:
    top = qual.split(".", 1)[0]
    return top not in (
        "builtins",
        "torch",
        "os",
        "sys",
        "math",
        "numpy",
        "np",
        "typing",
        "functools",
        "itertools",
        "collections",
        "logging",
    )


def _left_out(qual: str, within: frozenset[str] | None, outside: set[str]) -> bool:
    """Whether ``qual`` is under a top-level module the run lacks (``within``: the run's,
    None when unknown); if so, that module is added to ``outside``."""
    if within is None:
        return False
    top = qual.split(".", 1)[0]
    if top in within:
        return False
    outside.add(top)
    return True


def _calls(
    model: FileModel, module: str, is_pkg: bool, within: frozenset[str] | None, outside: set[str]
) -> list[list[Any]]:
    """Calls to (possibly) project functions and classes, with the facts of their arguments.
    ``within``: the top-level modules the run has (see ``summarize``); a callee or an
    argument's class under another one is left out, and its top-level module added to
    ``outside``."""
    out: list[list[Any]] = []
    local_defs = {
        s.name
        for s in model.tree.body
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    }
    for name, calls in model.calls.items():
        for call in calls:
            if not call.args and not call.keywords:
                continue
            func = call.func
            qual = model.qualname(func)
            if qual is None:
                # a same-file function or class, called by its module-level name
                if (
                    isinstance(func, ast.Name)
                    and name in local_defs
                    and model.resolve_call(call) is not None
                    or (
                        isinstance(func, ast.Name)
                        and name in local_defs
                        and model.class_named(name) is not None
                    )
                ):
                    qual = f"{module}.{name}" if module else name
                else:
                    continue
            elif not _project_candidate(qual):
                continue
            else:
                qual = absolute(qual, module, is_pkg)
                if _left_out(qual, within, outside):
                    continue
            args: list[list[Any]] = []
            for i, arg in enumerate(call.args):
                if isinstance(arg, ast.Starred):
                    break
                f = _arg_fact(model, arg, module, is_pkg, within, outside)
                if f is not None:
                    args.append([i, f, *_model_class(model, arg, f, module, is_pkg)])
            for kw in call.keywords:
                if kw.arg is not None:
                    f = _arg_fact(model, kw.value, module, is_pkg, within, outside)
                    if f is not None:
                        args.append([kw.arg, f, *_model_class(model, kw.value, f, module, is_pkg)])
            if args:
                _mark_shared(model, call, args)
                out.append([qual, args])
    import json

    out.sort(key=lambda c: json.dumps(c))
    return out


def _mark_shared(model: FileModel, call: ast.Call, args: list[list[Any]]) -> None:
    """A call made several times at once (in a loop or comprehension, not joined in the
    same iteration): a model or optimizer argument that is the same object every time
    gets a fifth element, True. Only a ``Thread`` subclass's constructor keeps it (see
    :meth:`ProjectIndex._add_call`): every instance started shares that object."""
    if not any(slot[1][0] in (Role.MODEL.value, Role.OPTIMIZER.value) for slot in args):
        return
    if not model.loop_contexts(call) and not any(
        isinstance(a, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp))
        for a in model.ancestors(call)
    ):
        return
    from trainlint.analysis.escapes import escapes

    esc = escapes(model)
    if not esc.repeated_at_once(call):
        return
    given: dict[int | str, ast.expr] = dict(enumerate(call.args))
    given.update((k.arg, k.value) for k in call.keywords if k.arg)
    for slot in args:
        where, fact = slot[:2]
        arg = given.get(where)
        if (
            fact[0] in (Role.MODEL.value, Role.OPTIMIZER.value)
            and arg is not None
            and (esc.same_object(arg))
        ):
            slot[1] = [*fact[:4], True]


def _model_class(
    model: FileModel, arg: ast.expr, fact: Fact, module: str, is_pkg: bool
) -> list[str]:
    """``[class]`` when ``arg`` is a model the roles know by use only (``net = Net()``,
    then ``net.parameters()`` into an optimizer) and is built from a project class: the
    index then says whether that class's ``forward`` ends in a softmax. [] otherwise."""
    if fact[0] != Role.MODEL.value or fact[1] is not None or fact[3]:
        return []
    value: ast.AST | None = single_value(model, arg) if isinstance(arg, ast.Name) else arg
    while (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr in SAME_OBJECT_METHODS
    ):
        value = value.func.value  # `Net().to(device)` is that `Net()`
    if not isinstance(value, ast.Call):
        return []
    q = model.qualname(value.func)
    if q is not None and _project_candidate(q):
        return [absolute(q, module, is_pkg)]
    if q is None and isinstance(value.func, ast.Name) and model.class_named(value.func.id):
        return [f"{module}.{value.func.id}" if module else value.func.id]
    return []


def _arg_fact(
    model: FileModel,
    arg: ast.expr,
    module: str,
    is_pkg: bool,
    within: frozenset[str] | None,
    outside: set[str],
) -> Fact | None:
    if not isinstance(arg, (ast.Name, ast.Attribute, ast.Call)):
        return None
    found = model.roles.classify(arg)
    if len(found) == 1 and found[0] is not None:
        return fact_of(model, found[0])
    # An instance of a project class (`Net()`, directly or through one name): the index
    # says what the class is.
    value: ast.AST | None = arg
    if isinstance(arg, ast.Name):
        value = single_value(model, arg)
    if isinstance(value, ast.Call):
        q = model.qualname(value.func)
        if q is not None and _project_candidate(q):
            full = absolute(q, module, is_pkg)
            return None if _left_out(full, within, outside) else ["instance", full, None, False]
        if q is None and isinstance(value.func, ast.Name) and model.class_named(value.func.id):
            return [
                "instance",
                f"{module}.{value.func.id}" if module else value.func.id,
                None,
                False,
            ]
    return None


def single_assignments(model: FileModel) -> dict[tuple[int, str], list[ast.expr]]:
    """(scope, name) -> the values assigned to the plain name there (cheap, no flow)."""

    def build(m: FileModel) -> dict[tuple[int, str], list[ast.expr]]:
        out: dict[tuple[int, str], list[ast.expr]] = {}
        for node in m.assignments:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    value = node.value if not isinstance(node, ast.AugAssign) else None
                    out.setdefault((id(m.scope_of(node)), t.id), []).append(
                        value if value is not None else t
                    )
        return out

    return model.memo(single_assignments, build)


def single_value(model: FileModel, name: ast.Name) -> ast.expr | None:
    """The one value ``name`` is assigned in its scope; None when it is assigned more
    than once or never (a parameter, a global)."""
    values = single_assignments(model).get((id(model.scope_of(name)), name.id))
    return values[0] if values is not None and len(values) == 1 else None


# -- the index --------------------------------------------------------------------------------


class ProjectIndex:
    """All summaries of a run, merged; gives each file its view."""

    def __init__(self, summaries: list[dict], growing: bool = False) -> None:
        self.modules: dict[tuple[str, str], dict] = {}
        for s in summaries:
            self.modules.setdefault((s["root"], s["module"]), s)
        # (root, module, function) -> param -> facts from every call site
        self._params: dict[tuple[str, str, str], dict[str, list[Fact]]] = {}
        # (root, module, function) -> param -> the project classes whose instances the
        # call sites pass there (canonical ``module.Class``), when they say nothing else
        self._instances: dict[tuple[str, str, str], dict[str, list[str]]] = {}
        # (root, module) -> its functions called with facts (the keys of _params there): a
        # view reads its own module's, without going through every module's
        self._called: dict[tuple[str, str], set[str]] = {}
        self._effect_memo: dict[str, tuple[list[list[Any]], bool]] = {}
        # project directory -> the summaries there that save checkpoints or define savers,
        # and the saves of objects they make (analysis.checkpoints), joined on first ask
        self._ckpt_summaries: dict[str, list[dict]] = {}
        self._saves: dict[str, list[list[Any]]] = {}
        #: the summaries with lean entries (see ``summarize``) whose left-out facts were
        #: asked for: the views given are not the whole project's until those files are
        #: summarised in full (``runner.run`` lints them again)
        self.lean_read: set[tuple[str, str]] = set()
        # growing (see add): (root, module) -> the calls that module may resolve, not
        # resolved yet: [summary, callee, args, done]
        self._pending: dict[tuple[str, str], list[list[Any]]] | None = {} if growing else None
        for s in self.modules.values():
            for callee, args in s["calls"]:
                self._call_or_wait(s, callee, args)
            self._note_checkpoints(s)

    def add(self, summary: dict) -> None:
        """Take one more file's summary, after those it imports: its calls are resolved
        against the summaries there so far, so the views this index gives are the whole
        project's only once every file is in (a run speculates with them, see
        ``runner.run``). A module already here keeps its first summary."""
        key = (summary["root"], summary["module"])
        if key in self.modules:
            return
        self.modules[key] = summary
        for callee, args in summary["calls"]:
            self._call_or_wait(summary, callee, args)
        # calls made earlier into this module (a caller whose summary the cache had)
        for entry in (self._pending or {}).pop(key, ()):
            if not entry[3]:
                entry[3] = self._add_call(*entry[:3])
        self._effect_memo.clear()
        self._note_checkpoints(summary)

    def _note_checkpoints(self, s: dict) -> None:
        # only the files that save (or define a saver) take part in the join: it stays
        # linear in the project's size, and a file without saves changes no join
        ck = s.get("ckpt")
        if ck and ("saves" in ck or "calls" in ck or "savers" in ck):
            project = checkpoints.project_dir(s["root"])
            self._ckpt_summaries.setdefault(project, []).append(s)
            self._saves.pop(project, None)

    def _call_or_wait(self, s: dict, callee: str, args: list[list[Any]]) -> None:
        if self._add_call(s, callee, args) or self._pending is None:
            return
        entry = [s, callee, args, False]
        parts = callee.split(".")
        for i in range(1, len(parts)):  # the modules whose arrival may resolve it
            self._pending.setdefault((s["root"], ".".join(parts[:i])), []).append(entry)

    def speculate(self, summary: dict) -> dict | None:
        """``add`` the summary of the file about to be linted, and give its view so far."""
        self.add(summary)
        return self.view(summary["root"], summary["module"])

    def _filled_of(self, root: str, module: str) -> list[str]:
        """The module's functions that call sites pass facts to, in name order."""
        return sorted(self._called.get((root, module), ()))

    # -- resolution -------------------------------------------------------------------
    def resolve(self, root: str, qual: str, hops: int = 0) -> tuple[dict, str] | None:
        """The summary and local name (``f``, ``C``, ``C.m``) ``qual`` names, following
        re-exports (an import in an ``__init__``) and star imports."""
        if hops > MAX_HOPS:
            return None
        parts = qual.split(".")
        for i in range(len(parts) - 1, 0, -1):
            mod = self.modules.get((root, ".".join(parts[:i])))
            if mod is not None:
                break
        else:
            return None
        rest = parts[i:]
        head = rest[0]
        if head in mod["classes"] or head in mod["functions"]:
            return mod, ".".join(rest)
        if head in mod["imports"]:
            target = mod["imports"][head][1]
            if target != qual:
                return self.resolve(root, ".".join([target, *rest[1:]]), hops + 1)
        for star in mod["stars"]:
            found = self.resolve(root, ".".join([star, *rest]), hops + 1)
            if found is not None:
                return found
        return None

    def _add_call(self, s: dict, callee: str, args: list[list[Any]]) -> bool:
        """Note the facts a call passes to a project function or class; False when
        ``callee`` names nothing the index has (yet)."""
        found = self.resolve(s["root"], callee)
        if found is None:
            return False
        mod, local = found
        if local in mod["classes"]:
            fn_name, skip = f"{local}.__init__", 1
        elif local in mod["functions"]:
            fn_name, skip = local, 0
        else:
            return True
        fn = mod["functions"].get(fn_name)
        if fn is None:
            return True
        params = fn["params"][skip:]
        names = set(params) | set(fn.get("kwonly", ()))
        thread = skip == 1 and self.is_thread_class(mod["root"], mod, local)
        slot = self._params.setdefault((mod["root"], mod["module"], fn_name), {})
        self._called.setdefault((mod["root"], mod["module"]), set()).add(fn_name)
        kwarg = fn.get("kwarg")
        for where, fact, *cls in args:
            if cls:
                fact = self._softmax_model(s["root"], fact, cls[0])
            name = params[where] if isinstance(where, int) and where < len(params) else where
            if isinstance(name, str) and name not in names and kwarg and name in kwarg[1]:
                name = f'{kwarg[0]}["{name}"]'  # `Trainer(scheduler=...)` into `**kwargs`
            elif not isinstance(name, str) or name not in names:
                continue
            settled = self._settle(s["root"], fact if thread else fact[:4])
            if settled is not None:
                slot.setdefault(name, []).append(settled)
            elif fact[0] == "instance":
                cls = self._class_qual(s["root"], fact[1])
                if cls is not None:
                    self._instances.setdefault(
                        (mod["root"], mod["module"], fn_name), {}
                    ).setdefault(name, []).append(cls)
        return True

    def _function_facts(self, mod: dict, name: str) -> dict | None:
        """``mod``'s entry for the function ``name``, to read what a lean entry leaves out
        (returns, kept parameters, effects): such a read is noted in ``lean_read``."""
        fn = mod["functions"].get(name)
        if fn is not None and fn.get("lean"):
            self.lean_read.add((mod["root"], mod["module"]))
        return fn

    def _settle(self, root: str, fact: Fact) -> Fact | None:
        """An ``instance`` fact becomes what its class is: a model (softmax or not), a
        thread; a call of a project factory, what the factory returns; anything else
        says nothing."""
        if fact[0] != "instance":
            return fact
        found = self.resolve(root, fact[1])
        if found is None:
            return None
        mod, local = found
        cls = mod["classes"].get(local)
        if cls is None:
            # a project factory's product passed straight on:
            # `Trainer(model, opt, make_scheduler(opt, epochs))`
            fn = self._function_facts(mod, local)
            ret = fn.get("returns") if fn is not None else None
            return ret if ret is not None and ret[0] != "instance" else None
        if cls.get("softmax"):
            return [Role.MODEL.value, local, None, True]
        return None

    def _softmax_model(self, root: str, fact: Fact, cls: str) -> Fact:
        """A model fact (see :func:`_model_class`) that says so when its project class's
        ``forward`` ends in a softmax; ``fact`` unchanged otherwise."""
        found = self.resolve(root, cls)
        if found is None or not found[0]["classes"].get(found[1], {}).get("softmax"):
            return fact
        return [fact[0], found[1], fact[2], True, *fact[4:]]

    def _class_qual(self, root: str, qual: str) -> str | None:
        """The one spelling (``pkg.state.Training``) of a project class, however the
        caller imported it; None for anything else."""
        found = self.resolve(root, qual)
        if found is None or found[1] not in found[0]["classes"]:
            return None
        mod, local = found
        return f"{mod['module']}.{local}" if mod["module"] else local

    def _attribute_facts(self, root: str, qual: str) -> dict[str, Fact]:
        """``self.x = x`` in ``qual``'s constructor: attribute -> what every call site
        passes for ``x`` (a role, or an instance of one project class); a parameter
        given a role at one site and an instance at another says nothing."""
        found = self.resolve(root, qual)
        if found is None:
            return {}
        mod, local = found
        attrs = mod["classes"].get(local, {}).get("attrs") or {}
        key = (mod["root"], mod["module"], f"{local}.__init__")
        roles, instances = self._params.get(key, {}), self._instances.get(key, {})
        out: dict[str, Fact] = {}
        for attr, param in attrs.items():
            facts, classes = roles.get(param, []), set(instances.get(param, ()))
            if facts and not classes:
                merged = _merge([f[:4] for f in facts])
                if merged is not None:
                    out[attr] = merged
            elif len(classes) == 1 and not facts:
                out[attr] = ["instance", classes.pop(), None, False]
        return out

    def _chains(
        self, root: str, module: str
    ) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, Fact]]]:
        """The file's parameters every call site fills with an instance of one project
        class (function -> parameter -> class), and the attribute facts of those
        classes and of the instances they hold in turn (class -> attribute -> fact),
        bounded by MAX_HOPS, a cycle cut; only classes that lead to a role."""
        given: dict[str, dict[str, str]] = {}
        for fn_name in self._filled_of(root, module):
            for name, classes in self._instances.get((root, module, fn_name), {}).items():
                if len(set(classes)) == 1 and not self._params.get((root, module, fn_name), {}).get(
                    name
                ):
                    given.setdefault(fn_name, {})[name] = classes[0]
        attrs: dict[str, dict[str, Fact]] = {}
        todo = sorted({c for p in given.values() for c in p.values()})
        depth = 0
        while todo and depth <= MAX_HOPS:
            nxt: list[str] = []
            for qual in todo:
                if qual in attrs:
                    continue
                attrs[qual] = facts = self._attribute_facts(root, qual)
                nxt.extend(f[1] for f in facts.values() if f[0] == "instance")
            todo, depth = nxt, depth + 1

        def leads(qual: str, seen: frozenset[str]) -> bool:
            return qual not in seen and any(
                f[0] != "instance" or leads(f[1], seen | {qual})
                for f in attrs.get(qual, {}).values()
            )

        useful = {q for q in attrs if leads(q, frozenset())}
        given = {
            fn: kept
            for fn, p in given.items()
            if (kept := {n: c for n, c in p.items() if c in useful})
        }
        return given, {q: attrs[q] for q in sorted(useful)}

    def is_thread_class(
        self, root: str, mod: dict, local: str, seen: frozenset[tuple[str, str]] = frozenset()
    ) -> bool:
        """``local`` in ``mod`` subclasses ``threading.Thread``, directly or through other
        project classes (``class TrainWorker(BaseWorker)``, ``BaseWorker(Thread)`` in
        another module); an inheritance cycle or an unresolved base says no."""
        cls = mod["classes"].get(local)
        if cls is None or (mod["module"], local) in seen or len(seen) > MAX_HOPS:
            return False
        if cls.get("thread"):
            return True
        seen = seen | {(mod["module"], local)}
        for base in cls["bases"]:
            found = self.resolve(root, base) if "." in base else None
            if found is None and mod["module"]:
                found = self.resolve(root, f"{mod['module']}.{base}")
            if found is not None and self.is_thread_class(root, *found, seen):
                return True
        return False

    def _class_fact(self, mod: dict, local: str) -> Fact | None:
        cls = mod["classes"].get(local)
        if cls is None:
            fn = self._function_facts(mod, local)
            return fn.get("returns") if fn is not None else None
        if cls.get("softmax"):
            return [Role.MODEL.value, local, None, True]
        if self.is_thread_class(mod["root"], mod, local):
            return ["thread", local, None, False]
        return None

    # -- views --------------------------------------------------------------------------
    def view(self, root: str, module: str) -> dict | None:
        """What the file ``module`` may read from the index; None when nothing."""
        s = self.modules.get((root, module))
        if s is None:
            return None
        refs: dict[str, Fact] = {}
        for raw, full in s["imports"].values():
            found = self.resolve(root, full)
            if found is not None:
                fact = self._class_fact(*found)
                if fact is not None:
                    refs[raw] = fact
                continue
            mod = self.modules.get((root, full))
            if mod is not None:  # `from . import sched` / `import pkg.sched as s`
                for name in (*mod["classes"], *mod["functions"]):
                    if "." not in name:
                        fact = self._class_fact(mod, name)
                        if fact is not None:
                            refs[f"{raw}.{name}"] = fact
        stars: dict[str, str] = {}
        self._star_names(root, s, stars, refs, 0, set())
        for name in [n for n in stars if n in s["imports"] or n in s["defs"]]:
            del stars[name]  # bound by the file itself: the star import changes nothing
        params: dict[str, dict[str, Fact]] = {}
        for fn_name in self._filled_of(root, module):
            for name, facts in self._params.get((root, module, fn_name), {}).items():
                merged = _merge(facts)
                if merged is not None:
                    params.setdefault(fn_name, {})[name] = merged
        calls = self._calls_of(root, s)
        instances, attrs = self._chains(root, module)
        saves = self._checkpoint_saves(root, module, s)
        if not refs and not stars and not params and not calls and not instances and not saves:
            return None
        out: dict[str, Any] = {"refs": refs, "stars": stars, "params": params}
        if calls:
            out["calls"] = calls
        if instances:  # `ctx.training.scheduler` (foreign_binding follows the chain)
            out["instances"] = instances
            out["attrs"] = attrs
        if saves:  # the saves of other files this file's loads read (TL704)
            out["checkpoints"] = saves
        return out

    def _checkpoint_saves(self, root: str, module: str, s: dict) -> list[list[Any]]:
        ck = s.get("ckpt")
        if not ck or not ck.get("loads"):
            return []
        project = checkpoints.project_dir(root)
        if project not in self._saves:  # once per project, not once per file
            self._saves[project] = checkpoints.project_saves(
                self._ckpt_summaries.get(project, []), self.resolve
            )
        return checkpoints.view_saves(self._saves[project], root, module, ck)

    # -- effects across files (analysis.effects) ------------------------------------------
    def _calls_of(self, root: str, s: dict) -> dict[str, dict]:
        """The project functions and methods the file's imports name, with their effects:
        ``raw qualname -> entry`` (``.engine.train_step``, ``.helpers.Tracker.record``)."""
        out: dict[str, dict] = {}
        uses = set(s.get("uses", ()))
        if not uses:
            return out
        for raw, full in s["imports"].values():
            found = self.resolve(root, full)
            if found is not None:
                mod, local = found
                if local in mod["functions"] and raw in uses:
                    self._add_entry(out, raw, root, mod, local)
                elif local in mod["classes"]:
                    for name in mod["functions"]:
                        method = name[len(local) + 1 :]
                        if (
                            name.startswith(local + ".")
                            and f"?.{method}" in uses
                            and (method != "__init__")
                        ):
                            self._add_entry(out, f"{raw}.{method}", root, mod, name)
                continue
            whole = self.modules.get((root, full))
            if whole is not None:  # `from . import engine` / `import engine`
                for name in whole["functions"]:
                    if f"{raw}.{name}" in uses:
                        self._add_entry(out, f"{raw}.{name}", root, whole, name)
        return out

    def _add_entry(self, out: dict[str, dict], key: str, root: str, mod: dict, name: str) -> None:
        fn = self._function_facts(mod, name)
        assert fn is not None  # (the callers found it there)
        keeps = fn.get("keeps")
        if "effects" not in fn:
            paths: list[Any] = [[]]
            precise = True
            if not keeps:
                return
        else:
            paths, precise = self._effects(root, mod, name, 0, ())
        if precise and not any(paths) and not keeps:
            return
        method = "." in name and fn["params"][:1] == ["self"]
        entry: dict[str, Any] = {
            "fn": f"{mod['module']}.{name}" if mod["module"] else name,
            "params": fn["params"][1:] if method else fn["params"],
        }
        if fn.get("kwonly"):
            entry["kwonly"] = fn["kwonly"]
        if method:
            entry["method"] = True
        if precise:
            entry["paths"] = paths
        else:
            entry["imprecise"] = True
        if keeps:
            entry["keeps"] = keeps
        out[key] = entry

    def _effects(
        self, root: str, mod: dict, name: str, depth: int, stack: tuple[str, ...]
    ) -> tuple[list[list[Any]], bool]:
        """A function's effect paths with other files' calls replaced by their callees'
        (bounded by MAX_EFFECT_DEPTH, a cycle cut); (paths, precise)."""
        from trainlint.analysis.effects import MAX_EFFECT_PATHS

        key = f"{mod['module']}.{name}"
        cached = self._effect_memo.get(f"{root}:{key}") if depth == 0 else None
        if cached is not None:
            return cached
        eff = mod["functions"][name].get("effects") or {}
        if eff.get("imprecise"):
            return [], False
        precise = True
        out: list[list[Any]] = []
        for path in eff.get("paths", ()):
            expanded: list[list[Any]] = [[]]
            for effect in path:
                if effect[0] != "CALL":
                    expanded = [p + [effect] for p in expanded]
                    continue
                alts, ok = self._call_effects(root, effect, depth, (*stack, key))
                precise = precise and ok
                expanded = [p + a for p in expanded for a in alts]
                if len(expanded) > MAX_EFFECT_PATHS:
                    return [], False
            for p in expanded:
                if p not in out:
                    out.append(p)
        if len(out) > MAX_EFFECT_PATHS:
            return [], False
        if depth == 0:
            self._effect_memo[f"{root}:{key}"] = (out, precise)
        return out, precise

    def _call_effects(
        self, root: str, call: list[Any], depth: int, stack: tuple[str, ...]
    ) -> tuple[list[list[Any]], bool]:
        """The effect paths of a placeholder ``["CALL", qualname, args, depth, flags]`` in
        the calling function's terms; [[]] when it is no project function with effects,
        too deep, or a cycle."""
        _, qual, args, d, flags = call
        found = self.resolve(root, qual)
        if found is None or depth + 1 >= MAX_EFFECT_DEPTH:
            return [[]], True
        mod, local = found
        fn = self._function_facts(mod, local)
        if fn is None or "effects" not in fn or f"{mod['module']}.{local}" in stack:
            return [[]], True
        paths, precise = self._effects(root, mod, local, depth + 1, stack)
        if not precise:
            return [[]], False
        params = fn["params"]
        given = {
            (params[w] if isinstance(w, int) and w < len(params) else w): enc for w, enc in args
        }

        def remap(target: list[Any] | None) -> list[Any] | None:
            if target is None or target[0] != "p":
                return target if target is None or target[0] == "o" else ["o", qual + ":self"]
            enc = given.get(target[1])
            if enc is None:
                return ["o", f"{qual}:{target[1]}"]
            if enc[0] == "p":
                rest = ".".join(x for x in (enc[2], target[2]) if x)
                return ["p", enc[1], rest]
            if enc[0] == "s":
                return ["s", ".".join(x for x in (enc[1], target[2]) if x)]
            return enc

        return [[[k, remap(t), dd + d, ff | flags] for k, t, dd, ff in p] for p in paths] or [
            []
        ], True

    def _star_names(
        self,
        root: str,
        s: dict,
        stars: dict[str, str],
        refs: dict[str, Fact],
        depth: int,
        seen: set[str],
    ) -> None:
        for star in s["stars"]:
            mod = self.modules.get((root, star))
            if mod is None or star in seen or depth > MAX_HOPS:
                continue
            seen.add(star)
            for local, qual in mod["exported"].items():
                if not local.startswith("_"):
                    stars.setdefault(local, qual)
            for name in mod["defs"]:
                if name.startswith("_"):
                    continue
                fact = self._class_fact(mod, name)
                if fact is not None:
                    full = f"{star}.{name}"
                    stars.setdefault(name, full)
                    refs[full] = fact
            self._star_names(root, mod, stars, refs, depth + 1, seen)


def _merge(facts: list[Fact]) -> Fact | None:
    """One fact from every call site's: the role must agree; class and unit only when
    every site agrees on them too."""
    roles = {f[0] for f in facts}
    if len(roles) != 1:
        return None
    first = facts[0]
    same = all(f == first for f in facts)
    return first if same else [first[0], None, None, all(f[3] for f in facts)]


def own_view(summary: dict) -> dict | None:
    """The part of a file's view its own summary gives: the facts its own call sites
    settle (``layer_init(nn.Linear(...))`` in the file that defines ``layer_init``).
    Other files' summaries can only add to it; None when it is empty."""
    if not summary["calls"]:
        return None
    return ProjectIndex([summary]).view(summary["root"], summary["module"])


def digest(view: dict | None) -> str:
    if not view:
        return ""
    import hashlib
    import json

    return hashlib.sha256(json.dumps(view, sort_keys=True).encode()).hexdigest()[:32]


# -- reading a view from the analysis ---------------------------------------------------------


def apply_view(model: FileModel, view: dict | None) -> None:
    """Give ``model`` its project view: star-imported names become imports, and roles
    may ask :func:`foreign_binding`."""
    model.project = view
    if not view:
        return
    b = model.imports.bindings(model.tree)
    for name, qual in view["stars"].items():
        if name not in b.imports and name not in b.others:
            b.imports[name] = qual


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
    read = _keyword_read(expr)
    if read is None:
        return None
    base, key = read
    fn = model.function_of(expr)
    view = getattr(model, "project", None)
    if fn is None or not view or fn.args.kwarg is None or fn.args.kwarg.arg != base:
        return None
    cls = model.class_of(fn)
    if (cls if cls is not None else fn) is not None and model.scope_of(
        cls if cls is not None else fn
    ) is not model.tree:
        return None
    fn_key = f"{cls.name}.{fn.name}" if cls is not None else fn.name
    fact = view["params"].get(fn_key, {}).get(f'{base}["{key}"]')
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
    a = fn.args
    if any(x.arg == name.id for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)):
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
    from trainlint.analysis.model import walk_local

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
    from trainlint.analysis.model import dotted

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
    view = getattr(model, "project", None)
    if view:
        cls = model.class_of(fn)
        key = f"{cls.name}.{fn.name}" if cls is not None else fn.name
        if (
            cls is not None
            and model.scope_of(cls) is model.tree
            or (cls is None and model.scope_of(fn) is model.tree)
        ):
            fact = view["params"].get(key, {}).get(name.id)
            if fact is not None:
                return _binding(fact, param)
    if param.annotation is not None:
        q = model.qualname(param.annotation)
        role = _ANNOTATION_ROLES.get(q or "")
        if role is not None:
            return ForeignBinding(role, q, None, param)
    return None
