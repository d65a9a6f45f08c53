"""TL403 anomaly-detection-enabled."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.context import in_debug_context
from trainlint.analysis.model import FileModel, keyword
from trainlint.rules.base import Invalid, Report, Rule


def _top_level(model: FileModel, node: ast.AST) -> bool:
    """At module level, or in a `main()`/`if __name__ == "__main__":` entry point."""
    fn = model.function_of(node)
    if fn is None:
        return True
    return fn.name in ("main", "train", "run", "fit", "cli")


class AnomalyDetectionEnabled(Rule):
    """## What it does
    Flags `torch.autograd.set_detect_anomaly(True)` and `torch.autograd.detect_anomaly()`
    outside tests and debug branches (an `if` on a debug flag, a function named like
    `debug_*`).

    ## Why is this bad?
    Anomaly detection records a Python traceback for every autograd node and checks
    every backward output for NaN. It is a debugging tool: left on, it makes training
    several times slower, silently, for the whole run.

    ## Example
    ```python
    torch.autograd.set_detect_anomaly(True)
    for x, y in loader:
        ...
    ```

    ## Use instead
    ```python
    torch.autograd.set_detect_anomaly(args.debug)
    for x, y in loader:
        ...
    ```
    or use `trainlint.testing.assert_finite_grads(..., locate=True)` in a test, which
    turns anomaly detection on only to locate a failure.

    ## References
    - [torch.autograd.detect_anomaly](https://pytorch.org/docs/stable/autograd.html#anomaly-detection)
    """

    code = "TL403"
    name = "anomaly-detection-enabled"
    message = "autograd anomaly detection left on: training runs several times slower; enable it only while debugging"
    triggers = ("anomaly",)
    confirm_with = None  # a constant per-step cost: step-time checks compare steps
    test_files = False  # tests turn it on to debug a failure
    valid = [
        "import torch\ntorch.autograd.set_detect_anomaly(args.debug)\n",
        "import torch\ntorch.autograd.set_detect_anomaly(False)\n",
        "import torch\nif args.debug:\n    torch.autograd.set_detect_anomaly(True)\n",
        "import torch\n\ndef test_grads():\n    with torch.autograd.detect_anomaly():\n"
        "        loss.backward()\n",
        # shadowed: a local object with the same method name
        "def run(torch):\n    torch.autograd.set_detect_anomaly(True)\n",
        # no torch import at all
        "class A:\n    def detect_anomaly(self):\n        pass\n\nA().detect_anomaly()\n",
    ]
    invalid = [
        Invalid("import torch\ntorch.autograd.set_detect_anomaly(True)\n", line=2, column=1),
        Invalid(
            "from torch import autograd as ag\n\nfor x in loader:\n"
            "    with ag.detect_anomaly():\n        model(x).sum().backward()\n",
            line=4,
        ),
        Invalid(
            "import torch\n\ndef main():\n    torch.autograd.set_detect_anomaly(mode=True)\n",
            line=4,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        for name in ("set_detect_anomaly", "detect_anomaly"):
            for call in model.calls_to(f"torch.autograd.{name}"):
                if name == "set_detect_anomaly":
                    mode = call.args[0] if call.args else keyword(call, "mode")
                    if not (isinstance(mode, ast.Constant) and mode.value is True):
                        continue
                if in_debug_context(model, call):
                    continue
                if not model.steps.step_loops and not _top_level(model, call):
                    continue  # library code (tracing, numerics tools) switching it on locally
                yield self.report(call)
