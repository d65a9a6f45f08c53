"""assert_lr_schedule and assert_loss_decreases."""

from __future__ import annotations

import math
import re

import pytest
import torch
from runtime_helpers import batch, clean_setup, mlp
from torch import nn
from torch.optim import lr_scheduler

from trainlint.testing import (
    CheckFailed,
    LossResult,
    LRTrace,
    assert_loss_decreases,
    assert_lr_schedule,
)

EPOCHS, BATCHES = 6, 10

# ----------------------------------------------------------------- assert_lr_schedule


@pytest.mark.parametrize(
    "factory",
    [
        pytest.param(lambda opt: lr_scheduler.CosineAnnealingLR(opt, T_max=60), id="cosine"),
        pytest.param(lambda opt: lr_scheduler.StepLR(opt, step_size=10, gamma=0.5), id="step"),
        pytest.param(
            lambda opt: lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=60), id="onecycle"
        ),
        pytest.param(lambda opt: lr_scheduler.LambdaLR(opt, lambda s: 1 - s / 60), id="linear"),
        pytest.param(lambda opt: lr_scheduler.ExponentialLR(opt, gamma=0.95), id="exponential"),
    ],
)
def test_lr_schedule_passes_for_sound_schedules(factory):
    probe = factory(torch.optim.SGD([torch.zeros(1)], lr=1))
    warmup = 18 if isinstance(probe, lr_scheduler.OneCycleLR) else 0  # pct_start=0.3
    trace = assert_lr_schedule(factory, steps=60, warmup=warmup, min_lr=0.0)
    assert isinstance(trace, LRTrace)
    assert len(trace) == 60 and trace[0] > 0 and list(trace) == list(trace.lrs)


@pytest.mark.parametrize("warmup", [1, 5, 10])
def test_lr_schedule_linear_warmup_then_cosine_decay(warmup):
    total = 100

    def factor(s):
        if s < warmup:
            return (s + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (s - warmup) / (total - warmup)))

    trace = assert_lr_schedule(
        lambda opt: lr_scheduler.LambdaLR(opt, factor), steps=total, warmup=warmup, base_lr=0.1
    )
    assert trace[0] == pytest.approx(0.1 / warmup)
    assert max(trace) == pytest.approx(0.1)


def test_lr_schedule_epoch_restarts_stepped_per_batch():
    # T_0 is in epochs, but the loop steps the scheduler once per batch.
    def factory(opt):
        return lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=EPOCHS, eta_min=1e-4)

    with pytest.raises(CheckFailed) as info:
        assert_lr_schedule(factory, steps=EPOCHS * BATCHES, base_lr=1e-3)
    message = str(info.value)
    first_line = message.splitlines()[0]
    assert first_line.startswith("assert_lr_schedule: restarts at step 6: ")
    assert "\u2192 0.001" in first_line
    assert "(and at 8 more steps: 12, 18, 24, 30, 36, ...)" in first_line
    assert "TL201 scheduler-unit-mismatch" in message
    assert re.search(r"\n  6 +0\.001 +<-\n", message)  # the trace around the break
    assert info.value.rules[0] == "TL201"
    trace = info.value.result
    assert isinstance(trace, LRTrace) and len(trace) == EPOCHS * BATCHES


def test_lr_schedule_the_same_schedule_stepped_per_epoch_passes():
    def factory(opt):
        return lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=EPOCHS, eta_min=1e-4)

    assert_lr_schedule(factory, steps=EPOCHS, base_lr=1e-3, min_lr=1e-4)


def test_lr_schedule_restarts_allowed_when_asked():
    def factory(opt):
        return lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=EPOCHS)

    trace = assert_lr_schedule(factory, steps=EPOCHS * 3, restarts=True)
    assert trace[EPOCHS] == pytest.approx(1.0)


