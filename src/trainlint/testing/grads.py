"""``assert_grads_nonzero``: every trainable parameter receives a gradient."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Any, NoReturn

from trainlint._runtime.guard import DEFAULT_TIMEOUT, guarded
from trainlint._runtime.links import Symptom
from trainlint._runtime.report import fail, table
from trainlint.testing._common import (
    Step,
    model_step_runner,
    plural,
    runtime,
    selects,
    steps_text,
    trainable,
)

if TYPE_CHECKING:
    import torch

    from trainlint._runtime.steps import ParamSpec

CHECK = "assert_grads_nonzero"
_shape = attrgetter("shape")

SYMPTOMS = {
    "no-gradient-anywhere": Symptom(
        ("TL108", "TL105", "TL501", "TL502", "TL107"),
        text="No gradient reached any parameter of this model. Either backward() never ran "
        "through it (the loss was cut from the graph, or computed under no_grad), or the "
        "step trained another object: a copy made by deepcopy or pickling, a model sent "
        "to a Ray remote or actor, or to a forked process, whose updates never come back.",
    ),
    "none-gradients": Symptom(
        ("TL108", "TL105"),
        text="Parameters with a None gradient are not on the path from the loss to the "
        "model: a branch was detached (.detach(), .data, .item(), a torch.no_grad() block "
        "around part of the forward), or a submodule's output is never used.",
    ),
    # A grad norm read after zero_grad() (TL101) is 0 while this check passes: the hooks
    # see the gradients as backward accumulates them. Pointed to, never confirmed.
    "zero-gradients": Symptom(
        ("TL108", "TL105"),
        see_also=("TL101",),
        text="All-zero gradients mean the parameters are in the graph but nothing flows back "
        "through them: dead ReLUs (pre-activations all negative), a multiplication by "
        "zero, or a mask. (If instead your logged gradient norm is 0 while this check "
        "passes, the norm is read after zero_grad().)",
    ),
}


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


@guarded(CHECK)
def assert_grads_nonzero(
    model: torch.nn.Module,
    step: Step,
    *,
    steps: int = 1,
    ignore: Sequence[ParamSpec] | ParamSpec = (),
    batches: Iterable[Any] | None = None,
    timeout: float | None = DEFAULT_TIMEOUT,
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
    run = model_step_runner(CHECK, model, step, steps, batches)
    ignored: set[str] = set()
    if selects(ignore):
        ignored = runtime().match_params(model, ignore, "ignore")
    named = trainable(model, exclude=ignored)
    result = _measure(run, named, steps, ignored)
    gaps = _diagnose(result)
    if gaps is None:
        return result
    _report(gaps, result, step)


def _measure(
    run: Any, named: list[tuple[str, torch.Tensor]], steps: int, ignored: set[str]
) -> GradsResult:
    """Run the steps, recording each parameter's largest |gradient| as it accumulates."""
    __tracebackhide__ = True
    recorder = runtime().GradRecorder([p for _, p in named])
    with recorder:
        for i in range(steps):
            recorder.begin_step(i)
            run()
            recorder.end_step()
    per_param = zip(*recorder.table(steps), strict=True)  # [step][param] -> [param][step]
    names = [n for n, _ in named]
    return GradsResult(
        steps=steps,
        max_abs=dict(zip(names, per_param, strict=True)),
        shapes=dict(zip(names, map(tuple, map(_shape, recorder.params)), strict=True)),
        ignored=tuple(sorted(ignored)) if ignored else (),
    )


@dataclass(frozen=True)
class _Gaps:
    """Per parameter, the steps in which its gradient was None, and was all zero."""

    none_steps: dict[str, list[int]]
    zero_steps: dict[str, list[int]]
    symptoms: tuple[str, ...]


def _diagnose(result: GradsResult) -> _Gaps | None:
    if all(all(values) for values in result.max_abs.values()):
        return None  # neither None nor 0.0 anywhere (NaN is truthy: not this check's to fail)
    none_steps: dict[str, list[int]] = {}
    zero_steps: dict[str, list[int]] = {}
    for name, values in result.max_abs.items():
        nones = [i for i, v in enumerate(values) if v is None]
        zeros = [i for i, v in enumerate(values) if v == 0.0]
        if nones:
            none_steps[name] = nones
        if zeros:
            zero_steps[name] = zeros
    if not none_steps and not zero_steps:
        return None
    symptoms: list[str] = []
    everything_none = all(v is None for vs in result.max_abs.values() for v in vs)
    if len(none_steps) == len(result.max_abs) and everything_none:
        symptoms.append("no-gradient-anywhere")
    elif none_steps:
        symptoms.append("none-gradients")
    if zero_steps:
        symptoms.append("zero-gradients")
    return _Gaps(none_steps, zero_steps, tuple(symptoms))


def _report(gaps: _Gaps, result: GradsResult, step: Step) -> NoReturn:
    __tracebackhide__ = True
    rows = []
    for name, shape in result.shapes.items():
        if name in gaps.none_steps:
            rows.append((name, shape, "None", steps_text(gaps.none_steps[name], result.steps)))
        if name in gaps.zero_steps:
            rows.append((name, shape, "all zero", steps_text(gaps.zero_steps[name], result.steps)))
    symptoms = [SYMPTOMS[s] for s in gaps.symptoms]
    bad = gaps.none_steps.keys() | gaps.zero_steps.keys()
    fail(
        CHECK,
        f"{len(bad)} of {len(result.max_abs)} trainable parameters got no gradient or an "
        f"all-zero one ({plural(result.steps, 'step')})",
        [table(("parameter", "shape", "gradient", "steps"), rows), *(s.text for s in symptoms)],
        symptoms=symptoms,
        sources=[step],
        result=result,
    )
