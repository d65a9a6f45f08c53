"""``assert_finite_grads(locate=True)`` reruns the first failing step after the last one
from what that step began with: the parameters (copied at the end of its backward, only
when that backward went wrong), the buffers, the random state and the batch. Each case
records what every call of the step saw as it began, and the rerun (the last call) must
see what the first failing call saw."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from runtime_helpers import batch
from torch import nn

from trainlint.testing import CheckFailed, assert_finite_grads
from trainlint.testing._common import runtime


class Net(nn.Module):
    """Linear, BatchNorm (buffers that change in forward), Dropout (random state)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(8, 16)
        self.norm = nn.BatchNorm1d(16)
        self.drop = nn.Dropout(0.5)
        self.out = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor, poisoned: bool) -> torch.Tensor:
        h = self.drop(torch.relu(self.norm(self.inp(x))))
        out = self.out(h)
        if poisoned:
            out = torch.sqrt(out - out.detach())  # d sqrt(u)/du at u = 0: Inf, then NaN
        return out


def _seen(model: Net) -> dict[str, torch.Tensor]:
    state = {n: p.detach().clone() for n, p in model.named_parameters()}
    state.update({f"buffer {n}": b.clone() for n, b in model.named_buffers()})
    return state


def _run(bad: int, *, steps: int = 4, own_anomaly: bool = False, raise_at: int | None = None):
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = batch()
    batches = [(x + i, y, i, i == bad) for i in range(steps)]
    seen: list[dict[str, Any]] = []

    def step(b: Any) -> torch.Tensor:
        xb, yb, index, poisoned = b
        began = _seen(model)
        began["batch"] = index
        seen.append(began)
        opt.zero_grad()
        out = model(xb, poisoned)
        began["dropped"] = model.drop_mask if hasattr(model, "drop_mask") else None
        loss = nn.functional.mse_loss(out, yb)
        if own_anomaly:
            with torch.autograd.detect_anomaly():
                loss.backward()
        else:
            loss.backward()
        opt.step()
        if raise_at is not None and index == raise_at:
            raise ValueError("NaN weights broke the data pipeline")
        return loss

    def keep_mask(module: nn.Module, args: Any, output: torch.Tensor) -> None:
        model.drop_mask = output == 0  # type: ignore[assignment]

    model.drop.register_forward_hook(keep_mask)
    with pytest.raises(CheckFailed) as info:
        assert_finite_grads(model, step, steps=steps, batches=batches)
    return info.value, seen


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


@pytest.fixture(params=[False, True], ids=["cpu-path", "device-path"])
def path(request, monkeypatch):
    """``device-path``: the gradients measured as CUDA ones are (an engine callback per
    backward), so that the CPU covers that path too."""
    if request.param:
        rt = runtime()
        monkeypatch.setattr(
            rt, "GradRecorder", functools.partial(rt.GradRecorder, device_path=True)
        )
    return request.param


@pytest.mark.parametrize("bad", [0, 2, 3])
def test_the_rerun_begins_with_what_the_failing_step_began_with(bad, path):
    """Parameters, BatchNorm statistics, dropout mask (the random state) and batch."""
    failure, seen = _run(bad)
    message = str(failure)
    assert f"at step {bad}" in message
    assert "SqrtBackward0 turned finite gradients into" in message
    assert len(seen) == 4 + 1  # every step ran, then the rerun
    _same(seen[-1], seen[bad])
    if bad:  # not what the step before it began with
        assert not torch.equal(seen[-1]["inp.weight"], seen[bad - 1]["inp.weight"])
        assert not torch.equal(
            seen[-1]["buffer norm.running_mean"], seen[bad - 1]["buffer norm.running_mean"]
        )


def test_one_step_reruns_from_its_start():
    failure, seen = _run(0, steps=1)
    assert "SqrtBackward0" in str(failure)
    assert len(seen) == 2
    _same(seen[1], seen[0])


