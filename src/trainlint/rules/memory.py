"""TL3: memory. Graphs kept alive across training steps."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from trainlint.analysis.flow import Taint, grad_enabled_at
from trainlint.analysis.model import (
    FileModel,
    call_name,
    dotted,
    is_false,
    is_true,
    keyword,
    walk_local,
)
from trainlint.analysis.roles import Role
from trainlint.analysis.steps import Kind, backward_calls, backward_value, graph_uses
from trainlint.rules._paths import Reported
from trainlint.rules.base import Invalid, Report, Rule

_BINDING_NODES = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.NamedExpr)


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


def _value_names(expr: ast.AST) -> tuple[set[str], bool]:
    """Dotted names read by an expression, and whether it calls anything."""

    names: set[str] = set()
    has_call = False
    stack = [expr]
    while stack:
        sub = stack.pop()
        if isinstance(sub, ast.Call):
            has_call = True
        if isinstance(sub, (ast.Name, ast.Attribute)):
            name = dotted(sub)
            if name:
                parts = name.split(".")
                names.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
                continue
        if isinstance(sub, ast.Subscript):
            stack.append(sub.value)  # `y[i]` reads y's graph; the index carries none
            continue
        stack.extend(ast.iter_child_nodes(sub))
    return names, has_call


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
    message = "`retain_graph=True` keeps every batch's graph alive; nothing later in this step reuses it"
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
        names, _ = _value_names(value)
        if not names:
            return True
        loop = next(n for n in ctx if not isinstance(n, ast.Call))
        bound = _bound_names(loop)
        fn = model.function_of(call)
        if fn is not None and fn is not model.function_of(loop):
            bound |= _bound_names(fn)
        return bool(names & bound)

    def _fix(self, model: FileModel, call: ast.Call):  # type: ignore[no-untyped-def]
        from trainlint.fix import remove_keyword

        edit = remove_keyword(model, call, "retain_graph")
        return self.fix(edit, message="remove `retain_graph=True`") if edit else None


def _inside(model: FileModel, node: ast.AST, region: ast.AST) -> bool:
    return any(anc is region for anc in model.ancestors(node))


def _after(a: ast.AST, b: ast.AST) -> bool:
    return (getattr(a, "lineno", 0), getattr(a, "col_offset", 0)) > (
        getattr(b, "lineno", 0),
        getattr(b, "col_offset", 0),
    )


def _container_root(node: ast.AST) -> ast.AST | None:
    """``totals["a"]`` -> ``totals``; ``self.metrics["x"]`` -> ``self.metrics``."""
    while isinstance(node, ast.Subscript):
        node = node.value
    return node if isinstance(node, (ast.Name, ast.Attribute)) else None


def _persists_across(model: FileModel, target: ast.AST, loop: ast.AST) -> bool:
    """Does the accumulator outlive one iteration of ``loop``: defined before it, an
    attribute (``self.x``, ``trainer.x``) or a module global?"""
    name = dotted(target)
    if name is None:
        return False
    if "." in name:
        return True
    fn = model.function_of(target)
    if fn is None:
        return True  # module-level name
    found = model.flow.definition(name, target)
    if found is None:
        return True  # a parameter or a global: lives outside the loop
    stmt, _ = found
    return not any(anc is loop for anc in model.ancestors(stmt)) and stmt is not loop


def _backpropagated_later(model: FileModel, name: str, after: ast.AST) -> bool:
    """``total.backward()`` after the loop: accumulating the graph was the point."""
    fn = model.function_of(after) or model.tree
    for call in backward_calls(model):
        if model.function_of(call) is not (fn if fn is not model.tree else None):
            continue
        value = backward_value(model, call)
        if value is not None and name in _value_names(value)[0]:
            return True
    return False


class GraphAccumulation(Rule):
    """## What it does
    Flags a tensor that carries autograd history (a loss, a model output, anything
    computed from them) accumulated across loop iterations without `.item()` or
    `.detach()`: `total += loss`, `losses.append(loss)`, `history[k] = out`.

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
    message = "a tensor with autograd history is accumulated across iterations: every batch's graph stays alive"
    triggers = ("+=", "append", "extend", "] =", "]=", " + ")
    fix_safety = "unsafe"
    confirm_with = "assert_memory_stable"
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
        # no torch
        """
total = 0
for x in items:
    total += score(x)
""",
    ]
    invalid = [
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
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        self._loop_cache: dict[int, dict[int, bool]] = {}
        for stmt, target, value in self._accumulations(model):
            fn = model.function_of(stmt)
            if fn is not None and fn.name in ("forward", "__call__", "_forward"):
                continue  # unrolling time steps inside forward builds the graph on purpose
            loops = model.enclosing_loops(stmt)
            # a loop over FX nodes or profiler events is not a batch loop: some enclosing
            # loop must run a model, and the accumulator must outlive its iterations --
            # or the statement is in a step function (its body is one iteration) and the
            # accumulator comes from outside it (a parameter, an attribute, a global)
            anchor: ast.AST = stmt
            if not any(_persists_across(model, target, lp) and self._runs_a_model(model, lp)
                       for lp in loops):
                step_anchor = self._in_step_function(model, stmt, target)
                if step_anchor is None:
                    continue
                anchor = step_anchor
            if not grad_enabled_at(model, stmt)[0]:
                continue
            v = model.flow.value(value)
            if v.taint is not Taint.GRAD:
                continue
            if self._defined_without_grad(model, value):
                continue
            name = dotted(target)
            if name is not None and _backpropagated_later(model, name, stmt):
                continue
            yield self.report(anchor, fix=self._fix(model, value) if anchor is stmt else None)

    @staticmethod
    def _in_step_function(model: FileModel, stmt: ast.stmt, target: ast.AST) -> ast.AST | None:
        """Where to report when ``stmt`` runs once per training step (a step function, or
        a helper the step loop calls) and accumulates into something from outside that
        function (an attribute, a global, a parameter); else None."""
        fn = model.function_of(stmt)
        if fn is None or model.enclosing_loops(stmt):
            return None
        found_step = model.steps.per_step(stmt, limits=lambda g: False)
        name = dotted(target)
        if found_step is None or name is None:
            return None
        if "." not in name:
            found = model.flow.definition(name, stmt)
            if found is not None and found[0] is not fn:
                return None  # a list made inside the function: gone after the call
        return found_step[1]

    def _runs_a_model(self, model: FileModel, loop: ast.AST) -> bool:
        cache = self._loop_cache.setdefault(id(model), {})
        if id(loop) not in cache:
            cache[id(loop)] = id(loop) in model.steps.step_loop_ids or any(
                isinstance(sub, ast.Call) and model.flow._is_model_call(sub.func)
                for sub in walk_local(loop)
            )
        return cache[id(loop)]

    @staticmethod
    def _accumulations(model: FileModel) -> Iterator[tuple[ast.stmt, ast.AST, ast.AST]]:
        """(statement, accumulator, accumulated value) for += / x = x + v / append / [k] =."""
        for node in model.assignments:
            if isinstance(node, ast.AugAssign) and isinstance(node.op, (ast.Add, ast.Sub)):
                target = _container_root(node.target)
                if target is not None:
                    value = node.value
                    if isinstance(value, (ast.List, ast.Tuple)) and len(value.elts) == 1:
                        value = value.elts[0]  # losses += [loss]
                    yield node, target, value
            elif isinstance(node, ast.Assign) and len(node.targets) == 1:
                t = node.targets[0]
                v = node.value
                if isinstance(t, (ast.Name, ast.Attribute)) and isinstance(v, ast.BinOp) and (
                    isinstance(v.op, ast.Add) and dotted(v.left) == dotted(t) is not None
                ):
                    yield node, t, v.right
                elif isinstance(t, ast.Subscript) and isinstance(t.value, (ast.Name, ast.Attribute)):
                    yield node, t.value, v
        for name in ("append", "extend", "insert"):
            for call in model.calls.get(name, ()):
                func = call.func
                if not isinstance(func, ast.Attribute) or not call.args:
                    continue
                parent = model.parent_of(call)
                if not isinstance(parent, ast.Expr):
                    continue
                value = call.args[-1]
                if name == "extend" and isinstance(value, (ast.List, ast.Tuple)) and len(
                    value.elts
                ) == 1:
                    value = value.elts[0]
                root = _container_root(func.value)
                if root is not None:
                    yield parent, root, value

    @staticmethod
    def _defined_without_grad(model: FileModel, value: ast.AST) -> bool:
        name = dotted(value) if isinstance(value, (ast.Name, ast.Attribute)) else None
        if name is None:
            return False
        found = model.flow.definition(name, value)
        return found is not None and not grad_enabled_at(model, found[0])[0]

    def _fix(self, model: FileModel, value: ast.AST):  # type: ignore[no-untyped-def]
        from trainlint.fix import replace_node

        text = model.source.segment(value)
        if "\n" in text or "#" in text:
            return None
        simple = isinstance(value, (ast.Name, ast.Attribute, ast.Call, ast.Subscript))
        new = f"{text}.detach()" if simple else f"({text}).detach()"
        return self.fix(replace_node(model, value, new), message="add `.detach()`")


_EVAL_FUNC = re.compile(r"^(evaluate|validate|validation|eval|test|val)(_|$)|"
                        r"_(evaluate|validate|validation|eval|val|test)$|^(evaluate|validate)\w*",
                        re.IGNORECASE)


class EvalWithoutNoGrad(Rule):
    """## What it does
    Flags a model call in an evaluation loop (after `model.eval()`, or in a function
    named `evaluate`/`validate`/`test*`) that runs outside `torch.no_grad()` /
    `torch.inference_mode()`.

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

    ## References
    - [torch.no_grad](https://pytorch.org/docs/stable/generated/torch.no_grad.html)
    """

    code = "TL303"
    name = "eval-without-no-grad"
    message = "model called during evaluation without `torch.no_grad()`: activations are kept for a backward that never comes"
    triggers = ("eval", "valid", "test")
    confirm_with = "assert_memory_stable"
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
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        if not model.imports_module("torch"):
            return
        from trainlint.rules.throughput import is_test_file

        in_tests = is_test_file(model.path)
        seen = Reported()
        for call in self._model_calls(model):
            loops = model.enclosing_loops(call)
            if not loops:
                continue
            fn = model.function_of(call)
            if not (self._after_eval(model, call, fn) or (
                fn is not None and _EVAL_FUNC.search(fn.name) and not fn.name.endswith("_step")
                and not (in_tests and fn.name.startswith("test"))
            )):
                continue
            if not grad_enabled_at(model, call)[0]:
                continue
            if self._backprops(model, loops[-1]) or self._grad_disabled_earlier(model, call, fn):
                continue
            if fn is not None and self._callers_disable_grad(model, fn):
                continue
            if seen.first(call):
                yield self.report(call)

    @staticmethod
    def _model_calls(model: FileModel) -> Iterator[ast.Call]:
        """Calls of a model: by role, a name put in eval mode in the same function, or a
        model-like spelling (`model`, `net`) for parameters whose role is unknown."""
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
        candidates = [sub for scope in scopes.values() for sub in walk_local(scope)
                      if isinstance(sub, ast.Call)]
        for call in candidates:
            func = call.func
            name = dotted(func)
            if flow._is_model_call(func) or (
                name is not None and (id(model.function_of(call)), name) in evaluated
            ) or (isinstance(func, (ast.Name, ast.Attribute)) and model.qualname(func) is None
                  and model.steps._is_model(func)):
                yield call

    @staticmethod
    def _after_eval(model: FileModel, call: ast.Call, fn: ast.AST | None) -> bool:
        """`X.eval()` earlier in the same function, with no `X.train()` in between."""
        target = dotted(call.func)
        pos = (call.lineno, call.col_offset)
        last_eval = last_train = (-1, -1)
        for name in ("eval", "train"):
            for c in model.calls.get(name, ()):
                if model.function_of(c) is not fn or not isinstance(c.func, ast.Attribute):
                    continue
                recv = dotted(c.func.value)
                if recv is None or target is None or not (
                    target == recv or target.startswith(recv + ".") or recv.startswith(target + ".")
                ):
                    continue
                cpos = (c.lineno, c.col_offset)
                if cpos < pos:
                    if name == "eval":
                        last_eval = max(last_eval, cpos)
                    else:
                        last_train = max(last_train, cpos)
        return last_eval > last_train

    @staticmethod
    def _backprops(model: FileModel, loop: ast.AST) -> bool:
        for sub in walk_local(loop):
            if isinstance(sub, ast.Call) and (
                model.steps.classify(sub) is not None
                and model.steps.classify(sub).kind in (Kind.BACKWARD, Kind.STEP)  # type: ignore[union-attr]
                or call_name(sub) == "grad" and model.qualname(sub.func) == "torch.autograd.grad"
            ):
                return True
            if isinstance(sub, ast.Call):
                target = model.resolve_call(sub)
                if target is not None and model.steps._has_own_step(target):
                    return True
        return False

    @staticmethod
    def _grad_disabled_earlier(model: FileModel, call: ast.Call, fn: ast.AST | None) -> bool:
        for c in model.calls.get("set_grad_enabled", ()):
            if model.function_of(c) is fn and (c.lineno, c.col_offset) < (
                call.lineno, call.col_offset
            ) and isinstance(model.parent_of(c), ast.Expr) and c.args and is_false(c.args[0]):
                return True
        return False

    @staticmethod
    def _callers_disable_grad(model: FileModel, fn: ast.AST) -> bool:
        sites = model.call_sites.get(id(fn), [])
        return bool(sites) and all(not grad_enabled_at(model, s)[0] for s in sites)


class TensorKeptOnSelf(Rule):
    """## What it does
    Flags storing a tensor that carries autograd history on an object that outlives the
    training step (`self.last_output = out`, `model.cache = logits`, a module-level
    object) without `.detach()`, inside a training step.

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
    message = "a tensor with autograd history is stored on a long-lived object: the batch's graph stays alive"
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
        # not a training step: a forward hook caching features
        """
import torch
class Net(torch.nn.Module):
    def forward(self, x):
        self.features = self.body(x)
        return self.head(self.features)
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
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        if not model.imports_module("torch"):
            return
        for node in model.assignments:
            if not isinstance(node, ast.Assign) or len(node.targets) != 1:
                continue
            target = node.targets[0]
            if not isinstance(target, ast.Attribute) or not self._long_lived(model, target):
                continue
            anchor = self._in_training_step(model, node)
            if anchor is None:
                continue
            if model.flow.value(node.value).taint is not Taint.GRAD:
                continue
            if self._reaches_backward(model, node, target):
                continue
            yield self.report(anchor)

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
        if fn is not None and steps._has_own_step(fn) and any(
            isinstance(c, ast.Call) and (ev := steps.classify(c)) is not None
            and ev.kind is Kind.BACKWARD for c in walk_local(fn)
        ):
            return stmt
        return None

    @staticmethod
    def _reaches_backward(model: FileModel, stmt: ast.stmt, target: ast.Attribute) -> bool:
        name = dotted(target)
        fn = model.function_of(stmt)
        for call in backward_calls(model):
            if model.function_of(call) is not fn or (call.lineno, call.col_offset) < (
                stmt.lineno, stmt.col_offset
            ):
                continue
            value = backward_value(model, call)
            if value is None:
                continue
            names = _value_names(value)[0]
            frontier = list(names)
            seen: set[str] = set()
            while frontier:
                n = frontier.pop()
                if n in seen or len(seen) > 40:
                    continue
                seen.add(n)
                if n == name:
                    return True
                ref = ast.Name(id=n) if "." not in n else None
                found = model.flow.definition(n, call) if ref is not None or n.startswith("self.") else None
                if found is not None and isinstance(found[1], ast.expr):
                    frontier.extend(_value_names(found[1])[0])
        return False


class AllocatorCallInLoop(Rule):
    """## What it does
    Flags `torch.cuda.empty_cache()`, `torch.cuda.reset_peak_memory_stats()` and
    `gc.collect()` called on every step of a training loop (not under a rate-limiting
    `if`, not in an OOM `except` handler).

    ## Why is this bad?
    `empty_cache()` synchronises and returns cached blocks to the driver, so the next
    step has to `cudaMalloc` them again; `gc.collect()` walks every Python object. Both
    cost milliseconds per step and neither fixes a leak: memory held by live tensors
    (a kept graph, a growing list) is not freed by them. They hide the symptom while
    making every step slower.

    ## Example
    ```python
    for x, y in loader:
        ...
        optimizer.step()
        torch.cuda.empty_cache()
    ```

    ## Use instead
    ```python
    for step, (x, y) in enumerate(loader):
        ...
        optimizer.step()
    torch.cuda.empty_cache()  # once, between phases, if at all
    ```
    and fix the leak itself (see TL302, TL304).

    ## References
    - [CUDA memory management](https://pytorch.org/docs/stable/notes/cuda.html#memory-management)
    """

    code = "TL305"
    name = "allocator-call-in-loop"
    message = "allocator/GC call on every training step: costs time and does not fix leaks"
    severity = "warning"
    triggers = ("empty_cache", "reset_peak_memory_stats", "gc.collect", "collect(")
    confirm_with = "assert_step_time_stable"
    valid = [
        """
import torch
for epoch in range(10):
    for x in loader:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    torch.cuda.empty_cache()
""",
        """
import torch, gc
for step, x in enumerate(loader):
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
    if step % 1000 == 0:
        gc.collect()
""",
        # OOM recovery
        """
import torch
for x in loader:
    try:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
""",
        # no torch
        """
import gc
for item in queue:
    process(item)
    gc.collect()
""",
    ]
    invalid = [
        Invalid(
            """
import torch
for x, y in loader:
    opt.zero_grad()
    crit(model(x), y).backward()
    opt.step()
    torch.cuda.empty_cache()
""",
            line=6,
        ),
        Invalid(
            """
import gc as garbage
import torch

def cleanup():
    garbage.collect()

for epoch in range(3):
    for x in loader:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        cleanup()
""",
            line=12,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        if not model.imports_module("torch"):
            return
        calls = model.calls_to(
            "torch.cuda.empty_cache", "torch.cuda.reset_peak_memory_stats", "gc.collect",
            "torch.cuda.memory.empty_cache", "torch.mps.empty_cache", "torch.xpu.empty_cache",
        )
        seen = Reported()
        for call in calls:
            found = model.steps.per_step(call, limits=lambda g: True)
            if found is None:
                continue
            _, anchor = found
            if seen.first(anchor):
                yield self.report(anchor)


RULES = [RetainGraphInLoop, GraphAccumulation, EvalWithoutNoGrad, TensorKeptOnSelf,
         AllocatorCallInLoop]
