"""``assert_step_time_stable``: later steps are not slower than early ones."""

from __future__ import annotations

import contextlib
import math
import statistics
import time
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

from trainlint._runtime.guard import DEFAULT_TIMEOUT, guarded
from trainlint._runtime.links import Symptom
from trainlint._runtime.report import fail, table
from trainlint.testing._common import Step

CHECK = "assert_step_time_stable"

#: On CPU each timed sample runs the step this long (CPU seconds) at least: a
#: sub-millisecond step timed on its own is dominated by the timer, cache and
#: frequency effects, a batch of calls is not.
SAMPLE_SECONDS = 0.005
#: Most calls one sample may batch (a step of a microsecond or less).
MAX_CALLS_PER_SAMPLE = 1000

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

    ``times[i]`` is the time of one step in sample ``i``: on CPU the calling thread's CPU
    time of ``calls_per_sample`` consecutive calls divided by that count; on CUDA the
    synchronized wall-clock time of one call (``calls_per_sample`` is 1). ``ratio`` is the
    median of the later half of the timed samples over the median of the first half;
    ``confirm_median`` is the median of the extra samples timed to confirm a slowdown
    (None when there was none). ``syncs[i]`` counts the host syncs of step ``i`` and
    ``sync_sites`` where they came from; both are None off CUDA. ``clock`` names what was
    measured: ``"thread_time"`` or ``"cuda"``.
    """

    times: tuple[float, ...]
    early_median: float
    late_median: float
    ratio: float
    confirm_median: float | None = None
    syncs: tuple[int, ...] | None = None
    sync_sites: dict[str, int] | None = None
    calls_per_sample: int = 1
    clock: str = "thread_time"


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

    Runs ``warmup`` untimed steps, then times ``steps`` samples and compares the median of
    the second half with the median of the first. A slowdown above ``max_slowdown`` is
    confirmed by timing as many samples again: a step whose work grows keeps slowing down,
    while noise does not. (A slowdown that happens once and then holds is therefore not
    reported.)

    On CPU a sample is the CPU time of the calling thread (``time.thread_time``) over
    enough consecutive calls to take at least ``SAMPLE_SECONDS`` (calibrated after the
    warmup), with torch held to one intra-op thread for the whole check and restored
    after: time the step spends waiting (for a core on a busy machine, in ``sleep``, on
    I/O) is not counted, so a busy machine can neither fake a slowdown nor hide one. Work
    the step hands to other threads or processes is not counted either.

    On CUDA each step is one sample, synchronized before its clock stops, and host syncs
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
    clock = _Clock(torch, run)
    with clock.single_threaded():
        for _ in range(warmup):
            run()
        clock.calibrate()
        for _ in range(steps):
            clock.timed()
        times = clock.times  # the confirming samples are appended to it
        half = steps // 2
        early = statistics.median(times[:half])
        late = statistics.median(times[half:])
        ratio = late / early if early > 0 else math.inf
        slow = ratio > max_slowdown
        confirm: float | None = None
        if slow:
            # A step whose work grows keeps growing; a one-off slowdown (a busier
            # machine seen through CUDA's wall clock, a CPU that clocked down) does
            # not. So a slowdown counts only while it continues: the next window must
            # be slower again by a part of the early-to-late growth: half of it on the
            # wall clock of CUDA, a quarter on CPU, where a thread's CPU time is not
            # inflated by a busier machine and the window's noise is all that is left.
            confirm = statistics.median([clock.timed() for _ in range(steps - half)])
            part = 0.5 if clock.on_cuda else 0.25
            slow = confirm >= late + part * (late - early)
    on_cuda = clock.on_cuda
    result = StepTimeResult(
        times=tuple(times),
        early_median=early,
        late_median=late,
        ratio=ratio,
        confirm_median=confirm,
        syncs=tuple(clock.syncs) if on_cuda else None,
        sync_sites=dict(clock.sites) if on_cuda else None,
        calls_per_sample=clock.calls,
        clock="cuda" if on_cuda else "thread_time",
    )
    too_many_syncs = on_cuda and max_syncs is not None and max(clock.syncs, default=0) > max_syncs
    if not slow and not too_many_syncs:
        return result
    _report(result, slow, steps, warmup, max_slowdown, max_syncs, step)


class _Clock:
    """Times samples of the step; on CUDA, one synchronized call counting its host syncs.

    On CPU it reads the calling thread's CPU time (``time.thread_time``), which a busy
    machine cannot inflate: waiting for a core is not running on it. Not the process's
    CPU time: torch's intra-op worker threads spin while they wait for work, and other
    threads of the process (data loaders, the neighbours a test starts) count there too.
    So that the step's work is all on the calling thread, the check runs it with
    ``torch.set_num_threads(1)``. A sample batches ``calls`` calls so that it takes
    ``SAMPLE_SECONDS`` of CPU at least: see docs/testing.md.
    """

    def __init__(self, torch: Any, run: Any) -> None:
        self.torch = torch
        self.run = run
        self.on_cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        self.calls = 1
        self.times: list[float] = []
        self.syncs: list[int] = []
        self.sites: Counter[str] = Counter()

    def calibrate(self) -> None:
        """Choose how many calls a CPU sample batches (untimed calls, like the warmup)."""
        __tracebackhide__ = True
        if self.on_cuda:
            return
        # One call, then a batch of about a tenth of a sample to average out the first
        # call's cold caches. Few calls: a step whose work grows with every call should
        # not have grown much before the first timed sample.
        per_call = max(self._cpu_time(1), 1e-9)
        for _ in range(2):  # twice: the first call may be far slower than the rest
            if per_call >= SAMPLE_SECONDS:
                break
            probe = min(MAX_CALLS_PER_SAMPLE // 10, math.ceil(0.1 * SAMPLE_SECONDS / per_call))
            per_call = max(self._cpu_time(probe) / probe, 1e-9)
        calls = min(MAX_CALLS_PER_SAMPLE, max(1, math.ceil(SAMPLE_SECONDS / per_call)))
        self.calls = calls

    def _cpu_time(self, calls: int) -> float:
        __tracebackhide__ = True
        run = self.run
        start = time.thread_time()
        for _ in range(calls):
            run()
        return time.thread_time() - start

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
            elapsed = self._cpu_time(self.calls) / self.calls
        self.times.append(elapsed)
        return elapsed

    @contextlib.contextmanager
    def single_threaded(self) -> Iterator[None]:
        """One intra-op thread on CPU for the duration, the caller's count restored."""
        if self.on_cuda:
            yield
            return
        previous = self.torch.get_num_threads()
        self.torch.set_num_threads(1)
        try:
            yield
        finally:
            self.torch.set_num_threads(previous)


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
            f"({_measured(result)})\n"
            f"median of samples 0-{half - 1}: {result.early_median * 1e3:.3g} ms; of samples "
            f"{half}-{steps - 1}: {result.late_median * 1e3:.3g} ms (slowdown "
            f"{result.ratio:.2f}x, allowed {max_slowdown}x); of samples {steps}-"
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


def _measured(result: StepTimeResult) -> str:
    if result.clock == "cuda":
        return "one call per sample, wall-clock, synchronized"
    calls = result.calls_per_sample
    per = "one call" if calls == 1 else f"the mean of {calls} consecutive calls"
    return f"each {per}: CPU time of the calling thread, one intra-op thread"


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
