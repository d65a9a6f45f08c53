"""The target torch version: `target-torch` in the config, else the project's own torch pin.

TL702 reads it: a `torch.load` without `weights_only` is unsafe only before torch 2.6.
"""

from __future__ import annotations

import json

import pytest

from trainlint.config import TorchPins, torch_requirement

LOAD = "import torch\nsd = torch.load(path)\n"
EXPLICIT = "import torch\nmodel.load_state_dict(torch.load(path, weights_only=False))\n"


def _pyproject(*deps: str, tool: str = "") -> str:
    listed = ", ".join(json.dumps(d) for d in deps)
    return f'[project]\nname = "p"\ndependencies = [{listed}]\n{tool}'


def _tl702(out: str) -> list[str]:
    return [line for line in out.splitlines() if "TL702" in line]


@pytest.mark.parametrize(
    ("deps", "pin"),
    [
        (["torch>=2.6"], (2, 6)),
        (["torch>=2.1.0, <2.10.0"], (2, 1)),
        (["numpy", "torch (>=1.12.1)"], (1, 12)),
        (["torch<3.0,>=2.8"], (2, 8)),
        (["Torch[opt-einsum]~=2.4.1"], (2, 4)),
        (["torch==2.5.*"], (2, 5)),
        (["torch>2.5"], (2, 5)),  # 2.5.1 is allowed
        (["torch>=2"], (2, 0)),
        (["torch>=2.7; sys_platform == 'linux'", "torch>=2.3; sys_platform == 'darwin'"], (2, 3)),
        (["torch"], None),  # no lower bound: any torch
        (["torch<3"], None),
        (["torch>=2.6", "torch; sys_platform == 'win32'"], None),
        (["torchvision>=0.21", "torch_optimizer>=0.3"], None),  # not torch
        (["torch @ https://example.org/torch-2.6.0.whl"], None),
        ([], None),
    ],
)
def test_torch_requirement(deps, pin):
    assert torch_requirement(deps) == pin


def test_missing_weights_only_follows_the_project_pin(run_cli, tree):
    root = tree(
        {
            "new/pyproject.toml": _pyproject("torch>=2.6,<3"),
            "new/src/pkg/load.py": LOAD,
            "old/pyproject.toml": _pyproject("torch>=2.2"),
            "old/load.py": LOAD,
            "none/pyproject.toml": _pyproject("numpy"),
            "none/load.py": LOAD,
        }
    )
    _, out, _ = run_cli("check", "--extend-select", "TL702", "--no-cache", str(root))
    found = _tl702(out)
    assert not [f for f in found if "new" in f]
    (old,) = [f for f in found if "old" in f]
    assert "pyproject.toml requires torch>=2.2" in old
    (none,) = [f for f in found if "none" in f]
    assert "no torch pin found, assuming 2.1" in none


def test_explicit_false_is_reported_on_every_torch(run_cli, tree):
    root = tree({"pyproject.toml": _pyproject("torch>=2.6"), "load.py": EXPLICIT})
    code, out, _ = run_cli("check", "--extend-select", "TL702", "--no-cache", str(root))
    assert code == 1 and "load.py:2:23: TL702" in out


def test_target_torch_setting_wins_over_the_pin(run_cli, tree):
    root = tree(
        {
            "pyproject.toml": _pyproject(
                "torch>=2.6", tool='[tool.trainlint]\ntarget-torch = "2.4"\n'
            ),
            "load.py": LOAD,
        }
    )
    _, out, _ = run_cli("check", "--extend-select", "TL702", "--no-cache", str(root))
    (found,) = _tl702(out)
    assert "`target-torch` 2.4" in found
    (root / "pyproject.toml").write_text(
        _pyproject("torch>=2.1") + '[tool.trainlint]\ntarget-torch = "2.6"\n'
    )
    code, out, _ = run_cli("check", "--extend-select", "TL702", "--no-cache", str(root))
    assert code == 0 and not _tl702(out)


def test_rule_table_target_torch_wins_over_the_setting(run_cli, tree):
    root = tree(
        {
            "trainlint.toml": 'target-torch = "2.6"\n[rules.TL702]\ntarget-torch = "2.3"\n',
            "load.py": LOAD,
        }
    )
    _, out, _ = run_cli("check", "--extend-select", "TL702", "--no-cache", str(root))
    assert "`target-torch` 2.3" in out


