"""``pytest --trainlint``: static findings confirmed by the tests that ran them (SPEC §10).

The inner runs are subprocesses: each starts (or borrows) a coverage tracer, and a tracer
left in this process would measure the rest of the suite. Two runs train real (tiny) models;
the others use a stub ``torch`` module on the inner run's path, because the linter only reads
the source and the statuses only need *a* trainlint check to fail, which the tests raise.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from trainlint.confirm import (
    CheckFailure,
    build_report,
    check_failures,
    contexts_supported,
    is_check_failure,
)
from trainlint.findings import Finding
from trainlint.testing import CheckFailed

SECTION = "trainlint confirmation"


@pytest.fixture(autouse=True)
def _no_inherited_coverage(monkeypatch):
    # An outer `coverage run` (subprocess measurement, its data file, its core) must not
    # reach the inner runs: they check which tracer is (or is not) there, and their data.
    for name in (
        "COVERAGE_PROCESS_START",
        "COVERAGE_PROCESS_CONFIG",
        "COVERAGE_FILE",
        "COVERAGE_RCFILE",
        "COVERAGE_CORE",
        "COV_CORE_SOURCE",
        "COV_CORE_CONFIG",
        "COV_CORE_DATAFILE",
        "PYTEST_ADDOPTS",
    ):
        monkeypatch.delenv(name, raising=False)


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def where(source: str, line_marker: str, start: str) -> tuple[int, int]:
    """1-based (line, column) of ``start`` on the line of ``source`` holding ``line_marker``."""
    for number, line in enumerate(source.splitlines(), 1):
        if line_marker in line:
            return number, line.index(start) + 1
    raise AssertionError(f"{line_marker!r} not in source")


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dedent(text), encoding="utf-8")


def section(stdout: str) -> list[str]:
    """The lines of the trainlint confirmation section (without its header)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if SECTION in line and line.startswith("="))
    out = []
    for line in lines[start + 1 :]:
        if line.startswith("=") or line.startswith("_"):
            break
        out.append(line)
    return out


def entry(code, name, path, line, status, tests=(), confirmed_by=()):
    return {
        "code": code,
        "name": name,
        "path": path,
        "line": line,
        "status": status,
        "tests": list(tests),
        "confirmed_by": list(confirmed_by),
    }


def summary(confirmed, exercised, not_exercised):
    return {"confirmed": confirmed, "exercised": exercised, "not-exercised": not_exercised}


# ------------------------------------------------------------------ a real training project

TRAIN = dedent(
    """
    import torch
    from torch import nn


    class Trainer:
        def __init__(self, seed=0):
            torch.manual_seed(seed)
            self.model = nn.Linear(4, 1)
            self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
            self.batches = [(torch.randn(8, 4), torch.randn(8, 1))]
            self.total = 0.0

        def fit_leaky(self):
            for x, y in self.batches:
                self.opt.zero_grad()
                loss = ((self.model(x) - y) ** 2).mean()
                loss.backward()
                self.opt.step()
                self.total += loss  # keeps every step's graph
                snapshot = self.model.weight.grad.cpu()  # a host sync, not a leak

        def fit_retain(self):
            for x, y in self.batches:
                self.opt.zero_grad()
                loss = ((self.model(x) - y) ** 2).mean()
                loss.backward(retain_graph=True)
                self.opt.step()
            return loss.item()


    def load_checkpoint(path):
        return torch.load(path)
    """
)

TRAIN_TESTS = """
    from pkg.train import Trainer


    def test_leaky_step_memory(assert_memory_stable):
        assert_memory_stable(Trainer().fit_leaky)


    def test_retain_step_memory(assert_memory_stable):
        assert_memory_stable(Trainer().fit_retain)
    """

LEAK = "tests/test_train.py::test_leaky_step_memory"
RETAIN = "tests/test_train.py::test_retain_step_memory"
TL302 = where(TRAIN, "self.total += loss", "self.total")
TL301 = where(TRAIN, "retain_graph=True", "loss.backward")
TL702 = where(TRAIN, "torch.load(path)", "torch.load")
TL401 = where(TRAIN, "a host sync", "self.model.weight")

