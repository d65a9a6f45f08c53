"""IPython syntax in a notebook cell, masked into Python of the same line count.

A masked line keeps its indentation and becomes ``pass`` (or ``name = ...`` for a
magic whose result is assigned), so line and column numbers inside each cell are
unchanged and an indented magic does not empty a block.
"""

from __future__ import annotations

import re

# IPython's escapes (inputtransformer2.ESCAPE_SINGLES; `!!`, `??` and `%%` begin with one):
# a logical line that starts with one of these is IPython syntax, not Python.
_ESCAPES = ("!", "%", "?", ",", ";", "/")
# `name = %magic ...` / `name = !cmd ...`: IPython's MagicAssign and SystemAssign. The
# target keeps its name (bound to a placeholder); `+=`, `==`, `<=`... are not assignments.
_ASSIGN_MAGIC = re.compile(r"^([^=#'\"]*?[^=<>!+\-*/%&|^@:~\s])\s*=\s*(?:%[A-Za-z_]|!)")
# Cell magics whose body is still Python; any other cell magic masks the whole cell.
_PYTHON_CELL_MAGICS = {"time", "timeit", "capture", "prun", "debug", "python", "python3", "pypy"}
_BRACKETS = {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}


def mask_cell(text: str) -> str:
    """Replace IPython syntax with Python of the same line count, as IPython reads it.

    A cell magic (``%%name`` on the first non-blank line) owns its cell: its body is
    kept (and masked in turn) only when IPython runs it as Python in the kernel.
    Line magics, shell escapes and help requests are recognised only where a logical
    line starts, never inside brackets, strings or after a backslash, and take their
    backslash-continued lines with them.
    """
    lines = text.split("\n")
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is not None and lines[first].lstrip().startswith("%%"):
        header = lines[first].strip()
        magic = header[2:].split(None, 1)[0] if len(header) > 2 else ""
        head = [*lines[:first], "pass"]
        body = lines[first + 1 :]
        if magic in _PYTHON_CELL_MAGICS:
            return "\n".join([*head, *_mask_lines(body)])
        return "\n".join([*head, *("" for _ in body)])
    return "\n".join(_mask_lines(lines))


def _mask_lines(lines: list[str]) -> list[str]:
    out: list[str] = []
    lexer = _LogicalLines()
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.lstrip()
        indent = line[: len(line) - len(stripped)]
        assign = _ASSIGN_MAGIC.match(stripped)
        if stripped.startswith(_ESCAPES) or assign:
            end = i
            while end + 1 < len(lines) and lines[end].rstrip("\r").endswith("\\"):
                end += 1
            out.append(f"{indent}{assign.group(1)} = ..." if assign else f"{indent}pass")
            out.extend("" for _ in range(i + 1, end + 1))
            i = end + 1
            continue
        # An ordinary logical line: feed physical lines until brackets, strings and
        # backslashes close, then check for IPython's trailing help (`obj?`).
        end = i
        lexer.feed(line)
        while lexer.continues and end + 1 < len(lines):
            end += 1
            lexer.feed(lines[end])
        help_request = lexer.last_code == "?"
        lexer.reset()
        if help_request:
            out.append(f"{indent}pass")
            out.extend("" for _ in range(i + 1, end + 1))
        else:
            out.extend(lines[i : end + 1])
        i = end + 1
    return out


class _LogicalLines:
    """Just enough of Python's tokenizer to know where a logical line ends: open
    brackets, strings (triple-quoted ones span lines), comments, backslashes."""

    def __init__(self) -> None:
        self.depth = 0
        self.quote = ""  # the delimiter of the string being read, "" outside strings
        self.backslash = False
        self.last_code = ""  # last character outside comments of this logical line

    @property
    def continues(self) -> bool:
        return bool(self.depth or self.quote or self.backslash)

    def reset(self) -> None:
        self.depth, self.quote, self.backslash, self.last_code = 0, "", False, ""

    def feed(self, line: str) -> None:
        line = line.rstrip("\r")
        self.backslash = False
        i, n = 0, len(line)
        while i < n:
            c = line[i]
            if self.quote:
                if c == "\\":
                    i += 2
                    continue
                if line.startswith(self.quote, i):
                    i += len(self.quote)
                    self.quote = ""
                    self.last_code = c
                    continue
                i += 1
                continue
            if c == "#":
                break
            if c in "'\"":
                self.quote = c * 3 if line.startswith(c * 3, i) else c
                i += len(self.quote)
                self.last_code = c
                continue
            if c == "\\" and i == n - 1:
                self.backslash = True
                break
            self.depth = max(0, self.depth + _BRACKETS.get(c, 0))
            if not c.isspace():
                self.last_code = c
            i += 1
        if len(self.quote) == 1 and not self.backslash and not line.endswith("\\"):
            self.quote = ""  # an unterminated one-line string: a syntax error; resync here
