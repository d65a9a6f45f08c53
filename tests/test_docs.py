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
    # the quick suite first, then everything: what CI runs (issue 36, item 7)
    install = "pip install torch==2.13.0 && pip install -e '.[test]'"
    assert commands[1] == f'{install} && python -m pytest -m "not slow"'
    assert commands[2] == "python -m pytest"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert f"{install} && python -m pytest" in ci.splitlines()
    # the fixtures are tracked: the README says not to fix them in place (item 36)
    assert "on a copy, never on fixtures/" in _blocks(README, "bash")[0]


def test_install_from_a_checkout_or_a_wheel_and_later_by_name():
    install = GETTING_STARTED.split("## Install", 1)[1].split("\n## ", 1)[0]
    assert re.search(r"^pip install \.(\s|$)", install, flags=re.M)
    assert "pip wheel --no-deps -w dist ." in install
    assert "pip install dist/trainlint-*.whl" in install
    assert "pip install trainlint" in install


def test_pins_are_commit_hashes_not_tags():
    """Issue 36, item 5: no tag ships from this repository's main: the recipes pin a
    commit (tests/test_precommit.py runs the pre-commit one against a clone)."""
    (rev,) = re.findall(r"rev: (\S+)", GETTING_STARTED)
    assert re.fullmatch(r"[0-9a-f]{40}", rev)
    assert f"git+https://github.com/trainlint/trainlint@{rev}" in GETTING_STARTED
    assert "autoupdate --freeze" in GETTING_STARTED
    assert f"v{__version__}" not in GETTING_STARTED + README


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


def test_plugin_example_works_as_copied_beside_its_pyproject(tmp_path):
    """Issue 36, item 30: the configuration page's plugin module and its test, copied
    verbatim next to a pyproject.toml that names it, run without PYTHONPATH pointing
    there: the rule reports, and its examples pass the harness."""
    doc = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    plugins = doc.split("## Plugins", 1)[1]
    module, test = re.findall(r"^```python\n(.*?)^```$", plugins, flags=re.S | re.M)[:2]
    project = tmp_path / "project"
    project.mkdir()
    (project / "my_company_rules.py").write_text(module)
    (project / "test_my_rules.py").write_text(test)
    (project / "pyproject.toml").write_text('[tool.trainlint]\nplugins = ["my_company_rules"]\n')
    (project / "train.py").write_text(
        "import torch\nfor x in loader:\n    torch.manual_seed(0)\n    opt.zero_grad()\n"
        "    model(x).sum().backward()\n    opt.step()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run(
        [sys.executable, "-m", "trainlint", "check", "--no-cache", "project"],
        cwd=tmp_path,  # not the project: `python -m` would put it on sys.path
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "project/train.py:3:5: EXT101" in proc.stdout, proc.stdout + proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_my_rules.py"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


SAMPLE_TRAIN = """\
import torch
from torch import nn


def train(model: nn.Module, loader, epochs: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs)
    for epoch in range(epochs):
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            norm = torch.stack([p.grad.norm() for p in model.parameters()]).norm()
            print(norm)
            sched.step()
"""


def test_getting_started_sample_output_is_what_the_cli_prints(run_cli, tree):
    """Issue 36, item 34: the sample output is the real output of a run, summary lines
    included, on a project of 14 files whose training script has the two bugs."""
    files = {"src/train.py": SAMPLE_TRAIN}
    files.update({f"src/util{i}.py": f"X = {i}\n" for i in range(13)})
    root = tree(files)
    code, out, _ = run_cli("check", "--no-cache", "src/", cwd=root)
    (sample,) = [b for b in _blocks(GETTING_STARTED, "text") if "src/train.py" in b]
    assert code == 1 and out == sample
