"""Runtime checks that run real training steps and confirm silent training bugs.

Each check is a plain function (usable without pytest, like :mod:`torch.testing`) and, through
trainlint's pytest plugin, a fixture of the same name that returns it. A check raises
:class:`CheckFailed` (an :class:`AssertionError`) with a readable table on failure, naming the
static rules that explain the symptom and the linter's findings on the step's lines, and
returns a result object with its measurements on success.

Most checks take ``step``, a callable that performs one training step. It takes no
arguments (close over your batch), or one batch when ``batches=`` is given; the batches are
cycled if there are fewer than ``steps``. Steps are numbered from 0. Tensors stay where the
model put them: the checks run on CPU and CUDA alike.

Importing this module does not import torch; each check does, when called.
"""

from __future__ import annotations

import gc
import math
import os
import statistics
import sys
import threading
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, overload

from trainlint._runtime.report import fail, fmt, fmt_bytes, table

if TYPE_CHECKING:
    import torch

    from trainlint._runtime.steps import ParamSpec, StepRunner

__all__ = [
    "CheckFailed",
    "FiniteGradsResult",
    "GradsResult",
    "LRTrace",
    "LossResult",
    "MemoryResult",
    "StepTimeResult",
    "ThreadSafetyResult",
    "WeightsResult",
    "assert_finite_grads",
    "assert_grads_nonzero",
    "assert_loss_decreases",
    "assert_lr_schedule",
    "assert_memory_stable",
    "assert_step_time_stable",
    "assert_thread_safe",
    "assert_weights_updated",
]

Step = Callable[..., Any]


class CheckFailed(AssertionError):
    """A trainlint runtime check failed.

    ``check`` is the check's name, ``rules`` the codes of the static rules that explain the
    symptom, ``result`` the measurements taken before the failure (a result object, or None).
    """

    def __init__(
        self, message: str, *, check: str, rules: tuple[str, ...] = (), result: Any = None
    ) -> None:
        super().__init__(message)
        self.check = check
        self.rules = rules
        self.result = result


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class GradsResult:
    """What :func:`assert_grads_nonzero` measured.

    ``max_abs[name][i]`` is the largest |gradient| parameter ``name`` received in step ``i``
    (None: no gradient reached it).
    """

    steps: int
    max_abs: dict[str, tuple[float | None, ...]]
    shapes: dict[str, tuple[int, ...]]
    ignored: tuple[str, ...] = ()


@dataclass(frozen=True)
class FiniteGradsResult:
    """What :func:`assert_finite_grads` measured; ``losses`` holds what the step returned."""

    steps: int
    max_abs: dict[str, tuple[float | None, ...]]
    losses: tuple[float | None, ...]


@dataclass(frozen=True)
class WeightsResult:
    """What :func:`assert_weights_updated` measured: the largest |change| per parameter."""

    steps: int
    change: dict[str, float]
    frozen_change: dict[str, float]
    got_grad: dict[str, bool]


@dataclass(frozen=True)
class MemoryResult:
    """What :func:`assert_memory_stable` measured.

    Each series starts with the value after warmup, then one value after each step:
    ``saved_bytes`` (a), ``graph_nodes`` (b) and ``cuda_bytes`` (c, None when CUDA was not
    in use: not measured is not the same as stable). ``growth`` is the mean growth per step.
    """

    steps: int
    warmup: int
    saved_bytes: tuple[int, ...]
    graph_nodes: tuple[int, ...]
    cuda_bytes: tuple[int, ...] | None
    growth: dict[str, float]

    @property
    def measured(self) -> tuple[str, ...]:
        names = ("saved_bytes", "graph_nodes")
        return names + (("cuda_bytes",) if self.cuda_bytes is not None else ())


@dataclass(frozen=True)
class StepTimeResult:
    """What :func:`assert_step_time_stable` measured (seconds).

    ``ratio`` is the median of the later half of the timed steps over the median of the
    first half; ``confirm_median`` is the median of the extra steps timed to confirm a
    slowdown (None when there was none). ``syncs[i]`` counts the host syncs of step ``i``
    and ``sync_sites`` where they came from; both are None off CUDA.
    """

    times: tuple[float, ...]
    early_median: float
    late_median: float
    ratio: float
    confirm_median: float | None = None
    syncs: tuple[int, ...] | None = None
    sync_sites: dict[str, int] | None = None


@dataclass(frozen=True)
class LRTrace(Sequence[float]):
    """The learning rate each optimizer update used: ``trace[i]`` is step ``i``'s LR."""

    lrs: tuple[float, ...]

    @overload
    def __getitem__(self, index: int) -> float: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[float]: ...

    def __getitem__(self, index: int | slice) -> float | Sequence[float]:
        return self.lrs[index]

    def __len__(self) -> int:
        return len(self.lrs)

    def __iter__(self) -> Iterator[float]:
        return iter(self.lrs)


@dataclass(frozen=True)
class LossResult:
    """The losses the step returned, in order."""

    losses: tuple[float, ...]

    @property
    def first(self) -> float:
        return self.losses[0]

    @property
    def last(self) -> float:
        return self.losses[-1]


@dataclass(frozen=True)
class ThreadSafetyResult:
    """What :func:`assert_thread_safe` measured: max |threaded - sequential| per gradient."""

    threads: int
    batches: int
    max_abs_diff: dict[str, float] = field(default_factory=dict)


# --------------------------------------------------------------------------- gradients


