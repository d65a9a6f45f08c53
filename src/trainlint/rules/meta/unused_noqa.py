"""TL002 unused-noqa."""

from __future__ import annotations

from collections.abc import Iterator

from trainlint.analysis.model import FileModel
from trainlint.rules.base import Invalid, Report, Rule


class UnusedNoqa(Rule):
    """## What it does
    Reports a `# noqa: TL...` comment naming a trainlint code that is not reported
    on that line. Codes of other tools (`E501`) and of rules not enabled in this run
    are left alone, and so is a bare `# noqa`, which other linters also read. A `noqa`
    naming a `TL` code that no rule has (`# noqa: TL999`, or `TL1O1` with a letter O) is
    reported too: it can never suppress anything. So is a `noqa` whose colon is followed
    by words instead of codes (`# noqa: fix later`): it suppresses nothing, where a reader
    would take it for a bare `# noqa`.

    ## Why is this bad?
    A stale suppression hides the next real finding on that line: the bug it once
    silenced was fixed, and the comment now silences whatever comes next.

    ## Example
    ```python
    loss.backward()  # noqa: TL301
    ```

    ## Use instead
    ```python
    loss.backward()
    ```

    ## Fix safety
    Safe: the fix removes the unused codes from the comment, or the whole directive when
    none is left and nothing follows it on the line; a directive followed by more text,
    or naming no code, is left for you to edit.
    """

    code = "TL002"
    name = "unused-noqa"
    message = "unused `noqa` directive"
    default_enabled = False
    fix_safety = "safe"
    valid = [
        "x = 1  # noqa: E501\n",
        "x = 1  # noqa\n",
        "import torch\n\nfor b in loader:\n"
        "    loss = model(b)\n"
        "    loss.backward(retain_graph=True)  # noqa: TL301\n    opt.step()\n",
    ]
    invalid = [
        Invalid(
            "import torch\nx = torch.zeros(3)  # noqa: TL301\n",
            line=2,
            fixed="import torch\nx = torch.zeros(3)\n",
        ),
        Invalid(
            "import torch\nx = 1  # noqa: TL999, E501\n",
            line=2,
            fixed="import torch\nx = 1  # noqa: E501\n",
        ),
        Invalid("import torch\nx = 1  # noqa: fix later\n", line=2),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        return iter(())  # reported by the engine after suppression
