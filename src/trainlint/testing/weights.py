"""``assert_weights_updated``: trainable parameters move, frozen ones do not."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import is_, itemgetter
from typing import TYPE_CHECKING, Any, NoReturn

from trainlint._runtime.guard import DEFAULT_TIMEOUT, guarded
from trainlint._runtime.links import Symptom
from trainlint._runtime.report import fail, fmt, symptom_texts, table
from trainlint.testing._common import (
    Step,
    model_step_runner,
    named_parameters,
    plural,
    runtime,
    selects,
)

if TYPE_CHECKING:
    import torch

    from trainlint._runtime.steps import ParamSpec, StepRunner

CHECK = "assert_weights_updated"

SYMPTOMS = {
    "nothing-moved-no-gradient": Symptom(
        ("TL501", "TL502", "TL107", "TL108", "TL105"),
        text="Nothing changed and no gradient reached the model: the step trained another "
        "object. A Ray remote or actor, or a forked process, receives a copy of the "
        "model and trains that; a model rebound after the optimizer was built (a "
        "deepcopy, a reload) leaves the optimizer holding the old tensors. Train the "
        "object you check, or load the trained weights back.",
    ),
    "nothing-moved-with-gradient": Symptom(
        ("TL107", "TL501", "TL502", "TL102", "TL104", "TL203"),
        text="Gradients arrived but no parameter moved: the optimizer holds other tensors "
        "(built before the model was replaced or copied), zero_grad() runs between "
        "backward() and step(), step() runs before backward(), or the learning rate "
        "is 0.",
    ),
    "some-unmoved-with-gradient": Symptom(
        ("TL107",),
        text="Parameters that got a gradient but did not move are not updated by the "
        "optimizer: it was built from an explicit list that forgot them, or before "
        "they were added or replaced.",
    ),
    "some-unmoved-without-gradient": Symptom(
        ("TL108", "TL105"),
        text="Parameters without a gradient are cut off from the loss; "
        "assert_grads_nonzero shows where.",
    ),
    "weights-not-finite": Symptom(
        ("TL602", "TL604", "TL601"),
        text="Weights became NaN or Inf: a non-finite gradient was applied; "
        "assert_finite_grads(locate=True) names the op that produced it.",
    ),
    "frozen-moved": Symptom(
        text="Frozen parameters moved: requires_grad is still True for them (freezing missed "
        "them, or ran on another copy of the model), or weight decay or momentum in the "
        "optimizer moves them without a gradient.",
    ),
    "lr-zero": Symptom(
        ("TL203", "TL206", "TL204"),
        text="Gradients arrived but no parameter moved, or too little: the optimizer updated "
        "at learning rate 0. A warmup whose multiplier is 0 at its first step (`step / "
        "warmup`, `start_factor=0`) spends the first update, or a whole epoch, at LR 0.",
    ),
    "optimizer-mismatch": Symptom(("TL107",)),
}


@dataclass(frozen=True)
class WeightsResult:
    """What :func:`assert_weights_updated` measured: the largest |change| per parameter."""

    steps: int
    change: dict[str, float]
    frozen_change: dict[str, float]
    got_grad: dict[str, bool]
    #: (step, param group) for each optimizer update that held a checked parameter in a
    #: group whose learning rate was 0 when the update ran (read by an optimizer step
    #: pre-hook: a scheduler stepped after it has already raised the LR by the time the
    #: step returns)
    zero_lr: tuple[tuple[int, int], ...] = ()


@guarded(CHECK)
def assert_weights_updated(
    model: torch.nn.Module,
    step: Step,
    *,
    steps: int = 1,
    optimizer: Any = None,
    frozen: Sequence[ParamSpec] | ParamSpec = (),
    batches: Iterable[Any] | None = None,
    timeout: float | None = DEFAULT_TIMEOUT,
) -> WeightsResult:
    """Every trainable parameter changes, and every frozen one does not.

    ``frozen`` takes parameter names, module paths, globs, tensors or submodules that must
    stay put; parameters with ``requires_grad=False`` are not required to change. With
    ``optimizer``, its ``param_groups`` must hold exactly the model's trainable parameters,
    by identity: a layer it forgot, or tensors of a model that has since been replaced,
    fail the check even where the weights happen to move.
    """
    __tracebackhide__ = True
    run = model_step_runner(CHECK, model, step, steps, batches)
    frozen_names: set[str] = set()
    if selects(frozen):
        frozen_names = runtime().match_params(model, frozen, "frozen")
    named: list[tuple[str, torch.Tensor]] = []
    trainable: list[tuple[str, torch.Tensor]] = []
    frozen_list: list[tuple[str, torch.Tensor]] = []
    for n, p in named_parameters(model):  # one pass, not three comprehensions
        if p.numel() > 0:
            named.append((n, p))
            if n in frozen_names:
                frozen_list.append((n, p))
            elif p.requires_grad:
                trainable.append((n, p))
    if not trainable and not frozen_list:
        raise ValueError("the model has no trainable parameters to check")
    result = _measure(run, steps, trainable, frozen_list)
    found = _diagnose(result, named, trainable, frozen_list, optimizer)
    if found is None:
        return result
    _report(found, result, named, step)


def _measure(
    run: StepRunner,
    steps: int,
    trainable: list[tuple[str, torch.Tensor]],
    frozen_list: list[tuple[str, torch.Tensor]],
) -> WeightsResult:
    """Run the steps; the largest |change| of each watched parameter, and who got a grad."""
    __tracebackhide__ = True
    rt = runtime()
    names = [n for n, _ in trainable]
    params = [p for _, p in trainable]
    snapshot = rt.Snapshot(params + [p for _, p in frozen_list])
    recorder = rt.GradRecorder(params, measure=False)
    watched = set(map(id, params))
    zero_lr: list[tuple[int, int]] = []
    current = [0]

    def lr_used(optimizer: Any, args: Any, kwargs: Any) -> None:
        for g, group in enumerate(optimizer.param_groups):
            lr = group.get("lr")
            if lr is not None and float(lr) == 0.0:
                if any(id(p) in watched for p in group["params"]):
                    zero_lr.append((current[0], g))

    hook = rt.register_optimizer_step_pre_hook(lr_used)
    try:
        with recorder:
            for i in range(steps):
                current[0] = i
                recorder.begin_step(i)
                run()
                recorder.end_step()
    finally:
        hook.remove()
    changes = snapshot.changes()  # trainable first, then frozen: names are unique
    del snapshot
    fired = recorder.fired()
    k = len(names)
    return WeightsResult(
        steps=steps,
        change=dict(zip(names, changes[:k], strict=True)),
        frozen_change=dict(zip((n for n, _ in frozen_list), changes[k:], strict=True)),
        got_grad={n: j in fired for j, n in enumerate(names)},
        zero_lr=tuple(zero_lr),
    )


@dataclass(frozen=True)
class _Found:
    unchanged: list[str]
    corrupted: list[str]
    moved_frozen: list[str]
    in_optimizer: set[int] | None  # ids of the tensors the optimizer holds
    optimizer_notes: list[str]
    symptoms: list[str]


def _diagnose(
    result: WeightsResult,
    named: list[tuple[str, torch.Tensor]],
    trainable: list[tuple[str, torch.Tensor]],
    frozen_list: list[tuple[str, torch.Tensor]],
    optimizer: Any,
) -> _Found | None:
    changes = {**result.change, **result.frozen_change}
    moved = list(result.change.values())
    # all moved (no 0.0 in C) and all finite (a sum of values >= 0 is finite only if
    # every one is; one too large for the sum takes the long way): the lists are empty
    if 0.0 not in moved and math.isfinite(sum(moved)):
        unchanged: list[str] = []
        corrupted: list[str] = []
    else:
        unchanged = [n for n, _ in trainable if changes[n] == 0.0]
        # a weight that "changed" into NaN or Inf moved, but training is over for it
        corrupted = [n for n, _ in trainable if not math.isfinite(changes[n])]
    moved_frozen = [n for n, _ in frozen_list if changes[n] != 0.0]
    in_opt: set[int] | None = None
    notes: list[str] = []
    lr_zero = False
    if optimizer is not None:
        in_opt, notes, lr_zero = _optimizer_membership(optimizer, named, trainable, frozen_list)
    if not unchanged and not moved_frozen and not notes and not corrupted:
        return None
    got_grad = result.got_grad
    symptoms: list[str] = []
    zero_lr_steps = sorted({s for s, _ in result.zero_lr})
    if unchanged and zero_lr_steps:
        groups = sorted({g for _, g in result.zero_lr})
        notes = [n for n in notes if not n.startswith("The learning rate is 0")]
        notes.insert(
            0,
            f"The learning rate is 0 in param_groups {', '.join(map(str, groups))} when the "
            f"optimizer step of step {', '.join(map(str, zero_lr_steps[:10]))} runs (read as "
            "the update uses it, before any scheduler step after it): a warmup that starts "
            "at 0, or a scheduler that is never stepped.",
        )
        lr_zero = True
    if lr_zero:  # first: the LR the updates ran at explains what follows
        symptoms.append("lr-zero")
    if unchanged and len(unchanged) == len(trainable):
        if not any(got_grad.values()):
            symptoms.append("nothing-moved-no-gradient")
        elif len(zero_lr_steps) < result.steps:  # not all explained by LR 0
            symptoms.append("nothing-moved-with-gradient")
    elif unchanged:
        with_grad = [n for n in unchanged if got_grad[n]]
        if with_grad:
            symptoms.append("some-unmoved-with-gradient")
        if len(with_grad) < len(unchanged):
            symptoms.append("some-unmoved-without-gradient")
    if corrupted:
        symptoms.append("weights-not-finite")
    if moved_frozen:
        symptoms.append("frozen-moved")
    if notes and not unchanged:
        symptoms.append("optimizer-mismatch")
    return _Found(unchanged, corrupted, moved_frozen, in_opt, notes, symptoms)


def _report(
    found: _Found, result: WeightsResult, named: list[tuple[str, torch.Tensor]], step: Step
) -> NoReturn:
    __tracebackhide__ = True
    in_opt = found.in_optimizer
    params = dict(named)
    shapes = {n: tuple(p.shape) for n, p in named}
    rows = []
    problems = [(n, "did not change", result.got_grad[n]) for n in found.unchanged]
    problems += [(n, "became NaN or Inf", result.got_grad[n]) for n in found.corrupted]
    problems += [
        (n, f"frozen but moved by {fmt(result.frozen_change[n])}", params[n].requires_grad)
        for n in found.moved_frozen
    ]
    for n, problem, got_grad in problems:
        row = [n, shapes[n], problem, got_grad]
        if in_opt is not None:
            row.append(id(params[n]) in in_opt)
        rows.append(row)
    headers = ["parameter", "shape", "problem", "got a gradient"]
    if in_opt is not None:
        headers.append("in optimizer")
    symptoms = [SYMPTOMS[s] for s in found.symptoms]
    sections = [table(headers, rows)] if rows else []
    sections += found.optimizer_notes
    sections += symptom_texts(symptoms)
    n_bad = len(found.unchanged) + len(found.moved_frozen) + len(found.corrupted)
    watched = len(result.change) + len(result.frozen_change)
    headline = (
        f"{n_bad} of {watched} parameters misbehaved after {plural(result.steps, 'step')}"
        if n_bad
        else "the optimizer does not hold exactly the model's trainable parameters"
    )
    fail(CHECK, headline, sections, symptoms=symptoms, sources=[step], result=result)


def _optimizer_membership(
    optimizer: Any,
    named: Sequence[tuple[str, torch.Tensor]],
    trainable: Sequence[tuple[str, torch.Tensor]],
    frozen_list: Sequence[tuple[str, torch.Tensor]],
) -> tuple[set[int], list[str], bool]:
    """Ids of the tensors ``optimizer`` holds, what is wrong with them, and whether an LR is 0."""
    groups = getattr(optimizer, "param_groups", None)
    if groups is None:
        raise TypeError(f"optimizer has no param_groups: {type(optimizer).__name__}")
    held = [p for group in groups for p in group["params"]]
    ids = set(map(id, held))
    notes: list[str] = []
    if len(held) == len(trainable) and all(map(is_, held, map(itemgetter(1), trainable))):
        # the model's trainable parameters, in order: none missing, none foreign, and no
        # frozen one (each tensor has one name: frozen and trainable are apart)
        return ids, notes, _lr_zero(groups, notes)
    model_ids = set(map(id, map(itemgetter(1), named)))
    missing = [n for n, p in trainable if id(p) not in ids]
    if missing:
        notes.append(
            f"{plural(len(missing), 'trainable parameter')} of the model "
            f"{'is' if len(missing) == 1 else 'are'} not in the optimizer: {', '.join(missing)}."
        )
    foreign = [p for p in held if id(p) not in model_ids]
    if foreign:
        shapes = ", ".join(fmt(tuple(p.shape)) for p in foreign[:8])
        notes.append(
            f"The optimizer holds {plural(len(foreign), 'tensor')} that "
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
    return ids, notes, _lr_zero(groups, notes)


def _lr_zero(groups: Any, notes: list[str]) -> bool:
    """Whether a param group's learning rate is 0, noted in ``notes``."""
    zero_groups = [i for i, g in enumerate(groups) if float(g.get("lr", 1.0)) == 0.0]
    if zero_groups:
        notes.append(
            "The learning rate is 0 in param_groups "
            + ", ".join(str(i) for i in zero_groups)
            + " (a warmup that starts at 0, or a scheduler that is never stepped)."
        )
    return bool(zero_groups)
