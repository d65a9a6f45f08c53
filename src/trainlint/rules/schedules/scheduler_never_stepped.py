"""TL204 scheduler-never-stepped."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.model import FileModel, walk_local
from trainlint.analysis.schedules import scheduler_calls
from trainlint.rules.base import Invalid, Report, Rule


def _flow_of(model: FileModel, expr: ast.AST, depth: int) -> str:
    """Follow where a value goes: "stepped", "escapes" or "never"."""
    if depth > 6:
        return "escapes"
    cur = expr
    parent = model.parent_of(cur)
    # climb out of containers and wrappers that keep the object
    while isinstance(parent, (ast.Tuple, ast.List, ast.Dict, ast.Set, ast.Starred, ast.keyword)):
        if isinstance(parent, (ast.Tuple, ast.List)) and isinstance(
            model.parent_of(parent), (ast.Assign,)
        ) and model.parent_of(parent).value is parent:  # type: ignore[union-attr]
            break  # `a, b = x, y` unpacks element-wise: handled below
        cur, parent = parent, model.parent_of(parent)
        if isinstance(parent, (ast.Assign, ast.AnnAssign)) and cur is not expr:
            return "escapes"  # stored in a container
    if isinstance(parent, ast.Return):
        return _flow_of_return(model, parent, cur, expr, depth)
    if isinstance(parent, ast.Call) and cur is not parent.func:
        return _flow_into_call(model, parent, cur, depth)
    if isinstance(parent, (ast.Assign, ast.AnnAssign)) and parent.value is cur:
        targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
        verdicts = []
        for t in targets:
            if isinstance(t, (ast.Tuple, ast.List)) and isinstance(cur, (ast.Tuple, ast.List)):
                for te, ve in zip(t.elts, cur.elts, strict=False):
                    if ve is expr or any(s is expr for s in ast.walk(ve)):
                        verdicts.append(_flow_of_name(model, te, depth))
            elif isinstance(t, (ast.Name, ast.Attribute)):
                verdicts.append(_flow_of_name(model, t, depth))
            else:
                verdicts.append("escapes")
        return _merge(verdicts)
    if isinstance(parent, ast.Expr):
        return "never"
    if isinstance(parent, (ast.withitem, ast.NamedExpr, ast.Lambda, ast.IfExp, ast.BoolOp)):
        return "escapes"
    return "escapes"


def _merge(verdicts: list[str]) -> str:
    if not verdicts:
        return "never"
    if "stepped" in verdicts:
        return "stepped"
    if "escapes" in verdicts:
        return "escapes"
    return "never"


def _flow_of_name(model: FileModel, target: ast.AST, depth: int) -> str:
    """A name/attribute now holds the scheduler: is it stepped or handed on?"""
    key = model.roles.key(target)
    if key is None:
        return "escapes"
    if key[0] == "dotted" and not str(key[1]).startswith("self."):
        return "escapes"  # someone else's attribute
    refs = _references(model, target, key)
    verdicts = []
    for ref in refs:
        parent = model.parent_of(ref)
        if isinstance(parent, ast.Attribute) and parent.value is ref:
            grand = model.parent_of(parent)
            if isinstance(grand, ast.Call) and grand.func is parent:
                if parent.attr == "step":
                    return "stepped"
                continue  # other methods: get_last_lr(), state_dict()
            continue
        if isinstance(parent, (ast.Compare, ast.If, ast.BoolOp, ast.UnaryOp, ast.FormattedValue,
                               ast.JoinedStr)):
            continue
        if isinstance(parent, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and ref in (
            parent.targets if isinstance(parent, ast.Assign) else [parent.target]
        ):
            continue
        verdicts.append(_flow_of(model, ref, depth + 1))
    return _merge(verdicts)


def _references(model: FileModel, target: ast.AST, key: tuple[object, ...]) -> list[ast.AST]:
    out: list[ast.AST] = []
    if key[0] == "name":
        scope_id = key[1]
        scope = model.tree if scope_id == id(model.tree) else next(
            (f for f in model.functions if id(f) == scope_id), model.tree
        )
        nodes = ast.walk(scope)
    else:
        nodes = ast.walk(model.tree)
    for node in nodes:
        if node is target:
            continue
        if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load):
            k = model.roles.key(node)
            if k == key or (key[0] == "attr" and k is not None and k[0] == "attr"
                            and k[2] == key[2]):
                out.append(node)
    return out


def _flow_of_return(model: FileModel, ret: ast.Return, cur: ast.AST, expr: ast.AST,
                    depth: int) -> str:
    fn = model.function_of(ret)
    if fn is None or fn.name.startswith("configure_") or fn.name.startswith("_configure"):
        return "escapes"
    sites = model.call_sites.get(id(fn), [])
    if not sites:
        return "escapes"  # called from outside this file
    index = None
    value = ret.value
    if isinstance(value, (ast.Tuple, ast.List)) and value is not cur:
        return "escapes"
    if isinstance(value, (ast.Tuple, ast.List)):
        for i, elt in enumerate(value.elts):
            if elt is expr or any(s is expr for s in ast.walk(elt)):
                index = i
    verdicts = []
    for site in sites:
        parent = model.parent_of(site)
        if isinstance(parent, ast.Assign) and parent.value is site and len(parent.targets) == 1:
            t = parent.targets[0]
            if index is not None and isinstance(t, (ast.Tuple, ast.List)) and index < len(t.elts):
                verdicts.append(_flow_of_name(model, t.elts[index], depth + 1))
            elif index is None and isinstance(t, (ast.Name, ast.Attribute)):
                verdicts.append(_flow_of_name(model, t, depth + 1))
            else:
                verdicts.append("escapes")
        else:
            verdicts.append(_flow_of(model, site, depth + 1) if index is None else "escapes")
    return _merge(verdicts)


def _flow_into_call(model: FileModel, call: ast.Call, arg: ast.AST, depth: int) -> str:
    target = model.resolve_call(call)
    if target is None:
        return "escapes"
    params = [a.arg for a in (*target.args.posonlyargs, *target.args.args)]
    if params and params[0] in ("self", "cls") and isinstance(call.func, ast.Attribute):
        params = params[1:]
    name = None
    for i, a in enumerate(call.args):
        if a is arg and i < len(params):
            name = params[i]
    for kw in call.keywords:
        if kw.value is arg:
            name = kw.arg
    if name is None:
        return "escapes"
    # closures count: ignite's `create_trainer(..., lr_scheduler)` steps it in the nested
    # `train_step(engine, batch)` it hands to the Engine
    for node in ast.walk(target):
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load):
            parent = model.parent_of(node)
            if isinstance(parent, ast.Attribute) and parent.attr == "step":
                return "stepped"
    # not stepped directly: follow its uses inside the helper
    verdicts = []
    for node in walk_local(target):
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load):
            parent = model.parent_of(node)
            if isinstance(parent, ast.Attribute):
                continue
            if isinstance(parent, (ast.Compare, ast.If, ast.BoolOp, ast.UnaryOp)):
                continue
            verdicts.append(_flow_of(model, node, depth + 1))
    return _merge(verdicts)


def _exported_by_config(model: FileModel, call: ast.Call) -> bool:
    """A module-level scheduler in a file that runs nothing: no loop at module level and
    no training step anywhere. Such a module is a configuration another script imports
    (ignite's `configs/*.py` read by its config runner), not a training script that
    forgot to step."""
    stmt = model.parent_of(call)
    if not (isinstance(stmt, (ast.Assign, ast.AnnAssign)) and model.parent_of(stmt) is model.tree):
        return False
    if model.steps.step_loops:
        return False
    return not any(model.function_of(loop) is None for loop in model.loops)


class SchedulerNeverStepped(Rule):
    """## What it does
    Flags a scheduler that is built but whose `step()` is never called anywhere its
    value flows in the file: through assignments, `self` attributes, returns and tuple
    unpacking into callers, and arguments of same-file functions. A scheduler that
    escapes the file (returned from a method a framework calls, like Lightning's
    `configure_optimizers`; passed to an unknown function; stored in a container) is
    left alone.

    ## Why is this bad?
    The schedule never runs: the LR stays at its initial value for the whole run, and
    with a warmup multiplier that initial value is 0 or tiny. The code reads as if a
    cosine decay or a warmup were in place; the logs show a flat LR nobody looks at.

    ## Example
    ```python
    scheduler = CosineAnnealingLR(optimizer, T_max=epochs)
    for epoch in range(epochs):
        train_one_epoch(model, loader, optimizer)
    ```

    ## Use instead
    ```python
    scheduler = CosineAnnealingLR(optimizer, T_max=epochs)
    for epoch in range(epochs):
        train_one_epoch(model, loader, optimizer)
        scheduler.step()
    ```

    ## References
    - [How to adjust learning rate](https://pytorch.org/docs/stable/optim.html#how-to-adjust-learning-rate)
    """

    code = "TL204"
    name = "scheduler-never-stepped"
    message = (
        "this scheduler is never stepped: the LR stays at its initial value; call `scheduler.step()` in the training loop"
    )
    triggers = ("lr_scheduler", "LR(", "LR)", "Scheduler", "_schedule")
    confirm_with = "assert_lr_schedule"
    valid = [
        """
import torch
sched = torch.optim.lr_scheduler.StepLR(opt, 30)
for epoch in range(90):
    train(model, opt)
    sched.step()
""",
        # Lightning: the framework steps what configure_optimizers returns
        """
import torch
import pytorch_lightning as pl
class M(pl.LightningModule):
    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters())
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=1000)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
""",
        # returned from a factory and stepped by the caller
        """
