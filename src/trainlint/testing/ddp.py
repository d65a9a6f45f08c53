"""``assert_ddp_in_sync``: every DDP rank holds the same parameters after training steps.

DistributedDataParallel keeps replicas identical by averaging gradients across ranks during
``backward()``; every rank then applies the same update. When a rank steps on gradients that
were never averaged (a ``no_sync()`` still on at the optimizer step, a forward that bypasses
the DDP wrapper) or applies a different update (a rank-dependent learning rate or gradient
edit), the replicas drift apart without any error: each rank trains its own model.

The check spawns ``world_size`` processes (the ``spawn`` start method) joined in a process
group: gloo on CPU, or NCCL with one GPU per rank where there are enough GPUs. Each rank
builds the model, the check wraps it in DDP, runs the user's steps, and writes its parameters
to a temporary directory; the parent compares them. With ``make_loader``, each rank also
hashes the first batch it drew, and ranks that drew the same batch fail the check.

Measuring happens in :func:`trainlint.testing._ddp_ranks.rank_main` (in the ranks) and :func:`_measure` (the parent),
diagnosing in :func:`_diagnose`, reporting in :func:`_report`. No torch at import.
"""

from __future__ import annotations

import math
import os
import socket
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.reduction import ForkingPickler
from typing import TYPE_CHECKING, Any, NoReturn

from trainlint._runtime.guard import DEFAULT_TIMEOUT, guarded
from trainlint._runtime.links import Symptom
from trainlint._runtime.report import fail, fmt, symptom_texts, table
from trainlint.testing._common import Step, plural
from trainlint.testing._ddp_ranks import Config, Crash, all_saved, spawn

if TYPE_CHECKING:
    import torch

CHECK = "assert_ddp_in_sync"

SYMPTOMS = {
    "ranks-diverged": Symptom(
        text="The ranks stepped on gradients that were not the same everywhere, or applied "
        "different updates. Common causes: the backward that precedes optimizer.step() "
        "runs under `with ddp_model.no_sync():` (gradient accumulation that never leaves "
        "no_sync on the last micro-batch); the forward goes through the unwrapped module "
        "(`ddp_model.module(x)`, or a model reference kept from before wrapping), so DDP "
        "never averages the gradients; an optimizer built over another copy of the model; "
        "a learning rate, schedule or gradient scaling, clipping or edit that depends on the "
        "rank (only rank 0 clips, a per-rank lr); parameters changed outside backward "
        "(weights edited in place on one rank).",
    ),
    "same-batches": Symptom(
        text="Every rank trains on the same data: use a DistributedSampler "
        "(`DataLoader(ds, sampler=DistributedSampler(ds, num_replicas=world_size, "
        "rank=rank))`, and call `sampler.set_epoch(epoch)` each epoch), or shard the data "
        "by rank yourself. With the same batches on every rank, a world of N ranks does "
        "the work of N and learns what one rank would.",
        explained_by=("TL505",),
        see_also=("TL504",),
    ),
    "same-batches-given": Symptom(
        text="batches= gave every rank the same batch (rank r gets batches[(i * world_size "
        "+ r) % len(batches)] at step i): pass at least world_size different batches. "
        "Ranks that compute the same gradients stay in sync even when nothing syncs them, "
        "so the check could not see a missing sync.",
    ),
}


@dataclass(frozen=True)
class DDPSyncResult:
    """What :func:`assert_ddp_in_sync` measured.

    ``max_difference``: per parameter, the largest |difference| between any rank and rank 0
    (0 everywhere when the ranks are in sync); ``max_change``: per rank, the largest
    |change| of any parameter over the steps (0 means the step never updated the model);
    ``batch_hashes``: per rank, a hash of the first batch it drew (``make_loader``/``batches``
    only, else None).
    """

    world_size: int
    steps: int
    backend: str
    max_difference: dict[str, float]
    max_change: list[float]
    batch_hashes: list[str] | None = None
    differing_ranks: dict[str, list[int]] = field(default_factory=dict)