TRAIN_REPORT = {
    "findings": [
        entry("TL302", "graph-accumulation", "pkg/train.py", TL302[0], "confirmed", [LEAK], [LEAK]),
        # ran by the failing test, but the memory check's failure explains TL302, not this
        entry("TL401", "host-sync-in-loop", "pkg/train.py", TL401[0], "exercised", [LEAK]),
        entry("TL301", "retain-graph-in-loop", "pkg/train.py", TL301[0], "exercised", [RETAIN]),
        entry("TL702", "unsafe-torch-load", "pkg/train.py", TL702[0], "not-exercised"),
    ],
    "summary": summary(1, 2, 1),
}


@pytest.fixture
def train_project(pytester):
    write(
        pytester.path,
        {
            # TL401 and TL702, the findings these projects carry, are opt-in: selected here
            "pyproject.toml": "[tool.pytest.ini_options]\naddopts = '-p no:cacheprovider'\n"
            '[tool.trainlint]\nextend-select = ["TL401", "TL702"]\n',
            "pkg/__init__.py": "",
            "pkg/train.py": TRAIN,
            "tests/conftest.py": "import torch\n\ntorch.set_num_threads(1)\n",
            "tests/test_train.py": TRAIN_TESTS,
        },
    )
    return pytester


@pytest.mark.slow  # a pytest run in a subprocess, with coverage
def test_findings_are_confirmed_exercised_or_not_exercised(train_project):
    result = train_project.runpytest_subprocess("--trainlint", "--trainlint-report=out.json")
    result.assert_outcomes(passed=1, failed=1)
    report = json.loads((train_project.path / "out.json").read_text(encoding="utf-8"))
    assert report == TRAIN_REPORT
    assert section(result.stdout.str()) == [
        f"pkg/train.py:{TL302[0]}:{TL302[1]} TL302 graph-accumulation  [confirmed]",
        f"    confirmed by {LEAK} (assert_memory_stable)",
        f"pkg/train.py:{TL401[0]}:{TL401[1]} TL401 host-sync-in-loop  [exercised]",
        f"pkg/train.py:{TL301[0]}:{TL301[1]} TL301 retain-graph-in-loop  [exercised]",
        f"pkg/train.py:{TL702[0]}:{TL702[1]} TL702 unsafe-torch-load  [not exercised]",
        "trainlint: 1 confirmed, 2 exercised, 1 not exercised (4 findings in 1 file linted)",
        f"trainlint report written to {(train_project.path / 'out.json').resolve()}",
    ]


@pytest.mark.slow  # a pytest run in a subprocess, with coverage
def test_pytest_cov_collector_is_reused_and_its_report_still_works(train_project):
    from coverage import CoverageData

    train_project.makepyfile(
        **{
            "tests/test_tracer": """
        import coverage

        def test_one_tracer(cov):
            # pytest-cov's Coverage is the only one started: trainlint did not stack its own
            assert cov is not None and coverage.Coverage.current() is cov
        """
        }
    )
    result = train_project.runpytest_subprocess(
        "-p",
        "pytest_cov",
        "--cov=pkg",
        "--cov-report=term-missing",
        "--trainlint",
        "--trainlint-report=out.json",
    )
    result.assert_outcomes(passed=2, failed=1)
    report = json.loads((train_project.path / "out.json").read_text(encoding="utf-8"))
    assert report == TRAIN_REPORT
    out = result.stdout.str()
    assert "trainlint: 1 confirmed, 2 exercised, 1 not exercised" in out
    result.stdout.fnmatch_lines(["*tests coverage*", "pkg*train.py*", "TOTAL*"])
    data = CoverageData(basename=str(train_project.path / ".coverage"))
    data.read()
    (train_file,) = [f for f in data.measured_files() if f.endswith("train.py")]
    assert TL302[0] in data.lines(train_file)
    assert TL702[0] not in data.lines(train_file)


# ------------------------------------------------------------------ a stub-torch project

STUB_TORCH = """
    # Stands in for torch in the inner runs: the linter reads the source, never this.
    def load(path, weights_only=None):
        return path
    """

MODULE_A = dedent(
    """
    import torch


    def helper():
        return 1


    def load(path):
        return torch.load(path)
    """
)

MODULE_B = dedent(
    """
    import torch


    def helper():
        return 1


    def load(path):
        return torch.load(path)


    def restore(path):
        return torch.load(path)  # never called
    """
)

