"""``trainlint check --add-noqa``: suppress every current finding with a ``# noqa: CODE``
comment on its line (to adopt the linter on an existing code base, then fix as you go).

A comment is only added where a line really ends in code: not inside a string that spans
lines, not after a backslash continuation (the tokenizer says where those are); a line that
already has a directive with codes gets the new codes added to it. Written atomically,
in the file's own encoding and line endings."""

from __future__ import annotations

import io
import tokenize
from collections.abc import Iterable
from pathlib import Path

from trainlint.findings import Finding


def add_noqa(findings: Iterable[Finding]) -> int:
    """Add directives for ``findings`` (of ``.py``/``.pyi`` files) in place; returns how
    many findings they suppress. Notebooks and unreadable files are left alone."""
    by_path: dict[str, list[Finding]] = {}
    for f in findings:
        if f.cell is None and f.code != "TL001":
            by_path.setdefault(f.path, []).append(f)
    added = 0
    for path, items in by_path.items():
        added += _add_to_file(Path(path), items)
    return added


def _line_ends(text: str) -> set[int]:
    """Lines whose end is outside any string and not continued by a backslash."""
    ends: set[int] = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type in (tokenize.NEWLINE, tokenize.NL, tokenize.COMMENT):
                ends.add(tok.start[0])
    except (tokenize.TokenError, SyntaxError):
        return set()
    return ends


def _add_to_file(path: Path, findings: list[Finding]) -> int:
    from trainlint.fix import encode_like, write_atomic
    from trainlint.noqa import noqa_on_lines, with_codes
    from trainlint.source import Source, SourceError, decode

    try:
        data = path.read_bytes()
        text, encoding = decode(data)
    except (OSError, SourceError):
        return 0
    ends = _line_ends(text)
    lines = text.splitlines(keepends=True)
    wanted: dict[int, set[str]] = {}
    count = 0
    for f in findings:
        line = next((n for n in (f.line, f.end_line) if n in ends and n <= len(lines)), None)
        if line is not None:
            wanted.setdefault(line, set()).add(f.code)
            count += 1
    if not wanted:
        return 0
    existing = noqa_on_lines(Source(text), set(wanted))
    for n, codes in wanted.items():
        body = lines[n - 1]
        stripped = body.rstrip("\r\n")
        newline = body[len(stripped) :]
        have = existing.get(n)
        if have == []:
            continue  # a bare directive already suppresses everything there
        if have:
            merged = with_codes(stripped, codes)
            if merged is None:
                continue
            stripped = merged
        else:
            stripped = f"{stripped.rstrip()}  # noqa: {', '.join(sorted(codes))}"
        lines[n - 1] = stripped + newline
    write_atomic(path, encode_like("".join(lines), data, encoding))
    return count
