"""A plugin rule that raises: reported with rule and file named, other findings kept."""

from trainlint.plugins.hookspecs import hookimpl
from trainlint.rules.base import Invalid, Rule


class Explodes(Rule):
    """## What it does
    Raises.

    ## Why is this bad?
    It is a test double.

    ## Example
    ```python
    x = 1
    ```

    ## Use instead
    ```python
    x = 2
    ```
    """

    code = "BRK001"
    name = "explodes"
    message = "never reported"
    valid = ["x = 1\n"]
    invalid = [Invalid("x = 1\n", line=1)]

    def check(self, model):
        raise ZeroDivisionError("plugin bug")


@hookimpl
def trainlint_rules():
    return [Explodes]
