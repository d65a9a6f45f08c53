"""The structure of ``analysis/``: layers that import only downwards, no cycle, no import
inside a function (but of optional dependencies), no private name across modules, no
module past 800 lines. The layer table is ``trainlint.analysis.layers.LAYERS``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from trainlint.analysis.hooks import PROVIDERS, Answers
from trainlint.analysis.layers import LAYERS, LAZY_IMPORTS, OPTIONAL_IMPORTS, layer_of

SRC = Path(__file__).resolve().parents[1] / "src" / "trainlint"
ANALYSIS = SRC / "analysis"
PACKAGE = "trainlint.analysis"
MAX_LINES = 800
#: the package's ``__init__`` is the composition root: it imports the modules that answer
#: the upward questions (analysis.hooks), and sits in no layer
ROOT = "__init__"


class Import:
    """One import of an analysis module: who imports what, where, which names."""

    def __init__(
        self, importer: str, target: str, names: list[str], line: int, in_function: bool
    ) -> None:
        self.importer = importer
        self.target = target
        self.names = names
        self.line = line
        self.in_function = in_function

    def __repr__(self) -> str:
        where = "in a function" if self.in_function else "at module level"
        return f"{self.importer}:{self.line} imports {self.target} {self.names} {where}"


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out.update(id(sub) for sub in ast.walk(node))
    return out


def _function_nodes(tree: ast.Module) -> set[int]:
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            out.update(id(sub) for sub in ast.walk(node) if sub is not node)
    return out


def _absolute(node: ast.ImportFrom, module: str, package: str) -> str:
    if not node.level:
        return node.module or ""
    base = package.split(".")
    if node.level > 1:
        base = base[: -(node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imports_of(path: Path, package: str = PACKAGE, relative: bool = True) -> list[Import]:
    """Every import in ``path`` of a module of ``package`` (``if TYPE_CHECKING:`` left out),
    and every other import made inside a function (target ``""``: not an analysis one).
    ``relative``: whether ``path`` is in ``package`` (its relative imports are then its)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_nodes(tree)
    in_function = _function_nodes(tree)
    me = path.stem
    out: list[Import] = []
    for node in ast.walk(tree):
        if id(node) in skip or not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        inside = id(node) in in_function
        found = False
        if isinstance(node, ast.ImportFrom) and (relative or not node.level):
            full = _absolute(node, me, package)
            if full == package:  # from trainlint.analysis import roles
                for alias in node.names:
                    out.append(Import(me, alias.name, [], node.lineno, inside))
                found = True
            elif full.startswith(package + "."):
                target = full[len(package) + 1 :].split(".")[0]
                out.append(Import(me, target, [a.name for a in node.names], node.lineno, inside))
                found = True
        else:
            for alias in node.names:
                if alias.name.startswith(package + "."):
                    target = alias.name[len(package) + 1 :].split(".")[0]
                    out.append(Import(me, target, [], node.lineno, inside))
                    found = True
        if inside and not found:
            names = [a.name for a in node.names]
            top = (node.module or "") if isinstance(node, ast.ImportFrom) else names[0]
            out.append(Import(me, "", [top.split(".")[0] or "."], node.lineno, inside))
    return out


def modules(directory: Path = ANALYSIS) -> list[str]:
    return sorted(p.stem for p in directory.glob("*.py") if p.stem != ROOT)


def graph(directory: Path = ANALYSIS) -> dict[str, list[Import]]:
    return {m: imports_of(directory / f"{m}.py") for m in modules(directory)}


def upward_imports(g: dict[str, list[Import]]) -> list[Import]:
    out = []
    for imports in g.values():
        for imp in imports:
            low, high = layer_of(imp.target), layer_of(imp.importer)
            if imp.target and low is not None and high is not None and low > high:
                out.append(imp)
    return out


