r"""What a checkpoint holds: the save and load records, and the content of a saved object.

:func:`content` reads what the object handed to ``torch.save`` provably holds (dict
literals, ``dict(...)``, entries set before the save, values followed to the callers of
the saving function) as :class:`Item`\ s; :mod:`checkpoints` joins saves and loads.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from trainlint._record import Record
from trainlint.analysis.arguments import arguments_at_callers
from trainlint.analysis.arguments import parameter_names as parameters
from trainlint.analysis.assignments import single_assignments
from trainlint.analysis.model import call_name, dotted
from trainlint.analysis.roles import Role

if TYPE_CHECKING:
    from trainlint.analysis.model import FileModel

TORCH_SAVE = "torch.save"
TORCH_LOAD = "torch.load"
#: The words a file must spell for its saves and loads to matter.
WORDS = (b"torch.save", b"torch.load", b"import save", b"import load")
#: How far a value is followed through names, parameters and nested containers.
MAX_DEPTH = 4
_NAMESPACES = {
    "argparse.Namespace": "argparse.Namespace",
    "types.SimpleNamespace": "types.SimpleNamespace",
    "easydict.EasyDict": "easydict.EasyDict",
    "omegaconf.OmegaConf.create": "omegaconf.DictConfig",
    "omegaconf.OmegaConf.load": "omegaconf.DictConfig",
    "omegaconf.OmegaConf.structured": "omegaconf.DictConfig",
    "ml_collections.ConfigDict": "ml_collections.ConfigDict",
}
_ROLE_KINDS = {
    Role.MODEL: "a whole `nn.Module`",
    Role.OPTIMIZER: "an optimizer object",
    Role.SCHEDULER: "an LR scheduler object",
}
#: Calls whose value is plain data (a state dict, a plain dict or number).
_PLAIN_CALLS = {"state_dict", "item", "tolist", "vars", "asdict", "to_container", "float", "int"}
#: Methods of a module that return the module itself.
MODULE_METHODS = {"half", "float", "double", "bfloat16", "cpu", "cuda", "to", "eval", "train"}
#: Calls that return their argument, or a copy of it, or the module a wrapper holds.
_SAME_OBJECT = {"deepcopy", "copy", "de_parallel", "unwrap_model"}


class Item(Record, frozen=True):
    """One object in a checkpoint that ``weights_only`` refuses: its key in the saved dict
    (None for the saved object itself), how it is spelled, and what it is."""

    __slots__ = ("key", "text", "kind")

    def __init__(self, key: str | None, text: str, kind: str) -> None:
        self.key = key
        self.text = text
        self.kind = kind


class Save(Record, frozen=True):
    """A checkpoint written with objects ``weights_only`` refuses: at ``node`` in this
    file, or (``node`` None) at ``line`` of the module ``where``; or (``read``) what the
    code after a load shows the checkpoint holds."""

    __slots__ = ("node", "paths", "keys", "items", "where", "line", "read")

    def __init__(
        self,
        node: ast.Call | None,
        paths: frozenset[str],
        keys: frozenset[str],
        items: tuple[Item, ...],
        where: str = "",
        line: int = 0,
        read: bool = False,
    ) -> None:
        self.node = node
        self.paths = paths
        self.keys = keys
        self.items = items
        self.where = where
        self.line = node.lineno if node is not None else line
        #: not a save at all: the load's own code shows the object (``ckpt["model"].eval()``)
        self.read = read


class Load(Record, frozen=True):
    """A ``torch.load`` without ``weights_only``: the keys of its path and what it reads."""

    __slots__ = ("node", "paths", "keys")

    def __init__(self, node: ast.Call, paths: frozenset[str], keys: frozenset[str]) -> None:
        self.node = node
        self.paths = paths
        self.keys = keys


# -- what a value holds ---------------------------------------------------------------------


def short_text(node: ast.AST) -> str:
    text = ast.unparse(node)
    return text if len(text) <= 40 else text[:37] + "..."


def value_of(model: FileModel, name: ast.Name) -> ast.expr | None:
    """The one value ``name`` has where it is read: assigned once in its scope, or, when
    its function never assigns it, once at module level (a global)."""
    table = single_assignments(model)
    scope = model.scope_of(name)
    values = table.get((id(scope), name.id))
    if values is None and scope is not model.tree and not _is_parameter(scope, name.id):
        values = table.get((id(model.tree), name.id))
    return values[0] if values is not None and len(values) == 1 else None


def _is_parameter(fn: ast.AST, name: str) -> bool:
    return name in parameters(fn)


def _from_callers(model: FileModel, name: ast.Name, depth: int) -> Item | None:
    """A parameter every same-file call site fills with the same kind of object."""
    fn = model.scope_of(name)
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    passed = arguments_at_callers(model, fn, name.id)
    found: Item | None = None
    for arg in passed or ():
        item = _item(model, arg, depth + 1)
        if item is None or (found is not None and item.kind != found.kind):
            return None
        found = item
    return found


def _item(model: FileModel, value: ast.AST, depth: int = 0) -> Item | None:
    """What ``value`` is, when it is an object ``weights_only`` refuses; None when it is
    plain data or the file cannot tell."""
    if depth > MAX_DEPTH:
        return None
    if isinstance(value, ast.Call):
        return _call_item(model, value, depth)
    if isinstance(value, ast.Subscript) and isinstance(value.value, ast.Call):
        if call_name(value.value) == "parse_known_args":  # `parser.parse_known_args()[0]`
            return Item(None, short_text(value), "an `argparse.Namespace`")
        return None
    if isinstance(value, (ast.Name, ast.Attribute)):
        if isinstance(value, ast.Attribute) and value.attr == "module":
            inner = _item(model, value.value, depth + 1)  # `model.module` of a wrapper
            return inner if inner is not None and inner.kind == _ROLE_KINDS[Role.MODEL] else None
        role = model.roles.role(value)
        if role in _ROLE_KINDS:
            return Item(None, short_text(value), _ROLE_KINDS[role])
        appended = _appended_item(model, value, depth)
        if appended is not None:
            return appended
        if isinstance(value, ast.Name):
            assigned = value_of(model, value)
            if assigned is not None and assigned is not value:
                inner = _item(model, assigned, depth + 1)
                return Item(None, value.id, inner.kind) if inner is not None else None
            return _from_callers(model, value, depth)
    return None


def _appended_item(model: FileModel, value: ast.Name | ast.Attribute, depth: int) -> Item | None:
    """A list the code appends refused objects to (``self.losses.append(np.mean(...))``):
    appended in the same function for a name, in the same class for a ``self`` attribute."""
    text = dotted(value)
    if text is None or (isinstance(value, ast.Attribute) and not text.startswith("self.")):
        return None
    here = model.enclosing_class(value) if "." in text else model.scope_of(value)
    for call in model.calls.get("append", ()):
        recv = call.func.value if isinstance(call.func, ast.Attribute) else None
        if recv is None or dotted(recv) != text or len(call.args) != 1:
            continue
        where = model.enclosing_class(call) if "." in text else model.scope_of(call)
        if where is None or where is not here:
            continue
        inner = _item(model, call.args[0], depth + 1)
        if inner is not None:
            return Item(None, text, f"a list holding {inner.kind}")
    return None


def _call_item(model: FileModel, call: ast.Call, depth: int) -> Item | None:
    name = call_name(call)
    inner: Item | None = None
    if name in MODULE_METHODS and isinstance(call.func, ast.Attribute):
        inner = _item(model, call.func.value, depth + 1)  # `model.half()` is the module
    elif name in _SAME_OBJECT and call.args:
        inner = _item(model, call.args[0], depth + 1)  # `deepcopy(de_parallel(model))`
    if inner is not None and (name in _SAME_OBJECT or inner.kind == _ROLE_KINDS[Role.MODEL]):
        return Item(None, short_text(call), inner.kind)
    if name in ("parse_args",):
        return Item(None, short_text(call), "an `argparse.Namespace`")
    if name == "numpy" and not call.args:
        return Item(None, short_text(call), "a NumPy array")
    qual = model.call_qualname(call)
    if qual is not None:
        if qual in _NAMESPACES:
            return Item(None, short_text(call), f"a `{_NAMESPACES[qual]}`")
        if qual.startswith("numpy."):
            return Item(None, short_text(call), "a NumPy value")
    if isinstance(call.func, ast.Name):
        cls = model.class_named(call.func.id)
        if cls is not None and any(
            (dotted(d.func if isinstance(d, ast.Call) else d) or "").endswith("dataclass")
            for d in cls.decorator_list
        ):
            return Item(None, short_text(call), f"a `{cls.name}` dataclass")
    if name in _PLAIN_CALLS:
        return None
    fn = model.resolve_call(call)
    if fn is not None:  # a same-file factory: `args = get_args()`
        returned = [  # (a `return None` on an early exit says nothing of the value)
            _item(model, r.value, depth + 1)
            for r in model.returns_in(fn)
            if r.value is not None
            and not (isinstance(r.value, ast.Constant) and r.value.value is None)
        ]
        kinds = {i.kind if i is not None else None for i in returned}
        if len(kinds) == 1 and None not in kinds:
            return Item(None, short_text(call), kinds.pop())  # type: ignore[arg-type]
    role = model.roles.role(call)
    if role in _ROLE_KINDS and role is Role.MODEL:
        return Item(None, short_text(call), _ROLE_KINDS[role])
    return None


def _dict_entries(model: FileModel, obj: ast.AST, depth: int = 0) -> list[tuple[str, ast.expr]]:
    """(key, value) of a dict the file builds: a literal, ``dict(...)``, and for a name,
    its one value plus the ``name[key] = value`` stores in the same scope."""
    if depth > MAX_DEPTH:
        return []
    out: list[tuple[str, ast.expr]] = []
    if isinstance(obj, ast.Dict):
        for k, v in zip(obj.keys, obj.values, strict=True):
            if isinstance(k, ast.Constant) and isinstance(k.value, str):
                out.append((k.value, v))
            elif k is None:  # `{**base, ...}`
                out += _dict_entries(model, v, depth + 1)
    elif isinstance(obj, ast.Call) and call_name(obj) == "dict" and isinstance(obj.func, ast.Name):
        out += [(kw.arg, kw.value) for kw in obj.keywords if kw.arg]
    elif isinstance(obj, ast.Name):
        value = value_of(model, obj) or _last_dict(model, obj)
        if value is not None:
            out += _dict_entries(model, value, depth + 1)
        out += _stored_entries(model, obj)
    return out


def _last_dict(model: FileModel, name: ast.Name) -> ast.expr | None:
    """The dict literal last assigned to ``name`` before it is saved, in the same scope and
    block: ``ckpt = {...}; torch.save(ckpt, last)`` where ``ckpt`` was a load before."""
    values = single_assignments(model).get((id(model.scope_of(name)), name.id), [])
    before = [v for v in values if v.lineno < name.lineno]
    last = max(before, key=lambda v: v.lineno, default=None)
    if not isinstance(last, ast.Dict):
        return None
    stmt, save = model.statement_of(last), model.statement_of(name)
    return last if model.parent_of(stmt) is _block_owner(model, save, stmt) else None


def _block_owner(model: FileModel, save: ast.stmt, stmt: ast.stmt) -> ast.AST | None:
    """The node whose body holds ``stmt``, if ``save`` is in that body too (any depth)."""
    owner = model.parent_of(stmt)
    return owner if owner is not None and owner in {save, *model.ancestors(save)} else None


def _stored_entries(model: FileModel, name: ast.Name) -> list[tuple[str, ast.expr]]:
    scope = model.scope_of(name)
    out: list[tuple[str, ast.expr]] = []
    for node in model.assignments:
        if not isinstance(node, ast.Assign) or model.scope_of(node) is not scope:
            continue
        for t in node.targets:
            if (
                isinstance(t, ast.Subscript)
                and isinstance(t.value, ast.Name)
                and t.value.id == name.id
                and isinstance(t.slice, ast.Constant)
                and isinstance(t.slice.value, str)
            ):
                out.append((t.slice.value, node.value))
    return out


def content(model: FileModel, obj: ast.AST) -> tuple[frozenset[str], tuple[Item, ...]]:
    """(the keys of the saved dict, the objects in it ``weights_only`` refuses)."""
    whole = _item(model, obj)
    if whole is not None:
        return frozenset(), (whole,)
    entries = _dict_entries(model, obj)
    items: list[Item] = []
    for key, value in entries:
        found = _item(model, value)
        if found is None and isinstance(value, ast.Dict):
            inner = content(model, value)[1]  # a nested dict of objects
            found = inner[0] if inner else None
        if found is not None:
            items.append(Item(key, found.text, found.kind))
    return frozenset(k for k, _ in entries), tuple(items)
