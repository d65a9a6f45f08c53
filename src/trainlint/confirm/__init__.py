"""``pytest --trainlint``: confirm static findings with the tests that ran them.

While the tests run, coverage.py records which lines each test executed, under a dynamic
context per test. At the end of the session the project files that tests executed (or the
``--trainlint-paths``) are linted, and each finding gets a status:

* **confirmed**: a trainlint runtime check (:class:`trainlint.testing.CheckFailed`) failed in
  a test that ran the finding's line, and the failure lists the finding's code among the
  rules that explain its symptom (``CheckFailed.rules``, from ``Rule.confirm_with``);
* **exercised**: tests ran the line, and none of them failed a check that names its code;
* **not-exercised**: no test ran it.

When pytest-cov (or ``coverage run``) is already measuring, its collector is reused rather
than stacking a second tracer, which would pause the first and break the user's coverage.

This module is imported only when the option is on; :mod:`trainlint.pytest_plugin` stays thin.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainlint.confirm.manager import ConfirmationManager, contexts_supported, report_path
from trainlint.confirm.report import (
    STATUSES,
    CheckFailure,
    ConfirmedFinding,
    Report,
    Status,
    build_report,
    check_failures,
    is_check_failure,
    relative_to_root,
)

__all__ = [
    "STATUSES",
    "CheckFailure",
    "ConfirmationManager",
    "ConfirmedFinding",
    "Report",
    "Status",
    "build_report",
    "check_failures",
    "contexts_supported",
    "is_check_failure",
    "register",
    "relative_to_root",
]

PLUGIN_NAME = "trainlint-confirm"


def register(config: pytest.Config) -> None:
    """Validate the options and register the :class:`ConfirmationManager` for this session."""
    if hasattr(config, "workerinput"):
        return  # an xdist worker: the controller has said why there is no report
    _remove_stale_report(config)
    if _distributed(config):
        # Each xdist worker would trace and report on its share only; a merged report needs
        # the controller to gather contexts, which we do not do (yet). Say so, do not guess.
        config.issue_config_time_warning(
            pytest.PytestWarning(
                "--trainlint does not support pytest-xdist; no confirmation report is "
                "shown or written. Run with -p no:xdist or -n 0 for it"
            ),
            stacklevel=2,
        )
        return
    try:
        import coverage  # noqa: F401
    except ImportError:
        raise pytest.UsageError(
            "--trainlint needs coverage.py: pip install coverage (or trainlint[runtime])"
        ) from None
    paths = _option_paths(config)
    for path in paths:
        if not path.exists():
            raise pytest.UsageError(f"--trainlint-paths: {path}: no such file or directory")
    _check_lint_config(config.rootpath)
    config.pluginmanager.register(ConfirmationManager(config, paths=paths), PLUGIN_NAME)


def _remove_stale_report(config: pytest.Config) -> None:
    # A run that writes no report (under xdist, or when linting fails) must not leave the
    # previous run's file behind to be read as this run's.
    path = report_path(config)
    if path is not None:
        path.unlink(missing_ok=True)


def _distributed(config: pytest.Config) -> bool:
    # pytest-xdist turns `-n N` into a `--dist` mode before pytest_configure.
    return getattr(config.option, "dist", "no") not in ("no", None)


def _option_paths(config: pytest.Config) -> list[Path]:
    raw = config.getoption("trainlint_paths", default=None) or []
    base = config.invocation_params.dir
    return [(base / p).resolve() for p in raw]


def _check_lint_config(rootdir: Path) -> None:
    # A broken [tool.trainlint] should stop the session now, not after the whole suite ran.
    from trainlint.api import all_rules
    from trainlint.config import ConfigError, find_config, load_config, select_rules

    path = find_config(rootdir)
    if path is None:
        return
    try:
        settings = load_config(path)
        select_rules(all_rules(settings), settings)  # unknown codes, rule plugins that clash
    except ConfigError as exc:
        raise pytest.UsageError(f"--trainlint: {exc}") from None
