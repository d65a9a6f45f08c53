"""assert_memory_stable on real training steps."""

from __future__ import annotations

import gc

import pytest
import torch
from runtime_helpers import batch, clean_setup, mlp
from torch import nn

from trainlint.testing import (
    CheckFailed,
    MemoryResult,
    assert_memory_stable,
)

# ----------------------------------------------------------------- assert_memory_stable


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_memory_stable_passes_on_a_clean_step(seed, opt):
    s = clean_setup(seed, opt=opt)
    result = assert_memory_stable(s.step)
    assert isinstance(result, MemoryResult)
    assert result.saved_bytes == (0,) * 9
    assert result.graph_nodes == (0,) * 9
    assert result.cuda_bytes is None  # CPU: not measured, never reported as stable
    assert result.measured == ("saved_bytes", "graph_nodes")


@pytest.mark.parametrize("seed", range(5))
def test_memory_stable_passes_when_only_the_last_graph_is_kept(seed):
    # Keeping the latest output (and its graph) is constant memory, not a leak.
    s = clean_setup(seed)

    class Trainer:
        last = None

        def step(self):
            s.optimizer.zero_grad()
            out = s.model(s.x)
            loss = nn.functional.mse_loss(out, s.y)
            loss.backward(retain_graph=True)
            s.optimizer.step()
            self.last = out

    trainer = Trainer()
    result = assert_memory_stable(trainer.step)
    assert len(set(result.saved_bytes)) == 1 and result.saved_bytes[0] > 0


@pytest.mark.parametrize("seed", range(5))
def test_memory_stable_passes_when_the_step_makes_cyclic_garbage(seed):
    s = clean_setup(seed)

    def step():
        loss = s.step()
        holder = {"loss": loss}
        holder["self"] = holder  # a reference cycle only the garbage collector frees

    assert_memory_stable(step)


def test_memory_stable_total_loss_accumulated_after_backward():
    s = clean_setup()
    state = {"total": 0.0}

    def step():
        s.optimizer.zero_grad()
        loss = nn.functional.mse_loss(s.model(s.x), s.y)
        loss.backward()
        s.optimizer.step()
        state["total"] += loss  # TL302: should be loss.item()

    with pytest.raises(CheckFailed) as info:
        assert_memory_stable(step)
    message = str(info.value)
    assert "grows ((b) autograd graph nodes kept alive)" in message
    # backward() freed the saved buffers: only measure (b) sees this leak
    assert "(a) bytes saved by live autograd graphs  0 B" in message
    assert "0 B          0 of 8" in message
    assert "8 of 8  <- grows" in message
    assert "`total += loss`" in message
    assert "TL302 graph-accumulation" in message
    assert info.value.rules[0] == "TL302"
    result = info.value.result
    assert set(result.saved_bytes) == {0}
    assert result.growth["graph_nodes"] > 0


def test_memory_stable_losses_appended_after_backward():
    s = clean_setup(opt="adam")
    losses = []

    def step():
        losses.append(s.step())  # TL302

    with pytest.raises(CheckFailed) as info:
        assert_memory_stable(step, steps=6, warmup=1)
    assert "(b) autograd graph nodes kept alive" in str(info.value)
    assert set(info.value.result.saved_bytes) == {0}


def test_memory_stable_outputs_kept_on_an_object_with_retain_graph():
    s = clean_setup()

    class Trainer:
        def __init__(self):
            self.outputs = []

        def step(self):
            s.optimizer.zero_grad()
            out = s.model(s.x)
            loss = nn.functional.mse_loss(out, s.y)
            loss.backward(retain_graph=True)  # TL301
            s.optimizer.step()
            self.outputs.append(out)  # TL304

    trainer = Trainer()
    with pytest.raises(CheckFailed) as info:
        assert_memory_stable(trainer.step)
    message = str(info.value)
    assert "(a) bytes saved by live autograd graphs" in message.splitlines()[0]
    assert "retain_graph=True" in message
    for code in ("TL302 graph-accumulation", "TL301 retain-graph-in-loop", "TL304"):
        assert code in message
    result = info.value.result
    assert result.saved_bytes[-1] > result.saved_bytes[0]
    # the per-step table shows the growth step by step
    assert "after step  (a) saved  (b) nodes  (c) cuda" in message


def test_memory_stable_outputs_kept_without_backward():
    model = mlp()
    x, _ = batch()
    kept = []

    def evaluate():
        kept.append(model(x))  # TL303: evaluation outside no_grad, outputs kept

    with pytest.raises(CheckFailed, match="TL303"):
        assert_memory_stable(evaluate)


def test_memory_stable_rate_limited_leak_is_still_a_leak():
    s = clean_setup()
    history = []
    calls = []

    def step():
        loss = s.step()
        calls.append(1)
        if len(calls) % 3 == 0:
            history.append(loss)

    with pytest.raises(CheckFailed):
        assert_memory_stable(step, steps=9)


def test_memory_stable_a_one_off_allocation_is_not_a_leak():
    s = clean_setup()
    calls = []
    kept = []

    def step():
        loss = s.step()
        calls.append(1)
        if len(calls) == 5:
            kept.append(loss)  # once: not growth

    assert_memory_stable(step)


def test_memory_stable_does_not_leak_through_its_own_hooks():
    # The probe must not keep graphs alive: an output saved by its own node (sigmoid,
    # relu) would otherwise form a reference cycle through C++.
    model = mlp()
    x, _ = batch()
    outputs = []

    def step():
        outputs.append(torch.sigmoid(model(x)))

    with pytest.raises(CheckFailed):
        assert_memory_stable(step, steps=3, warmup=0)
    outputs.clear()
    gc.collect()
    fresh = mlp()

    def clean():
        torch.sigmoid(fresh(x)).sum().backward()

    result = assert_memory_stable(clean, steps=3, warmup=0)
    assert set(result.graph_nodes) == {0}


def test_memory_stable_rejects_bad_arguments():
    s = clean_setup()
    with pytest.raises(ValueError, match="steps"):
        assert_memory_stable(s.step, steps=1)
    with pytest.raises(ValueError, match="warmup"):
        assert_memory_stable(s.step, warmup=-1)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_memory_stable_measures_cuda_memory():
    s = clean_setup(device="cuda")
    result = assert_memory_stable(s.step)
    assert result.cuda_bytes is not None and "cuda_bytes" in result.measured
    kept = []

    def step():
        kept.append(s.step().detach())  # no graph, but GPU memory grows

    with pytest.raises(CheckFailed, match=r"\(c\) CUDA memory allocated"):
        assert_memory_stable(step)


def test_cuda_bytes_are_read_from_the_allocators_nested_counters(monkeypatch):
    """The nested counters give what torch.cuda.memory_allocated gives, without the public
    call's flattening of every counter; the public call is the fallback."""
    from trainlint._runtime import memory

    nested = {"allocated_bytes": {"all": {"current": 12345}}}
    monkeypatch.setattr(torch._C, "_cuda_memoryStats", lambda device: nested, raising=False)
    assert memory._allocated(0) == 12345
    monkeypatch.setattr(torch._C, "_cuda_memoryStats", lambda device: {}, raising=False)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 777)
    assert memory._allocated(0) == 777
