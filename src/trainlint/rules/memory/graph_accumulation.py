"""TL302 graph-accumulation."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.accumulation import (
    accumulations_across_steps,
    backpropagated_later,
    carries_graph,
    defined_without_grad,
    kept_by_calls,
)
from trainlint.analysis.flow import Taint, grad_enabled_at
from trainlint.analysis.model import FileModel, dotted
from trainlint.rules.base import Invalid, Report, Rule, Valid


class GraphAccumulation(Rule):
    """## What it does
    Flags a tensor that carries autograd history (a loss, a model output, anything
    computed from them) accumulated across loop iterations without `.item()` or
    `.detach()`: `total += loss`, `losses.append(loss)`, `history[k] = out`. Only the
    iterations of a training loop count (one that backpropagates or steps an optimizer,
    or an epoch loop around one): a loop over blocks, time steps or sampler steps inside
    one forward pass builds that pass's graph, and an entry overwritten under the same
    key does not grow. A helper that keeps what the step hands it (`meter.update(loss)`
    whose method appends or sums its argument on `self`), in this file or another, is
    reported at the call. A value backpropagated in the step has a graph whatever made
    it, and so does a dict whose `["loss"]` entry is; a helper keeps its argument's
    history through copies, views, reductions and Horovod's `allreduce`.

    ## Why is this bad?
    The accumulator keeps a reference to every batch's graph. After `backward()` the
    saved buffers are freed, but the chain of autograd nodes still grows by one graph
    per step; without a backward (evaluation without `no_grad`) every activation stays
    alive. Memory grows every batch until the process is killed or CUDA runs out, hours
    into the run.

    ## Example
    ```python
    total_loss = 0
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        total_loss += loss
    ```

    ## Use instead
    ```python
    total_loss = 0.0
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        total_loss += loss.item()
    ```

    ## Fix safety
    Adding `.detach()` is unsafe: if the accumulated value is later backpropagated on
    purpose (one backward over several micro-batches), detaching it changes training.
    Accumulators that reach a `backward()` in the same function are not reported.

    ## References
    - [PyTorch FAQ: don't accumulate history across your training loop](https://pytorch.org/docs/stable/notes/faq.html)
    """

    code = "TL302"
    name = "graph-accumulation"
    message = "a tensor with autograd history is accumulated across iterations: every batch's graph stays alive; accumulate `.detach()` (or `.item()` outside the hot loop)"
    triggers = ("+=", "append", "extend", "] =", "]=", " + ")
    fix_safety = "unsafe"
    confirm_with = "assert_memory_stable"
    test_files = False  # tests keep a few losses of a toy model on purpose, to compare runs
    valid = [
        """
import torch
model = torch.nn.Linear(4, 1)
total = 0.0
for x, y in loader:
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    total += loss.item()
""",
        # detached before keeping
        """
import torch
model = torch.nn.Linear(4, 1)
losses = []
for x, y in loader:
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    losses.append(loss.detach())
""",
        # accumulating on purpose: one backward over all micro-batches
        """
import torch
model = torch.nn.Linear(4, 1)
total = 0
for chunk in chunks:
    total = total + model(chunk).pow(2).mean()
total.backward()
""",
        # under no_grad there is no graph to keep
        """
import torch
model = torch.nn.Linear(4, 1)
outs = []
with torch.no_grad():
    for x in loader:
        outs.append(model(x))
""",
        # per-iteration container
        """
import torch
model = torch.nn.Linear(4, 1)
for x in loader:
    parts = []
    parts.append(model(x))
    torch.cat(parts).sum().backward()
""",
        # an RNN unrolled in forward: the list is the output's graph
        """
import torch
class Unrolled(torch.nn.Module):
    def forward(self, x):
        outs = []
        h = None
        for t in range(x.shape[0]):
            h = self.cell(x[t], h)
            outs.append(h)
        return torch.stack(outs)
""",
        # a U-Net encoder keeping each stage's output for the skip connections:
        # the list lives for one forward call
        """
import torch
class Encoder(torch.nn.Module):
    def forward(self, x):
        skips = []
        for stage in self.stages:
            x = stage(x)
            skips.append(x)
        return x, skips
""",
        # no torch
        """
total = 0
for x in items:
    total += score(x)
""",
        # a sampler integrating over denoising steps: not a training loop
        """
import torch

def sample(model, x, timesteps):
    for t, t_next in zip(timesteps[:-1], timesteps[1:]):
        x = x + (t_next - t) * model(x, t)
    return x
""",
        # one dict entry replaced every step: the dict does not grow
        """
import torch
import torch.nn.functional as F
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
latest = {}
for x, y in loader:
    loss = F.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    latest["loss"] = loss
""",
        # a test comparing the losses of two short runs of a toy model
        Valid(
            """
import torch
def run(model, opt, x, y, steps=5):
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss)
    return losses