STUB_TESTS = """
    import torch
    from trainlint.testing import CheckFailed

    from pkg import a, b, legacy


    def test_a_fails(loaded):
        a.load("ckpt")
        raise CheckFailed("unsafe load", check="assert_loads_safely", rules=("TL702",))


    def test_b_passes():
        assert b.load("ckpt") == "ckpt"
        assert torch.load("x") == "x"  # a finding in a test file: never linted


    def test_helpers():
        assert a.helper() == b.helper() == 1
        assert legacy.load("x") == "x"
    """

A_FAILS = "tests/test_stub.py::test_a_fails"
B_PASSES = "tests/test_stub.py::test_b_passes"
A_LOAD = where(MODULE_A, "torch.load(path)", "torch.load")[0]
B_LOAD = where(MODULE_B, "def load(path)", "def")[0] + 1
B_RESTORE = where(MODULE_B, "never called", "torch")[0]

STUB_FINDINGS = [
    entry("TL702", "unsafe-torch-load", "pkg/a.py", A_LOAD, "confirmed", [A_FAILS], [A_FAILS]),
    entry("TL702", "unsafe-torch-load", "pkg/b.py", B_LOAD, "exercised", [B_PASSES]),
    entry("TL702", "unsafe-torch-load", "pkg/b.py", B_RESTORE, "not-exercised"),
]
STUB_REPORT = {"findings": STUB_FINDINGS, "summary": summary(1, 1, 1)}


def stub_project(pytester, pyproject: str = "") -> pytest.Pytester:
    write(
        pytester.path,
        {
            "pyproject.toml": pyproject
            or dedent("""
            [tool.pytest.ini_options]
            addopts = "-p no:cacheprovider"

            [tool.trainlint]
            extend-exclude = ["pkg/legacy.py"]
            extend-select = ["TL702"]
            """),
            "torch.py": STUB_TORCH,
            "pkg/__init__.py": "",
            "pkg/a.py": MODULE_A,
            "pkg/b.py": MODULE_B,
            "pkg/legacy.py": MODULE_A,
            "pkg/never.py": MODULE_A,
            "tests/conftest.py": """
            import pytest
            import torch

            @pytest.fixture
            def loaded():
                return torch.load("fixture")  # runs in a test, but conftest is not linted
            """,
            "tests/test_stub.py": STUB_TESTS,
        },
    )
    return pytester


def test_lints_only_project_files_that_tests_executed(pytester):
    # Not the test file, not conftest.py, not pkg/never.py (never run), not pkg/legacy.py
    # (excluded by [tool.trainlint]); a, b and torch.py (which has no findings) are linted.
    stub_project(pytester)
    result = pytester.runpytest_subprocess("--trainlint", "--trainlint-report=out.json")
    result.assert_outcomes(passed=2, failed=1)
    assert json.loads((pytester.path / "out.json").read_text("utf-8")) == STUB_REPORT
    assert section(result.stdout.str())[-2] == (
        "trainlint: 1 confirmed, 1 exercised, 1 not exercised (3 findings in 3 files linted)"
    )


def test_trainlint_paths_restrict_linting(pytester):
    stub_project(pytester)
    result = pytester.runpytest_subprocess(
        "--trainlint", "--trainlint-paths=pkg/never.py", "--trainlint-report=out.json"
    )
    result.assert_outcomes(passed=2, failed=1)
    never = entry("TL702", "unsafe-torch-load", "pkg/never.py", A_LOAD, "not-exercised")
    report = json.loads((pytester.path / "out.json").read_text("utf-8"))
    assert report == {"findings": [never], "summary": summary(0, 0, 1)}
    # A directory is walked like `trainlint check` walks it, excludes included.
    result = pytester.runpytest_subprocess(
        "tests", "--trainlint-paths", "pkg", "--trainlint", "--trainlint-report=out.json"
    )
    report = json.loads((pytester.path / "out.json").read_text("utf-8"))
    assert report == {"findings": [*STUB_FINDINGS, never], "summary": summary(1, 1, 2)}
    assert section(result.stdout.str())[-2].endswith("(4 findings in 4 files linted)")