from torch import optim
def build(model):
    opt = optim.SGD(model.parameters(), lr=0.1)
    sched = optim.lr_scheduler.StepLR(opt, 10)
    return opt, sched

opt, sched = build(model)
for epoch in range(30):
    train(model, opt)
    sched.step()
""",
        # handed to an unknown trainer
        """
import torch
sched = torch.optim.lr_scheduler.StepLR(opt, 10)
trainer = Trainer(model, opt, sched)
trainer.fit()
""",
        # stepped through a same-file helper's parameter
        """
import torch
def train_epoch(model, opt, scheduler):
    for x in loader:
        model(x).sum().backward()
        opt.step()
        scheduler.step()

sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 100)
train_epoch(model, opt, sched)
""",
        # a config module: it only builds the objects a runner script imports
        """
import torch.optim.lr_scheduler as lrs
from torch import nn, optim

num_epochs = 90
model = build_model("resnet50")
criterion = nn.CrossEntropyLoss()
optimizer = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
lr_scheduler = lrs.MultiStepLR(optimizer, milestones=[30, 60, 80], gamma=0.1)
""",
        # returned, then handed to a factory whose nested step function steps it
        """
import torch

def initialize(model):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1000)
    return opt, sched

def create_trainer(model, opt, sched):
    def train_step(engine, batch):
        opt.zero_grad()
        model(batch).sum().backward()
        opt.step()
        sched.step()
    return Engine(train_step)

