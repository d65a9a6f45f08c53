"""``github``: workflow-command annotations for GitHub Actions."""

from __future__ import annotations

from collections.abc import Sequence

from trainlint.findings import Finding


def _escape_data(s: str) -> str:
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_prop(s: str) -> str:
    return _escape_data(s).replace(":", "%3A").replace(",", "%2C")


def format_github(findings: Sequence[Finding], rules: Sequence[object] = ()) -> str:
    out = []
    for f in findings:
        level = "error" if f.severity == "error" else "warning"
        where = f"cell {f.cell}, " if f.cell is not None else ""
        props = (
            f"file={_escape_prop(f.path)},line={f.line},col={f.column},"
            f"endLine={f.end_line},endColumn={f.end_column},"
            f"title={_escape_prop(f'{f.code} {f.name}')}"
        )
        out.append(f"::{level} {props}::{_escape_data(where + f.code + ' ' + f.message)}\n")
    return "".join(out)
