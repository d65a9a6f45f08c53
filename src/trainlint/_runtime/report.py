"""Failure messages: aligned tables, the static rules that explain a symptom, lint findings.

No torch here: a message is built from plain numbers the checks have already measured.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NoReturn

# Names as in the rule catalog; each line says how the rule shows up at runtime, which is
# what a reader of a failing check needs (the rule pages say the rest).
RULES: dict[str, tuple[str, str]] = {
    "TL101": ("grad-norm-after-zero-grad", "gradients read after zero_grad() are always 0"),
    "TL102": ("zero-grad-before-step", "zero_grad() between backward() and step(): no update"),
    "TL103": ("missing-zero-grad", "gradients are never cleared and pile up across steps"),
    "TL104": ("step-before-backward", "step() runs before backward(): stale or no gradients"),
    "TL105": ("backward-under-no-grad", "the loss was computed under no_grad/inference_mode"),
    "TL106": ("unregistered-submodules", "modules kept in a plain list/dict are invisible"),
    "TL107": (
        "optimizer-on-stale-params",
        "the model was replaced after the optimizer was built; it updates orphaned tensors",
    ),
    "TL108": ("graph-broken-loss", "the loss was cut from the graph (.detach(), .item(), .data)"),
    "TL201": (
        "scheduler-unit-mismatch",
        "an epoch schedule stepped per batch (or the reverse) restarts or stalls",
    ),
    "TL202": ("scheduler-before-optimizer", "scheduler.step() before optimizer.step()"),
    "TL203": ("warmup-starts-at-zero", "the warmup multiplier is 0 at step 0"),
    "TL204": ("scheduler-never-stepped", "the LR stays frozen at its first value"),
    "TL205": ("scheduler-step-with-epoch", "scheduler.step(i) with a batch counter jumps"),
    "TL301": ("retain-graph-in-loop", "backward(retain_graph=True) keeps every graph's buffers"),
    "TL302": (
        "graph-accumulation",
        "a loss/output with history is accumulated (total += loss, losses.append(loss))",
    ),
    "TL303": ("eval-without-no-grad", "evaluation outside no_grad() builds graphs nobody frees"),
    "TL304": ("tensor-kept-on-self", "a tensor with history is stored on an object"),
    "TL305": ("allocator-call-in-loop", "empty_cache()/gc.collect() each step cost time"),
    "TL401": ("host-sync-in-loop", ".item()/.cpu()/print(t) each step waits for the GPU"),
    "TL402": ("synchronize-in-loop", "torch.cuda.synchronize() each step"),
    "TL403": ("anomaly-detection-enabled", "anomaly detection slows every step"),
    "TL501": (
        "module-sent-to-remote",
        "a Ray remote/actor trains a copy; the caller's model never changes",
    ),
    "TL502": (
        "module-sent-to-process",
        "a forked process trains a copy; the parent's model never changes",
    ),
    "TL503": ("unlocked-shared-model", "threads run forward/backward/step on one shared model"),
    "TL601": ("clip-before-unscale", "clipping scaled gradients (GradScaler)"),
    "TL602": ("softmax-into-cross-entropy", "log of a softmax underflows to -inf, then NaN"),
    "TL604": ("scaler-step-bypassed", "optimizer.step() skips GradScaler's inf/NaN check"),
}

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


def rules_section(codes: Sequence[str]) -> str:
    """The 'static rules that explain this symptom' block, in the order given."""
    known = [c for c in dict.fromkeys(codes) if c in RULES]
    if not known:
        return ""
    width = max(len(f"{c} {RULES[c][0]}") for c in known)
    lines = ["Static rules that explain this symptom (`trainlint rule CODE` for details):"]
    for code in known:
        name, why = RULES[code]
        lines.append(f"  {f'{code} {name}'.ljust(width)}  {why}")
    return "\n".join(lines)


def fail(
    check: str,
    headline: str,
    sections: Sequence[str],
    *,
    rules: Sequence[str] = (),
    sources: Sequence[Callable[..., Any]] = (),
    result: Any = None,
) -> NoReturn:
    """Raise :class:`trainlint.testing.CheckFailed` with a message built from the parts.

    ``sources`` are the user's callables (the step, a scheduler factory) whose lines are
    linted; the lint section is left out when the linter or the source is unavailable.
    """
    __tracebackhide__ = True
    from trainlint._runtime.lintlink import findings_section
    from trainlint.testing import CheckFailed

    parts = [f"{check}: {headline}"]
    parts += [s for s in sections if s]
    parts.append(rules_section(rules))
    if sources:
        parts.append(findings_section(sources))
    message = "\n\n".join(p for p in parts if p)
    raise CheckFailed(message, check=check, rules=tuple(rules), result=result)
