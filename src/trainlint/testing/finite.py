"""``assert_finite_grads``: no NaN or Inf in any gradient or in the loss."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NoReturn

from trainlint._runtime.guard import DEFAULT_TIMEOUT, guarded
from trainlint._runtime.links import Symptom
from trainlint._runtime.nonfinite import Facts, locate_nonfinite
from trainlint._runtime.report import fail, fmt, table
from trainlint.testing._common import (
    Step,
    first_device,
    model_step_runner,
    named_parameters,
    runtime,
    trainable,
)
from trainlint.testing._finite_record import (
    Rewind,
    cut,
    loss_later,
    read_losses,
    returned_later,
    with_returned,
)

if TYPE_CHECKING:
    import torch

    from trainlint._runtime.recorder import GradRecorder
    from trainlint._runtime.steps import StepRunner

CHECK = "assert_finite_grads"

SYMPTOMS = {
    "non-finite": Symptom(("TL602", "TL601", "TL604", "TL603", "TL503")),
    "forward-non-finite": Symptom(
        ("TL602", "TL503"),
        text="The loss (or a value the step returned) was NaN or Inf: an op in the forward pass "
        "overflowed or left its domain (exp of a large value, log or sqrt of 0 or less, a "
        "division by 0, a softmax of a row all -inf), or the batch held NaN. Clamp its "
        "input or use a stable form (logsumexp, log_softmax, "
        "binary_cross_entropy_with_logits), and check the data.",
    ),
}


@dataclass(frozen=True)
class FiniteGradsResult:
    """What :func:`assert_finite_grads` measured; ``losses`` holds what the step returned."""

    steps: int
    max_abs: dict[str, tuple[float | None, ...]]
    losses: tuple[float | None, ...]


@guarded(CHECK)
def assert_finite_grads(
    model: torch.nn.Module,
    step: Step,
    *,
    steps: int = 1,
    locate: bool = True,
    batches: Iterable[Any] | None = None,
    timeout: float | None = DEFAULT_TIMEOUT,
) -> FiniteGradsResult:
    """No NaN or Inf in any gradient, nor in the loss when the step returns it.

    On failure names the first parameter (in backward order: the one nearest the loss) and
    the step where a non-finite gradient appeared. Nothing is read on the host while the
    steps run (on a GPU each read is a sync; the CPU takes the same path): the gradients
    are recorded on the device and read after the last step, so the steps after a failing
    one run too. With ``locate=True`` the first step whose backward made a non-finite
    gradient is then rerun from a copy of what it began with (the trainable parameters,
    copied on their device at the end of the first backward that made one and of no
    other; the module's buffers, copied as each step begins; not the optimizer's state:
    the rerun stops inside ``backward()``), with the same batch and random state, under
    ``torch.autograd.detect_anomaly()``, to name the backward op that produced it (e.g.
    ``LogBackward0``) and the forward line that created that op; the parameters and
    buffers are left as that step found them. ``locate=False`` only records.
    """
    __tracebackhide__ = True
    run = model_step_runner(CHECK, model, step, steps, batches)
    # locate: every parameter, for the first one's device (one walk, not two)
    every = named_parameters(model) if locate else None
    named = trainable(model, walked=every)
    device = first_device(model, every) if every is not None else None
    # locate: the buffers too (a BatchNorm's statistics), copied with the parameters
    buffers = list(model.buffers()) if every is not None else []
    measured = _measure(run, named, buffers, steps, device)
    first = _diagnose(measured, named)
    if first is None and not measured.bad_losses and measured.stopped_at is None:
        return measured.result
    _report(measured, named, first, run, locate, step)


@dataclass
class _Measured:
    result: FiniteGradsResult
    recorder: GradRecorder
    stopped_at: int | None
    rng: Any
    device: torch.device | None  # None: not located
    keys: dict[int, str] = field(default_factory=dict)
    rewind: Any = None  # puts the stopped step's start back: returns what reruns it

    @property
    def bad_losses(self) -> list[tuple[int, float]]:
        return [
            (i, v)
            for i, v in enumerate(self.result.losses)
            if v is not None and not math.isfinite(v)
        ]


def _measure(
    run: StepRunner,
    named: list[tuple[str, torch.Tensor]],
    buffers: list[torch.Tensor],
    steps: int,
    device: torch.device | None,
) -> _Measured:
    """Run the steps, recording each gradient's largest magnitude and each loss on the
    device, read once after the last step; then cut the record at the first step with a
    non-finite loss or (when locating, i.e. given the model's ``device``) gradient, as if
    the check had stopped there: inside that step's backward for a gradient."""
    __tracebackhide__ = True
    from trainlint._runtime.first_failure import FirstFailure

    rt = runtime()
    torch = rt.torch
    # locating: what each step began with (parameters, buffers, random state, batch), kept
    # for the first step whose backward made a NaN or Inf, to rerun it after the last step
    starts = None
    if device is not None:
        starts = FirstFailure([p for _, p in named], buffers, steps)
    ended = None if starts is None else starts.backward_ended
    recorder = rt.GradRecorder([p for _, p in named], backward_ended=ended)
    losses: list[Any] = []  # what each step returned, as a 0-d tensor or a number
    returned: list[list[tuple[str, Any]]] = []  # the other returned values' flags
    keys: dict[int, str] = {}  # step -> the returned key holding NaN/Inf (not the loss)
    rngs: list[Any] = []
    batches: list[Any] = []
    stopped_at: int | None = None
    raised: tuple[int, Exception] | None = None
    try:
        with recorder:
            for i in range(steps):
                if starts is not None and device is not None:
                    rngs.append(_rng_state(torch, device))
                    starts.begin_step(i)
                recorder.begin_step(i)
                try:
                    out = run()
                except Exception as error:
                    # The user's own anomaly detection stopped backward at a NaN first.
                    if isinstance(error, RuntimeError) and re.search(
                        r"Function '\w+' returned nan values", str(error)
                    ):
                        stopped_at = i
                    else:  # a NaN of an earlier step may be why: known once read
                        raised = (i, error)
                    break
                finally:
                    batches.append(run.last_batch)
                recorder.end_step()
                losses.append(loss_later(torch, out))
                returned.append(returned_later(torch, out))
                del out
                if starts is not None and i < steps - 1:
                    starts.end_step()
        numbers = with_returned(torch, read_losses(torch, losses), returned, keys)
        ran, stopped_at = cut(recorder, numbers, stopped_at, raised, device is not None)
        if stopped_at is None and starts is not None:
            starts.release()
            starts = None
    except BaseException:
        if starts is not None:
            starts.release()
        raise
    if ran < len(batches):  # stopped before the last step begun
        recorder.truncate(ran)
    per_step = recorder.table(ran)
    per_param = zip(*per_step, strict=True) if ran else (() for _ in named)
    result = FiniteGradsResult(
        steps=ran,
        max_abs={n: tuple(values) for (n, _), values in zip(named, per_param, strict=True)},
        losses=tuple(numbers[: ran - (stopped_at is not None)]),
    )
    rewind = None
    if stopped_at is not None and device is not None:
        rewind = Rewind(run, starts, stopped_at, batches[stopped_at])
    rng = rngs[stopped_at] if stopped_at is not None and rngs else None
    return _Measured(result, recorder, stopped_at, rng, device, keys, rewind)


def _diagnose(measured: _Measured, named: list[tuple[str, torch.Tensor]]) -> tuple[int, str] | None:
    """(step, parameter) of the first non-finite gradient, in the order backward made them."""
    isfinite = math.isfinite
    if all(v is None or isfinite(v) for vs in measured.result.max_abs.values() for v in vs):
        return None  # each step's entry is its largest |grad|, NaN winning: nothing to find
    events = measured.recorder.events
    numbers = measured.recorder.numbers()
    seen = [(s, j) for s, j, v in events if v is not None]
    for (step_i, index), number in zip(seen, numbers, strict=True):
        if not math.isfinite(number):
            return step_i, named[index][0]
    return None


def _report(
    measured: _Measured,
    named: list[tuple[str, torch.Tensor]],
    first: tuple[int, str] | None,
    run: StepRunner,
    locate: bool,
    step: Step,
) -> NoReturn:
    __tracebackhide__ = True
    import torch

    result = measured.result
    rows = []
    for name, param in named:
        for i, value in enumerate(result.max_abs[name]):
            if value is not None and not math.isfinite(value):
                rows.append((name, tuple(param.shape), i, value))
    sections = []
    if first is not None:
        step_i, name = first
        value = result.max_abs[name][step_i]
        what = "NaN" if value is None or value != value else "Inf"
        headline = f"{what} gradient in `{name}` at step {step_i}"
        sections.append(
            f"First non-finite ({what}) gradient: `{name}` "
            f"{fmt(tuple(dict(named)[name].shape))} "
            f"at step {step_i} (the first parameter backward reached, so the nearest the loss)."
        )
        if rows:
            sections.append(table(("parameter", "shape", "step", "max |grad|"), rows))
    elif measured.bad_losses:
        step_i, value = measured.bad_losses[0]
        key = measured.keys.get(step_i)
        headline = (
            f"the step returned {value} under {key} at step {step_i}"
            if key
            else f"the loss is {value} at step {step_i}"
        )
    else:  # the step's own anomaly detection stopped backward before a gradient was stored
        headline = f"NaN in backward at step {measured.stopped_at}, stopped by anomaly detection"
    if measured.bad_losses:
        sections.append(
            "Loss per step: " + ", ".join(f"{i}: {fmt(v)}" for i, v in enumerate(result.losses))
        )
    facts = Facts()
    if locate and measured.stopped_at is not None:
        rerun = measured.rewind() if measured.rewind is not None else run
        text, facts = locate_nonfinite(torch, rerun, measured.rng)
        sections.append(text)
        if facts.loss is not None and first is not None:
            headline += f": the forward pass made the loss {facts.loss}"
    elif locate:
        sections.append(
            "Not located: the step was not stopped inside backward() (the gradient was "
            "assigned directly, or only the loss is non-finite)."
        )
    else:
        sections.append("Rerun with locate=True to name the backward op that produced it.")
    forward = facts.loss is not None or (first is None and bool(measured.bad_losses))
    symptom = SYMPTOMS["forward-non-finite" if forward else "non-finite"]
    # only the rules whose preconditions the rerun saw (a GradScaler, autocast, ...)
    symptom = replace(symptom, explained_by=tuple(filter(facts.holds, symptom.explained_by)))
    fail(
        CHECK,
        headline,
        [*sections, symptom.text],
        symptoms=[symptom],
        sources=[step],
        result=result,
    )


def _rng_state(torch: Any, device: torch.device) -> tuple[Any, Any]:
    cuda_state = None
    if device.type == "cuda":
        cuda_state = torch.cuda.get_rng_state_all()
    return torch.get_rng_state(), cuda_state
