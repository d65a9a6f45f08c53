"""``assert_thread_safe``: gradients computed on several threads equal the sequential ones."""

from __future__ import annotations

import math
import os
import random
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

from trainlint._runtime.guard import DEFAULT_TIMEOUT, guarded
from trainlint._runtime.links import Symptom
from trainlint._runtime.report import fail, table
from trainlint.testing._common import trainable

if TYPE_CHECKING:
    import torch

CHECK = "assert_thread_safe"

SYMPTOMS = {
    "thread-unsafe": Symptom(
        ("TL503", "TL304"),
        text="Threads that share one model race on whatever a forward or backward writes to "
        "shared state: attributes a module sets on self during forward, buffers, an "
        "optimizer step. Give each thread its own model replica, or hold a lock around "
        "forward, backward and step.",
    ),
}

_ThreadError = tuple[int, BaseException, str]


@dataclass(frozen=True)
class ThreadSafetyResult:
    """What :func:`assert_thread_safe` measured: max |threaded - sequential| per gradient."""

    threads: int
    batches: int
    max_abs_diff: dict[str, float] = field(default_factory=dict)
    rounds: int = 1


@guarded(CHECK)
def assert_thread_safe(
    model: torch.nn.Module,
    step: Callable[[Any], Any],
    batches: Iterable[Any],
    *,
    threads: int = 4,
    rtol: float = 1e-4,
    atol: float | None = None,
    rounds: int = 200,
    max_seconds: float = 3.0,
    timeout: float | None = DEFAULT_TIMEOUT,
) -> ThreadSafetyResult:
    """Computing gradients on several threads gives what computing them in sequence gives.

    ``step(batch)`` runs forward and backward for one batch (no optimizer step). The
    batches are run one after another, then spread over ``threads`` threads started
    together (with a short interpreter switch interval, so races show up), for up to
    ``rounds`` rounds or ``max_seconds``, the batches shuffled over the threads each round,
    stopping at the first round that diverges; the gradients
    accumulated in ``.grad`` must match within ``rtol`` (and ``atol``, by default ``rtol``
    times the largest sequential gradient of each parameter) and be finite. The model's
    parameters, buffers and gradients are restored afterwards.
    """
    __tracebackhide__ = True
    from trainlint._runtime.arguments import check_count, check_model, check_step

    check_model(CHECK, model, step)
    check_count("threads", threads, 2)
    check_step(CHECK, step, batches=True)
    batch_list = list(batches)
    if len(batch_list) < 2:
        raise ValueError("assert_thread_safe needs at least two batches")
    n_threads = min(threads, len(batch_list))
    named = trainable(model)
    check_count("rounds", rounds, 1)

    def diverged(
        threaded: list[torch.Tensor | None], sequential: list[torch.Tensor | None]
    ) -> bool:
        return bool(_diagnose(named, sequential, threaded, rtol, atol)[0])

    sequential, threaded, errors, ran = _measure(
        model, named, step, batch_list, n_threads, rounds, max_seconds, diverged
    )
    rows, diffs = _diagnose(named, sequential, threaded, rtol, atol)
    result = ThreadSafetyResult(
        threads=n_threads, batches=len(batch_list), max_abs_diff=diffs, rounds=ran
    )
    if not rows and not errors:
        return result
    _report(rows, errors, n_threads, result, step)


def _measure(
    model: torch.nn.Module,
    named: list[tuple[str, torch.Tensor]],
    step: Callable[[Any], Any],
    batch_list: list[Any],
    n_threads: int,
    rounds: int,
    max_seconds: float,
    diverged: Callable[[list[Any], list[Any]], bool],
) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None], list[_ThreadError], int]:
    """The gradients of running every batch in sequence, then on threads, and what raised.

    A race shows up only in some interleavings, so the threaded run is repeated (up to
    ``rounds`` times, or ``max_seconds``), each round with the batches shuffled over the
    threads, and stops at the first round whose gradients diverge or whose threads raise.
    Every run starts from the same state and the model is left as it was found.
    """
    __tracebackhide__ = True
    import torch

    params = [p for _, p in named]
    state = [*model.parameters(), *model.buffers()]
    snapshot = [t.detach().clone() for t in state]
    grads_before = [p.grad for p in params]

    def restore() -> None:
        with torch.no_grad():
            for tensor, saved in zip(state, snapshot, strict=True):
                tensor.copy_(saved)
        for p in params:
            p.grad = None

    try:
        restore()
        for batch in batch_list:
            step(batch)
        sequential = [p.grad for p in params]
        saved_of = {id(t): s for t, s in zip(state, snapshot, strict=True)}
        with torch.no_grad():
            moved = [n for n, p in named if not torch.equal(p, saved_of[id(p)])]
        if moved:
            raise ValueError(
                "step(batch) changed the parameters (" + ", ".join(moved[:5]) + "): "
                "assert_thread_safe compares gradients, so pass a step that runs forward and "
                "backward without an optimizer step"
            )
        order = list(batch_list)
        shuffle = random.Random(0).shuffle
        deadline = time.monotonic() + max_seconds
        ran = 0
        while True:
            restore()
            errors = _run_threads(step, order, n_threads)
            threaded = [p.grad for p in params]
            ran += 1
            if errors or diverged(threaded, sequential):
                break
            if ran >= rounds or time.monotonic() > deadline:
                break
            shuffle(order)
    finally:
        restore()
        for p, g in zip(params, grads_before, strict=True):
            p.grad = g
    return sequential, threaded, errors, ran


