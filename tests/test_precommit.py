"""The pre-commit hooks, installed from this repository by the real pre-commit."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

needs_pre_commit = [
    pytest.mark.skipif(
        importlib.util.find_spec("pre_commit") is None, reason="pre-commit not installed"
    ),
    pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs a git checkout of trainlint"),
]


def _git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


@pytest.mark.slow  # builds pre-commit's own environment for the hooks
@needs_pre_commit[0]
@needs_pre_commit[1]
def test_hooks_install_and_run(tmp_path):
    sample = tmp_path / "sample"
    sample.mkdir()
    _git("init", "-q", cwd=sample)
    # the state dict goes to load_state_dict, so adding weights_only=True is a safe fix
    (sample / "train.py").write_text(
        "import torch\nsd = torch.load(path)\nmodel.load_state_dict(sd)\n"
    )
    (sample / "clean.py").write_text("import torch\nsd = torch.load(path, weights_only=True)\n")
    _git("add", ".", cwd=sample)
    home = tmp_path / "pre-commit-home"
    env = {**os.environ, "PRE_COMMIT_HOME": str(home), "PRE_COMMIT_COLOR": "never"}

    def hook(name: str, *files: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "pre_commit",
                "try-repo",
                str(ROOT),
                name,
                "--files",
                *files,
                "--verbose",
            ],
            cwd=sample,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )

    proc = hook("trainlint", "train.py", "clean.py")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "train.py:2:6: TL702" in proc.stdout
    assert "clean.py" not in proc.stdout.split("TL702")[0].splitlines()[-1]

    proc = hook("trainlint-fix", "train.py")
    assert (sample / "train.py").read_text() == (
        "import torch\nsd = torch.load(path, weights_only=True)\nmodel.load_state_dict(sd)\n"
    ), proc.stdout + proc.stderr


def test_linter_requirements_do_not_pull_torch():
    """pre-commit installs the package without extras: torch must only be an extra."""
    from importlib.metadata import requires

    reqs = requires("trainlint") or []
    core = [r for r in reqs if "extra ==" not in r]
    assert core and not any(r.lower().startswith(("torch", "pytest", "coverage")) for r in core)


def test_plugin_import_does_not_import_torch():
    code = (
        "import sys, trainlint, trainlint.pytest_plugin, trainlint.cli, trainlint.testing\n"
        "from trainlint import lint_source\n"
        "lint_source('import torch\\nx = torch.load(p)\\n')\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
