"""Lint time grows linearly with a file's size (issue: a 50k-line file took minutes).

Counted in Python function calls, not seconds, so that a busy machine cannot make it
pass or fail: a file five times longer may cost at most 1.5 times five times as many.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from trainlint import lint_source

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import scaling  # noqa: E402


def _calls(blocks: int) -> tuple[int, int]:
    source = scaling.module(blocks)
    count = 0

    def profile(frame: object, event: str, arg: object) -> None:
        nonlocal count
        if event == "call":
            count += 1

    sys.setprofile(profile)
    try:
        findings = lint_source(source, path="generated.py", select=["TL"])
    finally:
        sys.setprofile(None)
    return count, len(findings)


@pytest.mark.slow
def test_lint_calls_grow_linearly_with_file_size():
    small, small_findings = _calls(12)
    large, large_findings = _calls(60)
    assert small_findings and large_findings == 5 * small_findings
    assert large / small <= 5 * 1.5, f"5x the file took {large / small:.1f}x the calls"
