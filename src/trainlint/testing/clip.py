"""``assert_clip_effective``: gradient reads through ``torch.nn.utils`` see this step's backward."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from trainlint._runtime.guard import DEFAULT_TIMEOUT, guarded
from trainlint._runtime.links import Symptom
from trainlint._runtime.report import fail, table
from trainlint.testing import _clip_reads as _reads
from trainlint.testing._clip_reads import PendingRead, read_all, same_norm
from trainlint.testing._common import Step, model_step_runner, plural, runtime, trainable

if TYPE_CHECKING:
    import torch

CHECK = "assert_clip_effective"

SYMPTOMS = {
    "read-after-zero-grad": Symptom(
        ("TL101",),
        text="The gradients were read after zero_grad() cleared them: a clip then acts on "
        "nothing (the update is never clipped) and a logged gradient norm is always 0. "
        "Read and clip them between backward() and zero_grad().",
    ),
    "clip-after-step": Symptom(
        ("TL110",),
        text="The gradients were clipped after optimizer.step() had already applied them: "
        "the clip comes too late to change the update. Clip between backward() (or "
        "scaler.unscale_()) and optimizer.step().",
    ),
    "read-before-backward": Symptom(
        see_also=("TL101", "TL110"),
        text="The gradients were read before this step's backward() ran: the read sees the "
        "previous step's gradients, or none.",
    ),
    "clip-before-unscale": Symptom(
        ("TL601",),
        text="The gradients were read while still multiplied by the GradScaler's scale "
        "factor: a clip threshold then applies to scaled gradients (it clips far too hard, "
        "or a logged norm is off by the factor). Call scaler.unscale_(optimizer) first.",
    ),
}

_BATCHED_ON_CPU = False  # tests: the norms of CPU gradients taken as a GPU's are


@dataclass(frozen=True)
class GradRead:
    """One gradient read through ``torch.nn.utils`` during the check.

    ``seen``: the total 2-norm of the gradients the read saw (0 for none); ``backward``:
    the total 2-norm the last backward left in those parameters' gradients (None: no
    backward had reached them); ``after``: what happened to them since that backward
    (``"backward"``: nothing, the read is fine; ``"zero_grad"``; ``"step"``; None: no
    backward yet).
    """

    step: int
    function: str
    seen: float
    backward: float | None
    after: str | None
    order: tuple[str, ...]
    scaled: bool = False  # still multiplied by a GradScaler's factor (no unscale_ yet)


@dataclass(frozen=True)
class ClipResult:
    """What :func:`assert_clip_effective` measured: every read, in order."""

    steps: int
    reads: tuple[GradRead, ...]
    scale: float | None = None  # the GradScaler's factor after the last step, if one scaled


@guarded(CHECK)
def assert_clip_effective(
    model: torch.nn.Module,
    step: Step,
    *,
    steps: int = 1,
    batches: Iterable[Any] | None = None,
    timeout: float | None = DEFAULT_TIMEOUT,
) -> ClipResult:
    """Every gradient read the step makes through ``torch.nn.utils`` sees this step's backward.

    ``clip_grad_norm_``, ``clip_grad_value_`` and ``get_total_norm`` on the model's
    parameters must come after the backward that produced the gradients, and before the
    ``zero_grad()`` that clears them (TL101: the norm is 0, the clip acts on nothing) and the
    ``optimizer.step()`` that applies them (TL110: the clip comes too late). For the check's
    duration it hooks every optimizer's ``step`` and ``zero_grad``, the parameters' gradient
    accumulation and those functions; a read of 0 where the backward left gradients fails
    the same way (a module's ``zero_grad()`` cleared them). Gradient accumulation (several
    backwards, one clip), AMP's ``scaler.unscale_`` then clip, and several optimizers (a
    GAN's two) are fine. A step that reads no gradient through them passes.

    Fails showing the norm the read saw, the norm the backward produced, and the order of
    events in that step.
    """
    __tracebackhide__ = True
    run = model_step_runner(CHECK, model, step, steps, batches)
    named = trainable(model)
    result = _measure(run, named, steps)
    bad = _diagnose(result)
    if not bad:
        return result
    _report(bad, result, step)


class _Tracker:
    """Per parameter: what happened last (backward, zero_grad, step) and the backward's norm."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.params = params
        self.index = {id(p): i for i, p in enumerate(params)}
        self.last: list[str | None] = [None] * len(params)
        self.norm: list[Any] = [None] * len(params)
        self.scaled: list[Any] = [None] * len(params)  # the GradScaler, until unscaled
        self.scaling: Any = None  # a GradScaler whose scale() ran, until its update()
        self.order: list[Any] = []  # this step's events: texts, and reads (_Read)
        self.pending: list[PendingRead] = []
        self.step = 0
        self.local = threading.local()
        self.unmeasured: list[int] = []  # accumulated, norm not taken yet (see measure)
        self.queued = False
        torch = _torch()
        self._floats = (torch.float32, torch.float16, torch.bfloat16)
        self._float32 = torch.float32
        self._vector_norm = torch.linalg.vector_norm
        self.eager = not _BATCHED_ON_CPU and all(p.is_cpu for p in params)
        self._queue_callback = torch.autograd.Variable._execution_engine.queue_callback

    def event(self, text: str) -> None:
        if not self.order or self.order[-1] != text:
            self.order.append(text)

    def mark(self, params: Iterable[Any], what: str, label: str) -> None:
        hit = False
        for p in params:
            i = self.index.get(id(p))
            if i is not None:
                self.last[i] = what
                hit = True
        if hit:
            self.event(label)

    def accumulated(self, param: torch.Tensor) -> None:
        """A post-accumulate-grad hook (one for every parameter, found by identity). On the
        CPU it takes the gradient's norm; elsewhere it notes the parameter, and the norms
        of what a backward accumulated are taken together when it ends (:meth:`measure`,
        an engine callback: one foreach norm where a launch per gradient was made)."""
        i = self.index[id(param)]
        self.last[i] = "backward"
        self.scaled[i] = self.scaling
        if self.eager:  # CPU: a norm now (a foreach norm there loops, at ~4x the cost)
            grad = param.grad
            if grad is None:
                self.norm[i] = None
            elif grad.dtype is self._float32 and not grad.is_sparse and not grad.requires_grad:
                self.norm[i] = self._vector_norm(grad)  # what _norm does, without its tests
            else:  # a backward with create_graph=True leaves gradients with history
                self.norm[i] = _norm(grad.detach() if grad.requires_grad else grad)
        else:
            self.unmeasured.append(i)
            if not self.queued:
                self.queued = True
                self._queue_callback(self.measure)
        order = self.order
        if not order or order[-1] != "backward":
            order.append("backward")

    def measure(self) -> None:
        """The 2-norm of each gradient accumulated since the last call, as 0-d tensors (no
        host read): one foreach norm for the dense floating ones."""
        self.queued = False
        indices, self.unmeasured = self.unmeasured, []
        if not indices:
            return
        torch = _torch()
        dense: list[int] = []
        for i in dict.fromkeys(indices):  # a parameter twice: measured once, as it is now
            grad = self.params[i].grad
            if grad is None:
                self.norm[i] = None
            elif grad.layout is torch.strided and grad.dtype in self._floats:
                dense.append(i)
            else:  # sparse, or a backward with create_graph=True (history)
                self.norm[i] = _norm(grad.detach() if grad.requires_grad else grad)
        if dense:
            grads = [self.params[i].grad.detach() for i in dense]  # type: ignore[union-attr]
            try:
                with torch.no_grad():  # float32 accumulation, as _total_norm's
                    norms = torch._foreach_norm(grads, 2, dtype=torch.float32)
            except (RuntimeError, TypeError):  # torch < 2.3, or several devices
                norms = [_norm(g) for g in grads]
            for i, value in zip(dense, norms, strict=True):
                self.norm[i] = value

    def read(self, function: str, indices: list[int], total: Any = None) -> None:
        """Note a read of the parameters ``indices``; ``total``: the total norm the read
        computed itself, where it is :func:`_total_norm`'s to the bit (see same_norm).

        Nothing is read on the host here (on a GPU that would be a sync inside the step):
        the norms stay 0-d tensors, and what the read means is decided in :meth:`reads`,
        after the last step."""
        indices = sorted(set(indices))
        if not indices:
            return
        if self.unmeasured:  # a backward outside the engine's callbacks (another thread)
            self.measure()
        if total is None:
            grads = [g for g in (self.params[i].grad for i in indices) if g is not None]
            seen = _total_norm(grads)
        else:
            seen = total.detach() if isinstance(total, _torch().Tensor) else total
        states = [self.last[i] for i in indices]
        norms = [self.norm[i] for i in indices if self.norm[i] is not None]
        backward = _stacked_norm(norms) if norms else None
        scalers = [self.scaled[i] for i in indices if self.scaled[i] is not None]
        scaler = scalers[0] if scalers else None
        read = PendingRead(self.step, function, seen, backward, states, self.order, scaler)
        self.order.append(read)
        read.at = len(self.order)
        self.pending.append(read)

    def reads(self) -> tuple[list[GradRead], Any]:
        """Every read, its norms read on the host in one pass; the last scaler a read saw."""
        pending, self.pending = self.pending, []
        scalers = [r.scaler for r in pending if r.scaler is not None]
        reads = [GradRead(*fields) for fields in read_all(pending)]
        return reads, scalers[-1] if scalers else None


