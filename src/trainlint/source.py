"""Reading source files: decoding, parsing with CPython's parser, position conversion.

The analysis runs on :mod:`ast` rather than a concrete syntax tree: CPython's parser
is ~10x faster than ``libcst.parse_module`` on real training code, gives exact
start/end positions for free, and makes "does not parse" mean exactly what
``ast.parse`` says. Fixes are applied as exact text edits, so formatting, comments,
line endings and encodings are preserved byte for byte.
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from functools import cached_property

from trainlint._record import Record


class SourceError(Exception):
    """The file cannot be decoded or parsed; carries a 1-based position."""

    def __init__(self, message: str, line: int = 1, column: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.line = max(1, line)
        self.column = max(1, column)


def decode(data: bytes) -> tuple[str, str]:
    """Decode bytes as Python source (PEP 263 cookie, BOM). Returns (text, encoding)."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:
        if not str(exc.msg).startswith("unknown encoding"):
            raise SourceError(f"cannot determine encoding: {exc.msg}", exc.lineno or 1) from None
        # A cookie naming a codec this interpreter lacks is almost always one that a
        # package registers at import time to transform source (`future_fstrings`,
        # `pyxl`): the file itself is UTF-8. Read it so, as ruff does; bytes that are not
        # UTF-8 still fail below with the cookie's name in the message.
        encoding = "utf-8-sig" if data.startswith(b"\xef\xbb\xbf") else "utf-8"
        try:
            data.decode(encoding)
        except UnicodeDecodeError:
            raise SourceError(f"cannot determine encoding: {exc.msg}", 1) from None
    try:
        text = data.decode(encoding)
    except (UnicodeDecodeError, LookupError) as exc:
        line = 1
        if isinstance(exc, UnicodeDecodeError):
            line = data.count(b"\n", 0, exc.start) + 1
        raise SourceError(f"cannot decode as {encoding}: {exc}", line) from None
    if text.startswith("\ufeff"):
        text = text[1:]
    return text, encoding


#: Statements that only parse on a newer Python than this one: ``type X = ...`` and
#: generic ``def f[T]`` / ``class C[T]`` (3.12).
_NEWER_SYNTAX = re.compile(
    r"^\s*(?:type\s+\w+\s*(?:\[[^\]]*\])?\s*=|(?:async\s+)?def\s+\w+\s*\[|class\s+\w+\s*\[)"
)


def parse(text: str, filename: str = "<unknown>") -> ast.Module:
    """Parse text; any rejection becomes a :class:`SourceError` with a position.

    ``filename`` is not handed to the parser: given a path that exists, CPython reads the
    offending line back from that file to turn the error's byte offset into a column,
    which is wrong whenever the text is not the file's (a notebook's cells, an editor's
    unsaved buffer on stdin)."""
    try:
        return ast.parse(text, filename="<trainlint>", type_comments=False)
    except SyntaxError as exc:
        line = exc.lineno or 1
        col = exc.offset or 1
        msg = exc.msg
        if exc.text and exc.offset:
            # SyntaxError offsets are 1-based character offsets already on 3.10+.
            col = exc.offset
        lines = text.splitlines()
        if sys.version_info < (3, 12) and 0 < line <= len(lines):
            if _NEWER_SYNTAX.match(lines[line - 1]):
                msg += (
                    " (this is Python 3.12 syntax; trainlint runs on Python "
                    f"{sys.version_info[0]}.{sys.version_info[1]}: run it with 3.12 or later)"
                )
        raise SourceError(f"syntax error: {msg}", line, col) from None
    except ValueError as exc:  # null bytes on older interpreters
        nul = text.find("\0")
        line = text.count("\n", 0, nul) + 1 if nul >= 0 else 1
        col = nul - text.rfind("\n", 0, nul) if nul >= 0 else 1
        raise SourceError(f"syntax error: {exc}", line, col) from None
    except (RecursionError, MemoryError) as exc:
        raise SourceError(f"syntax error: too deeply nested ({type(exc).__name__})") from None


class Source(Record):
    """A decoded source text with helpers to turn ast positions into 1-based columns."""

    __slots__ = ("text", "_ascii", "__dict__")  # (a __dict__ for the cached lines)

    def __init__(self, text: str) -> None:
        self.text = text
        self._ascii = text.isascii()

    @cached_property
    def lines(self) -> list[str]:
        """The text's lines, ends kept: split on first use (most files, clean and ASCII,
        never need them)."""
        return self.text.splitlines(keepends=True) or [""]

    def char_col(self, line: int, byte_col: int) -> int:
        """Convert ast's 0-based UTF-8 byte column on a 1-based line to a 0-based char column."""
        if self._ascii or line < 1 or line > len(self.lines):
            return byte_col
        raw = self.lines[line - 1].encode("utf-8")
        return len(raw[:byte_col].decode("utf-8", errors="replace"))

    def span(self, node: ast.AST) -> tuple[int, int, int, int]:
        """1-based (line, column, end_line, end_column) of a node, columns in characters."""
        line = getattr(node, "lineno", 1)
        col = getattr(node, "col_offset", 0)
        end_line = getattr(node, "end_lineno", None) or line
        end_col = getattr(node, "end_col_offset", None)
        if end_col is None:
            end_col = col
        return (
            line,
            self.char_col(line, col) + 1,
            end_line,
            self.char_col(end_line, end_col) + 1,
        )

    def offset(self, line: int, column: int) -> int:
        """Character offset in ``text`` of a 1-based (line, column)."""
        line = min(max(line, 1), len(self.lines))
        return self._line_starts[line - 1] + column - 1

    @cached_property
    def _line_starts(self) -> list[int]:
        """The character offset at which each line starts: an offset is one look-up, not
        a sum over the lines before it (a fix or a finding asks for many)."""
        starts = [0]
        for text in self.lines:
            starts.append(starts[-1] + len(text))
        return starts

    def segment(self, node: ast.AST) -> str:
        line, col, end_line, end_col = self.span(node)
        return self.text[self.offset(line, col) : self.offset(end_line, end_col)]