def _diagnose(
    named: list[tuple[str, torch.Tensor]],
    sequential: list[torch.Tensor | None],
    threaded: list[torch.Tensor | None],
    rtol: float,
    atol: float | None,
) -> tuple[list[tuple[Any, ...]], dict[str, float]]:
    """A row per gradient that differs or is not finite, and max |diff| per parameter."""
    import torch

    rows: list[tuple[Any, ...]] = []
    diffs: dict[str, float] = {}
    with torch.no_grad():
        for (name, param), seq, thr in zip(named, sequential, threaded, strict=True):
            if seq is None and thr is None:
                continue
            if seq is None or thr is None:
                which = "sequential" if seq is None else "threaded"
                rows.append((name, tuple(param.shape), "-", "-", f"no gradient in the {which} run"))
                diffs[name] = math.inf
                continue
            scale = float(seq.abs().max()) if seq.numel() else 0.0
            diff = float((thr - seq).abs().max()) if seq.numel() else 0.0
            diffs[name] = diff
            finite = bool(torch.isfinite(thr).all()) and bool(torch.isfinite(seq).all())
            tol_abs = atol if atol is not None else rtol * scale
            close = bool(((thr - seq).abs() <= tol_abs + rtol * seq.abs()).all())
            if not finite:
                rows.append((name, tuple(param.shape), scale, diff, "not finite"))
            elif not close:
                rows.append((name, tuple(param.shape), scale, diff, "differs"))
    return rows, diffs


def _report(
    rows: list[tuple[Any, ...]],
    errors: list[_ThreadError],
    n_threads: int,
    result: ThreadSafetyResult,
    step: Callable[[Any], Any],
) -> NoReturn:
    __tracebackhide__ = True
    sections = []
    if rows:
        sections.append(
            table(("parameter", "shape", "max |grad| (sequential)", "max |diff|", "problem"), rows)
        )
    if errors:
        sections.append(_thread_errors(errors, n_threads))
    symptom = SYMPTOMS["thread-unsafe"]
    sections.append(symptom.text)
    fail(
        CHECK,
        f"gradients computed on {n_threads} threads differ from the sequential ones"
        if rows
        else f"{len(errors)} of {n_threads} threads raised",
        sections,
        symptoms=[symptom],
        sources=[step],
        result=result,
    )


def _thread_errors(errors: list[_ThreadError], n_threads: int) -> str:
    """One line per distinct error, with the threads that raised it and where."""
    from trainlint._runtime.lintlink import display_path

    groups: dict[str, list[int]] = {}
    where: dict[str, str] = {}
    for index, error, _ in errors:
        text = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        if len(text) > 160:
            text = text[:157] + "..."
        groups.setdefault(text, []).append(index)
        frames = [
            f
            for f in traceback.extract_tb(error.__traceback__)
            if f"{os.sep}torch{os.sep}" not in f.filename and f.name != "work"
        ]
        if frames and text not in where:
            frame = frames[-1]
            where[text] = f" (at {display_path(frame.filename)}:{frame.lineno})"
    lines = []
    for text, threads in groups.items():
        which = ", ".join(str(i) for i in sorted(threads))
        lines.append(
            f"{len(threads)} of {n_threads} threads (thread {which}) raised {text}"
            f"{where.get(text, '')}"
        )
    return "\n".join(lines)


def _run_threads(
    step: Callable[[Any], Any], batches: list[Any], n_threads: int
) -> list[_ThreadError]:
    barrier = threading.Barrier(n_threads)
    errors: list[_ThreadError] = []

    def work(index: int) -> None:
        try:
            barrier.wait()
            for batch in batches[index::n_threads]:
                step(batch)
        except BaseException as error:  # noqa: BLE001 - reported in the failure
            errors.append((index, error, traceback.format_exc()))

    workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(n_threads)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often, so interleavings actually happen
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        sys.setswitchinterval(interval)
    return errors
