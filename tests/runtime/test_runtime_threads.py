"""assert_thread_safe: gradients from several threads equal the sequential ones."""

from __future__ import annotations

import time

import pytest
import torch
from runtime_helpers import batch, mlp
from torch import nn

from trainlint.testing import CheckFailed, ThreadSafetyResult, assert_thread_safe

BATCHES = [batch(i, n=16) for i in range(8)]


def grad_step(model):
    def step(b):
        x, y = b
        nn.functional.mse_loss(model(x), y).backward()

    return step


@pytest.mark.parametrize("seed", range(10))
def test_thread_safe_passes_for_a_stateless_model(seed):
    model = mlp(seed)
    result = assert_thread_safe(model, grad_step(model), BATCHES)
    assert isinstance(result, ThreadSafetyResult)
    assert result.threads == 4 and result.batches == 8
    assert set(result.max_abs_diff) == {"0.weight", "0.bias", "2.weight", "2.bias"}


class KeepsStateOnSelf(nn.Module):
    """Stores its hidden activation on self during forward, like many research models."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = nn.Linear(8, 16)
        self.head = nn.Linear(16, 1)
        self.hidden = None

    def forward(self, x):
        self.hidden = torch.relu(self.encoder(x))
        time.sleep(0.002)  # other work; another thread's forward runs meanwhile
        return self.head(self.hidden)


def test_thread_safe_catches_per_call_state_on_self():
    model = KeepsStateOnSelf()
    with pytest.raises(CheckFailed) as info:
        assert_thread_safe(model, grad_step(model), BATCHES, threads=4)
    message = str(info.value)
    assert "gradients computed on 4 threads differ from the sequential ones" in message
    assert "head.weight" in message and "(1, 16)" in message
    assert "differs" in message
    assert "TL503 unlocked-shared-model" in message
    assert "TL304 tensor-kept-on-self" in message


def test_thread_safe_passes_with_a_lock():
    import threading

    model = KeepsStateOnSelf()
    lock = threading.Lock()
    step = grad_step(model)

    def locked(b):
        with lock:
            step(b)

    assert_thread_safe(model, locked, BATCHES)


def test_thread_safe_reports_exceptions_from_threads():
    model = mlp()
    calls = []

    def step(b):
        calls.append(1)
        if len(calls) > len(BATCHES):  # only in the threaded run
            raise RuntimeError("shape mismatch in a racing buffer")
        grad_step(model)(b)

    with pytest.raises(CheckFailed) as info:
        assert_thread_safe(model, step, BATCHES, threads=2)
    assert "raised RuntimeError: shape mismatch in a racing buffer" in str(info.value)


def test_thread_safe_restores_the_model():
    model = mlp()
    before = [p.detach().clone() for p in model.parameters()]
    marker = torch.ones(16, 8)
    model[0].weight.grad = marker
    assert_thread_safe(model, grad_step(model), BATCHES)
    assert model[0].weight.grad is marker
    assert model[2].weight.grad is None
    for p, b in zip(model.parameters(), before, strict=True):
        assert torch.equal(p, b)


def test_thread_safe_rejects_a_step_that_updates_weights():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(b):
        grad_step(model)(b)
        opt.step()

    with pytest.raises(ValueError, match="without an optimizer step"):
        assert_thread_safe(model, step, BATCHES)


def test_thread_safe_needs_two_batches():
    model = mlp()
    with pytest.raises(ValueError, match="two batches"):
        assert_thread_safe(model, grad_step(model), BATCHES[:1])


class RacesOnSelf(nn.Module):
    """The unlocked shared model of the CLLM report (seeds/002): forward writes shared state.

    No sleep to widen the window: the race is as narrow as in real code.
    """

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = nn.Linear(8, 16)
        self.head = nn.Linear(16, 1)
        self.hidden = None

    def forward(self, x):
        self.hidden = torch.relu(self.encoder(x))
        return self.head(self.hidden)


def test_thread_safe_catches_a_narrow_race_and_stops_at_the_first_divergence():
    model = RacesOnSelf()
    start = time.perf_counter()
    with pytest.raises(CheckFailed) as info:
        assert_thread_safe(model, grad_step(model), BATCHES)
    assert time.perf_counter() - start < 5
    assert info.value.result.rounds < 200  # stopped when it diverged
    assert "TL503 unlocked-shared-model" in str(info.value)


def test_thread_safe_clean_runs_all_rounds_in_time():
    model = mlp()
    start = time.perf_counter()
    result = assert_thread_safe(model, grad_step(model), BATCHES, max_seconds=3.0)
    assert time.perf_counter() - start < 5
    assert result.rounds >= 1


@pytest.mark.slow
def test_thread_safe_detects_the_narrow_race_in_95_percent_of_runs():
    runs, caught, slowest = 200, 0, 0.0
    for _ in range(runs):
        model = RacesOnSelf()
        start = time.perf_counter()
        try:
            assert_thread_safe(model, grad_step(model), BATCHES)
        except CheckFailed:
            caught += 1
        slowest = max(slowest, time.perf_counter() - start)
    assert caught >= 0.95 * runs, f"caught {caught} of {runs}"
    assert slowest < 5


@pytest.mark.slow
def test_thread_safe_never_fails_a_clean_step():
    batches = BATCHES[:4]
    for seed in range(200):
        model = mlp(seed)
        assert_thread_safe(model, grad_step(model), batches)
