"""--fix / --unsafe-fixes / --diff: exact edits, atomic writes, idempotence, notebooks."""

from __future__ import annotations

import json
import os
import stat

import pytest

# TL702's fix is safe here: the loaded state dict goes straight to load_state_dict.
SRC = """\
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = [nn.Linear(2, 2) for _ in range(3)]  # keep this comment


model.load_state_dict(torch.load(path))
for x in loader:
    opt.zero_grad()
    loss = model(x).sum()
    loss.backward(retain_graph=True)
    opt.step()
"""


@pytest.fixture
def run_cli(run_cli):
    """The shared runner, with TL702 selected: it is opt-in, and its fix is the one
    these tests apply and read."""

    def _run(*args, **kwargs):
        if args and args[0] == "check":
            args = ("check", "--extend-select", "TL702", *args[1:])
        return run_cli(*args, **kwargs)

    return _run


def test_diff_writes_nothing(run_cli, tree):
    root = tree({"train.py": SRC})
    code, out, _ = run_cli("check", "--diff", str(root / "train.py"))
    assert code == 1
    assert (
        "+        self.layers = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])  # keep" in out
    )
    assert "+model.load_state_dict(torch.load(path, weights_only=True))" in out
    assert "retain_graph" not in out  # unsafe fixes need --unsafe-fixes
    assert (root / "train.py").read_text() == SRC
    code, out, _ = run_cli("check", "--diff", "--unsafe-fixes", str(root / "train.py"))
    assert "+    loss.backward()" in out


def test_fix_safe_then_unsafe_and_idempotent(run_cli, tree):
    root = tree({"train.py": SRC})
    path = root / "train.py"
    code, out, _ = run_cli("check", "--fix", str(path))
    assert code == 1  # TL301 left: its fix is unsafe
    text = path.read_text()
    assert "nn.ModuleList([" in text and "weights_only=True" in text
    assert "retain_graph=True" in text
    assert "Fixed 2 findings" in out and "--unsafe-fixes" in out
    code, out, _ = run_cli("check", "--fix", "--unsafe-fixes", str(path))
    assert code == 0
    fixed = path.read_text()
    assert "loss.backward()\n" in fixed
    mtime = path.stat().st_mtime_ns
    code, _, _ = run_cli("check", "--fix", "--unsafe-fixes", str(path))
    assert code == 0 and path.read_text() == fixed
    assert path.stat().st_mtime_ns == mtime  # unchanged content is never rewritten
    compile(fixed, "train.py", "exec")


@pytest.mark.parametrize(
    ("prefix", "newline", "encoding"),
    [
        (b"", b"\n", "utf-8"),
        (b"\xef\xbb\xbf", b"\r\n", "utf-8"),
        (b"# -*- coding: latin-1 -*-\n", b"\n", "latin-1"),
    ],
)
def test_fix_preserves_bytes_outside_the_edit(run_cli, tree, prefix, newline, encoding):
    body = "name = 'caf\u00e9'\nimport torch\nm.load_state_dict(torch.load(p))  # \u00e9\n"
    data = prefix + body.replace("\n", newline.decode()).encode(encoding)
    root = tree({"a.py": data})
    path = root / "a.py"
    os.chmod(path, 0o640)
    run_cli("check", "--fix", str(path))
    got = path.read_bytes()
    want = data.replace(b"torch.load(p)", b"torch.load(p, weights_only=True)")
    assert got == want
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


def test_interrupted_write_leaves_original(run_cli, tree, monkeypatch):
    root = tree({"a.py": "import torch\nm.load_state_dict(torch.load(p))\n"})
    path = root / "a.py"

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    from trainlint.config import Settings, select_rules
    from trainlint.rules import builtin_rules
    from trainlint.runner import FixMode, run

    settings = Settings(extend_select=["TL702"])  # (opt-in: its safe fix is the one written)
    result = run(
        [path], select_rules(builtin_rules(), settings), settings, jobs=1, fix=FixMode(write=True)
    )
    assert result.exit_code == 2 and "disk full" in str(result.errors[0])
    assert path.read_text() == "import torch\nm.load_state_dict(torch.load(p))\n"
    assert [p.name for p in root.iterdir()] == ["a.py"]  # no temp file left behind


