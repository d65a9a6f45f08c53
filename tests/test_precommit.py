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
    # TL702 is opt-in (security hygiene): the sample project selects it
    (sample / "pyproject.toml").write_text('[tool.trainlint]\nextend-select = ["TL702"]\n')
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


def _clone_at_working_tree(tmp_path: Path) -> tuple[Path, str]:
    """A clone of this repository whose HEAD is a commit of the working tree as it is
    (tracked and new files, uncommitted edits included): what a user pins by hash."""
    clone = tmp_path / "trainlint-clone"
    _git("clone", "-q", "--no-hardlinks", str(ROOT), str(clone), cwd=tmp_path)
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout
    import shutil

    for raw in listed.split(b"\0"):
        rel = os.fsdecode(raw)
        if rel and (ROOT / rel).is_file():
            (clone / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, clone / rel)
    _git("add", "-A", cwd=clone)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty",
         "-m", "working tree"],
        cwd=clone, check=True, capture_output=True,
    )  # fmt: skip
    sha = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=clone, check=True, capture_output=True, text=True
    ).stdout.strip()
    return clone, sha


@pytest.mark.slow  # clones the repository and builds pre-commit's environments
@needs_pre_commit[0]
@needs_pre_commit[1]
def test_documented_recipe_pinned_by_commit_runs_from_a_clone(tmp_path):
    """Issue 36, items 3-5: the getting-started recipe, verbatim but for the repository
    (a local clone) and the hash it pins (the clone's HEAD), works with both hooks: the
    report hook skips what the config excludes, the fix hook applies a fix that needs
    libcst, with no pip advice."""
    import re

    text = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    (recipe,) = [b for b in re.findall(r"```yaml\n(.*?)```", text, flags=re.S) if "rev: " in b]
    clone, sha = _clone_at_working_tree(tmp_path)
    pinned = re.search(r"rev: ([0-9a-f]{40})", recipe)
    assert pinned, "the recipe pins a commit hash"
    recipe = recipe.replace("https://github.com/trainlint/trainlint", str(clone))
    recipe = recipe.replace(pinned.group(1), sha)
    sample = tmp_path / "sample"
    sample.mkdir()
    (sample / ".pre-commit-config.yaml").write_text(recipe)
    (sample / "pyproject.toml").write_text('[tool.trainlint]\nexclude = ["generated"]\n')
    (sample / "generated").mkdir()
    (sample / "generated" / "stub.py").write_text("import torch\nsd = torch.load(path)\n")
    (sample / "train.py").write_text(
        "import torch\n\nmodel = torch.nn.Linear(2, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x in loader:\n    loss = model(x).sum()\n    loss.backward()\n"
        "    opt.zero_grad()\n    opt.step()\n"
    )
    _git("init", "-q", cwd=sample)
    _git("add", ".", cwd=sample)
    env = {
        **os.environ,
        "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"),
        "PRE_COMMIT_COLOR": "never",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "pre_commit", "run", "--all-files", "--verbose"],
        cwd=sample,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = proc.stdout + proc.stderr
    assert "generated/stub.py" not in out, out
    assert "pip install" not in out, out
    fixed = (sample / "train.py").read_text()
    assert fixed.index("opt.step()") < fixed.index("opt.zero_grad()"), out


@pytest.mark.slow  # clones the repository and installs it into a fresh virtualenv
@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs a git checkout of trainlint")
def test_documented_ci_recipe_runs_from_a_clone(tmp_path):
    """Issue 36, item 5: the workflow's `run:` steps, verbatim but for the repository (a
    clone) and the hash (its HEAD), install trainlint and write a SARIF report."""
    import json
    import re
    import venv

    text = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    (workflow,) = [
        b for b in re.findall(r"```yaml\n(.*?)```", text, flags=re.S) if "upload-sarif" in b
    ]
    steps = re.findall(r"^\s*- run: (.*)$", workflow, flags=re.M)
    assert len(steps) == 2 and re.search(r"@[0-9a-f]{40}\"$", steps[0])
    clone, sha = _clone_at_working_tree(tmp_path)
    install = re.sub(
        r"git\+https://github\.com/trainlint/trainlint@[0-9a-f]{40}",
        f"git+file://localhost{clone}@{sha}",  # (a PEP 508 URL needs a host)
        steps[0],
    )
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    env = {**os.environ, "PATH": f"{env_dir / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("import torch\nsd = torch.load(path)\n")
    (project / "pyproject.toml").write_text('[tool.trainlint]\nextend-select = ["TL702"]\n')
    for step in (install, steps[1]):
        proc = subprocess.run(
            step, shell=True, cwd=project, env=env, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, step + "\n" + proc.stdout + proc.stderr
    sarif = json.loads((project / "trainlint.sarif").read_text())
    assert sarif["runs"][0]["results"][0]["ruleId"] == "TL702"
