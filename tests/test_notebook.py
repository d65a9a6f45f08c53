"""Notebooks: IPython syntax masked as IPython reads it, one bad cell never blinds the
rest, and locations that point at the right cell in every output format."""

from __future__ import annotations

import json

import pytest

from trainlint.notebook import mask_cell

# A training loop that holds every batch's graph (TL301 on its line 4).
LEAK_CELL = [
    "for x in loader:\n",
    "    loss = model(x).sum()\n",
    "    opt.zero_grad()\n",
    "    loss.backward(retain_graph=True)\n",
    "    opt.step()\n",
]


@pytest.fixture
def run_cli(run_cli):
    """The shared runner, with TL702 selected: it is opt-in, and its fix is the one
    these tests apply and read."""

    def _run(*args, **kwargs):
        if args and args[0] == "check":
            args = ("check", "--extend-select", "TL702", *args[1:])
        return run_cli(*args, **kwargs)

    return _run


def notebook(*cells, indent=1):
    """cells: source strings/lists (code) or ("markdown", text)."""
    out = []
    for c in cells:
        if isinstance(c, tuple):
            out.append({"cell_type": c[0], "metadata": {}, "source": c[1]})
        else:
            out.append(
                {
                    "cell_type": "code",
                    "execution_count": None,
                    "metadata": {},
                    "outputs": [],
                    "source": c,
                }
            )
    nb = {"cells": out, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    return json.dumps(nb, indent=indent) + "\n"


CELLS_ON = '[tool.trainlint.rules.TL001]\nnotebook-cells = true\n'


def check(run_cli, tree, nb, *args, cells=False):
    """Lint one notebook; ``cells``: with TL001's `notebook-cells` on."""
    root = tree({"nb.ipynb": nb, **({"pyproject.toml": CELLS_ON} if cells else {})})
    code, out, err = run_cli("check", "--no-cache", *args, str(root / "nb.ipynb"), cwd=root)
    return code, out, err


# -- masking, case by case from issue 17 ----------------------------------------------------


@pytest.mark.parametrize(
    ("cell", "masked"),
    [
        # `!cmd \` and `%pip \` with indented continuation lines: one magic, blank continuations
        (
            "!pip install torch \\\n    torchvision \\\n    tqdm\nimport torch\n",
            "pass\n\n\nimport torch\n",
        ),
        ("%pip install \\\n      numpy\nx = 1\n", "pass\n\nx = 1\n"),
        # `%` continuing an expression is the modulo operator, not a magic
        ('msg = ("%s of %s"\n       % (a, b))\n', 'msg = ("%s of %s"\n       % (a, b))\n'),
        ('msg = "%s of %s" \\\n    % (a, b)\n', 'msg = "%s of %s" \\\n    % (a, b)\n'),
        (
            's = """\n!not a shell line\n%not a magic\n"""\n',
            's = """\n!not a shell line\n%not a magic\n"""\n',
        ),
        # a cell magic owns its cell; Python-bodied ones keep the body, masked in turn
        (
            "%%capture out\n!pip install x\n%env A=1\nimport torch\n",
            "pass\npass\npass\nimport torch\n",
        ),
        ("\n%%time\nfor i in range(3):\n    !echo $i\n", "\npass\nfor i in range(3):\n    pass\n"),
        ("%%bash\nfor f in *; do\n  echo $f\ndone\n", "pass\n\n\n\n"),
        # indented magics keep the block non-empty; assignments keep their name
        ("if ok:\n    %time train()\n", "if ok:\n    pass\n"),
        ("files = !ls \\\n    -la\nn = len(files)\n", "files = ...\n\nn = len(files)\n"),
        ("x = %env HOME\n", "x = ...\n"),
        # help: `obj?`, `obj??`, `?obj`; a `?` in a comment or string is code
        ("torch.nn.Linear?\nmodel??\n?opt\n", "pass\npass\npass\n"),
        ("x = 1  # why?\ny = '?'\n", "x = 1  # why?\ny = '?'\n"),
        # `!=` and `%=` at a line's start inside brackets are operators
        ("ok = (a\n      != b)\n", "ok = (a\n      != b)\n"),
    ],
)
def test_masking_follows_ipython(cell, masked):
    assert mask_cell(cell) == masked
    assert mask_cell(cell).count("\n") == cell.count("\n")


IPYTHON_CASES = [
    "for i in range(3):\n    !echo {i}\n    print(i)\n",
    "a, b = !ls\n",
    "x = [1,\n  2]\n%time f(x)\n",
    "!echo it's\nx = 1\n",
    "/print 1 2\n",
    "print(1); %time x\n",
    "x = (1 +\n%s)\n",
    "%%writefile a.py\nimport (\n",
]


@pytest.mark.parametrize("cell", IPYTHON_CASES)
def test_masked_cell_parses_exactly_when_ipythons_own_transform_does(cell):
    import ast

    ipython = pytest.importorskip("IPython.core.inputtransformer2")

    def parses(text):
        try:
            ast.parse(text)
            return True
        except SyntaxError:
            return False

    expected = parses(ipython.TransformerManager().transform_cell(cell))
    assert parses(mask_cell(cell)) == expected


def test_masking_never_raises_and_keeps_every_line():
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    alphabet = st.sampled_from(list("%!?\\\"'#()[]{}:=, \n\tabx1") + ['"""', "%%", "\r\n"])

    @hypothesis.settings(max_examples=300, deadline=None)
    @hypothesis.given(st.lists(alphabet, max_size=60).map("".join))
    def prop(text):
        assert mask_cell(text).count("\n") == text.count("\n")

    prop()


@pytest.mark.parametrize(
    "cell",
    [
        ["!pip install torch \\\n", "    torchvision\n", "import torch\n"],
        ["%pip install \\\n", "    numpy\n", "import torch\n"],
        ["import torch\n", 'name = ("%s-%s"\n', "        % (1, 2))\n"],
        ["%%capture\n", "!pip install -q torch\n", "%load_ext autoreload\n", "import torch\n"],
    ],
    ids=["shell-continued", "pip-continued", "percent-continuation", "capture-with-magics"],
)
def test_valid_notebooks_with_ipython_syntax_are_linted(run_cli, tree, cell):
    code, out, _ = check(run_cli, tree, notebook(cell, LEAK_CELL))
    assert "TL001" not in out
    assert code == 1 and "nb.ipynb:cell 2:4:5: TL301" in out


def test_a_cell_that_does_not_parse_is_tl001_and_the_others_are_still_linted(run_cli, tree):
    nb = notebook(
        ["import torch\n"],
        ["x = 1\n", "def broken(:\n", "    pass\n"],
        ("markdown", "text"),
        LEAK_CELL,
    )
    code, out, _ = check(run_cli, tree, nb, cells=True)
    assert code == 1
    lines = [ln for ln in out.splitlines() if "nb.ipynb" in ln]
    assert lines[0].startswith("nb.ipynb:cell 2:2:12: TL001 syntax-error:")
    assert lines[1].startswith("nb.ipynb:cell 4:4:5: TL301")
    assert len(lines) == 2


def test_a_broken_cell_leaves_the_other_cells_context_intact(run_cli, tree):
    # the model is built in cell 1 and trained in cell 3: cross-cell context still counts
    nb = notebook(["import torch\n"], ["!ls ((\n", "x = (\n"], LEAK_CELL)
    code, out, _ = check(run_cli, tree, nb, "--output-format", "json", cells=True)
    found = json.loads(out)
    assert [(f["code"], f["cell"], f["line"]) for f in found] == [("TL001", 2, 2), ("TL301", 3, 4)]


def test_a_cell_that_does_not_parse_is_left_out_silently_by_default(run_cli, tree):
    # shell lines without `!`, YAML, a Dockerfile: shown in code cells, not Python
    nb = notebook(["import torch\n"], ["FROM python:3.11\n", "RUN pip install torch\n"], LEAK_CELL)
    code, out, _ = check(run_cli, tree, nb, "--output-format", "json")
    found = json.loads(out)
    assert [(f["code"], f["cell"], f["line"]) for f in found] == [("TL301", 3, 4)]


@pytest.mark.parametrize(
    "meta",
    [
        {"jupytext": {"main_language": "bash"}, "language_info": {"name": "python"}},
        {"kernelspec": {"name": "ir", "language": "R", "display_name": "R"}},
    ],
    ids=["jupytext-bash", "r-kernel"],
)
def test_a_notebook_in_another_language_is_not_linted(run_cli, tree, meta):
    nb = json.loads(notebook(["curl -LO https://example.invalid/x.sh\n"], LEAK_CELL))
    nb["metadata"] = meta
    code, out, _ = check(run_cli, tree, json.dumps(nb))
    assert code == 0 and "TL" not in out, out


def test_a_broken_cell_does_not_stop_fixes_in_other_cells(run_cli, tree):
    nb = notebook(["import torch\n", "m.load_state_dict(torch.load(p))\n"], ["def broken(:\n"])
    root = tree({"nb.ipynb": nb, "pyproject.toml": CELLS_ON})
    code, out, _ = run_cli("check", "--fix", "--no-cache", str(root / "nb.ipynb"), cwd=root)
    assert "Fixed 1 finding" in out and "TL001" in out
    cells = json.loads((root / "nb.ipynb").read_text())["cells"]
    assert cells[0]["source"][1] == "m.load_state_dict(torch.load(p, weights_only=True))\n"
    assert cells[1]["source"] == ["def broken(:\n"]


# -- locations -------------------------------------------------------------------------------


def _json_position(nb_text, needle, column):
    """(line, column) in the notebook file of the cell character at ``column`` of the
    source line that contains ``needle``; each source line sits on its own JSON line."""
    for number, raw in enumerate(nb_text.splitlines(), 1):
        if needle in raw:
            return number, raw.index('"') + 1 + column
    raise AssertionError(needle)


def test_findings_print_in_cell_order(run_cli, tree):
    nb = notebook(["import torch\n"], LEAK_CELL, ["sd = torch.load(p)\n"])
    _, out, _ = check(run_cli, tree, nb)
    assert [ln.split(": ")[0] for ln in out.splitlines() if ln.startswith("nb.ipynb")] == [
        "nb.ipynb:cell 2:4:5",
        "nb.ipynb:cell 3:1:6",
    ]


def test_github_annotation_points_into_the_notebook_file_and_names_the_cell(run_cli, tree):
    nb = notebook(["import torch\n"], LEAK_CELL)
    _, out, _ = check(run_cli, tree, nb, "--output-format", "github")
    line, col = _json_position(nb, "loss.backward(retain_graph=True)", 5)
    assert out.startswith(f"::error file=nb.ipynb,line={line},col={col},")
    assert "::cell 2, line 4, col 5: TL301 " in out


def test_sarif_region_is_on_the_notebook_file_with_the_cell_in_its_properties(run_cli, tree):
    nb = notebook(["import torch\n"], LEAK_CELL)
    _, out, _ = check(run_cli, tree, nb, "--output-format", "sarif")
    (result,) = json.loads(out)["runs"][0]["results"]
    loc = result["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"]["uri"] == "nb.ipynb"
    line, col = _json_position(nb, "loss.backward(retain_graph=True)", 5)
    region = loc["region"]
    assert (region["startLine"], region["startColumn"]) == (line, col)
    assert (region["endLine"], region["endColumn"]) == (line, col + 32)
    assert region["properties"] == {
        "cell": 2,
        "cellLine": 4,
        "cellColumn": 5,
        "cellEndLine": 4,
        "cellEndColumn": 37,
    }


def test_notebook_file_positions_follow_escapes_and_one_string_sources(run_cli, tree):
    # source as one string, non-ASCII escaped as \\u00e9, a tab and quotes before the finding
    src = 'import torch\nname = "caf\u00e9\\t"; sd = torch.load(p)\n'
    nb = json.dumps(
        {
            "cells": [
                {
                    "cell_type": "code",
                    "metadata": {},
                    "outputs": [],
                    "execution_count": None,
                    "source": src,
                }
            ],
            "metadata": {},
            "nbformat": 4,
            "nbformat_minor": 5,
        },
        indent=2,
    )
    _, out, _ = check(run_cli, tree, nb, "--output-format", "sarif")
    (result,) = json.loads(out)["runs"][0]["results"]
    region = result["locations"][0]["physicalLocation"]["region"]
    raw_lines = nb.splitlines()
    line = next(i for i, raw in enumerate(raw_lines, 1) if "torch.load(p)" in raw)
    assert region["startLine"] == line
    assert region["startColumn"] == raw_lines[line - 1].index("torch.load(p)") + 1
    assert region["properties"]["cellLine"] == 2


def test_json_keeps_the_cell_field(run_cli, tree):
    nb = notebook(["import torch\n"], LEAK_CELL)
    _, out, _ = check(run_cli, tree, nb, "--output-format", "json")
    (f,) = json.loads(out)
    assert (f["cell"], f["line"], f["column"]) == (2, 4, 5)


def test_a_notebook_that_cannot_be_mapped_gets_no_cell_relative_file_line(tmp_path, monkeypatch):
    from trainlint.findings import Finding
    from trainlint.reporting.github import format_github
    from trainlint.reporting.sarif import format_sarif

    monkeypatch.chdir(tmp_path)  # gone.ipynb does not exist (deleted after linting)
    f = Finding("TL301", "retain-graph-in-loop", "gone.ipynb", 4, 5, 4, 37, "m", cell=2)
    assert format_github([f]) == (
        "::error file=gone.ipynb,title=TL301 retain-graph-in-loop::cell 2, line 4, col 5: TL301 m\n"
    )
    region = json.loads(format_sarif([f]))["runs"][0]["results"][0]["locations"][0][
        "physicalLocation"
    ]["region"]
    assert region == {
        "startLine": 1,
        "properties": {
            "cell": 2,
            "cellLine": 4,
            "cellColumn": 5,
            "cellEndLine": 4,
            "cellEndColumn": 37,
        },
    }


# -- issue 36: notebooks through every door ------------------------------------------------

BAD_CELL = ["x = (1,\n", "y = 2 +\n"]  # does not parse: TL001 inside the cell


def test_syntax_error_column_is_the_cells_in_an_indented_notebook(run_cli, tree):
    # CPython reads the offending line back from the file named: the JSON's line, here
    for indent in (1, 4):
        code, out, _ = check(
            run_cli, tree, notebook(["import torch\n"], ["y = 2 +\n"], indent=indent), cells=True
        )
        assert "nb.ipynb:cell 2:1:8: TL001" in out, out


def test_stdin_syntax_error_column_is_the_buffers_not_the_files(run_cli, tree, monkeypatch):
    import io
    import sys

    root = tree({"t.py": "# ééééééééééééé on disk\n"})  # bytes != characters here
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"y = 2 +\n")))
    code, out, _ = run_cli("check", "--stdin-filename", "t.py", "-", cwd=root)
    assert "t.py:1:8: TL001" in out, out


