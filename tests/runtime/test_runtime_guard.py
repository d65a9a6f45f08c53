"""Every check: exceptions in threads and processes the step started are not swallowed,
and a step that hangs fails after ``timeout=`` with every thread's stack."""

from __future__ import annotations

import multiprocessing
import sys
import threading
import time

import pytest
from runtime_helpers import clean_setup, mlp
from test_runtime_threads import BATCHES, grad_step
from torch import nn

import trainlint.testing
from trainlint._runtime import recorder
from trainlint.testing import CheckFailed, assert_finite_grads, assert_grads_nonzero

# The guard still passes thread exceptions on to the previous hook (pytest's, here).
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")

CHECKS = [name for name in trainlint.testing.__all__ if name.startswith("assert_")]


def threaded_setup(crash: bool):
    """A step that spreads the batch over two worker threads, each doing backward."""
    s = clean_setup()
    halves = [(s.x[:16], s.y[:16]), (s.x[16:], s.y[16:])]

    def worker(x, y):
        if crash:
            raise ValueError("worker lost its batch")
        nn.functional.mse_loss(s.model(x), y).backward()

    def step():
        s.optimizer.zero_grad()
        workers = [
            threading.Thread(target=worker, args=h, name=f"grad-worker-{i}")
            for i, h in enumerate(halves)
        ]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        s.optimizer.step()

    return s, step


def test_a_thread_that_raised_fails_the_check_naming_it():
    s, step = threaded_setup(crash=True)
    before = threading.excepthook
    # without the guard the missing gradients would pass as "finite"
    with pytest.raises(CheckFailed) as info:
        assert_finite_grads(s.model, step)
    message = str(info.value)
    assert "2 threads raised" in message
    assert "thread 'grad-worker-0' raised ValueError: worker lost its batch" in message
    assert "thread 'grad-worker-1' raised ValueError: worker lost its batch" in message
    assert "test_runtime_guard.py" in message  # where it raised
    assert threading.excepthook is before


def test_threaded_steps_that_work_pass_repeatedly():
    # Two threads in backward at once: their hooks must not share the recorder's slots.
    # The kept slots are filled with NaN first, so a slot one hook skipped while another
    # wrote twice reads as a NaN gradient (before the fix, about one setup in sixteen).
    for _ in range(100):
        s, step = threaded_setup(crash=False)
        kept = recorder.take_slots(len(list(s.model.parameters())))
        kept[0].fill_(float("nan"))
        recorder.give_back_slots(kept)
        assert_finite_grads(s.model, step, steps=2)
        assert_grads_nonzero(s.model, step)


def test_a_failing_check_carries_the_thread_errors_as_a_note():
    s, step = threaded_setup(crash=True)
    with pytest.raises(CheckFailed) as info:
        assert_grads_nonzero(s.model, step)  # no gradient reached the model: fails anyway
    assert "no gradient" in str(info.value)
    if sys.version_info >= (3, 11):
        assert any("grad-worker-0" in n for n in info.value.__notes__)


def test_threads_that_existed_before_the_check_are_not_blamed():
    s = clean_setup()
    go = threading.Event()

    def unrelated():
        go.wait()
        raise RuntimeError("not the step's")

    thread = threading.Thread(target=unrelated)
    thread.start()

    def step():
        go.set()
        thread.join()
        s.step()

    assert_grads_nonzero(s.model, step)


def _exit_with(code):
    sys.exit(code)


def test_a_process_that_exited_non_zero_fails_the_check():
    s = clean_setup()
    ctx = multiprocessing.get_context("fork")

    def step():
        p = ctx.Process(target=_exit_with, args=(3,), name="loader-0")
        p.start()
        p.join()
        s.step()

    with pytest.raises(CheckFailed) as info:
        assert_grads_nonzero(s.model, step)
    assert "process 'loader-0'" in str(info.value)
    assert "exited with code 3" in str(info.value)


def _sleep_forever():
    time.sleep(600)


def test_a_process_the_step_terminates_itself_is_not_an_error():
    s = clean_setup()
    ctx = multiprocessing.get_context("fork")

    def step():
        p = ctx.Process(target=_sleep_forever)
        p.start()
        p.terminate()
        p.join()
        s.step()

    assert_grads_nonzero(s.model, step)


def test_a_step_with_deadlocked_workers_times_out_and_they_are_terminated():
    s = clean_setup()
    ctx = multiprocessing.get_context("fork")
    started = []

    def step():
        p = ctx.Process(target=_sleep_forever, name="deadlocked-worker")
        p.start()
        started.append(p)
        p.join()  # never returns on its own
        s.step()

    t0 = time.monotonic()
    with pytest.raises(CheckFailed) as info:
        assert_grads_nonzero(s.model, step, timeout=1)
    assert time.monotonic() - t0 < 10
    message = str(info.value)
    assert "the step did not finish within timeout=1 s" in message
    assert "Thread 'MainThread'" in message and "in step" in message and "p.join()" in message
    assert "deadlocked-worker" in message
    assert not started[0].is_alive()


