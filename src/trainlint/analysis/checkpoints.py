"""Checkpoints: what each ``torch.save`` writes, and which ``torch.load`` reads it back.

Facts layer and project layer together, for one question: does a load read a checkpoint
this project saved with objects other than tensors and plain containers (which a
``weights_only`` load refuses)?

* A *save* is ``torch.save(obj, path)``, or a call to a function of the project that
  hands its parameters on to ``torch.save`` (``save_on_master(state, path)``,
  ``save_checkpoint(state, filename)``). Its *content* is what ``obj`` provably holds:
  the values of a dict literal, ``dict(...)``, or a dict built up by ``d[k] = v`` before
  the save. Each value is read as far as the file tells: a ``state_dict()``, a tensor,
  number or string is plain; an ``argparse.Namespace`` from ``parse_args()``, a
  dataclass or namespace object, a whole module, an optimizer or scheduler object, NumPy
  arrays and scalars are not. What the file cannot tell counts as nothing.
* A *path key* says which file a path names, the same way on both sides: a literal or
  pattern (``f"{out}/best.pt"``, ``os.path.join(d, "best.pt")``, ``"ep%d.pt" % e`` give
  the pattern of their last component), a config key or attribute (``cfg.ckpt_path``,
  ``cfg["ckpt"]``), a call to a path helper of the project (``ckpt_path(run, "best")``),
  or, within one function, a local name.
* A *load* is ``torch.load(path)``; its keys are the path's, and the checkpoint keys it
  reads (``ckpt["model"]``). A load also matches a save whose dict has every key it
  reads, when it reads at least two: a resume through ``args.resume`` reads what the
  training script wrote.

:func:`summary` is the file's part of the project summary (plain data); the index joins
the saves of every file with the loads of each (:func:`foreign_saves`).
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainlint.analysis.arguments import parameter_names as parameters
from trainlint.analysis.checkpoint_contents import (
    MAX_DEPTH,
    MODULE_METHODS,
    TORCH_LOAD,
    TORCH_SAVE,
    WORDS,  # noqa: F401 (the project index imports it from here)
    Item,
    Load,
    Save,
    content,
    short_text,
    value_of,
)
from trainlint.analysis.model import call_name, dotted, has_star_kwargs, keyword, walk_local
from trainlint.analysis.project_modules import absolute, module_of

if TYPE_CHECKING:
    from trainlint.analysis.model import FileModel

#: A load of a file another program wrote: none of this rule's business.
_DOWNLOADS = re.compile(
    r"(download|hf_hub|from_url|cached_path|urlretrieve|get_file|snapshot|hub\.)", re.I
)
_WEAK_SEGMENT = re.compile(r"^[*]?\.?[A-Za-z0-9]{0,5}$")
# -- which file a path names ----------------------------------------------------------------


def _template(model: FileModel, node: ast.AST, depth: int = 0) -> str | None:
    """The path as a pattern: literal parts kept, everything else ``*``."""
    if depth > MAX_DEPTH:
        return "*"
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.JoinedStr):
        parts = [
            v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "*"
            for v in node.values
        ]
        return "".join(parts)
    if isinstance(node, ast.BinOp):
        left = _template(model, node.left, depth + 1) or "*"
        if isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant):
            return re.sub(r"%[-+ #0-9.]*[a-zA-Z]", "*", left)
        right = _template(model, node.right, depth + 1) or "*"
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Div):
            return f"{left}/{right}"
        return None
    if isinstance(node, ast.Call):
        name = call_name(node)
        if name == "join" and node.args:
            return "/".join(_template(model, a, depth + 1) or "*" for a in node.args)
        if name == "format" and isinstance(node.func, ast.Attribute):
            base = _template(model, node.func.value, depth + 1) or "*"
            return re.sub(r"\{[^}]*\}", "*", base)
        if name in ("Path", "str", "PurePath", "abspath", "expanduser") and len(node.args) == 1:
            return _template(model, node.args[0], depth + 1)
        return "*"
    if isinstance(node, ast.Name):
        value = value_of(model, node)
        return _template(model, value, depth + 1) if value is not None else "*"
    return "*"


def _segment_key(template: str | None) -> str | None:
    if template is None:
        return None
    last = re.sub(r"\*+", "*", template.replace("\\", "/").rsplit("/", 1)[-1])
    if _WEAK_SEGMENT.match(last.replace("*", "")) or len(last.replace("*", "")) < 4:
        return None  # `*.pt`, `*`: names nothing in particular
    return "file:" + last


def _opened(model: FileModel, name: ast.Name) -> ast.expr | None:
    """The path of ``with open(path) as name:`` around ``name``: the file object stands
    for that path."""
    for anc in model.ancestors(name):
        if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return None
        if isinstance(anc, (ast.With, ast.AsyncWith)):
            for item in anc.items:
                target, ctx = item.optional_vars, item.context_expr
                if (
                    isinstance(target, ast.Name)
                    and target.id == name.id
                    and isinstance(ctx, ast.Call)
                    and call_name(ctx) == "open"
                    and ctx.args
                ):
                    return ctx.args[0]
    return None


def path_keys(model: FileModel, path: ast.AST) -> frozenset[str]:
    """The keys by which ``path`` names a file (see the module docstring)."""
    if isinstance(path, ast.Name):
        opened = _opened(model, path)
        if opened is not None:
            path = opened
    keys: set[str] = set()
    seg = _segment_key(_template(model, path))
    if seg is not None:
        keys.add(seg)
    node = path
    if isinstance(node, ast.Call) and call_name(node) in ("Path", "str") and len(node.args) == 1:
        node = node.args[0]
    if isinstance(node, ast.Name):
        value = value_of(model, node)
        if value is None:
            keys.add(f"local:{id(model.scope_of(node))}:{node.id}")  # within one function
        elif isinstance(value, (ast.Attribute, ast.Subscript, ast.Call)):
            node = value
    if isinstance(node, ast.Attribute):
        text = dotted(node)
        if text is not None and "." in text:
            keys.add("attr:" + text.removeprefix("self."))
    elif (
        isinstance(node, ast.Subscript)
        and isinstance(node.slice, ast.Constant)
        and isinstance(node.slice.value, str)
    ):
        keys.add("key:" + node.slice.value)
    elif isinstance(node, ast.Call):
        qual = model.call_qualname(node)
        if qual is not None and call_name(node) not in ("join", "format", "Path", "str"):
            if qual.startswith("."):
                qual = _absolute(model, qual)
            args = ",".join(
                repr(a.value) if isinstance(a, ast.Constant) else "*" for a in node.args
            )
            keys.add(f"call:{qual}({args})")
    return frozenset(keys)


def _absolute(model: FileModel, qual: str) -> str:
    """A relative import's qualified name made absolute, as every file spells it."""
    _, module, is_pkg = module_of(model.path)
    return absolute(qual, module, is_pkg)


