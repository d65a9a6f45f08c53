"""trainlint's pytest plugin (the ``pytest11`` entry point).

It provides one fixture per runtime check in :mod:`trainlint.testing`, each returning that
check, and ``train_device``, parametrized over ``"cpu"`` and ``"cuda"``; and the
``--trainlint`` confirmation report, whose state lives in :mod:`trainlint.confirm`. The plugin
is loaded into every pytest session of every environment trainlint is installed in, torch or
not, so it stays thin: nothing heavy is imported here, torch only inside a fixture that needs
it, and coverage and the linter only when ``--trainlint`` is on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # The cuda case of `train_device` carries this marker so `-m "not cuda"` deselects it;
    # registering it here keeps `--strict-markers` projects working without their own entry.
    config.addinivalue_line("markers", "cuda: needs a CUDA device; skipped without one")
    if config.getoption("trainlint", default=False) or config.getini("trainlint"):
        # Imported only now: without the option nothing is traced and nothing more loaded.
        from trainlint.confirm import register

        register(config)


def _check(name: str) -> Callable[..., Any]:
    import importlib.util

    missing = None
    try:  # find torch without importing it: the check imports it when it runs
        if importlib.util.find_spec("torch") is None:
            missing = "No module named 'torch'"
    except (ImportError, ValueError) as exc:
        missing = str(exc)
    if missing is not None:
        pytest.fail(
            f"`{name}` runs real training steps and needs torch, which cannot be imported "
            f"here ({missing}): pip install 'trainlint[runtime]' (or the torch build you use)",
            pytrace=False,
        )
    from trainlint import testing

    check: Callable[..., Any] = getattr(testing, name)
    return check


@pytest.fixture
def assert_grads_nonzero() -> Callable[..., Any]:
    """:func:`trainlint.testing.assert_grads_nonzero`."""
    return _check("assert_grads_nonzero")


@pytest.fixture
def assert_finite_grads() -> Callable[..., Any]:
    """:func:`trainlint.testing.assert_finite_grads`."""
    return _check("assert_finite_grads")


@pytest.fixture
def assert_weights_updated() -> Callable[..., Any]:
    """:func:`trainlint.testing.assert_weights_updated`."""
    return _check("assert_weights_updated")


@pytest.fixture
def assert_memory_stable() -> Callable[..., Any]:
    """:func:`trainlint.testing.assert_memory_stable`."""
    return _check("assert_memory_stable")


@pytest.fixture
def assert_no_graph_in_eval() -> Callable[..., Any]:
    """:func:`trainlint.testing.assert_no_graph_in_eval`."""
    return _check("assert_no_graph_in_eval")


@pytest.fixture
def assert_step_time_stable() -> Callable[..., Any]:
    """:func:`trainlint.testing.assert_step_time_stable`."""
    return _check("assert_step_time_stable")


@pytest.fixture
def assert_lr_schedule() -> Callable[..., Any]:
    """:func:`trainlint.testing.assert_lr_schedule`."""
    return _check("assert_lr_schedule")


@pytest.fixture
def assert_loss_decreases() -> Callable[..., Any]:
    """:func:`trainlint.testing.assert_loss_decreases`."""
    return _check("assert_loss_decreases")


@pytest.fixture
def assert_clip_effective() -> Callable[..., Any]:
    """:func:`trainlint.testing.assert_clip_effective`."""
    return _check("assert_clip_effective")


@pytest.fixture
def assert_ddp_in_sync() -> Callable[..., Any]:
    """:func:`trainlint.testing.assert_ddp_in_sync`."""
    return _check("assert_ddp_in_sync")


@pytest.fixture
def assert_thread_safe() -> Callable[..., Any]:
    """:func:`trainlint.testing.assert_thread_safe`."""
    return _check("assert_thread_safe")


@pytest.fixture(
    params=[pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.cuda)]
)
def train_device(request: pytest.FixtureRequest) -> str:
    """The device to build the model on: ``"cpu"``, and ``"cuda"`` where a GPU is available.

    The cuda case skips (it does not fail) when torch is missing or sees no GPU, so one test
    body covers both devices on a laptop, in CPU-only CI and on a GPU runner.
    """
    device: str = request.param
    if device == "cuda":
        try:
            import torch
        except ImportError:
            pytest.skip("torch is not installed")
        if not torch.cuda.is_available():
            pytest.skip("CUDA is not available")
    return device


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("trainlint", "trainlint: confirm static findings with the tests")
    group.addoption(
        "--trainlint",
        action="store_true",
        default=False,
        dest="trainlint",
        help="Record which lines each test runs, lint the project files the tests executed, "
        "and report each finding as confirmed (a trainlint check failed in a test that ran "
        "it), exercised or not exercised. Ini: trainlint = true.",
    )
    group.addoption(
        "--trainlint-report",
        metavar="PATH",
        default=None,
        dest="trainlint_report",
        help="With --trainlint, also write the report as JSON to PATH. "
        "Ini: trainlint_report (relative to the rootdir).",
    )
    group.addoption(
        "--trainlint-paths",
        nargs="+",
        action="extend",
        metavar="PATH",
        default=None,
        dest="trainlint_paths",
        help="With --trainlint, lint these files/directories instead of the files the tests "
        "executed (use --trainlint-paths=PATH before test paths).",
    )
    parser.addini(
        "trainlint", type="bool", default=False, help="Turn on --trainlint for every run."
    )
    parser.addini(
        "trainlint_report", type="string", default="", help="Where --trainlint writes JSON."
    )
