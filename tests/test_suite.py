"""The test suite itself: slow tests are marked, daily runs skip them, CI runs them all."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SLOW = {
    "tests/test_reliability.py::test_torch_package_sweep",
    "tests/test_reliability.py::test_fuzz_mutated_training_code",
    "tests/test_reliability.py::test_fuzz_generated_programs",
    "tests/test_reliability.py::test_fuzz_generated_syntax_trees",
    "tests/test_sweep.py::test_stdlib_sweep",
    "tests/runtime/test_runtime_stress.py::test_clean_steps_never_fail",
    # processes: two gloo ranks, a pytest run under coverage, pre-commit's environment
    "tests/runtime/test_runtime_ddp.py::test_a_clean_ddp_step_passes",
    "tests/runtime/test_runtime_ddp.py::test_a_hanging_rank_times_out_and_the_ranks_are_terminated",
    "tests/runtime/test_runtime_links.py::test_ddp_in_sync_confirms_only_its_rules",
    "tests/test_confirm.py::test_findings_are_confirmed_exercised_or_not_exercised",
    "tests/test_confirm.py::test_pytest_cov_collector_is_reused_and_its_report_still_works",
    "tests/test_precommit.py::test_hooks_install_and_run",
}


@pytest.mark.slow  # a fresh pytest that imports torch and hypothesmith: CI checks this
def test_sweeps_fuzzing_and_stress_are_marked_slow():
    files = sorted({node.split("::")[0] for node in SLOW})
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            "slow",
            *files,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    collected = {ln.strip() for ln in proc.stdout.splitlines() if "::" in ln}
    assert not SLOW - collected


def test_ci_and_the_readme_run_everything_and_the_readme_shows_the_daily_command():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    runs = [
        ln.split("python -m pytest", 1)[1]
        for ln in ci.splitlines()
        if "python -m pytest" in ln and not ln.startswith("#")
    ]
    assert runs and all("-m" not in args and "slow" not in args for args in runs)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert 'python -m pytest -m "not slow"' in readme
