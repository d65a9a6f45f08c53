"""assert_clip_effective: clips and norm reads see this step's backward (TL101, TL110)."""

from __future__ import annotations

import pytest
import torch
from runtime_helpers import batch, mlp
from torch import nn

import trainlint.testing
from trainlint.testing import CheckFailed, ClipResult, assert_clip_effective


def setup(order: str, seed: int = 0):
    model = mlp(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = batch(seed)
    norms = []

    def step():
        loss = nn.functional.mse_loss(model(x), y)
        if order == "clean":
            opt.zero_grad()
            loss.backward()
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1))
            opt.step()
        elif order == "TL101":  # the norm is read after zero_grad: always 0
            loss.backward()
            opt.step()
            opt.zero_grad()
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1))
        elif order == "TL110":  # the clip comes after the update it should have limited
            opt.zero_grad()
            loss.backward()
            opt.step()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        return loss

    return model, step


@pytest.mark.parametrize("seed", range(10))
def test_clip_between_backward_and_step_passes(seed):
    model, step = setup("clean", seed)
    result = assert_clip_effective(model, step, steps=3)
    assert isinstance(result, ClipResult)
    assert [r.function for r in result.reads] == ["clip_grad_norm_"] * 3
    assert all(r.after == "backward" and r.seen > 0 for r in result.reads)
    assert all(r.seen == pytest.approx(r.backward) for r in result.reads)


def test_a_norm_read_after_zero_grad_fails_showing_both_norms_and_the_order():
    model, step = setup("TL101")
    with pytest.raises(CheckFailed) as info:
        assert_clip_effective(model, step)
    failure = info.value
    message = str(failure)
    assert "clip_grad_norm_ read the gradients after zero_grad()" in message
    read = failure.result.reads[0]
    assert read.seen == 0 and read.backward is not None and read.backward > 0
    assert "norm it saw" in message and "norm backward produced" in message
    order = message.split("in order:")[1]
    assert order.index("backward") < order.index("SGD.step") < order.index("SGD.zero_grad")
    assert order.index("SGD.zero_grad") < order.index("clip_grad_norm_  (saw 0)")
    assert "TL101 grad-norm-after-zero-grad" in message
    assert "TL110" not in failure.rules


def test_a_norm_read_after_zero_grad_confirms_tl101():
    model, step = setup("TL101")
    with pytest.raises(CheckFailed) as info:
        assert_clip_effective(model, step)
    assert info.value.rules == ("TL101",)


def test_a_clip_after_the_step_fails():
    model, step = setup("TL110")
    with pytest.raises(CheckFailed) as info:
        assert_clip_effective(model, step)
    message = str(info.value)
    assert "clip_grad_norm_ read the gradients after optimizer.step()" in message
    read = info.value.result.reads[0]
    assert read.seen == pytest.approx(read.backward)  # it saw the gradients, too late
    assert "TL110 clip-after-step" in message
    assert "TL101" not in info.value.rules


def test_a_clip_after_the_step_confirms_tl110():
    model, step = setup("TL110")
    with pytest.raises(CheckFailed) as info:
        assert_clip_effective(model, step)
    assert info.value.rules == ("TL110",)


def test_clip_grad_value_and_get_total_norm_are_watched_too():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = batch()

    def step():
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        grads = [p.grad for p in model.parameters()]
        torch.nn.utils.get_total_norm(grads)  # logged before the clip: fine
        torch.nn.utils.clip_grad_value_(model.parameters(), 0.01)
        opt.step()
        model.zero_grad(set_to_none=False)
        torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])

    with pytest.raises(CheckFailed) as info:
        assert_clip_effective(model, step)
    reads = info.value.result.reads
    assert [(r.function, r.after) for r in reads] == [
        ("get_total_norm", "backward"),
        ("clip_grad_value_", "backward"),
        ("get_total_norm", "zero_grad"),
    ]
    # a module's zero_grad is not hooked: the read of 0 after a backward tells it
    assert "zero_grad() or another clear (the gradients read 0)" in str(info.value)


