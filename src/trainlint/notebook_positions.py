"""Where each character of a notebook's code cells sits in the ``.ipynb`` file's own JSON
text: formats whose consumers annotate files (SARIF, GitHub) report there."""

from __future__ import annotations

import json
import re
from bisect import bisect_left
from typing import Any

from trainlint._record import Record


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
    for number, source in code_cells(nb).items():
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


def code_cells(nb: dict[str, Any]) -> dict[int, str]:
    return {
        number: cell_source(cell)
        for number, cell in enumerate(nb.get("cells", []), 1)
        if isinstance(cell, dict) and cell.get("cell_type") == "code"
    }