def test_a_later_step_that_raises_reruns_the_first_failing_one(path):
    """Step 1 makes a NaN; step 2 raises (a data pipeline broken by NaN weights): the NaN
    of step 1 is the failure, rerun from what step 1 began with."""
    failure, seen = _run(1, raise_at=2)
    message = str(failure)
    assert "at step 1" in message and "SqrtBackward0" in message
    assert len(seen) == 3 + 1
    _same(seen[-1], seen[1])


def test_a_step_stopped_by_its_own_anomaly_detection_reruns_from_its_start(path):
    """The step's own detect_anomaly raises inside backward at step 2: no optimizer ran,
    nothing was copied at the end of that backward, and the rerun still begins as that
    step began."""
    failure, seen = _run(2, own_anomaly=True)
    assert "at step 2" in str(failure)
    assert len(seen) == 3 + 1  # the step raised: no step after it
    _same(seen[-1], seen[2])


def test_a_passing_check_leaves_nothing_copied_on_its_parameters():
    """No failure: the model is as the steps left it, and a second check reuses the kept
    buffers."""
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batch()

    def step() -> torch.Tensor:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x, False), y)
        loss.backward()
        opt.step()
        return loss

    for _ in range(2):
        before = _seen(model)
        assert_finite_grads(model, step, steps=3)
        after = _seen(model)
        assert not torch.equal(before["inp.weight"], after["inp.weight"])


def test_without_the_fused_kernel_the_copy_is_taken_by_where(monkeypatch):
    """Where ``torch._fused_sgd_`` is missing (or does not take the dtype), the copy is
    chosen by ``torch.where`` on the flag: the same rerun."""
    from trainlint._runtime import first_failure
    from trainlint._runtime.pool import KeptPool

    monkeypatch.setattr(first_failure, "_fused_sgd", None)
    monkeypatch.setattr(first_failure, "_free_groups", KeptPool(4, per_key=1))
    failure, seen = _run(2)
    assert "at step 2" in str(failure) and "SqrtBackward0" in str(failure)
    _same(seen[-1], seen[2])


def test_a_fused_kernel_that_refuses_the_tensors_gives_way_to_where(monkeypatch):
    """A device or layout the fused kernel refuses raises before it writes: the group is
    copied by ``where`` from then on, and the rerun is the same."""
    from trainlint._runtime import first_failure
    from trainlint._runtime.pool import KeptPool

    def refuses(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("not on this device")

    monkeypatch.setattr(first_failure, "_fused_sgd", refuses)
    monkeypatch.setattr(first_failure, "_free_groups", KeptPool(4, per_key=1))
    failure, seen = _run(1)
    assert "at step 1" in str(failure) and "SqrtBackward0" in str(failure)
    _same(seen[-1], seen[1])


def test_a_fused_kernel_that_ignores_the_skip_flag_is_not_used(monkeypatch):
    """Tried once a device and dtype before the steps: a kernel that copied on every
    backward would keep the last backward's parameters, not the first failing one's."""
    from trainlint._runtime import first_failure
    from trainlint._runtime.pool import KeptPool

    real = first_failure._fused_sgd
    used: list[int] = []

    def ignores_skip(*args: Any, found_inf: torch.Tensor, **kwargs: Any) -> None:
        used.append(1)
        real(*args, found_inf=torch.zeros_like(found_inf), **kwargs)

    monkeypatch.setattr(first_failure, "_fused_sgd", ignores_skip)
    monkeypatch.setattr(first_failure, "_FUSED_OK", {})
    monkeypatch.setattr(first_failure, "_free_groups", KeptPool(4, per_key=1))
    assert not first_failure._fused_copies(torch.device("cpu"), torch.float32)
    used.clear()
    failure, seen = _run(1)
    assert "at step 1" in str(failure)
    _same(seen[-1], seen[1])
    assert not used  # the steps copied by where
