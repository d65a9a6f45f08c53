"""What ``assert_finite_grads`` keeps while its steps run, read after them: the losses as
0-d tensors, where the record is cut (the first failing step), and how that step is put
back to be rerun. No torch at import."""

from __future__ import annotations

import math
from collections.abc import Iterator
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
    """Puts back what a stopped step began with (its parameters and buffers; its batch),
    and gives what reruns it."""

    def __init__(self, run: StepRunner, starts: Any, step: int, batch: Any) -> None:
        self.run, self.starts, self.step, self.batch = run, starts, step, batch

    def __call__(self) -> Rewind:
        # the copy kept for the first failing step (see FirstFailure)
        if self.starts is not None:
            self.starts.restore(self.step)
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


def returned_later(torch: Any, out: Any) -> list[tuple[str, Any]]:
    """Everything else a step returned (every key of a dict, every item of a tuple or list,
    one level down too), as (key, flag) without reading it: a number that is NaN or Inf
    as itself, a floating tensor as a 0-d code on its device (2 NaN, 1 Inf, 0 finite). A
    step returning ``{"total_loss": nan}`` has no ``loss`` key, and its NaN must still
    fail the check."""
    if not isinstance(out, (dict, tuple, list)):
        return []  # the loss itself, read with the losses
    primary = out.get("loss") if isinstance(out, dict) else (out[0] if out else None)
    flags: list[tuple[str, Any]] = []
    for key, item in _returned_items(out, "", 2):
        if item is primary:
            continue
        if isinstance(item, torch.Tensor):
            if item.is_floating_point() and item.numel():
                t = item.detach()
                nan = torch.isnan(t).any()
                flags.append((key, nan.to(torch.int8) * 2 + (torch.isinf(t).any() & ~nan)))
        elif isinstance(item, (int, float)) and not isinstance(item, bool):
            if not math.isfinite(item):
                flags.append((key, float(item)))
    return flags


def with_returned(
    torch: Any, losses: list[float | None], flags: list[list[tuple[str, Any]]], keys: dict[int, str]
) -> list[float | None]:
    """``losses`` where a step's loss is finite (or absent) but another value it returned
    is not: that value instead, its key in ``keys`` (the flags read in one host read per
    device)."""
    codes: dict[tuple[int, int], int] = {}
    groups: dict[Any, list[tuple[int, int]]] = {}
    for i, step in enumerate(flags):
        for j, (_, flag) in enumerate(step):
            if isinstance(flag, torch.Tensor):
                groups.setdefault(flag.device, []).append((i, j))
    for places in groups.values():
        read = torch.stack([flags[i][j][1] for i, j in places]).tolist()
        codes.update(zip(places, read, strict=True))
    out = list(losses)
    for i, step in enumerate(flags):
        if i >= len(out) or (out[i] is not None and not math.isfinite(out[i])):  # type: ignore[arg-type]
            continue
        for j, (key, flag) in enumerate(step):
            code = codes.get((i, j))
            bad = flag if code is None else (math.nan if code == 2 else math.inf if code else None)
            if bad is not None:
                out[i], keys[i] = bad, key
                break
    return out


def _returned_items(out: Any, prefix: str, depth: int) -> Iterator[tuple[str, Any]]:
    if isinstance(out, dict):
        named = [(f"{prefix}[{k!r}]", v) for k, v in out.items()]
    elif isinstance(out, (tuple, list)):
        named = [(f"{prefix}[{i}]", v) for i, v in enumerate(out)]
    else:
        yield prefix or "the returned value", out
        return
    for name, item in named:
        if depth > 1 and isinstance(item, (dict, tuple, list)):
            yield from _returned_items(item, name, depth - 1)
        else:
            yield name, item
