"""What ``assert_finite_grads`` keeps while its steps run, read after them: the losses as
0-d tensors, where the record is cut (the first failing step), and how that step is put
back to be rerun. No torch at import."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from trainlint.testing._common import loss_value

if TYPE_CHECKING:
    from trainlint._runtime.recorder import GradRecorder
    from trainlint._runtime.steps import StepRunner


def cut(
    recorder: GradRecorder,
    losses: list[float | None],
    stopped_at: int | None,
    raised: tuple[int, Exception] | None,
    locating: bool,
) -> tuple[int, int | None]:
    """(steps the check counts as run, the step stopped inside backward or None): the
    first of a non-finite gradient from backward (locating), a step stopped by its own
    anomaly detection, a non-finite loss; a step that raised before any of them raises."""
    __tracebackhide__ = True
    isfinite = math.isfinite
    first_grad = None
    if locating:
        assigned = recorder.assigned
        first_grad = next(
            (
                step
                for step, i, v in recorder.events
                if v is not None and not isfinite(v) and (step, i) not in assigned
            ),
            None,
        )
    first_loss = next((i for i, v in enumerate(losses) if v is not None and not isfinite(v)), None)
    stop = min((s for s in (first_grad, stopped_at) if s is not None), default=None)
    if stop is not None and (first_loss is None or stop <= first_loss):
        return stop + 1, stop
    if first_loss is not None and (raised is None or first_loss < raised[0]):
        return first_loss + 1, None
    if raised is not None:
        raise raised[1]
    return len(losses), None


class Rewind:
    """Puts back what a stopped step began with (its parameters; its batch), and gives
    what reruns it."""

    def __init__(self, run: StepRunner, starts: Any, step: int, last: int, batch: Any) -> None:
        self.run, self.starts, self.step, self.last, self.batch = run, starts, step, last, batch

    def __call__(self) -> Rewind:
        # this step's copy is the last one taken, or the one kept for an earlier step; no
        # copy: the step was stopped inside backward, its parameters untouched
        if self.starts is not None:
            self.starts.restore(kept=self.step < self.last)
            self.starts.release()
        return self

    def again(self) -> Any:
        return self.run.again_with(self.batch)


def loss_later(torch: Any, out: Any) -> Any:
    """What :func:`loss_value` reads from a step's return, without reading it: a 0-d
    tensor (a copy: the step may reuse its tensor), a float, or None."""
    if isinstance(out, (tuple, list)) and out:
        out = out[0]
    elif isinstance(out, dict) and "loss" in out:
        out = out["loss"]
    if not isinstance(out, torch.Tensor) or out.is_complex():
        return loss_value(out)  # a number, None, or loss_value's own error
    n = out.numel()
    if n == 0:
        return None
    detached = out.detach()
    if n > 1:
        return detached.float().mean()
    return detached.clone() if detached.dim() == 0 else detached.reshape(()).clone()


def read_losses(torch: Any, losses: list[Any]) -> list[float | None]:
    """The losses as floats: the tensors in one host read per device and dtype."""
    groups: dict[tuple[Any, Any], list[int]] = {}
    for i, v in enumerate(losses):
        if isinstance(v, torch.Tensor):
            groups.setdefault((v.device, v.dtype), []).append(i)
    out = list(losses)
    for indices in groups.values():
        picked = [losses[i] for i in indices]
        read = picked[0].reshape(1).tolist() if len(picked) == 1 else torch.stack(picked).tolist()
        for i, number in zip(indices, read, strict=True):
            out[i] = float(number)
    return out
