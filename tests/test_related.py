"""A finding that involves two places carries the other one: full text, JSON, SARIF, github."""

from __future__ import annotations

import ast
import json

import pytest

from trainlint.config import RuleSelection
from trainlint.engine import Linter
from trainlint.findings import Finding
from trainlint.reporting.github import format_github
from trainlint.reporting.jsonfmt import format_json
from trainlint.reporting.sarif import format_sarif
from trainlint.reporting.text import full
from trainlint.rules.base import Invalid, Rule

SOURCE = "x = first()\ny = second()\n"


class SecondAfterFirst(Rule):
    """## What it does
    Test rule.

    ## Why is this bad?
    It is not.

    ## Example
    ```python
    second()
    ```

    ## Use instead
    ```python
    first()
    ```
    """

    code = "TL999"
    name = "second-after-first"
    message = "second() after first()"
    valid = ["pass\n"]
    invalid = [Invalid(SOURCE, line=2)]

    def check(self, model):
        calls = {
            c.func.id: c
            for c in ast.walk(model.tree)
            if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
        }
        yield self.report(calls["second"], related=((calls["first"], "first() called here"),))


def _finding(tmp_path) -> Finding:
    path = tmp_path / "mod.py"
    path.write_text(SOURCE)
    linter = Linter(RuleSelection([SecondAfterFirst], {}))
    [f] = linter.lint_bytes(SOURCE.encode(), str(path)).findings
    return f


def test_related_location_in_every_output(tmp_path):
    f = _finding(tmp_path)
    assert [(r.line, r.column, r.message) for r in f.related] == [(1, 5, "first() called here")]
    assert "  = note: first() called here at 1:5" in full([f])
    data = json.loads(format_json([f]))[0]
    assert data["related"] == [
        {"line": 1, "column": 5, "end_line": 1, "end_column": 12, "message": "first() called here"}
    ]
    assert Finding.from_dict(data) == f  # the cache round-trips it
    sarif = json.loads(format_sarif([f], [SecondAfterFirst]))
    [rel] = sarif["runs"][0]["results"][0]["relatedLocations"]
    assert rel["physicalLocation"]["region"]["startLine"] == 1
    assert rel["message"]["text"] == "first() called here"
    assert "first() called here at line 1" in format_github([f])


def test_findings_without_related_keep_their_json_shape(tmp_path):
    f = _finding(tmp_path)
    f.related = ()
    assert "related" not in json.loads(format_json([f]))[0]


@pytest.mark.parametrize(
    ("code", "source", "note"),
    [
        (
            "TL101",
            """
import torch
for x, y in loader:
    loss = model(x).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
""",
            (6, "gradients cleared here"),
        ),
        (
            "TL110",
            """
import torch
for x, y in loader:
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
""",
            (5, "the optimizer step it comes after"),
        ),
        (
            "TL201",
            """
import torch
opt = torch.optim.SGD(model.parameters(), lr=0.1)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.epochs)
for epoch in range(args.epochs):
    for x, y in loader:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        sched.step()
""",
            (3, "`T_max` sets the schedule's length here"),
        ),
    ],
)
def test_rules_point_at_the_other_place(code, source, note):
    from trainlint.rule_testing import lint_example
    from trainlint.rules import builtin_rules

    rule = next(r for r in builtin_rules() if r.code == code)
    [finding] = lint_example(rule, source)
    assert [(r.line, r.message) for r in finding.related] == [note]