def assert_grads_nonzero(
    model: torch.nn.Module,
    step: Step,
    *,
    steps: int = 1,
    ignore: Sequence[ParamSpec] | ParamSpec = (),
    batches: Iterable[Any] | None = None,
) -> GradsResult:
    """Every trainable parameter receives a gradient that is not None and not all zero.

    Gradients are recorded as autograd accumulates them (post-accumulate-grad hooks), so a
    ``zero_grad()`` at the end of the step does not hide them; each of the ``steps`` steps
    must give every parameter one. ``ignore`` takes parameter names, module paths
    (``"encoder"``), globs (``"*.bias"``), tensors or submodules. Gradients taken with
    ``torch.autograd.grad`` are not accumulated into ``.grad`` and so are not seen.

    Fails listing the parameters with no or all-zero gradients by module path and shape.
    """
    __tracebackhide__ = True
    from trainlint._runtime.steps import GradRecorder, StepRunner, check_count, match_params

    check_count("steps", steps, 1)
    run = StepRunner(step, batches)
    ignored = match_params(model, ignore, "ignore") if ignore else set()
    named = _trainable(model, exclude=ignored)
    recorder = GradRecorder([p for _, p in named])
    with recorder:
        for i in range(steps):
            recorder.begin_step(i)
            run()
            recorder.end_step()
    per_step = recorder.table(steps)
    result = GradsResult(
        steps=steps,
        max_abs={n: tuple(per_step[i][j] for i in range(steps)) for j, (n, _) in enumerate(named)},
        shapes={n: tuple(p.shape) for n, p in named},
        ignored=tuple(sorted(ignored)),
    )

    rows = []
    missing: set[str] = set()
    zero: set[str] = set()
    for name, param in named:
        values = result.max_abs[name]
        none_steps = [i for i, v in enumerate(values) if v is None]
        zero_steps = [i for i, v in enumerate(values) if v == 0.0]
        if none_steps:
            missing.add(name)
            rows.append((name, tuple(param.shape), "None", _steps_text(none_steps, steps)))
        if zero_steps:
            zero.add(name)
            rows.append((name, tuple(param.shape), "all zero", _steps_text(zero_steps, steps)))
    if not rows:
        return result

    bad = missing | zero
    sections = [table(("parameter", "shape", "gradient", "steps"), rows)]
    rules: list[str] = []
    if len(missing) == len(named) and all(v is None for vs in result.max_abs.values() for v in vs):
        sections.append(
            "No gradient reached any parameter of this model. Either backward() never ran "
            "through it (the loss was cut from the graph, or computed under no_grad), or the "
            "step trained another object: a copy made by deepcopy or pickling, a model sent "
            "to a Ray remote or actor, or to a forked process, whose updates never come back."
        )
        rules += ["TL108", "TL105", "TL501", "TL502", "TL107"]
    elif missing:
        sections.append(
            "Parameters with a None gradient are not on the path from the loss to the "
            "model: a branch was detached (.detach(), .data, .item(), a torch.no_grad() block "
            "around part of the forward), or a submodule's output is never used."
        )
        rules += ["TL108", "TL105"]
    if zero:
        sections.append(
            "All-zero gradients mean the parameters are in the graph but nothing flows back "
            "through them: dead ReLUs (pre-activations all negative), a multiplication by "
            "zero, or a mask. (If instead your logged gradient norm is 0 while this check "
            "passes, the norm is read after zero_grad().)"
        )
        rules += ["TL101", "TL108", "TL105"]
    fail(
        "assert_grads_nonzero",
        f"{len(bad)} of {len(named)} trainable parameters got no gradient or an all-zero one"
        f" ({_plural(steps, 'step')})",
        sections,
        rules=rules,
        sources=[step],
        result=result,
    )


def assert_finite_grads(
    model: torch.nn.Module,
    step: Step,
    *,
    steps: int = 1,
    locate: bool = True,
    batches: Iterable[Any] | None = None,
) -> FiniteGradsResult:
    """No NaN or Inf in any gradient, nor in the loss when the step returns it.

    On failure names the first parameter (in backward order: the one nearest the loss) and
    the step where a non-finite gradient appeared. With ``locate=True`` the step is stopped
    inside ``backward()`` at the first non-finite gradient, before the optimizer spreads it
    to the weights, and rerun with the same batch and random state under
    ``torch.autograd.detect_anomaly()`` to name the backward op that produced it (e.g.
    ``LogBackward0``) and the forward line that created that op. That costs a host sync per
    gradient on CUDA; ``locate=False`` only records.
    """
    __tracebackhide__ = True
    import torch

    from trainlint._runtime.steps import (
        GradRecorder,
        NonFiniteGradient,
        StepRunner,
        check_count,
        model_device,
    )

    check_count("steps", steps, 1)
    run = StepRunner(step, batches)
    named = _trainable(model)
    device = model_device(model)
    recorder = GradRecorder([p for _, p in named], stop_on_nonfinite=locate)
    losses: list[float | None] = []
    stopped_at: int | None = None
    rng: Any = None
    with recorder:
        for i in range(steps):
            if locate:
                rng = _rng_state(torch, device)
            recorder.begin_step(i)
            try:
                out = run()
            except NonFiniteGradient:
                stopped_at = i
                break
            recorder.end_step()
            losses.append(_loss_value(out))
            loss = losses[-1]
            del out
            if loss is not None and not math.isfinite(loss):
                break
    ran = len(losses) + (stopped_at is not None)
    per_step = recorder.table(ran)
    result = FiniteGradsResult(
        steps=ran,
        max_abs={n: tuple(per_step[i][j] for i in range(ran)) for j, (n, _) in enumerate(named)},
        losses=tuple(losses),
    )

    first: tuple[int, str] | None = None
    numbers = _floats_of_events(recorder)
    measured = [(s, j) for s, j, v in recorder.events if v is not None]
    for (step_i, index), number in zip(measured, numbers, strict=True):
        if not math.isfinite(number):
            first = (step_i, named[index][0])
            break
    bad_loss = [(i, v) for i, v in enumerate(losses) if v is not None and not math.isfinite(v)]
    if first is None and not bad_loss:
        return result

    rows = []
    for name, param in named:
        for i, value in enumerate(result.max_abs[name]):
            if value is not None and not math.isfinite(value):
                rows.append((name, tuple(param.shape), i, value))
    sections = []
    if first is not None:
        step_i, name = first
        headline = f"non-finite gradient in `{name}` at step {step_i}"
        sections.append(
            f"First non-finite gradient: `{name}` {fmt(tuple(dict(named)[name].shape))} "
            f"at step {step_i} (the first parameter backward reached, so the nearest the loss)."
        )
        if rows:
            sections.append(table(("parameter", "shape", "step", "max |grad|"), rows))
    else:
        step_i, value = bad_loss[0]
        headline = f"the loss is {value} at step {step_i}"
    if bad_loss:
        sections.append(
            "Loss per step: " + ", ".join(f"{i}: {fmt(v)}" for i, v in enumerate(losses))
        )
    if locate and stopped_at is not None:
        sections.append(_locate_nonfinite(torch, run, rng, device, named))
    elif locate:
        sections.append(
            "Not located: the step was not stopped inside backward() (the gradient was "
            "assigned directly, or only the loss is non-finite)."
        )
    else:
        sections.append("Rerun with locate=True to name the backward op that produced it.")
    fail(
        "assert_finite_grads",
        headline,
        sections,
        rules=["TL602", "TL601", "TL604", "TL503"],
        sources=[step],
        result=result,
    )


