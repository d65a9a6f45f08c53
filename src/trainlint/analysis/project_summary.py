"""One file's part of the project summary: plain data, built from its model.

:func:`summarize` writes what other files may ask about this one (JSON- and
pickle-ready, cached by the file's bytes): its module name, imports, classes and bases,
the roles its functions and classes build and return, the calls it makes into other
modules with the roles of their arguments, the softmax its forwards return, its step
effects and checkpoint saves. :class:`~trainlint.analysis.project.ProjectIndex` joins
the summaries.
"""

from __future__ import annotations

import ast
import json
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from trainlint._record import Record
from trainlint.analysis import checkpoints
from trainlint.analysis.accumulation import kept_parameters, returns_backpropagated
from trainlint.analysis.activations import applied_parameter
from trainlint.analysis.assignments import single_value
from trainlint.analysis.checkpoints import WORDS as CHECKPOINT_WORDS
from trainlint.analysis.data_parallel import DATA_WORDS, data_facts
from trainlint.analysis.effects import effects_of, not_project
from trainlint.analysis.escape_callers import reads_after_calls
from trainlint.analysis.escape_targets import worker_facts
from trainlint.analysis.escapes import escapes
from trainlint.analysis.model import walk_local, walk_tree
from trainlint.analysis.project_modules import (
    absolute,
    project_candidate,
)
from trainlint.analysis.roles import Binding, Role
from trainlint.analysis.schedule_units import sized_in_iterations
from trainlint.analysis.schedules import schedule_of
from trainlint.analysis.settings import summary as settings_summary
from trainlint.analysis.softmax import softmax_sources
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
    *DATA_WORDS,  # how the project splits its data across ranks (analysis.data_parallel)
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
    __hash__ = Record.field_hash


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
    the words the role facts need; its calls' argument facts are still taken). ``keep``, when given, names the top-level functions
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
                    if item.name == "forward" and isinstance(item, ast.FunctionDef):
                        applies = applied_parameter(item)  # from the tree: no model needed
                        if applies is not None:
                            cls["applies"] = applies
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
        # a file built for its step effects alone still says what it passes where: a
        # script's `train(net.Network().to(dev), ...)` spells none of the fact words
        "calls": _calls(model, module, is_pkg, within, outside) if model is not None else [],
    }
    if outside:
        out["outside"] = sorted(outside)
    if model is not None and model.imports_training_library:
        after = _reads_after(model, module, is_pkg, within)
        if after:  # what this file reads after its calls into other modules return
            out["after"] = after
    uses = _uses(model, imports, module) if model is not None else []
    if uses:
        out["uses"] = uses
    ck = checkpoints.summary(model) if model is not None else None
    if ck:
        out["ckpt"] = ck
    st = settings_summary(tree, model, text)
    if st:  # config defaults declared, settings changed and read (analysis.settings)
        out["settings"] = st
    data = data_facts(model) if model is not None else None
    if data:
        out["data"] = data
    if keep is not None:
        out["lean"] = sorted(keep)
    return out


def _reads_after(
    model: FileModel, module: str, is_pkg: bool, within: frozenset[str] | None
) -> list[list[Any]]:
    """The file's calls into other project modules, with the arguments and receiver
    attributes it reads after each returns (``analysis.escape_callers``)."""

    def project(qual: str) -> bool:
        return project_candidate(qual) and not _left_out(qual, within, set())

    return reads_after_calls(model, module, is_pkg, project)


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

    own = module.split(".", 1)[0]
    imports = {
        k: v
        for k, v in imports.items()
        if project_candidate(v[1]) and not not_project(v[0], v[1], own)
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

        kept = kept_parameters(model, fn)
        if kept:  # `self.history.append(loss)`: what a caller passes there is kept
            out["keeps"] = kept
        if returns_backpropagated(model, fn):  # `return loss` after `loss.backward()`
            out["returns_graph"] = True
        if model.imports_training_library and fn.name != "__init__":  # (never followed)

            effects = effects_of(model, fn, qualname, module, is_pkg)
            if effects is not None:
                out["effects"] = effects
            if "." not in qualname and (effects is not None or fn.decorator_list):
                worker = worker_facts(escapes(model), fn)
                if worker is not None:  # a process or remote target: what it trains
                    out["worker"] = worker
    return out


def _kwargs_keys(fn: ast.AST, kwarg: str) -> list[str]:
    """The constant keys ``fn`` reads from its ``**kwarg``."""
    return sorted(
        {
            read[1]
            for node in walk_local(fn)
            if (read := keyword_read(node)) is not None and read[0] == kwarg
        }
    )


def keyword_read(node: ast.AST) -> tuple[str, str] | None:
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

    returns = model.returns_in(forward)
    return bool(returns) and all(
        r.value is not None and softmax_sources(model, r.value) for r in returns
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
            elif not project_candidate(qual):
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
                    args.append([i, f, *model_class(model, arg, f, module, is_pkg)])
            for kw in call.keywords:
                if kw.arg is not None:
                    f = _arg_fact(model, kw.value, module, is_pkg, within, outside)
                    if f is not None:
                        args.append([kw.arg, f, *model_class(model, kw.value, f, module, is_pkg)])
            if args:
                _mark_shared(model, call, args)
                out.append([qual, args])
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


def model_class(
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
    if q is not None and project_candidate(q):
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
    while (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr in SAME_OBJECT_METHODS
        and model.qualname(value.func) is None
    ):
        value = value.func.value  # `net.Network().to(dev)` is the instance itself
    if isinstance(value, ast.Call):
        q = model.qualname(value.func)
        if q is not None and project_candidate(q):
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
