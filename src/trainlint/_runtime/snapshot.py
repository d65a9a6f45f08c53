"""A copy of a model's parameters, to tell how far each moved during a check's steps."""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any

import torch

from trainlint._runtime.magnitudes import max_abs, small_dense, to_floats
from trainlint._runtime.pool import KeptPool
from trainlint._runtime.steps import extrema, max_abs_values

_FOREACH_MAX = hasattr(torch, "_foreach_max")  # torch >= 2.4
_OFF_HEAP = 1 << 20  # bytes
_SPARE_MAX = 64 << 20  # bytes kept between checks, at most
_spare: Any = None  # a mapping a finished snapshot left for the next
_spare_lock = threading.Lock()
_ROW = 1024  # elements per row of the small models' copy (see _Rows)
_foreach_copy = getattr(torch, "_foreach_copy_", None)
# what torch.no_grad() does on entry and exit, without its objects: ~18k instructions a
# `with torch.no_grad()`, against ~4k for the two calls
_grad_enabled = torch.is_grad_enabled
_set_grad_enabled = torch._C._set_grad_enabled


class Snapshot:
    """A copy of parameters, to tell how far each moved: the largest |change| of each.

    The copies of dense floating-point parameters are compared with one in-place
    subtraction, one ``abs_`` and one max over all of them (``torch._foreach_*``: on a
    small model, per-parameter ``sub_``/``aminmax`` calls and the stack of their results
    were most of the check's fixed cost); other tensors (sparse, complex, integer) one by
    one. The copy is subtracted in place: a second parameter-sized buffer is what made the
    weights check cost 30% of a step on a 4M-parameter model.
    """

    def __init__(self, params: Sequence[torch.Tensor]) -> None:
        # the parameters themselves, read under no_grad: `p.data = ...` rebinds the storage
        self.params = list(params)
        self._mapped: Any = None
        self._rows = take_rows(self.params)
        if self._rows is not None:
            self.before = self._rows.copy_in(self.params)
            return
        # in one pass: the bytes to copy, and whether all are dense floating tensors, and
        # small ones (small_dense implies dense: the foreach path is the whole of changes())
        strided = torch.strided
        total, self._dense, self._small = 0, True, True
        for p in self.params:
            total += (p.numel() * p.element_size() + 63) // 64 * 64
            self._dense = self._dense and p.layout is strided and p.dtype.is_floating_point
            self._small = self._small and small_dense(p)
        with torch.no_grad():
            self.before = (total >= _OFF_HEAP and self._copy_off_heap()) or [
                p.clone() for p in self.params
            ]

    def _copy_off_heap(self) -> list[torch.Tensor] | None:
        """Large CPU parameters copied into one anonymous mmap, outside malloc: a
        parameter-sized malloc and free per check moved glibc's mmap threshold so that the
        step's own allocations page-faulted, 1.4x a bare step on a 4M-parameter MLP."""
        import mmap

        params = self.params
        sizes = [p.numel() * p.element_size() for p in params]
        total = sum((n + 63) // 64 * 64 for n in sizes)
        if total < _OFF_HEAP:  # first: most models a check runs on in tests are small
            return None
        if not all(
            p.device.type == "cpu"
            and p.layout is torch.strided
            and p.dtype.is_floating_point
            and not p.dtype.is_complex
            for p in params
        ):
            return None
        global _spare
        with _spare_lock:  # checks in two threads must not share one mapping
            if _spare is not None and len(_spare) >= total:
                self._mapped, _spare = _spare, None  # pages already touched: no faults
        if self._mapped is None:
            flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_ANONYMOUS", 0x20)
            # all pages in one call: a fault per 4 KiB on first touch costs more than the copy
            flags |= getattr(mmap, "MAP_POPULATE", 0)
            self._mapped = mmap.mmap(-1, total, flags=flags)
        copies, offset = [], 0
        for p, n in zip(params, sizes, strict=True):
            flat = torch.frombuffer(self._mapped, dtype=p.dtype, count=p.numel(), offset=offset)
            copy = flat.view(p.shape)
            copy.copy_(p)
            copies.append(copy)
            offset += (n + 63) // 64 * 64
        return copies

    def changes(self) -> list[float]:
        """max |now - then| per parameter (NaN when a value became NaN); uses the copy up."""
        before, self.before = self.before, []
        now = self.params
        rows, self._rows = self._rows, None
        if rows is not None:
            try:
                return rows.changes(now)
            finally:
                give_back_rows(rows)
        with torch.no_grad():
            if not self._dense or not _FOREACH_MAX:
                pairs = [extrema(b.sub_(n)) for b, n in zip(before, now, strict=True)]
                del before
                self._keep_spare()
                return max_abs_values(pairs)
            try:
                torch._foreach_sub_(before, now)
            except RuntimeError:  # a dtype or device changed under us: one by one
                for b, n in zip(before, now, strict=True):
                    b.sub_(n)
            # small copies: abs in place (they are ours: no copy to allocate) and one
            # foreach max, 43-47 us in a check on the small MLP against 51-56 us for an
            # aminmax each and more for an abs that allocates; large ones: aminmax (one
            # read pass, no write); one host transfer for all
            if self._small:
                torch._foreach_abs_(before)
                out = to_floats(list(torch._foreach_max(before)))
            else:
                out = to_floats(max_abs(before, small=False))
        del before
        self._keep_spare()
        return out

    def _keep_spare(self) -> None:
        """Keep the mapping (up to _SPARE_MAX bytes) for the next check: fresh pages cost
        ~0.5 ms a MiB on a VM, 10 ms a check for a 4M-parameter model."""
        global _spare
        mapped, self._mapped = self._mapped, None
        if mapped is not None and len(mapped) <= _SPARE_MAX:
            with _spare_lock:
                if _spare is None or len(mapped) > len(_spare):
                    _spare = mapped


class _Rows:
    """The copy of a small model's float32 CPU parameters, each in its own rows of one
    zeroed (rows, _ROW) buffer (a parameter starts a row; the rest of its last row stays
    0): one foreach copy in, one foreach subtraction, an ``abs_`` and a max per row give
    every parameter's largest |change| from its rows' maxima, where a clone, a
    subtraction, an abs and a max per parameter cost ~15k instructions each. Made once
    per list of shapes and kept for the next check (:func:`take_rows`)."""

    __slots__ = ("key", "buffer", "views", "spans")

    def __init__(self, key: tuple[torch.Size, ...]) -> None:
        self.key = key
        self.spans: list[tuple[int, int]] = []
        start = 0
        for shape in key:
            n = shape.numel()
            end = start + (n + _ROW - 1) // _ROW
            self.spans.append((start, end))
            start = end
        self.buffer = torch.zeros(start, _ROW)
        flat = self.buffer.view(-1)
        self.views = [
            flat[a * _ROW : a * _ROW + shape.numel()].view(shape)
            for (a, _), shape in zip(self.spans, key, strict=True)
        ]

    def copy_in(self, params: list[torch.Tensor]) -> list[torch.Tensor]:
        enabled = _grad_enabled()
        _set_grad_enabled(False)  # no_grad
        try:
            if _foreach_copy is not None:
                _foreach_copy(self.views, params)
            else:  # pragma: no cover - torch without _foreach_copy_
                for view, p in zip(self.views, params, strict=True):
                    view.copy_(p)
        finally:
            _set_grad_enabled(enabled)
        return self.views

    def changes(self, now: list[torch.Tensor]) -> list[float]:
        views = self.views
        enabled = _grad_enabled()
        _set_grad_enabled(False)  # no_grad
        try:
            try:
                torch._foreach_sub_(views, now)
            except RuntimeError:  # a dtype or device changed under us: one by one
                for b, n in zip(views, now, strict=True):
                    b.sub_(n)
            # abs in place and a max per row: 47k instructions on the small MLP's 29 rows,
            # where aminmax(dim=1) is not vectorized (380k)
            highs = self.buffer.abs_().amax(1).tolist()
        finally:
            _set_grad_enabled(enabled)
        total = sum(highs)  # NaN when a row's max is (all are >= 0: no Inf - Inf)
        maybe_nan = total != total  # NaN wins, and Python's max is not NaN-safe
        out = []
        for first, end in self.spans:
            row = highs[first:end]
            out.append(math.nan if maybe_nan and any(v != v for v in row) else max(row))
        return out


class StepStart:
    """Tensors as they were when a step began (a model's buffers: a BatchNorm's running
    statistics change in the forward pass), kept for the first step that went wrong, so
    that a check can rerun that step after the others ran (a non-finite gradient is found
    once the steps are over: stopping at it would take a host read per backward).

    One flat buffer per device and dtype holds the copy (one foreach copy a step). With
    more steps to come it has two rows: a step's copy goes to row 0 while no earlier step
    went wrong, else to row 1, chosen on the device (an ``index_copy_`` whose index is the
    0-d flag of the steps so far), so that row 0 ends holding the first failing step's
    start (or the last step's) with nothing read on the host and no more memory traffic
    than the copy itself (a ``where`` per step read three tensors). CPU buffers are kept
    for the next check (a parameter-sized malloc and free per check slows the step's own
    allocations: see :meth:`Snapshot._copy_off_heap`); others are the caching allocator's
    to reuse.
    """

    def __init__(self, tensors: Sequence[torch.Tensor], steps: int) -> None:
        # dense tensors only: a sparse parameter is rerun as it is now
        strided = torch.strided
        self.params = [t for t in tensors if t.layout is strided]
        key = (tuple((p.device, p.dtype, p.shape) for p in self.params), steps > 1)
        self._key = key
        # per device: the row (0 or 1, a 1-element index) the next step's copy goes to
        self._rows: dict[torch.device, torch.Tensor] = {}
        kept = _free_starts.take(key)
        if kept is None:
            kept = _layout(self.params, steps > 1)
        # the buffers; each tensor's view in row 0, and (two rows) its (2, n) view
        self._buffers, self.views, self._pairs = kept

    def take(self) -> None:
        """Copy the tensors (at the start of a step) into the row the steps so far chose."""
        if not self.params:
            return
        enabled = _grad_enabled()
        _set_grad_enabled(False)  # no_grad
        try:
            if not self._rows:  # the first step, or a single row: row 0
                torch._foreach_copy_(self.views, self.params)
                return
            rows = self._rows
            for pair, p in zip(self._pairs, self.params, strict=True):
                pair.index_copy_(0, rows[p.device], p.reshape(1, -1))
        finally:
            _set_grad_enabled(enabled)

    def end_step(self, clean: torch.Tensor | None) -> None:
        """Note whether every step so far went well (``clean``, a 0-d bool on the device):
        once one did not, later copies go to the spare row."""
        if clean is None or not self._pairs:
            return
        row = (~clean).to(torch.long).reshape(1)
        self._rows = {b.device: row.to(b.device, non_blocking=True) for b in self._buffers}

    def restore(self) -> None:
        """Put the kept copy (row 0) back."""
        if self.params and len(self.views) == len(self.params):
            with torch.no_grad():
                torch._foreach_copy_(self.params, self.views)

    def release(self) -> None:
        """Give the CPU buffers back for the next check."""
        buffers, self._buffers = self._buffers, []
        if buffers and all(
            b.is_cpu and b.numel() * b.element_size() <= _SPARE_MAX for b in buffers
        ):
            _free_starts.give(self._key, (buffers, self.views, self._pairs))
        self.views, self._pairs = [], []


Layout = tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]


