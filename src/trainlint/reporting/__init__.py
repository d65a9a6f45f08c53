"""Output formats. Each formatter turns a run's findings into text for stdout."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from trainlint.findings import Finding

if TYPE_CHECKING:
    from trainlint.rules.base import Rule

Formatter = Callable[[Sequence[Finding], "Sequence[type[Rule]]"], str]


def builtin_formats() -> dict[str, Formatter]:
    from trainlint.reporting import github, jsonfmt, sarif, text

    return {
        "concise": text.concise,
        "full": text.full,
        "json": jsonfmt.format_json,
        "sarif": sarif.format_sarif,
        "github": github.format_github,
    }


def location(f: Finding) -> str:
    if f.cell is not None:
        return f"{f.path}:cell {f.cell}:{f.line}:{f.column}"
    return f"{f.path}:{f.line}:{f.column}"
