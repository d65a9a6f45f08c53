"""TL203 warmup-starts-at-zero."""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Iterator

from trainlint.analysis.constants import ConstantEvaluator, is_number, is_positive
from trainlint.analysis.model import FileModel, keyword
from trainlint.analysis.objects import Fate, objects
from trainlint.analysis.schedules import lambda_arg, lambda_closure, scheduler_calls
from trainlint.rules.base import Invalid, Report, Rule, Valid


def _multiplier_at_zero(model: FileModel, node: ast.AST | None) -> object:
    body = lambda_closure(model, node)
    if body is None:
        return None
    expr, params, bound = body
    if not params:
        return None
    ev = ConstantEvaluator(model)
    env: dict[str, object] = {}
    for name, arg in bound.items():  # a factory's parameters, as its call site fills them
        value = ev.expr(arg, {})
        if value is not None:
            env[name] = value
    env.update((p, 0) for p in params)
    if isinstance(expr, ast.FunctionDef):
        if len(expr.args.args) != 1:
            return None
        return ev.function(expr, env)
    return ev.expr(expr, env)


_WARMUP_FACTORIES = re.compile(r"^get_\w*schedule_with_warmup$")


class WarmupStartsAtZero(Rule):
    """## What it does
    Flags a `LambdaLR` whose multiplier is 0 at step 0 (`lambda s: s / warmup`), a
    `LinearLR(start_factor=0)`, and a `transformers` `get_*_schedule_with_warmup` factory
    with a non-zero warmup whose `step()` is never called where it flows in the file (a
    factory that is stepped starts at 0 by the library's design, and only its first
    update of thousands is lost: not reported). Simple lambdas and `def`s are evaluated at step 0 statically. A
    warmup length that cannot be resolved to a constant may be 0 (the usual default), so
    it is reported only when the multiplier is 0 whatever the length (`step / warmup`
    divides by it, so it is not 0 when it runs), or when the length is provably
    positive.

    ## Why is this bad?
    The first optimizer update runs with LR 0 and does nothing; and if `scheduler.step()`
    is never reached (it was commented out, it sits behind a condition that is never
    true, the loop was refactored), the LR stays at 0 for the whole run: training
    "works", the loss never moves. This is the failure of seed report 003 (LR 0 after the
    scheduler was disabled).

    ## Example
    ```python
    scheduler = LambdaLR(optimizer, lambda step: step / warmup_steps)
    ```

    ## Use instead
    ```python
    scheduler = LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup_steps))
    ```

    ## References
    - [torch.optim.lr_scheduler.LambdaLR](https://pytorch.org/docs/stable/generated/torch.optim.lr_scheduler.LambdaLR.html)
    """

    code = "TL203"
    name = "warmup-starts-at-zero"
    message = (
        "the LR multiplier is 0 at step 0: the first update uses LR 0; start the warmup "
        "above 0, e.g. `(step + 1) / warmup`"
    )
    triggers = ("LambdaLR", "LinearLR", "_with_warmup")
    test_files = False  # tests build schedules to test something else than the first LR
    confirm_with = "assert_lr_schedule"
    valid = [
        "import torch\nS = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))\n",
        "from torch.optim.lr_scheduler import LinearLR\ns = LinearLR(opt, start_factor=0.1, total_iters=5)\n",
        "from torch.optim.lr_scheduler import LambdaLR\ns = LambdaLR(opt, lambda epoch: 0.95 ** epoch)\n",
        "from transformers import get_linear_schedule_with_warmup\n"
        "s = get_linear_schedule_with_warmup(opt, num_warmup_steps=0, num_training_steps=n)\n",
        # unknown multiplier: silent
        "import torch\ns = torch.optim.lr_scheduler.LambdaLR(opt, make_lambda(cfg))\n",
        # a warmup branch whose length is the caller's (it may be 0): not provably
        # taken at step 0
        """
import math
from torch.optim.lr_scheduler import LambdaLR

def cosine_with_warmup(optimizer, num_warmup_steps, num_training_steps):
    def lr_lambda(step):
        if step < num_warmup_steps:
            return step / max(1, num_warmup_steps)
        progress = (step - num_warmup_steps) / max(1, num_training_steps - num_warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return LambdaLR(optimizer, lr_lambda)
""",
        # a warmup that defaults to 0
        """
from torch.optim.lr_scheduler import LambdaLR

def build(optimizer, warmup_steps=0):
    return LambdaLR(optimizer, lambda s: s / warmup_steps if s < warmup_steps else 1.0)
""",
        # a command-line warmup whose default is 0
        """
import argparse
from torch.optim.lr_scheduler import LambdaLR

parser = argparse.ArgumentParser()
parser.add_argument("--warmup-steps", type=int, default=0)
args = parser.parse_args()
sched = LambdaLR(opt, lambda s: s / args.warmup_steps if s < args.warmup_steps else 1.0)
""",
        # the library's warmup factory, stepped after every update: its first value 0
        # is the documented design, one update of thousands
        """
from transformers import get_cosine_schedule_with_warmup

sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=500, num_training_steps=10000)
for batch in loader:
    model(**batch).loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad()
""",
        # a configured warmup length: 0 by default in most trainers
        "from transformers import get_linear_schedule_with_warmup\n"
        "s = get_linear_schedule_with_warmup(opt, args.warmup_steps, args.max_steps)\n",
        # a test building a schedule for something else than its first value
        Valid(
            "from torch.optim.lr_scheduler import LambdaLR\n"
            "sched = LambdaLR(opt, lr_lambda=lambda epoch: epoch ** 0.65)\n",
            path="tests/test_sync.py",
        ),
        # no torch
        "def LambdaLR(o, f):\n    return f\ns = LambdaLR(opt, lambda s: s / 10)\n",
    ]
    invalid = [
        # a warmup that defaults to 0, but the schedule is only built when it is not
        Invalid(
            """
from torch.optim.lr_scheduler import LambdaLR
def build(opt, warmup_steps=0):
    if warmup_steps > 0:
        return LambdaLR(opt, lambda s: min(1.0, s / warmup_steps))
    return None
""",
            line=4,
        ),
        # dividing by the warmup length proves it is not 0
        Invalid(
            "import torch.optim.lr_scheduler as sched\n"
            "s = sched.LambdaLR(opt, lambda step: step / warmup_steps)\n",
            line=2,
        ),
        # a warmup parameter without default, divided by: provably > 0 when it runs
        Invalid(
            """
import torch

def get_lr_scheduler(optimizer, warmup_steps, max_steps):
    warm = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: step / warmup_steps)
    cos = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max_steps - warmup_steps)
    return torch.optim.lr_scheduler.SequentialLR(optimizer, [warm, cos], milestones=[warmup_steps])
""",
            line=4,
        ),
        Invalid(
            """
from torch.optim.lr_scheduler import LambdaLR
import math

warmup_epochs = 5
total_epochs = 100

def lr_lambda(epoch):
    if epoch < warmup_epochs:
        return epoch / warmup_epochs
    progress = (epoch - warmup_epochs) / (total_epochs - warmup_epochs)
    return 0.5 * (1 + math.cos(math.pi * progress))

scheduler = LambdaLR(optimizer, lr_lambda)
""",
            line=13,
        ),
        Invalid(
            "from torch.optim.lr_scheduler import LinearLR\n"
            "s = LinearLR(opt, start_factor=0.0, total_iters=1000)\n",
            line=2,
        ),
        Invalid(
            "from transformers import get_cosine_schedule_with_warmup as cosine\n"
            "s = cosine(opt, num_warmup_steps=500, num_training_steps=total)\n",
            line=2,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        for call in scheduler_calls(model):
            qual = model.qualname(call.func) or ""
            cls = qual.rsplit(".", 1)[-1]
            if cls == "LambdaLR":
                arg = lambda_arg(call)
                values = arg.elts if isinstance(arg, (ast.List, ast.Tuple)) else [arg]
                if any(self._zero(_multiplier_at_zero(model, v)) for v in values):
                    yield self.report(call)
            elif cls == "LinearLR":
                start = keyword(call, "start_factor")
                if start is None and len(call.args) > 1:
                    start = call.args[1]
                if isinstance(start, ast.Constant) and is_number(start.value) and start.value == 0:
                    yield self.report(
                        call,
                        "`LinearLR(start_factor=0)`: a zero LR factor (current torch rejects it "
                        "with a ValueError at construction; older versions train at LR 0); "
                        "use a small positive `start_factor`",
                    )
            elif qual.startswith("transformers") and _WARMUP_FACTORIES.match(cls):
                warm = keyword(call, "num_warmup_steps")
                if warm is None and len(call.args) > 1:
                    warm = call.args[1]
                if warm is None or not is_positive(ConstantEvaluator(model).expr(warm, {})):
                    continue  # a warmup of 0 (the usual default) starts at the full LR
                if objects(model).fate(call, "step") is not Fate.NEVER:
                    # the library's documented warmup, stepped: one update of thousands
                    # at LR 0 is its design, and the user cannot change the factory
                    continue
                yield self.report(
                    call,
                    f"`{cls}` starts warmup at LR 0 and is never stepped: the LR stays 0 "
                    "for the whole run; call `scheduler.step()` after every "
                    "`optimizer.step()`",
                )

    @staticmethod
    def _zero(value: object) -> bool:
        return is_number(value) and math.isclose(value, 0.0, abs_tol=0.0)  # type: ignore[arg-type]