def _layout(params: list[torch.Tensor], keep: bool) -> Layout:
    """Buffers for :class:`StepStart`, one per device and dtype ((2, n) with ``keep``),
    each tensor's view in row 0 and (``keep``) its (2, numel) view of both rows."""
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for at, p in enumerate(params):
        groups.setdefault((p.device, p.dtype), []).append(at)
    buffers: list[torch.Tensor] = []
    views: list[Any] = [None] * len(params)
    pairs: list[Any] = [None] * len(params) if keep else []
    for (device, dtype), members in groups.items():
        total = sum(params[at].numel() for at in members)
        buffer = torch.empty((2 if keep else 1, total), dtype=dtype, device=device)
        buffers.append(buffer)
        offset = 0
        for at in members:
            p = params[at]
            n = p.numel()
            views[at] = buffer[0, offset : offset + n].view(p.shape)
            if keep:
                pairs[at] = buffer[:, offset : offset + n]
            offset += n
    return buffers, views, pairs


_free_starts: KeptPool[Layout] = KeptPool(4)

_NOT_ROWS: set[tuple[torch.Size, ...]] = set()  # shapes too large for rows
_ROWS_MAX = _OFF_HEAP  # bytes of a rows buffer, at most: larger models copy as before
_ROW_SHAPES = 16  # lists of shapes kept, at most
_free_rows: KeptPool[_Rows] = KeptPool(_ROW_SHAPES)


def take_rows(params: list[torch.Tensor]) -> _Rows | None:
    """The rows for these parameters when all are dense float32 CPU tensors small enough,
    a kept one when one is free (two snapshots at once never share one); else None."""
    float32, strided = torch.float32, torch.strided
    key = []
    for p in params:
        if p.dtype is not float32 or p.layout is not strided or not p.is_cpu:
            return None
        key.append(p.shape)
    shapes = tuple(key)
    if shapes in _NOT_ROWS:
        return None
    kept = _free_rows.take(shapes)
    if kept is not None:
        return kept
    numels = [s.numel() for s in shapes]
    rows = sum((n + _ROW - 1) // _ROW for n in numels)
    if not shapes or 0 in numels or rows * _ROW * 4 > _ROWS_MAX:
        if len(_NOT_ROWS) >= _ROW_SHAPES:
            _NOT_ROWS.clear()
        _NOT_ROWS.add(shapes)
        return None
    return _Rows(shapes)


def give_back_rows(rows: _Rows) -> None:
    _free_rows.give(rows.key, rows)
