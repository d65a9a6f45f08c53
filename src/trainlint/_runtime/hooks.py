"""What the gradient recorder puts on the parameters and where its CPU hooks write: the
hook set, the kept slot buffers, which devices' foreach inf-norm keeps a NaN, and the
record read back from the slots after the steps."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch

from trainlint._runtime.pool import KeptPool

Slots = tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]


# Slots for the CPU hooks, by parameter count: made once (two 0-d views per parameter
# cost ~20k instructions each time), taken by a recorder for a check and given back
# after, so two checks running at once never share one; a check of several steps or
# backwards takes several.
_free_slots: KeptPool[Slots] = KeptPool(16, per_key=16)  # parameter counts kept, at most


def take_slots(n: int) -> Slots:
    kept = _free_slots.take(n)
    if kept is not None:
        return kept
    buffer = torch.empty(n, 2)  # float32: other dtypes are measured in the hook
    low, high = buffer.unbind(1)
    return buffer, list(zip(low.unbind(), high.unbind(), strict=True))


def give_back_slots(slots: Slots) -> None:
    _free_slots.give(len(slots[1]), slots)


class HookSet:
    """Post-accumulate-grad hooks put on parameters, taken off together.

    For a plain leaf parameter the entry ``register_post_accumulate_grad_hook`` would make
    goes in the same dict directly: the public call's checks and handle object were a third
    of a small model's per-check hook cost. Subclasses and non-leaves take the public way.
    """

    __slots__ = ("_entries", "_handles")

    def __init__(self) -> None:
        self._entries: list[tuple[Any, object]] = []
        self._handles: list[Any] = []

    def add(self, param: torch.Tensor, hook: Callable[[torch.Tensor], None]) -> None:
        self.add_all((param,), hook)

    def add_all(self, params: Sequence[torch.Tensor], hook: Callable[[torch.Tensor], None]) -> None:
        """:meth:`add` each, in one call, with one key: each parameter has its own dict."""
        key, entries, plain = object(), self._entries, (torch.nn.Parameter, torch.Tensor)
        for param in params:
            if type(param) in plain and param.requires_grad and param.grad_fn is None:
                hooks = param._post_accumulate_grad_hooks
                if hooks is None:
                    hooks = param._post_accumulate_grad_hooks = OrderedDict()  # C++ hooks it
                hooks[key] = hook
                entries.append((hooks, key))
            else:  # subclasses: their way; a non-leaf: its error message
                self._handles.append(param.register_post_accumulate_grad_hook(hook))

    def remove(self) -> None:
        for hooks, key in self._entries:
            hooks.pop(key, None)
        for handle in self._handles:
            handle.remove()
        self._entries.clear()
        self._handles.clear()


_KEEPS_NAN: dict[torch.device, bool] = {}


def inf_norm_keeps_nan(device: torch.device) -> bool:
    """Whether ``_foreach_norm(ord=inf)`` on ``device`` gives NaN for a tensor holding one
    (as max |x| must: a NaN gradient is what the finite check looks for). Asked once per
    device and process, before any step: one host read."""
    known = _KEEPS_NAN.get(device)
    if known is None:
        try:
            probe = torch.tensor([1.0, math.nan, -2.0], device=device)
            (norm,) = torch._foreach_norm([probe], math.inf)
            known = bool(torch.isnan(norm))
        except (RuntimeError, TypeError, AttributeError):
            known = False
        _KEEPS_NAN[device] = known
    return known


def read_record(
    used: list[torch.Tensor],
    slotted: list[int],
    starts: list[tuple[int, int]],
    later: list[tuple[int, int, int, Any]],
) -> list[tuple[int, int, float | None]]:
    """The recorder's events, (step, parameter, max |grad| or None), each measure a float:
    the slot buffers ``used`` in one host read (``slotted``: the parameter of each slot
    written; ``starts``: (step, the slot it began at)), the measures taken aside
    (``later``: (slots written before it, step, parameter, 0-d tensor or None)) in one
    read per device and dtype."""
    from trainlint._runtime.norms import read_floats

    values: list[float] = []
    if slotted:
        flat = used[0] if len(used) == 1 else torch.cat(used)
        nan = math.nan
        # NaN wins; max |-0.0| is 0.0 (as magnitudes.cpu_max_abs)
        values = [
            nan if lo != lo or hi != hi else max(abs(hi), abs(lo))
            for lo, hi in flat[: len(slotted)].tolist()
        ]
    # each step's slots, with the measures taken aside in their places among them
    starts = starts or [(0, 0)]
    ends = [at for _, at in starts[1:]] + [len(slotted)]
    out: list[tuple[int, int, float | None]] = []
    if not later:
        for (step, a), b in zip(starts, ends, strict=True):
            out += zip([step] * (b - a), slotted[a:b], values[a:b], strict=True)
        return out
    numbers = iter(read_floats([v for _, _, _, v in later if v is not None]))
    j = 0
    for (step, a), b in zip(starts, ends, strict=True):
        for k in range(a, b):
            while j < len(later) and later[j][0] <= k:
                _, at_step, index, value = later[j]
                out.append((at_step, index, None if value is None else next(numbers)))
                j += 1
            out.append((step, slotted[k], values[k]))
    for _, at_step, index, value in later[j:]:
        out.append((at_step, index, None if value is None else next(numbers)))
    return out
