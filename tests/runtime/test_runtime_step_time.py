"""assert_step_time_stable on real training steps, with real growing work and real neighbours.

On CPU the check times the calling thread's CPU time over batches of calls (one intra-op
thread), so these tests use real compute for work that grows, and real CPU-bound
processes, or sleeps, for a machine that gets busier: neither may move the result.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch
from runtime_helpers import clean_setup
from torch import nn

from trainlint._runtime.clock import SAMPLE_SECONDS
from trainlint.testing import CheckFailed, StepTimeResult, assert_step_time_stable, step_time


def _burn() -> None:
    while True:
        pass


def start_neighbours(n: int = 2) -> list[multiprocessing.Process]:
    """``n`` CPU-bound processes, as on a shared CI runner."""
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_burn, daemon=True) for _ in range(n)]
    for p in procs:
        p.start()
    return procs


def stop_neighbours(procs: list[multiprocessing.Process]) -> None:
    for p in procs:
        p.kill()
        p.join()


@contextmanager
def busy_neighbours(n: int = 2) -> Iterator[None]:
    procs = start_neighbours(n)
    try:
        yield
    finally:
        stop_neighbours(procs)


def growing_matmul() -> Callable[[], None]:
    """A training step that also re-processes every batch seen so far (256 rows more each call).

    Without a bound: however many calls a sample batches, the work keeps growing.
    """
    s = clean_setup()
    torch.manual_seed(0)
    rows, w = torch.randn(256, 64), torch.randn(64, 64)
    calls = []

    def step() -> None:
        calls.append(1)
        for _ in calls:  # re-processes everything seen so far
            rows @ w
        s.step()

    return step


def growing_graph(backwards: Callable[[], int] = lambda: 1) -> Callable[[], None]:
    """A recurrent state never detached: each backward walks every earlier step (TL302).

    Each call runs ``backwards()`` backward passes (one, unless a test doubles some).
    """
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64))
    x = torch.randn(256, 64)
    y = torch.randn(256, 64)
    state = {"hidden": torch.zeros(256, 64)}

    def step() -> None:
        state["hidden"] = state["hidden"] * 0.5 + model(x)
        loss = nn.functional.mse_loss(state["hidden"], y)
        for _ in range(backwards()):
            loss.backward(retain_graph=True)

    return step


def cuda_in_use() -> None:
    """Leave CUDA initialised, as an earlier test on a GPU runner does: the CPU tests that
    call this must hold there too (they failed there while the clock followed the process,
    not the step). Nothing happens without CUDA."""
    if torch.cuda.is_available():
        torch.ones(2, device="cuda").sum().item()


def caught(step: Callable[[], None]) -> CheckFailed:
    """The check's failure on ``step``; if it passes, a test failure with what it measured."""
    try:
        result = assert_step_time_stable(step)
    except CheckFailed as failure:
        return failure
    pytest.fail(
        f"not reported as slower: {result.calls_per_sample} calls a sample, floors (ms) "
        f"{result.early * 1e3:.3g} -> {result.late * 1e3:.3g} ({result.ratio:.2f}x), "
        f"confirming {[round(c * 1e3, 3) for c in result.confirm]}"
    )


