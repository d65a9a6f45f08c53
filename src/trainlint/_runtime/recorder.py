"""Seeing each parameter's gradient as autograd accumulates it, at a fixed cost per backward.

A check's step may be a fraction of a millisecond, so what runs inside it is kept small.
CPU gradients are measured in their post-accumulate-grad hook: one ``aminmax`` and two
host reads each (foreach ops loop there anyway, and a large gradient is read once, not
twice as by abs + max; no engine callback, ~10 us a check). Elsewhere (CUDA) the hook only
notes the parameter, and a callback queued on the autograd
engine, run when that backward has accumulated every gradient, takes max |grad| of all of
them with foreach ops, one per dtype and device group, read on the host at the end (per
backward only to stop at a non-finite one). Either way before the rest of the step, so a
``zero_grad()`` later in the step hides nothing. Hooks are registered once per check.
"""

from __future__ import annotations

import math
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch

from trainlint._runtime.steps import extrema

_LARGE = 1 << 16  # elements: past this aminmax (one read pass) beats foreach abs + max
_queue_callback = torch.autograd.Variable._execution_engine.queue_callback
_aminmax = torch.aminmax


class NonFiniteGradient(BaseException):
    """Raised at the end of a backward to stop a step before the optimizer spreads a NaN.

    A BaseException so that a step's own ``except Exception`` does not swallow it.
    """

    def __init__(self, index: int, value: float) -> None:
        super().__init__(index, value)
        self.index = index
        self.value = value


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
        # (step, parameter index, max |grad| as a float (_cpu_hook) or a 0-d tensor, or
        # None when not measured), in the order backward accumulated them
        self.events: list[tuple[int, int, Any]] = []
        self.assigned: set[tuple[int, int]] = set()
        self._fired: set[int] = set()  # hooks that fired this step
        self._ever: set[int] = set()  # got a gradient, when not measured
        self._pending: list[int] = []  # accumulated in the running backward, not measured
        self._queued = False
        self._bad: tuple[int, float] | None = None  # non-finite, to raise at backward's end
        self._numbers: list[float] | None = None
        self._hooks = HookSet()
        # CPU gradients of any size are measured in their hooks (_cpu_hook); small_dense is
        # asked only elsewhere, where it picks foreach ops (six calls were a third of this)
        self._on_cpu = measure and all(p.is_cpu for p in self.params)
        self._small: list[bool] = (
            [small_dense(p) for p in self.params] if measure and not self._on_cpu else []
        )
        self._floats = self._on_cpu  # every event's value a float (the CPU hooks')
        # weak: holding last step's grads would keep them alive while the step allocates
        # new ones, doubling gradient memory for the duration of the check
        self._grads_before: list[Any] = []

    # ------------------------------------------------------------------ hooks

    def __enter__(self) -> GradRecorder:
        index = {id(p): i for i, p in enumerate(self.params)}
        try:
            self._hooks.add_all(self.params, self._make_hook(index))
        except BaseException:
            self._hooks.remove()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.remove()
        self._pending.clear()

    def _make_hook(self, index: dict[int, int]) -> Callable[[torch.Tensor], None]:
        fired = self._fired
        pending = self._pending
        flush = self._flush

        if not self.measure:
            ever = self._ever

            def note(param: torch.Tensor) -> None:
                i = index[id(param)]
                fired.add(i)
                if param.grad is not None:
                    ever.add(i)

            return note

        if self._on_cpu:
            return self._cpu_hook(index)

        def hook(param: torch.Tensor) -> None:
            i = index[id(param)]
            fired.add(i)
            pending.append(i)
            if not self._queued:
                self._queued = True
                _queue_callback(flush)

        return hook

    def _cpu_hook(self, index: dict[int, int]) -> Callable[[torch.Tensor], None]:
        """CPU gradients, measured in the hook as floats (an aminmax, one read pass whatever
        the size, and host reads that cost nothing on the CPU): an engine callback is queued
        only to stop the step at the end of a backward that made a non-finite one."""
        fired = self._fired
        events = self.events
        stop = self.stop_on_nonfinite
        raise_bad = self._raise_bad

        def hook(param: torch.Tensor) -> None:
            i = index[id(param)]
            fired.add(i)
            grad = param.grad
            if grad is None:
                return
            if grad.requires_grad:  # a backward with create_graph=True
                grad = grad.detach()
            number = cpu_max_abs(grad)
            events.append((self.step, i, number))
            if stop and self._bad is None and not math.isfinite(number):
                self._bad = (i, number)
                _queue_callback(raise_bad)

        return hook

    def _raise_bad(self) -> None:
        bad, self._bad = self._bad, None
        if bad is not None:
            raise NonFiniteGradient(*bad)

    def _flush(self) -> None:
        """Measure what the backward that just ended accumulated (an engine callback)."""
        self._queued = False
        if not self._pending:
            return
        indices = [i for i in self._pending if self.params[i].grad is not None]
        self._pending.clear()
        if not indices:
            return
        params, small = self.params, self._small
        grads: list[torch.Tensor] = [params[i].grad for i in indices]  # type: ignore[misc]
        with torch.no_grad():  # a backward with create_graph=True; the CPU's is _cpu_hook
            values = max_abs(grads, small=all(small[i] for i in indices))
        step = self.step
        self._floats = False
        self.events += [(step, i, v) for i, v in zip(indices, values, strict=True)]
        if self.stop_on_nonfinite:
            for i, number in zip(indices, as_numbers(values), strict=True):
                if not math.isfinite(number):
                    raise NonFiniteGradient(i, number)

    # ------------------------------------------------------------------ steps

    def begin_step(self, step: int) -> None:
        self.step = step
        self._fired.clear()
        self._queued = False
        self._grads_before = [_NONE if p.grad is None else weakref.ref(p.grad) for p in self.params]

    def end_step(self) -> None:
        if self._pending:  # a backward that raised, or ran outside the engine's callbacks
            self._flush()
        self._raise_bad()
        self._queued = False
        fired = self._fired
        if len(fired) == len(self.params):
            self._grads_before = []
            return  # every gradient came through a hook: nothing was assigned directly
        for index, param in enumerate(self.params):
            if index in fired:
                continue
            grad = param.grad
            if grad is not None and grad is not self._grads_before[index]():
                self.assigned.add((self.step, index))
                self._ever.add(index)
                value = None
                if self.measure:
                    with torch.no_grad():
                        value = max_abs([grad])[0]
                    self._floats = False
                self.events.append((self.step, index, value))
        self._grads_before = []

    def numbers(self) -> list[float]:
        """max |grad| of each measured event, in the order of ``events``."""
        if self._numbers is None:
            # floats measured in the hooks (_cpu_hook), tensors read here in one pass
            self._numbers = as_numbers([v for _, _, v in self.events if v is not None])
        return self._numbers

    def table(self, steps: int) -> list[list[float | None]]:
        """``[step][param]``: the largest max |grad| recorded in that step, None if none."""
        out: list[list[float | None]] = [[None] * len(self.params) for _ in range(steps)]
        # every event a float measured in its hook (_cpu_hook): no pass to read tensors
        it = None if self._floats else iter(self.numbers())
        for step, index, value in self.events:
            if step >= steps:
                continue
            number = value if it is None else next(it) if value is not None else 0.0
            row = out[step]
            old = row[index]
            if old is None or _greater(number, old):
                row[index] = number
        return out

    def fired(self) -> set[int]:
        return self._ever | {index for _, index, _ in self.events}


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


_NONE = type(None)  # called, gives None: what a dead weak reference gives


def _greater(a: float, b: float) -> bool:
    # NaN wins, so a non-finite accumulation is never hidden by a later finite one
    return a != a or (b == b and a > b)
