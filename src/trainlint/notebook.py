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