def assert_weights_updated(
    model: torch.nn.Module,
    step: Step,
    *,
    steps: int = 1,
    optimizer: Any = None,
    frozen: Sequence[ParamSpec] | ParamSpec = (),
    batches: Iterable[Any] | None = None,
) -> WeightsResult:
    """Every trainable parameter changes, and every frozen one does not.

    ``frozen`` takes parameter names, module paths, globs, tensors or submodules that must
    stay put; parameters with ``requires_grad=False`` are not required to change. With
    ``optimizer``, its ``param_groups`` must hold exactly the model's trainable parameters,
    by identity: a layer it forgot, or tensors of a model that has since been replaced,
    fail the check even where the weights happen to move.
    """
    __tracebackhide__ = True
    import torch

    from trainlint._runtime.steps import (
        GradRecorder,
        StepRunner,
        check_count,
        extrema,
        match_params,
        max_abs_values,
    )

    check_count("steps", steps, 1)
    run = StepRunner(step, batches)
    frozen_names = match_params(model, frozen, "frozen") if frozen else set()
    named = [(n, p) for n, p in model.named_parameters() if p.numel() > 0]
    trainable = [(n, p) for n, p in named if p.requires_grad and n not in frozen_names]
    frozen_list = [(n, p) for n, p in named if n in frozen_names]
    if not trainable and not frozen_list:
        raise ValueError("the model has no trainable parameters to check")
    watched = trainable + frozen_list
    before = [p.detach().clone() for _, p in watched]
    recorder = GradRecorder([p for _, p in trainable], measure=False)
    with recorder:
        for i in range(steps):
            recorder.begin_step(i)
            run()
            recorder.end_step()
    with torch.no_grad():
        # in place into the snapshot: a second parameter-sized allocation is what made
        # this check cost 30% of a step on a 4M-parameter model
        deltas = [extrema(b.sub_(p.detach())) for (_, p), b in zip(watched, before, strict=True)]
    del before
    changes = dict(zip((n for n, _ in watched), max_abs_values(deltas), strict=True))
    fired = recorder.fired()
    got_grad = {n: j in fired for j, (n, _) in enumerate(trainable)}
    result = WeightsResult(
        steps=steps,
        change={n: changes[n] for n, _ in trainable},
        frozen_change={n: changes[n] for n, _ in frozen_list},
        got_grad=got_grad,
    )

    unchanged = [n for n, _ in trainable if changes[n] == 0.0]
    moved_frozen = [n for n, _ in frozen_list if changes[n] != 0.0]
    # a weight that "changed" into NaN or Inf moved, but training is over for it
    corrupted = [n for n, _ in trainable if not math.isfinite(changes[n])]
    in_opt: set[int] | None = None
    opt_notes: list[str] = []
    lr_zero = False
    if optimizer is not None:
        in_opt, opt_notes, lr_zero = _optimizer_membership(optimizer, named, trainable, frozen_list)
    missing_from_opt = [n for n, p in trainable if in_opt is not None and id(p) not in in_opt]
    if not unchanged and not moved_frozen and not opt_notes and not corrupted:
        return result

    shapes = {n: tuple(p.shape) for n, p in named}
    rows = []
    for n in unchanged:
        row = [n, shapes[n], "did not change", got_grad[n]]
        if in_opt is not None:
            row.append(n not in missing_from_opt)
        rows.append(row)
    for n in corrupted:
        row = [n, shapes[n], "became NaN or Inf", got_grad[n]]
        if in_opt is not None:
            row.append(n not in missing_from_opt)
        rows.append(row)
    for n in moved_frozen:
        p = dict(named)[n]
        row = [n, shapes[n], f"frozen but moved by {fmt(changes[n])}", p.requires_grad]
        if in_opt is not None:
            row.append(id(p) in in_opt)
        rows.append(row)
    headers = ["parameter", "shape", "problem", "got a gradient"]
    if in_opt is not None:
        headers.append("in optimizer")
    sections = [table(headers, rows)] if rows else []
    sections += opt_notes
    rules: list[str] = []
    if unchanged and len(unchanged) == len(trainable):
        if not any(got_grad.values()):
            sections.append(
                "Nothing changed and no gradient reached the model: the step trained another "
                "object. A Ray remote or actor, or a forked process, receives a copy of the "
                "model and trains that; a model rebound after the optimizer was built (a "
                "deepcopy, a reload) leaves the optimizer holding the old tensors. Train the "
                "object you check, or load the trained weights back."
            )
            rules += ["TL501", "TL502", "TL107", "TL108", "TL105"]
        else:
            sections.append(
                "Gradients arrived but no parameter moved: the optimizer holds other tensors "
                "(built before the model was replaced or copied), zero_grad() runs between "
                "backward() and step(), step() runs before backward(), or the learning rate "
                "is 0."
            )
            rules += ["TL107", "TL501", "TL502", "TL102", "TL104", "TL203"]
    elif unchanged:
        with_grad = [n for n in unchanged if got_grad[n]]
        if with_grad:
            sections.append(
                "Parameters that got a gradient but did not move are not updated by the "
                "optimizer: it was built from an explicit list that forgot them, or before "
                "they were added or replaced."
            )
            rules += ["TL107"]
        if len(with_grad) < len(unchanged):
            sections.append(
                "Parameters without a gradient are cut off from the loss; "
                "assert_grads_nonzero shows where."
            )
            rules += ["TL108", "TL105"]
    if corrupted:
        sections.append(
            "Weights became NaN or Inf: a non-finite gradient was applied; "
            "assert_finite_grads(locate=True) names the op that produced it."
        )
        rules += ["TL602", "TL604", "TL601"]
    if moved_frozen:
        sections.append(
            "Frozen parameters moved: requires_grad is still True for them (freezing missed "
            "them, or ran on another copy of the model), or weight decay or momentum in the "
            "optimizer moves them without a gradient."
        )
    if lr_zero:
        rules += ["TL203", "TL204"]
    if opt_notes and not unchanged:
        rules += ["TL107"]
    n_bad = len(unchanged) + len(moved_frozen) + len(corrupted)
    headline = (
        f"{n_bad} of {len(watched)} parameters misbehaved after {_plural(steps, 'step')}"
        if n_bad
        else "the optimizer does not hold exactly the model's trainable parameters"
    )
    fail("assert_weights_updated", headline, sections, rules=rules, sources=[step], result=result)