def test_lr_schedule_warmup_lambda_that_starts_at_zero():
    warmup = 10

    with pytest.raises(CheckFailed) as info:
        assert_lr_schedule(
            lambda opt: lr_scheduler.LambdaLR(opt, lambda s: min(1.0, s / warmup)),
            steps=50,
            warmup=warmup,
        )
    message = str(info.value)
    assert "the first update uses LR 0 (it stays 0 until step 1)" in message
    assert "TL203 warmup-starts-at-zero" in message
    assert "TL204 scheduler-never-stepped" in message


def test_lr_schedule_transformers_style_linear_warmup_starts_at_zero():
    num_warmup_steps, num_training_steps = 5, 50

    def lr_lambda(current_step):  # as in transformers.get_linear_schedule_with_warmup
        if current_step < num_warmup_steps:
            return float(current_step) / float(max(1, num_warmup_steps))
        return max(
            0.0,
            float(num_training_steps - current_step)
            / float(max(1, num_training_steps - num_warmup_steps)),
        )

    with pytest.raises(CheckFailed, match="TL203"):
        assert_lr_schedule(
            lambda opt: lr_scheduler.LambdaLR(opt, lr_lambda),
            steps=num_training_steps,
            warmup=num_warmup_steps,
        )


def test_lr_schedule_decay_shorter_than_training():
    # A linear decay sized in epochs, stepped per batch: it hits 0, then goes negative.
    with pytest.raises(CheckFailed) as info:
        assert_lr_schedule(
            lambda opt: lr_scheduler.LambdaLR(opt, lambda s: 1 - s / EPOCHS),
            steps=EPOCHS * BATCHES,
        )
    message = str(info.value)
    assert "the LR is -0.1667 at step 7" in message
    assert "the LR reaches 0 at step 6 of 60" in message
    assert "TL201" in message


def test_lr_schedule_min_lr():
    with pytest.raises(CheckFailed, match=r"the last LR .* is below min_lr=0.01"):
        assert_lr_schedule(
            lambda opt: lr_scheduler.ExponentialLR(opt, gamma=0.5), steps=20, min_lr=0.01
        )


def test_lr_schedule_rejects_plateau_and_non_schedulers():
    with pytest.raises(TypeError, match="ReduceLROnPlateau"):
        assert_lr_schedule(lambda opt: lr_scheduler.ReduceLROnPlateau(opt), steps=3)
    with pytest.raises(TypeError, match="must return a scheduler"):
        assert_lr_schedule(lambda opt: opt.param_groups, steps=3)


# ----------------------------------------------------------------- assert_loss_decreases


@pytest.mark.parametrize("seed", range(10))
def test_loss_decreases_on_a_clean_step(seed):
    s = clean_setup(seed, opt="adam", lr=0.01)
    result = assert_loss_decreases(s.step, steps=30)
    assert isinstance(result, LossResult)
    assert result.last < 0.5 * result.first


def test_loss_decreases_with_batches_and_a_float_loss():
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    def step(b):
        x, y = b
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return {"loss": loss.item(), "lr": 0.01}

    assert_loss_decreases(step, steps=30, batches=[batch()])


def test_loss_decreases_fails_with_learning_rate_zero():
    s = clean_setup(opt="adam", lr=0.0)
    with pytest.raises(CheckFailed) as info:
        assert_loss_decreases(s.step)
    message = str(info.value)
    assert "the loss never changed in 20 steps" in message
    assert "the learning rate is 0" in message
    assert "TL203 warmup-starts-at-zero" in message
    assert "step  loss" in message


def test_loss_decreases_fails_when_learning_too_slowly():
    s = clean_setup(lr=1e-4)
    with pytest.raises(CheckFailed, match=r"expected at most .* \(factor 0.5\)"):
        assert_loss_decreases(s.step)


def test_loss_decreases_fails_on_a_nan_loss():
    model = mlp()
    x, y = batch()

    def step():
        return nn.functional.mse_loss(model(x) * float("nan"), y)

    with pytest.raises(CheckFailed, match="the loss became nan at step 0"):
        assert_loss_decreases(step)


def test_loss_decreases_needs_the_loss():
    s = clean_setup()

    def step():
        s.step()

    with pytest.raises(TypeError, match="return the loss"):
        assert_loss_decreases(step)


