"""Jupyter notebooks: code cells joined into one module, magics masked, cell-aware locations.

Cells are numbered by their 1-based position among *all* cells, as Jupyter and
VS Code show them. IPython syntax is masked by :mod:`trainlint.notebook_magics`
(``mask_cell`` is importable from here too): a masked line keeps its indentation and
becomes ``pass``, so line and column numbers inside each cell are unchanged and an
indented magic does not empty a block.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from trainlint._record import Record
from trainlint.findings import Finding
from trainlint.notebook_magics import mask_cell
from trainlint.notebook_positions import (
    FilePositions,
    cell_source,
    code_cells,
    file_positions,
)

__all__ = ["FilePositions", "cell_source", "file_positions", "lint_notebook", "mask_cell"]

if TYPE_CHECKING:
    from trainlint.engine import FileResult, Linter


class CellMap(Record):
    """Maps module lines back to (cell number, line in cell)."""

    __slots__ = ("starts",)

    def __init__(self, starts: list[tuple[int, int]]) -> None:
        self.starts = starts  # (first module line, 1-based cell number), ascending

    def locate(self, line: int) -> tuple[int, int]:
        cell, first = self.starts[0][1], self.starts[0][0]
        for start, number in self.starts:
            if start > line:
                break
            cell, first = number, start
        return cell, line - first + 1


def join(cells: Iterable[tuple[int, str]]) -> tuple[str, CellMap]:
    """(cell number, masked text) pairs as one module, and the map back to cells."""
    parts: list[str] = []
    starts: list[tuple[int, int]] = []
    line = 1
    for number, text in cells:
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
        related = []
        for r in f.related:
            r_cell, r_line = cells.locate(r.line)
            r_end_cell, r_end = cells.locate(r.end_line)
            related.append(
                r._replace(
                    line=r_line, end_line=r_end if r_end_cell == r_cell else r_line, cell=r_cell
                )
            )
        out.append(
            f._replace(
                line=line,
                end_line=end_line,
                cell=cell,
                fix=_cell_fix(f.fix, cells, cell, line - f.line),
                related=tuple(related),
            )
        )
    return out


def _cell_fix(fix: Any, cells: CellMap, cell: int, shift: int) -> Any:
    """A finding's fix in its cell's own lines (what ``--fix`` applies there), or None
    when it reaches into another cell (``fix_notebook`` leaves such a fix out too)."""
    if fix is None:
        return None
    spans = [(e.line, e.end_line) for e in fix.edits]
    if fix.intent is not None:
        spans.append((fix.intent.line, fix.intent.end_line))
    if any(cells.locate(a)[0] != cell or cells.locate(b)[0] != cell for a, b in spans):
        return None
    return fix._replace(
        edits=tuple(
            e._replace(line=e.line + shift, end_line=e.end_line + shift) for e in fix.edits
        ),
        intent=fix.intent.shifted(shift) if fix.intent is not None else None,
    )


def lint_cells(
    linter: Linter, sources: dict[int, str], path: str, ignored: Iterable[str]
) -> tuple[FileResult, CellMap, list[Finding]]:
    """Lint code cells as one module, as the kernel runs them.

    A cell that does not parse on its own is left out, so one bad cell does not blind
    the linter to the notebook: the others are linted together (each still sees the
    names earlier good cells define). Returns the module's result, its cell map, and
    a cell-relative TL001 for each cell left out.
    """
    from trainlint.engine import SYNTAX_ERROR
    from trainlint.source import SourceError, parse

    ignored = tuple(ignored)
    masked = [(n, mask_cell(src)) for n, src in sources.items()]
    text, cells = join(masked)
    result = linter.lint_bytes(text.encode("utf-8"), path, ignored=ignored, text=text)
    if not result.syntax_error:
        return result, cells, []
    errors: dict[int, SourceError] = {}
    for number, cell_text in masked:
        try:
            parse(cell_text, path)
        except SourceError as exc:
            errors[number] = exc
    if not errors:  # every cell parses alone: the module's own TL001 stands
        return result, cells, []
    text, cells = join((n, t) for n, t in masked if n not in errors)
    result = linter.lint_bytes(text.encode("utf-8"), path, ignored=ignored, text=text)
    broken = []
    if linter.is_on(SYNTAX_ERROR, ignored) and _reports_cells(linter):
        for number, err in errors.items():
            f = linter._meta_finding(SYNTAX_ERROR, path, err.line, err.column, err.message)
            broken.append(f._replace(cell=number))
    return result, cells, broken


def _reports_cells(linter: Linter) -> bool:
    """TL001's `notebook-cells` option: report code cells that do not parse."""
    from trainlint.rules.meta.syntax_error import SyntaxError_

    options = linter.selection.options.get(SyntaxError_.code) or {}
    return bool(options.get("notebook-cells", SyntaxError_.options["notebook-cells"]))


def language(nb: dict[str, Any]) -> str | None:
    """The notebook's language as its metadata says: jupytext's `main_language` first
    (the cells' language when the kernel is only a host), then the kernel's, lowercased."""
    meta = nb.get("metadata")
    if not isinstance(meta, dict):
        return None
    for section, key in (("jupytext", "main_language"), ("kernelspec", "language"),
                         ("language_info", "name")):
        value = meta.get(section, {}).get(key) if isinstance(meta.get(section), dict) else None
        if isinstance(value, str) and value.strip():
            return value.strip().lower()
    return None


