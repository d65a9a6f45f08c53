"""What a check keeps to rerun the first step whose backward made a NaN or Inf gradient,
with no host read while the steps run, and almost no copying on steps that go well.

A step's forward and backward depend on the trainable parameters, the module's buffers,
the random state and the batch, not on the optimizer's state: the rerun stops inside
``backward()`` (under anomaly detection), before any optimizer runs.

The parameters are copied at the end of a backward (an engine callback: nothing after
``backward()`` in the step, an optimizer's ``step()`` included, has run yet), and only
at the end of the first backward of the check that made a non-finite gradient. That
condition is a flag on the device; reading it on the host would be a sync on a GPU, so
the copy is made by a kernel that reads the flag itself and returns at once when it says
"skip": ``torch._fused_sgd_`` with ``found_inf`` (what a GradScaler uses to skip a step)
and, on its first step, a momentum buffer set to the gradient exactly (its ``lr`` is 0,
and the parameter it updates is a scratch tensor). So a check that passes pays a few
microseconds a backward instead of a parameter-sized copy a step (1.6 ms a step on a
4M-parameter CPU model, 5% of its step). A dtype that kernel does not take is copied by
``torch.where`` on the flag. A step that changes its parameters before the backward that
fails (a GAN's discriminator step between two backwards) is rerun from the parameters
that backward saw, where stopping the step there used to leave them.

The buffers (a BatchNorm's running statistics) change in the forward pass, so they are
copied as each step begins (:class:`~trainlint._runtime.snapshot.StepStart`, which keeps
the first failing step's copy on the device too); they are small next to the parameters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from trainlint._runtime.pool import KeptPool
from trainlint._runtime.snapshot import StepStart

_fused_sgd = getattr(torch, "_fused_sgd_", None)  # torch >= 2.2
_FUSED_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_KEEP_MAX = 64 << 20  # bytes of CPU copies kept for the next check, at most
_grad_enabled = torch.is_grad_enabled
_set_grad_enabled = torch._C._set_grad_enabled


class _Group:
    """The parameters of one device and dtype: the copy's views in one flat buffer, and
    (the fused copy) a scratch tensor the kernel writes its unused update into."""

    __slots__ = ("params", "kept", "views", "scratch", "fused")

    def __init__(self, params: list[torch.Tensor]) -> None:
        first = params[0]
        self.params = params
        self.kept = torch.empty(
            sum(p.numel() for p in params), dtype=first.dtype, device=first.device
        )
        self.views: list[torch.Tensor] = []
        offset = 0
        for p in params:
            n = p.numel()
            self.views.append(self.kept[offset : offset + n].view(p.shape))
            offset += n
        self.fused = (
            _fused_sgd is not None
            and first.dtype in _FUSED_DTYPES
            and all(p.is_contiguous() for p in params)
            and _fused_copies(first.device, first.dtype)
        )
        self.scratch: list[torch.Tensor] = []
        if self.fused:
            # one region as large as the largest parameter, each scratch a view of its
            # start: what the kernel writes there is never read
            largest = max(p.numel() for p in params)
            region = torch.empty(largest, dtype=first.dtype, device=first.device)
            self.scratch = [region[: p.numel()].view(p.shape) for p in params]

    def copy_if(self, skip: torch.Tensor) -> None:
        """Copy the parameters into ``views`` unless ``skip`` (a 0-d float, 1.0: skip)."""
        if self.fused:
            try:
                _copy_unless(self.scratch, self.params, self.views, skip)
                return
            except RuntimeError:  # a device or layout the kernel refuses: where, from now
                self.fused, self.scratch = False, []
        take = skip == 0
        for p, view in zip(self.params, self.views, strict=True):
            torch.where(take, p, view, out=view)

    def restore(self) -> None:
        torch._foreach_copy_(self.params, self.views)


def _copy_unless(
    scratch: list[torch.Tensor], sources: list[torch.Tensor], into: list[torch.Tensor],
    skip: torch.Tensor,
) -> None:
    """``into[i] = sources[i]`` unless ``skip`` (a device flag) is nonzero: SGD's fused
    kernel at momentum 1, lr 0, first step, with ``scratch`` as the "parameters", sets its
    momentum buffers (``into``) to the "gradients" (``sources``) and skips on ``found_inf``."""
    _fused_sgd(  # type: ignore[misc]
        scratch,
        sources,
        into,
        weight_decay=0.0,
        momentum=1.0,
        lr=0.0,
        dampening=0.0,
        nesterov=False,
        maximize=False,
        is_first_step=True,
        found_inf=skip,
    )


_free_groups: KeptPool[list[_Group]] = KeptPool(4, per_key=1)
_FUSED_OK: dict[tuple[torch.device, torch.dtype], bool] = {}


def _fused_copies(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the fused kernel, on this device and dtype, copies exactly when told to and
    writes nothing when told to skip: tried once a process on four values (an Inf and a
    negative zero among them), read on the host before any step runs; else ``where``."""
    known = _FUSED_OK.get((device, dtype))
    if known is None:
        try:
            values = torch.tensor([1.5, -0.0, math.inf, -3.25], dtype=dtype, device=device)
            kept = torch.zeros_like(values)
            calls = []
            for skip in (1.0, 0.0):
                flag = torch.tensor(skip, device=device)
                _copy_unless([torch.zeros_like(values)], [values], [kept], flag)
                calls.append(kept.clone())
            skipped, copied = calls
            known = (
                bool((skipped == 0).all())
                and not bool(torch.signbit(skipped).any())
                and torch.equal(copied, values)
                and bool(torch.signbit(copied[1]))
            )
        except RuntimeError:
            known = False
        _FUSED_OK[(device, dtype)] = known
    return known