def _downloaded(model: FileModel, path: ast.AST) -> bool:
    """The path names a file another program wrote: a URL or a download helper's result."""
    node: ast.AST | None = path
    for _ in range(MAX_DEPTH):
        if isinstance(node, ast.Name):
            node = value_of(model, node)
        else:
            break
    if node is None:
        return False
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            if "://" in sub.value:
                return True
        elif isinstance(sub, ast.Call):
            if _DOWNLOADS.search(ast.unparse(sub.func)):
                return True
    return False


# -- saves and loads of one file ------------------------------------------------------------


def _save_args(call: ast.Call) -> tuple[ast.expr | None, ast.expr | None]:
    obj = call.args[0] if call.args else keyword(call, "obj")
    path = call.args[1] if len(call.args) > 1 else keyword(call, "f")
    return obj, path


def savers(model: FileModel) -> dict[str, tuple[int, int]]:
    """Functions of the file that hand two of their parameters on to ``torch.save``:
    name -> (index of the object, index of the path); ``*args`` forwarding is (0, 1)."""

    def build(m: FileModel) -> dict[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        for call in m.calls_to(TORCH_SAVE):
            fn = m.function_of(call)
            if fn is None or isinstance(fn, ast.Lambda):
                continue
            params = parameters(fn)
            if params[:1] in (["self"], ["cls"]):
                params = params[1:]
            starred = call.args and isinstance(call.args[0], ast.Starred)
            if starred and fn.args.vararg is not None:
                out[_def_name(m, fn)] = (0, 1)
                continue
            obj, path = _save_args(call)
            if isinstance(obj, ast.Name) and obj.id in params:
                p = path.id if isinstance(path, ast.Name) and path.id in params else None
                out[_def_name(m, fn)] = (params.index(obj.id), params.index(p) if p else -1)
        return out

    return model.memo(savers, build)


def _def_name(model: FileModel, fn: ast.AST) -> str:
    cls = model.class_of(fn)
    name = getattr(fn, "name", "")
    return f"{cls.name}.{name}" if cls is not None else name


def _save_sites(model: FileModel) -> Iterator[tuple[ast.Call, ast.expr | None, ast.expr | None]]:
    """(call, object, path) of every save: ``torch.save`` and calls to same-file savers."""
    for call in model.calls_to(TORCH_SAVE):
        yield (call, *_save_args(call))
    local = savers(model)
    for fn in model.functions:
        spec = local.get(_def_name(model, fn))
        if spec is None:
            continue
        for call in model.call_sites.get(id(fn), ()):
            yield (call, *_site_args(call, spec))


def _site_args(call: ast.Call, spec: tuple[int, int]) -> tuple[ast.expr | None, ast.expr | None]:
    if any(isinstance(a, ast.Starred) for a in call.args):
        return None, None
    obj_i, path_i = spec
    obj = call.args[obj_i] if obj_i < len(call.args) else None
    path = call.args[path_i] if 0 <= path_i < len(call.args) else None
    return obj, path


def saves(model: FileModel) -> list[Save]:
    """The file's saves (``torch.save`` and same-file savers) of known content: those with
    ``items`` hold objects ``weights_only`` refuses, the others a dict of plain data."""

    def build(m: FileModel) -> list[Save]:
        out: list[Save] = []
        for call, obj, path in _save_sites(m):
            if obj is None or path is None:
                continue
            keys, items = content(m, obj)
            if items or keys:
                out.append(Save(call, path_keys(m, path), keys, items))
        return out

    return model.memo(saves, build)


def _named_saves(model: FileModel) -> list[Save]:
    """Calls to functions of other files named like savers (``save_checkpoint(state, ...)``)
    with a dict this file builds: what a resume in this file most likely reads back. Not
    known to be saves: they only decide which checkpoint a load's keys point to."""
    out: list[Save] = []
    for name, calls in model.calls.items():
        if not _SAVER_NAME.search(name):
            continue
        for call in calls:
            if not call.args or model.call_qualname(call) in (TORCH_SAVE, None):
                continue
            keys, items = content(model, call.args[0])
            if keys:
                out.append(Save(call, frozenset(), keys, items))
    return out


def _catches_type_error(handler: ast.ExceptHandler) -> bool:
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(k, ast.Name) and k.id == "TypeError" for k in kinds)


