"""TL301 retain-graph-in-loop."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.accumulation import value_names
from trainlint.analysis.model import FileModel, dotted, is_true, keyword, walk_local
from trainlint.analysis.steps import backward_value, graph_uses
from trainlint.rules.base import Invalid, Report, Rule


def _bound_names(region: ast.AST) -> set[str]:
    """Names (and dotted attribute targets) assigned anywhere inside ``region``."""

    out: set[str] = set()
    for node in walk_local(region):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.NamedExpr, ast.For, ast.AsyncFor)):
            targets = [node.target]
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            targets = [i.optional_vars for i in node.items if i.optional_vars is not None]
        for t in targets:
            for sub in ast.walk(t):
                if isinstance(sub, (ast.Name, ast.Attribute)):
                    name = dotted(sub)
                    if name:
                        out.add(name)
    return out


def _inside(model: FileModel, node: ast.AST, region: ast.AST) -> bool:
    return any(anc is region for anc in model.ancestors(node))


def _after(a: ast.AST, b: ast.AST) -> bool:
    return (getattr(a, "lineno", 0), getattr(a, "col_offset", 0)) > (
        getattr(b, "lineno", 0),
        getattr(b, "col_offset", 0),
    )


class RetainGraphInLoop(Rule):
    """## What it does
    Flags `backward(retain_graph=True)` and `torch.autograd.grad(..., retain_graph=True)`
    in a training loop when the graph is built inside the loop iteration and no later
    backward in the same iteration uses it.

    ## Why is this bad?
    `retain_graph=True` tells autograd to keep every buffer the graph saved for
    backward. In a loop nothing needs them again, so each batch's activations stay
    alive until the loss name is rebound, doubling peak memory, and any reference to
    the loss kept elsewhere (a list of losses, a logged tensor) keeps every batch's
    graph for good: memory grows every step until CUDA runs out.

    The argument is only needed when a second backward pass traverses the same graph
    (two losses sharing an encoder, gradient penalties), or when the graph is built
    once outside the loop and differentiated repeatedly (a Jacobian row by row); both
    stay silent.

    ## Example
    ```python
    for x, y in loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward(retain_graph=True)
        optimizer.step()
    ```

    ## Use instead
    ```python
    for x, y in loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    ```

    ## Fix safety
    Removing the argument is unsafe: if something outside the loop body does reuse
    the graph, the second backward raises "Trying to backward through the graph a
    second time".

    ## References
    - [torch.Tensor.backward](https://pytorch.org/docs/stable/generated/torch.Tensor.backward.html)
    - [PyTorch FAQ: my model reports "cuda runtime error(2): out of memory"](https://pytorch.org/docs/stable/notes/faq.html)
    """

    code = "TL301"
    name = "retain-graph-in-loop"
    message = (
        "`retain_graph=True` keeps this batch's saved activations after `backward()` (until the "
        "loss is dropped: peak memory doubles, and a kept loss keeps them for good), and no "
        "later backward in this step uses them; remove it"
    )
    triggers = ("retain_graph",)
    fix_safety = "unsafe"
    confirm_with = "assert_memory_stable"
    valid = [
        # Two losses share one graph: the first backward must retain it.
        """
import torch
for x, y in loader:
    opt.zero_grad()
    feats = encoder(x)
    loss_a = head_a(feats).mean()
    loss_b = head_b(feats).mean()
    loss_a.backward(retain_graph=True)
    loss_b.backward()
    opt.step()
""",
        # Graph built once outside the loop, differentiated row by row.
        """
import torch
y = f(x)
rows = []
for i in range(y.shape[0]):
    (g,) = torch.autograd.grad(y[i], x, retain_graph=True)
    rows.append(g)
""",
        # Not in a loop at all.
        """
import torch
loss = model(x).sum()
loss.backward(retain_graph=True)
""",
        # The flag is computed, not a literal True.
        """
import torch
for i, x in enumerate(batches):
    loss = model(x).sum()
    loss.backward(retain_graph=i < len(batches) - 1)
""",
        # Gradient penalty: autograd.grad with create_graph, then a later backward.
        """
import torch
from torch import autograd
for real in loader:
    real.requires_grad_(True)
    out = critic(real)
    (grad,) = autograd.grad(out.sum(), real, create_graph=True, retain_graph=True)
    penalty = ((grad.norm(2, dim=1) - 1) ** 2).mean()
    (out.mean() + penalty).backward()
    opt.step()
""",
        # A file that never imports torch: its own `backward` API.
        """
for job in queue:
    job.backward(retain_graph=False)
""",
    ]
    invalid = [
        Invalid(
            """
import torch
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward(retain_graph=True)
    optimizer.step()
""",
            line=5,
            column=5,
            fixed="""
import torch
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
""",
        ),
        # Aliased autograd, in a helper called from the loop.
        Invalid(
            """
import torch.autograd as ag

def step(batch):
    out = net(batch)
    grads = ag.grad(out.sum(), list(net.parameters()), retain_graph=True)
    apply(grads)

for epoch in range(10):
    for batch in loader:
        step(batch)
""",
            line=5,
            fixed="""
import torch.autograd as ag

def step(batch):
    out = net(batch)
    grads = ag.grad(out.sum(), list(net.parameters()))
    apply(grads)

for epoch in range(10):
    for batch in loader:
        step(batch)
""",
        ),
        # Scaler form, inside a trainer method.
        Invalid(
            """
import torch

class Trainer:
    def train_epoch(self, loader):
        for x, y in loader:
            with torch.autocast("cuda"):
                loss = self.criterion(self.model(x), y)
            self.scaler.scale(loss).backward(retain_graph = True)
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad()
""",
            line=8,
            fixed="""
import torch

class Trainer:
    def train_epoch(self, loader):
        for x, y in loader:
            with torch.autocast("cuda"):
                loss = self.criterion(self.model(x), y)
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad()
""",
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        uses = graph_uses(model)
        for call in uses:
            flag = keyword(call, "retain_graph")
            if not is_true(flag):
                continue
            contexts = model.loop_contexts(call)
            if not contexts:
                continue
            if any(self._reused_later(model, call, ctx, uses) for ctx in contexts):
                continue
            if not any(self._built_in_iteration(model, call, ctx) for ctx in contexts):
                continue
            yield self.report(call, fix=self._fix(model, call))

    @staticmethod
    def _reused_later(
        model: FileModel, call: ast.Call, ctx: list[ast.AST], uses: list[ast.Call]
    ) -> bool:
        """Does another graph use run after ``call`` in the same loop iteration?"""
        loop_at = next(i for i, n in enumerate(ctx) if not isinstance(n, ast.Call))
        chain = [call, *ctx[:loop_at]]  # the call, then the call sites up to the loop body
        for anchor in chain:
            region = ctx[loop_at] if anchor is chain[-1] else model.function_of(anchor)
            if region is None:
                continue
            for other in uses:
                if other is not call and _after(other, anchor) and _inside(model, other, region):
                    return True
            for site, target in model.callees(region):
                if _after(site, anchor) and any(
                    model.function_of(u) is target for u in uses if u is not call
                ):
                    return True
        return False

    @staticmethod
    def _built_in_iteration(model: FileModel, call: ast.Call, ctx: list[ast.AST]) -> bool:
        value = backward_value(model, call)
        if value is None:
            return True
        names, _ = value_names(value)
        if not names:
            return True
        loop = next(n for n in ctx if not isinstance(n, ast.Call))
        bound = _bound_names(loop)
        fn = model.function_of(call)
        if fn is not None and fn is not model.function_of(loop):
            bound |= _bound_names(fn)
        return bool(names & bound)

    def _fix(self, model: FileModel, call: ast.Call):  # type: ignore[no-untyped-def]
        from trainlint.edits import remove_keyword

        edit = remove_keyword(model, call, "retain_graph")
        return self.fix(edit, message="remove `retain_graph=True`") if edit else None
