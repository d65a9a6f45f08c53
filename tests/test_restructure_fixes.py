"""Fixes that move, wrap or dedent statements (fix intents carried out with libcst).

Each positive fixture of a restructuring rule with a ``.py.fixed`` twin is linted,
fixed, re-linted and re-fixed: the output equals the twin, parses, has no finding of
the rule left, and a second fix changes nothing. Cases the transform must not touch
are checked to stay unfixed.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainlint.config import Settings, select_rules
from trainlint.engine import Linter
from trainlint.fix import fix_text
from trainlint.rules import builtin_rules

pytest.importorskip("libcst")

ROOT = Path(__file__).resolve().parent.parent
TWINS = sorted(ROOT.glob("fixtures/**/*.py.fixed"))
RESTRUCTURING = {"TL101", "TL102", "TL104", "TL110", "TL202", "TL303", "TL603", "TL701"}


@pytest.fixture
def run_cli(run_cli):
    """The shared runner, with TL702 selected: it is opt-in, and its fix is the one
    these tests apply and read."""

    def _run(*args, **kwargs):
        if args and args[0] == "check":
            args = ("check", "--extend-select", "TL702", *args[1:])
        return run_cli(*args, **kwargs)

    return _run


def _linter(*codes: str) -> Linter:
    return Linter(select_rules(builtin_rules(), Settings(), cli_select=list(codes)))


def _fix(text: str, *codes: str, unsafe: bool = True) -> tuple[str, int, list]:
    linter = _linter(*codes)
    return fix_text(
        text,
        lambda t: linter.lint_bytes(t.encode("utf-8"), "train.py", text=t).findings,
        unsafe,
    )


def test_every_restructuring_rule_has_a_fixture_twin():
    codes = {"TL" + p.name[2:5] for p in TWINS}
    assert codes >= RESTRUCTURING


@pytest.mark.parametrize("twin", TWINS, ids=lambda p: p.name[: -len(".py.fixed")])
def test_fixture_fixes_to_its_twin(twin):
    code = "TL" + twin.name[2:5]
    source = twin.with_name(twin.name[: -len(".fixed")]).read_text(encoding="utf-8")
    want = twin.read_text(encoding="utf-8")
    fixed, applied, left = _fix(source, code)
    assert applied >= 1
    assert fixed == want
    ast.parse(fixed)
    assert [f for f in left if f.code == code] == []
    again, n, _ = _fix(fixed, code)
    assert again == fixed and n == 0
    # comments survive the move: every comment line of the source is still there
    comments = sorted(ln.split("#", 1)[1] for ln in source.splitlines() if "#" in ln)
    assert comments == sorted(ln.split("#", 1)[1] for ln in fixed.splitlines() if "#" in ln)


@pytest.mark.parametrize(
    "name", ["tl603_helper_of_helper.py", "tl603_multi_item_async_and_positional_disable.py"]
)
def test_fixtures_that_stay_unfixed(name):
    source = (ROOT / "fixtures" / "numerics" / name).read_text(encoding="utf-8")
    fixed, applied, left = _fix(source, "TL603")
    assert fixed == source and applied == 0 and any(f.code == "TL603" for f in left)


LOOP = """\
import torch
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
{between}    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
"""


@pytest.mark.parametrize(
    "between",
    [
        "    try:\n        log(loss)\n    except ValueError:\n        pass\n",  # spans a try
        "    if loss.item() > 1e3:\n        continue\n",  # a jump between
        "    log(loss); log2(loss)\n",  # two statements on a line
        "    max_norm = schedule(it)\n",  # the clip reads a name assigned in between
    ],
)
def test_move_left_undone_when_unsafe(between):
    source = LOOP.format(between=between)
    fixed, applied, left = _fix(source, "TL110")
    assert fixed == source and applied == 0
    assert [f.code for f in left] == ["TL110"]


READ_AFTER_ZERO = """\
import torch
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
    {step}
    optimizer.zero_grad()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
    log(norm)
