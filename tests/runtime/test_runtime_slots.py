"""The CPU hooks write each gradient's (min, max) into a slot and the slots are read later
(issue 19): what the checks report is still what backward produced, whatever the step does
to the gradients after its hooks fired, and however many backwards it runs."""

from __future__ import annotations

import math

import pytest
import torch
from runtime_helpers import batch, mlp
from torch import nn

from trainlint._runtime.recorder import GradRecorder, take_slots
from trainlint.testing import CheckFailed, assert_finite_grads, assert_grads_nonzero


def _maxima(model: nn.Module) -> dict[str, float]:
    return {n: float(p.grad.abs().max()) for n, p in model.named_parameters()}


@pytest.mark.parametrize("after", ["zero_grad(set_to_none=False)", "grad.data.zero_()", "clip"])
def test_what_the_step_does_to_the_gradients_after_backward_is_not_measured(after):
    model = mlp()
    x, y = batch()
    seen: dict[str, float] = {}

    def step() -> None:
        model.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        seen.update(_maxima(model))
        if after == "clip":  # in place, through _foreach_mul_
            nn.utils.clip_grad_value_(model.parameters(), 1e-6)
        elif after == "grad.data.zero_()":  # old style: no version bump on the grad
            for p in model.parameters():
                p.grad.data.zero_()
        else:
            model.zero_grad(set_to_none=False)

    result = assert_grads_nonzero(model, step)
    assert {n: v[0] for n, v in result.max_abs.items()} == seen
    assert all(float(p.grad.abs().max()) <= 1e-6 for p in model.parameters())


def test_two_backwards_in_one_step_are_seen_as_autograd_accumulates_them():
    model = mlp()
    x, y = batch()
    sums: list[dict[str, float]] = []

    def step() -> None:
        model.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        sums.append(_maxima(model))
        (-3.0 * nn.functional.mse_loss(model(x), y)).backward()  # accumulates in place
        sums.append(_maxima(model))
        model.zero_grad()

    result = assert_grads_nonzero(model, step)
    # the larger of the two accumulations, each as it was when its backward made it
    assert {n: v[0] for n, v in result.max_abs.items()} == {
        n: max(sums[0][n], sums[1][n]) for n in sums[0]
    }


def test_more_accumulations_than_slots_are_all_read():
    p = nn.Parameter(torch.zeros(4))
    scales = [1.0, -5.0, 2.0, 10.0, -30.0]
    with GradRecorder([p]) as recorder:  # one slot
        recorder.begin_step(0)
        for scale in scales:
            (p * scale).sum().backward()
        recorder.end_step()
    running = [sum(scales[: i + 1]) for i in range(len(scales))]
    assert [v for _, _, v in recorder.events] == [abs(r) for r in running]
    assert recorder.table(1) == [[max(abs(r) for r in running)]]


def test_a_nan_in_one_parameter_is_named_and_its_rerun_stops_inside_backward():
    model = mlp()
    x, y = batch()
    went_on: list[int] = []

    def step() -> torch.Tensor:
        model.zero_grad()
        bias = model[2].bias
        # 0 forward, NaN backward (d sqrt at 0 is inf, times d|u| at 0, 0): one bad gradient
        spike = (bias - bias.detach()).abs().sqrt().sum()
        loss = nn.functional.mse_loss(model(x), y) + spike
        loss.backward()
        went_on.append(1)
        return loss

    with pytest.raises(CheckFailed) as info:
        assert_finite_grads(model, step)
    # recorded without a host read: the step ran to its end; its rerun stopped in backward
    assert went_on == [1]
    message = str(info.value)
    assert "NaN gradient in `2.bias` at step 0" in message
    assert "SqrtBackward0" in message
    values = info.value.result.max_abs
    assert math.isnan(values["2.bias"][0])
    assert all(math.isfinite(v[0]) for n, v in values.items() if n != "2.bias" and v[0] is not None)


def test_slots_are_kept_for_the_next_check_and_never_shared():
    first = take_slots(3)
    second = take_slots(3)
    assert first[0] is not second[0]
    assert len(first[1]) == 3 and all(lo.dim() == 0 and hi.dim() == 0 for lo, hi in first[1])
