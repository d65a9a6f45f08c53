"""Third-party rule packs through pluggy: config key, entry points, clashes, typos, faults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainlint.plugins import manager
from trainlint.rule_testing import check_rule

PKGS = Path(__file__).resolve().parent / "plugin_pkgs"
SEEDED = (
    "import torch\nfor x in loader:\n    torch.manual_seed(0)\n    opt.zero_grad()\n"
    "    model(x).sum().backward()\n    opt.step()\n"
)


@pytest.fixture
def run_cli(run_cli):
    """The shared runner, with TL702 selected: it is opt-in, and its fix is the one
    these tests apply and read."""

    def _run(*args, **kwargs):
        if args and args[0] == "check":
            args = ("check", "--extend-select", "TL702", *args[1:])
        return run_cli(*args, **kwargs)

    return _run


@pytest.fixture(autouse=True)
def plugin_path(monkeypatch):
    monkeypatch.syspath_prepend(str(PKGS))
    manager._manager.cache_clear()
    yield
    manager._manager.cache_clear()


def test_third_party_rule_uses_the_same_harness():
    from tl_example_plugin import SeedInsideStep

    check_rule(SeedInsideStep)


def test_plugin_from_config_key(run_cli, tree):
    root = tree(
        {
            "pyproject.toml": '[tool.trainlint]\nplugins = ["tl_example_plugin"]\n',
            "train.py": SEEDED,
        }
    )
    code, out, _ = run_cli("check", "--no-cache", str(root))
    assert code == 1 and "train.py:3:5: EXT101 seed-inside-step" in out
    code, out, _ = run_cli("rules", cwd=root)
    assert "EXT101" in out and "seed-inside-step" in out
    code, out, _ = run_cli("rule", "EXT101", cwd=root)
    assert "From plugin: tl_example_plugin" in out and "## Why is this bad?" in out
    code, out, _ = run_cli("check", "--no-cache", "--output-format", "count", str(root))
    assert out == "1 findings\n"
    code, out, _ = run_cli("check", "--no-cache", "--select", "EXT", str(root))
    assert "EXT101" in out


def test_plugin_from_entry_point(run_cli, tree, monkeypatch, tmp_path):
    dist = tmp_path / "site" / "tl_example_plugin-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tl-example-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[trainlint]\nexample = tl_example_plugin\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    root = tree({"train.py": SEEDED})
    code, out, _ = run_cli("check", "--no-cache", str(root / "train.py"))
    assert code == 1 and "EXT101" in out


def test_code_clash_names_both(run_cli, tree):
    root = tree(
        {"pyproject.toml": '[tool.trainlint]\nplugins = ["tl_clash_plugin"]\n', "a.py": "x = 1\n"}
    )
    code, _, err = run_cli("check", str(root))
    assert code == 2
    assert "TL301" in err and "built-in" in err and "tl_clash_plugin" in err


def test_misspelled_hook_is_rejected(run_cli, tree):
    root = tree(
        {"pyproject.toml": '[tool.trainlint]\nplugins = ["tl_typo_plugin"]\n', "a.py": "x = 1\n"}
    )
    code, _, err = run_cli("check", str(root))
    assert code == 2 and "trainlint_rule" in err


def test_unknown_plugin_module(run_cli, tree):
    root = tree(
        {
            "pyproject.toml": '[tool.trainlint]\nplugins = ["no_such_plugin_mod"]\n',
            "a.py": "x = 1\n",
        }
    )
    code, _, err = run_cli("check", str(root))
    assert code == 2 and "no_such_plugin_mod" in err


def test_raising_plugin_rule_is_isolated(run_cli, tree):
    root = tree(
        {
            "pyproject.toml": '[tool.trainlint]\nplugins = ["tl_broken_plugin"]\n'
            'extend-select = ["BRK"]\n',
            "train.py": "import torch\nsd = torch.load(p)\n",
        }
    )
    code, out, err = run_cli("check", "--no-cache", "--output-format", "json", str(root))
    assert code == 2
    assert [f["code"] for f in json.loads(out)] == ["TL702"]
    assert "BRK001" in err and "train.py" in err and "plugin bug" in err