def test_stdin_notebook_is_read_as_a_notebook(run_cli, monkeypatch):
    import io
    import sys

    nb = notebook(["import torch\n"], LEAK_CELL)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(nb.encode())))
    code, out, _ = run_cli("check", "--stdin-filename", "nb.ipynb", "-")
    assert code == 1 and "nb.ipynb:cell 2:4:" in out and "TL001" not in out


def test_debug_model_reads_a_notebooks_cells(run_cli, tree):
    root = tree({"nb.ipynb": notebook(["import torch\n"], ["%time x = 1\n"], LEAK_CELL)})
    code, out, err = run_cli("debug", "model", str(root / "nb.ipynb"))
    assert code == 0, err
    assert "backward" in out


def test_notebook_findings_carry_their_fix_in_cell_lines(run_cli, tree):
    code, out, _ = check(
        run_cli, tree, notebook(["import torch\n"], LEAK_CELL), "--output-format", "json"
    )
    (finding,) = [f for f in json.loads(out) if f["code"] == "TL301"]
    assert finding["fix"] is not None and finding["cell"] == 2
    assert {e["line"] for e in finding["fix"]["edits"]} == {4}
    code, out, _ = check(run_cli, tree, notebook(["import torch\n"], LEAK_CELL))
    assert "fixable with `--fix --unsafe-fixes`" in out


