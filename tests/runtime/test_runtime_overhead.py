"""What made the checks cheaper (issue 19) keeps their answers: traced once per step, the
weights compared with foreach ops, gradient norms taken with one reduction per tensor."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time

import pytest
import torch
from runtime_helpers import accumulating_trainer_module, batch, clean_setup, mlp
from torch import nn

from trainlint._runtime import lintlink
from trainlint._runtime.snapshot import Snapshot
from trainlint._runtime.steps import StepRunner
from trainlint.testing import (
    CheckFailed,
    assert_clip_effective,
    assert_grads_nonzero,
    assert_memory_stable,
    assert_weights_updated,
)


def _helper_the_step_runs(log: list[int]) -> None:
    log.append(1)


def test_a_step_is_traced_once_and_its_run_functions_kept_for_later_checks():
    log: list[int] = []

    def step() -> None:
        profilers.append(sys.getprofile())
        _helper_the_step_runs(log)

    profilers: list[object] = []
    for _ in range(3):
        lintlink.reset_ran()
        StepRunner(step, None)()
        spans = list(lintlink._ran)
        assert any(
            first <= _helper_the_step_runs.__code__.co_firstlineno <= last
            for _, first, last in spans
        ), spans
    assert profilers[0] is not None, "the first call is traced"
    assert profilers[1:] == [None, None], "later checks of the same step are not"
    # a new step function is traced again
    StepRunner(lambda: step(), None)()
    assert profilers[-1] is not None


def test_a_failing_later_check_of_the_same_step_still_lints_what_the_step_ran(
    tmp_path, monkeypatch
):
    """The step's first check traced it; a later failing check reuses that record, so the
    function reached through a module attribute still has its findings in the message."""
    trainer_module, tl302_line = accumulating_trainer_module(tmp_path, monkeypatch, "proj_overhead")

    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    history: list = []
    batches = [batch()]

    def step() -> None:
        trainer_module.train(model, opt, batches, history)

    assert_grads_nonzero(model, step)  # passes, and traces the step
    with pytest.raises(CheckFailed) as info:
        assert_memory_stable(step)
    message = str(info.value)
    assert f"trainer.py:{tl302_line}:" in message
    assert "TL302" in message.split("findings on the step's lines")[1]


def test_snapshot_measures_each_parameter_exactly():
    torch.manual_seed(0)
    a = nn.Parameter(torch.randn(4, 3))
    b = nn.Parameter(torch.randn(5, dtype=torch.float64))
    c = nn.Parameter(torch.randn(2, 2))  # untouched
    d = nn.Parameter(torch.randn(3))  # becomes NaN
    e = nn.Parameter(torch.randn(3))  # rebound with `.data =`
    snap = Snapshot([a, b, c, d, e])
    with torch.no_grad():
        a[1, 2] -= 0.25
        a[0, 0] += 0.125
        b[3] += 2.0
        d[1] = math.nan
    e.data = e.data + 0.5
    changes = snap.changes()
    assert changes[0] == pytest.approx(0.25)
    assert changes[1] == pytest.approx(2.0)
    assert changes[2] == 0.0
    assert math.isnan(changes[3])
    assert changes[4] == pytest.approx(0.5)


def test_snapshot_of_complex_and_integer_tensors_falls_back_to_one_by_one():
    z = torch.zeros(3, dtype=torch.complex64)
    n = torch.zeros(4, dtype=torch.int64)
    f = torch.zeros(2)
    snap = Snapshot([z, n, f])
    z[0] = 3 + 4j
    n[2] = -7
    assert snap.changes() == [5.0, 7.0, 0.0]


def test_weights_result_matches_a_reference_computed_by_hand():
    s = clean_setup(opt="adam", lr=0.01)
    before = {n: p.detach().clone() for n, p in s.model.named_parameters()}
    result = assert_weights_updated(s.model, s.step, optimizer=s.optimizer)
    for n, p in s.model.named_parameters():
        expected = float((p.detach() - before[n]).abs().max())
        assert result.change[n] == pytest.approx(expected, rel=1e-6, abs=0)
        assert result.got_grad[n]


def test_clip_norms_match_torchs_own_total_norm():
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = batch()
    totals: list[float] = []

    def step() -> None:
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        totals.append(
            float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]))
            if hasattr(torch.nn.utils, "get_total_norm")
            else float(
                torch.linalg.vector_norm(
                    torch.stack([torch.linalg.vector_norm(p.grad) for p in model.parameters()])
                )
            )
        )
        nn.utils.clip_grad_norm_(model.parameters(), 1e9)
        optimizer.step()

    result = assert_clip_effective(model, step, steps=2)
    clips = [r for r in result.reads if r.function == "clip_grad_norm_"]
    assert len(clips) == 2
    for read, total in zip(clips, totals, strict=True):
        assert read.seen == pytest.approx(total, rel=1e-5)
        assert read.backward == pytest.approx(total, rel=1e-5)


def test_clip_norm_of_half_precision_gradients_does_not_overflow():
    model = nn.Linear(4, 1).half()
    with torch.no_grad():
        model.weight.fill_(1.0)
    x = torch.full((8, 4), 200.0, dtype=torch.float16)

    def step() -> None:
        model.zero_grad()
        model(x).float().sum().backward()  # d/dw = 8 * 200 = 1600 per weight
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)

    result = assert_clip_effective(model, step)
    expected = math.sqrt(4 * 1600.0**2 + 8.0**2)  # weights, and the bias's 8
    assert result.reads[0].seen == pytest.approx(expected, rel=1e-3)
    assert result.reads[0].backward == pytest.approx(expected, rel=1e-3)


def test_the_guard_sees_children_without_reading_proc_when_there_are_none():
    from trainlint._runtime.guard import _child_pids, _has_children

    if not os.path.isdir(f"/proc/{os.getpid()}/task"):
        pytest.skip("needs /proc")
    if _child_pids():
        pytest.skip("this test process already has children")
    assert not _has_children()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert _has_children()
        assert child.pid in _child_pids()
    finally:
        child.kill()
        child.wait()
    assert not _has_children()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pids from /proc")
@pytest.mark.parametrize("with_older", [False, True])
def test_a_timeout_terminates_a_subprocess_the_step_started_but_not_an_older_one(with_older):
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    older = subprocess.Popen(sleeper) if with_older else None
    started: list[subprocess.Popen] = []
    s = clean_setup()

    def step() -> None:
        started.append(subprocess.Popen(sleeper))
        s.step()
        time.sleep(30)

    try:
        with pytest.raises(CheckFailed, match="did not finish within timeout"):
            assert_grads_nonzero(s.model, step, timeout=1.0)
        assert started[0].wait(timeout=10) is not None, "the step's child was terminated"
        assert older is None or older.poll() is None, "a child from before is left alone"
    finally:
        for p in [*([older] if older else []), *started]:
            p.kill()
            p.wait()


def test_large_snapshots_reuse_one_mapping_and_stay_exact():
    from trainlint._runtime import snapshot

    torch.manual_seed(0)
    big = nn.Parameter(torch.randn(512, 1024))  # 2 MiB: copied off the malloc heap
    small = nn.Parameter(torch.randn(7))
    for shift in (0.5, 0.25, 0.0):
        snap = Snapshot([big, small])
        with torch.no_grad():
            big[10, 20] += shift
            small[3] -= 2 * shift
        assert snap.changes() == [pytest.approx(shift), pytest.approx(2 * shift)]
        assert snapshot._spare is not None and len(snapshot._spare) >= big.numel() * 4


def test_an_optimizer_with_the_parameters_in_another_order_or_groups_is_fine():
    """The membership's short way (the trainable parameters, in order) and the long way
    (any other order, several groups) agree."""
    model = mlp()
    x, y = batch()
    params = list(model.parameters())
    for optimizer in (
        torch.optim.SGD(params, lr=0.1),
        torch.optim.SGD(params[::-1], lr=0.1),
        torch.optim.SGD([{"params": params[:2]}, {"params": params[2:], "lr": 0.05}], lr=0.1),
    ):

        def step(optimizer: torch.optim.Optimizer = optimizer) -> None:
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()

        result = assert_weights_updated(model, step, optimizer=optimizer)
        assert all(v > 0 for v in result.change.values())


def test_changes_too_large_to_sum_still_pass():
    """A sum of the changes that overflows to Inf takes the long way, which finds every
    change finite."""
    model = nn.Linear(2, 2)

    def step() -> None:
        with torch.no_grad():
            model.weight.add_(1e308)
            model.bias.add_(1e308)

    model.double()
    with torch.no_grad():
        model.weight.fill_(-1e308)
        model.bias.fill_(-1e308)
    result = assert_weights_updated(model, step)
    assert math.isinf(sum(result.change.values()))
    assert all(math.isfinite(v) for v in result.change.values())


def test_an_optimizer_holding_a_frozen_parameter_still_says_so():
    model = mlp()
    x, y = batch()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    first = next(iter(model.parameters()))

    def step() -> None:
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()

    with pytest.raises(CheckFailed, match="Frozen parameters that still require grad"):
        assert_weights_updated(model, step, optimizer=optimizer, frozen=[first])