opt, sched = initialize(model)
trainer = create_trainer(model, opt, sched)
""",
        # no torch
        """
class StepLR:
    pass
s = StepLR()
""",
    ]
    invalid = [
        Invalid(
            """
import torch.optim as optim
sched = optim.lr_scheduler.CosineAnnealingLR(opt, T_max=100)
for epoch in range(100):
    train(model, opt)
""",
            line=2,
        ),
        Invalid(
            """
from torch.optim.lr_scheduler import LambdaLR

class Trainer:
    def __init__(self, model, opt):
        self.opt = opt
        self.scheduler = LambdaLR(opt, lambda s: min(1.0, (s + 1) / 100))

    def save(self, path):
        torch.save({"sched": self.scheduler.state_dict()}, path)
""",
            line=6,
        ),
        Invalid(
            """
import torch
def build(model):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 10)
    return opt, sched

opt, sched = build(model)
for epoch in range(30):
    train(model, opt)
""",
            line=4,
        ),
        # a module-level scheduler next to the training loop of the same file
        Invalid(
            """
import torch
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10)

def main():
    for x, y in loader:
        opt.zero_grad()
        criterion(model(x), y).backward()
        opt.step()

main()
""",
            line=2,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        for call in scheduler_calls(model):
            verdict = _flow_of(model, call, depth=0)
            if verdict == "never" and not _exported_by_config(model, call):
                yield self.report(call)
