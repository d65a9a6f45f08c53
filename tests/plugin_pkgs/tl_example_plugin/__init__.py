"""An example third-party rule pack: same base class, metadata, examples and harness."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.model import FileModel
from trainlint.plugins.hookspecs import hookimpl
from trainlint.rules.base import Invalid, Report, Rule


class SeedInsideStep(Rule):
    """## What it does
    Flags `torch.manual_seed(...)` called on every step of a training loop.

    ## Why is this bad?
    Re-seeding each step makes every batch draw the same dropout masks and the same
    augmentation randomness: the model sees far less noise than intended.

    ## Example
    ```python
    for x, y in loader:
        torch.manual_seed(0)
        ...
    ```

    ## Use instead
    ```python
    torch.manual_seed(0)
    for x, y in loader:
        ...
    ```
    """

    code = "EXT101"
    name = "seed-inside-step"
    message = "`manual_seed` on every training step repeats the same randomness"
    triggers = ("manual_seed",)
    valid = [
        "import torch\ntorch.manual_seed(0)\nfor x in loader:\n"
        "    opt.zero_grad()\n    model(x).sum().backward()\n    opt.step()\n",
        "def f(torch):\n    for x in loader:\n        torch.manual_seed(0)\n"
        "        x.backward()\n        opt.step()\n",
    ]
    invalid = [
        Invalid(
            "import torch as T\nfor x in loader:\n    T.manual_seed(0)\n"
            "    opt.zero_grad()\n    model(x).sum().backward()\n    opt.step()\n",
            line=3,
        )
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        for call in model.calls_to("torch.manual_seed"):
            found = model.steps.per_step(call)
            if found is not None:
                yield self.report(found[1])


def count_format(findings, rules) -> str:  # type: ignore[no-untyped-def]
    return f"{len(findings)} findings\n"


@hookimpl
def trainlint_rules() -> list[type[Rule]]:
    return [SeedInsideStep]


@hookimpl
def trainlint_output_formats() -> dict[str, object]:
    return {"count": count_format}


_ = ast  # keep the import list honest for readers: rules walk `ast` nodes