""",
            path="tests/test_parity.py",
        ),
    ]
    invalid = [
        # the dict's "loss" entry is backpropagated: keeping the dict keeps its graph
        Invalid(
            """
import torch
outputs = []
for batch in loader:
    out = task.training_step(batch)
    out["loss"].backward()
    opt.step()
    outputs.append(out)
""",
            line=7,
        ),
        Invalid(
            """
import torch
model = torch.nn.Linear(4, 1)
total_loss = 0
for x, y in loader:
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    total_loss += loss
""",
            line=7,
            fixed="""
import torch
model = torch.nn.Linear(4, 1)
total_loss = 0
for x, y in loader:
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    total_loss += loss.detach()
""",
        ),
        Invalid(
            """
from torch import nn
import torch.nn.functional as F

class Trainer:
    def __init__(self):
        self.model = nn.Linear(8, 2)
        self.history = []

    def fit(self, loader):
        for x, y in loader:
            out = self.model(x)
            loss = F.cross_entropy(out, y)
            loss.backward()
            self.history.append(loss)
""",
            line=14,
            fixed="""
from torch import nn
import torch.nn.functional as F

class Trainer:
    def __init__(self):
        self.model = nn.Linear(8, 2)
        self.history = []

    def fit(self, loader):
        for x, y in loader:
            out = self.model(x)
            loss = F.cross_entropy(out, y)
            loss.backward()
            self.history.append(loss.detach())
""",
        ),
        Invalid(
            """
import torch
net = torch.nn.Linear(4, 4)
outputs = {}
for i, x in enumerate(loader):
    out = net(x)
    out.sum().backward()
    outputs[i] = out + 1
""",
            line=7,
            fixed="""
import torch
net = torch.nn.Linear(4, 4)
outputs = {}
for i, x in enumerate(loader):
    out = net(x)
    out.sum().backward()
    outputs[i] = (out + 1).detach()
""",
        ),
        # the per-epoch total (epoch loop) and the running sum (step loop) both keep graphs
        Invalid(
            """
import torch
import torch.nn.functional as F
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
epoch_losses = []
for epoch in range(10):
    running = 0
    for x, y in loader:
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        running = running + loss
    epoch_losses.append(running)
""",
            lines=(13, 14),
            fixed="""
import torch
import torch.nn.functional as F
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
epoch_losses = []
for epoch in range(10):
    running = 0
    for x, y in loader:
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        running = running + loss.detach()
    epoch_losses.append(running.detach())
""",
        ),
        # a key that changes every step: one entry per batch
        Invalid(
            """
import torch
import torch.nn.functional as F
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
by_step = {}
step = 0
for x, y in loader:
    loss = F.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    by_step[step] = loss
    step += 1
""",
            line=12,
            fixed="""
import torch
import torch.nn.functional as F
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
by_step = {}
step = 0
for x, y in loader:
    loss = F.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    by_step[step] = loss.detach()
    step += 1
""",
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        if not model.steps.step_loops:
            return  # every accumulation it reports is in a step loop or a step function
        for stmt, target, value, anchor in accumulations_across_steps(model):
            # backpropagated in the step (itself or its `["loss"]`): it has a graph
            v = model.flow.value(value)
            if (
                not grad_enabled_at(model, stmt)[0]
                or not carries_graph(model, value, target)
                or defined_without_grad(model, value)
            ):
                continue
            name = dotted(target)
            if name is not None and backpropagated_later(model, name, stmt):
                continue
            fixable = anchor is stmt and v.taint is Taint.GRAD  # a dict has no `.detach()`
            yield self.report(anchor, fix=self._fix(model, value) if fixable else None)
        for call, arg, kept_in, callee in kept_by_calls(model):
            # a helper (this file's or another's) keeps what the step hands it
            if (
                model.steps.per_step(call) is None
                or not grad_enabled_at(model, call)[0]
                or model.flow.value(arg).taint is not Taint.GRAD
                or defined_without_grad(model, arg)
                or backpropagated_later(model, kept_in, call)
            ):
                continue
            what = model.source.segment(arg)
            yield self.report(
                call,
                f"`{callee.rsplit('.', 1)[-1]}()` keeps `{what}`, with its "
                f"autograd history, in `{kept_in}` on every step: every batch's "
                f"graph stays alive; pass `{what}.detach()` (or `.item()`)",
            )

    def _fix(self, model: FileModel, value: ast.AST):  # type: ignore[no-untyped-def]
        from trainlint.edits import replace_node

        text = model.source.segment(value)
        if "\n" in text or "#" in text:
            return None
        simple = isinstance(value, (ast.Name, ast.Attribute, ast.Call, ast.Subscript))
        new = f"{text}.detach()" if simple else f"({text}).detach()"
        return self.fix(replace_node(model, value, new), message="add `.detach()`")
