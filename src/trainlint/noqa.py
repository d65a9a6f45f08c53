"""Finding ``# noqa`` comments: the patterns, and the scan that tells real comments from
``#`` inside strings (a fast regex scan, checked against ``tokenize`` in the tests)."""

from __future__ import annotations

import functools
import io
import re
import sys
import tokenize

from trainlint.findings import Edit
from trainlint.source import Source

#: Codes starting with this are trainlint's own: an unknown one in a `noqa` is a mistake.
OWN_PREFIX = "TL"


# The patterns are compiled on first use (~2 ms together): most files have no noqa
# comment, and a check of a few files may meet none.
@functools.cache
def _noqa() -> re.Pattern[str]:
    # A code is letters then a digit, then letters or digits: `TL1O1` (a letter O) is
    # read whole, so TL002 can name it, rather than as `TL1` plus trailing text.
    return re.compile(
        r"#\s*noqa(?![\w-])(?:\s*:\s*(?P<codes>[A-Z]+[0-9][0-9A-Z]*"
        r"(?:\s*[,\s]\s*[A-Z]+[0-9][0-9A-Z]*)*))?",
        re.IGNORECASE,
    )


@functools.cache
def _file_noqa() -> re.Pattern[str]:
    return re.compile(
        r"^\s*#\s*trainlint\s*:\s*noqa(?:\s*:\s*(?P<codes>[A-Z]+[0-9]*(?:\s*[,\s]\s*[A-Z]+[0-9]*)*))?\s*$",
        re.IGNORECASE | re.MULTILINE,
    )


_CODE_SPLIT = re.compile(r"[,\s]+")


def codes_of(text: str | None) -> list[str]:
    if not text:
        return []
    return [c.upper() for c in _CODE_SPLIT.split(text.strip()) if c]


#: The codes of a ``noqa`` directive whose colon is followed by text that names no code
#: (``noqa`` + ``: fix later``): it suppresses nothing (it is no bare directive either),
#: and TL002 says so.
INVALID = "<no code>"
_NOT_CODES = re.compile(r"[^\S\r\n]*:[^\S\r\n]*[^\s#]")


def _directive(found: re.Match[str]) -> list[str]:
    codes = found.group("codes")
    if codes is None and _NOT_CODES.match(found.string, found.end()):
        return [INVALID]
    return codes_of(codes)


def unused_codes_edit(line_text: str, line: int, unused: set[str]) -> Edit | None:
    """The edit that drops ``unused`` codes from the directive on this line: the whole
    directive when none is left and it ends the line, else the rest of its codes; None
    when the directive names no code or text follows it (removing it could join that
    text to the code)."""
    found = list(_noqa().finditer(line_text))
    if not found or found[-1].group("codes") is None:
        return None
    m = found[-1]
    kept = [c for c in codes_of(m.group("codes")) if c not in unused]
    if kept:
        start, end = m.span("codes")
        return Edit(line, start + 1, line, end + 1, ", ".join(kept))
    if line_text[m.end() :].strip():
        return None
    start = len(line_text[: m.start()].rstrip())
    return Edit(line, start + 1, line, len(line_text.rstrip("\r\n")) + 1, "")


def with_codes(line_text: str, codes: set[str]) -> str | None:
    """The line with ``codes`` added to the codes of its directive (None: no codes there)."""
    found = list(_noqa().finditer(line_text))
    if not found or found[-1].group("codes") is None:
        return None
    m = found[-1]
    merged = sorted(set(codes_of(m.group("codes"))) | codes)
    start, end = m.span("codes")
    return line_text[:start] + ", ".join(merged) + line_text[end:]


def file_noqa_codes(text: str) -> list[str] | None:
    """A file's ``# trainlint: noqa`` directives: None, none; [], skip the whole file;
    [codes], turn those rules off in it."""
    if "trainlint" not in text:
        return None
    found: list[str] | None = None
    for m in _file_noqa().finditer(text):
        codes = codes_of(m.group("codes"))
        if not codes:
            return []
        found = (found or []) + codes
    return found