# ------------------------------------------- the LR an update used (assert_weights_updated)


def warmup_from_zero_setup():
    """A warmup LambdaLR that is 0 at step 0 (TL203), stepped after each update."""
    model = mlp()
    x, y = batch()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = lr_scheduler.LambdaLR(opt, lambda s: s / 10)

    def step():
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        sched.step()  # raises the LR before the check could read it after the step

    return model, opt, step


@pytest.mark.parametrize("pass_optimizer", [False, True])
def test_weights_updated_names_lr_zero_first_when_the_first_update_ran_at_lr_zero(
    pass_optimizer,
):
    from trainlint.testing import assert_weights_updated

    model, opt, step = warmup_from_zero_setup()
    with pytest.raises(CheckFailed) as info:
        assert_weights_updated(model, step, optimizer=opt if pass_optimizer else None)
    message = str(info.value)
    assert "The learning rate is 0 in param_groups 0 when the optimizer step of step 0" in message
    assert info.value.rules[0] == "TL206"  # the check confirms TL206, TL203 is the schedule's
    rules = message.split("Static rules that explain this symptom")[1]
    assert rules.index("TL206") < rules.index("TL203") < rules.index("TL204")
    assert "See also" in rules and rules.split("See also")[1].lstrip(" (").find("TL203") != -1
    # an LR of 0 explains it all: the other causes of "nothing moved" are not listed
    for code in ("TL107", "TL102", "TL104"):
        assert code not in rules
    assert info.value.result.zero_lr == ((0, 0),)


def test_weights_updated_passes_once_the_warmup_has_moved_the_lr():
    from trainlint.testing import assert_weights_updated

    model, _, step = warmup_from_zero_setup()
    for _ in range(3):
        result = assert_weights_updated(model, step, steps=2)
        assert result.zero_lr[:1] in ((), ((0, 0),))


# ---------------------------------------- the headline and the summary tell one story


def test_lr_schedule_a_cosine_that_reaches_zero_and_rises_is_a_restart():
    # The headline said "reaches 0 ... shorter than the training" while the summary showed
    # the LR rising again at once: a restart, reported as one.
    with pytest.raises(CheckFailed) as info:
        assert_lr_schedule(
            lambda opt: lr_scheduler.CosineAnnealingLR(opt, T_max=EPOCHS), steps=EPOCHS * BATCHES
        )
    headline = str(info.value).splitlines()[0]
    assert "restarts at step 7: 0 \u2192 0.06699, after reaching 0 at step 6" in headline
    assert "shorter than the training" not in str(info.value)
    # the summary names the first step at the peak, not one rounding lifted by 1e-16
    assert "starts at 1, peaks at 1 (step 0)" in str(info.value)


def test_lr_schedule_a_warmup_from_zero_is_not_also_a_restart():
    with pytest.raises(CheckFailed) as info:
        assert_lr_schedule(lambda opt: lr_scheduler.LambdaLR(opt, lambda s: s / 10), steps=5)
    message = str(info.value)
    assert message.splitlines()[0].endswith("the first update uses LR 0 (it stays 0 until step 1)")
    assert "restart" not in message.lower()
    assert "\n- " not in message  # one problem: no list that disagrees with the headline
    assert info.value.rules[0] == "TL203"


def test_lr_schedule_failure_carries_the_schedulers_it_built():
    def factory(opt):
        warm = lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=2)
        cosine = lr_scheduler.CosineAnnealingLR(opt, T_max=EPOCHS)
        return lr_scheduler.SequentialLR(opt, [warm, cosine], milestones=[2])

    with pytest.raises(CheckFailed) as info:
        assert_lr_schedule(factory, steps=EPOCHS * BATCHES)
    assert info.value.result.built == (
        "torch.optim.lr_scheduler.SequentialLR",
        "torch.optim.lr_scheduler.LinearLR",
        "torch.optim.lr_scheduler.CosineAnnealingLR",
    )
