"""Random generators a dataset object carries: ``self.rng = np.random.default_rng(...)`` set
in a method of a class that defines ``__getitem__``, and drawn from where items are built."""

from __future__ import annotations

import ast

from trainlint._record import Record
from trainlint.analysis.model import FileModel, dotted, walk_local

GENERATOR_FACTORIES = {
    "numpy.random.default_rng",
    "numpy.random.RandomState",
    "numpy.random.Generator",
    "random.Random",
    "torch.Generator",
}


class HeldGenerator(Record, frozen=True):
    __slots__ = ("cls", "attr", "creation", "use")

    cls: ast.ClassDef
    attr: str  # `rng` for `self.rng`
    creation: ast.Call
    use: ast.AST  # a draw from it while an item is built

    def __init__(self, cls: ast.ClassDef, attr: str, creation: ast.Call, use: ast.AST) -> None:
        self.cls = cls
        self.attr = attr
        self.creation = creation
        self.use = use


def held_generators(model: FileModel) -> list[HeldGenerator]:
    """Generators stored on ``self`` by a dataset class and drawn from in ``__getitem__``
    (or in a method it calls on ``self``), unless the class reseeds them per worker
    (mentions ``get_worker_info`` outside ``__init__``) or rebinds them outside
    ``__init__``."""
    out: list[HeldGenerator] = []
    for cls in model.classes:
        methods = model.methods(cls)
        getitem = methods.get("__getitem__") or methods.get("__getitems__")
        if getitem is None:
            continue
        # `get_worker_info()` asked in `__init__` answers in the main process, where the
        # dataset is built: there it is None and reseeds nothing
        if any(
            _asks_worker_info(body) for name, body in methods.items() if name != "__init__"
        ):
            continue
        created: dict[str, list[ast.Call]] = {}
        rebound: set[str] = set()
        for name, fn in methods.items():
            for node in walk_local(fn):
                if not isinstance(node, ast.Assign):
                    continue
                for target in node.targets:
                    attr = _self_attr(target)
                    if attr is None:
                        continue
                    value = node.value
                    if (
                        name == "__init__"
                        and isinstance(value, ast.Call)
                        and model.qualname(value.func) in GENERATOR_FACTORIES
                    ):
                        created.setdefault(attr, []).append(value)
                    else:
                        rebound.add(attr)
        for attr, calls in created.items():
            if attr in rebound or len(calls) != 1:
                continue
            use = _draw(model, cls, getitem, attr, depth=0, seen=set())
            if use is not None:
                out.append(HeldGenerator(cls, attr, calls[0], use))
    return out


def _asks_worker_info(fn: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Attribute)
        and n.attr == "get_worker_info"
        or isinstance(n, ast.Name)
        and n.id == "get_worker_info"
        for n in ast.walk(fn)
    )


def _self_attr(node: ast.AST) -> str | None:
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and (node.value.id == "self")
    ):
        return node.attr
    return None


def _draw(
    model: FileModel, cls: ast.ClassDef, fn: ast.AST, attr: str, depth: int, seen: set[int]
) -> ast.AST | None:
    """``self.<attr>.method(...)`` or ``self.<attr>`` passed as a generator argument in
    ``fn`` or the same-class methods it calls."""
    if id(fn) in seen:
        return None
    seen.add(id(fn))
    for node in walk_local(fn):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and _self_attr(func.value) == attr:
            return node
        if any(
            dotted(a) == f"self.{attr}" for a in [*node.args, *(k.value for k in node.keywords)]
        ):
            return node
        if (
            depth < 2
            and isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "self"
        ):
            callee = model.method_of(cls, func.attr)
            if callee is not None:
                found = _draw(model, cls, callee, attr, depth + 1, seen)
                if found is not None:
                    return node
    return None
