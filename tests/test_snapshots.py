"""Snapshot tests: the full text, JSON and ``--diff`` output of linting ``fixtures/``.

A change to any message, column, range or fix shows up here as a diff to review.
Regenerate after an intended change with::

    TRAINLINT_UPDATE_SNAPSHOTS=1 python -m pytest tests/test_snapshots.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainlint.cli import main

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOTS = Path(__file__).resolve().parent / "snapshots"
UPDATE = os.environ.get("TRAINLINT_UPDATE_SNAPSHOTS") == "1"

CASES = {
    "fixtures.full.txt": ["--output-format", "full"],
    "fixtures.json": ["--output-format", "json"],
    "fixtures.diff": ["--diff", "--unsafe-fixes"],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_fixture_output_matches_snapshot(name, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    main(["check", "fixtures", "--no-cache", "--jobs", "1", *CASES[name]])
    captured = capsys.readouterr()
    got = captured.out
    # a rule that crashes loses its findings quietly in the comparison above; say why
    assert "internal error" not in captured.err.lower(), captured.err
    path = SNAPSHOTS / name
    if UPDATE or not path.exists():
        path.write_text(got, encoding="utf-8")
        if not UPDATE:
            pytest.fail(f"{name} did not exist; written, review and commit it")
    want = path.read_text(encoding="utf-8")
    if got != want:
        import difflib

        diff = "".join(
            difflib.unified_diff(
                want.splitlines(keepends=True),
                got.splitlines(keepends=True),
                f"snapshot/{name}",
                f"now/{name}",
                n=2,
            )
        )
        pytest.fail(
            f"output differs from the snapshot (TRAINLINT_UPDATE_SNAPSHOTS=1 to accept):\n"
            f"{diff[:20000]}"
        )