def test_ini_options_turn_it_on(pytester):
    stub_project(
        pytester,
        pyproject=dedent("""
        [tool.pytest.ini_options]
        addopts = "-p no:cacheprovider"
        trainlint = true
        trainlint_report = "reports/trainlint.json"

        [tool.trainlint]
        extend-exclude = ["pkg/legacy.py"]
        extend-select = ["TL702"]
        """),
    )
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=2, failed=1)
    assert SECTION in result.stdout.str()
    report = pytester.path / "reports" / "trainlint.json"
    assert json.loads(report.read_text("utf-8")) == STUB_REPORT
    report.unlink()
    result = pytester.runpytest_subprocess("-o", "trainlint=false")
    assert SECTION not in result.stdout.str()
    assert not report.exists()


def test_under_xdist_the_previous_report_is_not_left_in_place(pytester):
    pytest.importorskip("xdist")
    stub_project(pytester)
    report = pytester.path / "out.json"
    result = pytester.runpytest_subprocess("--trainlint", "--trainlint-report=out.json")
    result.assert_outcomes(passed=2, failed=1)
    assert json.loads(report.read_text("utf-8")) == STUB_REPORT
    # The workers cannot hand their lines to the controller: no report, and not the old one.
    result = pytester.runpytest_subprocess("-n", "2", "--trainlint", "--trainlint-report=out.json")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*--trainlint does not support pytest-xdist*"])
    assert SECTION not in result.stdout.str()
    assert not report.exists()
    # Back without xdist, the report is written afresh.
    result = pytester.runpytest_subprocess("-n", "0", "--trainlint", "--trainlint-report=out.json")
    assert json.loads(report.read_text("utf-8")) == STUB_REPORT