def _optimizer_membership(
    optimizer: Any,
    named: Sequence[tuple[str, torch.Tensor]],
    trainable: Sequence[tuple[str, torch.Tensor]],
    frozen_list: Sequence[tuple[str, torch.Tensor]],
) -> tuple[set[int], list[str], bool]:
    groups = getattr(optimizer, "param_groups", None)
    if groups is None:
        raise TypeError(f"optimizer has no param_groups: {type(optimizer).__name__}")
    held = [p for group in groups for p in group["params"]]
    ids = {id(p) for p in held}
    model_ids = {id(p) for _, p in named}
    notes = []
    missing = [n for n, p in trainable if id(p) not in ids]
    if missing:
        notes.append(
            f"{_plural(len(missing), 'trainable parameter')} of the model "
            f"{'is' if len(missing) == 1 else 'are'} not in the optimizer: {', '.join(missing)}."
        )
    foreign = [p for p in held if id(p) not in model_ids]
    if foreign:
        shapes = ", ".join(fmt(tuple(p.shape)) for p in foreign[:8])
        notes.append(
            f"The optimizer holds {_plural(len(foreign), 'tensor')} that "
            f"{'is' if len(foreign) == 1 else 'are'} not a parameter of this model "
            f"(shapes {shapes}{', ...' if len(foreign) > 8 else ''}): the parameters of a "
            "model that has since been replaced or copied."
        )
    frozen_held = [n for n, p in frozen_list if p.requires_grad and id(p) in ids]
    if frozen_held:
        notes.append(
            "Frozen parameters that still require grad are in the optimizer: "
            + ", ".join(frozen_held)
            + "."
        )
    zero_groups = [i for i, g in enumerate(groups) if float(g.get("lr", 1.0)) == 0.0]
    if zero_groups:
        notes.append(
            "The learning rate is 0 in param_groups "
            + ", ".join(str(i) for i in zero_groups)
            + " (a warmup that starts at 0, or a scheduler that is never stepped)."
        )
    return ids, notes, bool(zero_groups)


# --------------------------------------------------------------------------- memory


def assert_memory_stable(
    step: Step,
    *,
    steps: int = 8,
    warmup: int = 2,
    tolerance: int = 0,
    batches: Iterable[Any] | None = None,
) -> MemoryResult:
    """Memory held after each step does not grow.

    Runs ``warmup`` steps (absorbing optimizer state, allocator caches, lazy init), then
    ``steps`` measured steps, and after each measures:

    (a) bytes of tensors saved by autograd graphs that are still alive (exact, on any
        device): graphs kept with ``retain_graph=True`` or never backpropagated;
    (b) autograd graph nodes still alive: ``total += loss`` after ``backward()`` frees the
        saved buffers but chains every step's graph, and only this measure sees it;
    (c) ``torch.cuda.memory_allocated()`` when CUDA is in use (not measured otherwise).

    A measure grows when it ends higher than after warmup, is still rising over the second
    half of the steps and rose in at least two of them (a one-off allocation is not a leak);
    growth is confirmed after a full garbage collection. ``tolerance`` is the growth in
    bytes per step allowed for (a) and (c); the node count (b) must not grow. Tensors saved
    under the step's own ``saved_tensors_hooks`` (e.g. ``save_on_cpu``) are not counted.
    """
    __tracebackhide__ = True
    from trainlint._runtime.memory import AutogradProbe, cuda_allocated
    from trainlint._runtime.steps import StepRunner, check_count

    check_count("steps", steps, 2)
    check_count("warmup", warmup, 0)
    check_count("tolerance", tolerance, 0)
    run = StepRunner(step, batches)
    probe = AutogradProbe()
    saved: list[int] = []
    nodes: list[int] = []
    cuda: list[int | None] = []

    def measure() -> None:
        # The young generations hold any cyclic garbage the step just made; collecting
        # them is cheap, unlike a full collection (tens of ms once torch is imported).
        gc.collect(1)
        saved.append(probe.saved_bytes())
        nodes.append(probe.live_nodes())
        cuda.append(cuda_allocated())

    with probe:
        for _ in range(warmup):
            run()
        measure()
        for _ in range(steps):
            run()
            measure()
        cuda_series = [c for c in cuda if c is not None]
        measures: dict[str, list[int]] = {"saved_bytes": saved, "graph_nodes": nodes}
        if len(cuda_series) >= 3:
            measures["cuda_bytes"] = cuda_series
        tolerances = {"saved_bytes": tolerance, "graph_nodes": 0, "cuda_bytes": tolerance}
        growing = [k for k, v in measures.items() if _grows(v, tolerances[k])]
        if growing:
            # Confirm: garbage in the old generation can look like growth until a full
            # collection; what survives one is held.
            gc.collect()
            saved[-1] = probe.saved_bytes()
            nodes[-1] = probe.live_nodes()
            if "cuda_bytes" in measures:
                now = cuda_allocated()
                if now is not None:
                    measures["cuda_bytes"][-1] = now
            growing = [k for k, v in measures.items() if _grows(v, tolerances[k])]

    growth = {k: (v[-1] - v[0]) / (len(v) - 1) for k, v in measures.items()}
    result = MemoryResult(
        steps=steps,
        warmup=warmup,
        saved_bytes=tuple(saved),
        graph_nodes=tuple(nodes),
        cuda_bytes=tuple(measures["cuda_bytes"]) if "cuda_bytes" in measures else None,
        growth=growth,
    )
    if not growing:
        return result

    labels = {
        "saved_bytes": "(a) bytes saved by live autograd graphs",
        "graph_nodes": "(b) autograd graph nodes kept alive",
        "cuda_bytes": "(c) CUDA memory allocated",
    }

    def show(key: str, value: float) -> str:
        return str(int(value)) if key == "graph_nodes" else fmt_bytes(value)

    rows = []
    for key, label in labels.items():
        if key not in measures:
            rows.append((label, "-", "-", "-", "not measured: CUDA not in use"))
            continue
        values = measures[key]
        ups = sum(1 for a, b in zip(values, values[1:], strict=False) if b > a)
        per_step = growth[key]
        rows.append(
            (
                label,
                show(key, values[0]),
                show(key, values[-1]),
                ("+" if per_step > 0 else "")
                + (f"{per_step:.1f}" if key == "graph_nodes" else fmt_bytes(per_step)),
                f"{ups} of {len(values) - 1}" + ("  <- grows" if key in growing else ""),
            )
        )
    sections = [
        table(("measure", "after warmup", "after last step", "growth/step", "rose in"), rows)
    ]
    series_rows = []
    for i in range(len(saved)):
        label = "warmup" if i == 0 else str(warmup + i - 1)
        c_value = cuda[i] if i < len(cuda) else None
        series_rows.append(
            (label, fmt_bytes(saved[i]), nodes[i], "-" if c_value is None else fmt_bytes(c_value))
        )
    sections.append(table(("after step", "(a) saved", "(b) nodes", "(c) cuda"), series_rows))
    rules: list[str]
    if "saved_bytes" in growing:
        sections.append(
            "(a) grows: each step's graph outlives the step with its saved buffers, because "
            "it was backpropagated with retain_graph=True, or never backpropagated while an "
            "output or loss was kept (on self, in a list, or from an evaluation run outside "
            "torch.no_grad())."
        )
        rules = ["TL302", "TL301", "TL304", "TL303"]
    elif "graph_nodes" in growing:
        sections.append(
            "(b) grows while (a) does not: backward() freed the saved buffers, but each "
            "step's graph stays chained to something that outlives the step: a loss or "
            "output accumulated with its history (`total += loss`, `losses.append(loss)`, "
            "a tensor kept on self). Accumulate `loss.item()` or `loss.detach()` instead."
        )
        rules = ["TL302", "TL304", "TL301"]
    else:
        sections.append(
            "(c) grows while no autograd graph does: tensors without history are kept on "
            "the GPU from step to step (a list of detached outputs, a cache that is never "
            "trimmed)."
        )
        rules = ["TL302", "TL304", "TL305"]
    fail(
        "assert_memory_stable",
        f"memory held after each step grows ({', '.join(labels[k] for k in growing)}) "
        f"over {_plural(steps, 'step')} after {warmup} warmup",
        sections,
        rules=rules,
        sources=[step],
        result=result,
    )


