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


def check(run_cli, tree, nb, *args):
    root = tree({"nb.ipynb": nb})
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
    code, out, _ = check(run_cli, tree, nb)
    assert code == 1
    lines = [ln for ln in out.splitlines() if "nb.ipynb" in ln]
    assert lines[0].startswith("nb.ipynb:cell 2:2:12: TL001 syntax-error:")
    assert lines[1].startswith("nb.ipynb:cell 4:4:5: TL301")
    assert len(lines) == 2


def test_a_broken_cell_leaves_the_other_cells_context_intact(run_cli, tree):
    # the model is built in cell 1 and trained in cell 3: cross-cell context still counts
    nb = notebook(["import torch\n"], ["!ls ((\n", "x = (\n"], LEAK_CELL)
    code, out, _ = check(run_cli, tree, nb, "--output-format", "json")
    found = json.loads(out)
    assert [(f["code"], f["cell"], f["line"]) for f in found] == [("TL001", 2, 2), ("TL301", 3, 4)]


def test_a_broken_cell_does_not_stop_fixes_in_other_cells(run_cli, tree):
    nb = notebook(["import torch\n", "m.load_state_dict(torch.load(p))\n"], ["def broken(:\n"])
    root = tree({"nb.ipynb": nb})
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
