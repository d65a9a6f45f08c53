"""Failure messages: aligned tables, the static rules that explain a symptom, lint findings.

This is the reporting half of every check (its measuring and diagnosing live in the check's
module). No torch here: a message is built from plain numbers the checks have already
measured, and rule names and messages come from the rule registry (:mod:`.links`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from trainlint._runtime.links import Explanation, Symptom

_MAX_ROWS = 40
_MAX_CELL = 70


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, indent: str = "  ") -> str:
    """Render rows as left-aligned columns under a dashed header; long tables are cut."""
    all_rows = [[_cell(v) for v in row] for row in rows]
    shown = all_rows[:_MAX_ROWS]
    widths = [len(h) for h in headers]
    for row in shown:
        for i, value in enumerate(row):
            widths[i] = max(widths[i], len(value))
    lines = [
        indent + "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip(),
        indent + "  ".join("-" * w for w in widths),
    ]
    lines += [
        indent + "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
        for row in shown
    ]
    if len(all_rows) > len(shown):
        lines.append(f"{indent}... and {len(all_rows) - len(shown)} more")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    text = value if isinstance(value, str) else fmt(value)
    return text if len(text) <= _MAX_CELL else text[: _MAX_CELL - 3] + "..."


def fmt(value: Any) -> str:
    """A short human form of a measurement."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        if value == 0.0:
            return "0"
        if 1e-3 <= abs(value) < 1e5:
            return f"{value:.4g}"
        return f"{value:.3e}"
    if isinstance(value, tuple):
        return "(" + ", ".join(str(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return str(value)


def fmt_bytes(n: float) -> str:
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def symptom_texts(symptoms: Iterable[Symptom]) -> list[str]:
    """The symptoms' explanatory paragraphs, each once, in order."""
    return list(dict.fromkeys(s.text for s in symptoms if s.text))


def rules_section(check: str, explanation: Explanation) -> str:
    """The rules a failure names: those it confirms, then those it only points to.

    Names and messages are the rules' own (``Rule.name``, ``Rule.message``).
    """
    from trainlint._runtime.links import rule_info

    confirmed = [rule_info(c) for c in explanation.rules]
    related = [rule_info(c) for c in explanation.see_also]
    infos = [i for i in [*confirmed, *related] if i is not None]
    if not infos:
        return ""
    width = max(len(f"{i.code} {i.name}") for i in infos)

    def line(code: str, name: str, why: str) -> str:
        return f"  {f'{code} {name}'.ljust(width)}  {why}"

    lines = []
    if explanation.rules:
        lines.append("Static rules that explain this symptom (`trainlint rule CODE` for details):")
        lines += [line(i.code, i.name, i.message) for i in confirmed if i is not None]
    if related:
        lines.append(
            "See also (related rules this failure does not confirm; [the check that does]):"
            if explanation.rules
            else "Related static rules (this failure does not confirm them; [the check that "
            "does]; `trainlint rule CODE` for details):"
        )
        for i in related:
            if i is not None:
                by = f" [{i.confirm_with}]" if i.confirm_with not in (None, check) else ""
                lines.append(line(i.code, i.name, i.message + by))
    return "\n".join(lines)


def _explain(check: str, symptoms: Sequence[Symptom]) -> Explanation:
    from trainlint._runtime.links import Explanation, explain

    try:
        return explain(check, symptoms)
    except Exception:  # noqa: BLE001 - a broken rule registry must not mask the failure
        return Explanation()


def fail(
    check: str,
    headline: str,
    sections: Sequence[str],
    *,
    symptoms: Sequence[Symptom] = (),
    sources: Sequence[Callable[..., Any]] = (),
    result: Any = None,
) -> NoReturn:
    """Raise :class:`trainlint.testing.CheckFailed` with a message built from the parts.

    ``symptoms`` are what the check's diagnosis found; the rules that explain them and name
    ``check`` in their ``confirm_with`` become ``CheckFailed.rules``. ``sources`` are the
    user's callables (the step, a scheduler factory) whose lines are linted; the lint
    section is left out when the linter or the source is unavailable.
    """
    __tracebackhide__ = True
    from trainlint._runtime.lintlink import findings_section
    from trainlint.testing import CheckFailed

    explanation = _explain(check, symptoms)
    parts = [f"{check}: {headline}"]
    parts += [s for s in sections if s]
    parts.append(rules_section(check, explanation))
    if sources:
        parts.append(findings_section(sources, [*explanation.rules, *explanation.see_also]))
    message = "\n\n".join(p for p in parts if p)
    raise CheckFailed(message, check=check, rules=explanation.rules, result=result)
