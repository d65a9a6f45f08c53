"""The clean cases, many times over: a runtime check that cries wolf gets deleted.

Slow: carries the `slow` marker (`-m "not slow"` leaves it out).
"""

from __future__ import annotations

import pytest
from runtime_helpers import clean_setup, mlp
from test_runtime_threads import BATCHES, grad_step

from trainlint.testing import (
    assert_finite_grads,
    assert_grads_nonzero,
    assert_loss_decreases,
    assert_memory_stable,
    assert_step_time_stable,
    assert_thread_safe,
    assert_weights_updated,
)

pytestmark = pytest.mark.slow


def test_clean_steps_never_fail():
    for seed in range(100):
        s = clean_setup(seed, opt="adam" if seed % 2 else "sgd", lr=0.01)
        assert_grads_nonzero(s.model, s.step, steps=2)
        assert_finite_grads(s.model, s.step, steps=2)
        assert_weights_updated(s.model, s.step, optimizer=s.optimizer)
        assert_memory_stable(s.step)
        assert_step_time_stable(s.step)
        # the timing check runs many real steps: by now the model has memorised its batch,
        # so the loss check starts from a fresh one
        fresh = clean_setup(seed, opt="adam" if seed % 2 else "sgd", lr=0.01)
        assert_loss_decreases(fresh.step, steps=30)
        model = mlp(seed)
        assert_thread_safe(model, grad_step(model), BATCHES)
