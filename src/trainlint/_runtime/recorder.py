"""Seeing each parameter's gradient as autograd accumulates it, with no host read until
the steps are over.

A check's step may be a fraction of a millisecond, so what runs inside it is kept small;
on a GPU a host read inside the steps is a sync, after which the CPU can no longer run
ahead and every millisecond of bookkeeping shows on the GPU's timeline. So nothing is
read until the check asks for the record (:meth:`GradRecorder.table`), once, after the
last step.

CPU gradients are measured in their post-accumulate-grad hook by one ``aminmax`` each,
written into the next free slot of a buffer kept for the whole check (two 0-d views of it
per slot, made once and kept for the next check with as many parameters): no tensor is
allocated and no number read in the hook; a check that runs out of slots (several
backwards a step) takes another buffer. A gradient the slots cannot take (not float32,
sparse, with history, or from another thread) is measured in the hook into a 0-d tensor.
Elsewhere (CUDA) the hook only notes the parameter, and a callback queued on the autograd
engine, run when that backward has accumulated every gradient, takes max |grad| of all of
them with one foreach inf-norm (or foreach ops per dtype and device group, and an
``aminmax`` per large gradient, where that kernel drops a NaN), kept as 0-d tensors.
Either way
before the rest of the step, so a ``zero_grad()`` or a clip later in the step changes
nothing measured. Hooks are registered once per check.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any

import torch

from trainlint._runtime.hooks import (
    HookSet,
    Slots,
    give_back_slots,
    inf_norm_keeps_nan,
    read_record,
    take_slots,
)
from trainlint._runtime.magnitudes import max_abs, small_dense

_queue_callback = torch.autograd.Variable._execution_engine.queue_callback
_aminmax = torch.aminmax
_grad_of = attrgetter("grad")
_is_cpu = attrgetter("is_cpu")
_ref = weakref.ref
_get_ident = threading.get_ident


class GradRecorder:
    """Sees each parameter's ``.grad`` as autograd accumulates into it.

    Post-accumulate-grad hooks fire inside ``backward()``, so a ``zero_grad()`` later in the
    same step cannot hide what backward produced. A ``.grad`` assigned directly (gradients
    computed elsewhere and copied in) fires no hook; it is picked up at the end of the step
    when the grad object changed identity.

    Nothing is read on the host until the steps are over, on the CPU too: a check that
    must know whether a step went wrong asks :meth:`finite_since_mark` for a flag kept
    on the device. ``backward_ended``: called at the end of each backward that accumulated
    a gradient (an engine callback, after that backward's gradients are measured, before
    anything after ``backward()`` in the step runs) with :meth:`finite_since_mark`.
    ``device_path``: measure CPU gradients the way CUDA ones are (an engine callback per
    backward), so that the CPU tests cover that path too.
    """

    def __init__(
        self,
        params: Sequence[torch.Tensor],
        *,
        measure: bool = True,
        backward_ended: Callable[[torch.Tensor | None], None] | None = None,
        device_path: bool = False,
    ) -> None:
        self.params = params = list(params)
        self._ended = backward_ended
        self.measure = measure
        self.step = 0
        self.assigned: set[tuple[int, int]] = set()
        self._fired: set[int] = set()  # hooks that fired this step
        self._ever: set[int] = set()  # got a gradient, when not measured
        self._pending: list[int] = []  # accumulated in the running backward, not measured
        self._queued = False
        # CPU gradients are measured in their hooks (into the slots); small_dense is asked
        # only elsewhere, where it picks foreach ops
        self._on_cpu = measure and not device_path and all(map(_is_cpu, params))
        # elsewhere: one foreach inf-norm for all the gradients of a backward (a launch or a
        # few, no copy), where the device's kernel keeps a NaN; else max_abs (an aminmax
        # per large gradient: three launches each)
        self._inf_norm = (
            measure
            and not self._on_cpu
            and all(map(inf_norm_keeps_nan, {p.device for p in params}))
        )
        self._small: list[bool] = (
            [small_dense(p) for p in params]
            if measure and not self._on_cpu and not self._inf_norm
            else []
        )
        # The CPU hooks' slots: buffers of (n, 2) float32 and their 0-d (min, max) views,
        # all the views in one list; the parameter of each slot written, in order, and the
        # slot each step began at (see _cpu_hook)
        self._chunks: list[Slots] = []
        self._views: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._slotted: list[int] = []
        self._starts: list[tuple[int, int]] = []
        # measured outside the slots: (slots written before it, step, parameter, max |grad|
        # as a 0-d tensor or None when not measured), in the order backward made them
        self._later: list[tuple[int, int, int, Any]] = []
        self._marks = (0, 0)  # (slots, _later) already covered by finite_since_mark
        self._events: list[tuple[int, int, float | None]] | None = None
        # weak: holding last step's grads would keep them alive while the step allocates
        # new ones, doubling gradient memory for the duration of the check
        self._grads_before: list[Any] = []

    # ------------------------------------------------------------------ hooks

    def __enter__(self) -> GradRecorder:
        index = {id(p): i for i, p in enumerate(self.params)}
        try:
            if self._on_cpu:
                self._grow()
            self._hooks = HookSet()
            self._hooks.add_all(self.params, self._make_hook(index))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        hooks = getattr(self, "_hooks", None)
        if hooks is not None:
            hooks.remove()
        if self._pending:  # a backward that raised before its callback: what it made
            self._flush()
        try:
            self.events  # noqa: B018 - the one host read, after the last step
        finally:
            chunks, self._chunks = self._chunks, []
            self._views = []
            for chunk in chunks:
                give_back_slots(chunk)

    def _grow(self) -> None:
        """Another buffer of slots, one per parameter (views extended in place: the hook
        holds the list)."""
        chunk = take_slots(len(self.params))
        self._chunks.append(chunk)
        self._views += chunk[1]

    def _make_hook(self, index: dict[int, int]) -> Callable[[torch.Tensor], None]:
        fired = self._fired
        pending = self._pending
        flush = self._flush if self._ended is None else self._flush_and_end

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
        read; the slots are read together after the steps), or, for a gradient it does
        not take, :meth:`_measure_aside`.

        Only the thread that entered the recorder uses the slots: a step may run backward
        in several threads at once, and two hooks taking the same free slot would leave
        another unwritten (read as whatever the buffer last held)."""
        fired = self._fired
        owner = _get_ident()
        slotted = self._slotted
        views = self._views
        aminmax = _aminmax
        grow = self._grow
        aside = self._measure_aside
        ended = self._end_of_backward if self._ended is not None else None

        def hook(param: torch.Tensor) -> None:
            i = index[id(param)]
            fired.add(i)
            grad = param.grad
            if grad is None:
                return
            if _get_ident() != owner:
                aside(i, grad)
                return
            if ended is not None and not self._queued:
                self._queued = True
                _queue_callback(ended)
            k = len(slotted)
            if k == len(views):
                grow()
            try:
                aminmax(grad, out=views[k])
            except RuntimeError:  # not float32, sparse, or with history (create_graph)
                aside(i, grad)
            else:
                slotted.append(i)

        return hook

    def _end_of_backward(self) -> None:
        """The engine callback of a CPU backward (``backward_ended``)."""
        self._queued = False
        self._ended(self.finite_since_mark())  # type: ignore[misc]

    def _flush_and_end(self) -> None:
        """The engine callback elsewhere, with ``backward_ended``."""
        self._flush()
        self._ended(self.finite_since_mark())  # type: ignore[misc]

    def _measure_aside(self, i: int, grad: torch.Tensor) -> None:
        """A gradient the slots did not take: max |grad| as a 0-d tensor, read with the rest
        (kept after what the slots hold so far: the order backward made them)."""
        with torch.no_grad():
            value = max_abs([grad.detach() if grad.requires_grad else grad])[0]
        self._later.append((len(self._slotted), self.step, i, value))

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
        grads = [g.detach() if g.requires_grad else g for g in grads]  # create_graph=True
        values: Sequence[torch.Tensor] | None = None
        with torch.no_grad():
            if self._inf_norm:
                try:
                    values = torch._foreach_norm(grads, math.inf)
                except RuntimeError:  # a sparse gradient, or several devices
                    values = None
            if values is None:  # (small: empty where the inf-norm was to serve)
                values = max_abs(grads, small=bool(small) and all(small[i] for i in indices))
        at, step = len(self._slotted), self.step
        self._later += [(at, step, i, v) for i, v in zip(indices, values, strict=True)]

    # ------------------------------------------------------------------ steps

    def begin_step(self, step: int) -> None:
        self.step = step
        self._fired.clear()
        self._queued = False
        self._starts.append((step, len(self._slotted)))
        # one read of each .grad (a tensor attribute costs ~1k instructions)
        self._grads_before = [_NONE if g is None else _ref(g) for g in map(_grad_of, self.params)]

    def end_step(self) -> None:
        if self._pending:  # a backward that raised, or ran outside the engine's callbacks
            self._flush()
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
                        value = max_abs([grad.detach()])[0]
                self._later.append((len(self._slotted), self.step, index, value))
        self._grads_before = []

    def finite_since_mark(self) -> torch.Tensor | None:
        """A 0-d bool tensor, on the gradients' device: whether every gradient backward
        made since the last call is finite (one assigned directly is not counted: no rerun
        of backward names where it came from); None when none was measured. No host
        read."""
        slots_at, later_at = self._marks
        end, later_end = len(self._slotted), len(self._later)
        self._marks = (end, later_end)
        n = len(self.params)
        if later_at == later_end and slots_at < end and slots_at // n == (end - 1) // n:
            # one buffer's rows, nothing aside (a step's single backward): two ops
            rows = self._chunks[slots_at // n][0][slots_at % n : (end - 1) % n + 1]
            return torch.isfinite(rows).all()
        flags: list[torch.Tensor] = []
        for c, (buffer, _) in enumerate(self._chunks):
            a, b = max(slots_at - c * n, 0), min(end - c * n, n)
            if a < b:
                flags.append(torch.isfinite(buffer[a:b]).all())
        assigned = self.assigned
        values = [
            v
            for _, step, i, v in self._later[later_at:]
            if v is not None and (step, i) not in assigned
        ]
        by_device: dict[torch.device, list[torch.Tensor]] = {}
        for v in values:
            by_device.setdefault(v.device, []).append(v.float())
        flags += [torch.isfinite(torch.stack(vs)).all() for vs in by_device.values()]
        if not flags:
            return None
        device = flags[0].device
        ok = flags[0]
        for flag in flags[1:]:
            ok = ok & flag.to(device, non_blocking=True)
        return ok

    # ------------------------------------------------------------------ the record

    @property
    def events(self) -> list[tuple[int, int, float | None]]:
        """(step, parameter index, max |grad| or None when not measured), in the order
        backward accumulated them; read on the first access, in one pass."""
        if self._events is None:
            self._events = self._read()
        return self._events

    def _read(self) -> list[tuple[int, int, float | None]]:
        """Every measure as a float (:func:`read_record`), in one pass."""
        chunks = [c[0] for c in self._chunks]
        return read_record(chunks, self._slotted, self._starts, self._later)

    def numbers(self) -> list[float]:
        """max |grad| of each measured event, in the order of ``events``."""
        return [v for _, _, v in self.events if v is not None]

    def table(self, steps: int) -> list[list[float | None]]:
        """``[step][param]``: the largest max |grad| recorded in that step, None if none."""
        out: list[list[float | None]] = [[None] * len(self.params) for _ in range(steps)]
        for step, index, value in self.events:
            if step >= steps:
                continue
            number = 0.0 if value is None else value
            row = out[step]
            old = row[index]
            if old is None or _greater(number, old):
                row[index] = number
        return out

    def truncate(self, steps: int) -> None:
        """Forget what was recorded from step ``steps`` on (a check that stops there)."""
        self._events = [e for e in self.events if e[0] < steps]

    def fired(self) -> set[int]:
        return self._ever | {index for _, index, _ in self.events}


_NONE = type(None)  # called, gives None: what a dead weak reference gives


def _greater(a: float, b: float) -> bool:
    # NaN wins, so a non-finite accumulation is never hidden by a later finite one
    return a != a or (b == b and a > b)