def test_fix_never_breaks_the_file(tree):
    from trainlint.findings import Edit, Finding, Fix
    from trainlint.fix import fix_text

    def lint(text):
        if "BROKEN" in text:
            return []
        return [
            Finding(
                "TL999",
                "x",
                "a.py",
                1,
                1,
                1,
                2,
                "m",
                fix=Fix("safe", (Edit(1, 1, 1, 2, "BROKEN ("),)),
            )
        ]

    text, applied, _ = fix_text("x = 1\n", lint, unsafe=False)
    assert text == "x = 1\n" and applied == 0


def test_notebook_fix_rewrites_only_changed_cells(run_cli, tree):
    nb = {
        "cells": [
            {"cell_type": "markdown", "metadata": {}, "source": ["# title\n"]},
            {
                "cell_type": "code",
                "execution_count": 1,
                "metadata": {"tags": ["x"]},
                "outputs": [{"output_type": "stream", "name": "stdout", "text": ["hi\n"]}],
                "source": [
                    "%matplotlib inline\n",
                    "import torch\n",
                    "m.load_state_dict(torch.load(p))",
                ],
            },
            {
                "cell_type": "code",
                "execution_count": 2,
                "metadata": {},
                "outputs": [],
                "source": "x = 1",
            },
        ],
        "metadata": {"kernelspec": {"name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    text = json.dumps(nb, indent=1) + "\n"
    root = tree({"n.ipynb": text})
    code, out, _ = run_cli("check", "--fix", str(root / "n.ipynb"))
    assert code == 0, out
    new = json.loads((root / "n.ipynb").read_text())
    assert new["cells"][1]["source"] == [
        "%matplotlib inline\n",
        "import torch\n",
        "m.load_state_dict(torch.load(p, weights_only=True))",
    ]
    assert new["cells"][1]["outputs"] == nb["cells"][1]["outputs"]
    assert new["cells"][0] == nb["cells"][0] and new["cells"][2] == nb["cells"][2]
    assert new["metadata"] == nb["metadata"]
    assert (root / "n.ipynb").read_text().startswith('{\n "cells": [\n  {')


def test_fix_writes_through_a_symlink_and_keeps_the_link(run_cli, tree):
    root = tree(
        {"real/a.py": "import torch\nm.load_state_dict(torch.load(p))\n", "links/.keep": ""}
    )
    target = root / "real" / "a.py"
    os.chmod(target, 0o640)
    link = root / "links" / "a.py"
    link.symlink_to(os.path.relpath(target, link.parent))
    code, out, _ = run_cli("check", "--fix", "--no-cache", str(link))
    assert code == 0 and "Fixed 1 finding" in out
    assert link.is_symlink() and os.readlink(link) == os.path.join("..", "real", "a.py")
    assert (
        target.read_text() == "import torch\nm.load_state_dict(torch.load(p, weights_only=True))\n"
    )
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    # the temp file went beside the target, and nothing was left behind in either folder
    assert sorted(p.name for p in (root / "real").iterdir()) == ["a.py"]
    assert sorted(p.name for p in (root / "links").iterdir()) == [".keep", "a.py"]


def test_fix_through_a_chain_of_symlinks_to_a_notebook(run_cli, tree):
    nb = {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": None,
                "metadata": {},
                "outputs": [],
                "source": ["import torch\n", "m.load_state_dict(torch.load(p))\n"],
            }
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    root = tree({"nb.ipynb": json.dumps(nb, indent=1) + "\n"})
    (root / "one.ipynb").symlink_to("nb.ipynb")
    (root / "two.ipynb").symlink_to("one.ipynb")
    code, _, _ = run_cli("check", "--fix", "--no-cache", str(root / "two.ipynb"))
    assert code == 0
    assert (root / "two.ipynb").is_symlink() and (root / "one.ipynb").is_symlink()
    fixed = json.loads((root / "nb.ipynb").read_text())
    assert fixed["cells"][0]["source"][1] == "m.load_state_dict(torch.load(p, weights_only=True))\n"
