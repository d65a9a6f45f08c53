"""Lint every bundled fixture script and compare with its `# expect: CODE` comments, exactly."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from trainlint import lint_paths
from trainlint.rules import builtin_rules

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
EXPECT = re.compile(r"#\s*expect:\s*(?P<codes>TL\d{3}(?:\s*,\s*TL\d{3})*)")
# A focused fixture (one rule's near-misses and positives, moved here from the tests) says
# which codes it is about on a line of its own; other rules' findings in it are not compared.
SELECT = re.compile(r"^#\s*fixture-select:\s*(?P<codes>TL\d{3}(?:\s*,\s*TL\d{3})*)\s*$", re.M)
OPT_IN = {rule.code for rule in builtin_rules() if not rule.default_enabled}
FILES = sorted(p for p in FIXTURES.rglob("*") if p.suffix in (".py", ".ipynb"))


def expected(path: Path) -> Counter:
    out: Counter = Counter()
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = EXPECT.search(line)
        if m:
            for code in m.group("codes").split(","):
                out[(i, code.strip())] += 1
    return out


def selected(path: Path) -> set[str]:
    m = SELECT.search(path.read_text(encoding="utf-8"))
    return {c.strip() for c in m.group("codes").split(",")} if m else set()


@pytest.fixture(scope="module")
def findings_by_file():
    found = lint_paths([FIXTURES], jobs=1)
    by_file: dict[str, Counter] = {}
    for f in found:
        key = Path(f.path).resolve().relative_to(FIXTURES).as_posix()
        by_file.setdefault(key, Counter())[(f.line, f.code)] += 1
    return by_file


@pytest.mark.parametrize(
    "path",
    [p for p in FILES if p.suffix == ".py"],
    ids=lambda p: p.relative_to(FIXTURES).as_posix(),
)
def test_fixture(path, findings_by_file):
    rel = path.relative_to(FIXTURES).as_posix()
    got = findings_by_file.get(rel, Counter())
    want = expected(path)
    focus = selected(path)
    if focus & OPT_IN:
        # an off-by-default rule's fixture: lint it with the rule selected, as users would
        got = Counter((f.line, f.code) for f in lint_paths([path], select=sorted(focus)))
    if focus:
        got = Counter({key: n for key, n in got.items() if key[1] in focus})
    missing = sorted((want - got).elements())
    extra = sorted((got - want).elements())
    assert not missing and not extra, f"{rel}: missing {missing}, unexpected {extra}"


def test_fixture_corpus_has_positives_and_negatives():
    positives = [p for p in FILES if p.suffix == ".py" and expected(p)]
    negatives = [p for p in FILES if p.suffix == ".py" and not expected(p)]
    assert len(positives) >= 3 and len(negatives) >= 3