def test_without_the_option_nothing_is_traced_or_imported(pytester):
    pytester.makepyfile(
        test_quiet="""
        import sys

        def test_nothing_loaded():
            assert sys.gettrace() is None
            assert "coverage" not in sys.modules
            assert "trainlint.confirm" not in sys.modules
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--trainlint-report=x.json")
    result.assert_outcomes(passed=1)
    assert SECTION not in result.stdout.str()
    assert not (pytester.path / "x.json").exists()


@pytest.mark.parametrize("runner", ["cov_context_test", "coverage_run", "test_function"])
def test_the_users_own_coverage_run_is_borrowed_and_kept(pytester, runner):
    from coverage import CoverageData

    stub_project(pytester)
    if runner == "cov_context_test":  # pytest-cov labelling each phase itself
        result = pytester.runpytest_subprocess(
            "--cov=pkg", "--cov-context=test", "--trainlint", "--trainlint-report=out.json"
        )
    else:
        if runner == "test_function":  # coverage labelling each test function itself
            with (pytester.path / "pyproject.toml").open("a", encoding="utf-8") as f:
                f.write('\n[tool.coverage.run]\ndynamic_context = "test_function"\n')
        result = pytester.run(
            sys.executable,
            "-m",
            "coverage",
            "run",
            "--source=pkg",
            "-m",
            "pytest",
            "--trainlint",
            "--trainlint-report=out.json",
        )
    result.assert_outcomes(passed=2, failed=1)
    assert json.loads((pytester.path / "out.json").read_text("utf-8")) == STUB_REPORT
    assert "Conflicting dynamic contexts" not in result.stdout.str() + result.stderr.str()
    data = CoverageData(basename=str(pytester.path / ".coverage"))
    data.read()
    assert any(f.endswith("a.py") for f in data.measured_files())
    contexts = data.measured_contexts() - {""}
    if runner == "coverage_run":
        assert A_FAILS in contexts  # trainlint labelled the user's collector per test
    elif runner == "test_function":
        assert contexts == {
            "test_stub.test_a_fails",
            "test_stub.test_b_passes",
            "test_stub.test_helpers",
        }  # left as coverage labelled them
    else:
        assert f"{A_FAILS}|run" in contexts  # left as pytest-cov labelled them
        assert all(c.rsplit("|", 1)[1] in ("setup", "run", "teardown") for c in contexts)
    report = pytester.run(sys.executable, "-m", "coverage", "report")
    assert report.ret == 0
    report.stdout.fnmatch_lines(["pkg*a.py*", "TOTAL*"])


def test_a_bad_path_or_config_stops_the_session_at_once(pytester):
    pytester.makepyfile(test_x="def test_x(): pass")
    result = pytester.runpytest_subprocess("--trainlint", "--trainlint-paths=missing.py")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--trainlint-paths:*missing.py: no such file or directory*"])
    for table, error in [("selekt = ['TL3']", "*selekt*"), ("select = ['XX9']", "*XX9*")]:
        pytester.makepyprojecttoml(f"[tool.trainlint]\n{table}\n")
        result = pytester.runpytest_subprocess("--trainlint")
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines([f"*--trainlint:*pyproject.toml*{error}"])


# ------------------------------------------------------------------ units


def finding(path: Path, line: int, end_line: int | None = None, code: str = "TL302") -> Finding:
    return Finding(
        code=code,
        name="n",
        path=str(path),
        line=line,
        column=1,
        end_line=end_line or line,
        end_column=2,
        message="m",
    )


def test_status_follows_the_tests_that_ran_the_line(tmp_path):
    src = tmp_path / "src" / "train.py"
    executed = {src: {3: {"t::b", "t::a"}, 7: {"t::b"}, 9: {"t::c"}}}
    report = build_report(
        [finding(src, 9, 11), finding(src, 3), finding(src, 7), finding(src, 5)],
        executed,
        {"t::a": [CheckFailure("assert_x", ("TL302",))]},
        rootdir=tmp_path,
        order={"t::a": 0, "t::b": 1},
    )
    got = [(f.line, f.status, f.tests, f.confirmed_by) for f in report.findings]
    assert got == [
        (3, "confirmed", ("t::a", "t::b"), ("t::a",)),  # in run order
        (5, "not-exercised", (), ()),
        (7, "exercised", ("t::b",), ()),
        (9, "exercised", ("t::c",), ()),  # a multi-line finding: any of its lines
    ]
    assert report.findings[0].path == "src/train.py"
    assert report.summary() == summary(1, 2, 1)


def test_a_check_that_failed_for_another_rule_leaves_the_finding_exercised(tmp_path):
    src = tmp_path / "train.py"
    executed = {src: {3: {"t::mem", "t::clip"}, 5: {"t::mem"}}}
    failures = {
        "t::mem": [CheckFailure("assert_memory_stable", ("TL302",))],
        "t::clip": [CheckFailure("assert_clip_effective", ("TL101",))],
    }
    report = build_report(
        [finding(src, 3, code="TL101"), finding(src, 5, code="TL401"), finding(src, 5)],
        executed,
        failures,
        rootdir=tmp_path,
        order={"t::mem": 0, "t::clip": 1},
    )
    got = [
        (f.line, f.code, f.status, f.confirmed_by, f.confirming_checks, f.other_failures)
        for f in report.findings
    ]
    assert got == [
        (
            3,
            "TL101",
            "confirmed",
            ("t::clip",),
            (("t::clip", "assert_clip_effective"),),
            (("t::mem", "assert_memory_stable"),),
        ),
        (5, "TL302", "confirmed", ("t::mem",), (("t::mem", "assert_memory_stable"),), ()),
        (5, "TL401", "exercised", (), (), (("t::mem", "assert_memory_stable"),)),
    ]
    # the JSON shape is the SPEC's: no extra keys
    assert set(report.to_json()["findings"][0]) == {
        "code",
        "name",
        "path",
        "line",
        "status",
        "tests",
        "confirmed_by",
    }


def test_check_failures_carry_the_check_and_its_rules():
    failed = CheckFailed("grows", check="assert_memory_stable", rules=("TL302", "TL301"))
    try:
        try:
            raise failed
        except CheckFailed as exc:
            raise RuntimeError("wrapped") from exc
    except RuntimeError as exc:
        assert check_failures(exc) == [CheckFailure("assert_memory_stable", ("TL302", "TL301"))]
    assert check_failures(ValueError("x")) == []


def test_paths_outside_the_rootdir_are_relative_posix(tmp_path):
    other = tmp_path / "lib" / "x.py"
    report = build_report([finding(other, 1)], {}, {}, tmp_path / "proj")
    assert report.findings[0].path == "../lib/x.py"


def test_check_failures_are_found_in_chains_and_groups():
    failed = CheckFailed("grows", check="assert_memory_stable")
    assert is_check_failure(failed)
    assert not is_check_failure(AssertionError("plain assert"))
    try:
        try:
            raise failed
        except CheckFailed as exc:
            raise RuntimeError("wrapped") from exc
    except RuntimeError as exc:
        assert is_check_failure(exc)
    try:
        try:
            raise failed
        except CheckFailed:
            raise ValueError("while handling") from None
    except ValueError as exc:
        assert not is_check_failure(exc)  # the user said it is not the cause
    if sys.version_info >= (3, 11):
        group = ExceptionGroup("steps", [ValueError("x"), ExceptionGroup("inner", [failed])])  # noqa: F821
        assert is_check_failure(group)


def test_a_collector_that_cannot_label_tests_is_noticed():
    from types import SimpleNamespace

    from coverage import Coverage

    assert contexts_supported(Coverage(data_file=None))  # not started: no core yet
    sysmon = SimpleNamespace(_core=SimpleNamespace(supports_dynamic_contexts=False))
    assert not contexts_supported(sysmon)


# ------------------------------------- a schedule checked on its own confirms TL201


def test_a_failure_confirms_findings_naming_the_class_it_built(tmp_path):
    # TL201 is reported at `scheduler.step()`; a schedule test (as the docs show it) builds
    # the scheduler in the test and never runs that line.
    src = tmp_path / "train.py"
    tl201 = finding(src, 12, code="TL201")
    tl201.message = "`CosineAnnealingLR` counts epochs but is stepped every batch"
    other = finding(src, 20, code="TL201")
    other.message = "`StepLR` counts epochs but is stepped every batch"
    failures = {
        "t::sched": [
            CheckFailure(
                "assert_lr_schedule",
                ("TL201", "TL207"),
                ("torch.optim.lr_scheduler.CosineAnnealingLR",),
            )
        ],
        "t::mem": [CheckFailure("assert_memory_stable", ("TL201",))],  # built nothing
    }
    report = build_report([tl201, other], {}, failures, rootdir=tmp_path)
    got = [(f.line, f.status, f.tests, f.confirmed_by) for f in report.findings]
    assert got == [
        (12, "confirmed", (), ("t::sched",)),
        (20, "not-exercised", (), ()),  # another class: not this failure's
    ]


def test_check_failures_carry_the_classes_the_check_built():
    class Trace:
        built = ("torch.optim.lr_scheduler.StepLR",)

    failed = CheckFailed("x", check="assert_lr_schedule", rules=("TL201",), result=Trace())
    assert check_failures(failed) == [
        CheckFailure("assert_lr_schedule", ("TL201",), ("torch.optim.lr_scheduler.StepLR",))
    ]


SCHEDULE_TRAIN = dedent(
    """
    import torch
    from torch.optim.lr_scheduler import CosineAnnealingLR


    def train(model, loader, epochs):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sched = CosineAnnealingLR(opt, T_max=epochs)
        for epoch in range(epochs):
            for x, y in loader:
                opt.zero_grad()
                loss = ((model(x) - y) ** 2).mean()
                loss.backward()
                opt.step()
                sched.step()
    """
)

SCHEDULE_TESTS = """
    from torch.optim.lr_scheduler import CosineAnnealingLR

    EPOCHS, BATCHES = 6, 10


    def test_schedule(assert_lr_schedule):
        assert_lr_schedule(lambda opt: CosineAnnealingLR(opt, T_max=EPOCHS), steps=EPOCHS * BATCHES)
    """


@pytest.mark.slow  # a pytest run in a subprocess, with coverage
def test_tl201_is_confirmed_by_a_failing_schedule_test_of_that_scheduler(pytester):
    write(
        pytester.path,
        {
            "pyproject.toml": "[tool.pytest.ini_options]\naddopts = '-p no:cacheprovider'\n",
            "pkg/__init__.py": "",
            "pkg/train.py": SCHEDULE_TRAIN,
            "tests/test_schedule.py": SCHEDULE_TESTS,
        },
    )
    step_line = where(SCHEDULE_TRAIN, "sched.step()", "sched")[0]
    result = pytester.runpytest_subprocess(
        "--trainlint", "--trainlint-paths=pkg", "--trainlint-report=out.json"
    )
    result.assert_outcomes(failed=1)
    report = json.loads((pytester.path / "out.json").read_text(encoding="utf-8"))
    test = "tests/test_schedule.py::test_schedule"
    tl201 = [f for f in report["findings"] if f["code"] == "TL201"]
    assert tl201 == [
        entry(
            "TL201", "scheduler-unit-mismatch", "pkg/train.py", step_line, "confirmed", [], [test]
        )
    ]
