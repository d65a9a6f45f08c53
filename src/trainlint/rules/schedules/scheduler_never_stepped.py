"""TL204 scheduler-never-stepped."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.model import FileModel
from trainlint.analysis.objects import Fate, objects
from trainlint.analysis.schedules import scheduler_calls
from trainlint.rules.base import Invalid, Report, Rule


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
    unpacking into callers, and arguments of same-file functions; a `self.scheduler`
    counts as stepped when the file steps it through an instance
    (`model.scheduler.step()`). A scheduler that
    escapes the file (returned from a method a framework calls, like Lightning's
    `configure_optimizers`, unless the module sets `automatic_optimization = False`:
    Lightning then steps nothing, and the file must; passed to an unknown function;
    stored in a container) is left alone.

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
    message = "this scheduler is never stepped: the LR stays at its initial value; call `scheduler.step()` in the training loop"
    triggers = ("lr_scheduler", "LR(", "LR)", "Scheduler", "_schedule")
    confirm_with = "assert_lr_schedule"
    valid = [
        # built as a model's attribute, stepped through the instance by a function
        """
import torch
from torch import nn

class Recommender(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.emb = nn.Embedding(n, 32)
        self.optimizer = torch.optim.Adam(self.parameters())
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=3)

def run_epoch(model, batches):
    model.scheduler.step()
    for x in batches:
        model.optimizer.zero_grad()
        model.emb(x).sum().backward()
        model.optimizer.step()
""",
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
        # manual optimization: Lightning does not step the schedulers it is handed
        Invalid(
            """
import torch
import lightning as L

class GAN(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.opt = torch.optim.AdamW(self.parameters())
        self.sched = torch.optim.lr_scheduler.ExponentialLR(self.opt, gamma=0.999)

    def configure_optimizers(self):
        return [self.opt], [self.sched]

    def training_step(self, batch, batch_idx):
        self.opt.zero_grad()
        self.manual_backward(self(batch).mean())
        self.opt.step()
""",
            line=9,
        ),
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
        query = objects(model)
        for call in scheduler_calls(model):
            if query.fate(call, "step") is Fate.NEVER and not _exported_by_config(model, call):
                yield self.report(call)
