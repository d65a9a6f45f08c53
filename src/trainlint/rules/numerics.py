"""TL6: numerics and mixed precision. Loss scaling, autocast regions and softmax numerics."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from trainlint.analysis.model import FileModel, call_name, dotted, is_false, keyword, walk_local
from trainlint.analysis.roles import Binding, Role, name_role
from trainlint.analysis.steps import (
    Event,
    Kind,
    Path,
    StepLoop,
    backward_calls,
    backward_value,
    condition_literal,
)
from trainlint.rules._paths import Reported, precise_step_loops
from trainlint.rules.base import Invalid, Report, Rule

_SCALERS = {"torch.cuda.amp.GradScaler", "torch.amp.GradScaler", "torch.GradScaler",
            "torch.cpu.amp.GradScaler"}
_AUTOCAST_ENABLED_ARG = {
    # position of `enabled` among the positional arguments
    "torch.autocast": 2,
    "torch.amp.autocast": 2,
    "torch.cuda.amp.autocast": 0,
    "torch.cpu.amp.autocast": 0,
}
_SOFTMAX_FUNCS = {"torch.nn.functional.softmax", "torch.softmax", "torch.special.softmax"}
_SOFTMAX_MODULE = "torch.nn.Softmax"
_CE_FUNCS = {"torch.nn.functional.cross_entropy": "cross_entropy",
             "torch.nn.functional.nll_loss": "nll_loss"}
_CE_CLASSES = {"torch.nn.CrossEntropyLoss": "CrossEntropyLoss", "torch.nn.NLLLoss": "NLLLoss"}
# Methods that keep a tensor's values (reshaping, casting, selecting): probabilities stay
# probabilities through them, so a softmax output is still one after `.view(-1, C)`.
_SAME_VALUES = {"view", "reshape", "flatten", "squeeze", "unsqueeze", "permute", "transpose",
                "contiguous", "float", "double", "half", "bfloat16", "to", "type", "clone",
                "gather", "view_as", "reshape_as", "cuda", "cpu"}
_AMP_WORD = re.compile(r"(^|_)amp($|_)|fp16|bf16|float16|(^|_)half$|mixed|precision|scaler|"
                       r"autocast", re.IGNORECASE)
_NEGATED_WORD = re.compile(r"(^|_)(no|disable|disabled|without|skip)(_|$)|fp32|full",
                           re.IGNORECASE)


# -- grad scalers ---------------------------------------------------------------------------


def _disabled(call: ast.Call | None) -> bool:
    """``GradScaler(enabled=False)`` / ``autocast(enabled=False)``: a literal no-op."""
    return call is not None and is_false(keyword(call, "enabled"))


class _Scalers:
    """Which receivers are GradScalers, and which backwards were scaled by one; memoised per
    file because every path of every loop asks the same questions."""

    def __init__(self, model: FileModel) -> None:
        self.model = model
        self._scaled: dict[int, bool] = {}
        self._assigned: dict[tuple[object, ...], list[ast.AST]] | None = None

    def is_scaler(self, expr: ast.AST) -> bool:
        roles = self.model.roles
        binding = roles.lookup(expr)
        if binding is not None:
            return binding.role is Role.SCALER and not _disabled(binding.call)
        # No role binding: a `scaler` parameter, `GradScaler() if amp else None`, or
        # something built by a constructor we do not know (a custom loss scaler, a shadowed
        # `GradScaler`). Only the first two are GradScalers.
        key = roles.key(expr)
        if key is not None and any(isinstance(v, ast.Call) for v in self._values_of(key)):
            return False
        return name_role(expr) is Role.SCALER and self.model.imports_module("torch")

    def _values_of(self, key: tuple[object, ...]) -> list[ast.AST]:
        if self._assigned is None:
            assigned: dict[tuple[object, ...], list[ast.AST]] = {}
            roles = self.model.roles
            for node in self.model.assignments:
                if isinstance(node, ast.AugAssign) or node.value is None:
                    continue
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, (ast.Name, ast.Attribute)):
                        k = roles.key(t)
                        if k is not None:
                            assigned.setdefault(k, []).append(node.value)
            self._assigned = assigned
        return self._assigned.get(key, [])

    def scale_call(self, expr: ast.AST | None, depth: int = 0) -> ast.Call | None:
        """The ``scaler.scale(...)`` call a backward's tensor comes from, following names."""
        if expr is None or depth > 4:
            return None
        if isinstance(expr, ast.Call):
            func = expr.func
            if call_name(expr) == "scale" and isinstance(func, ast.Attribute) and (
                self.is_scaler(func.value)
            ):
                return expr
            return None
        if isinstance(expr, ast.BinOp):  # `(scaler.scale(loss) / accum).backward()`
            return self.scale_call(expr.left, depth + 1) or self.scale_call(expr.right, depth + 1)
        if isinstance(expr, ast.Name):
            found = self.model.flow.definition(expr.id, expr)
            if found is not None and isinstance(found[1], ast.expr):
                return self.scale_call(found[1], depth + 1)
        return None

    def scaled(self, event: Event) -> bool:
        """Is this backward ``scaler.scale(loss).backward()`` (or a name bound to it)?"""
        cached = self._scaled.get(id(event.node))
        if cached is None:
            node = event.node
            cached = isinstance(node, ast.Call) and self.scale_call(
                backward_value(self.model, node)
            ) is not None
            self._scaled[id(event.node)] = cached
        return cached


# -- path feasibility -----------------------------------------------------------------------