def old_torch_fallback(model: FileModel, load: ast.Call) -> bool:
    """The load is the `except TypeError:` fallback of a `try` that passes `weights_only`
    (by name or in `**kwargs`): it runs only on a torch too old to accept the argument."""
    for anc in model.ancestors(load):
        if not isinstance(anc, ast.ExceptHandler) or not _catches_type_error(anc):
            continue
        try_node = model.parent_of(anc)
        if not isinstance(try_node, ast.Try):
            continue
        for stmt in try_node.body:
            for node in ast.walk(stmt):
                if (
                    isinstance(node, ast.Call)
                    and (keyword(node, "weights_only") is not None or has_star_kwargs(node))
                    and model.call_qualname(node) == TORCH_LOAD
                ):
                    return True
    return False


def loads(model: FileModel) -> list[Load]:
    """The file's ``torch.load`` calls without ``weights_only`` (nor ``**kwargs`` that may
    carry it) of a path no other program wrote."""
    out: list[Load] = []
    for call in model.calls_to(TORCH_LOAD):
        if keyword(call, "weights_only") is not None or has_star_kwargs(call):
            continue
        path = call.args[0] if call.args else keyword(call, "f")
        if path is None or _downloaded(model, path) or old_torch_fallback(model, call):
            continue  # (the fallback runs only on a torch without `weights_only`)
        out.append(Load(call, path_keys(model, path), _read_keys(model, call)))
    return out