def _torch() -> Any:  # (bound once per process: see _common.runtime)
    return runtime().torch


def _norm(tensor: torch.Tensor) -> torch.Tensor:
    from trainlint._runtime.norms import norm

    return norm(tensor)


def _stacked_norm(norms: list[torch.Tensor]) -> torch.Tensor:
    from trainlint._runtime.norms import stacked_norm

    return stacked_norm(norms)


def _total_norm(grads: list[torch.Tensor]) -> Any:
    from trainlint._runtime.norms import total_norm

    return total_norm(grads)


def _measure(run: Any, named: list[tuple[str, torch.Tensor]], steps: int) -> ClipResult:
    __tracebackhide__ = True
    rt = runtime()
    torch = rt.torch
    params = [p for _, p in named]
    tracker = _Tracker(params)
    by_grad: Callable[[Any], list[int]] = lambda grads: [  # noqa: E731
        i for g in grads for i, p in enumerate(params) if p.grad is g
    ]

    def wrap_util(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(first: Any, *args: Any, **kwargs: Any) -> Any:
            local = tracker.local
            if getattr(local, "inside", False):
                return original(first, *args, **kwargs)
            items = [first] if isinstance(first, torch.Tensor) else list(first)
            function = name.lstrip("_")
            if function == "get_total_norm":
                indices = by_grad(items)  # it takes the gradients, not the parameters
                # A clip_grad_norm_ bound before the check (`from torch.nn.utils import
                # clip_grad_norm_`) is seen only here, through the norm it computes.
                if sys._getframe(1).f_code.co_name == "clip_grad_norm_":
                    function = "clip_grad_norm_"
            else:
                indices = [tracker.index[id(p)] for p in items if id(p) in tracker.index]
            # where it is ours to the bit, the norm clip_grad_norm_ returns is the one the
            # read saw, computed before it clips: no second foreach norm, stack and host
            # read of our own; otherwise the read is measured before the call clips
            returned_norm = (
                function == "clip_grad_norm_"
                and name == function
                and same_norm(torch, items, indices, args, kwargs)
            )
            if not returned_norm:
                tracker.read(function, indices)
            local.inside = True
            try:
                result = original(
                    items[0] if isinstance(first, torch.Tensor) else items, *args, **kwargs
                )
            finally:
                local.inside = False
            if returned_norm:
                tracker.read(function, indices, result)
            return result

        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        return wrapper

    patches: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, replacement: Any) -> None:
        patches.append((owner, name, getattr(owner, name)))
        setattr(owner, name, replacement)

    wrapped: dict[int, Any] = {}
    for owner, name in _reads.util_targets():
        original = getattr(owner, name, None)
        if original is None:
            continue
        if id(original) not in wrapped:
            wrapped[id(original)] = wrap_util(name, original)
        patch(owner, name, wrapped[id(original)])

    optimizer_zero_grad = torch.optim.Optimizer.zero_grad

    def opt_zero_grad(self: Any, *args: Any, **kwargs: Any) -> Any:
        group_params = [p for g in self.param_groups for p in g["params"]]
        tracker.mark(group_params, "zero_grad", f"{type(self).__name__}.zero_grad")
        return optimizer_zero_grad(self, *args, **kwargs)

    def step_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
        group_params = [p for g in optimizer.param_groups for p in g["params"]]
        tracker.mark(group_params, "step", f"{type(optimizer).__name__}.step")

    handles = [rt.register_optimizer_step_pre_hook(step_hook)]
    hooks = rt.HookSet()
    patch(torch.optim.Optimizer, "zero_grad", opt_zero_grad)
    _reads.watch_scaler(tracker, patch, torch)
    try:
        hooks.add_all(params, tracker.accumulated)  # one bound method for all
        for i in range(steps):
            tracker.step = i
            tracker.order = []
            tracker.queued = False
            run()
    finally:
        for owner, name, original in reversed(patches):
            setattr(owner, name, original)
        for handle in handles:
            handle.remove()
        hooks.remove()
    reads, scaler = tracker.reads()
    scale = None if scaler is None else _reads.scale_factor(scaler)  # after the steps: no sync
    return ClipResult(steps=steps, reads=tuple(reads), scale=scale)


