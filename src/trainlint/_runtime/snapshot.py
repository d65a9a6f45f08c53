"""A copy of a model's parameters, to tell how far each moved during a check's steps."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch

from trainlint._runtime.magnitudes import max_abs, small_dense, to_floats
from trainlint._runtime.steps import extrema, max_abs_values

_FOREACH_MAX = hasattr(torch, "_foreach_max")  # torch >= 2.4
_OFF_HEAP = 1 << 20  # bytes
_SPARE_MAX = 64 << 20  # bytes kept between checks, at most
_spare: Any = None  # a mapping a finished snapshot left for the next
_spare_lock = threading.Lock()


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
