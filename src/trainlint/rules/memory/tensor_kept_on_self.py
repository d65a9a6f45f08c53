"""TL304 tensor-kept-on-self."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from trainlint.analysis.accumulation import value_names
from trainlint.analysis.flow import Taint, grad_enabled_at
from trainlint.analysis.model import FileModel, dotted, walk_local
from trainlint.analysis.roles import Role
from trainlint.analysis.steps import Kind, backpropagated, backward_calls, backward_value
from trainlint.analysis.submodules import (
    builds_on_forward_graph,
    dead_store,
    eval_only,
    forward_stores,
    read_elsewhere,
)
from trainlint.rules.base import Invalid, Report, Rule

#: Values unpacked next to the loss for logging (`loss, loss_items = model(batch)`,
#: `loss, log_vars = parse_losses(out)`): by convention they are detached already.
_LOG_VALUES = re.compile(r"(^|_)(items|log_vars|logs|log_dict|scalars|metrics|stats)$")


def _only_logging_values(model: FileModel, value: ast.expr) -> bool:
    """Does every grad-carrying name in ``value`` read a logging value (see _LOG_VALUES)?
    Names bound by a comprehension inside ``value`` come from its iterables, also read."""
    bound = {
        n.id
        for comp in ast.walk(value)
        if isinstance(comp, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp))
        for gen in comp.generators
        for n in ast.walk(gen.target)
        if isinstance(n, ast.Name)
    }
    grad_names: list[str] = []
    stack: list[ast.AST] = [value]
    while stack:
        sub = stack.pop()
        if isinstance(sub, (ast.Name, ast.Attribute)) and (name := dotted(sub)) is not None:
            if name.split(".", 1)[0] not in bound and (model.flow.value(sub).taint is Taint.GRAD):
                grad_names.append(name)
            continue
        stack.extend(ast.iter_child_nodes(sub))
    return bool(grad_names) and all(_LOG_VALUES.search(n.rsplit(".", 1)[-1]) for n in grad_names)


class TensorKeptOnSelf(Rule):
    """## What it does
    Flags storing a tensor that carries autograd history on an object that outlives the
    training step (`self.last_output = out`, `model.cache = logits`, a module-level
    object) without `.detach()`, inside a training step. When a helper called from the
    step stores it, the finding is at that call and names the attribute. Logging values
    unpacked next to the loss (`loss, loss_items = model(batch)`, `log_vars`) are
    detached by convention and not reported. A module's `forward` (or a method it calls)
    that stores what the pass computes from its inputs or its own weights on `self`
    (`self.last_attn = attn`, an in-place copy into a buffer) is reported too, unless the
    store is detached, under `torch.no_grad()`, on an eval-only path, read again by the
    same method (a cache, state carried to the next call), a loss term handed to the
    step, or dead (an attribute nothing in the file reads and `__init__` does not
    declare).

    ## Why is this bad?
    The attribute keeps the batch's output, and through its `grad_fn` the whole graph
    of that batch, alive until the next overwrite, often longer (a callback copies it,
    a list on the object grows). Peak memory carries one extra batch of activations and
    leaks turn into OOMs that only show up on long runs.

    ## Example
    ```python
    def training_step(self, batch):
        out = self.model(batch.x)
        self.last_output = out
        loss = self.criterion(out, batch.y)
        ...
    ```

    ## Use instead
    ```python
    def training_step(self, batch):
        out = self.model(batch.x)
        self.last_output = out.detach()
        loss = self.criterion(out, batch.y)
        ...
    ```

    ## References
    - [PyTorch FAQ: my model reports "cuda runtime error(2): out of memory"](https://pytorch.org/docs/stable/notes/faq.html)
    """

    code = "TL304"
    name = "tensor-kept-on-self"
    message = "a tensor with autograd history is kept on an object that outlives the training step: the batch's graph stays alive until it is overwritten; store `.detach()`"
    triggers = ("self.", "backward")
    confirm_with = "assert_memory_stable"
    valid = [
        """
import torch
class Trainer:
    def train_step(self, x, y):
        out = self.model(x)
        self.last_output = out.detach()
        loss = self.crit(out, y)
        loss.backward()
        self.opt.step()
        self.last_loss = loss.item()
""",
        # the stored loss is the one backpropagated this step (buffers are freed)
        """
import torch
class GAN:
    def optimize(self):
        self.fake = self.netG(self.real)
        self.loss_G = self.crit(self.netD(self.fake), self.ones)
        self.loss_G.backward()
        self.opt_G.step()
""",
        # a value cached to be read again in the same forward pass
        """
import torch
class Net(torch.nn.Module):
    def forward(self, x):
        self.features = self.body(x)
        return self.head(self.features)
""",
        # the logging values returned next to the loss are detached by convention
        """
import torch
class Trainer:
    def __init__(self, model, opt):
        self.model, self.opt = model, opt
        self.mean_items = None

    def train_step(self, i, batch):
        loss, loss_items = self.model(batch)
        self.mean_items = (
            loss_items if self.mean_items is None
            else {k: (self.mean_items[k] * i + v) / (i + 1) for k, v in loss_items.items()}
        )
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
""",
        # a module's forward keeping what it computes, detached or in eval mode only
        """
import torch
class Block(torch.nn.Module):
    def forward(self, x):
        attn = torch.softmax(self.proj(x), dim=-1)
        self.last_attn = attn.detach()
        if not self.training:
            self.eval_attn = attn
        return attn * x
""",
        # no torch
        """
class Acc:
    def step(self, x):
        self.last = compute(x)
        x.backward()
        self.opt.step()
""",
    ]
    invalid = [
        # a module's forward keeps what it computes from its input
        Invalid(
            """
import torch
class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.last_attn = None

    def forward(self, x):
        attn = torch.softmax(self.proj(x), dim=-1)
        self.last_attn = attn
        return attn * x
""",
            line=10,
        ),
        Invalid(
            """
import torch
class Trainer:
    def __init__(self):
        self.model = torch.nn.Linear(4, 2)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def train_step(self, x, y):
        out = self.model(x)
        self.last_output = out
        loss = torch.nn.functional.cross_entropy(out, y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
""",
            line=9,
        ),
        Invalid(
            """
from torch import nn, optim
model = nn.Linear(4, 1)
opt = optim.Adam(model.parameters())
for x, y in loader:
    pred = model(x)
    loss = nn.functional.mse_loss(pred, y)
    model.last_pred = pred
    opt.zero_grad()
    loss.backward()
    opt.step()
""",
            line=7,
        ),
        # the logits returned next to the loss do carry the graph
        Invalid(
            """
import torch
class Trainer:
    def __init__(self, model, opt):
        self.model, self.opt = model, opt

    def train_step(self, batch):
        loss, logits = self.model(batch)
        self.last_logits = logits
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
""",
            line=8,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        if not model.imports_module("torch"):
            return
        reported = set()
        for stmt in self._kept_by_forward(model):
            reported.add(id(stmt))
            name = dotted(stmt.targets[0]) or model.source.segment(stmt.targets[0])
            yield self.report(
                stmt,
                f"`{name}` keeps what this forward pass computes, with its autograd "
                f"history, on the module: each batch's graph stays alive until the next "
                f"forward overwrites it; store `.detach()` (or write under `torch.no_grad()`)",
            )
        if not model.steps.trains:
            return  # (no training step here: nothing can be kept past one)
        for node in model.assignments:
            if id(node) in reported:
                continue
            if not isinstance(node, ast.Assign) or len(node.targets) != 1:
                continue
            target = node.targets[0]
            if not isinstance(target, ast.Attribute) or not self._long_lived(model, target):
                continue
            anchor = self._in_training_step(model, node)
            if anchor is None:
                continue
            if model.flow.value(node.value).taint is not Taint.GRAD and not backpropagated(
                model, node.value
            ):
                continue
            if _only_logging_values(model, node.value):
                continue
            if self._reaches_backward(model, node, target):
                continue
            yield self._report_at(model, node, target, anchor)

    @staticmethod
    def _kept_by_forward(model: FileModel) -> Iterator[ast.Assign]:
        """Stores on ``self`` during a module's forward of what that pass computes."""
        for stmt, forward in forward_stores(model):
            target = stmt.targets[0]
            root = target
            while isinstance(root, ast.Subscript):
                root = root.value  # `self.sv[i][:] = s` writes into the buffer `self.sv`
            name = dotted(root)
            if (
                name is None
                or "loss" in name.rsplit(".", 1)[-1].lower()  # a term the step backpropagates
                or not grad_enabled_at(model, stmt)[0]
                or eval_only(model, stmt)
                or read_elsewhere(model, stmt, name, forward)
                or dead_store(model, stmt)  # its cost cannot be told from intent
                or not builds_on_forward_graph(model, stmt.value, forward)
                or _only_logging_values(model, stmt.value)
            ):
                continue
            yield stmt

    def _report_at(
        self, model: FileModel, stmt: ast.Assign, target: ast.Attribute, anchor: ast.AST
    ) -> Report:
        name = dotted(target) or model.source.segment(target)
        if anchor is stmt:
            return self.report(
                stmt,
                (
                    f"`{name}` keeps a tensor with autograd history past the training step: this "
                    f"batch's graph stays alive until the attribute is overwritten; store `.detach()`"
                ),
            )
        fn = model.function_of(stmt)
        where = f" (in `{fn.name}`)" if fn is not None else ""
        return self.report(
            anchor,
            (
                f"this call stores a tensor with autograd history on `{name}`{where}, which "
                f"outlives the training step: the batch's graph stays alive until it is "
                f"overwritten; store `.detach()` there"
            ),
            related=((stmt, f"stored on `{name}` here"),),
        )

    @staticmethod
    def _long_lived(model: FileModel, target: ast.Attribute) -> bool:
        root = target
        while isinstance(root, ast.Attribute):
            root = root.value  # type: ignore[assignment]
        if not isinstance(root, ast.Name):
            return False
        if root.id == "self":
            return True
        fn = model.function_of(target)
        if fn is None:
            return True  # attribute of a module-level object
        if model.roles.role(root) is Role.MODEL:
            return True
        found = model.flow.definition(root.id, target)
        return found is None and root.id not in {a.arg for a in fn.args.args}

    @staticmethod
    def _in_training_step(model: FileModel, stmt: ast.stmt) -> ast.AST | None:
        """Where to report when ``stmt`` runs inside a training step (SPEC 7), else None."""
        steps = model.steps
        found = steps.per_step(stmt, limits=lambda g: False)
        if found is not None:
            return found[1]
        fn = model.function_of(stmt)
        if (
            fn is not None
            and steps.has_own_step(fn)
            and any(
                isinstance(c, ast.Call)
                and (ev := steps.classify(c)) is not None
                and ev.kind is Kind.BACKWARD
                for c in walk_local(fn)
            )
        ):
            return stmt
        return None

    @staticmethod
    def _reaches_backward(model: FileModel, stmt: ast.stmt, target: ast.Attribute) -> bool:
        name = dotted(target)
        fn = model.function_of(stmt)
        for call in backward_calls(model):
            if model.function_of(call) is not fn or (call.lineno, call.col_offset) < (
                stmt.lineno,
                stmt.col_offset,
            ):
                continue
            value = backward_value(model, call)
            if value is None:
                continue
            names = value_names(value)[0]
            frontier = list(names)
            seen: set[str] = set()
            while frontier:
                n = frontier.pop()
                if n in seen or len(seen) > 40:
                    continue
                seen.add(n)
                if n == name:
                    return True
                if "." in n and not n.startswith("self."):
                    continue
                # every definition that may reach the backward: branches often build the
                # loss differently (a dict's "total" on one, a sum of parts on the other)
                for _, assigned in model.flow.definitions_before(n, call):
                    if isinstance(assigned, ast.expr):
                        frontier.extend(value_names(assigned)[0])
        return False