def cycles(g: dict[str, list[Import]]) -> list[list[str]]:
    """The strongly connected components of more than one module (or a self-import)."""
    edges = {m: sorted({i.target for i in imps if i.target in g}) for m, imps in g.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in edges[v]:
                out.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    return out


def function_imports(g: dict[str, list[Import]]) -> list[Import]:
    """Imports inside a function but those of ``OPTIONAL_IMPORTS`` and ``LAZY_IMPORTS``."""
    none: frozenset[str] = frozenset()
    return [
        imp
        for imps in g.values()
        for imp in imps
        if imp.in_function
        and not (imp.target == "" and set(imp.names) <= OPTIONAL_IMPORTS.get(imp.importer, none))
        and not (imp.target and imp.target in LAZY_IMPORTS.get(imp.importer, none))
    ]


def private_imports(g: dict[str, list[Import]]) -> list[Import]:
    return [
        imp
        for imps in g.values()
        for imp in imps
        if imp.target and imp.target != imp.importer and any(_private(n) for n in imp.names)
    ]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def long_modules(directory: Path = ANALYSIS) -> list[tuple[str, int]]:
    out = []
    for m in modules(directory):
        lines = len((directory / f"{m}.py").read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            out.append((m, lines))
    return out


# -- the checks ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def g() -> dict[str, list[Import]]:
    return graph()


def test_every_module_is_in_one_layer_and_every_entry_exists():
    listed = [m for mods in LAYERS.values() for m in mods]
    assert len(listed) == len(set(listed)), "a module listed twice"
    assert sorted(set(modules()) - set(listed)) == [], "modules missing from the layer table"
    assert sorted(set(listed) - set(modules())) == [], "layer table entries with no module"


def test_no_import_goes_up_a_layer(g):
    assert upward_imports(g) == []


def test_no_import_cycle(g):
    assert cycles(g) == []


def test_no_import_inside_a_function_but_optional_dependencies(g):
    assert function_imports(g) == []


def test_no_private_name_crosses_analysis_modules(g):
    assert private_imports(g) == []


def test_no_rule_imports_a_private_analysis_name():
    found = []
    for path in sorted((SRC / "rules").rglob("*.py")):
        for imp in imports_of(path, relative=False):
            if imp.target and any(_private(n) for n in imp.names):
                found.append((str(path.relative_to(SRC)), imp.line, imp.names))
    assert found == []


def test_analysis_modules_stay_under_800_lines():
    assert long_modules() == []


def test_every_hook_is_answered_from_above_by_the_module_named():
    """Each slot of ``hooks.Answers`` names the module that sets it; that module sets it
    (``ANSWERS.slot = ...`` at module level) and sits above every module that asks it."""
    slots = set(Answers.__annotations__)
    assert slots == set(PROVIDERS)
    for slot, provider in PROVIDERS.items():
        module = provider.rsplit(".", 1)[-1]
        text = (ANALYSIS / f"{module}.py").read_text(encoding="utf-8")
        assert any(line.startswith(f"ANSWERS.{slot} = ") for line in text.splitlines()), slot
        for asker in modules():
            if asker != module and f"ANSWERS.{slot}" in (ANALYSIS / f"{asker}.py").read_text(
                encoding="utf-8"
            ):
                assert layer_of(asker) <= layer_of(module), (asker, slot, module)


def test_lazy_imports_are_listed_only_where_they_are_made(g):
    """A stale entry of ``LAZY_IMPORTS`` would let a new function-level import in."""
    made = {(i.importer, i.target) for imps in g.values() for i in imps if i.in_function}
    listed = {(m, t) for m, targets in LAZY_IMPORTS.items() for t in targets}
    assert listed <= made


def test_the_checks_see_what_they_forbid(tmp_path):
    """The graph builder itself: an upward, a cyclic, a function-level and a private
    import in a small tree are all found; a ``TYPE_CHECKING`` import is not."""
    (tmp_path / "model.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from trainlint.analysis.steps import _walk\n"
        "if TYPE_CHECKING:\n    from trainlint.analysis.roles import Roles\n"
    )
    (tmp_path / "steps.py").write_text(
        "from trainlint.analysis.model import FileModel\n"
        "def f():\n    import json\n    from trainlint.analysis import roles\n"
    )
    (tmp_path / "roles.py").write_text("from . import model\n")
    small = graph(tmp_path)
    assert [repr(i) for i in upward_imports(small)] == [
        "model:2 imports steps ['_walk'] at module level",
    ]
    assert cycles(small) == [["model", "roles", "steps"]]
    assert sorted(i.names[0] if i.names else i.target for i in function_imports(small)) == [
        "json",
        "roles",
    ]
    assert [i.names for i in private_imports(small)] == [["_walk"]]
    assert all(i.target != "roles" for i in small["model"])


#: receivers whose private attributes are another project's business (torch's own)
FOREIGN_RECEIVERS = {"torch", "self", "cls"}


def private_attribute_reaches(path: Path) -> list[str]:
    """``obj._name`` read on something other than ``self``/``cls`` where ``_name`` is not
    defined in the same module: a reach into another module's internals."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            own.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            own.add(node.target.id)
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
            continue
        if node.attr.startswith("__") or node.attr in own:
            continue
        base = node.value
        if isinstance(base, ast.Name) and base.id in FOREIGN_RECEIVERS:
            continue
        out.append(f"{path.name}:{node.lineno} .{node.attr}")
    return out


def test_no_private_attribute_of_another_module_is_read():
    found = [
        hit
        for path in sorted([*ANALYSIS.glob("*.py"), *(SRC / "rules").rglob("*.py")])
        for hit in private_attribute_reaches(path)
    ]
    assert found == []


def test_the_private_attribute_check_sees_a_reach(tmp_path):
    bad = tmp_path / "reach.py"
    bad.write_text("def f(model):\n    return model._scope_of\n")
    good = tmp_path / "own.py"
    good.write_text("class A:\n    def __init__(self):\n        self._x = 1\n\n"
                    "def f(a):\n    return a._x\n")
    assert private_attribute_reaches(bad) == ["reach.py:2 ._scope_of"]
    assert private_attribute_reaches(good) == []
