"""Every finding says what is wrong and what to do about it (issue 17, item 7)."""

from __future__ import annotations

import re

import pytest

from trainlint.rule_testing import lint_example
from trainlint.rules import builtin_rules

# A clause after the first (split at `: `, `; ` and sentence ends) says what to do.
REMEDY_VERBS = {
    "accumulate",
    "backpropagate",
    "build",
    "call",
    "clip",
    "compute",
    "divide",
    "drop",
    "enable",
    "hold",
    "keep",
    "log",
    "move",
    "pass",
    "read",
    "remove",
    "reseed",
    "return",
    "seed",
    "send",
    "start",
    "step",
    "store",
    "use",
    "wrap",
}
# A remedy that is a call to make, not a verb: `ray.train.report(...)` from the workers.
_CALL = re.compile(r"`[\w.]+\(")
# The parser's own message (TL001) and the noqa checker's (TL002) are not rule messages.
META = {"TL001", "TL002"}


def _says_what_to_do(message: str) -> bool:
    for clause in re.split(r"[;:] |\. ", message)[1:]:
        first = clause.split()[0] if clause.split() else ""
        if first.lower() in REMEDY_VERBS or _CALL.match(first):
            return True
    return False


def _messages(rule) -> set[str]:
    return {
        f.message
        for ex in rule.invalid
        for f in lint_example(rule, ex.source)
        if f.code == rule.code
    }


@pytest.mark.parametrize(
    "rule", [r for r in builtin_rules() if r.code not in META], ids=lambda r: r.code
)
def test_every_message_says_what_to_do(rule):
    for message in _messages(rule):
        assert _says_what_to_do(message), (rule.code, message)


@pytest.mark.parametrize("code", ["TL101", "TL201", "TL302", "TL405", "TL601", "TL604"])
def test_the_messages_issue_17_named_say_what_to_do(code):
    # these said only what was wrong: TL101, TL201, TL302 in the issue, TL405, TL601 and
    # TL604 found by the sweep above
    rule = next(r for r in builtin_rules() if r.code == code)
    messages = _messages(rule)
    assert messages
    assert all(_says_what_to_do(m) for m in messages), messages
