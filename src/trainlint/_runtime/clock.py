"""Timing a training step: the calling thread's CPU time on CPU (or, for a step that
mostly waits, the wall clock less the time queued for a core), CUDA events on the GPU,
with the host syncs counted. What ``assert_step_time_stable`` times samples with.

Which clock follows where the step's work runs (``work_devices``), never whether CUDA is
available or initialised in the process: a CPU step in a process that also ran CUDA work
(an earlier test on a GPU runner) is still timed by CPU time.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from typing import Any

from trainlint._collector import collector_paused

#: On CPU each timed sample runs the step this long (CPU seconds) at least: a
#: sub-millisecond step timed on its own is dominated by the timer, cache and
#: frequency effects, a batch of calls is not. Long enough that a window of samples
#: holds enough calls to see growing work beside busy neighbours (docs/testing.md).
SAMPLE_SECONDS = 0.01
#: Most calls one sample may batch (a step of a microsecond or less).
MAX_CALLS_PER_SAMPLE = 1000
#: A step whose thread runs less than this share of the time it is not queued for a
#: core mostly waits (sleep, I/O, other threads or processes): CPU time cannot see what
#: makes it slow, so it is timed by the clock instead (see ``StepClock``).
MIN_CPU_SHARE = 0.5
#: Rounds of the fixed reference work timed before each CPU sample (1 ms on a 2-core VM,
#: a tenth of a sample: see ``StepClock``).
REFERENCE_ROUNDS = 40


class StepClock:
    """Times samples of the step; on CUDA, one call timed with events, counting host syncs.

    ``calibrate`` decides the clock from one untimed call (``work_devices``): events for a
    step that runs CUDA kernels, the thread's CPU time for one whose tensor work is on the
    CPU, and both for a step doing both (``host_times`` then holds the CPU time of each
    call, at the calibration's speed). Only the user's step is inside the counted region:
    the check's own synchronize and event records happen before and after it.

    On CPU it reads the calling thread's CPU time (``time.thread_time``), which a busy
    machine cannot inflate: waiting for a core is not running on it. Not the process's
    CPU time: torch's intra-op worker threads spin while they wait for work, and other
    threads of the process (data loaders, the neighbours a test starts) count there too.
    So that the step's work is all on the calling thread, the check runs it with
    ``torch.set_num_threads(1)``. A sample batches ``calls`` calls so that it takes
    ``SAMPLE_SECONDS`` at least: see docs/testing.md.

    A step that mostly waits would be timed by CPU time as the noise of its few
    microseconds of Python: the calibration sees that (CPU time under ``MIN_CPU_SHARE``
    of the wall clock less the run-queue wait) and then times it by that active time,
    which counts sleeping, I/O and waiting for other threads, but not waiting for a core.

    CPU time is not the work done, though: on a shared virtual machine the same work's
    CPU time drifts by up to 2x over a few seconds (the host's clock and caches), and a
    drift that rises for a few windows looks like a step that grows. So each CPU sample
    is preceded by a fixed reference workload (``Reference``), and its time is scaled
    by how much faster that ran than at calibration: ``times`` are at the calibration's
    speed. The reference's time follows the step's (correlation 0.88 on an idle 2-core
    VM, 0.74 beside two busy processes), and the scaled floors of a constant step's
    windows scatter by a third (idle) to a half (busy) as much as the raw ones.
    """

    def __init__(self, torch: Any, run: Any) -> None:
        self.torch = torch
        self.run = run
        self.on_cuda = False  # set by calibrate: the step launches CUDA kernels
        self.on_cpu = True  # and whether it also does tensor work on the CPU
        self.kind = "thread_time"
        self.calls = 1
        self.times: list[float] = []
        self.host_times: list[float] = []
        #: each CPU sample's CPU time over its active time (see ``turned_to_waiting``)
        self.shares: list[float] = []
        self._events: tuple[Any, Any] | None = None
        self.syncs: list[int] = []
        self.sites: Counter[str] = Counter()
        self.reference: Reference | None = None
        self.reference_time = 0.0

    def calibrate(self) -> None:
        """Choose the clock, and on CPU how many calls a sample batches (untimed calls)."""
        __tracebackhide__ = True
        initialised = self.torch.cuda.is_initialized()
        if initialised:
            self._choose(work_devices(self.torch, self.run))
        if self.on_cuda:
            self._cuda_calibrate()
            return
        # One call, then three probes of a fifth of a sample each: the first call may be
        # far slower than the rest (cold caches), and on a busy machine any one probe
        # may be; the fastest probe sizes the sample. Few calls in all: a step whose
        # work grows with every call should not have grown much before the first sample.
        cpu, active = self._measure(1)
        if not initialised and self.torch.cuda.is_initialized():  # it initialised CUDA
            self._choose(work_devices(self.torch, self.run))
            if self.on_cuda:
                self._cuda_calibrate()
                return
        per_call = max(active, 1e-9)
        cpu_total = active_total = 0.0
        per_cpu, per_active = math.inf, math.inf
        for _ in range(3):
            probe = max(1, min(MAX_CALLS_PER_SAMPLE // 10, int(0.2 * SAMPLE_SECONDS / per_call)))
            cpu, active = self._measure(probe)
            cpu_total, active_total = cpu_total + cpu, active_total + active
            per_cpu = min(per_cpu, cpu / probe)
            per_active = min(per_active, active / probe)
            per_call = max(per_active, 1e-9)
        # Without the run queue, the wall clock of a computing step on a busy machine is
        # mostly queueing: only a far smaller CPU share then means the step waits.
        queue = _run_queue_seconds() is not None
        if cpu_total < (MIN_CPU_SHARE if queue else MIN_CPU_SHARE / 5) * active_total:
            self.kind = "active" if queue else "wall"
            per_call = per_active
        else:
            per_call = per_cpu
        per_call = max(per_call, 1e-9)
        self.calls = min(MAX_CALLS_PER_SAMPLE, max(1, math.ceil(SAMPLE_SECONDS / per_call)))
        if self.kind == "thread_time":
            self.reference = Reference(self.torch)
            self.reference_time = min(self.reference() for _ in range(3))

    def _choose(self, devices: set[str]) -> None:
        self.on_cuda = "cuda" in devices
        self.on_cpu = not self.on_cuda or bool(devices - {"cuda"})
        self.kind = (
            "cuda+thread_time"
            if self.on_cuda and self.on_cpu
            else ("cuda" if self.on_cuda else "thread_time")
        )

    def _cuda_calibrate(self) -> None:
        """Events made and recorded once, untimed: their first use may initialise CUDA
        state (and synchronize), which must not land in a counted step."""
        cuda = self.torch.cuda
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        start.record()
        end.record()
        end.synchronize()
        self._events = (start, end)
        if self.on_cpu:
            self.reference = Reference(self.torch)
            self.reference_time = min(self.reference() for _ in range(3))

    def _measure(self, calls: int) -> tuple[float, float]:
        """The calling thread's CPU time of ``calls`` calls, and their active time.

        Active time is the wall-clock time less the time the thread was runnable but
        waiting for a core (the run queue; Linux), or the plain wall-clock time where
        that cannot be read.
        """
        __tracebackhide__ = True
        run = self.run
        queued = _run_queue_seconds()
        wall = time.perf_counter()
        cpu = time.thread_time()
        for _ in range(calls):
            run()
        cpu = time.thread_time() - cpu
        wall = time.perf_counter() - wall
        after = _run_queue_seconds()
        if queued is not None and after is not None:
            wall -= after - queued
        return cpu, max(wall, cpu)

    def timed(self) -> float:
        __tracebackhide__ = True
        torch = self.torch
        speed = 1.0  # (the CPU clock is judged at the calibration's speed: see the class)
        if self.reference is not None:
            speed = self.reference_time / max(self.reference(), 1e-9)
        if self.on_cuda:
            assert self._events is not None
            start, end = self._events
            # The check's own synchronize and records stay outside the counted region:
            # only the user's step is counted (and its CPU time taken).
            torch.cuda.synchronize()
            start.record()
            with SyncCounter(torch) as counter:
                cpu = time.thread_time()
                self.run()
                cpu = time.thread_time() - cpu
            end.record()
            end.synchronize()
            elapsed = start.elapsed_time(end) / 1e3
            self.syncs.append(counter.count)
            self.sites.update(counter.sites)
            if self.on_cpu:
                self.host_times.append(cpu * speed)
        else:
            cpu, active = self._measure(self.calls)
            self.shares.append(cpu / active if active > 0 else 1.0)
            elapsed = (cpu * speed if self.kind == "thread_time" else active) / self.calls
        self.times.append(elapsed)
        return elapsed

    def turned_to_waiting(self, first: int) -> bool:
        """Whether a step timed by its CPU time spent most of the samples from ``first`` on
        waiting (its CPU time under ``MIN_CPU_SHARE`` of its active time), though it mostly
        computed at calibration: a wait that grows with every call (I/O, a lock, a sleep).

        Its CPU time then grows with the wait, not its work: each wake-up runs on cold
        caches and a lowered clock, and on a loaded machine other processes run during
        every wait (a clean step waiting 2.5 us more each call was judged 2.39x slower at
        load 5 on two cores). Sleeping is not running: such growth is not reported.
        """
        shares = self.shares[first:]
        return (
            self.kind == "thread_time"
            and bool(shares)
            and (sorted(shares)[len(shares) // 2] < MIN_CPU_SHARE)
        )

    @contextlib.contextmanager
    def single_threaded(self) -> Iterator[None]:
        """One intra-op thread on CPU for the duration, the caller's count restored (set
        before the clock is chosen: CPU work is timed on the calling thread alone)."""
        previous = self.torch.get_num_threads()
        self.torch.set_num_threads(1)
        try:
            yield
        finally:
            self.torch.set_num_threads(previous)


class Reference:
    """A fixed piece of CPU work, timed: small matmuls into one buffer, the kind of work
    a training step's operators do. Built without the random generator (the step's
    random stream is the user's), allocating nothing a step would notice, and run with
    the collector paused (a collection of the step's garbage is not the machine's speed)."""

    def __init__(self, torch: Any) -> None:
        self.mm = torch.mm
        self.a = torch.full((64, 64), 0.01)
        self.b = torch.full((64, 64), 0.02)
        self.out = torch.empty(64, 64)

    def __call__(self) -> float:
        """The CPU seconds of one run of the work, on the calling thread."""
        mm, a, b, out = self.mm, self.a, self.b, self.out
        with collector_paused():
            start = time.thread_time()
            for _ in range(REFERENCE_ROUNDS):
                mm(a, b, out=out)
                out.add_(1.0).relu_()
            return time.thread_time() - start


def work_devices(torch: Any, run: Any) -> set[str]:
    """The device types one call of the step does its tensor work on (one untimed call).

    Read from the tensors of every operator the call runs (a dispatch mode over the call),
    leaving out one-element tensors: an optimizer's step counter or a loss scale lives on
    the CPU beside a CUDA step, and is not CPU work. Where the dispatch mode cannot be used,
    whether the call allocated CUDA memory says whether it ran CUDA work. A step that
    touches no tensor is CPU work.
    """
    try:
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves
    except ImportError:
        return _allocating_devices(torch, run)
    seen: set[str] = set()
    tensor = torch.Tensor

    class Devices(TorchDispatchMode):  # type: ignore[misc]
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves((args, kwargs, out)):
                if isinstance(t, tensor) and t.numel() > 1:
                    seen.add(t.device.type)
            return out

    try:
        with Devices():
            run()
    except Exception:  # noqa: BLE001 - compiled code may refuse the mode; ask the allocator
        return _allocating_devices(torch, run)
    return seen or {"cpu"}


def _allocating_devices(torch: Any, run: Any) -> set[str]:
    def allocations() -> int:
        try:
            return int(torch.cuda.memory_stats().get("allocation.all.allocated", 0))
        except Exception:  # noqa: BLE001 - no CUDA allocator to ask
            return 0

    before = allocations()
    run()
    return {"cuda"} if allocations() > before else {"cpu"}


def _run_queue_seconds() -> float | None:
    """Seconds the calling thread has spent runnable but waiting for a core (Linux).

    The second field of ``/proc/thread-self/schedstat`` (nanoseconds); None where it
    cannot be read (not Linux, or a kernel without schedstats).
    """
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


class SyncCounter:
    """Counts synchronizing CUDA calls through the sync debug mode's warnings."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.count = 0
        self.sites: Counter[str] = Counter()

    def __enter__(self) -> SyncCounter:
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
