"""``assert_step_time_stable``: later steps are not slower than early ones."""

from __future__ import annotations

import math
import statistics
import time
import warnings
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NoReturn

from trainlint._runtime.guard import DEFAULT_TIMEOUT, guarded
from trainlint._runtime.links import Symptom
from trainlint._runtime.report import fail, table
from trainlint.testing._common import Step

CHECK = "assert_step_time_stable"

SYMPTOMS = {
    "slower-each-step": Symptom(
        ("TL302", "TL301", "TL305", "TL403"),
        text="Each step does more work than the last: usually an autograd graph that keeps "
        "growing (a loss accumulated with its history makes every backward walk all "
        "past graphs), a list that is re-processed each step, or caches that are "
        "cleared or rebuilt every step.",
    ),
    "host-syncs": Symptom(("TL401", "TL402")),
}


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


@guarded(CHECK)
def assert_step_time_stable(
    step: Step,
    *,
    steps: int = 10,
    warmup: int = 1,
    max_slowdown: float = 1.5,
    max_syncs: int | None = None,
    batches: Iterable[Any] | None = None,
    timeout: float | None = DEFAULT_TIMEOUT,
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

    from trainlint._runtime.arguments import check_count
    from trainlint._runtime.steps import StepRunner

    check_count("steps", steps, 2)
    check_count("warmup", warmup, 0)
    if not max_slowdown > 1.0:
        raise ValueError(f"max_slowdown must be > 1, got {max_slowdown!r}")
    run = StepRunner(step, batches, check=CHECK)
    for _ in range(warmup):
        run()
    clock = _Clock(torch, run)
    for _ in range(steps):
        clock.timed()
    times = clock.times
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
        confirm = statistics.median([clock.timed() for _ in range(steps - half)])
        slow = confirm >= late + 0.5 * (late - early)
    on_cuda = clock.on_cuda
    result = StepTimeResult(
        times=tuple(times),
        early_median=early,
        late_median=late,
        ratio=ratio,
        confirm_median=confirm,
        syncs=tuple(clock.syncs) if on_cuda else None,
        sync_sites=dict(clock.sites) if on_cuda else None,
    )
    too_many_syncs = on_cuda and max_syncs is not None and max(clock.syncs, default=0) > max_syncs
    if not slow and not too_many_syncs:
        return result
    _report(result, slow, steps, warmup, max_slowdown, max_syncs, step)


class _Clock:
    """Times each call of the step; on CUDA, synchronized, and counting its host syncs."""

    def __init__(self, torch: Any, run: Any) -> None:
        self.torch = torch
        self.run = run
        self.on_cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        self.times: list[float] = []
        self.syncs: list[int] = []
        self.sites: Counter[str] = Counter()

    def timed(self) -> float:
        __tracebackhide__ = True
        torch = self.torch
        if self.on_cuda:
            torch.cuda.synchronize()
            with _SyncCounter(torch) as counter:
                start = time.perf_counter()
                self.run()
            torch.cuda.synchronize()
            elapsed = time.perf_counter() - start
            self.syncs.append(counter.count)
            self.sites.update(counter.sites)
        else:
            start = time.perf_counter()
            self.run()
            elapsed = time.perf_counter() - start
        self.times.append(elapsed)
        return elapsed


def _report(
    result: StepTimeResult,
    slow: bool,
    steps: int,
    warmup: int,
    max_slowdown: float,
    max_syncs: int | None,
    step: Step,
) -> NoReturn:
    __tracebackhide__ = True
    times = result.times
    half = steps // 2
    sections = []
    symptoms = []
    ms = ", ".join(f"{t * 1e3:.3g}" for t in times)
    if slow:
        symptoms.append(SYMPTOMS["slower-each-step"])
        sections.append(
            f"Step times (ms, after {warmup} warmup): {ms}\n"
            f"median of steps 0-{half - 1}: {result.early_median * 1e3:.3g} ms; of steps "
            f"{half}-{steps - 1}: {result.late_median * 1e3:.3g} ms (slowdown "
            f"{result.ratio:.2f}x, allowed {max_slowdown}x); of steps {steps}-"
            f"{len(times) - 1}: {(result.confirm_median or 0.0) * 1e3:.3g} ms, still growing."
        )
        sections.append(SYMPTOMS["slower-each-step"].text)
    syncs = result.syncs
    if syncs is not None:
        symptoms.append(SYMPTOMS["host-syncs"])
        sites = Counter(result.sync_sites or {})
        sync_rows = [(site, count) for site, count in sites.most_common()]
        sections.append(
            f"Host syncs per step: {', '.join(str(s) for s in syncs)}"
            + ("\n" + table(("where", "syncs"), sync_rows) if sync_rows else "")
        )
    headline = (
        f"later steps are {result.ratio:.2f}x slower than early ones"
        if slow
        else f"up to {max(syncs or (0,))} host syncs per step (max_syncs={max_syncs})"
    )
    fail(CHECK, headline, sections, symptoms=symptoms, sources=[step], result=result)


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
