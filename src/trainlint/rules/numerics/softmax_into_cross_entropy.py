"""TL602 softmax-into-cross-entropy."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from trainlint.analysis.flow import grad_enabled_at
from trainlint.analysis.grad_mode import grad_disabled_earlier, under_grad_wrapper
from trainlint.analysis.model import FileModel, call_name, keyword
from trainlint.analysis.paths import Reported
from trainlint.analysis.roles import Role
from trainlint.analysis.softmax import softmax_sources
from trainlint.rules.base import Invalid, Report, Rule

_CE_FUNCS = {
    "torch.nn.functional.cross_entropy": "cross_entropy",
    "torch.nn.functional.nll_loss": "nll_loss",
}
_CE_CLASSES = {"torch.nn.CrossEntropyLoss": "CrossEntropyLoss", "torch.nn.NLLLoss": "NLLLoss"}

def _without_autograd(model: FileModel, node: ast.AST, logged: ast.AST) -> bool:
    """Grad mode is off where the softmax runs and its log feeds no loss (decoding,
    scoring, metrics): underflow gives -inf scores there, but no gradient to turn into
    NaN. A loss computed under no_grad (a custom autograd Function's forward) still
    counts. ``logged``: the expression whose log is taken."""
    fn = model.function_of(node)
    grad_off = (
        not grad_enabled_at(model, node)[0]
        or under_grad_wrapper(model, node)
        or (isinstance(node, ast.Call) and grad_disabled_earlier(model, node, fn))
    )
    if not grad_off:
        return False
    for anc in model.ancestors(logged):
        if isinstance(anc, ast.stmt):
            break
        if isinstance(anc, ast.Call) and "loss" in (call_name(anc) or "").lower():
            return False  # the log feeds a loss (`nll_loss(p.log(), y)`)
    return True


_TARGET_WORDS = re.compile(r"target|label|teacher", re.IGNORECASE)


def _over_targets(softmax: ast.AST) -> bool:
    """A softmax over target scores or a teacher's outputs: a distribution nothing
    backpropagates through (``p * p.log()`` in a KL target term), so the NaN-gradient
    hazard of ``log(softmax)`` does not apply."""
    if not isinstance(softmax, ast.Call) or not softmax.args:
        return False
    for sub in ast.walk(softmax.args[0]):
        text = (
            sub.id
            if isinstance(sub, ast.Name)
            else sub.attr
            if isinstance(sub, ast.Attribute)
            else ""
        )
        if text and _TARGET_WORDS.search(text):
            return True
    return False


class SoftmaxIntoCrossEntropy(Rule):
    """## What it does
    Flags a softmax whose output reaches `F.cross_entropy`/`nn.CrossEntropyLoss` (which
    apply log-softmax themselves), `F.nll_loss`/`nn.NLLLoss` (which expect
    log-probabilities), or `torch.log` / `.log()` instead of `log_softmax`. The softmax
    may be applied directly, through a name, by an `nn.Softmax` module, as the last layer
    of an `nn.Sequential`, as the return value of a model's `forward` (a model built in
    the same file, or one another file of the project builds and passes in), as the
    output of a wrapper module that applies the layer it is handed
    (`self.drop(x, nn.Sequential(self.fc, self.softmax))`), row by row (`for p in
    probs`), or as the `exp` of a log-softmax. A criterion may also be a constructor
    argument whose default is `nn.CrossEntropyLoss()`, when no call passes another.

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
    message = "softmax output fed to cross-entropy, which applies log-softmax itself: a double softmax; pass the logits"
    triggers = ("softmax", "Softmax")
    confirm_with = "assert_loss_decreases"
    valid = [
        # scoring beams without autograd: a log of a softmax has no gradient to turn NaN
        """
import torch
import torch.nn.functional as F

@torch.no_grad()
def next_token_scores(model, tokens):
    logits = model(tokens)[:, -1]
    return torch.log(F.softmax(logits, dim=-1))

def rank(model, tokens):
    with torch.inference_mode():
        return F.softmax(model(tokens), -1).log().topk(5)
""",
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
        # the log of a softmax over target scores (a KL target term): no gradient flows
        # through it
        """
import torch.nn.functional as F

def kl_to_scores(logits, target_scores, temperature=1.0):
    target_dist = F.softmax(target_scores / temperature, dim=-1)
    model_dist = F.log_softmax(logits, dim=-1)
    return (target_dist * (target_dist.log() - model_dist)).sum()
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
        # a loss computed by hand under no_grad (its gradient written in backward): the
        # log still underflows into the loss
        Invalid(
            """
import torch
import torch.nn.functional as F

class ChunkedLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels):
        with torch.no_grad():
            probs = F.softmax(hidden @ weight.t(), dim=-1)
            return F.nll_loss(probs.log(), labels)
""",
            line=8,
        ),
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
        # probabilities rebuilt as the exp of a log-softmax are still a softmax
        Invalid(
            """
import torch
import torch.nn.functional as F
probs = torch.exp(F.log_softmax(scores, dim=0))
loss = F.cross_entropy(probs.view(1, -1), answer)
""",
            line=3,
        ),
        # one element of a two-headed forward, through a one-line loss helper
        Invalid(
            """
import torch.nn as nn
import torch.nn.functional as F

class Heads(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(8, 1)
        self.cls = nn.Sequential(nn.Linear(8, 4), nn.Softmax(dim=1))

    def forward(self, x):
        return self.gate(x), self.cls(x)

def class_loss(scores, y):
    return F.cross_entropy(scores, y)

heads = Heads()
gate, scores = heads(x)
loss = class_loss(scores, y)
""",
            line=8,
        ),
        # a chunked LM loss: the softmax over the vocabulary, its log into nll_loss
        Invalid(
            """
import torch
import torch.nn.functional as F
for i in range(num_chunks):
    logits_chunk = hidden[i] @ weight.t()
    probs = F.softmax(logits_chunk.float(), dim=-1)
    losses.append(F.nll_loss(probs.log().reshape(-1, vocab), labels[i].reshape(-1)))
""",
            line=5,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        if not model.imports_module("torch"):
            return
        seen = Reported()
        for label, expr in self._sinks(model):
            for node in softmax_sources(model, expr):
                if label == "log" and (_over_targets(node) or _without_autograd(model, node, expr)):
                    continue
                if seen.first(node):
                    yield self.report(node, self._message(label))

    @staticmethod
    def _message(label: str) -> str:
        if label == "log":
            return (
                "`log(softmax(x))` is -inf wherever a probability underflows to 0, with NaN "
                "gradients through it; use `log_softmax`"
            )
        if label in ("nll_loss", "NLLLoss"):
            return (
                f"softmax output fed to `{label}`, which expects log-probabilities: "
                "use `log_softmax`"
            )
        return (
            f"softmax output fed to `{label}`, which applies log-softmax itself: "
            "a double softmax; pass the logits"
        )

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
            if (
                isinstance(func, ast.Attribute)
                and not call.args
                and not call.keywords
                and (model.qualname(func) is None)
            ):
                out.append((call, "log", func.value))
        out.sort(key=lambda t: (t[0].lineno, t[0].col_offset))
        for _, label, expr in out:
            yield label, expr
