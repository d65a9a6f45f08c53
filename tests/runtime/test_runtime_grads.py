"""assert_grads_nonzero, assert_finite_grads, assert_weights_updated on real models.

Every planted bug must fail with a message that names the parameters, their shapes and the
rules that explain the symptom; every clean step must pass, repeatedly.
"""

from __future__ import annotations

import copy
import functools
import pickle
from collections.abc import Callable

import pytest
import torch
from runtime_helpers import batch, clean_setup, mlp
from torch import nn

from trainlint.testing import (
    CheckFailed,
    FiniteGradsResult,
    GradsResult,
    WeightsResult,
    assert_finite_grads,
    assert_grads_nonzero,
    assert_weights_updated,
)
from trainlint.testing._common import runtime

# ----------------------------------------------------------------- assert_grads_nonzero


@pytest.mark.parametrize("seed", range(10))
def test_grads_nonzero_passes_on_a_clean_step(seed):
    s = clean_setup(seed)
    result = assert_grads_nonzero(s.model, s.step, steps=2)
    assert isinstance(result, GradsResult)
    assert set(result.max_abs) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert all(v is not None and v > 0 for vs in result.max_abs.values() for v in vs)
    assert result.shapes["0.weight"] == (16, 8)


@pytest.mark.parametrize("seed", range(10))
def test_grads_nonzero_sees_grads_that_the_step_zeroes_at_its_end(seed):
    model = mlp(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batch(seed)

    def step():
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()  # set_to_none: after the step every .grad is None again

    assert_grads_nonzero(model, step, steps=3)
    assert all(p.grad is None for p in model.parameters())


def test_grads_nonzero_with_batches_calls_step_with_each_batch():
    s = clean_setup()
    seen = []

    def step(b):
        seen.append(b)
        x, y = b
        s.optimizer.zero_grad()
        nn.functional.mse_loss(s.model(x), y).backward()
        s.optimizer.step()

    batches = [batch(1), batch(2)]
    assert_grads_nonzero(s.model, step, steps=3, batches=batches)
    assert [b is batches[i % 2] for i, b in enumerate(seen)] == [True, True, True]


def backward_step(model: nn.Module) -> Callable[[], None]:
    """A step that backpropagates an MSE loss on one batch into ``model`` (no update)."""
    x, y = batch()

    def step() -> None:
        model.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()

    return step


class TwoBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.left = nn.Linear(8, 16)
        self.right = nn.Linear(8, 16)
        self.head = nn.Linear(32, 1)

    def forward(self, x):
        # the planted bug: one branch is cut from the graph
        features = torch.cat([torch.relu(self.left(x)), torch.relu(self.right(x)).detach()], 1)
        return self.head(features)


def test_grads_nonzero_names_the_detached_branch():
    model = TwoBranch()
    step = backward_step(model)
    with pytest.raises(CheckFailed) as info:
        assert_grads_nonzero(model, step)
    message = str(info.value)
    assert "2 of 6 trainable parameters" in message
    assert "right.weight  (16, 8)  None" in message
    assert "right.bias    (16,)    None" in message
    assert "left.weight" not in message
    assert "TL108 graph-broken-loss" in message
    assert "TL105 backward-under-no-grad" in message
    assert info.value.rules[:2] == ("TL108", "TL105")
    assert info.value.check == "assert_grads_nonzero"
    assert isinstance(info.value, AssertionError)


def test_grads_nonzero_finds_a_dead_relu_layer():
    model = mlp()
    with torch.no_grad():
        model[0].bias.fill_(-100.0)  # every pre-activation is negative: the ReLU is dead
    x, y = batch()

    def step():
        model.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()

    with pytest.raises(CheckFailed) as info:
        assert_grads_nonzero(model, step)
    message = str(info.value)
    # numerically zero, not None: the layer is in the graph
    assert "0.weight   (16, 8)  all zero" in message
    assert "0.bias     (16,)    all zero" in message
    assert "2.weight   (1, 16)  all zero" in message
    assert "2.bias" not in message.split("All-zero")[0]
    assert "dead ReLUs" in message
    assert "TL101 grad-norm-after-zero-grad" in message
    result = info.value.result
    assert result.max_abs["0.weight"] == (0.0,)
    assert result.max_abs["2.bias"][0] > 0


@pytest.mark.parametrize("copier", ["deepcopy", "pickle"])
def test_grads_nonzero_when_the_step_trains_a_copy(copier):
    # What a Ray remote or a forked process does: the model arrives as a copy.
    model = mlp()
    x, y = batch()

    def remote_train_step(m):
        m = copy.deepcopy(m) if copier == "deepcopy" else pickle.loads(pickle.dumps(m))
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        nn.functional.mse_loss(m(x), y).backward()
        opt.step()

    with pytest.raises(CheckFailed) as info:
        assert_grads_nonzero(model, lambda: remote_train_step(model))
    message = str(info.value)
    assert "4 of 4 trainable parameters" in message
    assert "No gradient reached any parameter" in message
    for code in ("TL501 module-sent-to-remote", "TL502 module-sent-to-process", "TL107"):
        assert code in message


def test_grads_nonzero_under_no_grad():
    model = mlp()
    x, y = batch()

    def step():
        with torch.no_grad():
            loss = nn.functional.mse_loss(model(x), y)
        loss.requires_grad_(True).backward()  # "fixes" the error, trains nothing

    with pytest.raises(CheckFailed, match="TL105"):
        assert_grads_nonzero(model, step)


def test_grads_nonzero_ignore_and_a_typo_in_ignore():
    model = TwoBranch()
    step = backward_step(model)
    result = assert_grads_nonzero(model, step, ignore=["right"])
    assert result.ignored == ("right.bias", "right.weight")
    assert_grads_nonzero(model, step, ignore=[model.right])
    assert_grads_nonzero(model, step, ignore="right.*")
    with pytest.raises(ValueError, match="matches no parameter"):
        assert_grads_nonzero(model, step, ignore=["rigth"])


def test_grads_nonzero_ignore_takes_a_bare_tensor():
    # `if ignore:` asked the tensor for its truth value: "Boolean value of Tensor with more
    # than one value is ambiguous", and a one-element parameter holding 0 was not ignored
    model = TwoBranch()
    step = backward_step(model)
    with pytest.raises(CheckFailed, match="right.bias"):
        assert_grads_nonzero(model, step, ignore=model.right.weight)
    result = assert_grads_nonzero(model, step, ignore=model.right)
    assert result.ignored == ("right.bias", "right.weight")

    class Gated(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = mlp()
            self.gate = nn.Parameter(torch.zeros(1))  # unused: never gets a gradient

        def forward(self, x):
            return self.body(x)

    gated = Gated()
    gated_step = backward_step(gated)
    assert assert_grads_nonzero(gated, gated_step, ignore=gated.gate).ignored == ("gate",)
    with pytest.raises(CheckFailed, match="gate"):
        assert_grads_nonzero(gated, gated_step)


def test_grads_nonzero_counts_gradients_assigned_directly():
    # The correct Ray pattern: gradients computed elsewhere are copied into .grad.
    model = mlp()
    worker = copy.deepcopy(model)
    x, y = batch()

    def step():
        worker.zero_grad()
        nn.functional.mse_loss(worker(x), y).backward()
        for p, w in zip(model.parameters(), worker.parameters(), strict=True):
            p.grad = w.grad.clone()

    assert_grads_nonzero(model, step)


def test_grads_nonzero_removes_its_hooks():
    s = clean_setup()
    assert_grads_nonzero(s.model, s.step)
    for p in s.model.parameters():
        assert not p._post_accumulate_grad_hooks


def test_grads_nonzero_removes_its_hooks_when_the_step_raises():
    model = mlp()

    def step():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        assert_grads_nonzero(model, step)
    for p in model.parameters():
        assert not p._post_accumulate_grad_hooks


def test_grads_nonzero_rejects_bad_arguments():
    s = clean_setup()
    with pytest.raises(ValueError, match="steps"):
        assert_grads_nonzero(s.model, s.step, steps=0)
    with pytest.raises(TypeError, match="callable"):
        assert_grads_nonzero(s.model, None)
    frozen = mlp()
    frozen.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        assert_grads_nonzero(frozen, s.step)


# ----------------------------------------------------------------- assert_finite_grads


def saturating_bce_setup():
    """Hand-written binary cross-entropy on a saturated sigmoid: log(1 - 1) = log(0)."""
    model = mlp()
    with torch.no_grad():
        model[2].weight.mul_(100.0)
        model[2].bias.fill_(50.0)
    x, _ = batch()
    y = torch.ones(x.shape[0], 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step():
        opt.zero_grad()
        p = torch.sigmoid(model(x))
        loss = -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()
        loss.backward()
        opt.step()
        return loss

    return model, opt, step


@pytest.mark.parametrize("seed", range(10))
def test_finite_grads_passes_on_a_clean_step(seed):
    s = clean_setup(seed, opt="adam")
    result = assert_finite_grads(s.model, s.step, steps=3)
    assert isinstance(result, FiniteGradsResult)
    assert len(result.losses) == 3
    assert all(loss is not None and loss > 0 for loss in result.losses)


def test_finite_grads_names_the_backward_op_and_the_forward_line():
    model, _, step = saturating_bce_setup()
    with pytest.raises(CheckFailed) as info:
        assert_finite_grads(model, step)
    message = str(info.value)
    assert "NaN gradient in `2.bias` at step 0" in message
    assert "LogBackward0 turned finite gradients into NaN" in message
    assert "torch.log(1 - p)" in message  # the forward line that created the op
    assert "test_runtime_grads.py" in message
    assert "TL602 softmax-into-cross-entropy" in message
    # stopped inside backward: the optimizer never applied the NaN
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("user_setting", [False, True])
def test_finite_grads_locates_even_when_the_step_switches_anomaly_detection_off(user_setting):
    model, _, step = saturating_bce_setup()

    def step_without_anomaly():
        torch.autograd.set_detect_anomaly(False)  # "it is slow": the user turned it off
        return step()

    torch.autograd.set_detect_anomaly(user_setting)
    try:
        with pytest.raises(CheckFailed) as info:
            assert_finite_grads(model, step_without_anomaly)
        assert torch.is_anomaly_enabled() is False  # what the step itself left
        torch.autograd.set_detect_anomaly(user_setting)
        with pytest.raises(CheckFailed):
            assert_finite_grads(model, step)
        assert torch.is_anomaly_enabled() is user_setting  # the user's setting, restored
    finally:
        torch.autograd.set_detect_anomaly(False)
    message = str(info.value)
    assert "LogBackward0 turned finite gradients into NaN" in message
    assert "torch.log(1 - p)" in message


def test_finite_grads_names_an_inf_as_inf():
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    x = torch.randn(8, 4)

    def step():
        model.zero_grad()
        out = model(x)
        loss = torch.sqrt(out - out.detach()).sum()  # d sqrt(u)/du at u = 0 is Inf
        loss.backward()
        return loss

    with pytest.raises(CheckFailed) as info:
        assert_finite_grads(model, step)
    message = str(info.value)
    assert "SqrtBackward0 turned finite gradients into Inf" in message
    assert "torch.sqrt(out - out.detach())" in message
    assert "probably" not in message
    # the table's value and the headline agree on what it is
    value = info.value.result.max_abs["bias"][0]
    assert ("NaN gradient" if value != value else "Inf gradient") in message


def test_finite_grads_without_locate_only_records():
    model, _, step = saturating_bce_setup()
    with pytest.raises(CheckFailed) as info:
        assert_finite_grads(model, step, locate=False)
    message = str(info.value)
    assert "LogBackward0" not in message
    assert "locate=True" in message
    assert "2.bias" in message and "nan" in message


def test_finite_grads_reports_the_step_where_nan_appears():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    good = batch()
    bad = (good[0].clone(), good[1].clone())
    bad[0][3, 2] = float("nan")  # one corrupt sample in the third batch

    def step(b):
        x, y = b
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    with pytest.raises(CheckFailed) as info:
        assert_finite_grads(model, step, steps=5, batches=[good, good, bad])
    message = str(info.value)
    assert "at step 2" in message
    # the rerun uses the same (bad) batch, so anomaly mode reproduces the NaN
    assert "MseLossBackward0 turned finite gradients into NaN" in message
    assert info.value.result.steps == 3
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_finite_grads_says_when_the_rerun_does_not_reproduce():
    model = mlp()
    x, y = batch()
    calls = []

    def step():
        calls.append(1)
        model.zero_grad()
        out = model(x)
        if len(calls) == 1:  # only the first call goes wrong: the rerun is clean
            out = out * float("inf")
        loss = nn.functional.mse_loss(out, y)
        loss.backward()
        return loss

    with pytest.raises(CheckFailed) as info:
        assert_finite_grads(model, step)
    assert "did not name an op" in str(info.value)


def test_finite_grads_catches_a_non_finite_loss_with_finite_grads():
    model = mlp()
    x, y = batch()

    def step():
        model.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss + float("inf")

    with pytest.raises(CheckFailed, match="the loss is inf at step 0"):
        assert_finite_grads(model, step)


def test_finite_grads_stop_is_not_swallowed_by_the_step():
    model, opt, inner = saturating_bce_setup()

    def step():
        try:
            return inner()
        except Exception:  # a defensive step must not hide the NaN
            return None

    with pytest.raises(CheckFailed, match="LogBackward0"):
        assert_finite_grads(model, step)


def _nan_at(bad: int, steps: int = 4, after: Callable[[int], None] | None = None):
    """An SGD step whose batch ``bad`` (of ``steps``) makes a NaN in backward, and the
    batches; ``after(i)`` runs at the end of call ``i``."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = batch()
    batches = [(x, y, i == bad) for i in range(steps)]
    calls: list[int] = []

    def step(b):
        calls.append(1)
        x, y, poisoned = b
        opt.zero_grad()
        out = model(x)
        if poisoned:
            out = torch.sqrt(out - out.detach())  # d sqrt(u)/du at u = 0: Inf, then NaN
        loss = nn.functional.mse_loss(out, y)
        loss.backward()
        opt.step()
        if after is not None:
            after(len(calls) - 1)
        return loss

    return model, step, calls, batches


@pytest.mark.parametrize("device_path", [False, True])
@pytest.mark.parametrize("bad", [0, 1, 3])
def test_finite_grads_reruns_the_first_failing_step_from_the_weights_it_began_with(
    bad, device_path, monkeypatch
):
    """Read after the steps, the first failing step is rerun from a copy of the weights it
    began with (kept in row 0 of the copy while no earlier step failed): the op is named,
    and the weights are left as that step found them. One path on the CPU and off it;
    ``device_path``: the gradients measured as CUDA ones are (one engine callback per
    backward)."""
    if device_path:
        rt = runtime()
        recorder = functools.partial(rt.GradRecorder, device_path=True)
        monkeypatch.setattr(rt, "GradRecorder", recorder)
    before: dict[str, torch.Tensor] = {}

    def keep(i: int) -> None:
        if i == bad - 1:
            before.update({n: p.detach().clone() for n, p in model.named_parameters()})

    model, step, calls, batches = _nan_at(bad, after=keep)
    if bad == 0:
        before.update({n: p.detach().clone() for n, p in model.named_parameters()})
    with pytest.raises(CheckFailed) as info:
        assert_finite_grads(model, step, steps=4, batches=batches)
    message = str(info.value)
    assert f"at step {bad}" in message
    assert "SqrtBackward0 turned finite gradients into" in message
    assert info.value.result.steps == bad + 1
    assert len(info.value.result.losses) == bad
    assert len(calls) == 4 + 1  # every step ran, and the rerun
    for name, param in model.named_parameters():
        assert torch.equal(param.detach(), before[name]), name


def test_finite_grads_reports_an_earlier_nan_rather_than_a_later_step_s_error():
    def boom(i: int) -> None:
        if i == 2:
            raise ValueError("NaN weights broke the data pipeline")

    model, step, _, batches = _nan_at(1, after=boom)
    with pytest.raises(CheckFailed, match="at step 1"):
        assert_finite_grads(model, step, steps=4, batches=batches)
    clean = clean_setup()

    def failing():
        clean.step()
        raise ValueError("a plain bug")

    with pytest.raises(ValueError, match="a plain bug"):
        assert_finite_grads(clean.model, failing, steps=2)


def test_finite_grads_cuts_the_record_at_a_non_finite_loss():
    s = clean_setup()
    calls: list[int] = []

    def step():
        calls.append(1)
        loss = s.step()
        return loss + (float("inf") if len(calls) == 2 else 0.0)

    with pytest.raises(CheckFailed, match="the loss is inf at step 1") as info:
        assert_finite_grads(s.model, step, steps=4)
    result = info.value.result
    assert result.steps == 2 and len(result.losses) == 2
    assert all(len(v) == 2 for v in result.max_abs.values())


# ----------------------------------------------------------------- assert_weights_updated


@pytest.mark.parametrize("seed", range(10))
def test_weights_updated_passes_on_a_clean_step(seed):
    s = clean_setup(seed)
    result = assert_weights_updated(s.model, s.step, optimizer=s.optimizer)
    assert isinstance(result, WeightsResult)
    assert all(v > 0 for v in result.change.values())
    assert all(result.got_grad.values())


def test_weights_updated_optimizer_built_before_the_model_was_copied():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model = copy.deepcopy(model)  # the planted bug (TL107)
    x, y = batch()

    def step():
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    with pytest.raises(CheckFailed) as info:
        assert_weights_updated(model, step, optimizer=opt)
    message = str(info.value)
    assert "4 of 4 parameters misbehaved" in message
    assert "0.weight   (16, 8)  did not change  yes             no" in message
    assert "are not in the optimizer: 0.weight, 0.bias, 2.weight, 2.bias" in message
    assert "holds 4 tensors that are not a parameter of this model" in message
    assert "(16, 8), (16,), (1, 16), (1,)" in message
    assert "TL107 optimizer-on-stale-params" in message
    assert message.index("TL107") < message.index("TL102")


def test_weights_updated_model_trained_in_a_remote_copy():
    model = mlp()
    x, y = batch()

    def ray_like_step():
        remote = pickle.loads(pickle.dumps(model))  # what ray.put / .remote() ship
        opt = torch.optim.SGD(remote.parameters(), lr=0.1)
        nn.functional.mse_loss(remote(x), y).backward()
        opt.step()
        return remote  # the trained copy is dropped; the caller's model never moves

    with pytest.raises(CheckFailed) as info:
        assert_weights_updated(model, ray_like_step)
    message = str(info.value)
    assert "Nothing changed and no gradient reached the model" in message
    assert "did not change  no" in message
    lines = message.splitlines()
    rules = [
        ln.split()[0]
        for ln in lines[lines.index(next(ln for ln in lines if ln.startswith("Static"))) + 1 :]
        if ln.startswith("  TL")
    ]
    assert rules[:3] == ["TL501", "TL502", "TL107"]


def test_weights_updated_forgotten_last_layer():
    model = mlp()
    opt = torch.optim.SGD(model[0].parameters(), lr=0.1)  # the head is missing
    x, y = batch()

    def step():
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    with pytest.raises(CheckFailed) as info:
        assert_weights_updated(model, step, optimizer=opt)
    message = str(info.value)
    assert "2 of 4 parameters misbehaved" in message
    assert "2.weight   (1, 16)  did not change  yes             no" in message
    assert "2.bias     (1,)     did not change  yes             no" in message
    assert "0.weight" not in message.split("parameter")[1].split("\n\n")[0]
    assert (
        "2 trainable parameters of the model are not in the optimizer: 2.weight, 2.bias" in message
    )
    assert "got a gradient but did not move" in message


def test_weights_updated_forgotten_layer_fails_even_without_the_optimizer_argument():
    model = mlp()
    opt = torch.optim.SGD(model[0].parameters(), lr=0.1)
    x, y = batch()

    def step():
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    with pytest.raises(CheckFailed, match=r"2\.weight"):
        assert_weights_updated(model, step)


def first_weight_frozen():
    """An MLP whose first weight is frozen (its bias is not), trained by SGD over the
    parameters that still require grad: (model, optimizer, step)."""
    model = mlp()
    model[0].weight.requires_grad_(False)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    x, y = batch()

    def step():
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    return model, opt, step


def test_weights_updated_frozen_parameter_that_moves():
    model, opt, step = first_weight_frozen()  # the bias was forgotten

    with pytest.raises(CheckFailed) as info:
        assert_weights_updated(model, step, frozen=["0"], optimizer=opt)
    message = str(info.value)
    assert "1 of 4 parameters misbehaved" in message
    assert "0.bias     (16,)  frozen but moved by" in message
    assert "Frozen parameters that still require grad are in the optimizer: 0.bias" in message
    assert "0.weight" not in message


def test_weights_updated_frozen_backbone_with_all_parameters_in_the_optimizer():
    # Common and correct: freeze with requires_grad_(False), hand every parameter over.
    model = mlp()
    model[0].requires_grad_(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batch()

    def step():
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    result = assert_weights_updated(model, step, frozen=[model[0]], optimizer=opt)
    assert result.frozen_change == {"0.weight": 0.0, "0.bias": 0.0}
    assert set(result.change) == {"2.weight", "2.bias"}


def test_weights_updated_frozen_takes_a_bare_tensor():
    # `if frozen:` asked the tensor for its truth value: "Boolean value of Tensor with more
    # than one value is ambiguous" before any step ran
    model, opt, step = first_weight_frozen()

    result = assert_weights_updated(model, step, frozen=model[0].weight, optimizer=opt)
    assert result.frozen_change == {"0.weight": 0.0}
    assert set(result.change) == {"0.bias", "2.weight", "2.bias"}
    with pytest.raises(CheckFailed, match="0.bias .* frozen but moved by"):
        assert_weights_updated(model, step, frozen=model[0].bias, optimizer=opt)


def test_weights_updated_lr_zero_is_named():
    s = clean_setup(lr=0.0)
    with pytest.raises(CheckFailed) as info:
        assert_weights_updated(s.model, s.step, optimizer=s.optimizer)
    message = str(info.value)
    assert "Gradients arrived but no parameter moved" in message
    assert "learning rate is 0 in param_groups 0" in message
    assert "TL203" in message


def test_weights_updated_zero_grad_between_backward_and_step():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batch()

    def step():
        nn.functional.mse_loss(model(x), y).backward()
        opt.zero_grad()  # TL102
        opt.step()

    with pytest.raises(CheckFailed, match="TL102 zero-grad-before-step"):
        assert_weights_updated(model, step)


def test_weights_updated_weights_that_became_nan():
    model, opt, step = saturating_bce_setup()
    with pytest.raises(CheckFailed) as info:
        assert_weights_updated(model, step, optimizer=opt)
    message = str(info.value)
    assert "became NaN or Inf" in message
    assert "assert_finite_grads(locate=True)" in message