def test_a_clip_imported_before_the_check_is_still_seen():
    from torch.nn.utils import clip_grad_norm_  # bound before the check patches anything

    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = batch()

    def step():
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        clip_grad_norm_(model.parameters(), 0.1)

    with pytest.raises(CheckFailed, match="after optimizer.step"):
        assert_clip_effective(model, step)


def test_gradient_accumulation_passes():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    micro = [batch(i, n=8) for i in range(4)]

    def step():
        opt.zero_grad()
        for x, y in micro:
            (nn.functional.mse_loss(model(x), y) / len(micro)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()

    for _ in range(5):
        assert_clip_effective(model, step, steps=2)


def test_amp_unscale_then_clip_passes():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    # enabled=False off CUDA keeps the same calls (scale, unscale_, step, update)
    scaler = torch.amp.GradScaler("cpu")
    x, y = batch()

    def step():
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.mse_loss(model(x).float(), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        scaler.step(opt)
        scaler.update()

    for _ in range(5):
        assert_clip_effective(model, step, steps=2)


class GAN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.generator = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))
        self.discriminator = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


def gan_step(gan: GAN, late_generator_clip: bool = False):
    opt_g = torch.optim.Adam(gan.generator.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(gan.discriminator.parameters(), lr=1e-3)
    real = torch.randn(16, 8)
    bce = nn.functional.binary_cross_entropy_with_logits

    def step():
        z = torch.randn(16, 4)
        fake = gan.generator(z)
        opt_d.zero_grad()
        d_loss = bce(gan.discriminator(real), torch.ones(16, 1)) + bce(
            gan.discriminator(fake.detach()), torch.zeros(16, 1)
        )
        d_loss.backward()
        torch.nn.utils.clip_grad_norm_(gan.discriminator.parameters(), 1.0)
        opt_d.step()
        opt_g.zero_grad()
        g_loss = bce(gan.discriminator(fake), torch.ones(16, 1))
        g_loss.backward()
        if not late_generator_clip:
            torch.nn.utils.clip_grad_norm_(gan.generator.parameters(), 1.0)
        opt_g.step()
        if late_generator_clip:
            torch.nn.utils.clip_grad_norm_(gan.generator.parameters(), 1.0)

    return step


def test_two_optimizer_gan_steps_pass():
    gan = GAN()
    for _ in range(5):
        result = assert_clip_effective(gan, gan_step(gan), steps=2)
        assert [r.function for r in result.reads] == ["clip_grad_norm_"] * 4


def test_a_gan_whose_generator_clip_comes_late_fails():
    gan = GAN()
    with pytest.raises(CheckFailed) as info:
        assert_clip_effective(gan, gan_step(gan, late_generator_clip=True))
    assert [r.after for r in info.value.result.reads] == ["backward", "step"]
    assert "Adam.step" in str(info.value)


@pytest.mark.parametrize("set_to_none", [True, False])
def test_a_module_zero_grad_before_the_clip_fails_without_patching_module(set_to_none):
    """Module.zero_grad is left alone (a class attribute change of Module costs every
    subclass its attribute caches): a clip that reads 0 where the backward left gradients
    is what tells it."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = batch()
    original = nn.Module.zero_grad
    seen_classes = []

    def step():
        seen_classes.append(nn.Module.__dict__["zero_grad"] is original)
        nn.functional.mse_loss(model(x), y).backward()
        model.zero_grad(set_to_none=set_to_none)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        opt.step()

    with pytest.raises(CheckFailed, match="after zero_grad") as info:
        assert_clip_effective(model, step)
    (read,) = info.value.result.reads
    assert (read.after, read.seen) == ("zero_grad", 0.0)
    assert read.backward > 0
    assert seen_classes == [True]


def test_a_module_zero_grad_at_the_start_of_a_clean_step_passes():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = batch()

    def step():
        model.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        opt.step()

    result = assert_clip_effective(model, step, steps=3)
    assert [r.after for r in result.reads] == ["backward"] * 3


def test_a_step_that_reads_no_gradient_passes_and_hooks_are_removed():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = batch()
    clip = torch.nn.utils.clip_grad_norm_
    zero_grad = torch.optim.Optimizer.zero_grad

    def step():
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    assert assert_clip_effective(model, step).reads == ()
    assert torch.nn.utils.clip_grad_norm_ is clip
    assert torch.optim.Optimizer.zero_grad is zero_grad
    assert not model[0].weight._post_accumulate_grad_hooks


def test_it_is_exported_and_a_fixture(pytester):
    assert "assert_clip_effective" in trainlint.testing.__all__
    pytester.makepyfile("""
        def test_fixture(assert_clip_effective):
            from trainlint.testing import assert_clip_effective as check
            assert assert_clip_effective is check
        """)
    pytester.runpytest().assert_outcomes(passed=1)


def amp_setup(order: str, seed: int = 0, autocast: bool = True):
    """A GradScaler step on the CPU; ``order``: "clean" (unscale_ then clip), "TL601"
    (clip before unscale_), "accumulate" (two backwards, unscale_ and clip under one if)."""
    model = mlp(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    x, y = batch(seed)

    def loss_of(xs, ys):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = model(xs)
        return nn.functional.mse_loss(out.float(), ys)

    def step():
        opt.zero_grad()
        if order == "accumulate":
            for i in range(2):
                loss = loss_of(x[i::2], y[i::2])
                scaler.scale(loss / 2).backward()
                if i == 1:
                    scaler.unscale_(opt)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                    scaler.step(opt)
                    scaler.update()
            return loss
        loss = loss_of(x, y)
        scaler.scale(loss).backward()
        if order == "clean":
            scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        scaler.step(opt)
        scaler.update()
        return loss

    return model, step


@pytest.mark.parametrize("autocast", [True, False])
def test_a_clip_before_unscale_fails_naming_tl601_with_the_scale_factor(autocast):
    model, step = amp_setup("TL601", autocast=autocast)
    with pytest.raises(CheckFailed) as info:
        assert_clip_effective(model, step, steps=2)
    failure = info.value
    message = str(failure)
    assert "clip_grad_norm_ read the gradients before scaler.unscale_()" in message
    assert "TL601" in failure.rules
    assert "scale factor after the last step: 65536" in message
    assert "1. AdamW.zero_grad\n  2. GradScaler.scale\n  3. backward\n  4. clip_grad_norm_" in (
        message
    )
    assert all(r.scaled and r.after == "backward" for r in failure.result.reads)
    assert failure.result.scale == 65536.0


@pytest.mark.parametrize("seed", range(5))
def test_unscale_then_clip_passes(seed):
    model, step = amp_setup("clean", seed)
    result = assert_clip_effective(model, step, steps=3)
    assert [r.scaled for r in result.reads] == [False] * 3
    assert all(r.after == "backward" for r in result.reads)
    assert "GradScaler.unscale_(AdamW)" in result.reads[0].order
    assert result.scale is None


def test_accumulation_with_unscale_and_clip_under_one_if_passes():
    model, step = amp_setup("accumulate")
    result = assert_clip_effective(model, step, steps=3)
    assert [r.scaled for r in result.reads] == [False] * 3


def test_a_step_without_a_scaler_is_unaffected_and_the_scaler_is_restored():
    methods = {n: getattr(torch.amp.GradScaler, n) for n in ("scale", "unscale_", "step")}
    model, step = setup("clean")
    result = assert_clip_effective(model, step, steps=2)
    assert [r.scaled for r in result.reads] == [False, False] and result.scale is None
    assert not any("GradScaler" in e for r in result.reads for e in r.order)
    assert {n: getattr(torch.amp.GradScaler, n) for n in methods} == methods
    assert "update" not in vars(torch.cuda.amp.GradScaler)  # patched on the base only