def test_notebook_diff_is_a_patch_of_the_file(run_cli, tree):
    import subprocess

    root = tree({"nb.ipynb": notebook(["import torch\n"], LEAK_CELL)})
    code, diff, _ = run_cli("check", "--no-cache", "--diff", "--unsafe-fixes", "nb.ipynb", cwd=root)
    assert code == 1 and diff.startswith("--- a/nb.ipynb")
    (root / "fix.patch").write_text(diff)
    subprocess.run(["patch", "-p1", "-s", "-i", "fix.patch"], cwd=root, check=True)
    patched = (root / "nb.ipynb").read_text()
    run_cli("check", "--no-cache", "--fix", "--unsafe-fixes", "nb.ipynb", cwd=root)
    assert (root / "nb.ipynb").read_text() == patched  # the patch is what --fix writes
    assert "retain_graph" not in patched


def test_an_empty_notebook_file_is_not_a_syntax_error(run_cli, tree):
    code, out, _ = check(run_cli, tree, "")
    assert code == 0 and "TL001" not in out


def test_the_test_extra_installs_ipython_for_the_masking_tests():
    """Issue 36, item 33: without IPython the comparisons with its transformer skip."""
    import re
    import sys
    from pathlib import Path

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib

    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    test_extra = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]["test"]
    assert any(re.match(r"ipython\b", req, flags=re.I) for req in test_extra)