def test_changing_target_torch_is_not_served_from_the_cache(run_cli, tree):
    root = tree({"trainlint.toml": 'target-torch = "2.1"\n', "load.py": LOAD})
    code, _, _ = run_cli("check", "--extend-select", "TL702", str(root))
    assert code == 1
    (root / "trainlint.toml").write_text('target-torch = "2.6"\n')
    code, out, _ = run_cli("check", "--extend-select", "TL702", str(root))
    assert code == 0, out


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ("[tool.trainlint]\ntarget-torch = 2.6\n", "tool.trainlint.target-torch"),
        ('[tool.trainlint]\ntarget-torch = "2.x"\n', "tool.trainlint.target-torch"),
        ('[tool.trainlint]\ntarget-torch = ">=2.6"\n', "tool.trainlint.target-torch"),
        ('[tool.trainlint.rules.TL702]\ntarget-torch = "latest"\n', "rules.TL702.target-torch"),
    ],
)
def test_bad_target_torch_is_a_config_error(run_cli, tree, config, key):
    root = tree({"pyproject.toml": config, "load.py": LOAD})
    code, out, err = run_cli("check", "--extend-select", "TL702", str(root))
    assert code == 2 and out == ""
    assert f"`{key}` must be a torch version" in err and "pyproject.toml" in err


def test_findings_have_the_rule_severity(run_cli, tree):
    """Issue 17, item 5: a finding's severity is its rule's, as `trainlint rules` and SARIF say."""
    from trainlint.rules.state.unsafe_torch_load import UnsafeTorchLoad

    root = tree({"load.py": LOAD + "m.load_state_dict(torch.load(p, weights_only=False))\n"})
    _, out, _ = run_cli(
        "check", "--extend-select", "TL702", "--no-cache", "--output-format", "json", str(root)
    )
    findings = json.loads(out)
    assert len(findings) == 2
    assert {f["severity"] for f in findings} == {UnsafeTorchLoad.severity}


def test_pin_search_stops_at_a_project_root(tree):
    root = tree(
        {
            "pyproject.toml": _pyproject("torch>=2.6"),
            "vendored/trainlint.toml": "",
            "vendored/pkg/load.py": LOAD,
            "repo/.git/HEAD": "ref: refs/heads/main\n",
            "repo/load.py": LOAD,
            "inside/deeper/load.py": LOAD,
        }
    )
    pins = TorchPins()
    assert pins.for_file(str(root / "vendored/pkg/load.py")) is None
    assert pins.for_file(str(root / "repo/load.py")) is None
    assert pins.for_file(str(root / "inside/deeper/load.py")) == (2, 6)
    assert pins.for_file(str(root / "missing.py")) is None  # a source not on disk


def test_a_broken_pyproject_gives_no_pin(run_cli, tree):
    root = tree({"pyproject.toml": "[project\n", "load.py": LOAD})
    code, out, _ = run_cli("check", "--extend-select", "TL702", "--no-cache", str(root / "load.py"))
    assert code == 1 and "assuming 2.1" in out


def test_safe_fix_only_into_load_state_dict(run_cli, tree):
    root = tree(
        {
            "a.py": "import torch\nmodel.load_state_dict(torch.load(p))\n",
            "b.py": "import torch\nckpt = torch.load(p)\nstart = ckpt['epoch']\n",
        }
    )
    run_cli("check", "--extend-select", "TL702", "--fix", "--no-cache", str(root))
    assert "weights_only=True" in (root / "a.py").read_text()
    assert "weights_only" not in (root / "b.py").read_text()  # unsafe: needs --unsafe-fixes
    run_cli("check", "--extend-select", "TL702", "--fix", "--unsafe-fixes", "--no-cache", str(root))
    assert "weights_only=True" in (root / "b.py").read_text()


def test_editing_the_pin_relints_unchanged_files(run_cli, tree):
    """The cache key includes the project's torch pin, not only the file's bytes."""
    tool = '[tool.trainlint]\ncache-dir = ".cache"\n'
    root = tree({"pyproject.toml": _pyproject("torch>=2.1", tool=tool), "load.py": LOAD})
    code, out, _ = run_cli("check", "--extend-select", "TL702", str(root))
    assert code == 1 and _tl702(out)
    assert any((root / ".cache").rglob("*.json"))
    (root / "pyproject.toml").write_text(_pyproject("torch>=2.6", tool=tool))
    code, out, _ = run_cli("check", "--extend-select", "TL702", str(root))
    assert code == 0 and not _tl702(out)
