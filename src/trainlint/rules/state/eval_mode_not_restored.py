"""TL701 eval-mode-not-restored."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from trainlint.analysis.model import (
    FUNCTION_NODES,
    LOOP_NODES,
    FileModel,
    call_name,
    dotted,
    is_false,
)
from trainlint.analysis.steps import Event, Kind
from trainlint.rules.base import Invalid, Report, Rule


def _same_module(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return True
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


class EvalModeNotRestored(Rule):
    """## What it does
    Flags `model.eval()` inside a training loop (typically validation in the epoch
    loop) when no `model.train()` follows before the next training step, on some path
    through the loop (the next iteration included). When the `eval()` is inside an
    evaluation helper called from the loop, the finding is at that call. Helpers'
    parameters are matched to the caller's arguments (`train(net)` with
    `def train(model): model.train()` restores `net`). Not reported: a mode that follows
    a flag (`net.train() if is_train else net.eval()`), and modules training does not
    update: an EMA/SWA copy, a `deepcopy`, a model rebuilt in the loop from a state
    dict, a teacher or target network, a module frozen with `requires_grad_(False)`.

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
    message = (
        "`eval()` in the training loop and no `train()` before the next training step: dropout and batch norm stay in eval mode; call `.train()` after evaluating"
    )
    triggers = ("eval(",)
    confirm_with = None  # weights still update in eval mode
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
        # the training helper names its parameter differently from the evaluation one
        """
import torch
from torch import nn

def train_epoch(network, loader, opt):
    network.train()
    for x, y in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(network(x), y).backward()
        opt.step()

def evaluate(model, loader):
    model.eval()
    with torch.no_grad():
        return sum(model(x).argmax(1).eq(y).sum().item() for x, y in loader)

net = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.2))
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for epoch in range(10):
    train_epoch(net, train_loader, opt)
    evaluate(net, val_loader)
""",
        # one epoch function for both phases: the mode follows the flag
        """
import torch
import torch.nn.functional as F

def run_epoch(net, loader, opt, is_train):
    net.train() if is_train else net.eval()
    for x, y in loader:
        loss = F.cross_entropy(net(x), y)
        if is_train:
            opt.zero_grad()
            loss.backward()
            opt.step()

for epoch in range(10):
    run_epoch(net, train_loader, opt, True)
    run_epoch(net, val_loader, opt, False)
""",
        # evaluating the EMA copy leaves the trained model alone
        """
import copy
import torch

ema_model = copy.deepcopy(model)
for epoch in range(10):
    model.train()
    for x, y in loader:
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()
        update_ema(ema_model, model)
    ema_model.eval()
    evaluate(ema_model, val_loader)
""",
        # a frozen text encoder is kept in eval mode on purpose
        """
import torch

text_encoder.requires_grad_(False)
for epoch in range(10):
    unet.train()
    text_encoder.eval()
    for batch in loader:
        with torch.no_grad():
            cond = text_encoder(batch["ids"])
        loss = unet(batch["latents"], cond).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
""",
        # a fresh model rebuilt from the weights for evaluation
        """
import torch

for epoch in range(10):
    model.train()
    for x, y in loader:
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()
    eval_net = Net()
    eval_net.load_state_dict(model.state_dict())
    eval_net.eval()
    evaluate(eval_net, val_loader)
""",
        # sample grids from the EMA copy and the live model; the step restores train()
        """
import torch

class Trainer:
    def train_step(self):
        self.vae.train()
        loss = self.vae(next(self.dl))
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        if self.steps % 100 == 0:
            for model, tag in ((self.ema_vae.ema_model, "ema"), (self.vae, "live")):
                model.eval()
                save(model(next(self.dl)), tag)

    def train(self):
        while self.steps < self.num_steps:
            self.train_step()
            self.steps += 1
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
            line=17,
        ),
        # the helper restores train() on one branch only
        Invalid(
            """
import torch

@torch.no_grad()
def sample_text(model, prompt, limit):
    model.eval()
    if len(prompt) < limit:
        out = model.generate(prompt)
        model.train()
        return out
    return None

