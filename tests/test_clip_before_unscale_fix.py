"""TL601's fix: `scaler.unscale_(optimizer)` inserted before the clip, only where it is
sure to run once per `scaler.step` (a second `unscale_` before `update()` raises)."""

from __future__ import annotations

import textwrap

import pytest

from trainlint.rule_testing import fix_example, lint_example
from trainlint.rules.numerics.clip_before_unscale import ClipBeforeUnscale

HEAD = "import torch\nscaler = torch.amp.GradScaler()\n"


def fixed(body: str) -> str | None:
    """The file after the fix, or None when TL601 reports without a fix."""
    source = HEAD + textwrap.dedent(body).lstrip("\n")
    findings = lint_example(ClipBeforeUnscale, source, dedent=False)
    assert [f.code for f in findings] == ["TL601"], source
    if findings[0].fix is None:
        return None
    return fix_example(ClipBeforeUnscale, source, findings)[len(HEAD) :]


def test_accumulation_unscales_inside_the_block_that_steps():
    after = fixed(
        """
        for i, (x, y) in enumerate(loader):
            scaler.scale(criterion(model(x), y)).backward()
            if (i + 1) % 4 == 0:
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # keep
                scaler.step(self.opt)
                scaler.update()
                self.opt.zero_grad()
        """
    )
    assert after is not None
    lines = after.splitlines()
    assert lines[3:5] == [
        "        scaler.unscale_(self.opt)",
        "        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # keep",
    ]


def test_crlf_files_keep_their_line_endings():
    source = HEAD + (
        "for x, y in loader:\r\n"
        "    scaler.scale(criterion(model(x), y)).backward()\r\n"
        "    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\r\n"
        "    scaler.step(opt)\r\n"
        "    scaler.update()\r\n"
    )
    findings = lint_example(ClipBeforeUnscale, source, dedent=False)
    out = fix_example(ClipBeforeUnscale, source, findings)
    assert "    scaler.unscale_(opt)\r\n    torch.nn.utils.clip_grad_norm_" in out


@pytest.mark.parametrize(
    "body",
    [
        # clipped every micro-batch, stepped every fourth: a second unscale_ would raise
        """
        for i, (x, y) in enumerate(loader):
            scaler.scale(criterion(model(x), y)).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if (i + 1) % 4 == 0:
                scaler.step(opt)
                scaler.update()
        """,
        # a skipped step leaves the optimizer unscaled until the next update()
        """
        for x, y in loader:
            scaler.scale(criterion(model(x), y)).backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if not torch.isfinite(norm):
                continue
            scaler.step(opt)
            scaler.update()
        """,
        # two optimizers: each needs its own unscale_
        """
        for x, y in loader:
            scaler.scale(criterion(model(x), y)).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt_a)
            scaler.step(opt_b)
            scaler.update()
        """,
        # the optimizer is an expression: no name to spell it with
        """
        for x, y in loader:
            scaler.scale(criterion(model(x), y)).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizers[0])
            scaler.update()
        """,
        # two statements on one line: no line of its own to insert before
        """
        for x, y in loader:
            scaler.scale(criterion(model(x), y)).backward()
            log(x); torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
        """,
    ],
)
def test_no_fix_where_the_unscale_could_run_twice_or_cannot_be_spelled(body):
    assert fixed(body) is None
