"""TL605 sigmoid-into-bce-with-logits."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.activations import LINEAR, SIGMOID, Layer, layer_sources
from trainlint.analysis.model import FileModel, keyword
from trainlint.analysis.paths import Reported
from trainlint.analysis.roles import Role
from trainlint.rules.base import Invalid, Report, Rule

# Losses that apply a sigmoid to their input themselves.
_LOGIT_FUNCS = {
    "torch.nn.functional.binary_cross_entropy_with_logits": "binary_cross_entropy_with_logits",
    "torch.binary_cross_entropy_with_logits": "binary_cross_entropy_with_logits",
    "torchvision.ops.sigmoid_focal_loss": "sigmoid_focal_loss",
    "torchvision.ops.focal_loss.sigmoid_focal_loss": "sigmoid_focal_loss",
}
_LOGIT_CLASSES = {"torch.nn.BCEWithLogitsLoss": "BCEWithLogitsLoss"}
# Losses that expect probabilities.
_PROB_FUNCS = {"torch.nn.functional.binary_cross_entropy": "binary_cross_entropy"}
_PROB_CLASSES = {"torch.nn.BCELoss": "BCELoss"}


class SigmoidIntoBceWithLogits(Rule):
    """## What it does
    Flags a sigmoid whose output reaches a loss that applies the sigmoid itself:
    `F.binary_cross_entropy_with_logits`, `nn.BCEWithLogitsLoss` or torchvision's
    `sigmoid_focal_loss`. The sigmoid may be applied directly, through a name, by an
    `nn.Sigmoid` module, as the last layer of an `nn.Sequential`, or as the return value
    of a same-file model's `forward` (`model(x)`, `self(x)` or `self.forward(x)`). Also flags the opposite mistake where it is
    provable: `F.binary_cross_entropy`/`nn.BCELoss`, which expect probabilities, fed the
    output of a bare `nn.Linear` layer (directly, or as every return of `forward`).
    Reported at the sigmoid, or at the linear layer.

    ## Why is this bad?
    `BCEWithLogitsLoss` computes `sigmoid(x)` itself. Given probabilities, it squashes
    them a second time into [0.5, 0.73]: the loss can never approach 0, a negative
    label can never be predicted, and the gradient through two sigmoids is a fraction
    of the right one. Training runs, the loss plateaus, and nothing raises.
    `BCELoss` on raw logits raises on values outside [0, 1] on CPU and fails with a
    device-side assert on CUDA, far from the cause.

    ## Example
    ```python
    class Net(nn.Module):
        def forward(self, x):
            return torch.sigmoid(self.fc(x))

    criterion = nn.BCEWithLogitsLoss()
    loss = criterion(model(x), y)
    ```

    ## Use instead
    ```python
    class Net(nn.Module):
        def forward(self, x):
            return self.fc(x)  # logits

    criterion = nn.BCEWithLogitsLoss()
    loss = criterion(model(x), y)
    probs = torch.sigmoid(model(x))  # for metrics or inference only
    ```

    ## References
    - [torch.nn.BCEWithLogitsLoss](https://pytorch.org/docs/stable/generated/torch.nn.BCEWithLogitsLoss.html)
    - [torch.nn.BCELoss](https://pytorch.org/docs/stable/generated/torch.nn.BCELoss.html)
    """

    code = "TL605"
    name = "sigmoid-into-bce-with-logits"
    message = (
        "sigmoid output fed to a loss that applies the sigmoid itself: a double "
        "sigmoid; pass the logits"
    )
    triggers = (
        "_with_logits",
        "BCEWithLogits",
        "sigmoid_focal_loss",
        "BCELoss",
        "binary_cross_entropy",
    )
    confirm_with = "assert_loss_decreases"
    valid = [
        # logits into the loss, sigmoid for metrics
        """
import torch
import torch.nn.functional as F
for x, y in loader:
    logits = model(x)
    loss = F.binary_cross_entropy_with_logits(logits, y)
    preds = torch.sigmoid(logits) > 0.5
""",
        # sigmoid into the probability loss; the sigmoid'd tensor as the *target*
        # (distillation from a teacher's probabilities)
        """
import torch
from torch import nn
bce = nn.BCELoss()
loss = bce(torch.sigmoid(model(x)), y)
kd = nn.BCEWithLogitsLoss()(student(x), torch.sigmoid(teacher(x)))
""",
        # forward returns probabilities only in eval mode
        """
import torch
from torch import nn

class Net(nn.Module):
    def forward(self, x):
        logits = self.fc(x)
        if self.training:
            return logits
        return torch.sigmoid(logits)

net = Net()
loss = nn.BCEWithLogitsLoss()(net(x), y)
""",
        # the sigmoid in one branch only does not dominate the loss
        """
import torch
import torch.nn.functional as F
out = head(x)
if calibrated:
    out = out.sigmoid()
else:
    out = head(x)
loss = F.binary_cross_entropy_with_logits(out, y)
""",
        # BCELoss after a linear layer followed by a sigmoid in forward; a linear layer
        # whose output is transformed before the loss is not provably raw
        """
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 1)

    def forward(self, x):
        return torch.sigmoid(self.fc(x))

model = Net()
crit = nn.BCELoss()
loss = crit(model(x), y) + crit(squash(model.fc(x)), y)
""",
        # shadowed: a parameter named F is not torch.nn.functional
        """
import torch

def loss_of(F, logits, y):
    return F.binary_cross_entropy_with_logits(F.sigmoid(logits), y)
""",
        # no torch
        """
def loss_of(logits, y):
    return binary_cross_entropy_with_logits(sigmoid(logits), y)
""",
    ]
    invalid = [
        Invalid(
            """
import torch
import torch.nn.functional as F
for x, y in loader:
    probs = torch.sigmoid(model(x))
    loss = F.binary_cross_entropy_with_logits(probs, y)
    loss.backward()
""",
            line=4,
            column=13,
        ),
        # aliased import, a method sigmoid reshaped, a criterion object
        Invalid(
            """
from torch import nn
from torch.nn import functional as Fn

criterion = nn.BCEWithLogitsLoss(pos_weight=w)
out = Fn.sigmoid(head(x))
loss = criterion(out.view(-1), y.view(-1))
other = criterion(h.sigmoid().squeeze(1), y)
""",
            lines=(5, 7),
        ),
        # the model's last layer is a sigmoid: in forward, or ending a Sequential
        Invalid(
            """
import torch
from torch import nn

class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(128, 1)
        self.act = nn.Sigmoid()

    def forward(self, x):
        return self.act(self.fc(x))

disc = Discriminator()
seq = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid())
crit = nn.BCEWithLogitsLoss()
for x, y in loader:
    loss = crit(disc(x), y) + nn.functional.binary_cross_entropy_with_logits(seq(x), y)
