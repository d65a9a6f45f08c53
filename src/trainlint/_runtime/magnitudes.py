"""max |t| of gradients and weights without a host sync per tensor: foreach ops per
dtype/device group for small dense tensors, one ``aminmax`` read pass for the rest, and
the values read back in one go. Shared by the gradient recorder and the weight snapshot.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from trainlint._runtime.steps import extrema

_LARGE = 1 << 16  # elements: past this aminmax (one read pass) beats foreach abs + max
_aminmax = torch.aminmax


def small_dense(t: torch.Tensor) -> bool:
    """Whether max |t| is best taken by foreach ops: a small, non-empty, dense real tensor."""
    return t.layout is torch.strided and t.dtype.is_floating_point and 0 < t.numel() < _LARGE


def max_abs(tensors: list[torch.Tensor], *, small: bool = False) -> list[torch.Tensor]:
    """max |t| of each tensor as a 0-d tensor (NaN if any element is NaN), no host sync:
    small dense floating tensors with two foreach ops per dtype/device group, others one
    by one (``aminmax``, one read pass, where an ``abs`` would write a copy). ``small``:
    the caller knows every tensor is :func:`small_dense` (told once per check from the
    parameters, whose gradients and copies share their size), which skips the sorting.
    Called in backward or under ``no_grad`` (a ``no_grad()`` here cost more than the ops)."""
    if small:
        try:
            return list(torch._foreach_max(torch._foreach_abs(tensors)))
        except RuntimeError:  # a gradient of another kind than its parameter (sparse)
            pass
    out: list[Any] = [None] * len(tensors)
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    strided = torch.strided
    for i, t in enumerate(tensors):
        dtype = t.dtype
        if t.layout is strided and dtype.is_floating_point and 0 < t.numel() < _LARGE:
            groups.setdefault((t.device, dtype), []).append(i)
        else:
            low, high = extrema(t)
            out[i] = high if low is high else torch.maximum(high, low.neg())
    if len(groups) == 1 and len(next(iter(groups.values()))) == len(tensors):
        return list(torch._foreach_max(torch._foreach_abs(tensors)))  # the common case
    for indices in groups.values():
        picked = [tensors[i] for i in indices]
        for i, value in zip(indices, torch._foreach_max(torch._foreach_abs(picked)), strict=True):
            out[i] = value
    return out


def cpu_max_abs(t: torch.Tensor) -> float:
    """max |t| as a Python float from one ``aminmax``, to the bit what :func:`max_abs` gives
    a small dense tensor (NaN wins; max |-0.0| is 0.0, where max_abs's one-by-one path says
    -0.0): for a CPU tensor, where foreach ops loop over the tensors anyway (one aminmax each
    measured 0.6x the foreach abs + max of a 6-tensor MLP's gradients) and a large one is
    read once. A tensor aminmax does not take (sparse) goes through max_abs."""
    try:
        low, high = _aminmax(t)
    except RuntimeError:  # a gradient of another kind than its parameter (sparse)
        with torch.no_grad():
            return float(max_abs([t])[0])
    lo, hi = abs(float(low)), abs(float(high))
    return math.nan if lo != lo or hi != hi else max(hi, lo)


def as_numbers(values: Sequence[float | torch.Tensor]) -> list[float]:
    """Python floats from max |t| values, each a float already (:func:`cpu_max_abs`) or a
    0-d tensor (:func:`max_abs`): the tensors read in one pass, the order kept."""
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    if not tensors:
        return list(values)  # type: ignore[arg-type]
    read = iter(to_floats(tensors))
    return [next(read) if isinstance(v, torch.Tensor) else v for v in values]


def to_floats(values: Sequence[torch.Tensor]) -> list[float]:
    """Python floats from 0-d tensors: on the CPU ``float()`` each (no transfer to save;
    a stack costs more), elsewhere one ``stack().tolist()`` per dtype/device group."""
    if all(v.is_cpu for v in values):
        return [float(v) for v in values]
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, v in enumerate(values):
        groups.setdefault((v.device, v.dtype), []).append(i)
    out = [0.0] * len(values)
    for indices in groups.values():
        numbers = torch.stack([values[i] for i in indices]).tolist()
        for i, number in zip(indices, numbers, strict=True):
            out[i] = float(number)
    return out