def _read_keys(model: FileModel, load: ast.Call) -> frozenset[str]:
    """The checkpoint keys read from the loaded value: ``ckpt["model"]``, ``ckpt.get("epoch")``."""
    stmt = model.parent_of(load)
    if not (
        isinstance(stmt, ast.Assign)
        and len(stmt.targets) == 1
        and isinstance(stmt.targets[0], ast.Name)
    ):
        return frozenset()
    name = stmt.targets[0].id
    keys: set[str] = set()
    # (the load's own function only: loads are few, so this walk is cheap)
    for node in walk_local(model.scope_of(load)):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
            if node.value.id == name and isinstance(node.slice, ast.Constant):
                if isinstance(node.slice.value, str):
                    keys.add(node.slice.value)
        elif isinstance(node, ast.Call) and call_name(node) in ("get", "pop") and node.args:
            recv = node.func.value if isinstance(node.func, ast.Attribute) else None
            first = node.args[0]
            if (
                isinstance(recv, ast.Name)
                and recv.id == name
                and isinstance(first, ast.Constant)
                and isinstance(first.value, str)
            ):
                keys.add(first.value)
    return frozenset(keys)


#: Methods only a module (or an optimizer) has: called on a loaded entry, they show the
#: checkpoint pickles the object itself.
_OBJECT_METHODS = {"state_dict", "parameters", "named_parameters", "modules", "children", "eval"}
#: Keys under which a checkpoint keeps the command line or a config.
_CONFIG_KEYS = {"args", "opt", "opts", "config", "cfg", "hparams", "options"}
#: Attributes of the plain values a checkpoint may hold (a tensor, a dict).
_PLAIN_ATTRS = {
    "shape",
    "dtype",
    "device",
    "data",
    "T",
    "ndim",
    "get",
    "items",
    "keys",
    "values",
    "update",
    "pop",
    "copy",
    "setdefault",
}


def read_objects(model: FileModel, load: ast.Call) -> Save | None:
    """What the code after a load shows the checkpoint holds, whoever saved it: a module
    method called on it or on one of its entries (``ckpt["model"].float().state_dict()``,
    ``torch.load(p).eval()``), or an attribute read from its command-line entry
    (``ckpt["args"].arch``)."""
    starts: list[ast.AST] = [load]
    stmt = model.parent_of(load)
    if (
        isinstance(stmt, ast.Assign)
        and len(stmt.targets) == 1
        and isinstance(stmt.targets[0], ast.Name)
    ):
        name = stmt.targets[0].id
        # the uses after the load, up to the name's next binding to another value
        after = (load.lineno, load.col_offset)
        names = [
            n
            for n in walk_local(model.scope_of(load))
            if isinstance(n, ast.Name) and n.id == name and (n.lineno, n.col_offset) > after
        ]
        end = next((_pos(n) for n in names if _rebinds(model, n)), (1 << 30, 0))
        starts = [n for n in names if isinstance(n.ctx, ast.Load) and _pos(n) < end]
    for start in starts:
        found = _object_use(model, start)
        if found is not None:
            return found
    return None


def _pos(node: ast.expr) -> tuple[int, int]:
    return node.lineno, node.col_offset


def _rebinds(model: FileModel, name: ast.Name) -> bool:
    """``name`` is stored to, other than as the same module (``x = x.cuda()``)."""
    if not isinstance(name.ctx, ast.Store):
        return False
    stmt = model.parent_of(name)
    value = stmt.value if isinstance(stmt, ast.Assign) else None
    return not (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr in MODULE_METHODS
        and isinstance(value.func.value, ast.Name)
        and value.func.value.id == name.id
    )


def _object_use(model: FileModel, node: ast.AST) -> Save | None:
    entry: ast.AST = node  # the loaded value, or the entry of it that is used
    key: str | None = None
    for _ in range(MAX_DEPTH + 2):
        parent = model.parent_of(node)
        if (
            isinstance(parent, ast.Subscript)
            and parent.value is node
            and key is None
            and isinstance(parent.slice, ast.Constant)
            and isinstance(parent.slice.value, str)
        ):
            key, node = parent.slice.value, parent
            entry = parent
            continue
        if not isinstance(parent, ast.Attribute) or parent.value is not node:
            return None
        call = model.parent_of(parent)
        called = isinstance(call, ast.Call) and call.func is parent
        if called and call is not None and parent.attr in MODULE_METHODS - {"eval"}:
            node = call  # `.float()` is still the same object
            continue
        if _type_tested(model, parent):
            return None  # `if isinstance(ckpt, Module): ckpt.eval()`: one of several formats
        if called and parent.attr in _OBJECT_METHODS:
            what = "a whole `nn.Module`" if parent.attr != "state_dict" else "a pickled object"
            kind = f"{what}: line {parent.lineno} calls `.{parent.attr}()` on it"
        elif not called and key in _CONFIG_KEYS and parent.attr not in _PLAIN_ATTRS:
            kind = f"an object, not a dict: line {parent.lineno} reads `.{parent.attr}`"
        else:
            return None
        item = Item(key, short_text(entry), kind)
        return Save(None, frozenset(), frozenset(), (item,), line=parent.lineno, read=True)
    return None