"""


def test_gradient_read_moves_before_the_step_unless_a_name_crosses():
    fixed, applied, _ = _fix(READ_AFTER_ZERO.format(step="optimizer.step()"), "TL101")
    assert applied == 1
    assert fixed.index("norm = torch") < fixed.index("optimizer.step()")
    assert fixed.index("log(norm)") > fixed.index("optimizer.zero_grad()")
    # the step's result feeds the read: moving it would read a name not yet assigned
    source = READ_AFTER_ZERO.format(step="stats = optimizer.step()").replace(
        'float("inf"))', 'float("inf")) + stats'
    )
    fixed, applied, left = _fix(source, "TL101")
    assert fixed == source and applied == 0 and [f.code for f in left] == ["TL101"]


def test_move_keeps_comments_blank_lines_and_crlf():
    source = (
        "import torch\r\n"
        "for x, y in loader:  # batches\r\n"
        "    optimizer.zero_grad()\r\n"
        "    loss = criterion(model(x),\r\n"
        "                     y)  # continuation line\r\n"
        "    loss.backward()\r\n"
        "    optimizer.step()\r\n"
        "\r\n"
        "    # keep updates bounded\r\n"
        "    torch.nn.utils.clip_grad_norm_(\r\n"
        "        model.parameters(), 1.0)  # max norm\r\n"
    )
    fixed, applied, left = _fix(source, "TL110")
    assert applied == 1 and left == []
    assert fixed == (
        "import torch\r\n"
        "for x, y in loader:  # batches\r\n"
        "    optimizer.zero_grad()\r\n"
        "    loss = criterion(model(x),\r\n"
        "                     y)  # continuation line\r\n"
        "    loss.backward()\r\n"
        "\r\n"
        "    # keep updates bounded\r\n"
        "    torch.nn.utils.clip_grad_norm_(\r\n"
        "        model.parameters(), 1.0)  # max norm\r\n"
        "    optimizer.step()\r\n"
    )


def test_wrap_reindents_nested_blocks_with_tabs_and_keeps_strings():
    source = (
        "import torch as T\n"
        "def evaluate(model, loader):\n"
        "\tmodel.eval()\n"
        "\tfor x, y in loader:\n"
        "\t\t# per batch\n"
        "\t\tout = model(x)\n"
        "\t\tif out.isnan().any():\n"
        "\t\t\tprint('''nan\n"
        "at batch''')\n"
        "\treturn out\n"
    )
    fixed, applied, _ = _fix(source, "TL303")
    assert applied == 1
    assert fixed == (
        "import torch as T\n"
        "def evaluate(model, loader):\n"
        "\tmodel.eval()\n"
        "\twith T.no_grad():\n"
        "\t\tfor x, y in loader:\n"
        "\t\t\t# per batch\n"
        "\t\t\tout = model(x)\n"
        "\t\t\tif out.isnan().any():\n"
        "\t\t\t\tprint('''nan\n"
        "at batch''')\n"
        "\treturn out\n"
    )


def test_unsafe_intents_wait_for_unsafe_fixes():
    source = "import torch\nfor x in loader:\n    opt.step()\n    model(x).sum().backward()\n"
    fixed, applied, left = _fix(source, "TL104", unsafe=False)
    assert fixed == source and applied == 0 and left[0].fix.applicability == "unsafe"


def test_json_carries_the_intent_and_round_trips():
    from trainlint.findings import Finding

    text = LOOP.format(between="")
    (finding,) = _linter("TL110").lint_bytes(text.encode(), "t.py", text=text).findings
    data = json.loads(json.dumps(finding.to_dict()))
    assert data["fix"]["intent"]["kind"] == "move"
    assert Finding.from_dict(data).fix == finding.fix


def test_notebook_cells_are_restructured_in_place(run_cli, tree):
    cell = [
        "%load_ext autoreload\n",
        "for x, y in loader:\n",
        "    opt.zero_grad()\n",
        "    crit(model(x), y).backward()\n",
        "    opt.step()\n",
        "    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # clip",
    ]
    nb = {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": None,
                "metadata": {},
                "outputs": [],
                "source": ["import torch\n"],
            },
            {
                "cell_type": "code",
                "execution_count": None,
                "metadata": {},
                "outputs": [],
                "source": cell,
            },
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    root = tree({"n.ipynb": json.dumps(nb, indent=1) + "\n"})
    code, out, _ = run_cli("check", "--fix", "--select", "TL110", str(root / "n.ipynb"))
    assert code == 0, out
    got = json.loads((root / "n.ipynb").read_text())["cells"][1]["source"]
    assert got == [*cell[:4], cell[5] + "\n", "    opt.step()"]
    code, out, _ = run_cli("check", "--fix", "--select", "TL110", str(root / "n.ipynb"))
    assert code == 0 and "Fixed" not in out


def test_missing_libcst_says_what_to_install_and_still_applies_text_fixes(
    run_cli, tree, monkeypatch
):
    import trainlint.fix as fix

    monkeypatch.setattr(fix, "_LIBCST", False)
    src = "import torch\nm.load_state_dict(torch.load(p))\n" + LOOP.format(between="")
    root = tree({"t.py": src})
    code, _, err = run_cli("check", "--fix", "--jobs", "1", "--no-cache", str(root / "t.py"))
    assert code == 2
    assert err.strip().splitlines()[-1] == fix.MISSING_LIBCST
    assert "weights_only=True" in (root / "t.py").read_text()  # the text fix was applied
    # not asked for a structural fix: no complaint
    code, _, err = run_cli(
        "check", "--fix", "--select", "TL702", "--jobs", "1", "--no-cache", str(root / "t.py")
    )
    assert code == 0 and "libcst" not in err


def test_plain_check_never_imports_libcst(tmp_path):
    (tmp_path / "t.py").write_text(LOOP.format(between=""))
    code = (
        "import sys\n"
        "from trainlint.cli import main\n"
        f"rc = main(['check', '--no-cache', '--jobs', '1', {str(tmp_path / 't.py')!r}])\n"
        "assert 'libcst' not in sys.modules, 'libcst imported by a plain check'\n"
        "print('rc', rc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert "rc 1" in out.stdout, out.stderr


def test_structural_fix_keeps_cookie_encoding_crlf_mode_and_the_link(run_cli, tree):
    import os
    import stat

    # a latin-1 file with its cookie and CRLF endings, reached through a symlink
    text = "# -*- coding: latin-1 -*-\r\n" + LOOP.format(between="    # naïve clip\r\n").replace(
        "max_norm", "1.0"
    ).replace("\n", "\r\n").replace("\r\r\n", "\r\n")
    root = tree({"real/train.py": text.encode("latin-1")})
    target = root / "real" / "train.py"
    os.chmod(target, 0o640)
    (root / "src").mkdir()
    link = root / "src" / "train.py"
    link.symlink_to(os.path.join("..", "real", "train.py"))
    code, _, _ = run_cli("check", "--fix", "--no-cache", "--select", "TL110", str(link))
    assert code == 0
    assert link.is_symlink()
    data = target.read_bytes()
    assert data.startswith(b"# -*- coding: latin-1 -*-\r\n")
    assert "naïve".encode("latin-1") in data and b"\n" not in data.replace(b"\r\n", b"")
    fixed = data.decode("latin-1")
    assert fixed.index("clip_grad_norm_") < fixed.index("optimizer.step()")
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