for step, (x, y) in enumerate(loader):
    loss = model(x, y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    if step % 500 == 0:
        sample_text(model, prompt, 1024)
""",
            line=18,
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
        reported: set[int] = set()
        frozen: set[str] | None = None
        for _loop, paths in loops:
            # targets as the loop's own scope names them (helper parameters mapped back
            # to the arguments of the calls that reach them)
            resolved = [tuple(_resolved_target(model, e) for e in path) for path in paths]
            for path, names in zip(paths, resolved, strict=True):
                for i, e in enumerate(path):
                    if e.kind is not Kind.EVAL or id(e.node) in seen:
                        continue
                    if _switched_by_flag(model, e.node):
                        continue  # `net.train() if is_train else net.eval()`
                    if frozen is None:
                        frozen = _frozen(model)
                    # resolved names are the loop's own: look them up where it calls in
                    at = e.chain[0] if e.chain else e.node
                    left = [t for t in _eval_targets(model, e, names[i])
                            if not _copy_or_frozen(model, at, t, frozen)]
                    rest = list(zip(path[i + 1 :], names[i + 1 :], strict=True))
                    if not any(
                        self._trains_before_restore(rest, t) or any(
                            self._trains_before_restore(list(zip(p, n, strict=True)), t) is True
                            and not self._restores_before_end(rest, t)
                            for p, n in zip(paths, resolved, strict=True)
                        )
                        for t in left
                    ):
                        continue
                    seen.add(id(e.node))
                    anchor = steps.anchor(e)
                    if id(anchor) in reported:
                        continue
                    reported.add(id(anchor))
                    if anchor is e.node:
                        yield self.report(e.node)
                    else:
                        what = f"`{left[0]}`" if len(left) == 1 and left[0] else "the model"
                        yield self.report(anchor, _HELPER_MESSAGE.format(what=what), related=(
                            (e.node, "`eval()` here, with no `train()` after it"),
                        ))

    @staticmethod
    def _trains_before_restore(events: list[tuple[Event, str | None]], target: str | None) -> bool:
        for e, name in events:
            if e.kind is Kind.TRAIN and _same_module(name, target):
                return False
            if e.kind is Kind.EVAL and _same_module(name, target):
                continue
            if e.kind in (Kind.BACKWARD, Kind.STEP):
                return True
        return False

    @staticmethod
    def _restores_before_end(events: list[tuple[Event, str | None]], target: str | None) -> bool:
        return any(e.kind is Kind.TRAIN and _same_module(n, target) for e, n in events)


_HELPER_MESSAGE = (
    "this call leaves {what} in eval mode (its `eval()` has no `train()` after it) before the next training step: dropout and batch norm stay in eval mode; call `.train()` after evaluating"
)
#: Modules that are copies of the trained one or frozen on purpose: an EMA/SWA average,
#: a distillation teacher, an RL target network, a frozen reference model.
_COPY_WORD = re.compile(
    r"(^|_)(ema|teacher|frozen|averaged|swa|shadow|target|ref|reference)(_|$)", re.IGNORECASE
)
_COPY_CALLS = re.compile(r"deepcopy|AveragedModel|EMA|Ema|clone_model|copy_model")


def _resolved_target(model: FileModel, e: Event) -> str | None:
    return _resolve(model, e.target, e.chain)


def _resolve(model: FileModel, target: str | None, chain: tuple[ast.Call, ...]) -> str | None:
    """``target`` with helper parameters replaced by the arguments at the calls that
    inlined the helper (``validate(net)`` with ``def validate(model)``: ``model`` is
    ``net``); None when an argument is not a plain name."""
    for site in reversed(chain):
        if target is None:
            return None
        fn = model.resolve_call(site)
        if fn is None:
            return target
        root, _, rest = target.partition(".")
        params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
        if params and params[0] in ("self", "cls") and isinstance(site.func, ast.Attribute):
            if root == params[0]:
                recv = dotted(site.func.value)
                target = None if recv is None else recv + ("." + rest if rest else "")
                continue
            params = params[1:]
        arg: ast.AST | None = None
        if root in params:
            idx = params.index(root)
            if idx < len(site.args) and not any(isinstance(a, ast.Starred) for a in site.args[: idx + 1]):
                arg = site.args[idx]
            else:
                arg = next((k.value for k in site.keywords if k.arg == root), None)
            if arg is None:
                return None
        elif root in {a.arg for a in fn.args.kwonlyargs}:
            arg = next((k.value for k in site.keywords if k.arg == root), None)
            if arg is None:
                return None
        else:
            continue  # a global or `self.x` of the same object: same name outside
        base = dotted(arg)
        target = None if base is None else base + ("." + rest if rest else "")
    return target


def _eval_targets(model: FileModel, e: Event, resolved: str | None) -> list[str | None]:
    """The modules an ``eval()`` switches: ``for net, tag in ((ema, "ema"), (model,
    "live")): net.eval()`` switches each element of the literal it loops over."""
    if e.target is None or "." in e.target:
        return [resolved]
    for anc in model.ancestors(e.node):
        if isinstance(anc, (*FUNCTION_NODES, ast.ClassDef)):
            break
        if not isinstance(anc, (ast.For, ast.AsyncFor)) or not isinstance(
            anc.iter, (ast.Tuple, ast.List)
        ):
            continue
        pos = _binding_position(anc.target, e.target)
        if pos is None:
            continue
        out: list[str | None] = []
        for elt in anc.iter.elts:
            for i in pos:
                if not isinstance(elt, (ast.Tuple, ast.List)) or i >= len(elt.elts):
                    break
                elt = elt.elts[i]
            # a module the step model does not see as one: its `train()` calls are not
            # events either, so whether it is restored cannot be told
            if model.steps._is_model(elt):
                out.append(_resolve(model, dotted(elt), e.chain))
        return out
    return [resolved]


def _binding_position(target: ast.AST, name: str) -> list[int] | None:
    if isinstance(target, ast.Name):
        return [] if target.id == name else None
    if isinstance(target, (ast.Tuple, ast.List)):
        for i, t in enumerate(target.elts):
            inner = _binding_position(t, name)
            if inner is not None:
                return [i, *inner]
    return None


def _switched_by_flag(model: FileModel, node: ast.AST) -> bool:
    """``X.train() if flag else X.eval()`` (or the other way round): the mode follows the
    flag, and the training call passes True."""
    parent = model.parent_of(node)
    if not isinstance(parent, ast.IfExp):
        return False
    other = parent.body if parent.orelse is node else parent.orelse
    return isinstance(other, ast.Call) and call_name(other) == "train"


def _copy_or_frozen(model: FileModel, node: ast.AST, target: str | None,
                    frozen: set[str]) -> bool:
    """Is ``target`` a module training does not update: a copy of the trained model (an
    EMA/SWA average, a `deepcopy`, a model rebuilt in the loop from a state dict), a
    teacher or target network, or a module frozen with `requires_grad_(False)`?"""
    if target is None:
        return False
    if any(_COPY_WORD.search(part) for part in target.split(".")):
        return True
    if target in frozen:
        return True
    if "." in target:
        return False
    found = model.flow.definition(target, node)
    if found is None or not isinstance(found[0], ast.Assign):
        return False
    stmt, value = found
    if isinstance(value, ast.Call) and _COPY_CALLS.search(call_name(value) or ""):
        return True
    # bound afresh inside a loop that also runs the eval(): a new object every time
    fn = model.function_of(node)
    loops = {id(lp) for lp in model.enclosing_loops(node)}
    rewraps = any(isinstance(sub, ast.Name) and sub.id == target for sub in ast.walk(value))
    return isinstance(value, ast.Call) and not rewraps and model.function_of(stmt) is fn and any(
        id(anc) in loops for anc in model.ancestors(stmt)
    )


def _frozen(model: FileModel) -> set[str]:
    """Modules the file freezes whole: ``X.requires_grad_(False)``, or ``p.requires_grad =
    False`` / ``p.requires_grad_(False)`` for every ``p`` of a loop over ``X.parameters()``
    (not under an ``if``: freezing some parameters leaves the module trained). A module
    with something unfrozen again (``X.head.requires_grad_(True)``) is not frozen."""
    frozen: set[str] = set()
    unfrozen: set[str] = set()
    for call in model.calls.get("requires_grad_", ()):
        if not isinstance(call.func, ast.Attribute):
            continue
        off = bool(call.args) and is_false(call.args[0])
        names = _frozen_owners(model, call, dotted(call.func.value))
        (frozen if off else unfrozen).update(names)
    for node in model.assignments:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(
            node.targets[0], ast.Attribute
        ) and node.targets[0].attr == "requires_grad" and isinstance(node.value, ast.Constant):
            names = _frozen_owners(model, node, dotted(node.targets[0].value))
            (frozen if node.value.value is False else unfrozen).update(names)
    return {f for f in frozen
            if not any(u == f or u.startswith(f + ".") for u in unfrozen)}


def _frozen_owners(model: FileModel, node: ast.AST, name: str | None) -> list[str]:
    """The module a ``requires_grad`` change at ``node`` on ``name`` applies to: ``name``
    itself, or ``X`` when ``name`` is the loop variable of ``for p in X.parameters()``
    and the change is unconditional in that loop."""
    if name is None:
        return []
    conditional = False
    for anc in model.ancestors(node):
        if isinstance(anc, (*FUNCTION_NODES, ast.ClassDef)):
            break
        if isinstance(anc, (ast.If, ast.IfExp)):
            conditional = True
        if isinstance(anc, (ast.For, ast.AsyncFor)):
            bound = anc.target.elts[-1] if isinstance(anc.target, ast.Tuple) and (
                anc.target.elts
            ) else anc.target
            if isinstance(bound, ast.Name) and bound.id == name:
                return [] if conditional else _parameters_owner(anc.iter)
            break
    return [name]


def _parameters_owner(it: ast.AST) -> list[str]:
    """``X`` in ``X.parameters()`` (through ``enumerate``/``named_parameters``)."""
    while isinstance(it, ast.Call) and call_name(it) == "enumerate" and it.args:
        it = it.args[0]
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and it.func.attr in (
        "parameters", "named_parameters"
    ):
        name = dotted(it.func.value)
        return [name] if name is not None else []
    return []
