"""One file through the engine: TL001 on any bad input, suppressions, notebooks."""

from __future__ import annotations

import json
import textwrap

import pytest

from trainlint import lint_source

LEAK_LINE = "    loss.backward(retain_graph=True)"
LEAK = f"import torch\nfor x in loader:\n    loss = model(x).sum()\n{LEAK_LINE}{{c}}\n    opt.step()\n    opt.zero_grad()\n"


def codes(findings):
    return [(f.code, f.line) for f in findings]


@pytest.mark.parametrize(
    ("data", "line"),
    [
        (b"print 'py2'\n", 1),
        (b"x = 1\ndef f(:\n", 2),
        (b"x = 1\x00\n", 1),
        (b"# -*- coding: latin-1 -*-\nx = '\xe9'\ny = (\n", 3),
        (b"x = '\xff'\n", 1),  # invalid UTF-8 without a cookie
        (b"# coding: nope-42\nx = '\xff'\n", 1),  # an unknown codec on non-UTF-8 bytes
        (b"if True:\n\tx = 1\n        y = 2\n", 3),
        (b"(" * 300 + b")" * 300 + b"\n", 1),
    ],
)
def test_tl001_any_bad_input(data, line):
    found = lint_source(data)
    assert [f.code for f in found] == ["TL001"]
    assert found[0].line == line


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xef\xbb\xbfimport torch\nx = 1\n",
        b"# -*- coding: latin-1 -*-\nname = '\xe9t\xe9'\n",
        b"import torch\r\nx = 1\r\n",
        b"import torch\n\x0cx = 1\n",
        b"if True:\n\tx = 1\n",
        b"# -*- coding: future_fstrings -*-\nname = f'{1}'\n",  # a codec a package registers
    ],
)
def test_valid_edge_inputs_parse(data):
    assert lint_source(data) == []


def test_columns_are_characters_not_bytes():
    src = "import torch\nfor x in loader:\n    é = model(x).sum(); é.backward(retain_graph=True)\n    opt.step()\n"
    (f,) = lint_source(src, select=["TL301"])
    assert f.code == "TL301" and f.line == 3 and f.column == 25


def test_noqa_forms():
    assert codes(lint_source(LEAK.format(c=""))) == [("TL301", 4)]
    assert lint_source(LEAK.format(c="  # noqa: TL301")) == []
    assert lint_source(LEAK.format(c="  # noqa")) == []
    assert lint_source(LEAK.format(c="  # NOQA:TL301,TL702")) == []
    assert codes(lint_source(LEAK.format(c="  # noqa: TL702"))) == [("TL301", 4)]
    assert codes(lint_source(LEAK.format(c="  # noqa: E501"))) == [("TL301", 4)]


def test_noqa_inside_string_does_not_count():
    src = LEAK.format(c="; s = '# noqa'")
    assert codes(lint_source(src, select=["TL301"])) == [("TL301", 4)]


def test_file_level_noqa():
    assert lint_source("# trainlint: noqa\n" + LEAK.format(c="")) == []
    assert lint_source("# trainlint: noqa: TL301\n" + LEAK.format(c="")) == []
    assert lint_source("# trainlint: noqa: TL3\n" + LEAK.format(c="")) == []
    src = "# trainlint: noqa: TL702\n" + LEAK.format(c="")
    assert codes(lint_source(src)) == [("TL301", 5)]
    # not on its own line: not a file-level directive
    src = LEAK.format(c="  # trainlint: noqa")
    assert codes(lint_source(src)) == [("TL301", 4)]


def test_unused_noqa_is_off_by_default_and_precise():
    src = "import torch\nx = torch.zeros(3)  # noqa: TL301\ny = 1  # noqa: E501\nz = 2  # noqa\n"
    assert lint_source(src) == []
    assert codes(lint_source(src, select=["TL"])) == [("TL002", 2)]
    used = LEAK.format(c="  # noqa: TL301")
    assert lint_source(used, select=["TL"]) == []


def test_unused_noqa_reports_unknown_trainlint_codes():
    # as ruff's RUF100: a typo or a retired code suppresses nothing, forever
    src = "import torch\nx = torch.zeros(3)  # noqa: TL999, E501\ny = 2  # noqa: TL1O1\n"
    assert lint_source(src) == []  # TL002 is off by default
    found = lint_source(src, select=["TL"])
    assert codes(found) == [("TL002", 2), ("TL002", 3)]
    assert "unknown rule code `TL999`" in found[0].message
    assert "TL1O1" in found[1].message
    # a known code that this run does not select is still left alone
    assert lint_source("x = 1  # noqa: TL301\n", select=["TL002"]) == []


def test_files_without_triggers_are_not_analysed(monkeypatch):
    import trainlint.engine as engine

    built = []
    real = engine.FileModel

    def spy(*a, **k):
        built.append(1)
        return real(*a, **k)

    monkeypatch.setattr(engine, "FileModel", spy)
    assert lint_source("import os\nprint(os.getcwd())\n") == []
    assert built == []
    lint_source(LEAK.format(c=""))
    assert built == [1]


def test_syntax_error_still_reported_without_triggers():
    assert codes(lint_source("def f(:\n")) == [("TL001", 1)]
    assert lint_source("def f(:\n", ignore=["TL001"]) == []