def sample_index(monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """The index of the sample the check is timing (counting from the first timed one)."""
    taken = [0]
    timed = step_time.StepClock.timed

    def counting(self: step_time.StepClock) -> float:
        try:
            return timed(self)
        finally:
            taken[0] += 1

    monkeypatch.setattr(step_time.StepClock, "timed", counting)
    return lambda: taken[0]


@pytest.mark.parametrize("seed", range(10))
def test_step_time_stable_passes_on_a_clean_step(seed):
    cuda_in_use()
    s = clean_setup(seed)
    result = assert_step_time_stable(s.step)
    assert isinstance(result, StepTimeResult)
    assert len(result.times) >= 10
    assert result.syncs is None  # CPU: no sync counting
    assert result.clock == "thread_time"
    # a sub-millisecond step is timed in batches of calls of SAMPLE_SECONDS or more
    assert result.calls_per_sample > 1
    assert result.times[0] * result.calls_per_sample >= 0.5 * SAMPLE_SECONDS


def test_step_time_stable_step_whose_work_grows():
    cuda_in_use()
    failure = caught(growing_matmul())
    message = str(failure)
    assert "later steps are" in message and "x slower than early ones" in message
    assert "Step times (ms, after 1 warmup)" in message
    assert "CPU time of the calling thread, one intra-op thread" in message
    assert "Fastest third of each window of 5-5 samples (ms)" in message
    assert "TL302 graph-accumulation" in message
    result = failure.result
    assert result.clock == "thread_time"
    # four confirming windows (eight if four left it undecided), along a trend that grows
    # by a quarter a window or more
    assert result.ratio > 1.125 and len(result.confirm) in (4, 8) and result.growth > 0.25
    assert result.early < result.late < result.confirm[-1]
    assert f"{result.growth:.0%} of the first window more each window along their" in message


def test_step_time_stable_graph_that_grows_each_step():
    cuda_in_use()
    assert "slower" in str(caught(growing_graph()))


def test_step_time_stable_growing_work_is_caught_beside_busy_neighbours():
    cuda_in_use()
    with busy_neighbours():
        assert "slower" in str(caught(growing_matmul()))


def test_step_time_stable_growth_is_caught_when_one_window_was_slowed(monkeypatch):
    # A busy machine can slow one window of a growing step (a shared host's stolen time
    # is charged to the thread on some virtual machines). Planted: the second window of
    # the ten samples runs every backward twice. The first confirming window then is
    # often no slower than it; the growth must still be found in the windows after.
    # Noise can slow two more of the six windows, and then no trend is left to find: the
    # growth must be found in three of five tries. Measured on a 2-core VM: found in 86
    # of 90 tries (judged against the highest window so far, before the trend, in 18 of
    # 30); missing three of five then happens about once in a thousand runs.
    index, found = sample_index(monkeypatch), []
    for _ in range(5):
        start = index()
        try:
            assert_step_time_stable(
                growing_graph(lambda start=start: 2 if 5 <= index() - start < 10 else 1)
            )
        except CheckFailed as failure:
            assert len(failure.result.confirm) in (4, 8, 12, 16)
            found.append(failure.result.growth)
        if len(found) == 3:
            return
    pytest.fail(f"growth found in {len(found)} of 5 tries")


def test_step_time_stable_a_slowdown_that_holds_is_not_a_slow_step(monkeypatch):
    # The step's work triples from the sixth sample on and then stays: slower, but not
    # slower with every step (a CPU that clocked down, a cache now shared): not reported.
    # The jump lies between the first two windows, so five of the trend's fifteen slopes
    # are steep, and a machine that gets busier over the later windows could tip the
    # median (on a loaded 2-core VM once in about twenty runs: 0.44 -> 1.66 -> 1.62 ->
    # 1.47 -> 1.71 -> 2.15 ms); such a trend is now undecided and timed further (see
    # test_step_time_stable_undecided_windows_are_decided_by_more). Two of three tries:
    # on a loaded VM a window's floor can move by half, whatever the check decides.
    index = sample_index(monkeypatch)
    failures = []
    for _ in range(3):
        s = clean_setup()
        first = index()

        def step(s=s, first=first):
            for _ in range(3 if index() - first >= 5 else 1):
                s.step()

        try:
            result = assert_step_time_stable(step)
        except CheckFailed as exc:
            failures.append(str(exc).splitlines()[0])
            continue
        assert result.ratio > 2 and result.confirm  # slower, looked at again, not reported
    assert len(failures) <= 1, failures


def test_step_time_stable_a_machine_that_gets_busier_is_not_a_slow_step():
    cuda_in_use()
    # The step's own work is constant; from the 6th call on two CPU-bound processes
    # compete for the cores (neighbours on a shared CI runner). Its wall-clock time
    # grows; the CPU time of its thread does not.
    s = clean_setup()
    calls = []
    neighbours: list[multiprocessing.Process] = []

    def step():
        calls.append(1)
        if len(calls) == 6:
            neighbours.extend(start_neighbours())
        s.step()

    try:
        result = assert_step_time_stable(step)
    finally:
        stop_neighbours(neighbours)
    # the verdict, not the ratio: the CPU time of the same work still moves on a busy
    # machine, which the confirming windows tell from growth
    assert neighbours and result.clock == "thread_time"


def test_step_time_stable_time_spent_sleeping_is_not_a_slow_step():
    cuda_in_use()
    # A step that computes, and also waits a little longer every call (I/O, a lock, a
    # sleeping neighbour's turn), does no more work: sleeping is not running, so on the
    # CPU clock it is not slower. The wait grows by 2.5 us a call without end: under a clock
    # that counted it, the second window would be ~1.9x the first and every confirming
    # window slower again, and the check would fail. (The verdict is asserted, not the
    # ratio: on a noisy machine the CPU time of the same work moves by a third between
    # windows, which the confirming windows are there to tell from growth.) 2.5 us, half
    # what it was with 5 ms samples: a check now makes twice the calls, and a sleep of
    # 1-2.5 ms a call let the core idle long enough that the step's own CPU time after
    # it grew by 2x (cold caches, a lower clock): failed 2 of 7 runs, then 0 of 16.
    s = clean_setup()
    calls = []

    def step():
        calls.append(1)
        s.step()
        time.sleep(2.5e-6 * len(calls))

    result = assert_step_time_stable(step)
    assert result.clock == "thread_time"


def sleeper(grow: float) -> Callable[[], None]:
    """A step that mostly waits: a tiny computation, then 2 ms (+ ``grow`` per call) asleep."""
    x = torch.randn(16, 16)
    calls = []

    def step() -> None:
        calls.append(1)
        x @ x
        time.sleep(0.002 + grow * len(calls))

    return step


def test_step_time_stable_a_step_that_mostly_waits_is_timed_by_its_active_time():
    cuda_in_use()
    # CPU time would see only the few microseconds of Python around the sleep; the check
    # notices and times the step by the wall clock less the time queued for a core, so a
    # constant wait passes beside busy neighbours ...
    with busy_neighbours():
        result = assert_step_time_stable(sleeper(0.0))
    assert result.clock == "active"
    assert min(result.times) > 0.0018 and result.ratio < 1.5


def test_step_time_stable_a_wait_that_grows_is_caught():
    cuda_in_use()
    # ... and a wait that grows with every call is a slower step.
    with pytest.raises(CheckFailed, match="slower") as info:
        assert_step_time_stable(sleeper(0.0005))
    assert "the step mostly waits, so its CPU time would not show it" in str(info.value)
    assert info.value.result.clock == "active"


def test_step_time_stable_restores_the_thread_count():
    s = clean_setup()
    torch.set_num_threads(2)
    assert_step_time_stable(s.step)
    assert torch.get_num_threads() == 2


def test_step_time_stable_rejects_bad_arguments():
    s = clean_setup()
    with pytest.raises(ValueError, match="max_slowdown"):
        assert_step_time_stable(s.step, max_slowdown=1.0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_step_time_stable_counts_host_syncs_on_cuda():
    s = clean_setup(device="cuda")

    def step():
        loss = s.step()
        print(loss.item())  # TL401: a host sync every step

    result = assert_step_time_stable(step)
    assert result.clock == "cuda" and result.calls_per_sample == 1
    assert result.syncs is not None and min(result.syncs) >= 1
    assert any("test_runtime_step_time.py" in site for site in result.sync_sites)
    with pytest.raises(CheckFailed, match="TL401"):
        assert_step_time_stable(step, max_syncs=0)


@pytest.mark.slow
def test_step_time_stable_under_load_200_clean_runs_and_growing_work_caught():
    # The evidence for issue 14: beside two CPU-bound processes (on a two-core CI machine,
    # every core contended), a clean step passes 200 runs in a row, and steps whose work
    # grows are caught every time. Counts are collected before asserting, so a failure
    # reports the rates, not just the first miss.
    flagged, missed = [], []
    with busy_neighbours():
        for run in range(200):
            s = clean_setup(run % 10, opt="adam" if run % 2 else "sgd")
            try:
                assert_step_time_stable(s.step)
            except CheckFailed as failure:
                flagged.append((run, failure.result.times))
        for run in range(10):
            for make in (growing_matmul, growing_graph):
                try:
                    passed = assert_step_time_stable(make())
                except CheckFailed:
                    continue
                # the floors it judged, for the trend table when this misses on a runner
                floors = [round(f * 1e3, 3) for f in (passed.early, passed.late, *passed.confirm)]
                missed.append((run, make.__name__, floors))
    assert not flagged, f"{len(flagged)} of 200 clean runs flagged: {flagged[:3]}"
    assert not missed, f"{len(missed)} of 20 growing runs missed: {missed}"


@pytest.mark.parametrize(
    ("windows", "verdict"),
    [
        # A CI runner beside two CPU-bound processes: a constant step's floors (ms) stepped
        # up twice; judged against the highest window so far, this was reported as growth.
        ([0.652, 1.0, 1.124, 1.102, 1.247, 1.24], False),
        # A growing step whose second window was slowed twice over (its backwards doubled):
        # the windows after it were no higher than it and the growth was missed.
        ([3.61, 17.1, 12.042, 18.246, 24.275, 27.487], True),
        ([1.0, 3.0, 3.0, 3.1, 2.9, 3.0], False),  # slower once, then holds
        ([1.0, 1.6, 2.2, 2.8, 3.4, 4.0], True),  # linear growth
        ([1.0, 1.6, 2.9, 2.8, 3.4, 5.0], True),  # linear growth, noisy
        # CI: a step slowed three times over once, then a machine getting busier over the
        # last windows; the trend of all six grew 28% a window, of all but the first 6%
        ([0.44, 1.66, 1.62, 1.47, 1.71, 2.15], None),
        # CI: growing work (a matmul more each call) whose floors a machine growing quieter
        # held flat for four windows: 20% a window, below the 25% allowed
        ([2.173, 2.532, 5.28, 4.701, 4.673, 4.647], None),
        ([1.0, 3.0, 3.0, 3.0, 3.0, 4.0, 3.0, 3.0, 3.0, 3.0], False),  # more windows: it holds
        ([4.0, 5.0, 9.0, 9.0, 9.0, 9.0, 11.0, 13.0, 15.0, 17.0], True),  # more: it grows
    ],
)
def test_step_time_stable_trend_of_windows(windows, verdict):
    # the confirming decision on floors recorded on a loaded machine, and on plain shapes
    assert step_time._verdict(windows, step_time.CONFIRM_GROWTH * 0.5) is verdict


def confirmed(floors: list[float]) -> tuple[bool, list[float]]:
    """``_confirm`` after the first two windows of ``floors``, timing the rest in order."""
    timed = iter(floors[2:])
    return step_time._confirm(floors[:2], lambda: next(timed), step_time.CONFIRM_GROWTH * 0.5)


def test_step_time_stable_an_undecided_trend_is_timed_until_it_decides():
    # A step growing at about the allowed rate (1.1x), its floors scattered by up to a
    # fifth around the trend: still undecided after ten windows, where the check used to
    # stop and pass it; four more decide.
    floors = [1.06, 1.51, 1.66, 1.75, 2.06, 2.05, 3.14, 3.5, 2.84, 2.83, 3.38, 3.79, 4.99, 5.32]
    assert step_time._verdict(floors[:10], step_time.CONFIRM_GROWTH * 0.5) is None
    assert confirmed(floors) == (True, floors[2:])
    # a slowdown that happened once and then held is decided by the first four
    assert confirmed([1.0, 3.0] + [3.0] * 16) == (False, [3.0] * 4)
    # a trend that never decides (0.2 of the start a window: between half the allowed 0.25
    # and all of it) is timed over sixteen windows, then passes
    line = [1 + 0.2 * i for i in range(30)]
    assert confirmed(line) == (False, line[2:18])


@pytest.mark.parametrize(
    ("floors", "reported"),
    [
        ([3, 4, 7, 7, 7, 7, 10, 13, 16, 19], True),  # growth a busy machine hid a while
        ([1, 3, 3, 3, 3, 5, 3, 3, 3, 3], False),  # slowed once, then a busier last window
    ],
)
def test_step_time_stable_undecided_windows_are_decided_by_more(monkeypatch, floors, reported):
    # Six windows cannot tell these apart (see the trend table above); the ten timed
    # after four more can. Sample times are set per window of five, so that the decision,
    # not this machine's noise, is what is tested (real growing steps: the tests above).
    def timed(clock: step_time.StepClock) -> float:
        clock.run()
        elapsed = floors[len(clock.times) // 5] * 1e-3
        clock.times.append(elapsed)
        return elapsed

    monkeypatch.setattr(step_time.StepClock, "timed", timed)
    try:
        result = assert_step_time_stable(clean_setup().step)
    except CheckFailed as failure:
        result = failure.result
        assert reported, str(failure)
    else:
        assert not reported, result
    assert len(result.confirm) == 8  # four windows, then four more
