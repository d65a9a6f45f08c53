"""No check reads a tensor on the host while the user's steps run (issue 37).

On a GPU each such read (``.item()``, ``float()``, ``.tolist()``, ``.cpu()``, a
``synchronize``) is a sync: the CPU can no longer run ahead of the GPU, and every
millisecond of the check's bookkeeping shows on the GPU's timeline. The reads are
counted here on the CPU, by the frame that makes them: those from trainlint's own code
between the start of the first step and the end of the last must be none, and those
after the last step a few, however many steps ran. The user's own reads are not the
check's. The CPU takes the device's path: ``assert_finite_grads(locate=True)`` does not
stop a step at a non-finite gradient, it reruns the first failing one after the last.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from runtime_helpers import batch, mlp
from torch import nn

import trainlint
from trainlint.testing import (
    assert_clip_effective,
    assert_finite_grads,
    assert_grads_nonzero,
    assert_memory_stable,
    assert_weights_updated,
)
from trainlint.testing._common import runtime

_OURS = os.path.dirname(os.path.abspath(trainlint.__file__)) + os.sep
_READS = ("item", "tolist", "__float__", "__int__", "__bool__", "cpu", "numpy")
_END_READS = 4  # after the last step, at most: one per record a check keeps


class Reads:
    """Host reads made by trainlint's frames, before, during and after the steps."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.calls = 0  # steps begun
        self.done = 0  # steps finished
        self.during: list[str] = []
        self.after: list[str] = []

    def note(self, what: str, frame: Any) -> None:
        if not frame.f_code.co_filename.startswith(_OURS):
            return  # the user's read, or torch's own
        if self.calls and self.done < self.steps:
            self.during.append(f"{what} at {frame.f_code.co_name}:{frame.f_lineno}")
        elif self.done >= self.steps:
            self.after.append(what)

    def step(self, inner: Callable[[], Any]) -> Callable[[], Any]:
        def step() -> Any:
            self.calls += 1
            try:
                return inner()
            finally:
                self.done += 1

        return step


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[int], Reads]]:
    made: list[Reads] = []

    def watch(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def counting(*args: Any, **kwargs: Any) -> Any:
            if made:  # the check running now
                made[-1].note(name, sys._getframe(1))
            return original(*args, **kwargs)

        return counting

    for name in _READS:
        monkeypatch.setattr(torch.Tensor, name, watch(name, getattr(torch.Tensor, name)))
    monkeypatch.setattr(torch.cuda, "synchronize", watch("synchronize", torch.cuda.synchronize))

    def start(steps: int) -> Reads:
        made.append(Reads(steps))
        return made[-1]

    yield start


def _setup(clip: bool = False) -> tuple[nn.Module, Any, Callable[[], Any]]:
    model = mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = batch()

    def step() -> float:
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        if clip:
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            nn.utils.get_total_norm([p.grad for p in model.parameters()])
        optimizer.step()
        return loss  # a tensor: the check reads it, after the steps

    return model, optimizer, step


CHECKS: dict[str, Callable[[int, Reads], Any]] = {}


def _check(name: str) -> Callable[[Callable[[int, Reads], Any]], Callable[[int, Reads], Any]]:
    def register(run: Callable[[int, Reads], Any]) -> Callable[[int, Reads], Any]:
        CHECKS[name] = run
        return run

    return register


@_check("grads")
def _grads(steps: int, reads: Reads) -> Any:
    model, _, step = _setup()
    return assert_grads_nonzero(model, reads.step(step), steps=steps)


@_check("finite")
def _finite(steps: int, reads: Reads) -> Any:
    model, _, step = _setup()
    return assert_finite_grads(model, reads.step(step), steps=steps)


@_check("finite(locate=False)")
def _finite_unlocated(steps: int, reads: Reads) -> Any:
    model, _, step = _setup()
    return assert_finite_grads(model, reads.step(step), steps=steps, locate=False)


@_check("weights")
def _weights(steps: int, reads: Reads) -> Any:
    model, optimizer, step = _setup()
    return assert_weights_updated(model, reads.step(step), steps=steps, optimizer=optimizer)


@_check("clip")
def _clip(steps: int, reads: Reads) -> Any:
    model, _, step = _setup(clip=True)
    return assert_clip_effective(model, reads.step(step), steps=steps)


@_check("memory")
def _memory(steps: int, reads: Reads) -> Any:
    _, _, step = _setup()
    return assert_memory_stable(reads.step(step), steps=steps, warmup=1)


def _run(counted: Callable[[int], Reads], name: str, steps: int) -> Reads:
    calls = steps + 1 if name == "memory" else steps  # the memory check's warmup step
    reads = counted(calls)
    CHECKS[name](steps, reads)
    assert reads.done == calls
    return reads


@pytest.mark.parametrize("name", list(CHECKS))
def test_a_check_reads_nothing_on_the_host_while_the_steps_run(counted, name):
    few, many = _run(counted, name, 2), _run(counted, name, 5)
    assert few.during == [] and many.during == []
    # after the last step: a fixed number, not one per step
    assert len(many.after) == len(few.after) <= _END_READS, (few.after, many.after)


@pytest.mark.parametrize("name", ["grads", "finite", "finite(locate=False)", "clip"])
def test_the_device_path_reads_nothing_either(counted, name, monkeypatch):
    """The way CUDA gradients are measured (an engine callback per backward, 0-d tensors)
    run on the CPU, so that CI without a GPU covers it."""
    import trainlint.testing.clip as clip_module

    rt = runtime()
    monkeypatch.setattr(rt, "GradRecorder", functools.partial(rt.GradRecorder, device_path=True))
    monkeypatch.setattr(clip_module, "_BATCHED_ON_CPU", True)
    few, many = _run(counted, name, 2), _run(counted, name, 5)
    assert few.during == [] and many.during == []
    assert len(many.after) == len(few.after) <= _END_READS, (few.after, many.after)


def test_the_counting_sees_a_read_in_trainlints_frames(counted):
    """The counting itself: a read from a trainlint frame during the steps is caught."""
    from trainlint._runtime import norms

    reads = counted(1)
    model, _, step = _setup()

    def reading_step() -> Any:
        out = step()
        norms.read_floats([out.detach(), out.detach()])  # a read in trainlint's code
        return out

    assert_grads_nonzero(model, reads.step(reading_step))
    assert reads.during == ["tolist at read_floats:" + reads.during[0].rsplit(":", 1)[1]]
