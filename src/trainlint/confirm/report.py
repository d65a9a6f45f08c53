"""The confirmation report: each finding with what the test run says about it.

Plain data and one function (:func:`build_report`) that gives each finding its status from
which tests ran its line and which of them failed a trainlint check. No coverage, no pytest
state: the :class:`~trainlint.confirm.manager.ConfirmationManager` gathers those.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from trainlint.findings import Finding

Status = Literal["confirmed", "exercised", "not-exercised"]
STATUSES: tuple[Status, ...] = ("confirmed", "exercised", "not-exercised")


@dataclass(frozen=True)
class CheckFailure:
    """A trainlint check that failed in a test: its name and the rules it confirms.

    ``rules`` is the failure's ``CheckFailed.rules``: the codes whose ``Rule.confirm_with``
    is this check and whose symptom the check saw. Only findings with one of these codes
    are confirmed by it.
    """

    check: str
    rules: tuple[str, ...] = ()
    #: Qualified names of the classes the check built from the user's factory (the
    #: schedulers ``assert_lr_schedule`` stepped). A finding that names one of them is
    #: confirmed by the failure even where the test never ran the finding's line: a
    #: schedule checked on its own is built in the test, not by the training loop.
    built: tuple[str, ...] = ()


@dataclass(frozen=True)
class ConfirmedFinding:
    """A lint finding with what the test run says about it. ``path`` is rootdir-relative."""

    code: str
    name: str
    path: str
    line: int
    column: int
    status: Status
    tests: tuple[str, ...] = ()
    confirmed_by: tuple[str, ...] = ()
    #: (node id, check) for each confirming test; the terminal shows it, the JSON does not.
    confirming_checks: tuple[tuple[str, str], ...] = ()
    #: (node id, check) for tests that ran the line and failed a check about other rules.
    other_failures: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "name": self.name,
            "path": self.path,
            "line": self.line,
            "status": self.status,
            "tests": list(self.tests),
            "confirmed_by": list(self.confirmed_by),
        }


@dataclass
class Report:
    """All findings of the linted files, in path/line order, and how many files were linted."""

    findings: list[ConfirmedFinding] = field(default_factory=list)
    files: int = 0
    error: str | None = None

    def summary(self) -> dict[str, int]:
        counts: dict[str, int] = dict.fromkeys(STATUSES, 0)
        for finding in self.findings:
            counts[finding.status] += 1
        return counts

    def to_json(self) -> dict[str, Any]:
        return {
            "findings": [f.to_json() for f in self.findings],
            "summary": self.summary(),
        }


def build_report(
    findings: Iterable[Finding],
    executed: dict[Path, dict[int, set[str]]],
    failures: Mapping[str, Sequence[CheckFailure]],
    rootdir: Path,
    *,
    order: dict[str, int] | None = None,
    files: int = 0,
) -> Report:
    """Give each finding its status.

    ``findings`` carry absolute paths; ``executed[path][line]`` is the set of node ids that
    ran that line; ``failures[node id]`` the trainlint checks that failed in that test;
    ``order`` the run order of node ids (lists follow it, so the first test to run a line
    comes first).

    A finding is confirmed by a test that ran its line and failed a check whose rules list
    the finding's code: the check saw the symptom that rule explains. A test that ran the
    line but failed for another rule (a memory check failing on a graph kept in a running
    total, next to a gradient-norm finding) says nothing about this finding: exercised.
    A failure that built the class a finding names (``CheckFailure.built``, e.g. the
    ``CosineAnnealingLR`` a TL201 finding at ``scheduler.step()`` is about) confirms it
    too, wherever the test ran.
    """
    rank = order or {}
    by_class = [(t, f) for t, fs in failures.items() for f in fs if f.built]
    out = []
    for finding in findings:
        path = Path(finding.path)
        lines = executed.get(path, {})
        ran: set[str] = set()
        # A finding may span a multi-line statement; the tracer can report any of its lines.
        for line in range(finding.line, max(finding.line, finding.end_line) + 1):
            ran |= lines.get(line, set())
        tests = sorted(ran, key=lambda nodeid: (rank.get(nodeid, len(rank)), nodeid))
        confirming = tuple(
            (t, f.check) for t in tests for f in failures.get(t, ()) if finding.code in f.rules
        )
        if by_class:
            named = _named_classes(finding.message)
            built = sorted(
                (
                    (t, f.check)
                    for t, f in by_class
                    if finding.code in f.rules and named & {b.rsplit(".", 1)[-1] for b in f.built}
                ),
                key=lambda tc: (rank.get(tc[0], len(rank)), tc[0]),
            )
            confirming += tuple(tc for tc in built if tc not in confirming)
        confirmed_by = tuple(dict.fromkeys(t for t, _ in confirming))
        others = tuple(
            (t, f.check) for t in tests if t not in confirmed_by for f in failures.get(t, ())
        )
        status: Status = "confirmed" if confirmed_by else "exercised" if tests else "not-exercised"
        out.append(
            ConfirmedFinding(
                code=finding.code,
                name=finding.name,
                path=relative_to_root(path, rootdir),
                line=finding.line,
                column=finding.column,
                status=status,
                tests=tuple(tests),
                confirmed_by=confirmed_by,
                confirming_checks=confirming,
                other_failures=others,
            )
        )
    out.sort(key=lambda f: (f.path, f.line, f.column, f.code))
    return Report(findings=out, files=files)


def _named_classes(message: str) -> set[str]:
    """The class names a finding's message quotes (`` `CosineAnnealingLR` ``, or dotted)."""
    last = (m.rsplit(".", 1)[-1] for m in re.findall(r"`([\w.]+)`", message))
    return {name for name in last if name[:1].isupper()}


def relative_to_root(path: Path, rootdir: Path) -> str:
    """``path`` relative to the rootdir, posix, with ``..`` for files outside it."""
    try:
        return path.relative_to(rootdir).as_posix()
    except ValueError:
        return Path(os.path.relpath(path, rootdir)).as_posix()


def is_check_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is, wraps or was raised while handling a :class:`CheckFailed`."""
    return bool(check_failures(exc))


def check_failures(exc: BaseException) -> list[CheckFailure]:
    """The :class:`CheckFailed` errors ``exc`` is, wraps, groups or was raised handling."""
    from trainlint.testing import CheckFailed  # does not import torch

    found: list[CheckFailure] = []
    seen: set[int] = set()
    stack = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, CheckFailed):
            built = getattr(current.result, "built", ())
            names = (
                tuple(b for b in built if isinstance(b, str)) if isinstance(built, tuple) else ()
            )
            found.append(CheckFailure(current.check, tuple(current.rules), names))
        # ExceptionGroup (and the exceptiongroup backport on 3.10) keep their members here.
        members = getattr(current, "exceptions", None)
        if isinstance(members, (tuple, list)):
            stack.extend(m for m in members if isinstance(m, BaseException))
        if current.__cause__ is not None:
            stack.append(current.__cause__)
        if current.__context__ is not None and not current.__suppress_context__:
            stack.append(current.__context__)
    return found
