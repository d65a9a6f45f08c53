"""The user docs work as written: commands, recipes and the version they pin."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trainlint import __version__

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
GETTING_STARTED = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def test_readme_opens_with_the_lint_and_the_test_command_that_ci_runs():
    commands = [
        ln for ln in _blocks(README, "bash")[0].splitlines() if ln and not ln.startswith("#")
    ]
    assert commands[0] == "pip install . && trainlint check fixtures/"
    assert commands[1].startswith("pip install torch==2.13.0 && pip install -e '.[test]'")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert commands[1] in ci.splitlines()


def test_install_from_a_checkout_or_a_wheel_and_later_by_name():
    install = GETTING_STARTED.split("## Install", 1)[1].split("\n## ", 1)[0]
    assert re.search(r"^pip install \.(\s|$)", install, flags=re.M)
    assert "pip wheel --no-deps -w dist ." in install
    assert "pip install dist/trainlint-*.whl" in install
    assert "pip install trainlint" in install


def test_pre_commit_rev_is_the_release_tag_of_this_version():
    assert re.findall(r"rev: (\S+)", GETTING_STARTED) == [f"v{__version__}"]
    assert f"@v{__version__}" in GETTING_STARTED  # the CI recipe installs the same tag


def test_diff_exit_status_is_in_the_readmes_list():
    status = README.split("Exit status:", 1)[1].split("\n\n", 2)[1]
    assert "`--diff`" in status and "without an" in status


@pytest.mark.skipif(
    importlib.util.find_spec("pre_commit") is None or not shutil.which("git"),
    reason="needs pre-commit and git",
)
def test_local_pre_commit_recipe_runs_as_written(tmp_path):
    (recipe,) = [b for b in _blocks(GETTING_STARTED, "yaml") if "repo: local" in b]
    sample = tmp_path / "sample"
    sample.mkdir()
    (sample / ".pre-commit-config.yaml").write_text(recipe)
    (sample / "train.py").write_text(
        "import argparse\nimport torch\nargs = argparse.ArgumentParser().parse_args()\n"
        "torch.save({'args': args}, 'run/last.pt')\nckpt = torch.load('run/last.pt')\n"
    )
    # "trainlint installed in the environment that runs pre-commit": this interpreter's
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "trainlint"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m trainlint "$@"\n')
    shim.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PRE_COMMIT_HOME": str(tmp_path / "home"),
        "PRE_COMMIT_COLOR": "never",
    }
    for args in (["init", "-q"], ["add", "."]):
        subprocess.run(["git", *args], cwd=sample, check=True, capture_output=True)
    proc = subprocess.run(
        [sys.executable, "-m", "pre_commit", "run", "--all-files"],
        cwd=sample,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "train.py:5:8: TL704" in proc.stdout


def test_example_output_shows_the_messages_trainlint_prints():
    # a finding line in the docs is a message some fixture gets verbatim (the snapshot the
    # snapshot test keeps current): messages that grew a "what to do" part stay in step
    snapshot = (ROOT / "tests" / "snapshots" / "fixtures.full.txt").read_text(encoding="utf-8")
    printed = {
        ln.split(": ", 1)[1]
        for ln in snapshot.splitlines()
        if re.match(r"\S+:\d+:\d+: TL\d{3} ", ln)
    }
    shown = [
        ln.split(": ", 1)[1]
        for text in (README, GETTING_STARTED)
        for block in _blocks(text, "text")
        for ln in block.splitlines()
        if re.match(r"\S+:\d+:\d+: TL\d{3} ", ln)
    ]
    assert shown
    assert [m for m in shown if m not in printed] == []
