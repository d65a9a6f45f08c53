"""What the runtime checks cost, as a ratio to the bare training steps they run.

    python bench/bench_runtime.py [--repeats 15] [--models small,mid,conv] [--threads 1] [--strict]

For each model and check, a bare run (the step called as many times as the check calls it)
and the check alternate ``--repeats`` times, in alternating order; each sample repeats its
side enough times to take ~20 ms, so that a sub-millisecond step is measured over many
calls. Times are this process's CPU time (``time.process_time``), which other processes on
a shared machine do not inflate; the ratio of each adjacent pair is taken and the median
reported with the spread (lower-upper quartile), and the overhead per step in ms
(median of check minus bare, divided by the steps the check runs). Targets: 1.15x for the
gradient, weight and clip checks, 1.5x for the memory check. The other checks are listed
for information: step-time and loss checks add almost nothing by design.

A check traces the project functions its step runs once per step function (for the
failure message's lint findings); ``(new step)`` rows give every check call a new step
function, so they include that one-time cost.
"""

from __future__ import annotations

import argparse
import contextlib
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
    "assert_clip_effective": 1.15,
    "assert_memory_stable": 1.5,
}
SAMPLE_S = 0.02  # CPU seconds each side of a pair runs for, at least


def small_mlp() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    model = nn.Sequential(
        nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)
    )
    return model, torch.randn(32, 64), torch.randint(0, 10, (32,))


def mid_mlp() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    # about 4M parameters
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


def make_step(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, clip: bool = False
) -> tuple[Callable[[], Any], Any]:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step() -> torch.Tensor:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if clip:
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss

    return step, optimizer


Case = tuple[str, Callable[[], Any], int, Callable[[], Any]]


def cases(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[Case]:
    """(name, the bare step, number of step calls the check makes, the check run once)."""
    step, optimizer = make_step(model, x, y)
    clip_step, _ = make_step(model, x, y, clip=True)

    def new_step() -> Callable[[], Any]:
        return lambda: step()  # a new function: its first check traces it

    return [
        ("assert_grads_nonzero", step, 1, lambda: testing.assert_grads_nonzero(model, step)),
        ("assert_finite_grads", step, 1, lambda: testing.assert_finite_grads(model, step)),
        (
            "assert_finite_grads(locate=False)",
            step,
            1,
            lambda: testing.assert_finite_grads(model, step, locate=False),
        ),
        (
            "assert_weights_updated",
            step,
            1,
            lambda: testing.assert_weights_updated(model, step, optimizer=optimizer),
        ),
        (
            "assert_clip_effective",
            clip_step,
            1,
            lambda: testing.assert_clip_effective(model, clip_step),
        ),
        ("assert_memory_stable", step, 10, lambda: testing.assert_memory_stable(step)),
        (
            "assert_grads_nonzero (new step)",
            step,
            1,
            lambda: testing.assert_grads_nonzero(model, new_step()),
        ),
        (
            "assert_weights_updated (new step)",
            step,
            1,
            lambda: testing.assert_weights_updated(model, new_step(), optimizer=optimizer),
        ),
        ("assert_step_time_stable", step, 11, lambda: _info(testing.assert_step_time_stable, step)),
        ("assert_loss_decreases", step, 20, lambda: _info(_loss_decreases, step)),
    ]


def _info(check: Callable[..., Any], step: Callable[[], Any]) -> None:
    # a timing check may fail on a noisy machine; the cost is what is measured here
    with contextlib.suppress(testing.CheckFailed):
        check(step)


def _loss_decreases(step: Callable[[], Any]) -> None:
    # Any decrease passes: the bench times the passing path (a failure also lints the
    # step's file, which is not what is measured here).
    testing.assert_loss_decreases(step, factor=0.999999)


def timed(fn: Callable[[], Any], times: int) -> float:
    start = time.process_time()
    for _ in range(times):
        fn()
    return (time.process_time() - start) / times


def measure(
    bare: Callable[[], Any], check: Callable[[], Any], repeats: int
) -> tuple[list[float], list[float], list[float]]:
    """Per pair: check/bare ratio, check - bare (s), bare (s); one call of each."""
    for _ in range(3):  # warm both paths: allocator, lazy imports, optimizer state
        bare()
        check()
    times = max(1, round(SAMPLE_S / max(timed(bare, 1), timed(check, 1), 1e-6)))
    ratios, extra, bare_times = [], [], []
    for i in range(repeats):
        if i % 2:  # alternate the order too
            b, c = timed(bare, times), timed(check, times)
        else:
            c, b = timed(check, times), timed(bare, times)
        ratios.append(c / b)
        extra.append(c - b)
        bare_times.append(b)
    return ratios, extra, bare_times


def quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 4:
        return min(values), max(values)
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--models", default="small,mid,conv")
    parser.add_argument("--checks", default="", help="comma-separated names (default: all)")
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
    wanted = {c.strip() for c in args.checks.split(",") if c.strip()}

    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, process CPU time, "
        f"median of {args.repeats} alternating pairs [quartiles]"
    )
    print(
        f"{'model':<6} {'params':>7} {'bare step':>9}  {'check':<34} "
        f"{'ratio':>5} {'[spread]':<13} {'+ms/step':>8}  target"
    )
    worst = 0.0
    for key in args.models.split(","):
        names = [case[0] for case in cases(*MODELS[key]())]
        for index, name in enumerate(names):
            if wanted and name not in wanted:
                continue
            # a fresh model per check: thousands of steps on one batch converge, and a
            # check that then fails (the loss check) would time its failure message
            torch.manual_seed(0)
            model, x, y = MODELS[key]()
            n_params = sum(p.numel() for p in model.parameters())
            _, step, calls, check = cases(model, x, y)[index]

            def bare(calls: int = calls, step: Callable[[], Any] = step) -> None:
                for _ in range(calls):
                    step()

            ratios, extra, bare_times = measure(bare, check, args.repeats)
            r = statistics.median(ratios)
            low, high = quartiles(ratios)
            target = TARGETS.get(name)
            verdict = (
                "" if target is None else (f"<= {target}x " + ("ok" if r <= target else "OVER"))
            )
            print(
                f"{key:<6} {n_params / 1e6:>6.2f}M {statistics.median(bare_times) / calls * 1e3:>7.2f}ms  "
                f"{name:<34} {r:>5.2f}x [{low:.2f}-{high:.2f}]  "
                f"{statistics.median(extra) / calls * 1e3:>+7.3f}  {verdict}",
                flush=True,
            )
            if target is not None:
                worst = max(worst, r / target)
    return 1 if args.strict and worst > 1.0 else 0


if __name__ == "__main__":
    sys.exit(main())
