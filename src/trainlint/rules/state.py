"""TL7: state and safety."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.model import LOOP_NODES, FileModel, has_star_kwargs, is_false, keyword
from trainlint.analysis.steps import Event, Kind
from trainlint.rules.base import Invalid, Report, Rule, Valid

TORCH_LOAD = "torch.load"
TORCH_SAVE = "torch.save"


def _literal_path(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


class UnsafeTorchLoad(Rule):
    """## What it does
    Flags `torch.load(..., weights_only=False)` on a path that is not a literal this
    file itself saved with `torch.save`, and (as a warning) `torch.load` without an
    explicit `weights_only`.

    ## Why is this bad?
    This is a security rule. `torch.load` unpickles: with `weights_only=False` a
    checkpoint can run arbitrary code when it is loaded, so a downloaded or shared
    checkpoint is a remote-code-execution vector. Without the argument the behaviour
    depends on the torch version: before 2.6 the default was `False` (unsafe), since
    2.6 it is `True`, so the same line is unsafe on one machine and fails to load a
    whole pickled model on another.

    ## Example
    ```python
    state = torch.load(args.checkpoint, weights_only=False)
    model.load_state_dict(torch.load(path))
    ```

    ## Use instead
    ```python
    state = torch.load(args.checkpoint, weights_only=True)
    model.load_state_dict(torch.load(path, weights_only=True))
    ```
    Save state dicts (`model.state_dict()`), not whole modules, so `weights_only=True`
    can load them.

    ## Fix safety
    Adding `weights_only=True` where the argument is missing is safe: it is the
    default since torch 2.6, and on older versions it refuses to unpickle code instead
    of running it. An explicit `weights_only=False` is never changed automatically.

    ## Options
    - `require-explicit` (default `true`): also warn when `weights_only` is missing.
      Projects that require torch >= 2.6, where the default is already `True`, can
      set it to `false` to report only an explicit `weights_only=False`.

    ## References
    - [torch.load](https://pytorch.org/docs/stable/generated/torch.load.html)
    - [Python pickle security warning](https://docs.python.org/3/library/pickle.html)
    """

    code = "TL702"
    name = "unsafe-torch-load"
    message = "`torch.load(weights_only=False)` unpickles arbitrary code from this file"
    triggers = ("load",)
    fix_safety = "safe"
    options = {"require-explicit": True}
    valid = [
        "import torch\nstate = torch.load(path, weights_only=True)\n",
        "import torch\nstate = torch.load(path, map_location='cpu', **load_kwargs)\n",
        "import torch\nstate = torch.load(path, weights_only=args.trust)\n",
        # the project wrote this literal path itself, in this file
        "import torch\ntorch.save(model, 'ckpt/full.pt')\n"
        "model = torch.load('ckpt/full.pt', weights_only=False)\n",
        # shadowed: a local `torch` object
        "def restore(torch, path):\n    return torch.load(path)\n",
        # no torch at all: json.load, pickle-free config loading
        "import json\nwith open('cfg.json') as f:\n    cfg = json.load(f)\n",
        "import numpy as np\nw = np.load('w.npy')\n",
        Valid("import torch\nsd = torch.load(path)\n", options={"require-explicit": False}),
    ]
    invalid = [
        Invalid("import torch\nsd = torch.load(args.ckpt, weights_only=False)\n", line=2, column=6),
        Invalid(
            "from torch import load as tload\n\nsd = tload(path)\n",
            line=3,
            fixed="from torch import load as tload\n\nsd = tload(path, weights_only=True)\n",
        ),
        Invalid(
            "import torch\nmodel.load_state_dict(\n    torch.load(\n        ckpt,\n"
            "        map_location='cpu',\n    )\n)\n",
            line=3,
            fixed="import torch\nmodel.load_state_dict(\n    torch.load(\n        ckpt,\n"
            "        map_location='cpu', weights_only=True,\n    )\n)\n",
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        loads = model.calls_to(TORCH_LOAD)
        if not loads:
            return
        saved = {
            _literal_path(c.args[1] if len(c.args) > 1 else keyword(c, "f"))
            for c in model.calls_to(TORCH_SAVE)
        }
        saved.discard(None)
        for call in loads:
            weights_only = keyword(call, "weights_only")
            if weights_only is None:
                if not self.opts["require-explicit"] or has_star_kwargs(call):
                    continue  # may carry weights_only; cannot tell
                from trainlint.fix import add_keyword

                edit = add_keyword(model, call, "weights_only=True")
                yield self.report(
                    call,
                    "`torch.load` without `weights_only`: unpickles arbitrary code on "
                    "torch < 2.6; pass `weights_only=True`",
                    severity="warning",
                    fix=self.fix(edit, message="add `weights_only=True`") if edit else None,
                )
            elif is_false(weights_only):
                path = call.args[0] if call.args else keyword(call, "f")
                if _literal_path(path) in saved:
                    continue
                yield self.report(call)


def _same_module(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return True
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


class EvalModeNotRestored(Rule):
    """## What it does
    Flags `model.eval()` inside a training loop (typically validation in the epoch
    loop) when no `model.train()` follows before the next training step, on some path
    through the loop (the next iteration included).

    ## Why is this bad?
    `eval()` switches dropout off and makes batch-norm use its running statistics. If
    training resumes without `train()`, every epoch after the first validation trains
    with dropout disabled and frozen batch-norm statistics: the model overfits or stops
    improving, with no error, and only the learning curves hint at it.

    ## Example
    ```python
    model.train()
    for epoch in range(epochs):
        for x, y in loader:
            ...
        model.eval()
        validate(model, val_loader)
    ```

    ## Use instead
    ```python
    for epoch in range(epochs):
        model.train()
        for x, y in loader:
            ...
        model.eval()
        validate(model, val_loader)
    ```

    ## References
    - [torch.nn.Module.eval](https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.eval)
    """

    code = "TL701"
    name = "eval-mode-not-restored"
    message = "`eval()` in the training loop and no `train()` before the next training step"
    triggers = ("eval(",)
    confirm_with = "assert_weights_updated"
    valid = [
        """
import torch
for epoch in range(10):
    model.train()
    for x, y in loader:
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()
    model.eval()
    validate(model)
""",
        # train() restored inside the training helper
        """
import torch

def train_one_epoch(model, loader, opt):
    model.train()
    for x, y in loader:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

def evaluate(model, loader):
    model.eval()
    with torch.no_grad():
        for x, y in loader:
            model(x)

for epoch in range(10):
    train_one_epoch(model, loader, opt)
    evaluate(model, val_loader)
""",
        # nanoGPT: evaluation helper switches back itself
        """
import torch
@torch.no_grad()
def estimate_loss():
    model.eval()
    out = model(val_x)
    model.train()
    return out

while True:
    if it % eval_interval == 0:
        estimate_loss()
    loss = model(x).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
""",
        # final evaluation after training
        """
import torch
for epoch in range(10):
    for x, y in loader:
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()
model.eval()
""",
        # no torch
        """
for epoch in range(3):
    for x in data:
        x.backward()
        opt.step()
    model.eval()
""",
    ]
    invalid = [
        Invalid(
            """
import torch
model.train()
for epoch in range(10):
    for x, y in loader:
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        val = sum(crit(model(x), y).item() for x, y in val_loader)
""",
            line=8,
        ),
        Invalid(
            """
import torch.nn as nn
net = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))