def _load(data: bytes) -> dict[str, Any]:
    nb = json.loads(data.decode("utf-8-sig"))
    if not isinstance(nb, dict):
        raise ValueError("top level is not an object")
    if not isinstance(nb.get("cells", []), list):
        raise ValueError("`cells` is not a list")
    return nb


def notebook_module(data: bytes) -> str:
    """A notebook's code cells as the one module the linter reads (magics masked);
    ``ValueError`` when the bytes are not a notebook."""
    try:
        nb = _load(data)
    except UnicodeDecodeError as exc:
        raise ValueError(str(exc)) from None
    return join((n, mask_cell(src)) for n, src in code_cells(nb).items())[0]


def lint_notebook(linter: Linter, data: bytes, path: str, ignored: Iterable[str]) -> FileResult:
    from trainlint.engine import SYNTAX_ERROR, FileResult

    if not data.strip():
        return FileResult(path)  # an empty file (a notebook just created): nothing to lint
    try:
        nb = _load(data)
    except (UnicodeDecodeError, ValueError) as exc:
        result = FileResult(path)
        if SYNTAX_ERROR in linter.enabled:
            result.findings.append(
                linter._meta_finding(SYNTAX_ERROR, path, 1, 1, f"not a valid notebook: {exc}")
            )
        return result
    if language(nb) not in (None, "python", "python3", "ipython", "ipython3"):
        return FileResult(path)  # a bash, R or Julia notebook: not Python to lint
    result, cells, broken = lint_cells(linter, code_cells(nb), path, ignored)
    result.findings = sorted(remap(result.findings, cells) + broken, key=Finding.sort_key)
    return result


def fix_notebook(
    linter: Linter, data: bytes, path: str, ignored: Iterable[str], file_path: Any, mode: Any
) -> FileResult:
    """Fix code cells in place: edits map to (cell, line) positions of the module the
    cells were linted as, and restructuring intents are carried out on the cell's own
    source; only changed cells are rewritten, outputs and metadata are kept."""
    from trainlint.fix import MAX_FIX_PASSES, apply_edits, intent_edits, unified_diff, write_atomic

    try:
        nb = _load(data)
    except (UnicodeDecodeError, ValueError):
        return lint_notebook(linter, data, path, ignored)
    sources = code_cells(nb)
    original = dict(sources)
    applied = 0
    for _ in range(MAX_FIX_PASSES):
        result, cells, _broken = lint_cells(linter, sources, path, ignored)
        per_cell: dict[int, list[Any]] = {}
        for f in result.findings:
            if f.fix is None or not (f.fix.applicability == "safe" or mode.unsafe):
                continue
            fix = f.fix
            if fix.intent is not None:
                # Carried out on the cell's own source (magics unmasked): a region
                # across cells, or one holding a magic, does not parse and stays unfixed.
                cell, line = cells.locate(fix.intent.line)
                if cells.locate(fix.intent.end_line)[0] != cell:
                    continue
                shift = line - fix.intent.line
                fix = fix._replace(
                    edits=tuple(
                        e._replace(line=e.line + shift, end_line=e.end_line + shift)
                        for e in fix.edits
                    ),
                    intent=fix.intent.shifted(shift),
                )
                if any(
                    cells.locate(e.line)[0] != cell or cells.locate(e.end_line)[0] != cell
                    for e in f.fix.edits
                ):
                    continue
                per_cell.setdefault(cell, []).extend(intent_edits(fix, sources[cell]))
                continue
            for e in fix.edits:
                cell, line = cells.locate(e.line)
                end_cell, end_line = cells.locate(e.end_line)
                if cell != end_cell:
                    continue
                per_cell.setdefault(cell, []).append(e._replace(line=line, end_line=end_line))
        if not per_cell:
            break
        changed = False
        for cell, cell_edits in per_cell.items():
            new, n = apply_edits(sources[cell], cell_edits)
            if n and new != sources[cell]:
                sources[cell] = new
                applied += n
                changed = True
        if not changed:
            break
    final, cells, broken = lint_cells(linter, sources, path, ignored)
    final.findings = sorted(remap(final.findings, cells) + broken, key=Finding.sort_key)
    final.fixed = applied
    if sources != original:
        indent = _detect_indent(data)
        out = json.dumps(nb_with(nb, sources), indent=indent, ensure_ascii=False) + "\n"
        if mode.diff:
            # the diff of the file itself, as --fix would write it: a patch that applies
            final.diff = unified_diff(path, data.decode("utf-8-sig"), out)
        if mode.write:
            write_atomic(file_path, out.encode("utf-8"))
    return final


def nb_with(nb: dict[str, Any], sources: dict[int, str]) -> dict[str, Any]:
    """A copy of the notebook with new sources for the given cells (same list/str shape)."""
    cells = []
    for number, cell in enumerate(nb.get("cells", []), 1):
        if number in sources and isinstance(cell, dict) and cell_source(cell) != sources[number]:
            cell = dict(cell)
            src = sources[number]
            cell["source"] = (
                src.splitlines(keepends=True)
                if isinstance(nb["cells"][number - 1].get("source"), list)
                else src
            )
        cells.append(cell)
    return {**nb, "cells": cells}


def _detect_indent(data: bytes) -> int:
    for line in data.decode("utf-8-sig", errors="replace").splitlines()[1:3]:
        stripped = line.lstrip(" ")
        if stripped and len(line) != len(stripped):
            return len(line) - len(stripped)
    return 1
