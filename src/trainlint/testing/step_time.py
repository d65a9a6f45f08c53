"""``assert_step_time_stable``: later steps are not slower than early ones."""

from __future__ import annotations

import itertools
import math
import statistics
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple, NoReturn

from trainlint._runtime.clock import StepClock
from trainlint._runtime.guard import DEFAULT_TIMEOUT, guarded
from trainlint._runtime.links import Symptom
from trainlint._runtime.report import fail, table
from trainlint.testing._common import Step

CHECK = "assert_step_time_stable"

#: Windows timed after a slowdown to confirm that it continues, and the share of the
#: allowed slowdown (``max_slowdown - 1``) by which the trend of all windows must grow
#: from one to the next for the step to fail (see ``_growth``). Half, not all of it: on
#: a busy machine a step's CPU time per call doubles, a sample batches half as many
#: calls, and a window sees half the growth it would on a quiet one. The second window
#: need only be slower than the first by half that again for the windows to be timed:
#: one of the two slowed by a busy machine hides up to half the growth. An undecided
#: trend (see ``_verdict``) is timed over as many windows again, up to
#: ``MAX_CONFIRM_WINDOWS`` in all (see ``_confirm``).
CONFIRM_WINDOWS = 4
CONFIRM_GROWTH = 0.5
MAX_CONFIRM_WINDOWS = 4 * CONFIRM_WINDOWS

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

    ``times[i]`` is the time of one step in sample ``i``, the sample's time divided by
    ``calls_per_sample``. ``clock`` names what was measured: ``"thread_time"`` (CPU: the
    calling thread's CPU time, scaled to the machine's speed at calibration by a fixed
    reference workload timed before each sample), ``"active"`` (CPU, a step that mostly
    waits: wall-clock time less the time its thread sat in the run queue waiting for a
    core), ``"wall"``
    (the same where the run queue cannot be read: plain wall clock) or ``"cuda"`` (CUDA
    events around one call), or ``"cuda+thread_time"`` for a step that runs CUDA kernels
    and tensor work on the CPU: ``times`` are then its CUDA event times and ``host_times``
    the calling thread's CPU time of the same calls, each judged on its own. ``early``, ``late`` and ``confirm`` are the floors (the mean
    of the lowest third) of the first half of the ``steps`` samples, of the second half
    and of each window timed to confirm a slowdown; ``ratio`` is ``late / early``;
    ``growth`` is how much the trend of all those windows grows from one window to the
    next, as a share of its start (0 when no slowdown was confirmed).
    ``early_median`` and ``late_median`` are the plain medians of the two halves.
    ``syncs[i]`` counts the host syncs of step ``i`` and ``sync_sites`` where they came
    from; both are None off CUDA.
    """

    times: tuple[float, ...]
    early_median: float
    late_median: float
    ratio: float
    early: float = 0.0
    late: float = 0.0
    confirm: tuple[float, ...] = ()
    growth: float = 0.0
    syncs: tuple[int, ...] | None = None
    sync_sites: dict[str, int] | None = None
    calls_per_sample: int = 1
    clock: str = "thread_time"
    host_times: tuple[float, ...] | None = None


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

    Runs ``warmup`` untimed steps, then times ``steps`` samples and compares the floor
    (the mean of the lowest third) of the second half with that of the first: noise on a
    busy machine only ever adds time, so the fastest samples are the step's own cost.
    When the second half is slower by more than a quarter of the allowed slowdown
    (``max_slowdown - 1``), ``CONFIRM_WINDOWS`` more windows of as many samples are
    timed, and the check fails when the trend of all the windows (a median of slopes,
    see ``_growth``) grows by ``CONFIRM_GROWTH`` (half) of it from one window to the
    next: a step that becomes ``max_slowdown`` slower within two windows, and still grows
    without the first window. An undecided trend is timed over four more windows at a
    time, up to sixteen (``_verdict``, ``_confirm``). A step whose work grows keeps
    slowing down; noise, or a slowdown that happens once and then holds, does not, and
    is not reported.

    On CPU a sample is the CPU time of the calling thread (``time.thread_time``) over
    enough consecutive calls to take at least ``SAMPLE_SECONDS`` (calibrated after the
    warmup), with torch held to one intra-op thread for the whole check and restored
    after, and scaled by a fixed reference workload timed before each sample (the same
    work's CPU time drifts on a shared machine; see ``StepClock``). Time the thread
    spends not running is not counted: waiting for a core on a busy machine (so a busy
    machine can neither fake a slowdown nor hide one), but also ``time.sleep``, I/O,
    locks, and work the step hands to other threads or processes.
    A step that mostly waits (its thread runs less than ``MIN_CPU_SHARE`` of the time it
    is not queued for a core) is timed by wall clock less its run-queue wait instead
    (Linux; plain wall clock elsewhere), which sees the waits; ``result.clock`` says which.

    The clock follows where the step's work runs, decided from one untimed call after
    the warmup (the devices of the tensors its operators use), not from whether CUDA is
    available or initialised in the process. A step that runs CUDA kernels is timed one
    call a sample with CUDA events and synchronized; one that also does tensor work on the
    CPU is timed by both clocks, each judged on its own. Host syncs inside a CUDA step are
    counted with ``torch.cuda.set_sync_debug_mode`` and reported by source line (the
    check's own synchronize and event records are outside the counted region); with
    ``max_syncs`` a step with more syncs than that fails the check.
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
    clock = StepClock(torch, run)
    allowed = CONFIRM_GROWTH * (max_slowdown - 1)
    with clock.single_threaded():
        for _ in range(warmup):
            run()
        clock.calibrate()
        for _ in range(steps):
            clock.timed()
        # each clock judged on its own samples (a step doing both: CUDA events, and the
        # thread's CPU time); a window one needs is timed for both
        verdicts = [_judge(clock.times, steps, allowed, clock.timed)]
        if clock.on_cuda and clock.on_cpu:
            verdicts.append(_judge(clock.host_times, steps, allowed, clock.timed))
    if verdicts[0].slow and clock.turned_to_waiting(steps // 2):
        verdicts[0] = verdicts[0]._replace(slow=False)
    main = next((v for v in verdicts if v.slow), verdicts[0])
    on_cuda = clock.on_cuda
    times = clock.times
    half = steps // 2
    result = StepTimeResult(
        times=tuple(times),
        early_median=statistics.median(times[:half]),
        late_median=statistics.median(times[half:steps]),
        ratio=main.ratio,
        early=main.early,
        late=main.late,
        confirm=main.confirm,
        growth=main.growth,
        syncs=tuple(clock.syncs) if on_cuda else None,
        sync_sites=dict(clock.sites) if on_cuda else None,
        calls_per_sample=clock.calls,
        clock=clock.kind,
        host_times=tuple(clock.host_times) if clock.host_times else None,
    )
    slow = main.slow
    too_many_syncs = on_cuda and max_syncs is not None and max(clock.syncs, default=0) > max_syncs
    if not slow and not too_many_syncs:
        return result
    host = slow and main is not verdicts[0]
    _report(result, slow, steps, warmup, max_slowdown, max_syncs, step, host)


class _Verdict(NamedTuple):
    """One clock's judgement: the floors of its windows, and whether it keeps slowing."""

    slow: bool
    early: float
    late: float
    ratio: float
    confirm: tuple[float, ...]
    growth: float


