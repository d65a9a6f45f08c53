"""assert_finite_grads names the right cause: forward or backward, and only rules whose
preconditions the step meets; and a NaN under any key the step returns fails it."""

from __future__ import annotations

import pytest
import torch
from runtime_helpers import batch, clean_setup, mlp
from torch import nn

from trainlint.testing import CheckFailed, assert_finite_grads

AMP_RULES = ("TL601", "TL604", "TL603")


class ExpHead(nn.Module):
    """A model whose output goes through exp: large activations overflow to Inf."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(self.head(torch.relu(self.body(x))))  # overflows when scaled up


def overflowing_setup() -> tuple[nn.Module, object]:
    torch.manual_seed(0)
    model = ExpHead()
    with torch.no_grad():
        model.head.bias.fill_(100.0)  # exp(100) overflows float32
    x, y = batch()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step() -> torch.Tensor:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return model, step


def test_a_forward_overflow_is_named_as_such_without_amp_rules():
    model, step = overflowing_setup()
    for _ in range(3):  # the diagnosis is deterministic: the same every time
        with pytest.raises(CheckFailed) as info:
            assert_finite_grads(model, step)
        message = str(info.value)
        assert "the forward pass made the loss" in message.splitlines()[0]
        assert "The forward pass made it" in message
        assert "aten.exp" in message and "torch.exp(self.head(" in message
        assert "test_runtime_finite_diagnosis.py" in message
        # no GradScaler, no autocast, no softmax or log, no threads: no rule of theirs
        for code in (*AMP_RULES, "TL602", "TL503"):
            assert code not in message
            assert code not in info.value.rules
        assert all(torch.isfinite(p).all() for p in model.parameters())


def sqrt_at_zero_setup() -> tuple[nn.Module, object]:
    """A backward NaN: sqrt at 0 has a finite value and an infinite gradient."""
    model = mlp()
    x, y = batch()

    def step() -> torch.Tensor:
        model.zero_grad()
        out = model(x)
        loss = torch.sqrt((out - out.detach()).abs()).mean() + nn.functional.mse_loss(out, y)
        loss.backward()
        return loss

    return model, step


def test_threads_left_by_earlier_work_do_not_bring_tl503_in():
    # a daemon watcher and an idle executor from elsewhere in the process are not the
    # step's threads; a thread the step starts is
    import threading
    from concurrent.futures import ThreadPoolExecutor

    stop = threading.Event()
    watcher = threading.Thread(target=stop.wait, daemon=True)
    watcher.start()
    pool = ThreadPoolExecutor(max_workers=1)
    pool.submit(lambda: None).result()
    try:
        model, step = sqrt_at_zero_setup()
        with pytest.raises(CheckFailed) as info:
            assert_finite_grads(model, step)
        assert "TL503" not in str(info.value)

        model, plain = sqrt_at_zero_setup()

        def threaded_step() -> torch.Tensor:
            threading.Thread(target=stop.wait, args=(0.5,)).start()
            return plain()

        with pytest.raises(CheckFailed) as info:
            assert_finite_grads(model, threaded_step)
        assert "TL503" in str(info.value)
    finally:
        stop.set()
        pool.shutdown()


def test_a_backward_nan_is_still_named_in_backward():
    model = mlp()
    x, y = batch()

    def step() -> torch.Tensor:
        model.zero_grad()
        out = model(x)
        loss = torch.sqrt((out - out.detach()).abs()).mean() + nn.functional.mse_loss(out, y)
        loss.backward()  # sqrt at 0: finite value, infinite gradient
        return loss

    with pytest.raises(CheckFailed) as info:
        assert_finite_grads(model, step)
    message = str(info.value)
    assert "SqrtBackward0 turned finite gradients into" in message
    assert "The forward pass made it" not in message
    for code in AMP_RULES:
        assert code not in info.value.rules


def test_amp_rules_are_listed_when_the_step_uses_a_scaler_and_autocast():
    model = mlp()
    x, y = batch()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step() -> torch.Tensor:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
            out = out.float()
            # sqrt at 0: a finite loss, an infinite gradient (made in backward)
            loss = torch.sqrt((out - out.detach()).abs()).mean() + nn.functional.mse_loss(out, y)
            scaler.scale(loss).backward()  # TL603: backward under autocast
        return loss

    with pytest.raises(CheckFailed) as info:
        assert_finite_grads(model, step)
    assert "The forward pass made it" not in str(info.value)
    rules = str(info.value).split("Static rules that explain this symptom")[1]
    for code in AMP_RULES:  # confirmed, or listed under "See also"
        assert code in rules, str(info.value)


@pytest.mark.parametrize(
    "returned",
    [
        lambda loss: {"total_loss": loss * float("nan")},
        lambda loss: {"loss": loss, "aux": torch.tensor(float("inf"))},
        lambda loss: (loss, float("nan")),
        lambda loss: {"parts": {"kl": loss * float("nan")}},
        lambda loss: {"logits": torch.full((4, 2), float("nan"))},
    ],
    ids=["total_loss", "aux-tensor", "tuple-number", "nested", "non-scalar"],
)
def test_a_nan_under_any_returned_key_fails(returned):
    s = clean_setup()

    def step():
        return returned(s.step())

    with pytest.raises(CheckFailed, match=r"at step 0") as info:
        assert_finite_grads(s.model, step)
    assert "under [" in str(info.value).splitlines()[0] or "the loss is" in str(info.value)


def test_finite_returned_values_pass():
    s = clean_setup()
    for _ in range(3):
        result = assert_finite_grads(
            s.model, lambda: {"total_loss": s.step(), "acc": 0.5, "n": 3, "name": "x"}, steps=2
        )
        assert result.steps == 2
