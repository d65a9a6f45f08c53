"""Which clock assert_step_time_stable uses, and which host syncs it counts.

The clock follows where the step's work runs, not what the process has initialised: a
CPU step on a GPU runner (CUDA initialised by an earlier test) is timed by CPU time. And
only the user's step is counted for host syncs, never the check's own synchronize or
event records. Both are shown here on CPU with a stand-in for ``torch.cuda`` (a process
that reports CUDA as initialised, events that warn like the sync debug mode), and, where
a GPU exists, on the real thing (``-m cuda``).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable

import pytest
import torch
from runtime_helpers import clean_setup
from test_runtime_step_time import growing_graph, growing_matmul

from trainlint._runtime import clock as clock_module
from trainlint.testing import CheckFailed, assert_step_time_stable

SYNC_WARNING = "called a synchronizing CUDA operation"
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


class FakeCuda:
    """What the check uses of ``torch.cuda``, on CPU: CUDA reported initialised, events
    timed by the wall clock, and, as the real sync debug mode does, a warning for each
    synchronizing call while the mode is "warn" (the first record of a new event too)."""

    def __init__(self) -> None:
        self.mode: int | str = 0
        self.event_ms: float | None = None  # a fixed event time: a GPU timeline that holds
        fake = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                self.at = 0.0
                self.recorded = 0

            def record(self) -> None:
                if not self.recorded:
                    fake.sync(3)  # lazy state set up on first use
                self.recorded += 1
                self.at = time.perf_counter()

            def synchronize(self) -> None:
                fake.sync(3)

            def elapsed_time(self, end: Event) -> float:
                if fake.event_ms is not None:
                    return fake.event_ms
                return (end.at - self.at) * 1e3

        self.Event = Event

    def sync(self, stacklevel: int = 2) -> None:
        """Warn as the sync debug mode does, naming the frame ``stacklevel`` up (2: the
        caller of this method, 3: the caller of the fake CUDA call that calls it)."""
        if self.mode in ("warn", 1):
            warnings.warn(SYNC_WARNING, UserWarning, stacklevel=stacklevel)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        cuda = torch.cuda
        monkeypatch.setattr(cuda, "is_available", lambda: True)
        monkeypatch.setattr(cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(cuda, "Event", self.Event)
        monkeypatch.setattr(cuda, "synchronize", lambda device=None: self.sync(3))
        monkeypatch.setattr(cuda, "get_sync_debug_mode", lambda: self.mode)
        monkeypatch.setattr(cuda, "set_sync_debug_mode", lambda mode: setattr(self, "mode", mode))


@pytest.fixture
def cuda_initialised(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    fake = FakeCuda()
    fake.install(monkeypatch)
    return fake


@pytest.fixture
def work_on_cuda(monkeypatch: pytest.MonkeyPatch, cuda_initialised: FakeCuda) -> FakeCuda:
    """The clock choice injected: every step counts as CUDA work."""
    monkeypatch.setattr(clock_module, "work_devices", lambda torch, run: {"cuda"}, raising=False)
    return cuda_initialised


def cuda_step_first() -> None:
    """One real CUDA step, as an earlier test on a GPU runner leaves the process."""
    s = clean_setup(device="cuda")
    s.step()
    torch.cuda.synchronize()


# -- the clock follows the work --------------------------------------------------------


def test_cpu_step_is_timed_by_cpu_time_where_cuda_is_initialised(cuda_initialised):
    for seed in range(3):  # a clean step: repeated, flakiness is a bug
        result = assert_step_time_stable(clean_setup(seed).step)
        assert result.clock == "thread_time" and result.syncs is None
        assert result.calls_per_sample > 1


def test_growing_cpu_step_is_caught_where_cuda_is_initialised(cuda_initialised):
    # the bug: CUDA events around a CPU step ("floors 0.461 -> 0.423 ms"), not reported
    with pytest.raises(CheckFailed, match="slower") as info:
        assert_step_time_stable(growing_matmul())
    assert info.value.result.clock == "thread_time"
    assert "CPU time of the calling thread" in str(info.value)


def test_a_step_that_touches_no_tensor_is_cpu_work(cuda_initialised):
    result = assert_step_time_stable(lambda: sum(range(200)))
    assert result.clock in ("thread_time", "active", "wall")


def test_work_devices_reads_the_tensors_of_the_step():
    s = clean_setup()
    assert clock_module.work_devices(torch, s.step) == {"cpu"}
    scalar = torch.zeros(())
    # one-element tensors (a step counter, a loss scale) are not CPU work
    assert clock_module.work_devices(torch, lambda: scalar.add_(1)) == {"cpu"}
    assert clock_module.work_devices(torch, lambda: None) == {"cpu"}


@pytest.mark.cuda
@needs_cuda
def test_cpu_checks_keep_the_cpu_clock_after_a_real_cuda_step():
    cuda_step_first()
    assert torch.cuda.is_initialized()
    for seed in range(3):
        result = assert_step_time_stable(clean_setup(seed).step)
        assert result.clock == "thread_time" and result.syncs is None
    with pytest.raises(CheckFailed, match="slower") as info:
        assert_step_time_stable(growing_matmul())
    assert info.value.result.clock == "thread_time"


@pytest.mark.cuda
@needs_cuda
def test_work_devices_on_cuda():
    cpu, gpu = clean_setup(), clean_setup(device="cuda")
    assert clock_module.work_devices(torch, gpu.step) == {"cuda"}
    assert clock_module.work_devices(torch, cpu.step) == {"cpu"}

    def both() -> None:
        gpu.step()
        cpu.step()

    assert clock_module.work_devices(torch, both) == {"cpu", "cuda"}


@pytest.fixture
def work_on_both(monkeypatch: pytest.MonkeyPatch, cuda_initialised: FakeCuda) -> FakeCuda:
    """The clock choice injected: every step does CPU tensor work and runs CUDA kernels,
    whose GPU time holds at 1 ms."""
    monkeypatch.setattr(clock_module, "work_devices", lambda torch, run: {"cpu", "cuda"})
    cuda_initialised.event_ms = 1.0
    return cuda_initialised


def test_a_step_doing_both_is_timed_by_both_clocks(work_on_both):
    for seed in range(3):
        result = assert_step_time_stable(clean_setup(seed).step)
        assert result.clock == "cuda+thread_time" and result.calls_per_sample == 1
        assert result.host_times is not None and len(result.host_times) == len(result.times)


def test_cpu_work_that_grows_beside_cuda_work_is_caught_by_the_cpu_clock(work_on_both):
    # the CUDA events hold at 1 ms: only the thread's CPU time sees the growth
    with pytest.raises(CheckFailed, match="slower") as info:
        assert_step_time_stable(growing_matmul(), steps=20)
    assert "the step runs CUDA kernels too, and its CUDA time held" in str(info.value)
    assert info.value.result.clock == "cuda+thread_time"


# -- only the user's syncs are counted -------------------------------------------------


def test_the_checks_own_synchronize_is_not_a_host_sync(work_on_cuda):
    # the bug: "up to 1 host syncs per step", the site the check's own first record
    for seed in range(3):
        result = assert_step_time_stable(clean_setup(seed).step, max_syncs=0)
        assert result.clock == "cuda" and result.calls_per_sample == 1
        assert result.syncs is not None and set(result.syncs) == {0}
        assert result.sync_sites == {}


def test_the_steps_own_syncs_are_counted_by_site(work_on_cuda):
    s = clean_setup()

    def step() -> None:
        s.step()
        work_on_cuda.sync()  # stands for `loss.item()` on CUDA (TL401)

    result = assert_step_time_stable(step)
    assert result.syncs is not None and set(result.syncs) == {1}
    assert result.sync_sites is not None
    assert [site.rsplit(":", 1)[0] for site in result.sync_sites] == [__file__]
    with pytest.raises(CheckFailed, match="TL401") as info:
        assert_step_time_stable(step, max_syncs=0)
    assert "up to 1 host syncs per step (max_syncs=0)" in str(info.value)


@pytest.mark.cuda
@needs_cuda
def test_a_clean_cuda_step_passes_max_syncs_zero():
    for seed in range(3):
        result = assert_step_time_stable(clean_setup(seed, device="cuda").step, max_syncs=0)
        assert result.clock == "cuda" and result.syncs is not None and set(result.syncs) == {0}


@pytest.mark.cuda
@needs_cuda
def test_host_syncs_are_named_by_site_on_cuda():
    s = clean_setup(device="cuda")

    def step() -> None:
        loss = s.step()
        float(loss.item())  # TL401: a host sync every step

    with pytest.raises(CheckFailed, match="TL401") as info:
        assert_step_time_stable(step, max_syncs=0)
    sites = info.value.result.sync_sites
    assert sites and all(site.startswith(__file__) for site in sites), sites


# -- CUDA steps whose work grows -------------------------------------------------------


def growing_buffer(device: str) -> Callable[[], None]:
    """A step that also concatenates every batch seen so far into a buffer it re-reads."""
    s = clean_setup(device=device)
    kept: list[torch.Tensor] = []

    def step() -> None:
        kept.append(torch.randn(4096, 64, device=device))
        torch.cat(kept).square().sum()
        s.step()

    return step


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("make", ["graph", "buffer"])
def test_event_timing_catches_a_growing_cuda_step(make):
    if make == "graph":
        torch.manual_seed(0)
        step = growing_graph_on("cuda")
    else:
        step = growing_buffer("cuda")
    with pytest.raises(CheckFailed, match="slower") as info:
        assert_step_time_stable(step, steps=20)
    assert info.value.result.clock.startswith("cuda")


def growing_graph_on(device: str) -> Callable[[], None]:
    """``growing_graph`` on ``device``: a recurrent state never detached (TL302)."""
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh()).to(device)
    x, y = torch.randn(512, 256, device=device), torch.randn(512, 256, device=device)
    state = {"hidden": torch.zeros(512, 256, device=device)}

    def step() -> None:
        state["hidden"] = state["hidden"] * 0.5 + model(x)
        torch.nn.functional.mse_loss(state["hidden"], y).backward(retain_graph=True)

    return step


def test_growing_graph_is_still_caught_on_cpu():
    # the CPU twin of the CUDA graph test above: the same planted bug, the CPU clock
    with pytest.raises(CheckFailed, match="slower"):
        assert_step_time_stable(growing_graph())