def _grows(values: Sequence[int], tolerance: int) -> bool:
    n = len(values) - 1
    if n < 2:
        return False
    ups = sum(1 for a, b in zip(values, values[1:], strict=False) if b > a)
    mid = n // 2
    return (
        values[-1] - values[0] > tolerance * n
        and values[-1] - values[mid] > tolerance * (n - mid)
        and ups >= 2
    )


# --------------------------------------------------------------------------- time


def assert_step_time_stable(
    step: Step,
    *,
    steps: int = 10,
    warmup: int = 1,
    max_slowdown: float = 1.5,
    max_syncs: int | None = None,
    batches: Iterable[Any] | None = None,
) -> StepTimeResult:
    """Later steps are not slower than early ones.

    Runs ``warmup`` untimed steps, then times ``steps`` steps and compares the median of
    the second half with the median of the first. A slowdown above ``max_slowdown`` is
    confirmed by timing as many steps again: a step whose work grows keeps slowing down,
    while noise, or a machine that got busier, does not. (A slowdown that happens once and
    then holds is therefore not reported.) On CUDA each step is synchronized before its clock stops, and host syncs
    inside the step are counted with ``torch.cuda.set_sync_debug_mode`` and reported by
    source line; with ``max_syncs`` a step with more syncs than that fails the check.
    """
    __tracebackhide__ = True
    import torch

    from trainlint._runtime.steps import StepRunner, check_count

    check_count("steps", steps, 2)
    check_count("warmup", warmup, 0)
    if not max_slowdown > 1.0:
        raise ValueError(f"max_slowdown must be > 1, got {max_slowdown!r}")
    run = StepRunner(step, batches)
    for _ in range(warmup):
        run()
    on_cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    times: list[float] = []
    syncs: list[int] = []
    sites: Counter[str] = Counter()

    def timed() -> float:
        if on_cuda:
            torch.cuda.synchronize()
            with _SyncCounter(torch) as counter:
                start = time.perf_counter()
                run()
            torch.cuda.synchronize()
            elapsed = time.perf_counter() - start
            syncs.append(counter.count)
            sites.update(counter.sites)
        else:
            start = time.perf_counter()
            run()
            elapsed = time.perf_counter() - start
        times.append(elapsed)
        return elapsed

    for _ in range(steps):
        timed()
    half = steps // 2
    early = statistics.median(times[:half])
    late = statistics.median(times[half:])
    ratio = late / early if early > 0 else math.inf
    slow = ratio > max_slowdown
    confirm: float | None = None
    if slow:
        # A step whose work grows keeps growing; a machine that got busier (a neighbour
        # on a shared CI runner) makes every later step slower by the same amount. So a
        # slowdown counts only while it continues: the next window must be slower again
        # by at least half the early-to-late growth.
        confirm = statistics.median([timed() for _ in range(steps - half)])
        slow = confirm >= late + 0.5 * (late - early)
    result = StepTimeResult(
        times=tuple(times),
        early_median=early,
        late_median=late,
        ratio=ratio,
        confirm_median=confirm,
        syncs=tuple(syncs) if on_cuda else None,
        sync_sites=dict(sites) if on_cuda else None,
    )
    too_many_syncs = on_cuda and max_syncs is not None and max(syncs, default=0) > max_syncs
    if not slow and not too_many_syncs:
        return result

    sections = []
    rules: list[str] = []
    ms = ", ".join(f"{t * 1e3:.3g}" for t in times)
    if slow:
        sections.append(
            f"Step times (ms, after {warmup} warmup): {ms}\n"
            f"median of steps 0-{half - 1}: {early * 1e3:.3g} ms; of steps {half}-"
            f"{steps - 1}: {late * 1e3:.3g} ms (slowdown {ratio:.2f}x, allowed "
            f"{max_slowdown}x); of steps {steps}-{len(times) - 1}: "
            f"{(confirm or 0.0) * 1e3:.3g} ms, still growing."
        )
        sections.append(
            "Each step does more work than the last: usually an autograd graph that keeps "
            "growing (a loss accumulated with its history makes every backward walk all "
            "past graphs), a list that is re-processed each step, or caches that are "
            "cleared or rebuilt every step."
        )
        rules += ["TL302", "TL301", "TL305", "TL403"]
    if on_cuda:
        sync_rows = [(site, count) for site, count in sites.most_common()]
        sections.append(
            f"Host syncs per step: {', '.join(str(s) for s in syncs)}"
            + ("\n" + table(("where", "syncs"), sync_rows) if sync_rows else "")
        )
        rules += ["TL401", "TL402"]
    headline = (
        f"later steps are {ratio:.2f}x slower than early ones"
        if slow
        else f"up to {max(syncs)} host syncs per step (max_syncs={max_syncs})"
    )
    fail("assert_step_time_stable", headline, sections, rules=rules, sources=[step], result=result)


