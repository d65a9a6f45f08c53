"""The lint side's value classes (trainlint._record) behave as the dataclasses they replace,
and a check never imports dataclasses (nor, through it, inspect)."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from trainlint._record import Record
from trainlint.analysis.effects import _Placeholder
from trainlint.analysis.steps import Event, Kind
from trainlint.findings import Edit, Finding, Fix, Intent, Related

ROOT = Path(__file__).resolve().parent.parent


class Pair(Record, frozen=True):
    __slots__ = ("left", "right")

    def __init__(self, left: int, right: int = 0) -> None:
        self.left = left
        self.right = right


class Open(Record):
    __slots__ = ("items",)

    def __init__(self, items: list[int] | None = None) -> None:
        self.items = [] if items is None else items


class Token(Record, frozen=True, eq=False):
    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def test_a_frozen_record_compares_and_hashes_by_its_fields():
    assert Pair(1, 2) == Pair(1, 2) and Pair(1, 2) != Pair(2, 1)
    assert {Pair(1, 2): "x"}[Pair(1, 2)] == "x"
    assert repr(Pair(1)) == "Pair(left=1, right=0)"
    # another class with the same fields is not equal (as dataclasses)
    assert Pair(1, 2) != Edit(1, 2, 3, 4, "")
    assert Pair(1, 2)._replace(right=5) == Pair(1, 5)


def test_a_record_not_frozen_is_equal_by_fields_but_unhashable():
    assert Open([1]) == Open([1])
    with pytest.raises(TypeError):
        hash(Open())
    assert Open().items is not Open().items  # a fresh default each time


def test_eq_false_compares_by_identity_and_a_plain_subclass_keeps_that():
    a, b = Token("x"), Token("x")
    assert a != b and len({a, b}) == 2
    kwargs = {"kind": Kind.STEP, "node": None}
    first, second = _Placeholder(**kwargs), _Placeholder(**kwargs)
    assert first != second and len({first, second, Event(**kwargs)}) == 3


def test_a_finding_round_trips_and_leaves_extra_out_of_equality_and_repr():
    fix = Fix(
        "unsafe",
        (Edit(2, 1, 2, 5, "x"),),
        "move it",
        Intent("move", 2, 1, 3, 4, count=2, first=1, last=1, to=0),
    )
    finding = Finding(
        "TL101", "name", "a.py", 2, 1, 2, 5, "msg", fix=fix, related=(Related(1, 1, 1, 2, "here"),)
    )
    data = finding.to_dict()
    keys = "code name path line column end_line end_column message severity fix related"
    assert list(data) == keys.split()  # no cell, no extra: the JSON output's shape
    edit = {"line": 2, "column": 1, "end_line": 2, "end_column": 5, "content": "x"}
    assert data["fix"]["edits"] == (edit,)
    assert data["related"] == [
        {"line": 1, "column": 1, "end_line": 1, "end_column": 2, "message": "here"}
    ]
    assert Finding.from_dict(data) == finding
    tagged = finding._replace(extra={"k": 1})
    assert tagged == finding and "extra" not in repr(tagged)
    assert tagged._replace(cell=3).extra == {"k": 1}  # replace keeps what equality ignores
    assert pickle.loads(pickle.dumps(tagged)).extra == {"k": 1}
    assert fix.intent is not None and fix.intent.shifted(10).end_line == 13


def test_a_check_imports_neither_dataclasses_nor_inspect(tmp_path):
    # Building a dataclass compiles its methods with exec and importing dataclasses imports
    # inspect: 30-40 ms of every start, a pre-commit hook's whole run on one file.
    script = (
        "import sys\n"
        "from trainlint.cli import main\n"
        "code = main(['check', '--no-cache', '-q', '--exit-zero', '--select', 'ALL',"
        " '--jobs', '1', *sys.argv[1:]])\n"
        "print(sorted(m for m in ('dataclasses', 'inspect') if m in sys.modules))\n"
    )
    dirs = [str(ROOT / "fixtures" / d) for d in ("gradients", "schedules", "concurrency")]
    proc = subprocess.run(
        [sys.executable, "-c", script, *dirs],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    assert proc.stdout.splitlines()[-1] == "[]", proc.stdout[-2000:] + proc.stderr[-2000:]