def _notebook(cells):
    return json.dumps(
        {
            "cells": [
                {
                    "cell_type": t,
                    "metadata": {},
                    "source": s,
                    **({"outputs": [], "execution_count": None} if t == "code" else {}),
                }
                for t, s in cells
            ],
            "metadata": {},
            "nbformat": 4,
            "nbformat_minor": 5,
        }
    )


def test_notebook_cells_magics_and_locations(run_cli, tree):
    nb = _notebook(
        [
            ("markdown", "# Training\n"),
            ("code", ["%matplotlib inline\n", "!pip install torch\n", "import torch\n"]),
            (
                "code",
                [
                    "%%time\n",
                    "for x in loader:\n",
                    "    loss = model(x).sum()\n",
                    "    loss.backward(retain_graph=True)\n",
                    "    opt.step()\n",
                    "    opt.zero_grad()\n",
                ],
            ),
            ("code", "%%bash\necho hi | grep h\n"),
            ("code", "model?\n"),
        ]
    )
    root = tree({"train.ipynb": nb})
    code, out, _ = run_cli("check", str(root))
    assert code == 1
    assert "train.ipynb:cell 3:4:5: TL301" in out
    _, out, _ = run_cli("check", "--output-format", "json", str(root))
    (f,) = json.loads(out)
    assert f["cell"] == 3 and f["line"] == 4


def test_notebook_invalid_json_is_tl001(run_cli, tree):
    root = tree({"broken.ipynb": "{not json"})
    code, out, _ = run_cli("check", str(root))
    assert code == 1 and "broken.ipynb:1:1: TL001" in out


def test_huge_file_reported_and_skipped(monkeypatch):
    import trainlint.engine as engine

    monkeypatch.setattr(engine, "MAX_FILE_BYTES", 100)
    found = lint_source("x = 1\n" * 50)
    assert [f.code for f in found] == ["TL001"] and "too large" in found[0].message


def test_rules_that_skip_test_files_say_so_and_are_skipped_there():
    """A rule with ``test_files = False`` is not run on test files, and its docs say so."""
    from trainlint.config import RuleSelection
    from trainlint.engine import Linter
    from trainlint.rules import builtin_rules

    skipping = [r for r in builtin_rules() if not r.test_files]
    assert {r.code for r in skipping} >= {"TL101", "TL403"}
    for rule in skipping:
        assert "Not run on test files" in rule.documentation()
        example = rule.invalid[0]
        linter = Linter(RuleSelection([rule], {rule.code: dict(example.options)}))
        src = textwrap.dedent(example.source).lstrip("\n").encode()
        assert [f.code for f in linter.lint_bytes(src, "train.py").findings] == [rule.code] * len(
            example.expected_lines()
        ), rule.code
        for test_path in ("tests/train.py", "test_train.py", "pkg/train_test.py", "conftest.py"):
            assert linter.lint_bytes(src, test_path).findings == [], (rule.code, test_path)


def test_a_findings_severity_is_always_its_rules(monkeypatch):
    # one source of truth (issue 17): a rule, or a plugin's, that builds its Report with
    # another severity still reports what `trainlint rules` and SARIF declare
    from trainlint.rules.base import Report
    from trainlint.rules.memory.retain_graph_in_loop import RetainGraphInLoop

    original = RetainGraphInLoop.check

    def check(self, model):
        for r in original(self, model):
            yield Report(r.node, r.message, "warning", r.fix, related=r.related)

    monkeypatch.setattr(RetainGraphInLoop, "check", check)
    found = lint_source(LEAK.format(c=""))
    assert [(f.code, f.severity) for f in found] == [("TL301", RetainGraphInLoop.severity)]
    assert RetainGraphInLoop.severity == "error"


def test_noqa_with_words_instead_of_codes_suppresses_nothing_and_tl002_says_so():
    """Issue 36, item 27: `noqa: fix later` is no bare noqa; TL002 reports it, and its fix
    (like ruff's RUF100) drops unused codes."""
    from trainlint import lint_source

    src = "import torch\nsd = torch.load(p)  # noqa: fix later\n"
    assert [f.code for f in lint_source(src, select=["TL702"])] == ["TL702"]
    found = lint_source(src, select=["TL702", "TL002"])
    assert sorted(f.code for f in found) == ["TL002", "TL702"]
    assert "names no code" in next(f.message for f in found if f.code == "TL002")
    bare = "import torch\nsd = torch.load(p)  # noqa\n"
    assert lint_source(bare, select=["TL702"]) == []
    (stale,) = lint_source("x = 1  # noqa: TL301, E501\n", select=["TL002", "TL301"])
    assert stale.fix is not None and stale.fix.applicability == "safe"
    assert [e.content for e in stale.fix.edits] == ["E501"]


def test_unknown_codec_cookie_is_linted_as_utf8():
    # Source-transforming codecs (registered by a pip package at import time) are
    # unknown here; the file is UTF-8 and its rules still run.
    src = "# -*- coding: future_fstrings -*-\n" + LEAK.format(c="")
    assert codes(lint_source(src.encode())) == [("TL301", 5)]