class FirstFailure:
    """The start of the first step whose backward made a NaN or Inf gradient: its
    parameters (as the end of that backward found them) and its buffers, kept on their
    devices while the steps run; :meth:`restore` puts them back, after the steps.

    ``backward_ended(ok)`` is called at the end of each backward with a 0-d bool on the
    device (:meth:`GradRecorder.finite_since_mark`), ``begin_step`` and ``end_step``
    around each step.
    """

    def __init__(
        self, params: Sequence[torch.Tensor], buffers: Sequence[torch.Tensor], steps: int
    ) -> None:
        strided = torch.strided
        dense = [p for p in params if p.layout is strided]  # a sparse one reruns as it is
        self._key = tuple((p.device, p.dtype, p.shape, p.is_contiguous()) for p in dense)
        groups = _free_groups.take(self._key)
        if groups is not None:
            for group, members in zip(groups, _by_group(dense), strict=True):
                group.params = members  # the same shapes: this check's tensors
        else:
            groups = [_Group(members) for members in _by_group(dense)]
        self._groups = groups
        self._buffers = StepStart(buffers, steps)
        self._clean: torch.Tensor | None = None  # every backward so far was finite
        # each backward's step and its flag, read once if a step failed
        self._ends: list[tuple[int, torch.Tensor]] = []
        self._step = 0

    def begin_step(self, step: int) -> None:
        self._step = step
        self._buffers.take()

    def backward_ended(self, ok: torch.Tensor | None) -> None:
        """Copy the parameters unless ``ok`` (a 0-d bool on the device: every gradient
        of that backward finite) or an earlier backward was not."""
        if ok is None:
            return
        self._ends.append((self._step, ok))
        clean = self._clean
        # skip: this backward is fine, or the copy was taken before
        skip = ok if clean is None else ok | ~clean
        self._clean = ok if clean is None else clean & ok
        if not self._groups:
            return
        enabled = _grad_enabled()
        _set_grad_enabled(False)  # no_grad
        try:
            flags: dict[Any, torch.Tensor] = {}
            for group in self._groups:
                device = group.kept.device
                if device not in flags:
                    flags[device] = skip.to(device, torch.float32, non_blocking=True)
                group.copy_if(flags[device])
        finally:
            _set_grad_enabled(enabled)

    def end_step(self) -> None:
        """The step ended (with more to come): the buffers' next copy goes to the spare
        row once a backward went wrong."""
        self._buffers.end_step(self._clean)

    def restore(self, step: int) -> None:
        """Put back what ``step`` (the first failing one) began with: its buffers, and its
        parameters when they were copied at the end of its backward (a step stopped by
        its own anomaly detection raised inside backward: its parameters are as it left
        them). One host read."""
        self._buffers.restore()
        ends = self._ends
        if not ends:
            return
        device = ends[0][1].device
        oks = torch.stack([ok.to(device) for _, ok in ends]).tolist()
        copied = next((s for (s, _), ok in zip(ends, oks, strict=True) if not ok), None)
        if copied == step:
            with torch.no_grad():
                for group in self._groups:
                    group.restore()

    def release(self) -> None:
        """Give the CPU buffers back for the next check."""
        self._buffers.release()
        groups, self._groups = self._groups, []
        size = sum(g.kept.numel() * g.kept.element_size() for g in groups)
        if groups and size <= _KEEP_MAX and all(g.kept.is_cpu for g in groups):
            for group in groups:
                group.params = []  # not the model's tensors, kept past the check
            _free_groups.give(self._key, groups)


def _by_group(params: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for p in params:
        groups.setdefault((p.device, p.dtype), []).append(p)
    return list(groups.values())
