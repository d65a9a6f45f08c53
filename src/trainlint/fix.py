"""Fixes: exact text edits computed from node positions, applied atomically.

Edits replace character spans of the original text, so everything outside the
span (comments, formatting, line endings, encoding, BOM) is preserved byte for byte.
"""

from __future__ import annotations

import ast
import codecs
import contextlib
import difflib
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from trainlint.findings import Edit, Finding

if TYPE_CHECKING:
    from trainlint.analysis.model import FileModel


def _pos(node: ast.AST) -> tuple[int, int]:
    return (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))


def _start(model: FileModel, node: ast.AST) -> tuple[int, int]:
    line, col, _, _ = model.source.span(node)
    return line, col


def _end(model: FileModel, node: ast.AST) -> tuple[int, int]:
    _, _, line, col = model.source.span(node)
    return line, col


def replace_node(model: FileModel, node: ast.AST, content: str) -> Edit:
    line, col, end_line, end_col = model.source.span(node)
    return Edit(line, col, end_line, end_col, content)


def insert_at(line: int, column: int, content: str) -> Edit:
    return Edit(line, column, line, column, content)


def remove_keyword(model: FileModel, call: ast.Call, name: str) -> Edit | None:
    """Remove ``name=...`` from a call, with the comma that separates it."""
    items: list[ast.AST] = sorted(  # positional and keyword arguments, in source order
        [*call.args, *call.keywords], key=_pos
    )
    found = [i for i, it in enumerate(items) if isinstance(it, ast.keyword) and it.arg == name]
    if not found:
        return None
    i = found[0]
    item = items[i]
    if i > 0:
        start = _end(model, items[i - 1])
        end = _end(model, item)
    elif i + 1 < len(items):
        start = _start(model, item)
        end = _start(model, items[i + 1])
    else:
        start = _start(model, item)
        end = _end(model, item)
        # Drop a trailing comma too: f(retain_graph=True,) -> f()
        text = model.source.text
        off = model.source.offset(*end)
        j = off
        while j < len(text) and text[j] in " \t":
            j += 1
        if j < len(text) and text[j] == ",":
            end = (end[0], end[1] + (j - off) + 1)
    between = model.source.text[model.source.offset(*start) : model.source.offset(*end)]
    if "#" in between:
        return None  # a comment inside the span: leave the user's text alone
    return Edit(start[0], start[1], end[0], end[1], "")


def add_keyword(model: FileModel, call: ast.Call, text: str) -> Edit | None:
    """Append ``text`` (e.g. ``weights_only=True``) as the last argument of a call."""
    items = sorted([*call.args, *call.keywords], key=_pos)
    end_line, end_col = _end(model, call)  # just past ")"
    close = model.source.offset(end_line, end_col) - 1
    src = model.source.text
    if close < 0 or src[close] != ")":
        return None
    if not items:
        return insert_at(end_line, end_col - 1, text)
    # Right after the last argument: a trailing comma, if any, then follows our keyword.
    last_line, last_col = _end(model, items[-1])
    return insert_at(last_line, last_col, f", {text}")


def apply_edits(text: str, edits: list[Edit]) -> tuple[str, int]:
    """Apply non-overlapping edits (first come, first served). Returns (text, applied)."""
    from trainlint.source import Source

    src = Source(text)
    spans = []
    for e in edits:
        start = src.offset(e.line, e.column)
        end = src.offset(e.end_line, e.end_column)
        spans.append((start, end, e.content))
    spans.sort(key=lambda s: (s[0], s[1]))
    chosen: list[tuple[int, int, str]] = []
    last_end = -1
    for start, end, content in spans:
        if start < last_end or (chosen and start == chosen[-1][0] == end):
            continue  # overlaps an earlier edit: the next --fix pass picks it up
        chosen.append((start, end, content))
        last_end = end
    out = text
    for start, end, content in reversed(chosen):
        out = out[:start] + content + out[end:]
    return out, len(chosen)


# -- applying fixes to files ---------------------------------------------------------------

MAX_FIX_PASSES = 10


def selected_edits(findings: list[Finding], unsafe: bool) -> list[Edit]:
    return [
        e
        for f in findings
        if f.fix is not None and (f.fix.applicability == "safe" or unsafe)
        for e in f.fix.edits
    ]


def fix_text(
    text: str, lint: Callable[[str], list[Finding]], unsafe: bool
) -> tuple[str, int, list[Finding]]:
    """Apply fixes until none apply (overlapping ones wait for the next pass).

    Returns (fixed text, number of fixes applied, findings left on the fixed text).
    """
    applied = 0
    findings = lint(text)
    for _ in range(MAX_FIX_PASSES):
        fixable = [f for f in findings if f.fix is not None and (
            f.fix.applicability == "safe" or unsafe)]
        if not fixable:
            break
        new_text, n = apply_edits(text, selected_edits(fixable, unsafe))
        if n == 0 or new_text == text:
            break
        try:
            ast.parse(new_text)
        except (SyntaxError, ValueError):
            break  # never write a fix that breaks the file: keep the last good text
        text = new_text
        applied += n
        findings = lint(text)
    return text, applied, findings


def encode_like(text: str, original: bytes, encoding: str) -> bytes:
    """Encode fixed text as the original was: same codec, same BOM."""
    data = text.encode(encoding)
    if original.startswith(codecs.BOM_UTF8) and not data.startswith(codecs.BOM_UTF8):
        data = codecs.BOM_UTF8 + data
    return data


def write_atomic(path: Path, data: bytes) -> None:
    """Write via a temp file in the same directory and rename: readers never see a
    half-written file; the original's permission bits are kept.

    A symlink is written through: the temp file goes beside the file it finally points
    to and replaces that, so the link stays a link (renaming onto the link itself would
    turn it into a regular file and leave the real file unfixed).
    """
    path = Path(os.path.realpath(path))
    mode = None
    with contextlib.suppress(OSError):
        mode = stat.S_IMODE(os.stat(path).st_mode)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".trainlint-tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def unified_diff(path: str, before: str, after: str) -> str:
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True), after.splitlines(keepends=True),
            fromfile=f"a/{path}", tofile=f"b/{path}",
        )
    )