""",
            lines=(11, 14),
        ),
        # torchvision's focal loss applies the sigmoid itself too
        Invalid(
            """
import torch
from torchvision.ops import sigmoid_focal_loss
scores = torch.sigmoid(cls_head(feats))
loss = sigmoid_focal_loss(scores, targets, reduction="mean")
""",
            line=3,
        ),
        # BCELoss fed the raw output of a linear layer
        Invalid(
            """
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.ReLU()
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        h = self.body(x)
        return self.head(h).squeeze(-1)

model = Net()
loss = nn.BCELoss()(model(x), y.float())
""",
            line=12,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        if not model.imports_module("torch"):
            return
        seen = Reported()
        for label, expr, layer in self._sinks(model):
            for node in layer_sources(model, expr, layer):
                if seen.first(node):
                    yield self.report(node, self._message(label, layer))

    @staticmethod
    def _message(label: str, layer: Layer) -> str:
        if layer is LINEAR:
            return (
                f"raw logits of a linear layer fed to `{label}`, which expects "
                "probabilities: use `BCEWithLogitsLoss`/`binary_cross_entropy_with_logits`"
            )
        return (
            f"sigmoid output fed to `{label}`, which applies the sigmoid itself: a double "
            "sigmoid; pass the logits"
        )

    def _sinks(self, model: FileModel) -> Iterator[tuple[str, ast.AST, Layer]]:
        """(label, the expression fed as the loss input, the layer it must not come from)."""
        out: list[tuple[ast.Call, str, ast.AST, Layer]] = []
        for funcs, layer in ((_LOGIT_FUNCS, SIGMOID), (_PROB_FUNCS, LINEAR)):
            for call in model.calls_to(*funcs):
                arg = (
                    call.args[0]
                    if call.args
                    else (keyword(call, "input") or keyword(call, "inputs"))
                )
                if arg is not None:
                    out.append((call, funcs[model.qualname(call.func) or ""], arg, layer))
        classes = {
            **{q: (n, SIGMOID) for q, n in _LOGIT_CLASSES.items()},
            **{q: (n, LINEAR) for q, n in _PROB_CLASSES.items()},
        }
        # criterion objects: `crit = nn.BCEWithLogitsLoss()` ... `crit(out, y)`
        names: set[str] = set()
        for key, binding in model.roles.all_of(Role.CRITERION):
            if binding.qualname in classes and isinstance(key[-1], str):
                names.add(key[-1].rsplit(".", 1)[-1])
        for name in names:
            for call in model.calls.get(name, ()):
                if not isinstance(call.func, (ast.Name, ast.Attribute)) or not call.args:
                    continue
                crit = model.roles.lookup(call.func)
                if crit is not None and crit.qualname in classes:
                    label, layer = classes[crit.qualname]
                    out.append((call, label, call.args[0], layer))
        # `nn.BCEWithLogitsLoss()(out, y)`
        for ctor in model.calls_to(*classes):
            parent = model.parent_of(ctor)
            if isinstance(parent, ast.Call) and parent.func is ctor and parent.args:
                label, layer = classes[model.qualname(ctor.func) or ""]
                out.append((parent, label, parent.args[0], layer))
        out.sort(key=lambda t: (t[0].lineno, t[0].col_offset))
        for _, label, expr, layer in out:
            yield label, expr, layer
