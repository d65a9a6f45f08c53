"""``assert_lr_schedule``: the learning-rate schedule never starts at 0, hits 0 or restarts."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, overload

from trainlint._runtime.guard import DEFAULT_TIMEOUT, guarded
from trainlint._runtime.links import Symptom
from trainlint._runtime.report import fail, fmt, symptom_texts, table
from trainlint.testing._common import plural

CHECK = "assert_lr_schedule"

_WRONG_UNIT = (
    "A schedule measured in epochs (StepLR, CosineAnnealingLR, "
    "CosineAnnealingWarmRestarts' T_0, a lambda over epochs, or a hand-written "
    "`step / num_epochs` stored into param_groups) advanced once per batch "
    "runs through its length in a fraction of the training, then restarts or "
    "stalls. Step it once per epoch, or size it in batches."
)

SYMPTOMS = {
    "first-lr-zero": Symptom(("TL203", "TL204")),
    "lr-negative": Symptom(("TL201", "TL207"), text=_WRONG_UNIT),
    "lr-reaches-zero": Symptom(("TL201", "TL207"), text=_WRONG_UNIT),
    "lr-restarts": Symptom(("TL201", "TL205", "TL207"), text=_WRONG_UNIT),
    "below-min-lr": Symptom(("TL201", "TL207"), text=_WRONG_UNIT),
}


@dataclass(frozen=True)
class LRTrace(Sequence[float]):
    """The learning rate each optimizer update used: ``trace[i]`` is step ``i``'s LR.

    ``built``: the qualified class names of the schedulers the factory built (the
    children of a ``SequentialLR`` or ``ChainedScheduler`` after it), by which the
    confirmation report matches a failure to the findings about those schedulers.
    """

    lrs: tuple[float, ...]
    built: tuple[str, ...] = ()

    @overload
    def __getitem__(self, index: int) -> float: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[float]: ...

    def __getitem__(self, index: int | slice) -> float | Sequence[float]:
        return self.lrs[index]

    def __len__(self) -> int:
        return len(self.lrs)

    def __iter__(self) -> Iterator[float]:
        return iter(self.lrs)


@guarded(CHECK)
def assert_lr_schedule(
    scheduler_factory: Callable[[Any], Any],
    *,
    steps: int,
    base_lr: float = 1.0,
    warmup: int = 0,
    min_lr: float | None = None,
    restarts: bool = False,
    timeout: float | None = DEFAULT_TIMEOUT,
) -> LRTrace:
    """The learning-rate schedule has no zero start, no zero or negative LR, no restarts.

    Builds a throwaway SGD optimizer over one dummy parameter with ``lr=base_lr``, calls
    ``scheduler_factory(optimizer)``, then ``optimizer.step(); scheduler.step()`` ``steps``
    times: as many times as the training loop really does (epochs x batches when the loop
    steps the scheduler per batch). ``trace[i]`` is the LR update ``i`` used. Checks: the
    first update's LR is not 0; no LR after ``warmup`` is 0 and none is negative; the LR
    does not increase after ``warmup`` unless ``restarts=True``; the last LR is at least
    ``min_lr``. Fails showing where the trace breaks the rule.
    """
    __tracebackhide__ = True
    from trainlint._runtime.arguments import check_count

    check_count("steps", steps, 1)
    check_count("warmup", warmup, 0)
    trace = _measure(scheduler_factory, steps, base_lr)
    problems = _diagnose(trace.lrs, warmup, min_lr, restarts)
    if not problems:
        return trace
    _report(problems, trace, base_lr, scheduler_factory)


def _measure(scheduler_factory: Callable[[Any], Any], steps: int, base_lr: float) -> LRTrace:
    """The LR of each of ``steps`` updates of a throwaway optimizer under the schedule."""
    __tracebackhide__ = True
    import torch

    if not callable(scheduler_factory):
        raise TypeError(
            "scheduler_factory must build a scheduler from an optimizer (e.g. "
            f"`lambda opt: StepLR(opt, ...)`), got {type(scheduler_factory).__name__}"
        )
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=base_lr)
    scheduler = scheduler_factory(optimizer)
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        raise TypeError(
            "ReduceLROnPlateau follows a metric, not the step count; assert_lr_schedule "
            "checks schedules that depend only on how often step() is called"
        )
    if not callable(getattr(scheduler, "step", None)):
        raise TypeError(
            f"scheduler_factory must return a scheduler, got {type(scheduler).__name__}"
        )
    built = [scheduler, *getattr(scheduler, "_schedulers", ())]
    names = tuple(dict.fromkeys(f"{type(b).__module__}.{type(b).__qualname__}" for b in built))
    lrs: list[float] = []
    for _ in range(steps):
        lrs.append(float(optimizer.param_groups[0]["lr"]))
        optimizer.step()
        scheduler.step()
    return LRTrace(tuple(lrs), names)


def _diagnose(
    lrs: Sequence[float], warmup: int, min_lr: float | None, restarts: bool
) -> list[tuple[int, str, str]]:
    """(step, what is wrong there, symptom) for each rule the trace breaks, in check order."""
    steps = len(lrs)
    problems: list[tuple[int, str, str]] = []
    if lrs[0] == 0.0:
        zeros = _run_length(lrs, 0, lambda v: v == 0.0)
        stays = "for every step" if zeros == len(lrs) else f"until step {zeros}"
        problems.append((0, f"the first update uses LR 0 (it stays 0 {stays})", "first-lr-zero"))
    negative = next((i for i, v in enumerate(lrs) if v < 0 or math.isnan(v)), None)
    if negative is not None:
        problems.append(
            (negative, f"the LR is {fmt(lrs[negative])} at step {negative}", "lr-negative")
        )
    if lrs[0] == 0.0:
        # a schedule that starts at 0 and rises is warming up, whatever ``warmup`` says:
        # its rise is not a restart (the first problem already says it starts at 0)
        rise = 1
        while rise < steps and not _increases(lrs[rise], lrs[rise - 1]):
            rise += 1
        warmup = max(warmup, rise - 1)
    ups = (
        [] if restarts else [i for i in range(warmup + 1, steps) if _increases(lrs[i - 1], lrs[i])]
    )
    zero_late = next((i for i in range(max(warmup, 1), steps) if lrs[i] == 0.0), None)
    if zero_late is not None and lrs[0] != 0.0 and not any(u > zero_late for u in ups):
        problems.append(
            (
                zero_late,
                f"the LR reaches 0 at step {zero_late} of {steps}: the schedule is "
                "shorter than the training",
                "lr-reaches-zero",
            )
        )
    if ups:
        i = ups[0]
        more = (
            f" (and at {plural(len(ups) - 1, 'more step')}: "
            + ", ".join(str(u) for u in ups[1:6])
            + (", ..." if len(ups) > 6 else "")
            + ")"
            if len(ups) > 1
            else ""
        )
        # reaching 0 and rising again is the restart, not a schedule that ran out
        at_zero = f", after reaching 0 at step {zero_late}" if zero_late is not None else ""
        problems.append(
            (
                i,
                f"restarts at step {i}: {fmt(lrs[i - 1])} \u2192 {fmt(lrs[i])}{at_zero}{more}",
                "lr-restarts",
            )
        )
    if min_lr is not None and lrs[-1] < min_lr * (1 - 1e-9):
        problems.append(
            (
                len(lrs) - 1,
                f"the last LR {fmt(lrs[-1])} is below min_lr={fmt(float(min_lr))}",
                "below-min-lr",
            )
        )
    return problems


def _report(
    problems: list[tuple[int, str, str]],
    trace: LRTrace,
    base_lr: float,
    scheduler_factory: Callable[[Any], Any],
) -> NoReturn:
    __tracebackhide__ = True
    lrs = trace.lrs
    # the first step at the peak (or lowest), not one that rounding lifted by 1e-16
    top, bottom = max(lrs), min(lrs)
    peak = next(i for i, v in enumerate(lrs) if v >= top - abs(top) * 1e-9)
    low = lrs.index(bottom)
    symptoms = [SYMPTOMS[key] for _, _, key in problems]
    sections = [
        "\n".join(f"- {text}" for _, text, _ in problems) if len(problems) > 1 else "",
        f"LR trace over {len(lrs)} steps (base_lr={fmt(float(base_lr))}): starts at "
        f"{fmt(lrs[0])}, peaks at {fmt(lrs[peak])} (step {peak}), lowest {fmt(lrs[low])} "
        f"(step {low}), ends at {fmt(lrs[-1])}.",
        _trace_window(lrs, problems[0][0]),
        *symptom_texts(symptoms),
    ]
    fail(
        CHECK,
        problems[0][1],
        sections,
        symptoms=symptoms,
        sources=[scheduler_factory],
        result=trace,
    )


def _increases(before: float, after: float) -> bool:
    # Chained schedulers recompute the LR by multiplication; ignore rounding noise.
    return after > before * (1 + 1e-9) + 1e-15


def _run_length(values: Sequence[float], start: int, pred: Callable[[float], bool]) -> int:
    i = start
    while i < len(values) and pred(values[i]):
        i += 1
    return i - start


def _trace_window(lrs: Sequence[float], at: int) -> str:
    lo, hi = max(0, at - 3), min(len(lrs), at + 4)
    rows = [(i, fmt(lrs[i]), "<-" if i == at else "") for i in range(lo, hi)]
    return table(("step", "lr", ""), rows)
