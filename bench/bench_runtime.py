"""What the runtime checks cost, as a ratio to the bare training steps they run.

    python bench/bench_runtime.py [--repeats 30] [--models small,mid,conv] [--threads 1] [--strict]

For each model and check, a bare run (the step called as many times as the check calls it)
and the check alternate ``--repeats`` times; the ratio of each adjacent pair is taken and
the median reported, so drifting clocks and caches hit both sides alike. Targets: 1.15x for
the gradient and weight checks, 1.5x for the memory check. The other checks are listed for
information: step-time and loss checks add almost nothing by design.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from trainlint import testing

TARGETS = {
    "assert_grads_nonzero": 1.15,
    "assert_finite_grads": 1.15,
    "assert_finite_grads(locate=False)": 1.15,
    "assert_weights_updated": 1.15,
    "assert_memory_stable": 1.5,
}


def small_mlp() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    model = nn.Sequential(
        nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)
    )
    return model, torch.randn(32, 64), torch.randint(0, 10, (32,))


def mid_mlp() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    # about 4.5M parameters
    model = nn.Sequential(
        nn.Linear(512, 1536),
        nn.ReLU(),
        nn.Linear(1536, 1536),
        nn.ReLU(),
        nn.Linear(1536, 512),
        nn.ReLU(),
        nn.Linear(512, 10),
    )
    return model, torch.randn(64, 512), torch.randint(0, 10, (64,))


def small_conv() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 8 * 8, 128),
        nn.ReLU(),
        nn.Linear(128, 10),
    )
    return model, torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))


MODELS = {"small": small_mlp, "mid": mid_mlp, "conv": small_conv}


def make_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[Callable[[], Any], Any]:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step() -> torch.Tensor:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return step, optimizer


def cases(
    model: nn.Module, step: Callable[[], Any], optimizer: Any
) -> list[tuple[str, int, Callable[[], Any]]]:
    """(name, number of step calls the check makes, the check run once)."""
    return [
        ("assert_grads_nonzero", 1, lambda: testing.assert_grads_nonzero(model, step)),
        ("assert_finite_grads", 1, lambda: testing.assert_finite_grads(model, step)),
        (
            "assert_finite_grads(locate=False)",
            1,
            lambda: testing.assert_finite_grads(model, step, locate=False),
        ),
        (
            "assert_weights_updated",
            1,
            lambda: testing.assert_weights_updated(model, step, optimizer=optimizer),
        ),
        ("assert_memory_stable", 10, lambda: testing.assert_memory_stable(step)),
        ("assert_step_time_stable", 11, lambda: testing.assert_step_time_stable(step)),
        ("assert_loss_decreases", 20, lambda: _loss_decreases(step)),
    ]


def _loss_decreases(step: Callable[[], Any]) -> None:
    # Any decrease passes: the bench times the passing path (a failure also lints the
    # step's file, which is not what is measured here).
    testing.assert_loss_decreases(step, factor=0.999999)


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def ratio(bare: Callable[[], Any], check: Callable[[], Any], repeats: int) -> tuple[float, float]:
    for _ in range(3):  # warm both paths: allocator, lazy imports, optimizer state
        bare()
        check()
    ratios, bare_times = [], []
    for i in range(repeats):
        if i % 2:  # alternate the order too
            b, c = timed(bare), timed(check)
        else:
            c, b = timed(check), timed(bare)
        ratios.append(c / b)
        bare_times.append(b)
    return statistics.median(ratios), statistics.median(bare_times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--models", default="small,mid,conv")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: on small shared VMs, waking OpenMP "
        "workers adds milliseconds of jitter that drowns what is measured)",
    )
    parser.add_argument(
        "--strict", action="store_true", help="exit 1 when a check is over its target"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"median of {args.repeats} alternating runs"
    )
    print(f"{'model':<6} {'params':>8} {'bare step':>10}  {'check':<34} {'ratio':>6}  target")
    worst = 0.0
    for key in args.models.split(","):
        torch.manual_seed(0)
        model, x, y = MODELS[key]()
        step, optimizer = make_step(model, x, y)
        n_params = sum(p.numel() for p in model.parameters())
        for name, calls, check in cases(model, step, optimizer):

            def bare(calls: int = calls, step: Callable[[], Any] = step) -> None:
                for _ in range(calls):
                    step()

            r, bare_time = ratio(bare, check, args.repeats)
            target = TARGETS.get(name)
            verdict = (
                "" if target is None else (f"<= {target}x " + ("ok" if r <= target else "OVER"))
            )
            print(
                f"{key:<6} {n_params / 1e6:>7.2f}M {bare_time / calls * 1e3:>8.2f}ms  "
                f"{name:<34} {r:>5.2f}x  {verdict}"
            )
            if target is not None:
                worst = max(worst, r / target)
    return 1 if args.strict and worst > 1.0 else 0


if __name__ == "__main__":
    sys.exit(main())
