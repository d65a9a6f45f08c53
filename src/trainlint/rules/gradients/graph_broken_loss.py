"""TL108 graph-broken-loss."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.flow import Taint
from trainlint.analysis.loss_terms import cut_terms_of_trained_graph
from trainlint.analysis.model import FileModel
from trainlint.analysis.paths import Reported
from trainlint.analysis.steps import backward_calls, backward_value
from trainlint.rules.base import Invalid, Report, Rule


class GraphBrokenLoss(Rule):
    """## What it does
    Flags the call that cuts the value reaching `backward()` off the autograd graph:
    `.detach()`, `.data`, `.item()`, `.numpy()`, `.tolist()`, `float(...)`, or a
    `torch.tensor(x, requires_grad=True)` re-wrap of a model output or loss. Each
    additive term counts on its own: a term cut whole (`at_loss(f_s, f_t).detach()`)
    is reported when it is made from the same forward pass (`f_s, logits = net(x)`)
    as a term that still reaches backward; a cut term of other origin may be a
    deliberate constant and stays silent.

    ## Why is this bad?
    Backward then starts from a tensor with no history back to the model: gradients
    never reach the parameters. With a re-wrap (`requires_grad=True`) or another term
    that still has a graph, nothing raises: training runs, the loss is logged, and the
    weights never move. A `.detach()` on a *target* (a DQN target network, a
    distillation teacher) while the trained output keeps its graph is correct and stays
    silent.

    ## Example
    ```python
    loss = criterion(model(x), y)
    loss = torch.tensor(loss.item(), requires_grad=True)
    loss.backward()
    ```

    ## Use instead
    ```python
    loss = criterion(model(x), y)
    loss.backward()
    ```

    ## References
    - [Autograd mechanics](https://pytorch.org/docs/stable/notes/autograd.html)
    """

    code = "TL108"
    name = "graph-broken-loss"
    message = "the value reaching `backward()` was cut from the graph here: no gradient reaches the model; backpropagate the tensor itself and log `.item()` separately"
    triggers = ("backward",)
    confirm_with = "assert_grads_nonzero"
    valid = [
        # the cut term comes from another call's outputs: a constant on purpose
        """
import torch.nn.functional as F
def step(student, tracker, x, y, optimizer):
    feats, logits = student(x)
    score, _ = tracker(x)
    loss = F.cross_entropy(logits, y) + score.detach()
    loss.backward()
    optimizer.step()
""",
        """
import torch
model = torch.nn.Linear(4, 1)
for x, y in loader:
    out = model(x)
    loss = torch.nn.functional.mse_loss(out, y)
    loss.backward()
    print(loss.item())
""",
        # DQN: the target is detached, the prediction keeps its graph
        """
import torch
policy = Net()
target_net = Net()
for s, a, r, s2 in replay:
    q = policy(s).gather(1, a)
    target = (r + 0.99 * target_net(s2).max(1)[0]).detach()
    loss = torch.nn.functional.smooth_l1_loss(q, target)
    loss.backward()
""",
        # unknown provenance: stay silent
        """
import torch
def step(loss):
    loss = loss.detach() + reg_term()
    loss.backward()
""",
        # no torch
        """
for job in jobs:
    v = job.value.detach()
    v.backward()
""",
    ]
    invalid = [
        # a term made from the student's own outputs, cut whole
        Invalid(
            """
import torch.nn.functional as F
def step(opt, student, teacher, x, y, optimizer):
    feats, logits = student(x)
    t_feats, _ = teacher(x)
    at = distance(feats, t_feats).detach() * opt.beta
    loss = F.cross_entropy(logits, y) + at
    loss.backward()
    optimizer.step()
""",
            line=5,
        ),
        Invalid(
            """
import torch
model = torch.nn.Linear(4, 1)
for x, y in loader:
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss = torch.tensor(loss.item(), requires_grad=True)
    loss.backward()
""",
            line=5,
        ),
        Invalid(
            """
from torch import nn
import torch.nn.functional as F

class Net(nn.Module):
    pass

net = Net()
for x, y in loader:
    logits = net(x).detach()
    loss = F.cross_entropy(logits, y)
    loss.backward()
""",
            line=9,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        if not model.imports_module("torch"):
            return
        flow = model.flow
        seen = Reported()
        # `t.detach().item()` is two cuts that start at one place: one report
        places: set[tuple[int, int]] = set()
        for call in backward_calls(model):
            value = backward_value(model, call)
            if value is None:
                continue
            # Each additive term on its own: a term whose every graph source was cut
            # contributes no gradient, even when another term still has a graph.
            for term in flow.terms(value):
                v = flow.value(term)
                if v.taint is Taint.CUT and v.cuts:
                    node = v.cuts[0]
                    if seen.first(node) and _first_at(places, node):
                        yield self.report(node)
            # a term cut where the flow cannot tell it had a graph, but made from the
            # same forward pass as a term that still trains
            for node in cut_terms_of_trained_graph(model, value):
                if seen.first(node) and _first_at(places, node):
                    yield self.report(node)


def _first_at(places: set[tuple[int, int]], node: ast.AST) -> bool:
    place = (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))
    if place in places:
        return False
    places.add(place)
    return True