@guarded(CHECK)
def assert_ddp_in_sync(
    make_model: Callable[[], Any],
    step: Step,
    *,
    world_size: int = 2,
    batches: Sequence[Any] | None = None,
    make_loader: Callable[[int, int], Any] | None = None,
    steps: int = 2,
    backend: str | None = None,
    timeout: float | None = DEFAULT_TIMEOUT,
) -> DDPSyncResult:
    """After ``steps`` DDP training steps on ``world_size`` ranks, all ranks hold identical
    parameters; with ``make_loader``, the ranks drew different batches.

    ``make_model()`` runs on every rank after ``torch.manual_seed(0)`` (the process group is
    already up, so ``torch.distributed.get_rank()`` works in it) and returns the module, or
    a ``(module, optimizer)`` pair whose optimizer holds the module's parameters. The check
    wraps the module in ``DistributedDataParallel`` itself (on GPU, after moving it to
    ``cuda:rank``) and calls, on every rank and for every step,
    ``step(ddp_model, optimizer, rank)``, or ``step(ddp_model, optimizer, batch, rank)`` when
    ``batches`` or ``make_loader`` is given; ``optimizer`` is None when ``make_model``
    returned a module alone. The step does the forward, backward and optimizer step.

    The ranks must see different data, or a missing gradient sync cannot show: with
    ``batches``, rank ``r`` gets ``batches[(i * world_size + r) % len(batches)]`` at step
    ``i``; with ``make_loader(rank, world_size)``, each rank iterates its own loader; without
    either, the step must make its own per-rank data.

    ``make_model``, ``step``, ``make_loader`` and the batches are sent to spawned processes:
    they must be picklable (module-level functions, not lambdas or closures). ``backend``:
    ``"gloo"`` (CPU) or ``"nccl"`` (one GPU per rank); by default NCCL where CUDA has at
    least ``world_size`` GPUs, else gloo. Parameters must match exactly: DDP averages
    gradients to the same bits on every rank.
    """
    __tracebackhide__ = True
    config_args = _arguments(make_model, step, world_size, batches, make_loader, steps, backend)
    with tempfile.TemporaryDirectory(prefix="trainlint-ddp-") as out_dir:
        config = Config(
            make_model=make_model,
            step=step,
            world_size=world_size,
            steps=steps,
            backend=config_args["backend"],
            port=_free_port(),
            out_dir=out_dir,
            timeout=timeout if timeout is not None else DEFAULT_TIMEOUT,
            threads=config_args["threads"],
            seed=0,
            batches=config_args["batches"],
            make_loader=make_loader,
        )
        _check_picklable(config)
        crashed = spawn(config)
        if crashed is not None and crashed.died and all_saved(config):
            crashed = None  # died in gloo's teardown after its work was done and saved
        if crashed is not None:
            _report_crash(crashed, config, step, make_model)
        result = _measure(config)
    data = "loader" if make_loader is not None else "batches" if batches is not None else None
    found = _diagnose(result, data=data)
    if found is None:
        return result
    _report(found, result, step, make_model, make_loader)


# --------------------------------------------------------------------------- arguments