def validate(net, loader):
    net.eval()
    return [net(x) for x, _ in loader]

def train(net, loader, opt):
    for x, y in loader:
        opt.zero_grad()
        net(x).sum().backward()
        opt.step()

for epoch in range(20):
    train(net, loader, opt)
    if epoch % 5 == 0:
        validate(net, val_loader)
""",
            line=5,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        steps = model.steps
        loops: list[tuple[ast.AST, list[tuple[Event, ...]]]] = []
        for ep in steps.epoch_loops:
            paths, precise = steps.loop_paths(ep)
            if precise:
                loops.append((ep, paths))
        for sl in steps.step_loops:
            if sl.precise and isinstance(sl.node, LOOP_NODES):
                loops.append((sl.node, sl.paths))
        seen: set[int] = set()
        for _loop, paths in loops:
            # What the start of an iteration looks like on every path: does some path
            # train before any train()? (for each eval target)
            for path in paths:
                for i, e in enumerate(path):
                    if e.kind is not Kind.EVAL or id(e.node) in seen:
                        continue
                    if self._trains_before_restore(path[i + 1 :], e.target) or any(
                        self._trains_before_restore(p, e.target) is True
                        and not self._restores_before_end(path[i + 1 :], e.target)
                        for p in paths
                    ):
                        seen.add(id(e.node))
                        yield self.report(e.node)

    @staticmethod
    def _trains_before_restore(events: tuple[Event, ...], target: str | None) -> bool:
        for e in events:
            if e.kind is Kind.TRAIN and _same_module(e.target, target):
                return False
            if e.kind is Kind.EVAL and _same_module(e.target, target):
                continue
            if e.kind in (Kind.BACKWARD, Kind.STEP):
                return True
        return False

    @staticmethod
    def _restores_before_end(events: tuple[Event, ...], target: str | None) -> bool:
        return any(e.kind is Kind.TRAIN and _same_module(e.target, target) for e in events)


RULES = [EvalModeNotRestored, UnsafeTorchLoad]
