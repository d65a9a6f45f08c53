"""The runtime checks on CUDA steps (``-m cuda``; every test skips without a GPU).

CI has no GPU, so these run where one is lent: memory growth seen only by the CUDA
allocator, finite gradients under fp16 autocast, the clip check with a GradScaler.
(Step timing and host syncs on CUDA: test_runtime_clock_choice.py.)
"""

from __future__ import annotations

import pytest
import torch
from runtime_helpers import batch, mlp
from torch import nn

from trainlint.testing import (
    CheckFailed,
    assert_clip_effective,
    assert_finite_grads,
    assert_memory_stable,
)

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def amp_setup(clip_after_step: bool = False, scale_input: float = 1.0):
    """An fp16 autocast step with a GradScaler: unscale, clip, step, update."""
    model = mlp(device="cuda")
    x, y = batch(device="cuda")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0**8)

    def step() -> torch.Tensor:
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):
            loss = nn.functional.mse_loss(model(x * scale_input).float(), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        if not clip_after_step:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        if clip_after_step:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # TL110
        return loss

    return model, step


def test_memory_growth_seen_only_by_cuda_memory_allocated():
    model = mlp(device="cuda")
    x, y = batch(device="cuda")
    kept: list[torch.Tensor] = []

    def step() -> None:
        model.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        kept.append(torch.empty(1 << 20, device="cuda"))  # 4 MiB more each step, no graph

    with pytest.raises(CheckFailed) as info:
        assert_memory_stable(step)
    lines = [line.strip() for line in str(info.value).splitlines()]
    grows = [line.split("  ")[0] for line in lines if line[:1] == "(" and "<- grows" in line]
    assert grows == ["(c) CUDA memory allocated"], str(info.value)


def test_finite_grads_pass_on_a_clean_fp16_autocast_step():
    model, step = amp_setup()
    for _ in range(3):
        result = assert_finite_grads(model, step, steps=3)
        assert all(v is not None and v == v for v in result.losses)


def test_finite_grads_name_an_fp16_forward_overflow():
    model = mlp(device="cuda")
    x, y = batch(device="cuda")

    def step() -> torch.Tensor:
        model.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):
            out = model(x * 1e5)  # past fp16's 65504
        loss = nn.functional.mse_loss(out.float(), y)
        loss.backward()
        return loss

    with pytest.raises(CheckFailed) as info:
        assert_finite_grads(model, step)
    message = str(info.value)
    assert "The forward pass made it" in message
    for code in ("TL601", "TL604"):  # no GradScaler in this step
        assert code not in info.value.rules


def test_clip_check_passes_unscale_then_clip_with_a_grad_scaler():
    model, step = amp_setup()
    for _ in range(3):
        assert_clip_effective(model, step, steps=2)


def test_clip_check_catches_a_clip_after_the_scaler_step():
    model, step = amp_setup(clip_after_step=True)
    with pytest.raises(CheckFailed, match="TL110"):
        assert_clip_effective(model, step)
