"""Fixes: exact text edits applied atomically.

Edits replace character spans of the original text, so everything outside the
span (comments, formatting, line endings, encoding, BOM) is preserved byte for byte.

Fixes that move, wrap or dedent statements are built by the rules from the ``ast`` as
an :class:`~trainlint.findings.Intent` (plain data: which sibling statements, what to
do; see :mod:`trainlint.edits`) and carried out only under ``--fix``/``--diff`` by
:mod:`trainlint.cst_fix`, a libcst transform of the smallest region that holds them,
which becomes one text edit. libcst is imported there and nowhere else: a plain lint
never pays for it.
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
from typing import TYPE_CHECKING, Any

from trainlint.findings import Edit, Finding, Fix

if TYPE_CHECKING:
    from trainlint.engine import FileResult, Linter
    from trainlint.runner import FixMode


def intent_edits(fix: Fix, text: str | None) -> list[Edit]:
    """A fix's text edits, with its intent carried out on ``text`` (libcst, imported
    here lazily). An intent that cannot be carried out safely drops the whole fix; so
    does one with no ``text`` or no libcst (the CLI says what to install)."""
    if fix.intent is None:
        return list(fix.edits)
    if text is None or not libcst_available():
        return []
    from trainlint.cst_fix import realize

    edit = realize(text, fix.intent)
    return [*fix.edits, edit] if edit is not None else []


_LIBCST: bool | None = None


def libcst_available() -> bool:
    global _LIBCST
    if _LIBCST is None:
        import importlib.util

        try:
            _LIBCST = importlib.util.find_spec("libcst") is not None
        except (ImportError, ValueError):
            _LIBCST = False
    return _LIBCST


MISSING_LIBCST = (
    "trainlint: fixes that move or wrap statements need libcst: pip install 'trainlint[fix]'"
)


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


def selected_edits(findings: list[Finding], unsafe: bool, text: str | None = None) -> list[Edit]:
    """The edits of the fixes to apply; intents are carried out on ``text``."""
    return [
        e
        for f in findings
        if f.fix is not None and (f.fix.applicability == "safe" or unsafe)
        for e in intent_edits(f.fix, text)
    ]


def needs_libcst(findings: list[Finding], unsafe: bool) -> bool:
    """A selected fix is left only because libcst is missing."""
    return not libcst_available() and any(
        f.fix is not None and f.fix.intent is not None and (f.fix.applicability == "safe" or unsafe)
        for f in findings
    )


def fix_text(
    text: str, lint: Callable[[str], list[Finding]], unsafe: bool
) -> tuple[str, int, list[Finding]]:
    """Apply fixes until none apply (overlapping ones wait for the next pass).

    Returns (fixed text, number of fixes applied, findings left on the fixed text).
    """
    applied = 0
    findings = lint(text)
    for _ in range(MAX_FIX_PASSES):
        fixable = [
            f for f in findings if f.fix is not None and (f.fix.applicability == "safe" or unsafe)
        ]
        if not fixable:
            break
        new_text, n = apply_edits(text, selected_edits(fixable, unsafe, text))
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
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            fromfile=f"a/{path}",
            tofile=f"b/{path}",
        )
    )


def fix_python(
    linter: Linter,
    data: bytes,
    shown: str,
    ignored: set[str],
    path: Path,
    fix: FixMode,
    view: dict[str, Any] | None = None,
) -> FileResult:
    """``--fix``/``--diff`` of one Python file whose lint found fixes: the file fixed,
    linted again after each round, written atomically or shown as a diff."""
    from trainlint.source import decode

    text, encoding = decode(data)
    last: list[FileResult] = []

    def lint(t: str) -> list[Finding]:
        r = linter.lint_bytes(t.encode("utf-8"), shown, ignored=ignored, text=t, view=view)
        last.append(r)
        return r.findings

    new_text, applied, remaining = fix_text(text, lint, fix.unsafe)
    result = last[-1]
    result.findings = remaining
    result.fixed = applied
    if new_text != text:
        if fix.diff:
            result.diff = unified_diff(shown, text, new_text)
        if fix.write:
            write_atomic(path, encode_like(new_text, data, encoding))
    return result
