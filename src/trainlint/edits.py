"""Building fixes from the ``ast``: exact text edits from node positions, and fix
intents (move, wrap or dedent sibling statements) as plain data.

Rules call these while linting; nothing here edits text or imports libcst. Intents
are carried out only under ``--fix``/``--diff`` (:mod:`trainlint.fix`).
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from trainlint.analysis.reordering import independent, jumps
from trainlint.findings import Edit, Intent

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


# -- restructuring intents (built from the ast; carried out by cst_fix) -------------------


def siblings(model: FileModel, stmt: ast.stmt) -> list[ast.stmt] | None:
    """The statement list ``stmt`` sits in (a body, an ``else``, a ``finally``)."""
    parent = model.parent_of(stmt)
    if parent is None:
        return None
    for name in ("body", "orelse", "finalbody"):
        block = getattr(parent, name, None)
        if isinstance(block, list) and any(s is stmt for s in block):
            return block
    return None


def sibling_ancestor(model: FileModel, node: ast.AST, block: list[ast.stmt]) -> ast.stmt | None:
    """The statement of ``block`` that holds ``node`` (itself, or a loop or ``if`` around
    it), if any."""
    cur: ast.AST | None = model.statement_of(node)
    ids = {id(s) for s in block}
    while cur is not None and not isinstance(cur, (ast.FunctionDef, ast.AsyncFunctionDef)):
        if id(cur) in ids:
            return cur  # type: ignore[return-value]
        cur = model.parent_of(cur)
    return None


def _indent_unit(model: FileModel, stmt: ast.stmt) -> str:
    """One level of indentation as this file writes it, seen from ``stmt``'s block."""
    lines = model.source.lines
    own = lines[stmt.lineno - 1][: stmt.col_offset]
    parent = model.parent_of(stmt)
    if isinstance(parent, ast.stmt):
        outer = lines[parent.lineno - 1][: parent.col_offset]
        if own.startswith(outer) and len(own) > len(outer):
            return own[len(outer) :]
    for node in ast.walk(model.tree):  # module level: the first indented block
        if isinstance(node, ast.stmt) and node.col_offset > 0:
            return lines[node.lineno - 1][: node.col_offset]
    return "    "


def _region(
    model: FileModel, block: list[ast.stmt], lo: int, hi: int
) -> tuple[int, int, int, int] | None:
    """Span of ``block[lo..hi]`` if the statements sit one per line, alone on their lines."""
    region = block[lo : hi + 1]
    prev_end = 0
    for s in region:
        if s.lineno <= prev_end or getattr(s, "decorator_list", None):
            return None  # `a; b` on one line, or a decorator above the region's start
        prev_end = s.end_lineno or s.lineno
    first, last = region[0], region[-1]
    if first.lineno > 1 and hi + 1 < len(block) and block[hi + 1].lineno == prev_end:
        return None
    if lo > 0 and block[lo - 1].end_lineno == first.lineno:
        return None
    line, col, _, _ = model.source.span(first)
    _, _, end_line, end_col = model.source.span(last)
    if model.source.lines[line - 1][: col - 1].strip():
        return None
    return line, col, end_line, end_col


def move_intent(
    model: FileModel, moved: list[ast.stmt], anchor: ast.stmt, where: str = "before"
) -> Intent | None:
    """Move the contiguous sibling statements ``moved`` just ``before``/``after`` ``anchor``.

    None (leave the finding unfixed) when they are not siblings, when the statements
    moved or moved past could jump (return, break, raise, a ``try``), when one side
    writes a name the other reads or writes, or when the layout does not allow a clean
    cut (two statements on a line).
    """
    block = siblings(model, anchor)
    if block is None or not moved:
        return None
    idx = {id(s): i for i, s in enumerate(block)}
    if any(id(s) not in idx for s in moved):
        return None
    pos = sorted(idx[id(s)] for s in moved)
    if pos != list(range(pos[0], pos[-1] + 1)):
        return None
    a = idx[id(anchor)]
    if pos[0] <= a <= pos[-1]:
        return None
    lo, hi = min(pos[0], a), max(pos[-1], a)
    if any(jumps(s) for s in block[lo : hi + 1]):
        return None
    ids = {id(s) for s in moved}
    if not independent(moved, [s for s in block[lo : hi + 1] if id(s) not in ids]):
        return None  # a value one side computes would reach the other side changed
    span = _region(model, block, lo, hi)
    if span is None:
        return None
    to = a - lo + (1 if where == "after" else 0)
    if to in (pos[0] - lo, pos[-1] - lo + 1):
        return None  # already there
    return Intent("move", *span, count=hi - lo + 1, first=pos[0] - lo, last=pos[-1] - lo, to=to)


def move_next_to(model: FileModel, node: ast.AST, anchor: ast.AST, where: str) -> Intent | None:
    """Move the statement holding ``node`` just ``before``/``after`` the one holding
    ``anchor``. ``node`` may sit inside a loop or ``if`` of that block (the whole
    statement moves: a hand-written zeroing loop)."""
    target = model.statement_of(anchor)
    block = siblings(model, target)
    moved = sibling_ancestor(model, node, block) if block is not None else None
    if moved is None:
        return None
    return move_intent(model, [moved], target, where)


def move_after_last(model: FileModel, node: ast.AST, anchors: list[ast.AST]) -> Intent | None:
    """Move the statement holding ``node`` to just after the last statement of its block
    that holds one of ``anchors`` (a call, or a loop/``if`` around it). None when an
    anchor lies outside that block."""
    stmt = model.statement_of(node)
    block = siblings(model, stmt)
    if block is None or not anchors:
        return None
    order = {id(s): i for i, s in enumerate(block)}
    targets = [sibling_ancestor(model, a, block) for a in anchors]
    if any(t is None for t in targets):
        return None
    last = max((t for t in targets if t is not None), key=lambda t: order[id(t)])
    if order[id(last)] < order[id(stmt)]:
        return None
    return move_intent(model, [stmt], last, "after")


