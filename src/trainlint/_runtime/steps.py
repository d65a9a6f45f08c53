"""Driving the user's step and naming its parameters."""

from __future__ import annotations

import fnmatch
import math
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

    @property
    def last_batch(self) -> Any:
        """The batch of the last call (None without batches)."""
        return self._last

    def again_with(self, batch: Any) -> Any:
        """Call the step again with ``batch``, an earlier call's :attr:`last_batch`."""
        if self._iter is None:
            return self.step()
        return self.step(batch)

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
    from trainlint._runtime.magnitudes import to_floats

    flat = to_floats([t for pair in pairs for t in pair])
    nan = math.nan
    return [
        nan if low != low or high != high else (high if high >= -low else -low)
        for low, high in zip(flat[::2], flat[1::2], strict=True)
    ]
