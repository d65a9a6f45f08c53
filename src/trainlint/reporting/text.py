"""Human formats: ``concise`` (one line each) and ``full`` (with source and caret)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from trainlint.findings import Finding
from trainlint.reporting import location


def concise(findings: Sequence[Finding], rules: Sequence[object] = ()) -> str:
    return "".join(f"{location(f)}: {f.code} {f.name}: {f.message}\n" for f in findings)


def _source_lines(
    path: str, cell: int | None, cache: dict[tuple[str, int | None], list[str]]
) -> list[str]:
    key = (path, cell)
    if key not in cache:
        lines: list[str] = []
        try:
            data = Path(path).read_bytes()
            if cell is not None:
                import json

                nb = json.loads(data.decode("utf-8-sig"))
                src = nb["cells"][cell - 1].get("source", "")
                text = "".join(src) if isinstance(src, list) else str(src)
            else:
                from trainlint.source import decode

                text, _ = decode(data)
            lines = text.splitlines()
        except Exception:  # the report must never fail because a file changed meanwhile
            lines = []
        cache[key] = lines
    return cache[key]


def full(findings: Sequence[Finding], rules: Sequence[object] = ()) -> str:
    out: list[str] = []
    cache: dict[tuple[str, int | None], list[str]] = {}
    for f in findings:
        out.append(f"{location(f)}: {f.code} {f.name}: {f.message}")
        lines = _source_lines(f.path, f.cell, cache)
        if 1 <= f.line <= len(lines):
            width = len(str(f.end_line))
            last = min(f.end_line, f.line + 4, len(lines))
            for n in range(f.line, last + 1):
                text = lines[n - 1].expandtabs(1)
                out.append(f"  {n:>{width}} | {text}")
                if n == f.line:
                    start = f.column
                    stop = f.end_column if f.end_line == f.line else len(text) + 1
                    carets = "^" * max(1, stop - start)
                    out.append(f"  {'':>{width}} | {' ' * (start - 1)}{carets}")
        for r in f.related:
            where = f"cell {r.cell}:" if r.cell is not None else ""
            out.append(f"  = note: {r.message} at {where}{r.line}:{r.column}")
        if f.fix is not None:
            label = "Safe fix" if f.fix.applicability == "safe" else "Unsafe fix"
            out.append(f"  = {label}: {f.fix.message or 'available'}")
        out.append("")
    return "\n".join(out) + ("\n" if out else "")


def wants_color(choice: str, stream: object) -> bool:
    """``--color``: always, never, or (auto) on a terminal unless ``NO_COLOR`` is set
    (https://no-color.org); ``FORCE_COLOR`` turns it on where auto would not."""
    import os

    if choice != "auto":
        return choice == "always"
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def colorize(text: str) -> str:
    """The location in bold and the code in red on each finding line of ``concise``/``full``."""
    import re

    return re.sub(
        r"^(\S[^\n]*?:\d+:\d+:) (TL\d+|[A-Z]+\d+) ",
        "\x1b[1m\\1\x1b[0m \x1b[1;31m\\2\x1b[0m ",
        text,
        flags=re.M,
    )
