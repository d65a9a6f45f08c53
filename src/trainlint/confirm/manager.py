"""The session's state behind ``--trainlint``: which tests ran which lines, whose check failed.

Registered as a pytest plugin by :func:`trainlint.confirm.register`. It borrows the coverage
collector that is already measuring (pytest-cov's, or ``coverage run``'s) or starts its own,
labels lines with the running test, and at the end lints the project files and prints
(and writes) the report.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from trainlint.confirm.report import CheckFailure, Report, build_report, check_failures

if TYPE_CHECKING:
    from coverage import Coverage, CoverageData

    from trainlint.config import Settings
    from trainlint.findings import Finding

# pytest-cov's `--cov-context=test` labels each phase `<node id>|<phase>`.
_COV_PHASES = ("setup", "run", "teardown")
THIRD_PARTY_DIRS = ("site-packages", "dist-packages")
_GLOB_CHARS = set("*?[]")


def report_path(config: pytest.Config) -> Path | None:
    cli = config.getoption("trainlint_report", default=None)
    if cli:
        return (config.invocation_params.dir / cli).resolve()
    ini = config.getini("trainlint_report")
    if ini:
        # Like pytest's own path settings in an ini file: relative to the rootdir.
        return (config.rootpath / str(ini)).resolve()
    return None


class ConfirmationManager:
    """The session's state: which tests ran which lines, and whose trainlint check failed."""

    def __init__(self, config: pytest.Config, *, paths: Sequence[Path] = ()) -> None:
        self.config = config
        self.rootdir = config.rootpath.resolve()
        self.paths = list(paths)
        self.report_path = report_path(config)
        self.test_files: set[Path] = set()
        # coverage context label -> node ids; a test_function label can name several.
        self.labels: dict[str, set[str]] = {}
        self.order: dict[str, int] = {}
        # node id -> the trainlint checks that failed in it (and the rules each confirms)
        self.failures: dict[str, list[CheckFailure]] = {}
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
            failures = check_failures(call.excinfo.value)
            if failures:
                self.failures.setdefault(item.nodeid, []).extend(failures)

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
                'tell tests apart: no line is attributed to a test. Set core = "ctrace" in '
                "[tool.coverage.run] (or COVERAGE_CORE=ctrace) for --trainlint runs"
            )
        if self._own:
            cov.start()

    def _own_coverage(self) -> Coverage:
        from coverage import Coverage

        # source= is matched as a directory prefix (include= would read a pytester-style
        # "test_x[a]0" directory as a glob), and skips the running interpreter's
        # site-packages even when a virtualenv lives under the rootdir.
        omit = [f"*{os.sep}{d}{os.sep}*" for d in THIRD_PARTY_DIRS]
        omit.append(f"*{os.sep}conftest.py")
        # The tests themselves are traced for nothing: they are never linted. (A path that
        # reads as a glob is left traced; it is filtered out when the files are chosen.)
        omit += [str(p) for p in sorted(self.test_files) if not _GLOB_CHARS & set(str(p))]
        # config_file=False: the user's .coveragerc (its dynamic_context, its source) is for
        # their own runs; data_file=None: never write or clobber a .coverage file.
        cov = Coverage(data_file=None, config_file=False, source=[str(self.rootdir)], omit=omit)
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
            if not _under(path, self.rootdir) or any(d in path.parts for d in THIRD_PARTY_DIRS):
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
            findings,
            self.executed or {},
            self.failures,
            self.rootdir,
            order=self.order,
            files=len(files),
        )

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.executed is None or self.report_path is None:
            return
        report = self.report()
        if report.error is not None:
            return
        self.report_path.parent.mkdir(parents=True, exist_ok=True)
        self.report_path.write_text(json.dumps(report.to_json(), indent=2) + "\n", encoding="utf-8")

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
            for nodeid, check in f.confirming_checks:
                tr.write_line(f"    confirmed by {nodeid} ({check})")
            if verbose:
                failed_other = dict(f.other_failures)
                for nodeid in f.tests:
                    if nodeid in f.confirmed_by:
                        continue
                    if nodeid in failed_other:
                        checks = ", ".join(c for n, c in f.other_failures if n == nodeid)
                        tr.write_line(f"    ran in {nodeid} ({checks} failed, for other rules)")
                    else:
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
