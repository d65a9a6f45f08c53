"""Seeing each parameter's gradient as autograd accumulates it, at a fixed cost per backward.

A check's step may be a fraction of a millisecond, so what runs inside it is kept small.
CPU gradients are measured in their post-accumulate-grad hook by one ``aminmax`` each,
written into a slot of a small buffer (two 0-d views of it per slot, made once and kept
for the next check with as many parameters): no tensor is allocated and no number read in
the hook. The buffer is read in one ``tolist()`` at the end of the step, or at the end of
each backward when a non-finite gradient must stop the step (an engine callback), or when
its slots run out (several backwards in one step). A gradient the slots cannot take (not
float32, sparse, with history) is measured in the hook and read there. Elsewhere (CUDA) the
hook only notes the parameter, and a callback queued on the autograd engine, run when that
backward has accumulated every gradient, takes max |grad| of all of them with foreach ops,
one per dtype and device group, read on the host at the end (per backward only to stop at
a non-finite one). Either way before the rest of the step, so a ``zero_grad()`` or a clip
later in the step changes nothing measured. Hooks are registered once per check.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any

import torch

from trainlint._runtime.magnitudes import as_numbers, cpu_max_abs, max_abs, small_dense
from trainlint._runtime.pool import KeptPool

_queue_callback = torch.autograd.Variable._execution_engine.queue_callback
_aminmax = torch.aminmax
_grad_of = attrgetter("grad")
_is_cpu = attrgetter("is_cpu")
_ref = weakref.ref
_get_ident = threading.get_ident


class NonFiniteGradient(BaseException):
    """Raised at the end of a backward to stop a step before the optimizer spreads a NaN.

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
        self.params = params = list(params)
        self.measure = measure
        self.stop_on_nonfinite = stop_on_nonfinite
        self.step = 0
        # (step, parameter index, max |grad| as a float (CPU) or a 0-d tensor, or None when
        # not measured), in the order backward accumulated them
        self.events: list[tuple[int, int, Any]] = []
        self.assigned: set[tuple[int, int]] = set()
        self._fired: set[int] = set()  # hooks that fired this step
        self._ever: set[int] = set()  # got a gradient, when not measured
        self._pending: list[int] = []  # accumulated in the running backward, not measured
        self._queued = False
        self._numbers: list[float] | None = None
        self._hooks = HookSet()
        # CPU gradients are measured in their hooks (into _slots); small_dense is asked
        # only elsewhere, where it picks foreach ops
        self._on_cpu = measure and all(map(_is_cpu, params))
        self._small: list[bool] = (
            [small_dense(p) for p in params] if measure and not self._on_cpu else []
        )
        self._floats = self._on_cpu  # every event's value a float (the CPU hooks')
        # The CPU hooks' slots: a (n, 2) float32 buffer and its 0-d (min, max) views; the
        # parameter of each slot written this step, in order (see _cpu_hook)
        self._slots: tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]] | None = None
        self._slotted: list[int] = []
        self._checked = 0  # events already tested for a non-finite value (stop_on_nonfinite)
        # weak: holding last step's grads would keep them alive while the step allocates
        # new ones, doubling gradient memory for the duration of the check
        self._grads_before: list[Any] = []

    # ------------------------------------------------------------------ hooks

    def __enter__(self) -> GradRecorder:
        index = {id(p): i for i, p in enumerate(self.params)}
        try:
            if self._on_cpu:
                self._slots = take_slots(len(self.params))
            self._hooks.add_all(self.params, self._make_hook(index))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.remove()
        self._pending.clear()
        if self._slotted:  # a step that raised mid-backward: what its hooks measured
            self._flush_slots()
        slots, self._slots = self._slots, None
        if slots is not None:
            give_back_slots(slots)

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
        """CPU gradients: one ``aminmax`` into the next free slot (no allocation, no host
        read; the slots are read together later), or, for a gradient it does not take,
        measured and read at once (:func:`cpu_max_abs`). With ``stop_on_nonfinite`` the
        first hook of each backward queues an engine callback that reads what that backward
        made and stops the step at a non-finite gradient.

        Only the thread that entered the recorder uses the slots and queues callbacks: a
        step may run backward in several threads at once, and two hooks taking the same
        free slot would leave another unwritten (read as whatever the buffer last held).
        A hook in another thread measures and reads at once; a non-finite gradient it saw
        stops the step at its end."""
        fired = self._fired
        owner = _get_ident()
        slotted = self._slotted
        assert self._slots is not None
        slots = self._slots[1]
        capacity = len(slots)
        stop = self.stop_on_nonfinite
        aminmax = _aminmax

        def hook(param: torch.Tensor) -> None:
            i = index[id(param)]
            fired.add(i)
            grad = param.grad
            if grad is None:
                return
            if _get_ident() != owner:
                self._read_now(i, grad)
                return
            if stop and not self._queued:
                self._queued = True
                _queue_callback(self._end_of_backward)
            k = len(slotted)
            if k < capacity:
                try:
                    aminmax(grad, out=slots[k])
                except RuntimeError:  # not float32, sparse, or with history (create_graph)
                    pass
                else:
                    slotted.append(i)
                    return
            self._measure_now(i, grad)

        return hook

    def _measure_now(self, i: int, grad: torch.Tensor) -> None:
        """A gradient the slots did not take: measured and read now, after what the slots
        hold (events stay in the order backward made them)."""
        if self._slotted:
            self._flush_slots()
        self._read_now(i, grad)

    def _read_now(self, i: int, grad: torch.Tensor) -> None:
        """Measure a gradient and read it into events, touching no slot."""
        if grad.requires_grad:  # a backward with create_graph=True
            grad = grad.detach()
        self.events.append((self.step, i, cpu_max_abs(grad)))

    def _flush_slots(self) -> None:
        """Read the slots written since the last read into events, in one host read."""
        assert self._slots is not None
        slotted, step = self._slotted, self.step
        pairs = self._slots[0].tolist()
        nan = math.nan
        self.events += [
            (step, i, nan if lo != lo or hi != hi else max(abs(hi), abs(lo)))  # as cpu_max_abs
            for i, (lo, hi) in zip(slotted, pairs, strict=False)  # pairs: every slot
        ]
        slotted.clear()

    def _end_of_backward(self) -> None:
        """An engine callback (stop_on_nonfinite, CPU): stop the step at the first
        non-finite gradient this backward made, before the rest of the step runs."""
        self._queued = False
        if self._slotted:
            self._flush_slots()
        self._raise_nonfinite()

    def _raise_nonfinite(self) -> None:
        events, start = self.events, self._checked
        self._checked = len(events)
        isfinite = math.isfinite
        for _, i, number in events[start:]:
            if not isfinite(number):
                raise NonFiniteGradient(i, number)

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
        # one read of each .grad (a tensor attribute costs ~1k instructions)
        self._grads_before = [_NONE if g is None else _ref(g) for g in map(_grad_of, self.params)]

    def end_step(self) -> None:
        if self._pending:  # a backward that raised, or ran outside the engine's callbacks
            self._flush()
        if self._slotted:
            self._flush_slots()
        if self.stop_on_nonfinite and self._on_cpu:
            self._raise_nonfinite()
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


# Slots for the CPU hooks, by parameter count: made once (two 0-d views per parameter
# cost ~20k instructions each time), taken by a recorder for a check and given back
# after, so two checks running at once never share one.
_free_slots: KeptPool[tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]] = KeptPool(
    16
)  # parameter counts kept, at most


def take_slots(n: int) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    kept = _free_slots.take(n)
    if kept is not None:
        return kept
    buffer = torch.empty(n, 2)  # float32: other dtypes are measured in the hook
    low, high = buffer.unbind(1)
    return buffer, list(zip(low.unbind(), high.unbind(), strict=True))


def give_back_slots(slots: tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]) -> None:
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


_NONE = type(None)  # called, gives None: what a dead weak reference gives


def _greater(a: float, b: float) -> bool:
    # NaN wins, so a non-finite accumulation is never hidden by a later finite one
    return a != a or (b == b and a > b)