def _condition(guard: tuple[ast.If, bool]) -> tuple[str, bool, ast.expr]:
    """(identity of the tested expression, its truth on this branch, the expression)."""
    if_node, branch = guard
    expr, positive = condition_literal(if_node.test)
    return ast.dump(expr), positive == branch, expr


def _words(expr: ast.AST) -> list[str]:
    return [n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(expr)
            if isinstance(n, (ast.Name, ast.Attribute))]


def _off_amp_branch(event: Event, source: Event) -> bool:
    """Does ``event`` run only under a mixed-precision flag that ``source`` (the scaled
    backward) was not decided by, in a way that may mean "AMP off"? ``if not use_amp:``,
    ``if scaler is None:``, the ``else`` of ``if use_amp:``, ``if precision == "32":``.
    Such flags are correlated at run time in ways a path cannot see: stay silent."""
    decided = {_condition(g)[:2] for g in source.guards}
    own = {id(g) for g, _ in source.guards}
    for g in event.guards:
        if id(g[0]) in own:
            continue
        key, value, expr = _condition(g)
        words = _words(expr)
        if not any(_AMP_WORD.search(w) for w in words):
            continue
        if (key, value) in decided:
            continue  # the same flag, the same way, as the scaled backward
        if not value or not isinstance(expr, (ast.Name, ast.Attribute)):
            return True
        if any(_NEGATED_WORD.search(w) for w in words):
            return True
    return False


def _contains_in_order(path: Path, first: Event, *rest: Event) -> int:
    """Index of ``first`` when ``path`` holds first and then each of ``rest``; else -1."""
    start = -1
    for i, e in enumerate(path):
        if e is first:
            start = i
            break
    if start < 0:
        return -1
    pos = start
    for want in rest:
        for j in range(pos + 1, len(path)):
            if path[j] is want:
                pos = j
                break
        else:
            return -1
    return start


# -- TL601 ----------------------------------------------------------------------------------


_NORM_FUNCS = {"torch.norm", "torch.linalg.norm", "torch.linalg.vector_norm",
               "torch.linalg.matrix_norm", "torch.nn.utils.get_total_norm",
               "torch.nn.utils.clip_grad_norm_"}


def _is_norm_read(model: FileModel, event: Event) -> bool:
    """A read that measures gradient magnitude: ``clip_grad_norm_(ps, inf)``,
    ``get_total_norm``, ``p.grad.norm()``, ``torch.norm(p.grad)``. Finiteness checks and
    ``is None`` tests are unaffected by the scale and do not count."""
    node = event.node
    if isinstance(node, ast.Call):
        return True  # READ calls are the norm helpers (clip with an infinite bound & co.)
    cur: ast.AST = node
    for _ in range(6):
        parent = model.parent_of(cur)
        if isinstance(parent, ast.Attribute) and parent.value is cur:
            grand = model.parent_of(parent)
            if parent.attr == "norm" and isinstance(grand, ast.Call) and grand.func is parent:
                return True
            cur = parent
        elif isinstance(parent, ast.Call) and parent.func is cur:
            cur = parent  # `p.grad.detach()`, `p.grad.data.float()`
        elif isinstance(parent, ast.Call) and any(a is cur for a in parent.args):
            return model.qualname(parent.func) in _NORM_FUNCS
        else:
            return False
    return False


_READ_MSG = ("gradient norm read before `scaler.unscale_(optimizer)`: it measures scaled "
             "gradients, off by the loss scale")