def append_to_block(model: FileModel, stmt: ast.stmt, code: str) -> Edit | None:
    """A text edit adding the one-line statement ``code`` at the end of the block that
    holds ``stmt``, at its indentation. None when a statement after ``stmt`` in the block
    could jump past the new line (return, break, raise, a ``try``) or the block's last
    line does not end cleanly."""
    block = siblings(model, stmt)
    if block is None:
        return None
    i = next(k for k, s in enumerate(block) if s is stmt)
    if any(jumps(s) for s in block[i + 1 :]):
        return None
    lines = model.source.lines
    indent = lines[stmt.lineno - 1][: stmt.col_offset]
    last = block[-1]
    end_line = last.end_lineno or last.lineno
    if indent.strip() or end_line > len(lines):
        return None
    _, _, _, end_col = model.source.span(last)
    line = lines[end_line - 1]
    tail = line[end_col - 1 :].strip()
    if tail and not tail.startswith("#"):
        return None  # `a(); b()` or a one-line block: no clean place for a new line
    body = line.rstrip("\r\n")
    nl = line[len(body) :] or ("\r\n" if lines[0].endswith("\r\n") else "\n")
    return insert_at(end_line, len(body) + 1, f"{nl}{indent}{code}")


def insert_before(model: FileModel, stmt: ast.stmt, code: str) -> Edit | None:
    """A text edit adding the one-line statement ``code`` on its own line just before
    ``stmt``, at its indentation. None when ``stmt`` does not start its line (``a(); b()``)."""
    line = model.source.lines[stmt.lineno - 1]
    indent = line[: stmt.col_offset]
    if indent.strip():
        return None
    newline = line[len(line.rstrip("\r\n")) :] or "\n"
    return insert_at(stmt.lineno, 1, f"{indent}{code}{newline}")


def runs_after(model: FileModel, stmt: ast.stmt, earlier: ast.stmt) -> bool:
    """Whether ``earlier`` precedes ``stmt`` in its block or in one around it reached
    through ``if``/``with`` only: whenever ``stmt`` runs, ``earlier`` ran before it (barring
    a jump between them)."""
    cur: ast.AST | None = stmt
    while isinstance(cur, ast.stmt):
        if any(s is earlier for s in siblings(model, cur) or []):
            return earlier.lineno < cur.lineno
        cur = model.parent_of(cur)
        if not isinstance(cur, (ast.If, ast.With)):
            return False
    return False


def _import_spellings(model: FileModel, qualname: str) -> list[tuple[str, str]]:
    """Every way the file's imports can spell ``qualname``, shortest first (one walk of
    the tree per file and name, however many findings ask)."""
    spellings = []
    for imp in ast.walk(model.tree):
        if isinstance(imp, ast.Import):
            for a in imp.names:
                if qualname.startswith(a.name + "."):
                    local = a.asname or a.name
                    spellings.append((local.split(".")[0], local + qualname[len(a.name) :]))
        elif isinstance(imp, ast.ImportFrom) and imp.module and not imp.level:
            for a in imp.names:
                full = f"{imp.module}.{a.name}"
                if qualname == full or qualname.startswith(full + "."):
                    local = a.asname or a.name
                    spellings.append((local, local + qualname[len(full) :]))
    return sorted(spellings, key=lambda x: len(x[1]))


def torch_call(model: FileModel, node: ast.AST, qualname: str) -> str | None:
    """How the code at ``node`` spells a call of ``qualname`` (``torch.no_grad``) through
    the file's own imports (``import torch as T`` -> ``T.no_grad()``), or None."""
    scopes = model.scopes_of(node)
    spellings = model.memo(("import-spellings", qualname), lambda m: _import_spellings(m, qualname))
    for _local, spelled in spellings:
        head = spelled.split(".")[0]
        resolved = model.imports.resolve_name(head, scopes)
        if resolved is not None and (resolved + spelled[len(head) :]) == qualname:
            return spelled + "()"
    return None


def wrap_intent(model: FileModel, stmts: list[ast.stmt], header: str) -> Intent | None:
    """Wrap the contiguous sibling statements ``stmts`` in ``with <header>:``."""
    block = siblings(model, stmts[0]) if stmts else None
    if block is None:
        return None
    idx = {id(s): i for i, s in enumerate(block)}
    if any(id(s) not in idx for s in stmts):
        return None
    lo, hi = idx[id(stmts[0])], idx[id(stmts[-1])]
    span = _region(model, block, lo, hi)
    if span is None:
        return None
    return Intent(
        "wrap",
        *span,
        count=hi - lo + 1,
        first=0,
        last=hi - lo,
        header=header,
        indent=_indent_unit(model, stmts[0]),
    )


def dedent_intent(model: FileModel, with_stmt: ast.With, first: ast.stmt) -> Intent | None:
    """Move ``first`` and the statements after it in the ``with`` body out of the block,
    just after it. None when ``first`` opens the body (the block would be left empty)."""
    if len(with_stmt.items) != 1:
        return None  # other context managers would be left too
    body = with_stmt.body
    i = next((k for k, s in enumerate(body) if s is first), None)
    if not i or body[0].lineno == with_stmt.lineno:
        return None
    block = siblings(model, with_stmt)
    if block is None:
        return None
    k = next(n for n, s in enumerate(block) if s is with_stmt)
    span = _region(model, block, k, k)
    if span is None:
        return None
    return Intent("dedent", *span, count=1, first=i, last=len(body) - 1)