def _judge(
    times: list[float], steps: int, allowed: float, time_one: Callable[[], object]
) -> _Verdict:
    """Judge one clock's samples (``times``, which ``time_one()`` extends by one sample):
    the floors of the two halves of the first ``steps``, and when the second is slower by
    more than half of ``allowed``, windows of as many samples again until the trend
    decides (``_confirm``). Samples already timed for another clock are reused."""
    half = steps // 2
    early, late = _floor(times[:half]), _floor(times[half:steps])
    ratio = late / early if early > 0 else math.inf
    if not ratio > 1 + allowed / 2:
        return _Verdict(False, early, late, ratio, (), 0.0)
    size = steps - half
    taken = [0]

    def window() -> float:
        start = steps + taken[0] * size
        taken[0] += 1
        while len(times) < start + size:
            time_one()
        return _floor(times[start : start + size])

    slow, confirm = _confirm([early, late], window, allowed)
    return _Verdict(slow, early, late, ratio, tuple(confirm), _growth([early, late, *confirm]))


def _confirm(
    first: list[float], window: Callable[[], float], allowed: float
) -> tuple[bool, list[float]]:
    """Whether the step keeps slowing down, and the floors of the windows timed to decide:
    ``CONFIRM_WINDOWS`` at a time (``window()`` times one), until ``_verdict`` decides
    or ``MAX_CONFIRM_WINDOWS`` are timed; still undecided then, the step passes.

    Sixteen at most, not eight: beside busy neighbours a sample batches fewer calls (see
    ``CONFIRM_GROWTH``), and a step re-processing every earlier batch (the load test's)
    then grew by as little as 1-2x the allowed rate a window, its floors scattered by up
    to a third around their trend. Resampling that scatter, a step growing at the allowed
    rate was still undecided after ten windows a third of the time, at 1.2x that rate 4%,
    and passed; after eighteen, 17% and 0.4%. A slowdown that happens once and holds is
    decided no differently: the windows after it only add flat slopes.
    """
    confirm: list[float] = []
    verdict = None
    while verdict is None and len(confirm) < MAX_CONFIRM_WINDOWS:
        confirm.extend(window() for _ in range(CONFIRM_WINDOWS))
        verdict = _verdict([*first, *confirm], allowed)
    return bool(verdict), confirm