class ClipBeforeUnscale(Rule):
    """## What it does
    Flags gradient clipping (`clip_grad_norm_`/`clip_grad_value_`), or a gradient-norm
    read, after `scaler.scale(loss).backward()` with no `scaler.unscale_(optimizer)` in
    between, in the same training step.

    ## Why is this bad?
    A `GradScaler` multiplies the loss, and so every gradient, by the loss scale
    (65536 at the start, adapted during training). Before `unscale_`,
    `clip_grad_norm_(params, 1.0)` measures a norm that many times too large: it fires on
    every step, and once `scaler.step` divides the scale back out the update is made
    with gradients of total norm `max_norm / scale` (1/65536 for `max_norm=1.0`). Plain
    SGD then barely moves the weights, Adam-style optimizers see gradients at the level
    of their `eps`, which damps their steps, and the threshold you chose no longer
    relates to the real gradient norm (its effect even changes whenever the scaler
    adapts). A gradient norm logged at that point is off by the same factor, so people
    chasing NaN gradients tune ever smaller clip norms against a number that means
    nothing.

    ## Example
    ```python
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    ```

    ## Use instead
    ```python
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    ```

    ## References
    - [Working with unscaled gradients (AMP examples)](https://pytorch.org/docs/stable/notes/amp_examples.html#working-with-unscaled-gradients)
    """

    code = "TL601"
    name = "clip-before-unscale"
    message = "gradients clipped before `scaler.unscale_(optimizer)`: the threshold applies to scaled gradients"
    triggers = ("scale(",)
    confirm_with = "assert_loss_decreases"
    valid = [
        # the AMP recipe
        """
import torch
scaler = torch.cuda.amp.GradScaler()
for x, y in loader:
    optimizer.zero_grad()
    with torch.autocast("cuda"):
        loss = criterion(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
""",
        # clipping in the non-AMP branch
        """
import torch
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    if use_amp:
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
    else:
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
""",
        # correlated flags: the un-unscaled clip only runs without a scaler (the seed's fix)
        """
import torch

class Trainer:
    def train_step(self, batch):
        self.optimizer.zero_grad()
        loss = self.model(batch).mean()
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()
        self.control()
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()

    def control(self):
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
""",
        # a finiteness check is unaffected by the scale; a norm logged after scaler.step is
        # unscaled
        """
import torch
for x, y in loader:
    optimizer.zero_grad()
    scaler.scale(criterion(model(x), y)).backward()
    bad = any(not torch.isfinite(p.grad).all() for p in model.parameters())
    scaler.step(optimizer)
    scaler.update()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
""",
        # shadowed: a custom loss scaler (its own unscaling semantics), not a GradScaler
        """
import torch

class LossScaler:
    def scale(self, loss):
        return loss * 1024.0

scaler = LossScaler()
for x, y in loader:
    optimizer.zero_grad()
    scaler.scale(criterion(model(x), y)).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
""",
        # a literally disabled GradScaler scales nothing
        """
from torch.cuda.amp import GradScaler
scaler = GradScaler(enabled=False)
for x, y in loader:
    optimizer.zero_grad()
    scaler.scale(criterion(model(x), y)).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
""",
        # no torch
        """
for job in jobs:
    scaler.scale(job).backward()
    job.clip_grad_norm_(1.0)
    scaler.step(job)
""",
    ]
    invalid = [
        Invalid(
            """
import torch
scaler = torch.cuda.amp.GradScaler()
for x, y in loader:
    optimizer.zero_grad()
    with torch.autocast("cuda"):
        loss = criterion(model(x), y)
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
""",
            line=8,
            column=5,
        ),
        # aliased imports, scaled loss through a name, a clipping helper called per step
        Invalid(
            """
import torch.amp as amp
from torch.nn.utils import clip_grad_value_ as clip

def clip_all(model):
    clip(model.parameters(), 0.5)

grad_scaler = amp.GradScaler("cuda")
for epoch in range(10):
    for x, y in loader:
        opt.zero_grad()
        scaled = grad_scaler.scale(crit(net(x), y))
        scaled.backward()
        clip_all(net)
        grad_scaler.step(opt)
        grad_scaler.update()
""",
            line=13,
        ),
        # the clip runs on the AMP path of a script that supports both
        Invalid(
            """
import torch
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    if scaler is not None:
        scaler.scale(loss).backward()
    else:
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
""",
            line=9,
        ),
        # a logged gradient norm read off scaled gradients
        Invalid(
            """
import torch
scaler = torch.amp.GradScaler()
for step, (x, y) in enumerate(loader):
    optimizer.zero_grad()
    scaler.scale(criterion(model(x), y)).backward()
    if step % 100 == 0:
        total = sum(p.grad.norm() ** 2 for p in model.parameters()) ** 0.5
        print(step, total)
    scaler.step(optimizer)
    scaler.update()
""",
            line=7,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        scalers = _Scalers(model)
        seen = Reported()
        for loop in precise_step_loops(model):
            if not any(e.kind is Kind.CLIP or (e.kind is Kind.READ and _is_norm_read(model, e))
                       for e in loop.events):
                continue
            for path in loop.paths:
                scaled: Event | None = None  # the scaled backward whose gradients are live
                for e in path:
                    if e.kind is Kind.BACKWARD:
                        scaled = e if scalers.scaled(e) else None
                    elif e.kind in (Kind.UNSCALE, Kind.ZERO) or (e.kind is Kind.STEP and e.scaled):
                        scaled = None  # `scaler.step` unscales whatever is still scaled
                    elif scaled is not None and (
                        e.kind is Kind.CLIP or (e.kind is Kind.READ and _is_norm_read(model, e))
                    ):
                        if self._unscaled_elsewhere(loop, scaled, e) or _off_amp_branch(e, scaled):
                            continue
                        node = model.steps.anchor(e)
                        if seen.first(node):
                            yield self.report(node, None if e.kind is Kind.CLIP else _READ_MSG)

    @staticmethod
    def _unscaled_elsewhere(loop: StepLoop, backward: Event, clip: Event) -> bool:
        """Another path runs this backward, then an unscale, then this very clip: the unscale
        is conditional on something paths cannot correlate (``if self.scaler is not None``
        guarding both the scaled backward and the unscale): stay silent."""
        return any(
            _contains_in_order(p, backward, u, clip) >= 0
            for u in loop.of(Kind.UNSCALE)
            for p in loop.paths
        )


# -- TL602 ----------------------------------------------------------------------------------


def _int_literal(node: ast.AST) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return isinstance(node, ast.Constant) and type(node.value) is int


def _dominates(model: FileModel, stmt: ast.AST, use: ast.AST) -> bool:
    """Does ``stmt`` run before ``use`` on every way to it (same block, or a block enclosing
    it)? A definition in one branch of an ``if`` does not dominate a use after the ``if``."""
    if not isinstance(stmt, ast.stmt):
        stmt = model.statement_of(stmt)
    parent = model.parent_of(stmt)
    if parent is None:
        return False
    for field in ("body", "orelse", "finalbody"):
        block = getattr(parent, field, None)
        if not isinstance(block, list):
            continue
        for i, s in enumerate(block):
            if s is stmt:
                later = {id(x) for x in block[i + 1 :]}
                if id(use) in later:
                    return True
                for anc in model.ancestors(use):
                    if id(anc) in later:
                        return True
                    if anc is parent:
                        break
                return False
    return False


class SoftmaxIntoCrossEntropy(Rule):
    """## What it does
    Flags a softmax whose output reaches `F.cross_entropy`/`nn.CrossEntropyLoss` (which
    apply log-softmax themselves), `F.nll_loss`/`nn.NLLLoss` (which expect
    log-probabilities), or `torch.log` / `.log()` instead of `log_softmax`. The softmax
    may be applied directly, through a name, by an `nn.Softmax` module, as the last layer
    of an `nn.Sequential`, or as the return value of a same-file model's `forward`.

    ## Why is this bad?
    Cross-entropy on probabilities is a double softmax: its inputs lie in [0, 1], so the
    second softmax is nearly uniform, the loss plateaus near `log(num_classes)` and the
    gradients shrink by orders of magnitude; training crawls or stalls without any error.
    `nll_loss` on probabilities optimises `-p[y]` instead of `-log p[y]`, another objective.
    `torch.log(softmax(x))` underflows: a probability that rounds to 0 (easily in float16)
    gives `-inf`, and its gradient `inf * 0` gives NaN in every weight.

    ## Example
    ```python
    probs = F.softmax(model(x), dim=1)
    loss = F.cross_entropy(probs, y)
    ```

    ## Use instead
    ```python
    logits = model(x)
    loss = F.cross_entropy(logits, y)  # or F.nll_loss(F.log_softmax(logits, dim=1), y)
    probs = F.softmax(logits, dim=1)  # for metrics only
    ```

    ## References
    - [torch.nn.CrossEntropyLoss](https://pytorch.org/docs/stable/generated/torch.nn.CrossEntropyLoss.html)
    - [torch.nn.functional.log_softmax](https://pytorch.org/docs/stable/generated/torch.nn.functional.log_softmax.html)
    """

    code = "TL602"
    name = "softmax-into-cross-entropy"
    message = "softmax output fed to cross-entropy, which applies log-softmax itself: a double softmax"
    triggers = ("softmax", "Softmax")
    confirm_with = "assert_loss_decreases"
    valid = [
        # logits into the loss, softmax for metrics
        """
import torch.nn.functional as F
for x, y in loader:
    logits = model(x)
    loss = F.cross_entropy(logits, y)
    probs = F.softmax(logits, dim=1)
    acc = (probs.argmax(1) == y).float().mean()
""",
        # log_softmax into nll_loss; soft targets (the second argument) may be probabilities
        """
import torch
import torch.nn.functional as F
loss = F.nll_loss(F.log_softmax(logits, dim=-1), y)
kd = F.cross_entropy(student(x), F.softmax(teacher(x) / 2.0, dim=-1))
kl = F.kl_div(F.log_softmax(s, -1), torch.softmax(t, -1), reduction="batchmean")
""",
        # an epsilon keeps the log finite; a softmax in one branch only does not dominate
        """
import torch
import torch.nn.functional as F
ent = -(p * torch.log(F.softmax(z, -1) + 1e-8)).sum()
out = model(x)
if calibrate:
    out = out.softmax(-1)
else:
    out = model(x)
loss = F.cross_entropy(out, y)
""",
        # forward returns probabilities only in eval mode
        """
import torch
from torch import nn
import torch.nn.functional as F

class Net(nn.Module):
    def forward(self, x):
        logits = self.fc(x)
        if self.training:
            return logits
        return F.softmax(logits, dim=-1)

net = Net()
loss = nn.CrossEntropyLoss()(net(x), y)
""",
        # shadowed: a parameter named F is not torch.nn.functional
        """
import torch

def loss_of(F, logits, y):
    return F.cross_entropy(F.softmax(logits, 1), y)
""",
        # no torch
        """
def loss_of(logits, y):
    return cross_entropy(softmax(logits), y)
""",
    ]
    invalid = [
        Invalid(
            """
import torch.nn.functional as F
for x, y in loader:
    probs = F.softmax(model(x), dim=1)
    loss = F.cross_entropy(probs, y)
    loss.backward()
""",
            line=3,
            column=13,
        ),
        # aliased import and a reshaped tensor method softmax into a criterion
        Invalid(
            """
from torch import nn
from torch.nn import functional as Fn

criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
out = Fn.softmax(head(x), -1)
loss = criterion(out.view(-1, n_cls), y.view(-1))
other = criterion(h.softmax(dim=-1), y)
""",
            lines=(5, 7),
        ),
        # log of a softmax fed to nll_loss: reported once, at the softmax
        Invalid(
            """
import torch
import torch.nn.functional as F
loss = F.nll_loss(torch.log(torch.softmax(logits, dim=1)), y)
ent = -(p * F.softmax(z, -1).log()).sum(-1)
""",
            lines=(3, 4),
        ),
        # the model's last layer is a softmax
        Invalid(
            """
import torch
from torch import nn

class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(128, 10)

    def forward(self, x):
        return torch.softmax(self.fc(x), dim=1)

model = Classifier()
seq = nn.Sequential(nn.Linear(4, 3), nn.Softmax(dim=1))
crit = nn.NLLLoss()
for x, y in loader:
    loss = nn.functional.cross_entropy(model(x), y) + crit(seq(x), y)
""",
            lines=(10, 13),
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        if not model.imports_module("torch"):
            return
        seen = Reported()
        for label, expr in self._sinks(model):
            for node in self._softmax_sources(model, expr, 0, set()):
                if seen.first(node):
                    yield self.report(node, self._message(label))

    @staticmethod
    def _message(label: str) -> str:
        if label == "log":
            return "`log(softmax(x))` underflows to -inf and NaN gradients: use `log_softmax`"
        if label in ("nll_loss", "NLLLoss"):
            return (f"softmax output fed to `{label}`, which expects log-probabilities: "
                    "use `log_softmax`")
        return (f"softmax output fed to `{label}`, which applies log-softmax itself: "
                "a double softmax")

    def _sinks(self, model: FileModel) -> Iterator[tuple[str, ast.AST]]:
        """(label, the expression whose softmax-ness matters), in source order."""
        out: list[tuple[ast.Call, str, ast.AST]] = []
        for call in model.calls_to(*_CE_FUNCS):
            arg = call.args[0] if call.args else keyword(call, "input")
            if arg is not None:
                out.append((call, _CE_FUNCS[model.qualname(call.func) or ""], arg))
        # criterion objects: `crit = nn.CrossEntropyLoss()` ... `crit(out, y)`
        names: set[str] = set()
        for key, binding in model.roles.all_of(Role.CRITERION):
            if binding.qualname in _CE_CLASSES and isinstance(key[-1], str):
                names.add(key[-1].rsplit(".", 1)[-1])
        for name in names:
            for call in model.calls.get(name, ()):
                if not isinstance(call.func, (ast.Name, ast.Attribute)) or not call.args:
                    continue
                crit = model.roles.lookup(call.func)
                if crit is not None and crit.qualname in _CE_CLASSES:
                    out.append((call, _CE_CLASSES[crit.qualname], call.args[0]))
        # `nn.CrossEntropyLoss()(out, y)`
        for ctor in model.calls_to(*_CE_CLASSES):
            parent = model.parent_of(ctor)
            if isinstance(parent, ast.Call) and parent.func is ctor and parent.args:
                label = _CE_CLASSES[model.qualname(ctor.func) or ""]
                out.append((parent, label, parent.args[0]))
        for call in model.calls_to("torch.log"):
            if call.args:
                out.append((call, "log", call.args[0]))
        for call in model.calls.get("log", ()):
            func = call.func
            if isinstance(func, ast.Attribute) and not call.args and not call.keywords and (
                model.qualname(func) is None
            ):
                out.append((call, "log", func.value))
        out.sort(key=lambda t: (t[0].lineno, t[0].col_offset))
        for _, label, expr in out:
            yield label, expr

    def _softmax_sources(self, model: FileModel, expr: ast.AST, depth: int,
                         classes: set[int]) -> list[ast.AST]:
        """The softmax node(s) whose output ``expr`` certainly is; [] when not certain."""
        if depth > 8:
            return []
        d = depth + 1
        if isinstance(expr, ast.Subscript):
            return self._softmax_sources(model, expr.value, d, classes)
        if isinstance(expr, ast.Name):
            found = model.flow.definition(expr.id, expr)
            if found is None or not isinstance(found[1], ast.expr):
                return []
            if not _dominates(model, found[0], expr):
                return []
            return self._softmax_sources(model, found[1], d, classes)
        if not isinstance(expr, ast.Call):
            return []
        func = expr.func
        qual = model.qualname(func)
        if qual in _SOFTMAX_FUNCS:
            return [expr]
        if isinstance(func, ast.Attribute) and qual is None:
            if func.attr == "softmax" and self._method_form(expr):
                return [expr]
            if func.attr in _SAME_VALUES:
                return self._softmax_sources(model, func.value, d, classes)
        if isinstance(func, ast.Call) and model.qualname(func.func) == _SOFTMAX_MODULE:
            return [expr]  # nn.Softmax(dim=1)(x)
        return self._module_output(model, expr, d, classes)

    @staticmethod
    def _method_form(call: ast.Call) -> bool:
        """``t.softmax(-1)`` / ``t.softmax(dim=1)``, told apart from an unresolved
        ``F.softmax(t, 1)`` (a shadowed module) by its arguments."""
        kws = {k.arg for k in call.keywords}
        if not kws <= {"dim", "dtype"}:
            return False
        if not call.args:
            return "dim" in kws
        return len(call.args) == 1 and _int_literal(call.args[0]) and "dim" not in kws

    def _module_output(self, model: FileModel, call: ast.Call, depth: int,
                       classes: set[int]) -> list[ast.AST]:
        """Softmax at the end of a module called here: an `nn.Softmax` instance, the last
        layer of an `nn.Sequential`, or every return of a same-file class's `forward`."""
        func = call.func
        cls: ast.ClassDef | None = None
        if isinstance(func, ast.Name) and func.id == "self":
            cls = model.enclosing_class(func)
            if cls is not None and not model.roles.is_module_class(cls):
                return []  # `self(x)` runs `__call__`, which is `forward` only for modules
        elif isinstance(func, (ast.Name, ast.Attribute)):
            binding = model.roles.lookup(func)
            if binding is None or binding.call is None:
                return []
            if binding.qualname == _SOFTMAX_MODULE:
                return [call]
            if binding.qualname == "torch.nn.Sequential":
                last = binding.call.args[-1] if binding.call.args else None
                if isinstance(last, ast.Call) and model.qualname(last.func) == _SOFTMAX_MODULE:
                    return [last]
                return []
            cls = self._local_module_class(model, binding)
        if cls is None or id(cls) in classes:
            return []
        forward = self._forward_of(model, cls)
        if forward is None:
            return []
        returns = [n for n in walk_local(forward) if isinstance(n, ast.Return)]
        if not returns:
            return []
        found: list[ast.AST] = []
        for ret in returns:
            if ret.value is None:
                return []
            nodes = self._softmax_sources(model, ret.value, depth, classes | {id(cls)})
            if not nodes:
                return []  # some return is not a softmax output: not certain
            found.extend(nodes)
        return found

    @staticmethod
    def _local_module_class(model: FileModel, binding: Binding) -> ast.ClassDef | None:
        call = binding.call
        if binding.role is not Role.MODEL or call is None or not isinstance(call.func, ast.Name):
            return None
        if model.qualname(call.func) is not None:
            return None
        return model.class_named(call.func.id)

    @staticmethod
    def _forward_of(model: FileModel, cls: ast.ClassDef) -> ast.FunctionDef | None:
        seen: set[int] = set()
        cur: ast.ClassDef | None = cls
        while cur is not None and id(cur) not in seen:
            seen.add(id(cur))
            fn = model.methods(cur).get("forward")
            if isinstance(fn, ast.FunctionDef):
                return fn
            cur = model.local_base(cur)
        return None


# -- TL603 ----------------------------------------------------------------------------------


def _autocast_enabled(model: FileModel, expr: ast.AST, depth: int = 0) -> bool | None:
    """True for an autocast context/decorator that may be enabled, False for one literally
    disabled (``enabled=False``), None for anything else. A name is followed to its
    definition: nanoGPT's ``ctx = nullcontext() if cpu else torch.amp.autocast(...)``
    is an autocast region whenever it matters."""
    if isinstance(expr, ast.Name) and depth == 0:
        found = model.flow.definition(expr.id, expr)
        if found is None or not isinstance(found[1], (ast.Call, ast.IfExp)):
            return None
        value = found[1]
        if isinstance(value, ast.IfExp):
            states = [_autocast_enabled(model, b, 1) for b in (value.body, value.orelse)]
            nulls = [isinstance(b, ast.Call) and model.qualname(b.func) == "contextlib.nullcontext"
                     for b in (value.body, value.orelse)]
            if True in states and all(s is not None or n for s, n in zip(states, nulls,
                                                                              strict=True)):
                return True
            return None
        return _autocast_enabled(model, value, 1)
    if not isinstance(expr, ast.Call):
        return None
    qual = model.qualname(expr.func)
    if qual not in _AUTOCAST_ENABLED_ARG:
        return None
    enabled = keyword(expr, "enabled")
    index = _AUTOCAST_ENABLED_ARG[qual]
    if enabled is None and len(expr.args) > index:
        enabled = expr.args[index]
    return not is_false(enabled)


class BackwardInsideAutocast(Rule):
    """## What it does
    Flags `backward()` (in any form: `loss.backward()`, `scaler.scale(loss).backward()`,
    `accelerator.backward(loss)`, `torch.autograd.backward`) inside an enabled
    `torch.autocast(...)` / `torch.cuda.amp.autocast()` / `torch.amp.autocast(...)`
    region: a `with` block, a function decorated with it, or a same-file helper whose
    every call site is inside one.

    ## Why is this bad?
    Autocast is meant to wrap the forward pass and the loss only; PyTorch documents
    backward passes under autocast as not recommended. Backward ops already run in the
    dtype autocast chose for their forward ops. Inside the region, other ops that run
    during the backward call (gradient hooks, `create_graph=True` gradient penalties,
    custom `autograd.Function` backwards without `custom_bwd`) can be autocast as well and
    run in float16, where small gradient terms underflow to zero and large ones overflow
    to inf/NaN. Under `torch.compile` the compiled backward bakes in an assumption about
    the surrounding autocast state, and a mismatch gives silently wrong gradients. Plain
    models often train fine either way, hence a warning.

    ## Example
    ```python
    with torch.autocast("cuda"):
        loss = criterion(model(x), y)
        scaler.scale(loss).backward()
    ```

    ## Use instead
    ```python
    with torch.autocast("cuda"):
        loss = criterion(model(x), y)
    scaler.scale(loss).backward()
    ```

    ## References
    - [Automatic Mixed Precision: torch.autocast](https://pytorch.org/docs/stable/amp.html#torch.autocast)
    - [torch.compile has different autograd semantics](https://pytorch.org/docs/stable/torch.compiler_backward.html)
    """

    code = "TL603"
    name = "backward-inside-autocast"
    message = "`backward()` inside an `autocast` region: autocast should wrap only the forward pass and loss"
    severity = "warning"
    triggers = ("autocast",)
    confirm_with = "assert_finite_grads"
    valid = [
        """
import torch
for x, y in loader:
    optimizer.zero_grad()
    with torch.autocast("cuda", dtype=torch.float16):
        loss = criterion(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
""",
        # a disabled region, and a closure defined (not run) inside the region
        """
import torch
from torch.cuda.amp import autocast
with autocast(enabled=False):
    loss = criterion(model(x.float()), y)
    loss.backward()
with torch.autocast("cuda"):
    with torch.autocast("cuda", enabled=False):
        model(x).sum().backward()
    def closure():
        loss = model(x).sum()
        loss.backward()
        return loss
optimizer.step(closure)
""",
        # a helper called both inside and outside a region
        """
import torch

def backprop(loss):
    loss.backward()

with torch.autocast("cpu", dtype=torch.bfloat16):
    l1 = model(x).sum()
    backprop(l1)
backprop(model(x).sum())
""",
        # shadowed: a parameter named autocast
        """
import torch

def run(autocast, loss):
    with autocast():
        loss.backward()
""",
        # no torch
        """
with autocast():
    loss.backward()
""",
    ]
    invalid = [
        Invalid(
            """
import torch
for x, y in loader:
    optimizer.zero_grad()
    with torch.autocast(device_type="cuda", dtype=torch.float16):
        loss = criterion(model(x), y)
        scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
""",
            line=6,
            column=9,
        ),
        # aliased import, an enabled flag that is not literally False, accelerate backward
        Invalid(
            """
from torch.cuda.amp import autocast as amp_region
for batch in loader:
    with amp_region(enabled=args.amp):
        out = model(**batch)
        accelerator.backward(out.loss)
""",
            line=5,
        ),
        # a decorated step function, and a helper only called inside a region
        Invalid(
            """
import torch

def backprop(loss):
    loss.backward()

@torch.amp.autocast("cuda")
def train_step(model, x):
    torch.autograd.backward(model(x).sum())

with torch.cpu.amp.autocast():
    backprop(model(x).sum())
""",
            lines=(4, 8),
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        if not model.imports_module("torch"):
            return
        memo: dict[int, bool] = {}
        for call in backward_calls(model):
            if self._under_autocast(model, call, 2, memo):
                yield self.report(call)

    def _under_autocast(self, model: FileModel, node: ast.AST, depth: int,
                        memo: dict[int, bool]) -> bool:
        """Does ``node`` always run inside an enabled autocast region? The innermost
        autocast decides (``enabled=False`` nested inside an enabled region turns it off)."""
        for anc in model.ancestors(node):
            if isinstance(anc, (ast.With, ast.AsyncWith)):
                for item in reversed(anc.items):
                    state = _autocast_enabled(model, item.context_expr)
                    if state is not None:
                        return state
            elif isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for dec in anc.decorator_list:
                    state = _autocast_enabled(model, dec)
                    if state is not None:
                        return state
                return depth > 0 and self._every_call_under_autocast(model, anc, depth, memo)
            elif isinstance(anc, (ast.Lambda, ast.ClassDef)):
                return False
        return False

    def _every_call_under_autocast(self, model: FileModel, fn: ast.AST, depth: int,
                                   memo: dict[int, bool]) -> bool:
        cached = memo.get(id(fn))
        if cached is None:
            memo[id(fn)] = False  # recursion guard
            sites = model.call_sites.get(id(fn), [])
            cached = bool(sites) and all(
                self._under_autocast(model, site, depth - 1, memo) for site in sites
            )
            memo[id(fn)] = cached
        return cached


# -- TL604 ----------------------------------------------------------------------------------


class ScalerStepBypassed(Rule):
    """## What it does
    Flags `optimizer.step()` applying gradients produced by
    `scaler.scale(loss).backward()` instead of `scaler.step(optimizer)`, and a
    `scaler.step(optimizer)` whose `GradScaler` never gets `scaler.update()` anywhere in
    the file.

    ## Why is this bad?
    `scaler.step(optimizer)` unscales the gradients, checks them for inf/NaN, and skips
    the update when the scale overflowed. `optimizer.step()` does none of this: with plain
    SGD every update is multiplied by the loss scale (65536 at the start) and the model
    diverges at once; with Adam the scale mostly cancels, but steps whose gradients
    overflowed write inf/NaN into the weights, and from then on every loss is NaN.
    Without `scaler.update()` the scale never adapts (it neither backs off after an
    overflow nor grows), and an enabled scaler raises "step() has already been called
    since the last update()" on the second step, typically only on the GPU machine, when
    the scaler was built with `enabled=torch.cuda.is_available()`.

    ## Example
    ```python
    scaler.scale(loss).backward()
    optimizer.step()
    ```

    ## Use instead
    ```python
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    ```

    ## References
    - [Automatic Mixed Precision examples](https://pytorch.org/docs/stable/notes/amp_examples.html)
    - [torch.amp.GradScaler](https://pytorch.org/docs/stable/amp.html#gradient-scaling)
    """

    code = "TL604"
    name = "scaler-step-bypassed"
    message = "gradients from `scaler.scale(loss).backward()` applied by `optimizer.step()`: no unscaling, no inf/NaN check"
    triggers = ("scale(", "GradScaler")
    confirm_with = "assert_finite_grads"
    valid = [
        """
import torch
scaler = torch.cuda.amp.GradScaler()
for x, y in loader:
    optimizer.zero_grad()
    scaler.scale(criterion(model(x), y)).backward()
    scaler.step(optimizer)
    scaler.update()
""",
        # both modes behind one flag
        """
import torch
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    if use_amp:
        scaler.scale(loss).backward()
    else:
        loss.backward()
    if use_amp:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
""",
        # accumulation, and the update in a helper; a scaler handed to code we cannot see
        """
import torch

def finish(scaler, opt):
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()

scaler = torch.amp.GradScaler()
for i, (x, y) in enumerate(loader):
    scaler.scale(criterion(model(x), y) / 4).backward()
    if (i + 1) % 4 == 0:
        finish(scaler, optimizer)
other = torch.amp.GradScaler()
engine = Engine(other)
other.step(optimizer)
""",
        # shadowed: a parameter named GradScaler builds something else
        """
import torch

def train(GradScaler, loader, opt):
    scaler = GradScaler()
    for x in loader:
        scaler.scale(model(x).sum()).backward()
        opt.step()
""",
        # no torch
        """
for job in jobs:
    scaler.scale(job).backward()
    optimizer.step()
""",
    ]
    invalid = [
        Invalid(
            """
import torch
scaler = torch.cuda.amp.GradScaler()
for x, y in loader:
    optimizer.zero_grad()
    with torch.autocast("cuda"):
        loss = criterion(model(x), y)
    scaler.scale(loss).backward()
    optimizer.step()
    scaler.update()
""",
            line=8,
            column=5,
        ),
        # aliased import; unscale_ alone does not make optimizer.step() safe
        Invalid(
            """
from torch.amp import GradScaler as GS
import torch.optim as optim

gs = GS("cuda")
opt = optim.SGD(net.parameters(), lr=0.1)
for x, y in loader:
    opt.zero_grad()
    gs.scale(crit(net(x), y)).backward()
    gs.unscale_(opt)
    opt.step()
    gs.update()
""",
            line=10,
        ),
        # update never called for this scaler
        Invalid(
            """
import torch

class Trainer:
    def __init__(self, model):
        self.scaler = torch.cuda.amp.GradScaler(enabled=torch.cuda.is_available())
        self.opt = torch.optim.AdamW(model.parameters())

    def train_step(self, loss):
        self.opt.zero_grad()
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
""",
            line=11,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        scalers = _Scalers(model)
        seen = Reported()
        for loop in precise_step_loops(model):
            if not any(scalers.scaled(e) for e in loop.of(Kind.BACKWARD)):
                continue
            for path in loop.paths:
                scaled: Event | None = None
                for e in path:
                    if e.kind is Kind.BACKWARD:
                        scaled = e if scalers.scaled(e) else None
                    elif e.kind is Kind.ZERO or (e.kind is Kind.STEP and e.scaled):
                        scaled = None
                    elif e.kind is Kind.STEP and scaled is not None:
                        if self._scaled_step_elsewhere(loop, scaled, e) or _off_amp_branch(
                            e, scaled
                        ):
                            continue
                        node = model.steps.anchor(e)
                        if seen.first(node):
                            yield self.report(node)
        yield from self._never_updated(model, scalers, seen)

    @staticmethod
    def _scaled_step_elsewhere(loop: StepLoop, backward: Event, step: Event) -> bool:
        """Another path runs this backward and then a ``scaler.step`` instead of this
        ``optimizer.step()``: the two are alternatives chosen by a condition the paths
        cannot correlate (``if self.scaler is not None`` vs ``if self.use_amp``)."""
        for p in loop.paths:
            if any(e is step for e in p):
                continue
            for e in p:
                if e.kind is Kind.STEP and e.scaled and _contains_in_order(p, backward, e) >= 0:
                    return True
        return False

    def _never_updated(self, model: FileModel, scalers: _Scalers,
                       seen: Reported) -> Iterator[Report]:
        steps = [c for c in model.calls.get("step", ())
                 if isinstance(c.func, ast.Attribute) and c.args]
        if not steps:
            return
        roles = model.roles
        updated: set[int] = set()
        for call in model.calls.get("update", ()):
            func = call.func
            if not isinstance(func, ast.Attribute) or call.args or call.keywords:
                continue
            if not scalers.is_scaler(func.value) and not _named_scaler(func.value):
                continue
            b = roles.lookup(func.value)
            if b is None or b.call is None:
                return  # an update on a scaler we cannot identify may be any of them
            updated.add(id(b.call))
        escaped: dict[int, bool] = {}
        for call in steps:
            recv = call.func.value  # type: ignore[attr-defined]
            b = roles.lookup(recv)
            if b is None or b.role is not Role.SCALER or b.call is None or _disabled(b.call):
                continue  # a scaler passed in: its owner may update it
            if model.qualname(b.call.func) not in _SCALERS or id(b.call) in updated:
                continue
            if id(b.call) not in escaped:
                escaped[id(b.call)] = _escapes(model, b)
            if escaped[id(b.call)]:
                continue
            if seen.first(call):
                yield self.report(
                    call,
                    "`scaler.step()` but `scaler.update()` is never called: the loss scale "
                    "never adapts and the second step raises",
                )


def _named_scaler(expr: ast.AST) -> bool:
    return "scaler" in (dotted(expr) or "").rsplit(".", 1)[-1].lower()


def _escapes(model: FileModel, binding: Binding) -> bool:
    """Does the scaler object leave our sight (passed to a call, returned, stored elsewhere,
    put in a container)? Then whoever receives it may call ``update()``."""
    roles = model.roles
    keys = {k for k, bs in roles.bindings.items() if any(b.call is binding.call for b in bs)}
    if not keys:
        return True
    last = {str(k[-1]).rsplit(".", 1)[-1] for k in keys}
    candidates: list[ast.AST] = [a for name in last for a in model.attributes.get(name, ())]
    candidates += [n for n in ast.walk(model.tree) if isinstance(n, ast.Name) and n.id in last]
    for node in candidates:
        if not isinstance(getattr(node, "ctx", None), ast.Load) or roles.key(node) not in keys:
            continue
        parent = model.parent_of(node)
        if isinstance(parent, ast.Attribute) and parent.value is node:
            continue  # scaler.scale(...), scaler.step(...), scaler.state_dict()
        if _tested_only(model, node):
            continue  # `if scaler is not None:`, `use_amp = scaler is not None`
        return True
    return False


def _tested_only(model: FileModel, node: ast.AST) -> bool:
    """Is ``node`` only tested (compared, negated, or an ``if``/``while`` condition), so
    that the object itself goes nowhere? ``x = scaler or other`` hands it on."""
    cur, parent = node, model.parent_of(node)
    if isinstance(parent, ast.Compare):
        return True
    while isinstance(parent, (ast.BoolOp, ast.UnaryOp)):
        if isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.Not):
            return True
        cur, parent = parent, model.parent_of(parent)
    if isinstance(parent, (ast.If, ast.While, ast.IfExp, ast.Assert)):
        return parent.test is cur
    return isinstance(parent, ast.comprehension) and any(c is cur for c in parent.ifs)


RULES = [
    ClipBeforeUnscale,
    SoftmaxIntoCrossEntropy,
    BackwardInsideAutocast,
    ScalerStepBypassed,
]
