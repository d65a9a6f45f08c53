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
    reported too: it can never suppress anything.

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
    """

    code = "TL002"
    name = "unused-noqa"
    message = "unused `noqa` directive"
    default_enabled = False
    valid = [
        "x = 1  # noqa: E501\n",
        "x = 1  # noqa\n",
        "import torch\n\nfor b in loader:\n"
        "    loss = model(b)\n"
        "    loss.backward(retain_graph=True)  # noqa: TL301\n    opt.step()\n",
    ]
    invalid = [
        Invalid("import torch\nx = torch.zeros(3)  # noqa: TL301\n", line=2),
        Invalid("import torch\nx = 1  # noqa: TL999\n", line=2),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        return iter(())  # reported by the engine after suppression
