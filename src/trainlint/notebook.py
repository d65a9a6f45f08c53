"""Jupyter notebooks: code cells joined into one module, magics masked, cell-aware locations.

Cells are numbered by their 1-based position among *all* cells, as Jupyter and
VS Code show them. IPython syntax is masked by :mod:`trainlint.notebook_magics`
(``mask_cell`` is importable from here too): a masked line keeps its indentation and
becomes ``pass``, so line and column numbers inside each cell are unchanged and an
indented magic does not empty a block.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_left
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from trainlint._record import Record
from trainlint.findings import Finding
from trainlint.notebook_magics import mask_cell

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


class FilePositions(Record):
    """Where each character of each code cell sits in the notebook's own JSON text.

    Tools that annotate files (GitHub annotations, SARIF regions) need a position in
    the ``.ipynb`` file itself, not one relative to a cell.
    """

    __slots__ = ("cells", "newlines")

    def __init__(self, cells: dict[int, tuple[list[int], list[int]]], newlines: list[int]) -> None:
        self.cells = cells  # cell -> (file offset per char, line starts)
        self.newlines = newlines  # offsets of the file's "\n"

    def locate(self, cell: int, line: int, column: int) -> tuple[int, int] | None:
        """1-based (line, column) in the file of a 1-based (line, column) in a cell."""
        entry = self.cells.get(cell)
        if entry is None:
            return None
        offsets, starts = entry
        if not 1 <= line <= len(starts) or column < 1:
            return None
        offset = offsets[min(starts[line - 1] + column - 1, len(offsets) - 1)]
        before = bisect_left(self.newlines, offset)
        start = self.newlines[before - 1] + 1 if before else 0
        return before + 1, offset - start + 1


_WS = re.compile(r"[ \t\n\r]*")
_SKIP = json.JSONDecoder()


def file_positions(text: str) -> FilePositions | None:
    """Map the code cells of a notebook's JSON text; None when it is not one we can map."""
    text = text.removeprefix("\ufeff")
    spans: dict[int, list[tuple[int, int]]] = {}
    try:
        _walk_notebook(text, spans)
        nb = json.loads(text)
    except (ValueError, IndexError, RecursionError):
        return None
    cells: dict[int, tuple[list[int], list[int]]] = {}
    for number, source in _cell_sources(nb).items():
        offsets: list[int] = []
        for start, end in spans.get(number - 1, []):
            _literal_offsets(text, start, end, offsets)
        if len(offsets) != len(source):
            continue  # not the shape we understand: leave this cell unmapped
        last = spans[number - 1][-1][1] - 1 if spans.get(number - 1) else 0
        offsets.append(last)  # "just past the end" maps to the closing quote
        starts = [0, *(i + 1 for i, ch in enumerate(source) if ch == "\n")]
        cells[number] = (offsets, starts)
    newlines = [m.start() for m in re.finditer("\n", text)]
    return FilePositions(cells, newlines)


def _walk_notebook(text: str, spans: dict[int, list[tuple[int, int]]]) -> None:
    """Record the literal spans of ``cells[i].source`` (a string or a list of strings),
    keyed by the cell's 0-based index; every other value is skipped by the C decoder."""

    def ws(i: int) -> int:
        return _WS.match(text, i).end()  # type: ignore[union-attr]  # `*` always matches

    def skip(i: int) -> int:
        return _SKIP.raw_decode(text, i)[1]

    def container(i: int, on_value: Any) -> int:
        """``text[i]`` opens an object or array; ``on_value(key, offset)`` returns the
        end of each member's value. Returns the offset just past the container."""
        close = "}" if text[i] == "{" else "]"
        i = ws(i + 1)
        if text[i] == close:
            return i + 1
        index = 0
        while True:
            key: Any = index
            if close == "}":
                if text[i] != '"':
                    raise ValueError("expected a key")
                key, i = _SKIP.raw_decode(text, i)
                i = ws(i)
                if text[i] != ":":
                    raise ValueError("expected ':'")
                i = ws(i + 1)
            i = ws(on_value(key, i))
            index += 1
            if text[i] == ",":
                i = ws(i + 1)
            elif text[i] == close:
                return i + 1
            else:
                raise ValueError(f"expected ',' or {close!r}")

    def source_string(cell: int, i: int) -> int:
        if text[i] != '"':
            return skip(i)
        end = skip(i)
        spans.setdefault(cell, []).append((i, end))
        return end

    def cell_member(cell: int, key: Any, i: int) -> int:
        if key != "source":
            return skip(i)
        if text[i] == "[":
            return container(i, lambda _k, j: source_string(cell, j))
        return source_string(cell, i)

    def cell(index: int, i: int) -> int:
        if text[i] != "{":
            return skip(i)
        return container(i, lambda key, j: cell_member(index, key, j))

    def top_member(key: Any, i: int) -> int:
        if key != "cells" or text[i] != "[":
            return skip(i)
        return container(i, cell)

    i = ws(0)
    if text[i] != "{":
        raise ValueError("not a JSON object")
    container(i, top_member)


def _literal_offsets(text: str, start: int, end: int, out: list[int]) -> None:
    """Append the file offset of each character a JSON string literal decodes to."""
    i, stop = start + 1, end - 1
    while i < stop:
        out.append(i)
        if text[i] != "\\":
            i += 1
        elif text[i + 1] != "u":
            i += 2
        elif (
            0xD800 <= int(text[i + 2 : i + 6], 16) < 0xDC00
            and text.startswith("\\u", i + 6)
            and 0xDC00 <= int(text[i + 8 : i + 12], 16) < 0xE000
        ):
            i += 12  # a surrogate pair decodes to one character
        else:
            i += 6


def cell_source(cell: dict[str, Any]) -> str:
    src = cell.get("source", "")
    if isinstance(src, list):
        return "".join(str(s) for s in src)
    return str(src)


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
            f._replace(line=line, end_line=end_line, cell=cell, fix=None, related=tuple(related))
        )
    return out


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
    if linter.is_on(SYNTAX_ERROR, ignored):
        for number, err in errors.items():
            f = linter._meta_finding(SYNTAX_ERROR, path, err.line, err.column, err.message)
            broken.append(f._replace(cell=number))
    return result, cells, broken


def _load(data: bytes) -> dict[str, Any]:
    nb = json.loads(data.decode("utf-8-sig"))
    if not isinstance(nb, dict):
        raise ValueError("top level is not an object")
    if not isinstance(nb.get("cells", []), list):
        raise ValueError("`cells` is not a list")
    return nb


def lint_notebook(linter: Linter, data: bytes, path: str, ignored: Iterable[str]) -> FileResult:
    from trainlint.engine import SYNTAX_ERROR, FileResult

    try:
        nb = _load(data)
    except (UnicodeDecodeError, ValueError) as exc:
        result = FileResult(path)
        if SYNTAX_ERROR in linter.enabled:
            result.findings.append(
                linter._meta_finding(SYNTAX_ERROR, path, 1, 1, f"not a valid notebook: {exc}")
            )
        return result
    result, cells, broken = lint_cells(linter, _cell_sources(nb), path, ignored)
    result.findings = sorted(remap(result.findings, cells) + broken, key=Finding.sort_key)
    return result


def _cell_sources(nb: dict[str, Any]) -> dict[int, str]:
    return {
        number: cell_source(cell)
        for number, cell in enumerate(nb.get("cells", []), 1)
        if isinstance(cell, dict) and cell.get("cell_type") == "code"
    }


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
    sources = _cell_sources(nb)
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
