"""The torch a project pins, read from wherever projects write it down.

A project's *torch pin* is the lower bound of its torch requirement: the oldest torch it
says it runs on. Projects write it in many places, so all of them are read:
``pyproject.toml`` (``[project] dependencies`` and ``optional-dependencies``, PEP 735
``[dependency-groups]``, poetry's ``dependencies`` and groups), ``setup.py`` and
``setup.cfg`` ``install_requires``, ``requirements*.txt`` (following ``-r`` includes)
and conda's ``environment.yml``. The pin remembers which file gave it, so a message can
say which pin it used. Someone else's unreadable or malformed file gives no pin: it is
never our error.
"""

from __future__ import annotations

import configparser
import importlib
import os
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

_ENVIRONMENT_FILES = ("environment.yml", "environment.yaml")
#: ``-r`` includes followed from one requirements file (a cycle stops there too).
_MAX_INCLUDES = 8
#: Pin files larger than this are not read (a generated lock of a whole environment).
_MAX_BYTES = 1 << 20


class TorchPin(tuple):  # type: ignore[type-arg]
    """``(major, minor)`` of the oldest torch a project allows, and the file that says so.

    It compares as the plain tuple (``pin == (2, 6)``, ``pin < (2, 6)``); ``source`` is
    the file name it came from, for messages.
    """

    source: str

    def __new__(cls, major: int, minor: int, source: str) -> TorchPin:
        self = super().__new__(cls, (major, minor))
        self.source = source
        return self

    def __getnewargs__(self) -> tuple[int, int, str]:  # type: ignore[override]
        return self[0], self[1], self.source

    def __repr__(self) -> str:  # part of the cache key: another pin file re-lints
        return f"TorchPin({self[0]}, {self[1]}, {self.source!r})"


def _toml() -> Any:  # imported on first use: a check outside any project reads no TOML
    return importlib.import_module("tomllib" if sys.version_info >= (3, 11) else "tomli")


_REQUIREMENT_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(.*)$", re.S)
_CLAUSE_RE = re.compile(r"^\s*(===|==|~=|>=|<=|!=|>|<|\^|~|=)?\s*v?(\d+)(?:\.(\d+))?")


def _lower_bound(spec: str) -> tuple[int, int] | None:
    """The (major, minor) a version specifier cannot go below, or None when unbounded.

    PEP 440 clauses, and the spellings of poetry (``^2.1``, ``~2.1``, a bare ``2.1.0``)
    and conda (``=2.1``, ``2.1.*``), all of which start at the version they name.
    """
    spec = spec.split(";", 1)[0].split("#", 1)[0].strip()
    if "||" in spec:  # poetry's alternatives: the oldest of them
        return _oldest([_lower_bound(alt) for alt in spec.split("||")])
    if spec.startswith("(") and spec.endswith(")"):
        spec = spec[1:-1]
    bound: tuple[int, int] | None = None
    for clause in spec.split(","):
        m = _CLAUSE_RE.match(clause)
        if m is None or m.group(1) in ("<", "<=", "!="):
            continue
        version = (int(m.group(2)), int(m.group(3) or 0))
        bound = version if bound is None else max(bound, version)
    return bound


def _is_torch(name: str) -> bool:
    # conda spells the package `pytorch`
    return re.sub(r"[-_.]+", "-", name).lower() in ("torch", "pytorch")


def _bounds(requirements: Iterable[Any]) -> list[tuple[int, int] | None]:
    """The lower bound of each torch requirement among PEP 508 strings."""
    out: list[tuple[int, int] | None] = []
    for dep in requirements:
        if not isinstance(dep, str):
            continue
        m = _REQUIREMENT_RE.match(dep)
        if m is None or not _is_torch(m.group(1)):
            continue
        out.append(_lower_bound(m.group(2)))
    return out


def _oldest(bounds: list[tuple[int, int] | None]) -> tuple[int, int] | None:
    """The oldest bound; None when there is none, or one requirement allows any torch."""
    if not bounds or any(b is None for b in bounds):
        return None
    return min(b for b in bounds if b is not None)


def torch_requirement(dependencies: Iterable[Any]) -> tuple[int, int] | None:
    """The oldest torch that PEP 508 ``dependencies`` allow: ``["torch>=2.6,<3"]`` -> (2, 6).

    None when torch is not required or one of its requirements has no lower bound. Several
    requirements (per platform) give the oldest of their bounds.
    """
    return _oldest(_bounds(dependencies))


# -- one reader per kind of file: each gives the bounds of the torch requirements it lists ---


def _read(path: Path) -> str | None:
    try:
        if path.stat().st_size > _MAX_BYTES:
            return None
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _pyproject(path: Path) -> list[tuple[int, int] | None]:
    text = _read(path)
    if text is None or "torch" not in text:
        return []
    try:
        data = _toml().loads(text)
    except _toml().TOMLDecodeError:
        return []
    out: list[tuple[int, int] | None] = []
    project = data.get("project")
    if isinstance(project, dict):
        out += _bounds(_strings(project.get("dependencies")))
        for group in _tables(project.get("optional-dependencies")):
            out += _bounds(_strings(group))
    for group in _tables(data.get("dependency-groups")):
        out += _bounds(_strings(group))
    tool = data.get("tool")
    poetry = tool.get("poetry") if isinstance(tool, dict) else None
    if isinstance(poetry, dict):
        tables = [poetry.get("dependencies"), poetry.get("dev-dependencies")]
        tables += [g.get("dependencies") for g in _tables(poetry.get("group"))]
        for table in tables:
            if isinstance(table, dict):
                out += [_poetry_bound(v) for k, v in table.items() if _is_torch(k)]
    return out


