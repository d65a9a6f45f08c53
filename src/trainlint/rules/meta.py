"""TL0: meta rules. The engine itself reports these; the classes carry metadata and docs."""

from __future__ import annotations

from collections.abc import Iterator

from trainlint.analysis.model import FileModel
from trainlint.rules.base import Invalid, Report, Rule


class SyntaxError_(Rule):
    """## What it does
    Reports a file that CPython's parser rejects (a syntax error, a bad encoding, a
    null byte, Python 2 syntax), or that cannot be read at all. The finding sits at
    the parser's error position.

    ## Why is this bad?
    A file that does not parse cannot be analysed, so every other rule is silent on
    it. trainlint reports it instead of crashing, and lints every other file.

    ## Example
    ```python
    print "loss", loss
    ```

    ## Use instead
    ```python
    print("loss", loss)
    ```
    """

    code = "TL001"
    name = "syntax-error"
    message = "the file does not parse"
    valid = ["x = 1\n", "import torch\nloss = torch.zeros(())\n"]
    invalid = [
        Invalid("import torch\nprint 'hello'\n", line=2),
        Invalid("def f(:\n    pass\n", line=1),
        Invalid("x = 1\x00\n", line=1),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        return iter(())  # reported by the engine while parsing


class UnusedNoqa(Rule):
    """## What it does
    Reports a `# noqa: TL...` comment naming a trainlint code that is not reported
    on that line. Codes of other tools (`E501`) and of rules not enabled in this run
    are left alone, and so is a bare `# noqa`, which other linters also read.

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
    invalid = [Invalid("import torch\nx = torch.zeros(3)  # noqa: TL301\n", line=2)]

    def check(self, model: FileModel) -> Iterator[Report]:
        return iter(())  # reported by the engine after suppression


RULES = [SyntaxError_, UnusedNoqa]
