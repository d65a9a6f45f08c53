"""Driving the user's step and naming its parameters."""

from __future__ import annotations

import fnmatch
import math
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

from trainlint._runtime.arguments import check_step
from trainlint._runtime.lintlink import record_ran, reset_ran

ParamSpec = str | torch.Tensor | torch.nn.Module


class StepRunner:
    """Calls ``step()``, or ``step(batch)`` cycling over ``batches`` when they are given."""

    def __init__(
        self, step: Callable[..., Any], batches: Iterable[Any] | None, *, check: str = "check"
    ) -> None:
        check_step(check, step, batches=batches is not None)
        reset_ran()
        self._first = True
        self.step = step
        self._batches = batches
        self._iter: Iterator[Any] | None = None if batches is None else self._cycle(batches)
        self._last: Any = None

    def again(self) -> Any:
        """Repeat the last call, with the same batch."""
        if self._iter is None:
            return self.step()
        return self.step(self._last)

    @staticmethod
    def _cycle(batches: Iterable[Any]) -> Iterator[Any]:
        passes = 0
        while True:
            got = False
            for batch in batches:
                got = True
                yield batch
            if not got:
                if passes == 0:
                    raise ValueError("batches is empty")
                raise ValueError(
                    "batches ran out: it can be iterated only once (a generator?); "
                    "pass a list or a DataLoader, or fewer steps"
                )
            passes += 1

    def __call__(self) -> Any:
        if self._iter is not None:
            self._last = next(self._iter)
        if self._first:
            # the first call also notes which project functions the step runs, for the
            # failure message's lint findings (traced once per step function)
            self._first = False
            return record_ran(self.again, key=self.step)
        return self.again()


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter (or buffer); CPU for an empty model."""
    for param in model.parameters():
        return param.device
    for buffer in model.buffers():
        return buffer.device
    return torch.device("cpu")


def match_params(
    model: torch.nn.Module, specs: Sequence[ParamSpec] | ParamSpec, what: str
) -> set[str]:
    """Names of the model's parameters selected by ``specs``.

    A spec is a parameter name, a module path (``"encoder"`` selects ``encoder.*``), a
    glob (``"*.bias"``), a parameter tensor or a submodule. A spec that selects nothing is
    an error: a typo would otherwise silently weaken the check.
    """
    if isinstance(specs, (str, torch.Tensor, torch.nn.Module)):
        specs = [specs]
    named = list(model.named_parameters())
    selected: set[str] = set()
    for spec in specs:
        hits: set[str]
        if isinstance(spec, str):
            hits = {
                n
                for n, _ in named
                if n == spec or n.startswith(spec + ".") or fnmatch.fnmatchcase(n, spec)
            }
        elif isinstance(spec, torch.nn.Module):
            ids = {id(p) for p in spec.parameters()}
            hits = {n for n, p in named if id(p) in ids}
        elif isinstance(spec, torch.Tensor):
            hits = {n for n, p in named if p is spec}
        else:
            raise TypeError(
                f"{what} takes parameter names, globs, tensors or modules, got {type(spec).__name__}"
            )
        if not hits:
            raise ValueError(f"{what}={spec!r} matches no parameter of the model")
        selected |= hits
    return selected


def shape(tensor: torch.Tensor) -> tuple[int, ...]:
    return tuple(tensor.shape)


Extrema = tuple[torch.Tensor, torch.Tensor]


def extrema(tensor: torch.Tensor) -> Extrema:
    """(min, max) as 0-d tensors, without a host sync; NaN if any element is NaN.

    ``aminmax`` is one pass over the data; ``linalg.vector_norm(t, inf)``, the obvious way
    to get max |x|, measured 25x slower on CPU.
    """
    if tensor.is_sparse:
        tensor = tensor.coalesce().values()
    tensor = tensor.detach()
    if tensor.numel() == 0:
        zero = torch.zeros((), device=tensor.device)
        return zero, zero
    if tensor.is_complex():
        magnitude = tensor.abs().amax()
        return magnitude, magnitude
    if tensor.dtype == torch.bool:
        tensor = tensor.to(torch.uint8)
    low, high = torch.aminmax(tensor)
    return low, high


def max_abs_values(pairs: Sequence[Extrema]) -> list[float]:
    """max |x| for each (min, max) pair, with one host transfer per device and dtype."""
    flat = _to_floats([t for pair in pairs for t in pair])
    nan = math.nan
    return [
        nan if low != low or high != high else (high if high >= -low else -low)
        for low, high in zip(flat[::2], flat[1::2], strict=True)
    ]


class NonFiniteGradient(BaseException):
    """Raised from a gradient hook to stop a step before the optimizer spreads a NaN.

    A BaseException so that a step's own ``except Exception`` does not swallow it.
    """

    def __init__(self, index: int, value: float) -> None:
        super().__init__(index, value)
        self.index = index
        self.value = value


class GradRecorder:
    """Sees each parameter's ``.grad`` as autograd accumulates into it.

    Post-accumulate-grad hooks fire inside ``backward()``, so a ``zero_grad()`` later in the
    same step cannot hide what backward produced. A ``.grad`` assigned directly (gradients
    computed elsewhere and copied in) fires no hook; it is picked up at the end of the step
    when the grad object changed identity.
    """

    def __init__(
        self,
        params: Sequence[torch.Tensor],
        *,
        measure: bool = True,
        stop_on_nonfinite: bool = False,
    ) -> None:
        self.params = list(params)
        self.measure = measure
        self.stop_on_nonfinite = stop_on_nonfinite
        self.step = 0
        # (step, parameter index, (min, max) of the grad, or None when not measured)
        self.events: list[tuple[int, int, Extrema | None]] = []
        self.assigned: set[tuple[int, int]] = set()
        self._handles: list[Any] = []
        self._fired_this_step: set[int] = set()
        # weak: holding last step's grads would keep them alive while the step allocates
        # new ones, doubling gradient memory for the duration of the check
        self._grads_before: list[Callable[[], torch.Tensor | None]] = []

    def __enter__(self) -> GradRecorder:
        for index, param in enumerate(self.params):
            self._handles.append(param.register_post_accumulate_grad_hook(self._hook(index)))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _hook(self, index: int) -> Callable[[torch.Tensor], None]:
        events = self.events
        fired = self._fired_this_step
        measure = self.measure
        stop = self.stop_on_nonfinite
        strided = torch.strided
        aminmax = torch.aminmax
        # a gradient has its parameter's size: the common case is told by layout and dtype
        dtype = self.params[index].dtype
        plain = self.params[index].numel() > 0 and not dtype.is_complex

        def hook(param: torch.Tensor) -> None:
            fired.add(index)
            grad = param.grad
            if grad is None:
                return
            value: Extrema | None
            if not measure:
                value = None
            elif plain and grad.layout is strided and grad.dtype is dtype:
                value = aminmax(grad)  # the common case, without extrema()'s dispatch
            else:
                value = extrema(grad)
            events.append((self.step, index, value))
            if stop and value is not None:
                lowest, highest = float(value[0]), float(value[1])
                if not (math.isfinite(lowest) and math.isfinite(highest)):
                    raise NonFiniteGradient(index, highest if math.isfinite(lowest) else lowest)

        return hook

    def begin_step(self, step: int) -> None:
        self.step = step
        self._fired_this_step.clear()
        self._grads_before = [_NONE if p.grad is None else weakref.ref(p.grad) for p in self.params]

    def end_step(self) -> None:
        if len(self._fired_this_step) == len(self.params):
            self._grads_before = []
            return  # every gradient came through a hook: nothing was assigned directly
        for index, param in enumerate(self.params):
            if index in self._fired_this_step:
                continue
            grad = param.grad
            if grad is not None and grad is not self._grads_before[index]():
                self.assigned.add((self.step, index))
                self.events.append((self.step, index, extrema(grad) if self.measure else None))
        self._grads_before = []

    def table(self, steps: int) -> list[list[float | None]]:
        """``[step][param]``: the largest max |grad| recorded in that step, None if none."""
        out: list[list[float | None]] = [[None] * len(self.params) for _ in range(steps)]
        events = self.events
        numbers = max_abs_values([v for _, _, v in events if v is not None])
        it = iter(numbers)
        for step, index, value in events:
            if step >= steps:
                continue
            number = next(it) if value is not None else 0.0
            row = out[step]
            old = row[index]
            if old is None or _greater(number, old):
                row[index] = number
        return out

    def fired(self) -> set[int]:
        return {index for _, index, _ in self.events}


def _none() -> None:
    return None


_NONE = _none


def _greater(a: float, b: float) -> bool:
    # NaN wins, so a non-finite accumulation is never hidden by a later finite one
    return a != a or (b == b and a > b)


def _to_floats(values: list[torch.Tensor]) -> list[float]:
    """One host transfer per (device, dtype) instead of one per value; on the CPU, where
    there is no transfer, ``float()`` each (a stack and ``tolist()`` cost 5x more)."""
    cpu = _CPU
    if all(v.device == cpu for v in values):
        return [float(v) for v in values]
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, v in enumerate(values):
        groups.setdefault((v.device, v.dtype), []).append(i)
    out = [0.0] * len(values)
    for indices in groups.values():
        stacked = torch.stack([values[i] for i in indices]).tolist()
        for i, number in zip(indices, stacked, strict=True):
            out[i] = float(number)
    return out


_CPU = torch.device("cpu")
