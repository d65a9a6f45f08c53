"""``pytest --trainlint``: confirm static findings with the tests that ran them.

While the tests run, coverage.py records which lines each test executed, under a dynamic
context per test. At the end of the session the project files that tests executed (or the
``--trainlint-paths``) are linted, and each finding gets a status:

* **confirmed**: a trainlint runtime check (:class:`trainlint.testing.CheckFailed`) failed in
  a test that ran the finding's line;
* **exercised**: tests ran the line and none of their trainlint checks failed;
* **not-exercised**: no test ran it.

When pytest-cov (or ``coverage run``) is already measuring, its collector is reused rather
than stacking a second tracer, which would pause the first and break the user's coverage.

This module is imported only when the option is on; :mod:`trainlint.pytest_plugin` stays thin.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pytest

if TYPE_CHECKING:
    from coverage import Coverage, CoverageData

    from trainlint.config import Settings
    from trainlint.findings import Finding

__all__ = ["ConfirmationManager", "ConfirmedFinding", "Report", "register"]

Status = Literal["confirmed", "exercised", "not-exercised"]
STATUSES: tuple[Status, ...] = ("confirmed", "exercised", "not-exercised")

PLUGIN_NAME = "trainlint-confirm"
# pytest-cov's `--cov-context=test` labels each phase `<node id>|<phase>`.
_COV_PHASES = ("setup", "run", "teardown")
_THIRD_PARTY_DIRS = ("site-packages", "dist-packages")
_GLOB_CHARS = set("*?[]")


# --------------------------------------------------------------------------- the report


@dataclass(frozen=True)
class ConfirmedFinding:
    """A lint finding with what the test run says about it. ``path`` is rootdir-relative."""

    code: str
    name: str
    path: str
    line: int
    column: int
    status: Status
    tests: tuple[str, ...] = ()
    confirmed_by: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "name": self.name,
            "path": self.path,
            "line": self.line,
            "status": self.status,
            "tests": list(self.tests),
            "confirmed_by": list(self.confirmed_by),
        }


@dataclass
class Report:
    """All findings of the linted files, in path/line order, and how many files were linted."""

    findings: list[ConfirmedFinding] = field(default_factory=list)
    files: int = 0
    error: str | None = None

    def summary(self) -> dict[str, int]:
        counts: dict[str, int] = dict.fromkeys(STATUSES, 0)
        for finding in self.findings:
            counts[finding.status] += 1
        return counts

    def to_json(self) -> dict[str, Any]:
        return {
            "findings": [f.to_json() for f in self.findings],
            "summary": self.summary(),
        }


def build_report(
    findings: Iterable[Finding],
    executed: dict[Path, dict[int, set[str]]],
    failed: set[str],
    rootdir: Path,
    *,
    order: dict[str, int] | None = None,
    files: int = 0,
) -> Report:
    """Give each finding its status.

    ``findings`` carry absolute paths; ``executed[path][line]`` is the set of node ids that
    ran that line; ``failed`` the node ids whose trainlint check failed; ``order`` the run
    order of node ids (lists follow it, so the first test to run a line comes first).
    """
    rank = order or {}
    out = []
    for finding in findings:
        path = Path(finding.path)
        lines = executed.get(path, {})
        ran: set[str] = set()
        # A finding may span a multi-line statement; the tracer can report any of its lines.
        for line in range(finding.line, max(finding.line, finding.end_line) + 1):
            ran |= lines.get(line, set())
        tests = sorted(ran, key=lambda nodeid: (rank.get(nodeid, len(rank)), nodeid))
        confirmed_by = tuple(t for t in tests if t in failed)
        status: Status = (
            "confirmed" if confirmed_by else "exercised" if tests else "not-exercised"
        )
        out.append(
            ConfirmedFinding(
                code=finding.code,
                name=finding.name,
                path=relative_to_root(path, rootdir),
                line=finding.line,
                column=finding.column,
                status=status,
                tests=tuple(tests),
                confirmed_by=confirmed_by,
            )
        )
    out.sort(key=lambda f: (f.path, f.line, f.column, f.code))
    return Report(findings=out, files=files)


def relative_to_root(path: Path, rootdir: Path) -> str:
    """``path`` relative to the rootdir, posix, with ``..`` for files outside it."""
    try:
        return path.relative_to(rootdir).as_posix()
    except ValueError:
        return Path(os.path.relpath(path, rootdir)).as_posix()


def is_check_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is, wraps or was raised while handling a :class:`CheckFailed`."""
    from trainlint.testing import CheckFailed  # does not import torch

    seen: set[int] = set()
    stack = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, CheckFailed):
            return True
        # ExceptionGroup (and the exceptiongroup backport on 3.10) keep their members here.
        members = getattr(current, "exceptions", None)
        if isinstance(members, (tuple, list)):
            stack.extend(m for m in members if isinstance(m, BaseException))
        if current.__cause__ is not None:
            stack.append(current.__cause__)
        if current.__context__ is not None and not current.__suppress_context__:
            stack.append(current.__context__)
    return False


