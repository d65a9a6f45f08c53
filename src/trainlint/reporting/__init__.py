"""Output formats. Each formatter turns a run's findings into text for stdout."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from trainlint.findings import Finding

if TYPE_CHECKING:
    from trainlint.notebook import FilePositions
    from trainlint.rules.base import Rule

Formatter = Callable[[Sequence[Finding], "Sequence[type[Rule]]"], str]


#: format -> (module of this package, its formatter)
_FORMATS = {
    "concise": ("text", "concise"),
    "full": ("text", "full"),
    "json": ("jsonfmt", "format_json"),
    "sarif": ("sarif", "format_sarif"),
    "github": ("github", "format_github"),
    "json-lines": ("ci", "format_json_lines"),
    "gitlab": ("ci", "format_gitlab"),
    "junit": ("ci", "format_junit"),
}


def builtin_formats() -> dict[str, Formatter]:
    """Name -> formatter; a format's module (json, for two of them) is imported when a run
    prints in it."""
    return {name: _formatter(*where) for name, where in _FORMATS.items()}


def _formatter(module: str, name: str) -> Formatter:
    def run(findings: Sequence[Finding], rules: Sequence[type[Rule]]) -> str:
        real: Formatter = getattr(importlib.import_module(f"{__name__}.{module}"), name)
        return real(findings, rules)

    return run


def location(f: Finding) -> str:
    if f.cell is not None:
        return f"{f.path}:cell {f.cell}:{f.line}:{f.column}"
    return f"{f.path}:{f.line}:{f.column}"


class NotebookFiles:
    """Positions of notebook findings in the ``.ipynb`` file itself, for formats whose
    consumers annotate files (a cell-relative line would point at the wrong JSON line).
    Each notebook is read once per report."""

    def __init__(self) -> None:
        self._maps: dict[str, FilePositions | None] = {}

    def _map(self, path: str) -> FilePositions | None:
        if path not in self._maps:
            from trainlint.notebook import file_positions

            try:
                text = Path(path).read_bytes().decode("utf-8")
            except (OSError, UnicodeDecodeError):
                self._maps[path] = None
            else:
                self._maps[path] = file_positions(text)
        return self._maps[path]

    def region(self, f: Finding) -> tuple[int, int, int, int] | None:
        """(line, column, end_line, end_column) of a notebook finding in its file."""
        if f.cell is None:
            return None
        positions = self._map(f.path)
        if positions is None:
            return None
        start = positions.locate(f.cell, f.line, f.column)
        end = positions.locate(f.cell, f.end_line, f.end_column)
        if start is None or end is None:
            return None
        return (*start, *end)
