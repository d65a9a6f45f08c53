"""``assert_no_graph_in_eval``: an evaluation step builds no autograd graph."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from trainlint._runtime.guard import DEFAULT_TIMEOUT, guarded
from trainlint._runtime.links import Symptom
from trainlint._runtime.report import fail, fmt_bytes, table
from trainlint.testing._common import Step, model_step_runner, plural, runtime

if TYPE_CHECKING:
    import torch

CHECK = "assert_no_graph_in_eval"
# How deep the step's return value and the model's attributes are searched, and how many
# places a failure lists: a dict of lists of tensors is common, a deeper nest is not.
_MAX_DEPTH = 4
_MAX_PLACES = 8

SYMPTOMS = {
    "graph-in-eval": Symptom(
        ("TL303",),
        see_also=("TL302", "TL304"),
        text="The evaluation step recorded autograd history: `model.eval()` changes dropout "
        "and batch norm, not autograd, so every forward saves its activations for a "
        "backward that never comes. Evaluation then holds as much memory as training (more "
        "with larger batches) and OOMs at the first validation. Run it under "
        "`torch.no_grad()` (or `torch.inference_mode()`), e.g. `@torch.no_grad()` on the "
        "evaluation function.",
    ),
}


@dataclass(frozen=True)
class EvalGraphResult:
    """What :func:`assert_no_graph_in_eval` measured.

    ``saved_tensors[i]`` and ``saved_bytes[i]`` count what autograd saved for backward
    during step ``i`` (through ``torch.autograd.graph.saved_tensors_hooks``); ``with_history``
    lists where a tensor with a ``grad_fn`` was found after the steps: in a step's return
    value (``"step 0 returned [1]"``) or on the model (``"model.last_output"``), with the
    node that made it.
    """

    steps: int
    saved_tensors: tuple[int, ...]
    saved_bytes: tuple[int, ...]
    with_history: tuple[str, ...] = ()

    @property
    def built_graph(self) -> bool:
        return any(self.saved_tensors) or bool(self.with_history)


@guarded(CHECK)
def assert_no_graph_in_eval(
    model: torch.nn.Module,
    step: Step,
    *,
    steps: int = 2,
    batches: Iterable[Any] | None = None,
    timeout: float | None = DEFAULT_TIMEOUT,
) -> EvalGraphResult:
    """The evaluation step builds no autograd graph.

    Runs ``step`` (one evaluation batch, or a whole evaluation loop) ``steps`` times and
    fails when autograd recorded anything: a tensor saved for backward (seen by a
    ``saved_tensors_hooks`` pack hook), or a tensor with a ``grad_fn`` in what a step
    returned or on the model's modules. Passes under ``torch.no_grad()`` and
    ``torch.inference_mode()``, and when the model has no trainable parameter. Confirms
    TL303 (eval-without-no-grad).
    """
    __tracebackhide__ = True
    run = model_step_runner(CHECK, model, step, steps, batches)
    result = _measure(run, model, steps)
    if not result.built_graph:
        return result
    _report(result, step)


def _measure(run: Any, model: torch.nn.Module, steps: int) -> EvalGraphResult:
    __tracebackhide__ = True
    hooks = runtime().torch.autograd.graph.saved_tensors_hooks
    counts: list[int] = []
    sizes: list[int] = []
    places: list[str] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        counts[-1] += 1
        sizes[-1] += tensor.numel() * tensor.element_size()
        return tensor  # kept as autograd would keep it: nothing copied, nothing held longer

    # History the model held before (a loss kept by training) is not the evaluation's.
    before = {id(t) for _, t in _on_model(model)}
    for i in range(steps):
        counts.append(0)
        sizes.append(0)
        with hooks(pack, _unpack):
            out = run()
        places += [place for place, _ in _with_history(out, f"step {i} returned", 0)]
        del out
    places += [place for place, t in _on_model(model) if id(t) not in before]
    return EvalGraphResult(
        steps=steps,
        saved_tensors=tuple(counts),
        saved_bytes=tuple(sizes),
        with_history=tuple(dict.fromkeys(places)),
    )


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _on_model(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Tensors with history kept on the model's modules (``self.last = out``)."""
    found = []
    for name, module in model.named_modules():
        for attr, value in vars(module).items():
            if not attr.startswith("_"):  # parameters, buffers and submodules live there
                found += _with_history(
                    value, f"model.{name}.{attr}" if name else f"model.{attr}", 0
                )
    return found


def _with_history(value: Any, where: str, depth: int) -> list[tuple[str, torch.Tensor]]:
    """Where in ``value`` (tensors, and lists, tuples and dicts of them) a tensor has a
    ``grad_fn``, with the name of that node, and the tensor."""
    if isinstance(value, runtime().torch.Tensor):
        fn = value.grad_fn
        return [(f"{where} ({type(fn).__name__})", value)] if fn is not None else []
    if depth >= _MAX_DEPTH:
        return []
    if isinstance(value, dict):
        items: Iterable[tuple[Any, Any]] = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        return []
    found: list[tuple[str, torch.Tensor]] = []
    for key, item in items:
        found += _with_history(item, f"{where}[{key!r}]", depth + 1)
        if len(found) >= _MAX_PLACES:
            break
    return found


def _report(result: EvalGraphResult, step: Step) -> NoReturn:
    __tracebackhide__ = True
    rows = [
        (i, n, fmt_bytes(b))
        for i, (n, b) in enumerate(zip(result.saved_tensors, result.saved_bytes, strict=True))
    ]
    sections = [table(("step", "tensors saved for backward", "bytes"), rows)]
    if result.with_history:
        shown = result.with_history[:_MAX_PLACES]
        more = len(result.with_history) - len(shown)
        lines = [f"  {place}" for place in shown] + ([f"  ... and {more} more"] if more else [])
        sections.append("Tensors with autograd history after the steps:\n" + "\n".join(lines))
    symptom = SYMPTOMS["graph-in-eval"]
    saved = sum(result.saved_tensors)
    headline = (
        f"the evaluation step built an autograd graph ({plural(saved, 'tensor')} saved for "
        f"backward over {plural(result.steps, 'step')}"
        + (f", {len(result.with_history)} kept with history)" if result.with_history else ")")
    )
    fail(
        CHECK,
        headline,
        [*sections, symptom.text],
        symptoms=[symptom],
        sources=[step],
        result=result,
    )
