"""Misuse of the runtime API fails with one clear line naming the argument (issue 17, item 9).

Not a TypeError or AttributeError from inside the check or the user's step.
"""

from __future__ import annotations

import functools

import pytest
from runtime_helpers import batch, clean_setup, mlp
from torch import nn

from trainlint.testing import (
    assert_finite_grads,
    assert_grads_nonzero,
    assert_loss_decreases,
    assert_lr_schedule,
    assert_memory_stable,
    assert_step_time_stable,
    assert_thread_safe,
    assert_weights_updated,
)

MODEL_CHECKS = [assert_grads_nonzero, assert_finite_grads, assert_weights_updated]
STEP_CHECKS = [assert_memory_stable, assert_step_time_stable, assert_loss_decreases]


def batch_step():
    model = mlp()

    def step(b):
        x, y = b
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    return model, step


def _one_line(error: BaseException) -> str:
    text = str(error)
    assert "\n" not in text, text
    return text


@pytest.mark.parametrize("check", MODEL_CHECKS + STEP_CHECKS, ids=lambda c: c.__name__)
def test_a_step_that_needs_a_batch_without_batches(check):
    model, step = batch_step()
    args = (model, step) if check in MODEL_CHECKS else (step,)
    with pytest.raises(TypeError) as info:
        check(*args)
    text = _one_line(info.value)
    assert text.startswith(f"{check.__name__}: step(b) takes a batch but no batches= were given")
    assert "batches=[...]" in text


@pytest.mark.parametrize("check", MODEL_CHECKS + STEP_CHECKS, ids=lambda c: c.__name__)
def test_batches_for_a_step_that_takes_none(check):
    s = clean_setup()
    args = (s.model, s.step) if check in MODEL_CHECKS else (s.step,)
    with pytest.raises(TypeError) as info:
        check(*args, batches=[batch()])
    text = _one_line(info.value)
    assert "batches= were given but step() takes no arguments" in text


def test_a_step_with_defaults_or_a_partial_is_accepted():
    model, step = batch_step()
    assert_grads_nonzero(model, functools.partial(step, batch()))

    default = batch()

    def step_with_default(b=default):
        return step(b)

    assert_grads_nonzero(model, step_with_default)
    assert_grads_nonzero(model, step_with_default, batches=[batch()])


@pytest.mark.parametrize("check", MODEL_CHECKS + [assert_thread_safe], ids=lambda c: c.__name__)
def test_model_and_step_swapped(check):
    model, step = batch_step()
    extra = ([batch(0), batch(1)],) if check is assert_thread_safe else ()
    with pytest.raises(TypeError) as info:
        check(step, model, *extra)
    text = _one_line(info.value)
    assert text.startswith(f"{check.__name__}(model, step, ...): model and step are swapped")
    assert "Sequential module" in text


@pytest.mark.parametrize("check", MODEL_CHECKS + [assert_thread_safe], ids=lambda c: c.__name__)
def test_a_model_that_is_not_a_module(check):
    s = clean_setup()
    extra = ([batch(0), batch(1)],) if check is assert_thread_safe else ()
    step = (lambda b: None) if check is assert_thread_safe else s.step
    params = list(s.model.parameters())
    with pytest.raises(TypeError) as info:
        check(params, step, *extra)
    text = _one_line(info.value)
    assert text == f"{check.__name__}: model must be a torch.nn.Module, got a list"


@pytest.mark.parametrize("check", STEP_CHECKS, ids=lambda c: c.__name__)
def test_a_module_passed_as_the_step(check):
    with pytest.raises(TypeError) as info:
        check(mlp())
    text = _one_line(info.value)
    assert text.startswith(f"{check.__name__}: step is a Sequential module (its forward)")


def test_thread_safe_step_must_take_one_batch():
    model = mlp()
    with pytest.raises(TypeError) as info:
        assert_thread_safe(model, lambda: None, [batch(0), batch(1)])
    assert "takes no arguments" in _one_line(info.value)
    with pytest.raises(TypeError) as info:
        assert_thread_safe(model, lambda x, y: None, [batch(0), batch(1)])
    assert "needs 2 arguments, but it is called with one batch" in _one_line(info.value)


def test_lr_schedule_given_a_scheduler_instead_of_a_factory():
    import torch
    from torch.optim import lr_scheduler

    scheduler = lr_scheduler.StepLR(torch.optim.SGD([torch.zeros(1)], lr=1), step_size=2)
    with pytest.raises(TypeError) as info:
        assert_lr_schedule(scheduler, steps=10)
    text = _one_line(info.value)
    assert "scheduler_factory must build a scheduler from an optimizer" in text
    assert "got StepLR" in text
