"""Jupyter notebooks: code cells joined into one module, magics masked, cell-aware locations.

Cells are numbered by their 1-based position among *all* cells, as Jupyter and
VS Code show them. A masked line keeps its indentation and becomes ``pass``, so
line and column numbers inside each cell are unchanged and an indented magic does
not empty a block.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from trainlint.findings import Finding

if TYPE_CHECKING:
    from trainlint.engine import FileResult, Linter

_MAGIC_LINE = re.compile(r"^(\s*)(%|!|\?)")
_HELP_SUFFIX = re.compile(r"^(\s*)[\w.]+\?{1,2}\s*$")
_ASSIGN_MAGIC = re.compile(r"^(\s*)[\w.,\s]+=\s*[%!]")
# Cell magics whose body is still Python; any other cell magic masks the whole cell.
_PYTHON_CELL_MAGICS = {"time", "timeit", "capture", "prun", "debug", "python", "python3", "pypy"}


@dataclass
class CellMap:
    """Maps module lines back to (cell number, line in cell)."""

    starts: list[tuple[int, int]]  # (first module line, 1-based cell number), ascending

    def locate(self, line: int) -> tuple[int, int]:
        cell, first = self.starts[0][1], self.starts[0][0]
        for start, number in self.starts:
            if start > line:
                break
            cell, first = number, start
        return cell, line - first + 1


def cell_source(cell: dict[str, Any]) -> str:
    src = cell.get("source", "")
    if isinstance(src, list):
        return "".join(str(s) for s in src)
    return str(src)


def mask_cell(text: str) -> str:
    lines = text.split("\n")
    first = lines[0].strip() if lines else ""
    if first.startswith("%%"):
        magic = first[2:].split(None, 1)[0] if len(first) > 2 else ""
        if magic in _PYTHON_CELL_MAGICS:
            return "\n".join(["pass", *lines[1:]])
        return "\n".join("" if i else "pass" for i, _ in enumerate(lines))
    out = []
    for line in lines:
        m = _MAGIC_LINE.match(line) or _HELP_SUFFIX.match(line) or _ASSIGN_MAGIC.match(line)
        out.append(f"{m.group(1)}pass" if m else line)
    return "\n".join(out)


def to_module(notebook: dict[str, Any]) -> tuple[str, CellMap]:
    parts: list[str] = []
    starts: list[tuple[int, int]] = []
    line = 1
    for number, cell in enumerate(notebook.get("cells", []), 1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        text = mask_cell(cell_source(cell))
        if not text.endswith("\n"):
            text += "\n"
        starts.append((line, number))
        parts.append(text)
        line += text.count("\n")
    if not starts:
        starts.append((1, 1))
    return "".join(parts), CellMap(starts)


def remap(findings: Iterable[Finding], cells: CellMap) -> list[Finding]:
    out = []
    for f in findings:
        cell, line = cells.locate(f.line)
        end_cell, end_line = cells.locate(f.end_line)
        if end_cell != cell:
            end_line = line
        out.append(replace(f, line=line, end_line=end_line, cell=cell, fix=None))
    return out


def lint_notebook(linter: Linter, data: bytes, path: str, ignored: Iterable[str]) -> FileResult:
    from trainlint.engine import SYNTAX_ERROR, FileResult

    try:
        nb = json.loads(data.decode("utf-8-sig"))
        if not isinstance(nb, dict):
            raise ValueError("top level is not an object")
    except (UnicodeDecodeError, ValueError) as exc:
        result = FileResult(path)
        if SYNTAX_ERROR in linter.enabled:
            result.findings.append(
                linter._meta_finding(SYNTAX_ERROR, path, 1, 1, f"not a valid notebook: {exc}")
            )
        return result
    text, cells = to_module(nb)
    result = linter.lint_bytes(text.encode("utf-8"), path, ignored=ignored, text=text)
    result.findings = remap(result.findings, cells)
    return result


def _cell_sources(nb: dict[str, Any]) -> dict[int, str]:
    return {
        number: cell_source(cell)
        for number, cell in enumerate(nb.get("cells", []), 1)
        if isinstance(cell, dict) and cell.get("cell_type") == "code"
    }


def fix_notebook(linter: Linter, data: bytes, path: str, ignored: Iterable[str],
                 file_path: Any, mode: Any) -> FileResult:
    """Fix code cells in place: edits map to (cell, line) since fixes never add lines;
    only changed cells are rewritten, outputs and metadata are kept."""
    from trainlint.fix import (
        MAX_FIX_PASSES,
        apply_edits,
        selected_edits,
        unified_diff,
        write_atomic,
    )

    try:
        nb = json.loads(data.decode("utf-8-sig"))
    except (UnicodeDecodeError, ValueError):
        return lint_notebook(linter, data, path, ignored)
    sources = _cell_sources(nb)
    original = dict(sources)
    applied = 0
    for _ in range(MAX_FIX_PASSES):
        text, cells = to_module(nb_with(nb, sources))
        result = linter.lint_bytes(text.encode("utf-8"), path, ignored=ignored, text=text)
        edits = selected_edits(result.findings, mode.unsafe)
        if not edits:
            break
        per_cell: dict[int, list[Any]] = {}
        for e in edits:
            cell, line = cells.locate(e.line)
            end_cell, end_line = cells.locate(e.end_line)
            if cell != end_cell:
                continue
            per_cell.setdefault(cell, []).append(replace(e, line=line, end_line=end_line))
        changed = False
        for cell, cell_edits in per_cell.items():
            new, n = apply_edits(sources[cell], cell_edits)
            if n and new != sources[cell]:
                sources[cell] = new
                applied += n
                changed = True
        if not changed:
            break
    text, cells = to_module(nb_with(nb, sources))
    final = linter.lint_bytes(text.encode("utf-8"), path, ignored=ignored, text=text)
    final.findings = remap(final.findings, cells)
    final.fixed = applied
    if sources != original:
        before = "".join(f"# cell {n}\n{src}\n" for n, src in original.items())
        after = "".join(f"# cell {n}\n{src}\n" for n, src in sources.items())
        if mode.diff:
            final.diff = unified_diff(path, before, after)
        if mode.write:
            indent = _detect_indent(data)
            out = json.dumps(nb_with(nb, sources), indent=indent, ensure_ascii=False)
            write_atomic(file_path, (out + "\n").encode("utf-8"))
    return final


def nb_with(nb: dict[str, Any], sources: dict[int, str]) -> dict[str, Any]:
    """A copy of the notebook with new sources for the given cells (same list/str shape)."""
    cells = []
    for number, cell in enumerate(nb.get("cells", []), 1):
        if number in sources and isinstance(cell, dict) and cell_source(cell) != sources[number]:
            cell = dict(cell)
            src = sources[number]
            cell["source"] = src.splitlines(keepends=True) if isinstance(
                nb["cells"][number - 1].get("source"), list
            ) else src
        cells.append(cell)
    return {**nb, "cells": cells}


def _detect_indent(data: bytes) -> int:
    for line in data.decode("utf-8-sig", errors="replace").splitlines()[1:3]:
        stripped = line.lstrip(" ")
        if stripped and len(line) != len(stripped):
            return len(line) - len(stripped)
    return 1