def _type_tested(model: FileModel, node: ast.AST) -> bool:
    """``node`` runs under an ``if`` that tests a type or an attribute (``isinstance``,
    ``hasattr``): code that reads several checkpoint formats."""
    for anc in model.ancestors(node):
        if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return False
        if isinstance(anc, (ast.If, ast.IfExp)) and any(
            isinstance(n, ast.Call) and call_name(n) in ("isinstance", "hasattr")
            for n in ast.walk(anc.test)
        ):
            return True
    return False


def matches(
    save_paths: frozenset[str],
    save_keys: frozenset[str],
    paths: frozenset[str],
    keys: frozenset[str],
) -> bool:
    """Whether a load of ``paths`` that reads ``keys`` reads the checkpoint a save writes:
    a path key in common, or every key the load reads (two at least) is one the saved
    dict has."""
    if save_paths & paths:
        return True
    return len(keys) >= 2 and keys <= save_keys


# -- the project part -----------------------------------------------------------------------

#: Calls into other files that may be saves: a function whose name says it saves.
_SAVER_NAME = re.compile(r"save", re.I)
#: Positional arguments recorded at such a call (a saver takes the object and the path
#: among its first few).
_SAVER_ARGS = 3
#: Files that make a directory a project's root: the saves of one project pair with its
#: loads, whatever directory (and import root) each script sits in.
_PROJECT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git", "environment.yml")


def _foreign_saver_calls(model: FileModel) -> list[list[Any]]:
    """Calls to functions of other files named like savers, with what each of their first
    arguments holds and names: [callee, [[index, paths, keys, items], ...], line]."""
    out: list[list[Any]] = []
    local = savers(model)
    for name, calls in model.calls.items():
        if not _SAVER_NAME.search(name) or name in local:
            continue
        for call in calls:
            qual = model.call_qualname(call)
            if qual is None or qual.startswith("torch.") or model.resolve_call(call) is not None:
                continue
            if qual.startswith("."):
                qual = _absolute(model, qual)
            args: list[list[Any]] = []
            for i, arg in enumerate(call.args[:_SAVER_ARGS]):
                if isinstance(arg, ast.Starred):
                    break
                keys, items = content(model, arg)
                args.append([i, _exported(path_keys(model, arg)), sorted(keys), _plain(items)])
            if any(a[3] for a in args):
                out.append([qual, args, call.lineno])
    return out


def _exported(paths: frozenset[str]) -> list[str]:
    # a local name means something only inside its own function
    return sorted(k for k in paths if not k.startswith("local:"))


def _plain(items: tuple[Item, ...]) -> list[list[Any]]:
    return [[i.key, i.text, i.kind] for i in items]


def summary(model: FileModel) -> dict[str, Any]:
    """The file's part of the project summary, as plain data: ``saves`` [paths, keys,
    items, line] of its saves of objects; ``loads`` [paths, keys]; ``savers`` name ->
    [object index, path index]; ``calls`` (see ``_foreign_saver_calls``). Empty when the
    file has none of them."""
    if not any(_SAVER_NAME.search(n) or n == "load" for n in model.calls):
        return {}
    out: dict[str, Any] = {}
    found = [
        [_exported(s.paths), sorted(s.keys), _plain(s.items), s.line]
        for s in saves(model)
        if s.items
    ]
    if found:
        out["saves"] = found
    lds = [[_exported(ld.paths), sorted(ld.keys)] for ld in loads(model)]
    if lds:
        out["loads"] = lds
    local = savers(model)
    if local:
        out["savers"] = {k: list(v) for k, v in local.items()}
    calls = _foreign_saver_calls(model)
    if calls:
        out["calls"] = calls
    return out