# --------------------------------------------------------------------------- registration


def register(config: pytest.Config) -> None:
    """Validate the options and register the :class:`ConfirmationManager` for this session."""
    if hasattr(config, "workerinput"):
        return  # an xdist worker: the controller has said why there is no report
    if _distributed(config):
        # Each xdist worker would trace and report on its share only; a merged report needs
        # the controller to gather contexts, which we do not do (yet). Say so, do not guess.
        config.issue_config_time_warning(
            pytest.PytestWarning(
                "--trainlint does not support pytest-xdist; run with -p no:xdist or -n 0 "
                "for the confirmation report"
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


def _distributed(config: pytest.Config) -> bool:
    # pytest-xdist turns `-n N` into a `--dist` mode before pytest_configure.
    return getattr(config.option, "dist", "no") not in ("no", None)


def _option_paths(config: pytest.Config) -> list[Path]:
    raw = config.getoption("trainlint_paths", default=None) or []
    base = config.invocation_params.dir
    return [(base / p).resolve() for p in raw]


def _report_path(config: pytest.Config) -> Path | None:
    cli = config.getoption("trainlint_report", default=None)
    if cli:
        return (config.invocation_params.dir / cli).resolve()
    ini = config.getini("trainlint_report")
    if ini:
        # Like pytest's own path settings in an ini file: relative to the rootdir.
        return (config.rootpath / str(ini)).resolve()
    return None


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


# --------------------------------------------------------------------------- the manager


class ConfirmationManager:
    """The session's state: which tests ran which lines, and whose trainlint check failed."""

    def __init__(self, config: pytest.Config, *, paths: Sequence[Path] = ()) -> None:
        self.config = config
        self.rootdir = config.rootpath.resolve()
        self.paths = list(paths)
        self.report_path = _report_path(config)
        self.test_files: set[Path] = set()
        # coverage context label -> node ids; a test_function label can name several.
        self.labels: dict[str, set[str]] = {}
        self.order: dict[str, int] = {}
        self.failed: set[str] = set()
        self.executed: dict[Path, dict[int, set[str]]] | None = None
        self._cov: Coverage | None = None
        self._own = False
        self._switch = True
        self._static = ""
        self._report: Report | None = None
        #: Why the report cannot be trusted, shown above it (None: it can).
        self.problem: str | None = None

    # ------------------------------------------------------------------ collection

    def pytest_collectstart(self, collector: pytest.Collector) -> None:
        # Doctest modules are the project's own code, not tests of it.
        if isinstance(collector, pytest.Module) and type(collector).__name__ != "DoctestModule":
            self.test_files.add(collector.path.resolve())

    # ------------------------------------------------------------------ tracing

    # trylast: the innermost wrapper, so this ends (and reads the data) before pytest-cov's
    # wrapper stops its collector, saves and combines.
    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, object, object]:
        if session.config.option.collectonly:
            return (yield)
        self._start()
        try:
            return (yield)
        finally:
            self._finish()

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        self._learn_labels(item)
        self._switch_context(item.nodeid)
        try:
            return (yield)
        finally:
            self._switch_context("")

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> None:
        if call.when == "call" and call.excinfo is not None:
            if is_check_failure(call.excinfo.value):
                self.failed.add(item.nodeid)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self._own and self._cov is not None:
            self._cov.stop()  # a session that died before the loop ended
            self._cov = None

    def _start(self) -> None:
        cov = _active_coverage(self.config)
        if cov is None:
            cov = self._own_coverage()
            self._own = True
        self._cov = cov
        self._static = str(cov.get_option("run:context") or "")
        # Keep what the user's collector already labels: pytest-cov's --cov-context=test
        # switches per phase, coverage's dynamic_context switches per test function (and
        # warns "Conflicting dynamic contexts" if we switched too). Both are mapped back to
        # node ids in _learn_labels.
        self._switch = not (
            self.config.pluginmanager.has_plugin("_cov_contexts")
            or cov.get_option("run:dynamic_context")
        )
        if not contexts_supported(cov):
            self._switch = False
            self.problem = (
                "the running coverage measures with sys.monitoring (core=sysmon), which cannot "
                "tell tests apart: no line is attributed to a test. Set core = \"ctrace\" in "
                "[tool.coverage.run] (or COVERAGE_CORE=ctrace) for --trainlint runs"
            )
        if self._own:
            cov.start()

    def _own_coverage(self) -> Coverage:
        from coverage import Coverage

        # source= is matched as a directory prefix (include= would read a pytester-style
        # "test_x[a]0" directory as a glob), and skips the running interpreter's
        # site-packages even when a virtualenv lives under the rootdir.
        omit = [f"*{os.sep}{d}{os.sep}*" for d in _THIRD_PARTY_DIRS]
        omit.append(f"*{os.sep}conftest.py")
        # The tests themselves are traced for nothing: they are never linted. (A path that
        # reads as a glob is left traced; it is filtered out when the files are chosen.)
        omit += [str(p) for p in sorted(self.test_files) if not _GLOB_CHARS & set(str(p))]
        # config_file=False: the user's .coveragerc (its dynamic_context, its source) is for
        # their own runs; data_file=None: never write or clobber a .coverage file.
        cov = Coverage(
            data_file=None, config_file=False, source=[str(self.rootdir)], omit=omit
        )
        # sys.monitoring (the default core on new Pythons) cannot label contexts.
        cov.set_option("run:core", "ctrace")
        cov.set_option("run:disable_warnings", ["no-data-collected"])
        return cov

    def _switch_context(self, label: str) -> None:
        if not self._switch or self._cov is None:
            return
        from coverage.exceptions import CoverageException

        # Paused (pytest-cov's no_cover) or stopped by the user: there is nothing to label.
        with contextlib.suppress(CoverageException):
            self._cov.switch_context(label)

    def _learn_labels(self, item: pytest.Item) -> None:
        nodeid = item.nodeid
        self.order.setdefault(nodeid, len(self.order))
        labels = [nodeid, *(f"{nodeid}|{phase}" for phase in _COV_PHASES)]
        function = getattr(item, "function", None)
        if function is not None:
            # coverage's dynamic_context = test_function labels the test function by
            # module and qualified name: parametrized cases share one label.
            module = getattr(function, "__module__", None)
            qualname = getattr(function, "__qualname__", None)
            if module and qualname:
                labels.append(f"{module}.{qualname}")
        for label in labels:
            if self._static:
                label = f"{self._static}|{label}"
            self.labels.setdefault(label, set()).add(nodeid)

    def _finish(self) -> None:
        cov, self._cov = self._cov, None
        if cov is None:
            return
        if self._own:
            cov.stop()
        # get_data() flushes what the collector holds; on a borrowed collector that is
        # what its own save() does next, so the user's data is unchanged.
        self.executed = self._read(cov.get_data())

    def _read(self, data: CoverageData) -> dict[Path, dict[int, set[str]]]:
        executed: dict[Path, dict[int, set[str]]] = {}
        for filename in data.measured_files():
            by_line: dict[int, set[str]] = {}
            for line, labels in data.contexts_by_lineno(filename).items():
                nodeids: set[str] = set()
                for label in labels:
                    nodeids |= self.labels.get(label, set())
                if nodeids:  # lines run only at import (the empty context) are nobody's
                    by_line[line] = nodeids
            if by_line:
                executed[Path(filename).resolve()] = by_line
        return executed

    # ------------------------------------------------------------------ reporting

    def project_files(self) -> list[Path]:
        """The files to lint: ``--trainlint-paths``, else project files a test executed."""
        if self.paths:
            # Walked as `trainlint check` walks them (.gitignore, excludes), so the summary
            # can count files rather than the paths given.
            from trainlint.discovery import discover

            settings = _lint_settings(self.paths[0])
            return [Path(p).resolve() for p in discover(self.paths, settings or _settings())]
        settings = _lint_settings(self.rootdir)
        files = []
        for path in sorted(self.executed or {}):
            if path.suffix != ".py" or path.name == "conftest.py" or path in self.test_files:
                continue
            if not _under(path, self.rootdir) or any(d in path.parts for d in _THIRD_PARTY_DIRS):
                continue
            if settings is not None and _excluded(path, settings):
                continue
            files.append(path)
        return files

    def report(self) -> Report:
        """The confirmation report (built once, at the end of the session)."""
        if self._report is None:
            self._report = self._build()
        return self._report

    def _build(self) -> Report:
        findings: list[Finding] = []
        try:
            files = self.project_files()
            if files:
                from trainlint import lint_paths

                findings = lint_paths(files, jobs=1)
        except Exception as exc:  # noqa: BLE001 - the test results must still be shown
            return Report(error=f"{type(exc).__name__}: {exc}")
        cwd = Path.cwd()
        for finding in findings:
            # lint_paths reports paths relative to the working directory when under it.
            finding.path = str((cwd / finding.path).resolve())
        return build_report(
            findings, self.executed or {}, self.failed, self.rootdir,
            order=self.order, files=len(files),
        )

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.executed is None or self.report_path is None:
            return
        report = self.report()
        if report.error is not None:
            return
        self.report_path.parent.mkdir(parents=True, exist_ok=True)
        self.report_path.write_text(
            json.dumps(report.to_json(), indent=2) + "\n", encoding="utf-8"
        )

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.executed is None:
            return
        report = self.report()
        tr = terminalreporter
        tr.write_sep("=", "trainlint confirmation")
        if self.problem is not None:
            tr.write_line(f"trainlint: {self.problem}", yellow=True)
        if report.error is not None:
            tr.write_line(f"trainlint: could not lint: {report.error}", red=True)
            return
        verbose = self.config.option.verbose > 0
        for f in report.findings:
            status = f.status.replace("-", " ")
            markup = {"confirmed": {"red": True}, "exercised": {"yellow": True}}.get(f.status, {})
            tr.write_line(f"{f.path}:{f.line}:{f.column} {f.code} {f.name}  [{status}]", **markup)
            for nodeid in f.confirmed_by:
                tr.write_line(f"    confirmed by {nodeid}")
            if verbose:
                for nodeid in f.tests:
                    if nodeid not in f.confirmed_by:
                        tr.write_line(f"    ran in {nodeid}")
        counts = report.summary()
        tr.write_line(
            f"trainlint: {counts['confirmed']} confirmed, {counts['exercised']} exercised, "
            f"{counts['not-exercised']} not exercised ({_plural(len(report.findings), 'finding')}"
            f" in {_plural(report.files, 'file')} linted)"
        )
        if self.report_path is not None:
            tr.write_line(f"trainlint report written to {self.report_path}")


def contexts_supported(cov: Any) -> bool:
    """Whether ``cov`` can label lines per test (its sys.monitoring core cannot)."""
    # Coverage has no public way to ask; its own switch_context() reads this attribute.
    core = getattr(cov, "_core", None)
    return bool(getattr(core, "supports_dynamic_contexts", True))


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _active_coverage(config: pytest.Config) -> Coverage | None:
    """The collector already measuring this process: pytest-cov's, else ``coverage run``'s."""
    plugin = config.pluginmanager.getplugin("_cov")
    controller = getattr(plugin, "cov_controller", None)
    cov = getattr(controller, "cov", None)
    if cov is not None and getattr(controller, "started", False):
        return cov  # type: ignore[no-any-return]
    from coverage import Coverage

    return Coverage.current()


def _lint_settings(start: Path) -> Settings | None:
    """The ``[tool.trainlint]`` settings that ``lint_paths`` would find from ``start``."""
    from trainlint.config import find_config, load_config

    path = find_config(start)
    return load_config(path) if path is not None else None


def _settings() -> Settings:
    from trainlint.config import Settings

    return Settings()


def _excluded(path: Path, settings: Settings) -> bool:
    # Executed files are not "named on the command line", so the project's exclude applies
    # to them as it does to a directory walk.
    from trainlint.config import path_matches, relative_posix

    rel = relative_posix(path, settings.root)
    return any(path_matches(rel, p) for p in [*settings.exclude, *settings.extend_exclude])


def _under(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
    except ValueError:
        return False
    return True
