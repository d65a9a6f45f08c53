"""``assert_memory_stable``: what a step keeps alive does not grow from step to step."""

from __future__ import annotations

import gc
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from trainlint._runtime.guard import DEFAULT_TIMEOUT, guarded
from trainlint._runtime.links import Symptom
from trainlint._runtime.report import fail, fmt_bytes, table
from trainlint.testing._common import Step, plural

CHECK = "assert_memory_stable"

SYMPTOMS = {
    "saved-bytes-grow": Symptom(
        ("TL302", "TL301", "TL304", "TL303"),
        text="(a) grows: each step's graph outlives the step with its saved buffers, because "
        "it was backpropagated with retain_graph=True, or never backpropagated while an "
        "output or loss was kept (on self, in a list, or from an evaluation run outside "
        "torch.no_grad()).",
    ),
    "graph-nodes-grow": Symptom(
        ("TL302", "TL304", "TL301"),
        text="(b) grows while (a) does not: backward() freed the saved buffers, but each "
        "step's graph stays chained to something that outlives the step: a loss or "
        "output accumulated with its history (`total += loss`, `losses.append(loss)`, "
        "a tensor kept on self). Accumulate `loss.item()` or `loss.detach()` instead.",
    ),
    "cuda-bytes-grow": Symptom(
        ("TL302", "TL304", "TL305"),
        text="(c) grows while no autograd graph does: tensors without history are kept on "
        "the GPU from step to step (a list of detached outputs, a cache that is never "
        "trimmed).",
    ),
}

_LABELS = {
    "saved_bytes": "(a) bytes saved by live autograd graphs",
    "graph_nodes": "(b) autograd graph nodes kept alive",
    "cuda_bytes": "(c) CUDA memory allocated",
}


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


@guarded(CHECK)
def assert_memory_stable(
    step: Step,
    *,
    steps: int = 8,
    warmup: int = 2,
    tolerance: int = 0,
    batches: Iterable[Any] | None = None,
    timeout: float | None = DEFAULT_TIMEOUT,
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
    from trainlint._runtime.arguments import check_count
    from trainlint._runtime.steps import StepRunner

    check_count("steps", steps, 2)
    check_count("warmup", warmup, 0)
    check_count("tolerance", tolerance, 0)
    run = StepRunner(step, batches, check=CHECK)
    tolerances = {"saved_bytes": tolerance, "graph_nodes": 0, "cuda_bytes": tolerance}
    measures = _Measures()
    with measures.probe:
        for _ in range(warmup):
            run()
        measures.take()
        for _ in range(steps):
            run()
            measures.take()
        series = measures.series()
        growing = _diagnose(series, tolerances)
        if growing:
            # Confirm: garbage in the old generation can look like growth until a full
            # collection; what survives one is held.
            gc.collect()
            measures.retake_last(series)
            growing = _diagnose(series, tolerances)
    result = MemoryResult(
        steps=steps,
        warmup=warmup,
        saved_bytes=tuple(series["saved_bytes"]),
        graph_nodes=tuple(series["graph_nodes"]),
        cuda_bytes=tuple(series["cuda_bytes"]) if "cuda_bytes" in series else None,
        growth={k: (v[-1] - v[0]) / (len(v) - 1) for k, v in series.items()},
    )
    if not growing:
        return result
    _report(growing, series, measures.cuda, result, step)


class _Measures:
    """The three measures after warmup and after each step, and the probe behind (a), (b)."""

    def __init__(self) -> None:
        from trainlint._runtime.memory import AutogradProbe

        self.probe = AutogradProbe()
        self.saved: list[int] = []
        self.nodes: list[int] = []
        self.cuda: list[int | None] = []

    def take(self) -> None:
        from trainlint._runtime.memory import cuda_allocated

        # The young generations hold any cyclic garbage the step just made; collecting
        # them is cheap, unlike a full collection (tens of ms once torch is imported).
        gc.collect(1)
        self.saved.append(self.probe.saved_bytes())
        self.nodes.append(self.probe.live_nodes())
        self.cuda.append(cuda_allocated())

    def series(self) -> dict[str, list[int]]:
        """The measured series by name; CUDA's only when CUDA was in use throughout."""
        series: dict[str, list[int]] = {"saved_bytes": self.saved, "graph_nodes": self.nodes}
        cuda_series = [c for c in self.cuda if c is not None]
        if len(cuda_series) >= 3:
            series["cuda_bytes"] = cuda_series
        return series

    def retake_last(self, series: dict[str, list[int]]) -> None:
        from trainlint._runtime.memory import cuda_allocated

        series["saved_bytes"][-1] = self.probe.saved_bytes()
        series["graph_nodes"][-1] = self.probe.live_nodes()
        if "cuda_bytes" in series:
            now = cuda_allocated()
            if now is not None:
                series["cuda_bytes"][-1] = now


def _diagnose(series: dict[str, list[int]], tolerances: dict[str, int]) -> list[str]:
    """The measures that grow."""
    return [k for k, v in series.items() if _grows(v, tolerances[k])]


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


def _report(
    growing: list[str],
    series: dict[str, list[int]],
    cuda: list[int | None],
    result: MemoryResult,
    step: Step,
) -> NoReturn:
    __tracebackhide__ = True

    def show(key: str, value: float) -> str:
        return str(int(value)) if key == "graph_nodes" else fmt_bytes(value)

    rows = []
    for key, label in _LABELS.items():
        if key not in series:
            rows.append((label, "-", "-", "-", "not measured: CUDA not in use"))
            continue
        values = series[key]
        ups = sum(1 for a, b in zip(values, values[1:], strict=False) if b > a)
        per_step = result.growth[key]
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
    saved, nodes = series["saved_bytes"], series["graph_nodes"]
    series_rows = []
    for i in range(len(saved)):
        label = "warmup" if i == 0 else str(result.warmup + i - 1)
        c_value = cuda[i] if i < len(cuda) else None
        series_rows.append(
            (label, fmt_bytes(saved[i]), nodes[i], "-" if c_value is None else fmt_bytes(c_value))
        )
    sections.append(table(("after step", "(a) saved", "(b) nodes", "(c) cuda"), series_rows))
    # The first growing measure in (a), (b), (c) order says the most about the cause.
    symptom = SYMPTOMS[
        "saved-bytes-grow"
        if "saved_bytes" in growing
        else "graph-nodes-grow"
        if "graph_nodes" in growing
        else "cuda-bytes-grow"
    ]
    sections.append(symptom.text)
    fail(
        CHECK,
        f"memory held after each step grows ({', '.join(_LABELS[k] for k in growing)}) "
        f"over {plural(result.steps, 'step')} after {result.warmup} warmup",
        sections,
        symptoms=[symptom],
        sources=[step],
        result=result,
    )