@lru_cache(maxsize=1024)
def project_dir(root: str) -> str:
    """The directory of the project an import root belongs to: the nearest at or above it
    with a project file or ``.git``; the root itself when there is none."""
    path = Path(root)
    for d in (path, *path.parents):
        if any((d / m).exists() for m in _PROJECT_MARKERS):
            return str(d)
        try:
            if any(n.startswith("requirements") for n in os.listdir(d)):
                return str(d)
        except OSError:
            break
    return root


def project_saves(summaries: list[dict], resolve: Any) -> list[list[Any]]:
    """Every save of objects the ``summaries`` of one project (see ``project_dir``) make:
    [root, module, line, paths, keys, items, made through another file's saver].
    ``resolve(root, qual)`` finds a callee's (summary, local name), for the saves made
    through a saver."""
    out: list[list[Any]] = []
    for s in summaries:
        root, module, ck = s["root"], s["module"], s["ckpt"]
        for paths, keys, items, line in ck.get("saves", ()):
            out.append([root, module, line, paths, keys, items, False])
        for qual, args, line in ck.get("calls", ()):
            found = resolve(root, qual)
            if found is None:
                continue
            mod, local = found
            spec = mod.get("ckpt", {}).get("savers", {}).get(local)
            if spec is None:
                continue
            by_index = {a[0]: a for a in args}
            obj, path = by_index.get(spec[0]), by_index.get(spec[1])
            if obj is not None and obj[3]:
                paths = path[1] if path is not None else []
                out.append([root, module, line, paths, obj[2], obj[3], True])
    return out


def view_saves(all_saves: list[list[Any]], root: str, module: str, ck: dict) -> list[list[Any]]:
    """The saves that some load of the file (``ck["loads"]``) may read, less the file's
    own direct saves (its lint reads those itself): what the file's view carries, so its
    lint needs no other file. [module, line, paths, keys, items, in this file]."""
    lds = [(frozenset(p), frozenset(k)) for p, k in ck.get("loads", ())]
    out: list[list[Any]] = []
    for r, m, line, paths, keys, items, via in all_saves:
        own = r == root and m == module
        if own and not via:
            continue
        if any(matches(frozenset(paths), frozenset(keys), *ld) for ld in lds):
            out.append([m, line, paths, keys, items, own])
    return out


def foreign_saves(model: FileModel) -> list[Save]:
    """The saves the project view says this file's loads may read: other files' saves,
    and this file's saves through another file's saver (``where`` empty)."""
    out: list[Save] = []
    for module, line, paths, keys, items, own in (model.project or {}).get("checkpoints", ()):
        out.append(
            Save(
                None,
                frozenset(paths),
                frozenset(keys),
                tuple(Item(*i) for i in items),
                where="" if own else module,
                line=line,
            )
        )
    return out


def pickled_loads(model: FileModel) -> dict[ast.Call, Save]:
    """The file's loads without ``weights_only`` of checkpoints the project saves with
    objects ``weights_only`` refuses, each with the save it reads.

    A save of the same path (pattern, key, helper) is the checkpoint read. Failing that, a
    load is paired by the keys it reads: with this file's own saves first (a resume reads
    what its own script writes: when those are plain data, nothing is reported), then
    with the other files' saves.
    """

    def build(m: FileModel) -> dict[ast.Call, Save]:
        found = loads(m)
        if not found:
            return {}
        local = saves(m)
        foreign = foreign_saves(m)
        known = local + foreign
        own = [s for s in local if s.items] + [s for s in foreign if not s.where]
        out: dict[ast.Call, Save] = {}
        for load in found:
            # (a save after the load counts: a resume reads what the last run wrote)
            hit = next((s for s in known if s.items and s.paths & load.paths), None)
            if hit is None and len(load.keys) >= 2:
                near = [s for s in local + _named_saves(m) + own if load.keys <= s.keys]
                if near:
                    hit = next((s for s in own if load.keys <= s.keys), None)
                else:
                    hit = next((s for s in foreign if load.keys <= s.keys), None)
            if hit is None:
                hit = read_objects(m, load.node)
            if hit is not None:
                out[load.node] = hit
        return out

    return model.memo(pickled_loads, build)