def _diagnose(result: ClipResult) -> list[tuple[GradRead, str]]:
    symptom_of = {
        "zero_grad": "read-after-zero-grad",
        "step": "clip-after-step",
        None: "read-before-backward",
    }
    out = []
    for read in result.reads:
        if read.after == "step" and read.function == "get_total_norm":
            continue  # a norm logged after the step still shows what backward produced
        if read.after != "backward":
            out.append((read, symptom_of[read.after]))
        elif read.scaled:
            out.append((read, "clip-before-unscale"))
    return out


def _report(bad: list[tuple[GradRead, str]], result: ClipResult, step: Step) -> NoReturn:
    __tracebackhide__ = True
    what = _reads.WHEN
    rows = [
        (r.step, r.function, what[s], r.seen, "-" if r.backward is None else r.backward)
        for r, s in bad
    ]
    first, first_symptom = bad[0]
    order = "\n".join(f"  {i + 1}. {e}" for i, e in enumerate(first.order))
    symptoms = [SYMPTOMS[s] for s in dict.fromkeys(s for _, s in bad)]
    scale = result.scale if "clip-before-unscale" in {s for _, s in bad} else None
    factor = [f"The GradScaler's scale factor after the last step: {scale:g}"] if scale else []
    fail(
        CHECK,
        f"{first.function} read the gradients {what[first_symptom]} "
        f"({plural(len(bad), 'bad read')} in {plural(result.steps, 'step')})",
        [
            table(("step", "read", "when", "norm it saw", "norm backward produced"), rows),
            f"Events of step {first.step}, in order:\n{order}",
            *factor,
            *(s.text for s in symptoms),
        ],
        symptoms=symptoms,
        sources=[step],
        result=result,
    )