def test_a_timeout_off_the_main_thread_stops_the_check_too():
    s = clean_setup()
    outcome = []

    def step():
        while True:  # a Python-level hang
            time.sleep(0.001)

    def run():
        try:
            assert_grads_nonzero(s.model, step, timeout=0.5)
        except CheckFailed as failed:
            outcome.append(str(failed))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    assert outcome and "did not finish within timeout=0.5 s" in outcome[0]


def test_the_alarm_and_hook_are_restored():
    import signal

    s = clean_setup()
    handler = signal.getsignal(signal.SIGALRM)
    hook = threading.excepthook
    assert_grads_nonzero(s.model, s.step, timeout=5)
    assert signal.getsignal(signal.SIGALRM) is handler
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert threading.excepthook is hook


@pytest.mark.parametrize("check", CHECKS)
def test_every_check_takes_a_timeout(check):
    import inspect

    parameter = inspect.signature(getattr(trainlint.testing, check)).parameters["timeout"]
    assert parameter.kind is inspect.Parameter.KEYWORD_ONLY
    assert parameter.default == 120


def test_thread_safe_is_guarded_too():
    model = mlp()
    step = grad_step(model)
    with pytest.raises(ValueError, match="timeout must be a positive"):
        trainlint.testing.assert_thread_safe(model, step, BATCHES, timeout=0)


def test_an_alarm_someone_else_runs_is_left_running_and_the_timeout_still_fires():
    import signal

    s = clean_setup()
    fired = []

    def theirs(signum, frame):
        fired.append(signum)

    previous = signal.signal(signal.SIGALRM, theirs)
    signal.setitimer(signal.ITIMER_REAL, 30.0)  # pytest-timeout's way
    try:
        assert_grads_nonzero(s.model, s.step)
        assert signal.getsignal(signal.SIGALRM) is theirs
        assert 25.0 < signal.getitimer(signal.ITIMER_REAL)[0] <= 30.0

        def step():
            while True:  # a Python-level hang
                time.sleep(0.001)

        with pytest.raises(CheckFailed, match="did not finish within timeout=0.5 s"):
            assert_grads_nonzero(s.model, step, timeout=0.5)
        assert signal.getsignal(signal.SIGALRM) is theirs
        assert 25.0 < signal.getitimer(signal.ITIMER_REAL)[0] <= 30.0
        assert not fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_processes_started_outside_a_check_are_no_later_check_s():
    from multiprocessing.process import BaseProcess

    s = clean_setup()
    ctx = multiprocessing.get_context("fork")
    start = BaseProcess.start
    assert_grads_nonzero(s.model, s.step)
    assert BaseProcess.start is start  # a check leaves multiprocessing as it found it
    p = ctx.Process(target=_exit_with, args=(3,), name="not-the-step-s")
    p.start()
    p.join()
    assert p.exitcode == 3
    assert_grads_nonzero(s.model, s.step)  # passes: that process is nobody's

    def step():
        q = ctx.Process(target=_exit_with, args=(4,), name="the-step-s")
        q.start()
        q.join()
        s.step()

    with pytest.raises(CheckFailed, match="process 'the-step-s'") as info:
        assert_grads_nonzero(s.model, step)
    assert "not-the-step-s" not in str(info.value)


def test_terminate_and_kill_are_patched_only_once_a_process_starts_and_restored_after():
    from multiprocessing import process
    from multiprocessing.process import BaseProcess

    s = clean_setup()
    ctx = multiprocessing.get_context("fork")
    originals = {n: getattr(BaseProcess, n) for n in ("start", "terminate", "kill")}
    children = process._children
    seen: list[dict[str, bool]] = []

    def note() -> None:
        seen.append({n: getattr(BaseProcess, n) is originals[n] for n in originals})
        seen[-1]["children"] = process._children is children

    def quiet_step() -> None:
        note()
        s.step()

    assert_grads_nonzero(s.model, quiet_step)
    # a check that starts no process swaps multiprocessing's set of children, nothing else
    assert seen[-1] == {"start": True, "terminate": True, "kill": True, "children": False}

    def step() -> None:
        p = ctx.Process(target=_sleep_forever)
        p.start()
        note()
        p.kill()
        p.join()
        s.step()

    assert_grads_nonzero(s.model, step)  # the step's own kill is not an error
    assert seen[-1] == {"start": True, "terminate": False, "kill": False, "children": False}
    assert {n: getattr(BaseProcess, n) for n in originals} == originals
    assert process._children is children


def test_processes_alive_across_checks_stay_in_multiprocessing_s_children():
    from multiprocessing import process

    s = clean_setup()
    ctx = multiprocessing.get_context("fork")
    kept: list[object] = []

    def step() -> None:
        p = ctx.Process(target=_sleep_forever, name="kept-worker")
        p.start()
        kept.append(p)
        s.step()

    children = process._children
    try:
        assert_grads_nonzero(s.model, step, timeout=30)
        assert process._children is children and kept[0] in children
        assert kept[0] in multiprocessing.active_children()
    finally:
        kept[0].kill()  # type: ignore[attr-defined]
        kept[0].join()  # type: ignore[attr-defined]
    assert kept[0] not in multiprocessing.active_children()