def _arguments(
    make_model: Any,
    step: Any,
    world_size: Any,
    batches: Sequence[Any] | None,
    make_loader: Any,
    steps: Any,
    backend: str | None,
) -> dict[str, Any]:
    import torch

    from trainlint._runtime.arguments import check_count

    check_count("world_size", world_size, 2)
    check_count("steps", steps, 1)
    for name, value in (("make_model", make_model), ("step", step)):
        if not callable(value) or isinstance(value, torch.nn.Module):
            raise TypeError(
                f"{CHECK}: {name} must be a function, got {type(value).__name__}"
                + (" (pass a function that builds the model)" if name == "make_model" else "")
            )
    if batches is not None and make_loader is not None:
        raise ValueError(f"{CHECK}: pass batches= or make_loader=, not both")
    if make_loader is not None and not callable(make_loader):
        raise TypeError(f"{CHECK}: make_loader must be a function (rank, world_size) -> loader")
    batch_list = list(batches) if batches is not None else None
    if batch_list is not None and not batch_list:
        raise ValueError(f"{CHECK}: batches= is empty")
    import torch.distributed as dist

    if not dist.is_available():
        raise RuntimeError(f"{CHECK}: this torch build has no torch.distributed")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend is None:
        backend = "nccl" if gpus >= world_size and dist.is_nccl_available() else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"{CHECK}: backend must be 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl" and (gpus < world_size or not dist.is_nccl_available()):
        raise RuntimeError(
            f"{CHECK}: backend='nccl' needs {world_size} CUDA GPUs with NCCL; "
            f"this machine has {gpus}"
        )
    threads = max(1, min(torch.get_num_threads(), (os.cpu_count() or 1) // world_size))
    return {"backend": backend, "threads": threads, "batches": batch_list}


def _check_picklable(config: Config) -> None:
    for name in ("make_model", "step", "make_loader", "batches"):
        value = getattr(config, name)
        try:
            ForkingPickler.dumps(value)  # what the spawned ranks receive
        except Exception as error:  # noqa: BLE001 - pickling fails with many types
            raise TypeError(
                f"{CHECK}: {name} cannot be sent to the spawned ranks ({error}): define it "
                "as a module-level function (not a lambda, closure or local function) in an "
                "importable module"
            ) from None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# --------------------------------------------------------------------------- measuring


def _difference(a: torch.Tensor, b: torch.Tensor) -> float | None:
    """None when equal (NaN where the other has NaN counts as equal), else the max |a - b|
    (inf for another shape, NaN where only one side is NaN)."""
    import torch

    if a.shape != b.shape:
        return float("inf")
    if a.numel() == 0:
        return None
    a, b = a.double(), b.double()
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    if bool(same.all()):
        return None
    return float((a - b)[~same].abs().max())


def _measure(config: Config) -> DDPSyncResult:
    """Read back every rank's parameters and compare them with rank 0's."""
    import torch

    ranks = []
    for rank in range(config.world_size):
        path = os.path.join(config.out_dir, f"rank{rank}.pt")
        ranks.append(torch.load(path, weights_only=True))
    names: list[str] = ranks[0]["names"]
    max_difference: dict[str, float] = {}
    differing: dict[str, list[int]] = {}
    for j, name in enumerate(names):
        reference = ranks[0]["params"][j]
        worst = 0.0
        for rank in range(1, config.world_size):
            diff = _difference(reference, ranks[rank]["params"][j])
            if diff is None:
                continue
            differing.setdefault(name, []).append(rank)
            worst = diff if math.isnan(diff) or diff > worst else worst
        max_difference[name] = worst
    hashes = [r["batch_hash"] for r in ranks]
    return DDPSyncResult(
        world_size=config.world_size,
        steps=config.steps,
        backend=config.backend,
        max_difference=max_difference,
        max_change=[float(r["change"]) for r in ranks],
        batch_hashes=hashes if any(h is not None for h in hashes) else None,
        differing_ranks=differing,
    )


# --------------------------------------------------------------------------- diagnosing


@dataclass(frozen=True)
class _Found:
    diverged: list[str]
    same_batches: list[list[int]]  # groups of ranks that drew the same first batch
    symptoms: list[str]


def _diagnose(result: DDPSyncResult, *, data: str | None) -> _Found | None:
    diverged = [n for n in result.max_difference if n in result.differing_ranks]
    groups: dict[str, list[int]] = {}
    if data is not None and result.batch_hashes is not None:
        for rank, h in enumerate(result.batch_hashes):
            if h is not None:
                groups.setdefault(h, []).append(rank)
    same = [g for g in groups.values() if len(g) > 1]
    symptoms = ["ranks-diverged"] if diverged else []
    if same:
        symptoms.append("same-batches" if data == "loader" else "same-batches-given")
    if not symptoms:
        return None
    return _Found(diverged, same, symptoms)


# --------------------------------------------------------------------------- reporting


def _report(
    found: _Found,
    result: DDPSyncResult,
    step: Step,
    make_model: Callable[..., Any],
    make_loader: Callable[..., Any] | None,
) -> NoReturn:
    __tracebackhide__ = True
    sections = []
    headlines = []
    where = (
        f"{plural(result.steps, 'step')} on {plural(result.world_size, 'rank')} ({result.backend})"
    )
    if found.diverged:
        first = found.diverged[0]
        ranks = result.differing_ranks[first]
        headlines.append(
            f"ranks hold different parameters after {where}: first {first!r} differs "
            f"between rank 0 and rank{'s' if len(ranks) > 1 else ''} "
            f"{', '.join(str(r) for r in ranks)} by up to {fmt(result.max_difference[first])}"
        )
        rows = [
            [n, ", ".join(f"0 vs {r}" for r in result.differing_ranks[n]), result.max_difference[n]]
            for n in found.diverged
        ]
        sections.append(table(["parameter", "ranks", "max |difference|"], rows))
        sections.append(
            f"{len(found.diverged)} of {len(result.max_difference)} parameters differ. "
            "Largest change over the steps, per rank: "
            + ", ".join(f"rank {r}: {fmt(c)}" for r, c in enumerate(result.max_change))
            + "."
        )
    if found.same_batches:
        groups = "; ".join("ranks " + ", ".join(str(r) for r in g) for g in found.same_batches)
        everyone = len(found.same_batches) == 1 and len(found.same_batches[0]) == result.world_size
        headlines.append(
            (
                "every rank drew the same first batch"
                if everyone
                else f"{groups} drew the same first batch"
            )
            + (" from make_loader(rank, world_size)" if make_loader is not None else "")
        )
        assert result.batch_hashes is not None
        sections.append(
            table(
                ["rank", "first batch hash"],
                [[r, h or "-"] for r, h in enumerate(result.batch_hashes)],
            )
        )
    symptoms = [SYMPTOMS[s] for s in found.symptoms]
    sections += symptom_texts(symptoms)
    sources: list[Callable[..., Any]] = [step, make_model]
    if make_loader is not None:
        sources.append(make_loader)
    fail(
        CHECK, "; and ".join(headlines), sections, symptoms=symptoms, sources=sources, result=result
    )


def _report_crash(
    crash: Crash, config: Config, step: Step, make_model: Callable[..., Any]
) -> NoReturn:
    __tracebackhide__ = True
    who = f"rank {crash.rank}" if crash.rank is not None else "a rank"
    text = crash.text
    if "Traceback" not in text:
        text += (
            "\n(no Python traceback: the rank died while starting, or was killed. A spawned "
            "rank re-imports the script that called the check: guard its entry point with "
            '`if __name__ == "__main__":`; the rank\'s own output above may say more.)'
        )
    last = text.strip().splitlines()[-1] if text.strip() else "an error"
    sections = [
        f"Traceback from {who}:\n" + _indent(text),
        f"When one rank fails the others are stopped (those waiting in a collective would "
        f"otherwise wait for timeout={fmt(config.timeout)} s). make_model, step and "
        "make_loader run in spawned processes: what they use must be importable there.",
    ]
    fail(
        CHECK,
        f"{who} of {config.world_size} ({config.backend}) raised: {last}",
        sections,
        sources=[step, make_model],
    )


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


__all__ = ["DDPSyncResult", "assert_ddp_in_sync"]
