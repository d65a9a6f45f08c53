"""The gradient reads ``assert_clip_effective`` saw, kept with their norms on the device
until the steps are over (on a GPU a host read inside a step is a sync), then read
together and given their meaning and their place in the step's events; and when the norm
``clip_grad_norm_`` returns can stand for the one the read saw."""

from __future__ import annotations

from typing import Any

from trainlint._runtime.report import fmt


def read_all(
    pending: list[PendingRead],
) -> list[tuple[int, str, float, float | None, str | None, tuple[str, ...], bool]]:
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
        self,
        step: int,
        function: str,
        seen: Any,
        backward: Any,
        states: list[Any],
        order: list,
        scaler: Any = None,
    ) -> None:
        self.step, self.function, self.seen, self.backward = step, function, seen, backward
        self.states, self.order, self.at = states, order, 0
        self.scaler = scaler  # the GradScaler whose factor the gradients still carry

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

    def resolve(
        self,
    ) -> tuple[int, str, float, float | None, str | None, tuple[str, ...], bool]:
        """The fields of its ``GradRead``, once its norms are floats."""
        order: list[str] = []
        for item in self.order[: self.at]:
            if isinstance(item, str):
                order.append(item)
                continue
            for text in item.texts():  # as Tracker.event: a repeat is not added
                if not order or order[-1] != text:
                    order.append(text)
        fields = self.step, self.function, self.seen, self.backward, self.after(), tuple(order)
        return (*fields, self.scaler is not None)


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


_UTILS = ("clip_grad_norm_", "clip_grad_norm", "clip_grad_value_", "get_total_norm")
_TARGETS: list[tuple[Any, str]] | None = None  # (a getattr of a missing name raises: once)

# what each symptom's read came at, in the failure's table
WHEN = {
    "read-after-zero-grad": "after zero_grad()",
    "clip-after-step": "after optimizer.step()",
    "read-before-backward": "before backward()",
    "clip-before-unscale": "before scaler.unscale_()",
}


def util_targets() -> list[tuple[Any, str]]:
    """(module, name) of each gradient-reading function to wrap, found once per process."""
    global _TARGETS
    if _TARGETS is None:
        import torch.nn.utils as nn_utils
        import torch.nn.utils.clip_grad as clip_grad

        _TARGETS = [
            (owner, name)
            for owner in (nn_utils, clip_grad)
            for name in (*_UTILS, "_get_total_norm")
            if hasattr(owner, name)
        ]
    return _TARGETS


def watch_scaler(tracker: Any, patch: Any, torch: Any) -> None:
    """Patch ``GradScaler``'s ``scale``, ``unscale_``, ``step`` and ``update`` (through
    ``patch(owner, name, replacement)``, which restores them) so that the tracker knows
    which gradients are still multiplied by the scale factor: those a backward accumulated
    after an enabled scaler's ``scale()`` (``tracker.scaling``, until ``update()``), until
    ``unscale_`` or ``step`` of the optimizer holding them. Nothing is read on the host:
    the scale factor stays on the scaler, read once after the last step."""
    cls = getattr(getattr(torch, "amp", None), "GradScaler", None)
    if cls is None:  # torch < 2.3: torch.cuda.amp's is the only one
        cls = torch.cuda.amp.GradScaler
    scale, unscale, step, update = cls.scale, cls.unscale_, cls.step, cls.update

    def unscaled(optimizer: Any) -> None:
        for group in optimizer.param_groups:
            for p in group["params"]:
                i = tracker.index.get(id(p))
                if i is not None:
                    tracker.scaled[i] = None

    def scale_(self: Any, outputs: Any) -> Any:
        if self._enabled:  # a disabled scaler returns the outputs as they are
            tracker.scaling = self
            tracker.event("GradScaler.scale")
        return scale(self, outputs)

    def unscale_(self: Any, optimizer: Any) -> Any:
        result = unscale(self, optimizer)  # raises on a second unscale_: nothing noted
        if self._enabled:
            unscaled(optimizer)
            tracker.event(f"GradScaler.unscale_({type(optimizer).__name__})")
        return result

    def step_(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        if self._enabled:
            tracker.event(f"GradScaler.step({type(optimizer).__name__})")
        result = step(self, optimizer, *args, **kwargs)
        if self._enabled:  # it unscales first; a step skipped for an inf leaves them so
            unscaled(optimizer)
        return result

    def update_(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self._enabled:
            tracker.scaling = None
            tracker.event("GradScaler.update")
        return update(self, *args, **kwargs)

    replacements: dict[str, Any] = {
        "scale": scale_,
        "unscale_": unscale_,
        "step": step_,
        "update": update_,
    }
    for name, replacement in replacements.items():
        replacement.__wrapped__ = getattr(cls, name)
        patch(cls, name, replacement)


def scale_factor(scaler: Any) -> float | None:
    """The scale factor of the scaler that scaled a bad read's gradients (a host read:
    after the last step only)."""
    try:
        return float(scaler.get_scale())
    except (AttributeError, RuntimeError, TypeError):
        return None
