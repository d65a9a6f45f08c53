"""Carry out restructuring fix intents with libcst (imported only under ``--fix``/``--diff``).

Detection runs on CPython's ``ast``; a rule that wants statements moved, wrapped or
dedented describes that as an :class:`~trainlint.findings.Intent` over a region of
sibling statements. Here the region's lines alone are parsed with libcst (an indented
region under a synthetic ``if 1:`` header, so its own indentation stays as written),
the statements are rearranged as nodes, and the region's new text becomes one ordinary
:class:`~trainlint.findings.Edit`. libcst keeps comments (they travel with the statement
they sit above or beside), blank lines, line endings and re-indents nested blocks.
Anything unexpected (the region does not parse alone, its statements are not the ones
the intent counted, a block would be left empty) gives None: the finding stays unfixed.
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from trainlint.findings import Edit, Intent
from trainlint.source import Source

_HEADER = "if 1:"


def _newline(line: str) -> str:
    for nl in ("\r\n", "\n", "\r"):
        if line.endswith(nl):
            return nl
    return "\n"


def realize(text: str, intent: Intent) -> Edit | None:
    """The text edit that carries ``intent`` out on ``text``, or None if it cannot safely."""
    src = Source(text)
    if not 1 <= intent.line <= intent.end_line <= len(src.lines):
        return None
    first_line = src.lines[intent.line - 1]
    indent = first_line[: intent.column - 1]
    if indent.strip(" \t"):
        return None
    last_line = src.lines[intent.end_line - 1]
    tail = last_line[intent.end_column - 1 :].strip()
    if tail and not tail.startswith("#"):
        return None  # something else follows the region's last statement on its line
    start = src.offset(intent.line, 1)
    end = src.offset(intent.end_line, 1) + len(last_line)
    region = text[start:end]
    nl = _newline(first_line)
    added_newline = not region.endswith(("\n", "\r"))
    if added_newline:
        region += nl
    code = f"{_HEADER}{nl}{region}" if indent else region
    try:
        module = cst.parse_module(code)
    except (cst.ParserSyntaxError, RecursionError):
        return None
    if indent:
        outer = module.body[0]
        if not (isinstance(outer, cst.If) and isinstance(outer.body, cst.IndentedBlock)):
            return None
        stmts: Sequence[cst.BaseStatement] = outer.body.body
    else:
        stmts = module.body
    if len(stmts) != intent.count or any(
        isinstance(s, cst.SimpleStatementLine) and len(s.body) != 1 for s in stmts
    ):
        return None
    new = _transform(list(stmts), intent)
    if new is None:
        return None
    if indent:
        assert isinstance(outer, cst.If) and isinstance(outer.body, cst.IndentedBlock)
        out = module.with_changes(
            body=[outer.with_changes(body=outer.body.with_changes(body=new))]
        ).code
        if not out.startswith(f"{_HEADER}{nl}"):
            return None
        out = out[len(_HEADER) + len(nl) :]
    else:
        out = module.with_changes(body=new).code
    if added_newline and out.endswith(nl):
        out = out[: -len(nl)]
    if out == text[start:end]:
        return None
    return Edit(intent.line, 1, intent.end_line, len(last_line) + 1, out)


def _transform(stmts: list[cst.BaseStatement], intent: Intent) -> list[cst.BaseStatement] | None:
    if intent.kind == "move":
        seg = stmts[intent.first : intent.last + 1]
        rest = stmts[: intent.first] + stmts[intent.last + 1 :]
        at = intent.to if intent.to <= intent.first else intent.to - len(seg)
        if not 0 <= at <= len(rest):
            return None
        return rest[:at] + seg + rest[at:]
    if intent.kind == "wrap":
        seg = stmts[intent.first : intent.last + 1]
        if not seg or not intent.header:
            return None
        try:
            header = cst.parse_expression(intent.header)
        except cst.ParserSyntaxError:
            return None
        head = seg[0]
        if not isinstance(head, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            return None
        lead = head.leading_lines
        body = [head.with_changes(leading_lines=()), *seg[1:]]
        wrapped = cst.With(
            items=[cst.WithItem(item=header)],
            body=cst.IndentedBlock(body=body, indent=intent.indent or None),
            leading_lines=lead,
        )
        return stmts[: intent.first] + [wrapped] + stmts[intent.last + 1 :]
    if intent.kind == "dedent":
        (with_stmt,) = stmts
        if not isinstance(with_stmt, cst.With) or not isinstance(with_stmt.body, cst.IndentedBlock):
            return None
        inner = list(with_stmt.body.body)
        if not 1 <= intent.first < len(inner) or intent.last != len(inner) - 1:
            return None
        if with_stmt.body.footer:
            return None  # comments closing the block: which side they belong to is unclear
        kept = with_stmt.with_changes(body=with_stmt.body.with_changes(body=inner[: intent.first]))
        return [kept, *inner[intent.first :]]
    return None
