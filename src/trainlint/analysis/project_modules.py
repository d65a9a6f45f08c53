"""Module names and import lines of a project, read from paths and bytes alone.

:func:`module_of` names a file's module (walking up its packages), :func:`absolute`
resolves a relative import, :func:`imported_names` reads a file's import lines without
parsing it, and :func:`import_graph` / :func:`import_order` order a project's files so
that each comes after the modules it imports.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass

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


def project_candidate(qual: str) -> bool:
    """Whether a qualified name may name something of the project: not the standard
    library's or torch's usual modules."""
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
