"""Checkpoints across a project (TL704), TL702's new default, and where torch pins are read.

TL704 pairs each `torch.save` with the loads of the same checkpoint in any module of
the project, through the project index; the pin decides only whether a fix is offered.
"""

from __future__ import annotations

import pytest

from trainlint.torch_pin import TorchPins, directory_pin

SAVE_ARGS = (
    "import argparse\nimport torch\nfrom .paths import ckpt_path\n\n"
    "def main():\n    args = argparse.ArgumentParser().parse_args()\n"
    "    torch.save({'model': {}, 'args': ARGS}, ckpt_path(args.out, 'last'))\n"
)
PATHS = "import os\n\ndef ckpt_path(run, tag):\n    return os.path.join(run, tag + '.pt')\n"
LOAD = (
    "import torch\nfrom .paths import ckpt_path\n\n"
    "def evaluate(run):\n    return torch.load(ckpt_path(run, 'last'))\n"
)


def _project(tree, saved: str = "args", load: str = LOAD, **more: str):
    return tree(
        {
            "pyproject.toml": '[project]\nname = "p"\n',
            "pkg/__init__.py": "",
            "pkg/paths.py": PATHS,
            "pkg/train.py": SAVE_ARGS.replace("ARGS", saved),
            "pkg/evaluate.py": load,
            **more,
        }
    )


def _codes(out: str, code: str = "TL704") -> list[str]:
    return [line for line in out.splitlines() if f" {code} " in line]


def test_a_load_in_another_module_through_a_path_helper(run_cli, tree):
    root = _project(tree)
    code, out, _ = run_cli("check", "--no-cache", str(root))
    (found,) = _codes(out)
    assert code == 1 and "evaluate.py:5:12: TL704" in found
    assert "`pkg.train` line 7" in found and "argparse.Namespace" in found
    assert "vars(args)" in found and "weights_only=True" not in found


@pytest.mark.parametrize(
    "load",
    [
        LOAD.replace("ckpt_path(run, 'last'))", "ckpt_path(run, 'last'), weights_only=False)"),
        LOAD.replace("'last'", "'best'"),  # another checkpoint
        "import torch\n\ndef evaluate(url):\n    return torch.hub.load_state_dict_from_url(url)\n",
    ],
    ids=["explicit-false", "other-tag", "downloaded"],
)
def test_near_misses_stay_silent(run_cli, tree, load):
    root = _project(tree, load=load)
    _, out, _ = run_cli("check", "--no-cache", str(root))
    assert not _codes(out)


def test_plain_data_is_silent(run_cli, tree):
    root = _project(tree, saved="vars(args)")
    code, out, _ = run_cli("check", "--no-cache", str(root))
    assert not _codes(out)


def test_editing_the_save_relints_the_loading_file(run_cli, tree):
    """The loading file's cached findings are keyed on its view, which carries the saves."""
    root = _project(tree, **{"pyproject.toml": '[tool.trainlint]\ncache-dir = ".cache"\n'})
    _, out, _ = run_cli("check", str(root))
    assert _codes(out)
    (root / "pkg/train.py").write_text(SAVE_ARGS.replace("ARGS", "vars(args)"))
    _, out, _ = run_cli("check", str(root))
    assert not _codes(out)


def test_a_saver_helper_in_another_module(run_cli, tree):
    root = tree(
        {
            "pyproject.toml": '[project]\nname = "p"\n',
            "pkg/__init__.py": "",
            "pkg/dist.py": "import torch\n\ndef save_on_master(*args, **kwargs):\n"
            "    torch.save(*args, **kwargs)\n",
            "pkg/train.py": "import argparse\nimport torch\nfrom .dist import save_on_master\n\n"
            "args = argparse.ArgumentParser().parse_args()\n"
            "save_on_master({'model': {}, 'epoch': 1, 'args': args}, 'out/checkpoint.pth')\n"
            "ckpt = torch.load(args.resume)\nstart = ckpt['epoch']\nweights = ckpt['model']\n",
        }
    )
    _, out, _ = run_cli("check", "--no-cache", str(root))
    (found,) = _codes(out)
    assert "train.py:7:8: TL704" in found and "saved at line 6" in found


