"""TL107 optimizer-on-stale-params."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.model import FileModel, call_name, dotted, walk_local
from trainlint.analysis.roles import Role, parameter_owners
from trainlint.analysis.torch_table import (
    NEW_OBJECT_FUNCS,
    keeps_parameters_method,
    shares_parameters,
)
from trainlint.rules.base import Invalid, Report, Rule


class OptimizerOnStaleParams(Rule):
    """## What it does
    Flags rebinding a model name to a different module object (`model = Net()`,
    `copy.deepcopy(model)`, a whole model unpickled with `torch.load`, a new object
    from a factory) after an optimizer was built from `model.parameters()`, when that
    optimizer is stepped afterwards. Rebinding an object on the owner's attribute path
    counts too (`self.posterior = deepcopy(self.posterior)` after an optimizer over
    `self.posterior.net.parameters()`).

    ## Why is this bad?
    The optimizer holds the *old* parameter tensors. The new model's forward and
    backward fill the new tensors' gradients, and `optimizer.step()` updates tensors
    nothing uses any more: the model being trained never changes, no error, flat loss.
    `model = model.to(device)`, `torch.compile(model)`, `DDP(model)` and wrappers that
    keep the model inside share the same parameters and are fine.

    ## Example
    ```python
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model = copy.deepcopy(model)
    for x, y in loader:
        ...
        optimizer.step()
    ```

    ## Use instead
    ```python
    model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ```
    or load weights in place with `model.load_state_dict(...)`.

    ## References
    - [torch.optim: constructing it](https://pytorch.org/docs/stable/optim.html#constructing-it)
    """

    code = "TL107"
    name = "optimizer-on-stale-params"
    message = "model rebound after its optimizer was built: the optimizer updates the old parameters; build the optimizer from the final model"
    triggers = ("parameters",)
    confirm_with = "assert_weights_updated"
    valid = [
        """
import torch
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model = model.to("cuda")
model = torch.compile(model)
for x in loader:
    model(x).sum().backward()
    opt.step()
""",
        # the optimizer is rebuilt for the new model
        """
import copy, torch
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model = copy.deepcopy(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x in loader:
    model(x).sum().backward()
    opt.step()
""",
        # a wrapper that keeps the model inside shares its parameters
        """
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
opt = torch.optim.AdamW(model.parameters())
model = DDP(model, device_ids=[0])
model = EMAWrapper(model)
for x in loader:
    model(x).sum().backward()
    opt.step()
""",
        # a copy made for evaluation, optimizer never stepped afterwards
        """
import copy, torch
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x in loader:
    model(x).sum().backward()
    opt.step()
best = copy.deepcopy(model)
model = copy.deepcopy(best)
""",
        # no torch
        """
opt = make_optimizer(model.parameters())
model = rebuild(model)
opt.step()
""",
    ]
    invalid = [
        Invalid(
            """
import copy
import torch.optim as optim

optimizer = optim.Adam(model.parameters(), lr=1e-3)
model = copy.deepcopy(model)
for x, y in loader:
    optimizer.zero_grad()
    crit(model(x), y).backward()
    optimizer.step()
""",
            line=5,
        ),
        Invalid(
            """
import torch

def run_fold(cfg, loader):
    model = build_model(cfg)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    for fold in range(5):
        model = build_model(cfg)
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
""",
            line=7,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        if not (model.calls.get("parameters") or model.calls.get("named_parameters")):
            return  # no `X.parameters()` for an optimizer to have been built over
        for _, binding in model.roles.all_of(Role.OPTIMIZER):
            call = binding.call
            if call is None:
                continue
            owners = [dotted(o) for o in parameter_owners(call)]
            owners = [o for o in owners if o]
            if not owners:
                continue
            scope = model.function_of(call) or model.tree
            opt_stmt = model.statement_of(call)
            opt_name = self._bound_name(model, opt_stmt)
            if opt_name is None:
                continue
            for stmt in model.assignments_in(scope):
                if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
                    continue
                name = dotted(stmt.targets[0])
                if (
                    name is None
                    or not any(_rebinds(name, o) for o in owners)
                    or (stmt.lineno, stmt.col_offset) <= (opt_stmt.lineno, opt_stmt.col_offset)
                ):
                    continue  # a rebinding before the optimizer was built is harmless
                if not self._new_object(model, stmt.value, name):
                    continue
                if self._stepped_after(model, scope, stmt, opt_name):
                    yield self.report(stmt)

    @staticmethod
    def _bound_name(model: FileModel, stmt: ast.stmt) -> str | None:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            return dotted(stmt.targets[0])
        return None

    @staticmethod
    def _new_object(model: FileModel, value: ast.AST, name: str) -> bool:
        # `Net().to(device)`: look through pass-through methods to the object they act on
        while (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Attribute)
            and keeps_parameters_method(call_name(value))
        ):
            value = value.func.value
        if not isinstance(value, ast.Call):
            return False
        qual = model.qualname(value.func)
        if qual in NEW_OBJECT_FUNCS:
            return True
        if keeps_parameters_method(call_name(value)) or shares_parameters(qual):
            return False
        # a wrapper/factory that receives the old model keeps its parameters
        for arg in [*value.args, *(k.value for k in value.keywords)]:
            for sub in ast.walk(arg):
                if dotted(sub) == name:
                    return False
        if isinstance(value.func, ast.Attribute) and dotted(value.func.value) == name:
            return False  # model.something(...) returning itself or a view of itself
        return True

    @staticmethod
    def _stepped_after(model: FileModel, scope: ast.AST, stmt: ast.stmt, opt_name: str) -> bool:
        pos = (stmt.lineno, stmt.col_offset)
        rebuilt_at = [
            (s.lineno, s.col_offset)
            for s in walk_local(scope)
            if isinstance(s, ast.Assign)
            and any(dotted(t) == opt_name for t in s.targets)
            and (s.lineno, s.col_offset) > pos
        ]
        limit = min(rebuilt_at) if rebuilt_at else (10**9, 0)
        for call in walk_local(scope):
            if not isinstance(call, ast.Call) or call_name(call) not in ("step", "optimizer_step"):
                continue
            func = call.func
            target = None
            if call_name(call) == "step" and isinstance(func, ast.Attribute):
                target = dotted(func.value)
                if target != opt_name and call.args:
                    target = dotted(call.args[0])  # scaler.step(opt)
            elif call.args:
                target = dotted(call.args[0])
            if target == opt_name and pos < (call.lineno, call.col_offset) < limit:
                return True
        # `self.optimizer` built in __init__ and stepped in another method of the class
        if (
            opt_name.startswith("self.")
            and isinstance(scope, ast.FunctionDef)
            and (scope.name == "__init__" and not rebuilt_at)
        ):
            cls = model.class_of(scope)
            if cls is not None:
                for call in ast.walk(cls):
                    if (
                        isinstance(call, ast.Call)
                        and call_name(call) == "step"
                        and isinstance(call.func, ast.Attribute)
                        and dotted(call.func.value) == opt_name
                        and model.function_of(call) is not scope
                    ):
                        return True
        return False


def _rebinds(name: str, owner: str) -> bool:
    """Assigning ``name`` replaces the object whose parameters the optimizer holds: the
    owner itself, or an object on its attribute path (``self.posterior`` for an
    optimizer over ``self.posterior.net.parameters()``)."""
    return owner == name or owner.startswith(name + ".")