def noqa_on_lines(source: Source, lines: set[int]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for n in lines:
        if 1 <= n <= len(source.lines):
            text = source.lines[n - 1]
            hash_at = text.find("#")
            if hash_at < 0:
                continue
            m = _noqa().search(text, hash_at)
            if m and not _file_noqa().match(text):
                out[n] = _directive(m)
    return out


# Comments and string literals, in order, for sources the interpreter parsed: before
# 3.12 a string literal is a regular language (an f-string cannot nest its own quotes or
# hold a comment), so skipping strings finds exactly the comments `tokenize` would.
@functools.cache
def _comment_or_string() -> re.Pattern[str]:
    return re.compile(
        "|".join(
            (
                r"(#[^\r\n]*)",  # a comment: group 1
                r"'''(?:[^'\\]|\\.|'(?!''))*'''",  # triple-quoted strings first
                r'"""(?:[^"\\]|\\.|"(?!""))*"""',
                r"'(?:[^'\\\r\n]|\\.)*'",
                r'"(?:[^"\\\r\n]|\\.)*"',
            )
        ),
        re.DOTALL,
    )


_SCAN_COMMENTS = sys.version_info < (3, 12)


def noqa_comments(source: Source) -> dict[int, list[str]]:
    """line -> codes ([] for a bare noqa), from real comments only (not strings)."""
    text = source.text
    if _SCAN_COMMENTS and text.count("\r") == text.count("\r\n"):
        return scan_noqa_comments(text)
    return tokenize_noqa_comments(source)


def scan_noqa_comments(text: str) -> dict[int, list[str]]:
    """`tokenize_noqa_comments` at a fraction of the cost (tokenize is pure Python):
    lines counted as tokenize counts them (on "\\n"), comments cut where it cuts them."""
    if _POSSESSIVE:
        return _scan_to_directives(text, _to_directive())
    out: dict[int, list[str]] = {}
    line, counted = 1, 0
    for m in _comment_or_string().finditer(text):
        comment = m.group(1)
        if comment is None:
            continue
        found = _noqa().search(comment)
        if found and not _file_noqa().match(comment):
            start = m.start()
            line += text.count("\n", counted, start)
            counted = start
            out[line] = _directive(found)
    return out


# The same scan with one match per directive instead of one per string and comment: the
# strings and the comments without a directive are stepped over inside the regex engine,
# which stops at the next comment that has one (group 1) or where it can read no further.
# Possessive repeats (Python 3.11) never backtrack: each step takes the first alternative
# that matches, as `finditer` over `_comment_or_string()` does.
_AT_NOQA = r"[^\S\r\n]*(?i:noqa)(?![\w-])"
_POSSESSIVE = sys.version_info >= (3, 11)


@functools.cache
def _to_directive() -> re.Pattern[str]:
    # compiled on first use: not every run reads a noqa comment (start-up, pre-commit)
    return re.compile(
        "(?:"
        + "|".join(
            (
                r"""[^'"#]++""",
                r"'''[^'\\]*+(?:(?:\\.|'(?!''))[^'\\]*+)*+'''",  # (unrolled: a run a step)
                r'"""[^"\\]*+(?:(?:\\.|"(?!""))[^"\\]*+)*+"""',
                r"'[^'\\\r\n]*+(?:\\.[^'\\\r\n]*+)*+'",
                r'"[^"\\\r\n]*+(?:\\.[^"\\\r\n]*+)*+"',
                rf"#(?!{_AT_NOQA})(?![^\r\n]*#{_AT_NOQA})[^\r\n]*+",  # a comment, no directive
            )
        )
        + r")*+(#[^\r\n]*)?",
        re.DOTALL,
    )


def _scan_to_directives(text: str, to_directive: re.Pattern[str]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    line, counted, pos, end = 1, 0, 0, len(text)
    match = to_directive.match
    while pos < end:
        m = match(text, pos)
        assert m is not None  # (the pattern matches the empty string)
        comment = m.group(1)
        if comment is None:
            pos = m.end() + 1  # a quote that opens no string: `finditer` steps over it
            continue
        found = _noqa().search(comment)
        if found and not _file_noqa().match(comment):
            start = m.start(1)
            line += text.count("\n", counted, start)
            counted = start
            out[line] = _directive(found)
        pos = m.end()
    return out


def tokenize_noqa_comments(source: Source) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source.text).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        tokens = []
        for i, line in enumerate(source.lines, 1):
            m = _noqa().search(line)
            if m:
                out[i] = _directive(m)
        return out
    for tok in tokens:
        if tok.type == tokenize.COMMENT:
            m = _noqa().search(tok.string)
            if m and not _file_noqa().match(tok.string):
                out[tok.start[0]] = _directive(m)
    return out