def test_tl702_is_off_by_default_and_still_selectable(run_cli, tree):
    root = tree({"load.py": "import torch\nsd = torch.load(path)\n"})
    code, out, _ = run_cli("check", "--no-cache", str(root))
    assert code == 0 and not _codes(out, "TL702")
    code, out, _ = run_cli("check", "--no-cache", "--select", "TL702", str(root))
    assert code == 1 and _codes(out, "TL702")


def test_tl702_gives_no_weights_only_true_advice_for_a_checkpoint_of_objects(run_cli, tree):
    root = _project(tree)
    _, out, _ = run_cli("check", "--no-cache", "--select", "TL702", str(root))
    (found,) = _codes(out, "TL702")
    assert "cannot load it" in found and "pass `weights_only=True`" not in found


def test_rules_table_and_rule_page(run_cli):
    _, out, _ = run_cli("rules")
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    assert rows["TL702"][2] == "off" and rows["TL704"][2] == "on"
    _, page, _ = run_cli("rule", "TL704")
    assert "tests/runtime/test_runtime_checkpoint.py" in page
    assert "weights_only=False" in page


# -- the torch pin, from every file projects write it in ---------------------------------


@pytest.mark.parametrize(
    ("files", "pin", "source"),
    [
        ({"requirements.txt": "numpy\ntorch>=2.0.1  # cuda build\n"}, (2, 0), "requirements.txt"),
        (
            {
                "requirements.txt": "-r requirements/base.txt\n",
                "requirements/base.txt": "torch==1.13",
            },
            (1, 13),
            "requirements.txt",
        ),
        ({"setup.py": "setup(install_requires=['torch>=2.2', 'numpy'])\n"}, (2, 2), "setup.py"),
        (
            {"setup.cfg": "[options]\ninstall_requires =\n    numpy\n    torch>=2.3\n"},
            (2, 3),
            "setup.cfg",
        ),
        (
            {"environment.yml": "dependencies:\n  - python=3.10\n  - pytorch=2.1.0=py3.10_cuda\n"},
            (2, 1),
            "environment.yml",
        ),
        (
            {"pyproject.toml": '[tool.poetry.dependencies]\npython = "^3.10"\ntorch = "^2.4"\n'},
            (2, 4),
            "pyproject.toml",
        ),
        (
            {
                "pyproject.toml": '[project]\nname = "p"\n[project.optional-dependencies]\n'
                'train = ["torch>=2.5"]\n'
            },
            (2, 5),
            "pyproject.toml",
        ),
        (
            {
                "pyproject.toml": '[project]\nname = "p"\ndependencies = ["numpy"]\n',
                "requirements.txt": "torch>=2.7\n",
            },
            (2, 7),
            "requirements.txt",
        ),
        ({"requirements.txt": "torch\n"}, None, None),  # any torch: no pin
        ({"requirements.txt": "torchvision>=0.20\n"}, None, None),
        (
            {"pyproject.toml": '[tool.poetry.dependencies]\ntorch = "^1.13 || ^2.0"\n'},
            (1, 13),
            "pyproject.toml",
        ),
    ],
)
def test_pin_files(tree, files, pin, source):
    root = tree(files)
    found, _ = directory_pin(root)
    assert found == pin
    if pin is not None:
        assert found.source == source


def test_the_message_names_the_pin_file(run_cli, tree):
    root = tree(
        {"requirements.txt": "torch>=2.2\n", "load.py": "import torch\nx = torch.load(p)\n"}
    )
    _, out, _ = run_cli("check", "--no-cache", "--select", "TL702", str(root))
    assert "requirements.txt requires torch>=2.2" in out


def test_pins_are_looked_up_once_per_directory(tree):
    root = tree({"requirements.txt": "torch>=2.6\n", "src/a.py": "", "src/b.py": ""})
    pins = TorchPins()
    assert pins.for_file(str(root / "src/a.py")) == (2, 6)
    (root / "requirements.txt").write_text("torch>=2.1\n")
    assert pins.for_file(str(root / "src/b.py")) == (2, 6)  # (cached for the run)