def _strings(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _tables(value: Any) -> list[Any]:
    return list(value.values()) if isinstance(value, dict) else []


def _poetry_bound(value: Any) -> tuple[int, int] | None:
    """``torch = "^2.1"`` or ``torch = {version = ">=2.0", ...}``; a list of such tables
    (per platform) gives the oldest."""
    if isinstance(value, list):
        return _oldest([_poetry_bound(v) for v in value])
    if isinstance(value, dict):
        value = value.get("version")
    return _lower_bound(value) if isinstance(value, str) else None


_QUOTED = re.compile(r"""(['"])((?:py)?torch\b[^'"\n]*)\1""")


def _setup_py(path: Path) -> list[tuple[int, int] | None]:
    # Never run, never parsed: the torch requirement is a string literal in practice.
    text = _read(path)
    if text is None or "torch" not in text:
        return []
    return _bounds(m.group(2) for m in _QUOTED.finditer(text))


def _setup_cfg(path: Path) -> list[tuple[int, int] | None]:
    text = _read(path)
    if text is None or "torch" not in text:
        return []
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(text)
    except configparser.Error:
        return []
    lines: list[str] = []
    if parser.has_option("options", "install_requires"):
        lines += parser.get("options", "install_requires").splitlines()
    if parser.has_section("options.extras_require"):
        for _, value in parser.items("options.extras_require"):
            lines += value.splitlines()
    return _bounds(line.strip() for line in lines if line.strip())


def _requirements(path: Path, seen: set[Path] | None = None) -> list[tuple[int, int] | None]:
    seen = set() if seen is None else seen
    if path in seen or len(seen) >= _MAX_INCLUDES:
        return []
    seen.add(path)
    text = _read(path)
    if text is None:
        return []
    out: list[tuple[int, int] | None] = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        include = re.match(r"^(?:-r|--requirement)\s*=?\s*(\S+)", line)
        if include:
            out += _requirements(path.parent / include.group(1), seen)
        elif line and not line.startswith(("#", "-")):
            out += _bounds([line])
    return out


_CONDA_LINE = re.compile(r"^\s*-\s*(?:[\w-]+::)?((?:py)?torch)\b\s*([^#\n]*)", re.M)


def _environment(path: Path) -> list[tuple[int, int] | None]:
    # The dependency lines of conda and of its `pip:` list look alike; no YAML needed.
    text = _read(path)
    if text is None or "torch" not in text:
        return []
    out: list[tuple[int, int] | None] = []
    for m in _CONDA_LINE.finditer(text):
        spec = m.group(2).strip().strip("'\"")
        if spec.startswith("=") and not spec.startswith("=="):
            spec = spec.lstrip("=").split("=", 1)[0]  # conda's `pytorch=2.1.0=py3.10_cuda`
        out.append(_lower_bound(spec))
    return out


def _pin_files(directory: Path, names: set[str]) -> Iterator[tuple[Path, Any]]:
    """The pin files among ``names`` (the directory's entries), in the order their pins
    are preferred."""
    for name, reader in (
        ("pyproject.toml", _pyproject),
        ("setup.py", _setup_py),
        ("setup.cfg", _setup_cfg),
    ):
        if name in names:
            yield directory / name, reader
    for name in sorted(names):
        if name.startswith("requirements") and name.endswith(".txt"):
            yield directory / name, _requirements
    for name in _ENVIRONMENT_FILES:
        if name in names:
            yield directory / name, _environment


def directory_pin(directory: Path) -> tuple[TorchPin | None, bool]:
    """(the torch pin the files of ``directory`` give, whether it has any pin file).

    Every file that lists torch counts: the pin is the oldest bound they give, from the
    file that gives it; a file that allows any torch gives no pin at all.
    """
    try:
        names = set(os.listdir(directory))  # one listing, not a probe per candidate
    except OSError:
        return None, False
    found = False
    best: tuple[tuple[int, int], str] | None = None
    for path, reader in _pin_files(directory, names):
        if not path.is_file():
            continue
        found = True
        bounds = reader(path)
        if not bounds:
            continue
        bound = _oldest(bounds)
        if bound is None:
            return None, True
        if best is None or bound < best[0]:
            best = bound, path.name
    if best is None:
        return None, found
    return TorchPin(best[0][0], best[0][1], best[1]), found


class TorchPins:
    """The torch pin of the project each file belongs to, looked up once per directory.

    The project is the nearest directory at or above the file's that holds a pin file
    (``pyproject.toml``, ``setup.py``, ``setup.cfg``, ``requirements*.txt``,
    ``environment.yml``); the search stops at a directory holding ``trainlint.toml`` or
    ``.git`` (a project root without any). Files that do not exist on disk (sources linted
    from a string) have no pin.
    """

    def __init__(self) -> None:
        self._by_dir: dict[Path, TorchPin | None] = {}
        self._by_name: dict[str, TorchPin | None] = {}  # a file's directory, as given

    def for_file(self, path: str) -> TorchPin | None:
        try:
            if not os.path.isfile(path):
                return None
            raw = os.path.dirname(path)  # (asked for every file: strings, not Paths)
            if raw in self._by_name:
                return self._by_name[raw]
            pin = self._by_name[raw] = self._for_dir(Path(raw or ".").resolve())
        except (OSError, ValueError):
            return None
        return pin

    def _for_dir(self, directory: Path) -> TorchPin | None:
        seen: list[Path] = []
        pin: TorchPin | None = None
        for d in (directory, *directory.parents):
            if d in self._by_dir:
                pin = self._by_dir[d]
                break
            seen.append(d)
            pin, found = directory_pin(d)
            if found or (d / "trainlint.toml").is_file() or (d / ".git").exists():
                break
        for d in seen:
            self._by_dir[d] = pin
        return pin
