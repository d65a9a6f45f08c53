"""``github``: workflow-command annotations for GitHub Actions."""

from __future__ import annotations

from collections.abc import Sequence

from trainlint.findings import Finding
from trainlint.reporting import NotebookFiles


def _escape_data(s: str) -> str:
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_prop(s: str) -> str:
    return _escape_data(s).replace(":", "%3A").replace(",", "%2C")


def format_github(findings: Sequence[Finding], rules: Sequence[object] = ()) -> str:
    out = []
    notebooks = NotebookFiles()
    for f in findings:
        level = "error" if f.severity == "error" else "warning"
        span: tuple[int, int, int, int] | None = (f.line, f.column, f.end_line, f.end_column)
        where = ""
        if f.cell is not None:
            # GitHub places the annotation on a line of the .ipynb file: give the line
            # in the notebook's JSON (or none), and the cell's own line in the message.
            span = notebooks.region(f)
            where = f"cell {f.cell}, line {f.line}, col {f.column}: "
        props = f"file={_escape_prop(f.path)},"
        if span is not None:
            props += f"line={span[0]},col={span[1]},endLine={span[2]},endColumn={span[3]},"
        props += f"title={_escape_prop(f'{f.code} {f.name}')}"
        notes = "".join(f"; {r.message} at line {r.line}" for r in f.related if r.cell is None)
        out.append(f"::{level} {props}::{_escape_data(where + f.code + ' ' + f.message + notes)}\n")
    return "".join(out)
