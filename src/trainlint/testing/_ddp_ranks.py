"""The rank side of :func:`trainlint.testing.assert_ddp_in_sync`: spawning the ranks and
what each rank runs (join the group, wrap the model in DDP, run the steps, save the
parameters). Kept apart from the parent's measuring and reporting; the spawned ranks
import this module.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainlint.testing._common import Step

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Config:
    """What every rank needs; pickled into the spawned processes."""

    make_model: Callable[..., Any]
    step: Step
    world_size: int
    steps: int
    backend: str
    port: int
    out_dir: str
    timeout: float
    threads: int
    seed: int
    batches: list[Any] | None
    make_loader: Callable[[int, int], Any] | None


@dataclass(frozen=True)
class Crash:
    rank: int | None
    text: str
    died: bool = False  # killed by a signal or exited nonzero, no Python exception


def spawn(config: Config) -> Crash | None:
    """Run the ranks to the end; what the first one that failed raised, or None."""
    __tracebackhide__ = True
    import torch.multiprocessing as mp

    context = mp.start_processes(
        rank_main, args=(config,), nprocs=config.world_size, join=False, start_method="spawn"
    )
    crash: Crash | None = None
    try:
        while not context.join(timeout=0.5):
            pass
    except mp.ProcessRaisedException as error:
        crash = Crash(error.error_index, _child_traceback(str(error)))
    except mp.ProcessExitedException as error:
        crash = Crash(error.error_index, str(error), died=True)
    finally:
        for process in context.processes:
            if process.is_alive():
                process.terminate()
                process.join(2.0)
    return _first_failure(config, crash)


def _record_failure(config: Config, rank: int) -> None:
    import time
    import traceback

    path = os.path.join(config.out_dir, f"rank{rank}.failed")
    with contextlib.suppress(OSError), open(path, "w", encoding="utf-8") as f:
        f.write(f"{time.time()!r}\n{traceback.format_exc()}")


def _first_failure(config: Config, crash: Crash | None) -> Crash | None:
    """The failure of the rank that failed first (torch reports whichever process it
    looked at first, often a peer that only lost its connection to the failing rank)."""
    if crash is None:
        return None
    failed = []
    for rank in range(config.world_size):
        path = os.path.join(config.out_dir, f"rank{rank}.failed")
        with contextlib.suppress(OSError, ValueError), open(path, encoding="utf-8") as f:
            stamp, _, text = f.read().partition("\n")
            failed.append((float(stamp), rank, text.rstrip()))
    if not failed:
        return crash
    _, rank, text = min(failed)
    return crash if rank == crash.rank else Crash(rank, text)


def all_saved(config: Config) -> bool:
    return all(
        os.path.exists(os.path.join(config.out_dir, f"rank{rank}.pt"))
        for rank in range(config.world_size)
    )


def _child_traceback(message: str) -> str:
    # "\n\n-- Process 1 terminated with the following error:\nTraceback ..."
    head, sep, rest = message.partition("terminated with the following error:\n")
    return rest.rstrip() if sep else message.strip()


def rank_main(rank: int, config: Config) -> None:
    """One rank: join the group, build and wrap the model, run the steps, save parameters."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(config.port)
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(config.world_size)
    os.environ["LOCAL_RANK"] = str(rank)
    torch.set_num_threads(config.threads)
    dist.init_process_group(
        config.backend,
        rank=rank,
        world_size=config.world_size,
        timeout=timedelta(seconds=config.timeout),
    )
    try:
        torch.manual_seed(config.seed)
        made = config.make_model()
        model, optimizer = made if isinstance(made, tuple) else (made, None)
        if not isinstance(model, torch.nn.Module):
            raise TypeError(
                f"make_model() must return a torch.nn.Module or (module, optimizer), got "
                f"{type(made).__name__}"
            )
        if config.backend == "nccl":
            torch.cuda.set_device(rank)
            device: torch.device = torch.device("cuda", rank)
            model.to(device)
            ddp_model = DistributedDataParallel(model, device_ids=[rank])
        else:
            device = torch.device("cpu")
            ddp_model = DistributedDataParallel(model)
        names = [n for n, _ in model.named_parameters()]
        before = [p.detach().clone() for p in model.parameters()]
        first_hash = None
        draw = _batch_source(config, rank)
        for i in range(config.steps):
            if draw is None:
                config.step(ddp_model, optimizer, rank)
                continue
            batch = _to_device(draw(i), device)
            if i == 0:
                first_hash = _batch_hash(batch)
            config.step(ddp_model, optimizer, batch, rank)
        params = [p.detach() for p in model.parameters()]
        change = max(
            (float((p - b).abs().max()) for p, b in zip(params, before, strict=True) if p.numel()),
            default=0.0,
        )
        torch.save(
            {
                "names": names,
                "params": [p.cpu() for p in params],
                "change": change,
                "batch_hash": first_hash,
            },
            os.path.join(config.out_dir, f"rank{rank}.part"),
        )
        # complete or absent: the parent trusts a saved result even if teardown then fails
        os.replace(
            os.path.join(config.out_dir, f"rank{rank}.part"),
            os.path.join(config.out_dir, f"rank{rank}.pt"),
        )
        # Teardown is where gloo aborts ("terminate called without an active exception",
        # SIGABRT, seen on a loaded 2-core CI machine): a rank that destroys its group while
        # its peer still talks to it, or C++ worker threads still holding work when the
        # interpreter finalizes. So: wait for every rank, drop DDP's reducer before its
        # group, destroy the group, and leave without finalizing; the result is on disk.
        dist.barrier()
        del ddp_model
        dist.destroy_process_group()
    except BaseException:
        # The first rank to fail is the cause; its peers then fail in a collective
        # ("Connection closed by peer"). Stamp the time so the parent can tell them apart.
        _record_failure(config, rank)
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
        raise
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _batch_source(config: Config, rank: int) -> Callable[[int], Any] | None:
    if config.batches is not None:
        batches, ws = config.batches, config.world_size
        return lambda i: batches[(i * ws + rank) % len(batches)]
    if config.make_loader is not None:
        loader = config.make_loader(rank, config.world_size)
        state = {"it": iter(loader)}

        def draw(i: int) -> Any:
            try:
                return next(state["it"])
            except StopIteration:
                state["it"] = iter(loader)
                return next(state["it"])

        return draw
    return None


def _to_device(batch: Any, device: torch.device) -> Any:
    import torch

    if device.type == "cpu":
        return batch
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch


def _batch_hash(batch: Any) -> str:
    """A hash of a batch's contents (tensors by dtype, shape and bytes; the rest by repr)."""
    import torch

    digest = hashlib.sha256()

    def feed(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            digest.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            flat = t.reshape(-1)
            # no numpy (the CPU wheel does not need it): the leading values and a checksum
            # tell two ranks' batches apart
            digest.update(repr(flat[:4096].tolist()).encode())
            if flat.numel() > 4096 and not flat.is_complex():
                digest.update(repr(flat.double().sum().item()).encode())
        elif isinstance(value, (list, tuple)):
            digest.update(f"L{len(value)}".encode())
            for v in value:
                feed(v)
        elif isinstance(value, dict):
            digest.update(f"D{len(value)}".encode())
            for k in value:
                feed(k)
                feed(value[k])
        else:
            digest.update(repr(value).encode())

    feed(batch)
    return digest.hexdigest()[:16]