class _SyncCounter:
    """Counts synchronizing CUDA calls through the sync debug mode's warnings."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.count = 0
        self.sites: Counter[str] = Counter()

    def __enter__(self) -> _SyncCounter:
        self._previous = self.torch.cuda.get_sync_debug_mode()
        self._catcher = warnings.catch_warnings(record=True)
        self._caught = self._catcher.__enter__()
        warnings.simplefilter("always")
        self.torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc: Any) -> None:
        self.torch.cuda.set_sync_debug_mode(self._previous)
        self._catcher.__exit__(*exc)
        for w in self._caught:
            if "synchroniz" in str(w.message):
                self.count += 1
                self.sites[f"{w.filename}:{w.lineno}"] += 1
            else:  # not ours to swallow
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


# --------------------------------------------------------------------------- schedules


def assert_lr_schedule(
    scheduler_factory: Callable[[Any], Any],
    *,
    steps: int,
    base_lr: float = 1.0,
    warmup: int = 0,
    min_lr: float | None = None,
    restarts: bool = False,
) -> LRTrace:
    """The learning-rate schedule has no zero start, no zero or negative LR, no restarts.

    Builds a throwaway SGD optimizer over one dummy parameter with ``lr=base_lr``, calls
    ``scheduler_factory(optimizer)``, then ``optimizer.step(); scheduler.step()`` ``steps``
    times: as many times as the training loop really does (epochs x batches when the loop
    steps the scheduler per batch). ``trace[i]`` is the LR update ``i`` used. Checks: the
    first update's LR is not 0; no LR after ``warmup`` is 0 and none is negative; the LR
    does not increase after ``warmup`` unless ``restarts=True``; the last LR is at least
    ``min_lr``. Fails showing where the trace breaks the rule.
    """
    __tracebackhide__ = True
    import torch

    from trainlint._runtime.steps import check_count

    check_count("steps", steps, 1)
    check_count("warmup", warmup, 0)
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=base_lr)
    scheduler = scheduler_factory(optimizer)
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        raise TypeError(
            "ReduceLROnPlateau follows a metric, not the step count; assert_lr_schedule "
            "checks schedules that depend only on how often step() is called"
        )
    if not callable(getattr(scheduler, "step", None)):
        raise TypeError(
            f"scheduler_factory must return a scheduler, got {type(scheduler).__name__}"
        )
    lrs: list[float] = []
    for _ in range(steps):
        lrs.append(float(optimizer.param_groups[0]["lr"]))
        optimizer.step()
        scheduler.step()
    trace = LRTrace(tuple(lrs))

    problems: list[tuple[int, str]] = []
    rules: list[str] = []
    if lrs[0] == 0.0:
        zeros = _run_length(lrs, 0, lambda v: v == 0.0)
        stays = "for every step" if zeros == len(lrs) else f"until step {zeros}"
        problems.append((0, f"the first update uses LR 0 (it stays 0 {stays})"))
        rules += ["TL203", "TL204"]
    negative = next((i for i, v in enumerate(lrs) if v < 0 or math.isnan(v)), None)
    if negative is not None:
        problems.append((negative, f"the LR is {fmt(lrs[negative])} at step {negative}"))
        rules += ["TL201"]
    zero_late = next((i for i in range(max(warmup, 1), len(lrs)) if lrs[i] == 0.0), None)
    if zero_late is not None and lrs[0] != 0.0:
        problems.append(
            (
                zero_late,
                f"the LR reaches 0 at step {zero_late} of {steps}: the schedule is "
                "shorter than the training",
            )
        )
        rules += ["TL201"]
    if not restarts:
        ups = [i for i in range(warmup + 1, len(lrs)) if _increases(lrs[i - 1], lrs[i])]
        if ups:
            i = ups[0]
            more = (
                f" (and at {_plural(len(ups) - 1, 'more step')}: "
                + ", ".join(str(u) for u in ups[1:6])
                + (", ..." if len(ups) > 6 else "")
                + ")"
                if len(ups) > 1
                else ""
            )
            problems.append(
                (i, f"restarts at step {i}: {fmt(lrs[i - 1])} \u2192 {fmt(lrs[i])}{more}")
            )
            rules += ["TL201", "TL205"]
    if min_lr is not None and lrs[-1] < min_lr * (1 - 1e-9):
        problems.append(
            (len(lrs) - 1, f"the last LR {fmt(lrs[-1])} is below min_lr={fmt(float(min_lr))}")
        )
        rules += ["TL201"]
    if not problems:
        return trace

    peak = max(range(len(lrs)), key=lambda i: lrs[i])
    low = min(range(len(lrs)), key=lambda i: lrs[i])
    sections = [
        "\n".join(f"- {text}" for _, text in problems) if len(problems) > 1 else "",
        f"LR trace over {steps} steps (base_lr={fmt(float(base_lr))}): starts at "
        f"{fmt(lrs[0])}, peaks at {fmt(lrs[peak])} (step {peak}), lowest {fmt(lrs[low])} "
        f"(step {low}), ends at {fmt(lrs[-1])}.",
        _trace_window(lrs, problems[0][0]),
    ]
    if "TL201" in rules:
        sections.append(
            "A schedule measured in epochs (StepLR, CosineAnnealingLR, "
            "CosineAnnealingWarmRestarts' T_0, a lambda over epochs) stepped once per batch "
            "runs through its length in a fraction of the training, then restarts or "
            "stalls. Step it once per epoch, or size it in batches."
        )
    fail(
        "assert_lr_schedule",
        problems[0][1],
        sections,
        rules=rules,
        sources=[scheduler_factory],
        result=trace,
    )


def _increases(before: float, after: float) -> bool:
    # Chained schedulers recompute the LR by multiplication; ignore rounding noise.
    return after > before * (1 + 1e-9) + 1e-15


def _run_length(values: Sequence[float], start: int, pred: Callable[[float], bool]) -> int:
    i = start
    while i < len(values) and pred(values[i]):
        i += 1
    return i - start


def _trace_window(lrs: Sequence[float], at: int) -> str:
    lo, hi = max(0, at - 3), min(len(lrs), at + 4)
    rows = [(i, fmt(lrs[i]), "<-" if i == at else "") for i in range(lo, hi)]
    return table(("step", "lr", ""), rows)


# --------------------------------------------------------------------------- loss


def assert_loss_decreases(
    step: Step,
    *,
    steps: int = 20,
    factor: float = 0.5,
    batches: Iterable[Any] | None = None,
) -> LossResult:
    """Overfitting one batch works: after ``steps`` steps the loss fell to ``factor`` of
    the first loss (for a negative loss: by ``1 - factor`` of its magnitude).

    The step must return the loss (a tensor or a number). Close over one batch, or pass
    ``batches=[batch]``.
    """
    __tracebackhide__ = True
    from trainlint._runtime.steps import StepRunner, check_count

    check_count("steps", steps, 2)
    if not 0.0 < factor < 1.0:
        raise ValueError(f"factor must be between 0 and 1, got {factor!r}")
    run = StepRunner(step, batches)
    losses: list[float] = []
    for i in range(steps):
        value = _loss_value(run())
        if value is None:
            raise TypeError(
                "assert_loss_decreases needs the step to return the loss; "
                f"step {i} returned no number or tensor"
            )
        losses.append(value)
        if not math.isfinite(value):
            break
    result = LossResult(tuple(losses))
    first, last = losses[0], losses[-1]
    target = first - (1.0 - factor) * abs(first)
    if math.isfinite(last) and last <= target:
        return result

    sections = [_loss_table(losses)]
    rules: list[str]
    if not math.isfinite(last):
        headline = f"the loss became {last} at step {len(losses) - 1}"
        sections.append(
            "The loss is not finite; assert_finite_grads(locate=True) names the op that "
            "produced it."
        )
        rules = ["TL602", "TL601", "TL604"]
    elif all(v == first for v in losses):
        headline = f"the loss never changed in {steps} steps (stays {fmt(first)})"
        sections.append(
            "No update reached the model: the learning rate is 0 (a warmup that starts at 0, "
            "a scheduler never stepped), zero_grad() runs between backward() and step(), or "
            "the step trains another copy of the model or detaches the loss."
        )
        rules = ["TL203", "TL204", "TL102", "TL107", "TL501", "TL108", "TL105"]
    elif last > first:
        headline = f"the loss rose from {fmt(first)} to {fmt(last)} in {steps} steps"
        sections.append(
            "Training diverges on a single batch: gradients that are never cleared pile up, "
            "an accumulated loss is not scaled, or the learning rate is too high."
        )
        rules = ["TL103", "TL109", "TL104"]
    else:
        headline = (
            f"the loss went from {fmt(first)} to {fmt(last)} in {steps} steps; expected at "
            f"most {fmt(target)} (factor {factor})"
        )
        sections.append(
            "The model learns too slowly to overfit one batch: a tiny or zero learning rate "
            "for part of training, part of the model cut off from the loss, or parameters "
            "missing from the optimizer."
        )
        rules = ["TL203", "TL204", "TL108", "TL107", "TL102"]
    fail("assert_loss_decreases", headline, sections, rules=rules, sources=[step], result=result)


def _loss_table(losses: Sequence[float]) -> str:
    n = len(losses)
    picks = sorted({0, 1, 2, n // 4, n // 2, (3 * n) // 4, n - 2, n - 1} & set(range(n)))
    return table(("step", "loss"), [(i, fmt(losses[i])) for i in picks])


# --------------------------------------------------------------------------- threads


def assert_thread_safe(
    model: torch.nn.Module,
    step: Callable[[Any], Any],
    batches: Iterable[Any],
    *,
    threads: int = 4,
    rtol: float = 1e-4,
    atol: float | None = None,
) -> ThreadSafetyResult:
    """Computing gradients on several threads gives what computing them in sequence gives.

    ``step(batch)`` runs forward and backward for one batch (no optimizer step). The
    batches are run one after another, then spread over ``threads`` threads started
    together (with a short interpreter switch interval, so races show up); the gradients
    accumulated in ``.grad`` must match within ``rtol`` (and ``atol``, by default ``rtol``
    times the largest sequential gradient of each parameter) and be finite. The model's
    parameters, buffers and gradients are restored afterwards.
    """
    __tracebackhide__ = True
    import torch

    from trainlint._runtime.steps import check_count

    check_count("threads", threads, 2)
    if not callable(step):
        raise TypeError(f"step must be callable, got {type(step).__name__}")
    batch_list = list(batches)
    if len(batch_list) < 2:
        raise ValueError("assert_thread_safe needs at least two batches")
    n_threads = min(threads, len(batch_list))
    named = _trainable(model)
    params = [p for _, p in named]
    state = [*model.parameters(), *model.buffers()]
    snapshot = [t.detach().clone() for t in state]
    grads_before = [p.grad for p in params]

    def restore() -> None:
        with torch.no_grad():
            for tensor, saved in zip(state, snapshot, strict=True):
                tensor.copy_(saved)
        for p in params:
            p.grad = None

    errors: list[tuple[int, BaseException, str]] = []
    try:
        restore()
        for batch in batch_list:
            step(batch)
        sequential = [p.grad for p in params]
        saved_of = {id(t): s for t, s in zip(state, snapshot, strict=True)}
        with torch.no_grad():
            moved = [n for n, p in named if not torch.equal(p, saved_of[id(p)])]
        if moved:
            raise ValueError(
                "step(batch) changed the parameters (" + ", ".join(moved[:5]) + "): "
                "assert_thread_safe compares gradients, so pass a step that runs forward and "
                "backward without an optimizer step"
            )
        restore()
        errors = _run_threads(step, batch_list, n_threads)
        threaded = [p.grad for p in params]
    finally:
        restore()
        for p, g in zip(params, grads_before, strict=True):
            p.grad = g

    rows: list[tuple[Any, ...]] = []
    diffs: dict[str, float] = {}
    with torch.no_grad():
        for (name, param), seq, thr in zip(named, sequential, threaded, strict=True):
            if seq is None and thr is None:
                continue
            if seq is None or thr is None:
                which = "sequential" if seq is None else "threaded"
                rows.append((name, tuple(param.shape), "-", "-", f"no gradient in the {which} run"))
                diffs[name] = math.inf
                continue
            scale = float(seq.abs().max()) if seq.numel() else 0.0
            diff = float((thr - seq).abs().max()) if seq.numel() else 0.0
            diffs[name] = diff
            finite = bool(torch.isfinite(thr).all()) and bool(torch.isfinite(seq).all())
            tol_abs = atol if atol is not None else rtol * scale
            close = bool(((thr - seq).abs() <= tol_abs + rtol * seq.abs()).all())
            if not finite:
                rows.append((name, tuple(param.shape), scale, diff, "not finite"))
            elif not close:
                rows.append((name, tuple(param.shape), scale, diff, "differs"))
    result = ThreadSafetyResult(threads=n_threads, batches=len(batch_list), max_abs_diff=diffs)
    if not rows and not errors:
        return result

    sections = []
    if rows:
        sections.append(
            table(("parameter", "shape", "max |grad| (sequential)", "max |diff|", "problem"), rows)
        )
    if errors:
        sections.append(_thread_errors(errors, n_threads))
    sections.append(
        "Threads that share one model race on whatever a forward or backward writes to "
        "shared state: attributes a module sets on self during forward, buffers, an "
        "optimizer step. Give each thread its own model replica, or hold a lock around "
        "forward, backward and step."
    )
    fail(
        "assert_thread_safe",
        f"gradients computed on {n_threads} threads differ from the sequential ones"
        if rows
        else f"{len(errors)} of {n_threads} threads raised",
        sections,
        rules=["TL503", "TL304"],
        sources=[step],
        result=result,
    )


def _thread_errors(errors: list[tuple[int, BaseException, str]], n_threads: int) -> str:
    """One line per distinct error, with the threads that raised it and where."""
    groups: dict[str, list[int]] = {}
    where: dict[str, str] = {}
    for index, error, _ in errors:
        text = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        if len(text) > 160:
            text = text[:157] + "..."
        groups.setdefault(text, []).append(index)
        frames = [
            f
            for f in traceback.extract_tb(error.__traceback__)
            if f"{os.sep}torch{os.sep}" not in f.filename and f.name != "work"
        ]
        if frames and text not in where:
            frame = frames[-1]
            where[text] = f" (at {_rel(frame.filename)}:{frame.lineno})"
    lines = []
    for text, threads in groups.items():
        which = ", ".join(str(i) for i in sorted(threads))
        lines.append(
            f"{len(threads)} of {n_threads} threads (thread {which}) raised {text}"
            f"{where.get(text, '')}"
        )
    return "\n".join(lines)


def _run_threads(
    step: Callable[[Any], Any], batches: list[Any], n_threads: int
) -> list[tuple[int, BaseException, str]]:
    barrier = threading.Barrier(n_threads)
    errors: list[tuple[int, BaseException, str]] = []

    def work(index: int) -> None:
        try:
            barrier.wait()
            for batch in batches[index::n_threads]:
                step(batch)
        except BaseException as error:  # noqa: BLE001 - reported in the failure
            errors.append((index, error, traceback.format_exc()))

    workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(n_threads)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often, so interleavings actually happen
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        sys.setswitchinterval(interval)
    return errors


# --------------------------------------------------------------------------- helpers


def _trainable(
    model: torch.nn.Module, exclude: set[str] | None = None
) -> list[tuple[str, torch.Tensor]]:
    named: list[tuple[str, torch.Tensor]] = [
        (n, p)
        for n, p in model.named_parameters()
        if p.requires_grad and p.numel() > 0 and (not exclude or n not in exclude)
    ]
    if not named:
        raise ValueError("the model has no trainable parameters to check")
    return named


def _steps_text(which: list[int], total: int) -> str:
    if len(which) == total:
        return "all" if total > 1 else "0"
    return ", ".join(str(i) for i in which[:10]) + (", ..." if len(which) > 10 else "")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _loss_value(out: Any) -> float | None:
    """A float from what a step returned: a tensor, a number, or (loss, ...) / {"loss": ..}."""
    import torch

    if isinstance(out, (tuple, list)) and out:
        out = out[0]
    elif isinstance(out, dict) and "loss" in out:
        out = out["loss"]
    if isinstance(out, torch.Tensor):
        if out.numel() == 0:
            return None
        detached = out.detach()
        return float(detached if detached.numel() == 1 else detached.float().mean())
    if isinstance(out, (int, float)) and not isinstance(out, bool):
        return float(out)
    return None


def _floats_of_events(recorder: Any) -> list[float]:
    from trainlint._runtime.steps import max_abs_values

    return max_abs_values([v for _, _, v in recorder.events if v is not None])


def _rng_state(torch: Any, device: torch.device) -> tuple[Any, Any]:
    cuda_state = None
    if device.type == "cuda":
        cuda_state = torch.cuda.get_rng_state_all()
    return torch.get_rng_state(), cuda_state


def _locate_nonfinite(
    torch: Any,
    run: StepRunner,
    rng: tuple[Any, Any],
    device: torch.device,
    named: list[tuple[str, torch.Tensor]],
) -> str:
    """Rerun the failing step under anomaly detection; say which backward op made the NaN."""
    import re

    cpu_state, cuda_state = rng
    torch.set_rng_state(cpu_state)
    if cuda_state is not None:
        torch.cuda.set_rng_state_all(cuda_state)
    op = None
    error_text = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with torch.autograd.detect_anomaly(check_nan=True):
                run.again()
        except RuntimeError as error:
            match = re.search(r"Function '(\w+)' returned nan values", str(error))
            if match:
                op = match.group(1)
            else:
                error_text = f"{type(error).__name__}: {error}"
        except Exception as error:  # noqa: BLE001 - diagnostics must not replace the failure
            error_text = f"{type(error).__name__}: {error}"
    messages = [str(w.message) for w in caught]
    forward = _forward_site(messages)
    if op is None:
        # The step may have caught the RuntimeError itself; the warning anomaly mode
        # issues just before raising still names the op.
        for message in messages:
            match = re.search(r"Error detected in (\w+)\.", message)
            if match:
                op, error_text = match.group(1), None
                break
    if op is None:
        why = f" (the rerun raised {error_text})" if error_text else ""
        return (
            "Rerun under torch.autograd.detect_anomaly() did not name an op" + why + ": "
            "anomaly detection reports NaN outputs only, so the gradient is probably Inf "
            "(an overflow, or 1/x at x=0)."
        )
    text = f"Anomaly detection on a rerun of that step: {op} returned NaN."
    if forward:
        text += f"\nIt was created in the forward pass at {forward}"
    return text


def _rel(path: str) -> str:
    from trainlint._runtime.lintlink import display_path

    return display_path(path)


def _forward_site(messages: Iterable[str]) -> str | None:
    """The innermost frame outside torch in the forward traceback anomaly mode printed."""
    import re

    for message in messages:
        if "Traceback of forward call" not in message:
            continue
        frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n\s+(.*)', message)
        user = [f for f in frames if f"{os.sep}torch{os.sep}" not in f[0]]
        if user:
            path, line, func, code = user[-1]
            return f"{_rel(path)}:{line} in {func}: {code.strip()}"
    return None
