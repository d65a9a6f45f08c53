"""``assert_ddp_in_sync``: real DDP steps on a gloo process group of two CPU ranks.

The ranks are spawned processes: the models, steps and loaders they run are module-level
functions of this file, which the ranks import.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import trainlint.testing
from trainlint.testing import CheckFailed, DDPSyncResult, assert_ddp_in_sync

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed gloo"
)


def _data(seed: int, n: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=gen)
    return x, x[:, :1] - 0.5 * x[:, 1:2]


BATCHES = [_data(i) for i in range(4)]


def make_model() -> tuple[nn.Module, torch.optim.Optimizer]:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def clean_step(ddp_model, optimizer, batch, rank):
    x, y = batch
    optimizer.zero_grad()
    nn.functional.mse_loss(ddp_model(x), y).backward()
    optimizer.step()


def no_sync_step(ddp_model, optimizer, batch, rank):
    x, y = batch
    optimizer.zero_grad()
    with ddp_model.no_sync():  # accumulation that never syncs the last micro-batch
        nn.functional.mse_loss(ddp_model(x), y).backward()
    optimizer.step()


def rank_lr_step(ddp_model, optimizer, batch, rank):
    for group in optimizer.param_groups:
        group["lr"] = 0.1 * (rank + 1)  # "scaled by rank" by mistake
    clean_step(ddp_model, optimizer, batch, rank)


def unwrapped_forward_step(ddp_model, optimizer, batch, rank):
    x, y = batch
    optimizer.zero_grad()
    # the forward bypasses the wrapper: DDP's reducer is never armed, nothing is averaged
    nn.functional.mse_loss(ddp_model.module(x), y).backward()
    optimizer.step()


def crashing_step(ddp_model, optimizer, batch, rank):
    if rank == 1:
        raise ValueError("bad batch on rank 1")
    clean_step(ddp_model, optimizer, batch, rank)


def hanging_step(ddp_model, optimizer, batch, rank):
    if rank == 1:
        time.sleep(60)
    clean_step(ddp_model, optimizer, batch, rank)


def _dataset() -> TensorDataset:
    x, y = _data(7, n=32)
    return TensorDataset(x, y)


def loader_without_sampler(rank, world_size):
    return DataLoader(_dataset(), batch_size=8)


def shuffling_loader_without_sampler(rank, world_size):
    return DataLoader(_dataset(), batch_size=8, shuffle=True)


def loader_with_sampler(rank, world_size):
    sampler = DistributedSampler(_dataset(), num_replicas=world_size, rank=rank, shuffle=False)
    return DataLoader(_dataset(), batch_size=8, sampler=sampler)


# --------------------------------------------------------------------------- spawning


@pytest.mark.slow  # spawns two gloo ranks
def test_a_clean_ddp_step_passes():
    result = assert_ddp_in_sync(make_model, clean_step, batches=BATCHES)
    assert isinstance(result, DDPSyncResult)
    assert result.world_size == 2 and result.backend == "gloo" and result.steps == 2
    assert set(result.max_difference.values()) == {0.0}
    assert all(c > 0 for c in result.max_change)  # the steps did train


@pytest.mark.slow  # spawns two gloo ranks
def test_no_sync_at_the_optimizer_step_fails_naming_the_parameter():
    with pytest.raises(CheckFailed) as info:
        assert_ddp_in_sync(make_model, no_sync_step, batches=BATCHES)
    message = str(info.value)
    assert "ranks hold different parameters after 2 steps on 2 ranks (gloo)" in message
    assert "first '0.weight' differs between rank 0 and rank 1 by up to" in message
    assert "no_sync()" in message
    result = info.value.result
    assert result.differing_ranks["0.weight"] == [1]
    assert result.max_difference["0.weight"] > 0


@pytest.mark.slow  # spawns two gloo ranks
def test_a_rank_dependent_learning_rate_fails():
    with pytest.raises(CheckFailed, match="ranks hold different parameters") as info:
        assert_ddp_in_sync(make_model, rank_lr_step, batches=BATCHES)
    assert "rank-dependent" in str(info.value) or "depends on the rank" in str(info.value)


@pytest.mark.slow  # spawns two gloo ranks
def test_a_forward_through_the_unwrapped_module_fails():
    with pytest.raises(CheckFailed, match="first '0.weight' differs between rank 0 and rank 1"):
        assert_ddp_in_sync(make_model, unwrapped_forward_step, batches=BATCHES)


@pytest.mark.slow  # spawns two gloo ranks
def test_a_loader_without_a_distributed_sampler_fails_the_batch_check():
    with pytest.raises(CheckFailed) as info:
        assert_ddp_in_sync(make_model, clean_step, make_loader=loader_without_sampler)
    message = str(info.value)
    assert "every rank drew the same first batch" in message
    assert "Every rank trains on the same data: use a DistributedSampler" in message
    assert "ranks hold different parameters" not in message  # the same data keeps them in sync


@pytest.mark.slow  # spawns two gloo ranks
def test_a_shuffling_loader_without_a_sampler_confirms_tl505():
    # Every rank starts from torch's fixed default seed: the "random" orders coincide.
    with pytest.raises(CheckFailed) as info:
        assert_ddp_in_sync(make_model, clean_step, make_loader=shuffling_loader_without_sampler)
    assert "TL505" in info.value.rules


@pytest.mark.slow  # spawns two gloo ranks
def test_a_loader_with_a_distributed_sampler_passes():
    result = assert_ddp_in_sync(make_model, clean_step, make_loader=loader_with_sampler)
    hashes = result.batch_hashes
    assert hashes is not None and len(set(hashes)) == 2


@pytest.mark.slow  # spawns two gloo ranks
def test_an_exception_in_a_rank_fails_with_its_rank_and_traceback():
    with pytest.raises(CheckFailed) as info:
        assert_ddp_in_sync(make_model, crashing_step, batches=BATCHES)
    message = str(info.value)
    assert "rank 1 of 2 (gloo) raised: ValueError: bad batch on rank 1" in message
    assert "Traceback" in message and "in crashing_step" in message


@pytest.mark.slow  # spawns two gloo ranks
def test_a_hanging_rank_times_out_and_the_ranks_are_terminated():
    started = time.monotonic()
    with pytest.raises(CheckFailed, match=r"did not finish within timeout=6 s") as info:
        assert_ddp_in_sync(make_model, hanging_step, batches=BATCHES, timeout=6)
    assert time.monotonic() - started < 20
    assert "Terminated the processes it started" in str(info.value)


@pytest.mark.cuda
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"
)
def test_nccl_on_two_gpus():
    result = assert_ddp_in_sync(make_model, clean_step, batches=BATCHES, backend="nccl")
    assert result.backend == "nccl"
    with pytest.raises(CheckFailed, match="ranks hold different parameters"):
        assert_ddp_in_sync(make_model, no_sync_step, batches=BATCHES, backend="nccl")


# --------------------------------------------------------------------------- arguments


def test_functions_the_ranks_cannot_import_are_refused_up_front():
    with pytest.raises(TypeError, match="step cannot be sent to the spawned ranks"):
        assert_ddp_in_sync(make_model, lambda m, o, b, r: None, batches=BATCHES)


def test_argument_errors():
    with pytest.raises(ValueError, match="not both"):
        assert_ddp_in_sync(make_model, clean_step, batches=BATCHES, make_loader=loader_with_sampler)
    with pytest.raises(ValueError, match="world_size"):
        assert_ddp_in_sync(make_model, clean_step, world_size=1)
    with pytest.raises(TypeError, match="make_model must be a function"):
        assert_ddp_in_sync(nn.Linear(2, 2), clean_step)
    if torch.cuda.device_count() < 2:
        with pytest.raises(RuntimeError, match="needs 2 CUDA GPUs"):
            assert_ddp_in_sync(make_model, clean_step, backend="nccl")


@pytest.mark.slow  # spawns two gloo ranks
def test_the_same_batches_given_to_every_rank_are_diagnosed_without_a_sampler_hint():
    from trainlint.testing import ddp

    result = DDPSyncResult(2, 2, "gloo", {"w": 0.0}, [0.1, 0.1], ["abc", "abc"])
    found = ddp._diagnose(result, data="batches")
    assert found is not None and found.symptoms == ["same-batches-given"]
    assert "at least world_size different batches" in ddp.SYMPTOMS["same-batches-given"].text
    assert ddp._diagnose(result, data=None) is None
    in_sync = DDPSyncResult(2, 2, "gloo", {"w": 0.0}, [0.1, 0.1], ["abc", "def"])
    assert ddp._diagnose(in_sync, data="loader") is None


def test_exported_and_documented():
    assert "assert_ddp_in_sync" in trainlint.testing.__all__
    assert trainlint.testing.assert_ddp_in_sync.__doc__
