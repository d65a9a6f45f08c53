"""The gradient reads ``assert_clip_effective`` saw, kept with their norms on the device
until the steps are over (on a GPU a host read inside a step is a sync), then read
together and given their meaning and their place in the step's events; and when the norm
``clip_grad_norm_`` returns can stand for the one the read saw."""

from __future__ import annotations

from typing import Any

from trainlint._runtime.report import fmt


def read_all(
    pending: list[PendingRead],
) -> list[tuple[int, str, float, float | None, str | None, tuple[str, ...]]]:
    """The fields of each read's ``GradRead``, every norm read in one pass."""
    from trainlint._runtime.norms import read_floats  # torch: not at import

    values = [v for r in pending for v in (r.seen, r.backward) if v is not None]
    numbers = iter(read_floats(values))
    for r in pending:
        r.seen = next(numbers) if r.seen is not None else 0.0
        r.backward = next(numbers) if r.backward is not None else None
    return [r.resolve() for r in pending]


class PendingRead:
    """A read as it happened, its norms still on the device; its place in the step's
    events (``order``, shared with the tracker, up to ``at``). No torch at import."""

    def __init__(
        self, step: int, function: str, seen: Any, backward: Any, states: list[Any], order: list
    ) -> None:
        self.step, self.function, self.seen, self.backward = step, function, seen, backward
        self.states, self.order, self.at = states, order, 0

    def after(self) -> str | None:
        states, seen, backward = self.states, self.seen, self.backward
        if "zero_grad" in states:
            return "zero_grad"
        if seen == 0 and backward:
            # cleared unseen: a module's zero_grad() (unpatched: changing Module's class
            # attributes costs every subclass its caches), `p.grad = None`, `.zero_()`
            return "zero_grad"
        if "step" in states:
            return "step"
        if None in states:
            return None
        return "backward"

    def texts(self) -> list[str]:
        """The events this read adds to its step's order."""
        out = []
        if "zero_grad" not in self.states and self.seen == 0 and self.backward:
            out.append("zero_grad() or another clear (the gradients read 0)")
        out.append(f"{self.function}  (saw {fmt(self.seen)})")
        return out

    def resolve(self) -> tuple[int, str, float, float | None, str | None, tuple[str, ...]]:
        """The fields of its ``GradRead``, once its norms are floats."""
        order: list[str] = []
        for item in self.order[: self.at]:
            if isinstance(item, str):
                order.append(item)
                continue
            for text in item.texts():  # as Tracker.event: a repeat is not added
                if not order or order[-1] != text:
                    order.append(text)
        return self.step, self.function, self.seen, self.backward, self.after(), tuple(order)


def same_norm(
    torch: Any, items: list[Any], indices: list[int], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> bool:
    """Whether ``clip_grad_norm_(items, *args, **kwargs)`` computes the total norm exactly
    as ``clip._total_norm`` does over the tracker's ``indices``: a 2-norm by foreach ops over
    dense float32 CPU gradients, of the tracked parameters in the tracker's order (the
    stacked norms are summed in that order)."""
    norm_type = args[1] if len(args) > 1 else kwargs.get("norm_type", 2.0)
    foreach = args[3] if len(args) > 3 else kwargs.get("foreach")
    if foreach is False or len(indices) != len(items):
        return False
    if not isinstance(norm_type, (int, float)) or norm_type != 2:
        return False
    if indices != sorted(set(indices)):  # read() sums in the tracker's order
        return False
    float32, strided = torch.float32, torch.strided
    for p in items:
        g = p.grad
        if g is None:
            continue
        # checked to the bit on the CPU only (is_cpu: no device object made per gradient)
        if g.dtype is not float32 or g.layout is not strided or not g.is_cpu:
            return False
    return True
