"""TL303 eval-without-no-grad."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator

from trainlint.analysis.context import is_test_file
from trainlint.analysis.flow import grad_enabled_at
from trainlint.analysis.grad_mode import (
    after_eval,
    callers_disable_grad,
    evaluated_through_helpers,
    grad_disabled_earlier,
    under_grad_wrapper,
    walks_data,
)
from trainlint.analysis.loaders import over_fixed_input
from trainlint.analysis.model import FileModel, call_name, dotted, walk_local
from trainlint.analysis.paths import Reported
from trainlint.analysis.roles import modules_by_protocol
from trainlint.analysis.steps import Kind
from trainlint.edits import torch_call, wrap_intent
from trainlint.findings import Intent
from trainlint.rules.base import Invalid, Report, Rule

_EVAL_FUNC = re.compile(
    r"^(evaluate|validate|validation|eval|test|val)(_|$)|"
    r"_(evaluate|validate|validation|eval|val|test)$|^(evaluate|validate)\w*",
    re.IGNORECASE,
)


#: `get_model()`, `build_net(cfg)`: calls that return or change a model, not run it
_ACCESSOR = re.compile(
    r"^_?(get|set|build|make|create|load|init|turn|wrap|prepare|convert|"
    r"replace|register|freeze|unwrap)_",
    re.IGNORECASE,
)


def _wrap_in_no_grad(
    model: FileModel, call: ast.Call, loops: list[ast.For | ast.AsyncFor | ast.While]
) -> Intent | None:
    loop = next((lp for lp in loops if walks_data(model, lp)), None)  # innermost first
    header = torch_call(model, call, "torch.no_grad")
    if loop is None or header is None:
        return None
    return wrap_intent(model, [loop], header)


class EvalWithoutNoGrad(Rule):
    """## What it does
    Flags a model call in an evaluation loop (after `model.eval()`, or in a function
    named `evaluate`/`validate`/`test*`) that runs outside `torch.no_grad()` /
    `torch.inference_mode()`. In test files (`tests/`, `test_*.py`), `test_*` functions
    are pytest tests, not evaluation loops, and are not reported for their name alone.
    The loop must go over data (a loader, its batches, `range(len(loader))`): repeating a
    fixed input (a profiler warm-up), decode steps and environment rollouts are not
    evaluation passes. Under a decorator or `with` whose name says it disables grad
    (`smart_inference_mode()`, `eval_mode(model)` from another module), nothing is
    reported: whether grad is on there cannot be seen from the file. A helper shared
    with training (`model.eval()` then `run_epoch(data, model, ...)`, which runs the
    model over the data and has no backward of its own) is reported at its call. A file
    that never imports torch is checked when a receiver is a module by its uses
    (`X.eval()` and `X.zero_grad()`: the model was built elsewhere).

    ## Why is this bad?
    `model.eval()` switches dropout and batch-norm behaviour; it does not stop autograd
    from recording. Every activation of every validation batch is kept for a backward
    that never comes: validation uses as much memory as training (often more, with
    larger batches), runs slower, and OOMs at the first evaluation of a model that
    trained fine.

    ## Example
    ```python
    def evaluate(model, loader):
        model.eval()
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum().item()
    ```

    ## Use instead
    ```python
    @torch.no_grad()
    def evaluate(model, loader):
        model.eval()
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum().item()
    ```

    ## Fix safety
    The fix wraps the evaluation loop (the innermost loop over data around the model
    call) in `with torch.no_grad():`, spelled through the file's own imports. It is
    unsafe: the loop's outputs no longer carry autograd history, so code after it that
    differentiates them (rare in evaluation, but possible) would fail. It is left
    undone when no import of `torch` can spell `no_grad` there.

    ## Why is this off by default?
    On research training code, read in context, 6 of 14 findings were worth a change;
    the rest were right but cost nothing anyone would notice: a toy model's test pass,
    a one-off evaluation after training (each batch's graph is freed on the next).
    Cost is not visible in the code, so select it where evaluation memory matters.

    ## References
    - [torch.no_grad](https://pytorch.org/docs/stable/generated/torch.no_grad.html)
    """

    code = "TL303"
    name = "eval-without-no-grad"
    message = "model called during evaluation without `torch.no_grad()`: activations are kept for a backward that never comes; wrap the evaluation in `with torch.no_grad():`"
    triggers = ("eval", "valid", "test")
    fix_safety = "unsafe"
    default_enabled = False
    confirm_with = "assert_no_graph_in_eval"
    valid = [
        """
import torch
@torch.no_grad()
def evaluate(model, loader):
    model.eval()
    for x, y in loader:
        out = model(x)
""",
        """
import torch
def validate(model, loader):
    model.eval()
    with torch.inference_mode():
        for x, y in loader:
            out = model(x)
""",
        # the caller wraps the evaluation in no_grad
        """
import torch
def evaluate(model, loader):
    for x, y in loader:
        out = model(x)

with torch.no_grad():
    evaluate(model, val_loader)
""",
        # test-time training backpropagates: not an evaluation-only loop
        """
import torch
def test_time_adapt(model, loader, opt):
    model.eval()
    for x in loader:
        loss = model(x).entropy()
        loss.backward()
        opt.step()
""",
        # no torch
        """
def evaluate(model, loader):
    model.eval()
    for x in loader:
        model(x)
""",
        # a context manager from elsewhere that sets eval mode and may disable grad
        """
import torch
from myproject.nets import eval_mode

def validate(model, loader):
    with eval_mode(model):
        for x, y in loader:
            out = model(x)
""",
        # a profiler warming up on one fixed input: no data set is evaluated
        """
import torch
def measure(model, example, repeats=3):
    model.eval()
    for _ in range(repeats):
        model(example)
""",
        # `trainer.get_model()` fetches the model, it does not run it
        """
import torch
def validate(trainer, task, loader):
    for batch in loader:
        trainer.valid_step(batch)
        task.report(trainer.get_model(), batch)
""",
    ]
    invalid = [
        Invalid(
            """
import torch
model = torch.nn.Linear(4, 2)
def evaluate(loader):
    model.eval()
    correct = 0
    for x, y in loader:
        correct += (model(x).argmax(1) == y).sum().item()
    return correct
""",
            line=7,
            fixed="""
import torch
model = torch.nn.Linear(4, 2)
def evaluate(loader):
    model.eval()
    correct = 0
    with torch.no_grad():
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum().item()
    return correct
""",
        ),
        Invalid(
            """
import torch
from torch import nn

net = nn.Sequential(nn.Linear(4, 4))
for epoch in range(10):
    train(net)
    net.eval()
    for xb, yb in val_loader:
        preds = net(xb)
        metric.update(preds, yb)
""",
            line=9,
            fixed="""
import torch
from torch import nn

net = nn.Sequential(nn.Linear(4, 4))
for epoch in range(10):
    train(net)
    net.eval()
    with torch.no_grad():
        for xb, yb in val_loader:
            preds = net(xb)
            metric.update(preds, yb)
""",
        ),
        # batches drawn by index from the loader's length
        Invalid(
            """
import torch
def validate(model, val_loader):
    model.eval()
    it = iter(val_loader)
    for _ in range(len(val_loader)):
        x, y = next(it)
        out = model(x)
""",
            line=7,
            fixed="""
import torch
def validate(model, val_loader):
    model.eval()
    it = iter(val_loader)
    with torch.no_grad():
        for _ in range(len(val_loader)):
            x, y = next(it)
            out = model(x)
""",
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        if not model.loops or not (model.imports_module("torch") or modules_by_protocol(model)):
            return  # no loop over data, or no torch module (by import or by its uses)

        in_tests = is_test_file(model.path)
        seen = Reported()

        def over_data(call: ast.Call) -> bool:
            return any(
                walks_data(model, lp) and not over_fixed_input(model, lp)
                for lp in model.enclosing_loops(call)
            )

        for call in self._model_calls(model, over_data):
            loops = model.enclosing_loops(call)
            if not over_data(call):
                continue  # warm-up/benchmark repeats, decode steps, env rollouts: no dataset
            fn = model.function_of(call)
            if not (
                after_eval(model, call, fn)
                or (
                    fn is not None
                    and _EVAL_FUNC.search(fn.name)
                    and not fn.name.endswith("_step")
                    and not (in_tests and fn.name.startswith("test"))
                )
            ):
                continue
            if not grad_enabled_at(model, call)[0] or under_grad_wrapper(model, call):
                continue
            if self._backprops(model, loops[-1]) or grad_disabled_earlier(model, call, fn):
                continue
            if fn is not None and callers_disable_grad(model, fn):
                continue
            if seen.first(call):
                yield self.report(
                    call,
                    fix=self.restructure(
                        _wrap_in_no_grad(model, call, loops),
                        "wrap the evaluation loop in `no_grad()`",
                    ),
                )

        # `model.eval()` then a same-file helper shared with training, handed the model:
        # reported at the helper's call (the helper itself also trains)
        for site, runs in evaluated_through_helpers(model):
            fn = model.function_of(site)
            if (
                not grad_enabled_at(model, site)[0]
                or under_grad_wrapper(model, site)
                or grad_disabled_earlier(model, site, fn)
                or (fn is not None and callers_disable_grad(model, fn))
                or any(self._backprops(model, model.enclosing_loops(r)[-1]) for r in runs)
                or not all(seen.first(r) for r in runs)  # reported in the helper already
            ):
                continue
            if seen.first(site):
                yield self.report(site)

    @staticmethod
    def _model_calls(
        model: FileModel, keep: Callable[[ast.Call], bool] | None = None
    ) -> Iterator[ast.Call]:
        """Calls of a model: by role, a name put in eval mode in the same function, or a
        model-like spelling (`model`, `net`) for parameters whose role is unknown. Only
        calls that ``keep`` accepts are looked at (a cheap test before the costly ones)."""
        flow = model.flow
        evaluated: set[tuple[int, str]] = set()
        scopes: dict[int, ast.AST] = {}
        for c in model.calls.get("eval", ()):
            if isinstance(c.func, ast.Attribute) and not c.args:
                name = dotted(c.func.value)
                if name:
                    fn = model.function_of(c)
                    evaluated.add((id(fn), name))
                    scopes[id(fn)] = fn if fn is not None else model.tree
        for fn in model.functions:
            if _EVAL_FUNC.search(fn.name):
                scopes[id(fn)] = fn
        # only calls inside evaluation candidates can be reported: skip the rest unseen
        # `keep` wants an enclosing loop of the call's own function: walk only the scopes'
        # outermost loops (in source order, as the scope's walk would meet them)
        candidates = [
            sub
            for scope in scopes.values()
            for top in (model.outermost_loops(scope) if keep is not None else [scope])
            for sub in walk_local(top)
            if isinstance(sub, ast.Call) and (keep is None or keep(sub))
        ]
        for call in candidates:
            func = call.func
            name = dotted(func)
            if (
                flow.is_model_call(func)
                or (name is not None and (id(model.function_of(call)), name) in evaluated)
                or (
                    isinstance(func, (ast.Name, ast.Attribute))
                    and model.qualname(func) is None
                    and model.steps.is_model(func)
                    and model.resolve_call_target_is_none(func)
                    and not _ACCESSOR.match((name or "").rsplit(".", 1)[-1])
                )
            ):
                yield call

    @staticmethod
    def _backprops(model: FileModel, loop: ast.AST) -> bool:
        for sub in walk_local(loop):
            if isinstance(sub, ast.Call) and (
                model.steps.classify(sub) is not None
                and model.steps.classify(sub).kind in (Kind.BACKWARD, Kind.STEP)  # type: ignore[union-attr]
                or call_name(sub) == "grad"
                and model.qualname(sub.func) == "torch.autograd.grad"
            ):
                return True
            if isinstance(sub, ast.Call):
                target = model.resolve_call(sub)
                if target is not None and model.steps.has_own_step(target):
                    return True
        return False