def _verdict(windows: list[float], allowed: float) -> bool | None:
    """Whether the floors of the windows keep growing by more than ``allowed`` of the
    first a window (see ``_growth``); None when they cannot yet say.

    Growing: the trend of all of them grows by more than ``allowed``, and that of all but
    the first by half of it (of its own start). Not: the trend of all of them grows by half
    of it or less. Between, the step may grow, or a busy machine may have bent a trend
    (a growing step's flattened for a few windows by load lifting as its work grew; a
    step slowed once between the first two windows, five of the fifteen slopes steep,
    while load then rose): more windows decide. A step slowed once, then holding, leaves
    the windows after the first flat, whatever the slopes to the first say.
    """
    growth = _growth(windows)
    if growth <= allowed / 2:
        return False
    if growth > allowed and _growth(windows[1:]) > allowed / 2:
        return True
    return None


def _growth(windows: list[float]) -> float:
    """How much the floors of consecutive windows grow, window to window, as a share of
    the first: the slope of their trend line over its start (Theil-Sen: the median of the
    slopes between every two windows, the start the median of what each window leaves).

    A step whose work grows keeps growing at its rate; noise, a one-off slowdown that
    then holds (the CPU clocked down, a neighbour now shares the core's caches) or one
    window slowed by a busy machine (on some virtual machines a shared host's stolen
    time is charged to the thread) moves only some of the slopes, and the median of
    them stays with the rest: a slowdown that holds leaves most slopes at 0, one slowed
    window among six bends five of fifteen. Judged window by window against the
    highest so far, as before, a growing step slowed in one window could run out of
    windows before it rose above it, and noise that stepped up twice passed for growth.
    """
    slopes = [(b - a) / (j - i) for (i, a), (j, b) in itertools.combinations(enumerate(windows), 2)]
    slope = statistics.median(slopes)
    start = statistics.median(w - slope * i for i, w in enumerate(windows))
    return slope / start if start > 0 else math.inf


def _floor(window: list[float]) -> float:
    """The mean of the lowest third (at least one) of a window of sample times.

    Noise from a busy machine (cold caches after a context switch, an interrupt, a
    neighbour on the core's sibling) only adds time, so the window's fastest samples
    estimate the step's own cost; a third of them, not the single fastest, so that one
    lucky sample does not decide.
    """
    low = sorted(window)[: -(-len(window) // 3)]
    return sum(low) / len(low)


def _report(
    result: StepTimeResult,
    slow: bool,
    steps: int,
    warmup: int,
    max_slowdown: float,
    max_syncs: int | None,
    step: Step,
    host: bool = False,
) -> NoReturn:
    """``host``: the slowdown was found by the CPU clock of a step that also runs CUDA."""
    __tracebackhide__ = True
    times = result.host_times if host and result.host_times else result.times
    half = steps // 2
    sections = []
    symptoms = []
    ms = ", ".join(f"{t * 1e3:.3g}" for t in times)
    if slow:
        symptoms.append(SYMPTOMS["slower-each-step"])
        windows = [f"{result.early * 1e3:.3g}", f"{result.late * 1e3:.3g}"]
        windows += [f"{c * 1e3:.3g}" for c in result.confirm]
        sections.append(
            f"Step times (ms, after {warmup} warmup): {ms}\n"
            f"({_measured(result, host)})\n"
            f"Fastest third of each window of {half}-{steps - half} samples (ms): "
            f"{' -> '.join(windows)}: {result.growth:.0%} of the first window more each "
            f"window along their trend (allowed: {CONFIRM_GROWTH * (max_slowdown - 1):.0%}, "
            f"so that the step is at most max_slowdown={max_slowdown} slower after two)."
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
        f"later steps are {_slowdown(result):.2f}x slower than early ones, and slower "
        "with every window"
        if slow
        else f"up to {max(syncs or (0,))} host syncs per step (max_syncs={max_syncs})"
    )
    fail(CHECK, headline, sections, symptoms=symptoms, sources=[step], result=result)


def _slowdown(result: StepTimeResult) -> float:
    """The last window timed over the first (their floors)."""
    last = result.confirm[-1] if result.confirm else result.late
    return last / result.early if result.early > 0 else math.inf


def _measured(result: StepTimeResult, host: bool = False) -> str:
    if host:
        return (
            "one call per sample: CPU time of the calling thread, at the machine's speed when "
            "the check started; the step runs CUDA kernels too, and its CUDA time held"
        )
    if result.clock.startswith("cuda"):
        return "one call per sample, CUDA events, synchronized"
    calls = result.calls_per_sample
    per = "one call" if calls == 1 else f"the mean of {calls} consecutive calls"
    if result.clock == "thread_time":
        return (
            f"each {per}: CPU time of the calling thread, one intra-op thread, at the "
            "machine's speed when the check started (a reference workload timed before each)"
        )
    what = "wall clock"
    if result.clock == "active":
        what = "wall clock less the time queued for a core"
    return f"each {per}: {what}; the step mostly waits, so its CPU time would not show it"
