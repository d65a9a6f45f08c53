"""``assert_loss_decreases``: the step can overfit one batch."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from trainlint._runtime.guard import DEFAULT_TIMEOUT, guarded
from trainlint._runtime.links import Symptom
from trainlint._runtime.report import fail, fmt, table
from trainlint.testing._common import Step, loss_value

CHECK = "assert_loss_decreases"

SYMPTOMS = {
    "loss-not-finite": Symptom(
        ("TL602", "TL601", "TL604"),
        text="The loss is not finite; assert_finite_grads(locate=True) names the op that "
        "produced it.",
    ),
    "loss-never-changes": Symptom(
        ("TL203", "TL204", "TL102", "TL107", "TL501", "TL108", "TL105"),
        text="No update reached the model: the learning rate is 0 (a warmup that starts at 0, "
        "a scheduler never stepped), zero_grad() runs between backward() and step(), or "
        "the step trains another copy of the model or detaches the loss.",
    ),
    "loss-rises": Symptom(
        ("TL103", "TL109", "TL104"),
        text="Training diverges on a single batch: gradients that are never cleared pile up, "
        "an accumulated loss is not scaled, or the learning rate is too high.",
    ),
    # Clipping scaled gradients (TL601), a double softmax (TL602) and a double sigmoid
    # (TL605) train, but crawl.
    "loss-falls-too-slowly": Symptom(
        ("TL203", "TL204", "TL108", "TL107", "TL102", "TL602", "TL605", "TL601"),
        text="The model learns too slowly to overfit one batch: a tiny or zero learning rate "
        "for part of training, part of the model cut off from the loss, or parameters "
        "missing from the optimizer.",
    ),
}


@dataclass(frozen=True)
class LossResult:
    """The losses the step returned, in order."""

    losses: tuple[float, ...]

    @property
    def first(self) -> float:
        return self.losses[0]

    @property
    def last(self) -> float:
        return self.losses[-1]


@guarded(CHECK)
def assert_loss_decreases(
    step: Step,
    *,
    steps: int = 20,
    factor: float = 0.5,
    batches: Iterable[Any] | None = None,
    timeout: float | None = DEFAULT_TIMEOUT,
) -> LossResult:
    """Overfitting one batch works: after ``steps`` steps the loss fell to ``factor`` of
    the first loss (for a negative loss: by ``1 - factor`` of its magnitude).

    The step must return the loss (a tensor or a number). Close over one batch, or pass
    ``batches=[batch]``.
    """
    __tracebackhide__ = True
    from trainlint._runtime.arguments import check_count
    from trainlint._runtime.steps import StepRunner

    check_count("steps", steps, 2)
    if not 0.0 < factor < 1.0:
        raise ValueError(f"factor must be between 0 and 1, got {factor!r}")
    run = StepRunner(step, batches, check=CHECK)
    result = _measure(run, steps)
    target = result.first - (1.0 - factor) * abs(result.first)
    if math.isfinite(result.last) and result.last <= target:
        return result
    _report(result, steps, factor, target, step)


def _measure(run: Any, steps: int) -> LossResult:
    """The loss of each step, stopping at the first one that is not finite."""
    __tracebackhide__ = True
    losses: list[float] = []
    for i in range(steps):
        value = loss_value(run())
        if value is None:
            raise TypeError(
                "assert_loss_decreases needs the step to return the loss; "
                f"step {i} returned no number or tensor"
            )
        losses.append(value)
        if not math.isfinite(value):
            break
    return LossResult(tuple(losses))


def _diagnose(losses: Sequence[float]) -> str:
    """Which way a loss that did not fall enough went wrong."""
    first, last = losses[0], losses[-1]
    if not math.isfinite(last):
        return "loss-not-finite"
    if all(v == first for v in losses):
        return "loss-never-changes"
    if last > first:
        return "loss-rises"
    return "loss-falls-too-slowly"


def _report(result: LossResult, steps: int, factor: float, target: float, step: Step) -> NoReturn:
    __tracebackhide__ = True
    losses = result.losses
    first, last = result.first, result.last
    symptom = _diagnose(losses)
    headline = {
        "loss-not-finite": f"the loss became {last} at step {len(losses) - 1}",
        "loss-never-changes": f"the loss never changed in {steps} steps (stays {fmt(first)})",
        "loss-rises": f"the loss rose from {fmt(first)} to {fmt(last)} in {steps} steps",
        "loss-falls-too-slowly": f"the loss went from {fmt(first)} to {fmt(last)} in {steps} "
        f"steps; expected at most {fmt(target)} (factor {factor})",
    }[symptom]
    fail(
        CHECK,
        headline,
        [_loss_table(losses), SYMPTOMS[symptom].text],
        symptoms=[SYMPTOMS[symptom]],
        sources=[step],
        result=result,
    )


def _loss_table(losses: Sequence[float]) -> str:
    n = len(losses)
    picks = sorted({0, 1, 2, n // 4, n // 2, (3 * n) // 4, n - 2, n - 1} & set(range(n)))
    return table(("step", "loss"), [(i, fmt(losses[i])) for i in picks])
