"""TL701 eval-mode-not-restored."""

from __future__ import annotations

from collections.abc import Iterator

from trainlint.analysis.model import FileModel
from trainlint.analysis.modes import (
    copy_or_frozen,
    eval_targets,
    frozen_modules,
    hooks_left_in_eval,
    left_in_eval,
    outside_optimizers,
    resolved_target,
    restored_or_ended,
    restores_saved_mode,
    switched_by_flag,
    training_ends_after,
)
from trainlint.analysis.paths import precise_loop_paths
from trainlint.analysis.steps import Kind
from trainlint.edits import append_to_block
from trainlint.rules.base import Invalid, Report, Rule


class EvalModeNotRestored(Rule):
    """## What it does
    Flags `model.eval()` inside a training loop (typically validation in the epoch
    loop) when no `model.train()` follows before the next training step, on some path
    through the loop (the next iteration included). When the `eval()` is inside an
    evaluation helper called from the loop, the finding is at that call. Helpers'
    parameters are matched to the caller's arguments (`train(net)` with
    `def train(model): model.train()` restores `net`). Not reported: a mode that follows
    a flag (`net.train() if is_train else net.eval()`); a helper that restores the mode
    it saved (`was_training = net.training ... if was_training: net.train()`); an
    `eval()` after which every way on restores `train()` or leaves the loop (early
    stopping: `break`, `return`);
    and modules training does not update: an EMA/SWA copy, a `deepcopy`, a model rebuilt
    in the loop from a state dict, a teacher or target network, a module frozen with
    `requires_grad_(False)`, a module none of the file's optimizers holds (the backbone
    of a linear probe, when every optimizer stepped is built in the file). A framework's
    validation begin hook (`train_validation_begin`) that calls `eval()` is reported when
    its end hook does not call `train()` and only an epoch begin hook does.

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

    ## Fix safety
    The fix adds `model.train()` (the module the `eval()` switched) as the last statement
    of the block that holds the `eval()` or the evaluation call, so training resumes in
    training mode; only the bug changes, so it is safe. It is left undone when the
    `eval()` switches several modules or an unnamed one, or a `return`, `break`, `raise`
    or `try` after it in the block could skip the new line.

    ## References
    - [torch.nn.Module.eval](https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.eval)
    """

    code = "TL701"
    name = "eval-mode-not-restored"
    message = "`eval()` in the training loop and no `train()` before the next training step: dropout and batch norm stay in eval mode; call `.train()` after evaluating"
    triggers = ("eval(",)
    fix_safety = "safe"
    confirm_with = None  # weights still update in eval mode
    valid = [
        "for e in range(3):\n    for x in data:\n        x.backward()\n    model.eval()\n",  # no torch
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
            fixed="""
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
    model.train()
""",
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
            fixed="""
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
        net.train()
""",
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
            fixed="""
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
        model.train()
""",
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        steps = model.steps
        seen: set[int] = set()
        reported: set[int] = set()
        frozen: set[str] | None = None
        for loop, paths in precise_loop_paths(model):
            # targets as the loop's own scope names them (helper parameters mapped back
            # to the arguments of the calls that reach them)
            resolved = [tuple(resolved_target(model, e) for e in path) for path in paths]
            for path, names in zip(paths, resolved, strict=True):
                for i, e in enumerate(path):
                    if e.kind is not Kind.EVAL or id(e.node) in seen:
                        continue
                    if switched_by_flag(model, e.node):
                        continue  # `net.train() if is_train else net.eval()`
                    if restores_saved_mode(model, e):
                        continue  # `if was_training: net.train()` after evaluating
                    if frozen is None:
                        frozen = frozen_modules(model)
                    # resolved names are the loop's own: look them up where it calls in
                    at = e.chain[0] if e.chain else e.node
                    if training_ends_after(model, at, loop, names[i]) or restored_or_ended(
                        model, at, loop, names[i]
                    ):
                        continue  # early stopping (`net.eval(); break`), or restored
                    left = [
                        t
                        for t in eval_targets(model, e, names[i])
                        if not copy_or_frozen(model, at, t, frozen)
                        and not outside_optimizers(model, t)
                    ]
                    rest = list(zip(path[i + 1 :], names[i + 1 :], strict=True))
                    if not any(left_in_eval(rest, paths, resolved, t) for t in left):
                        continue
                    seen.add(id(e.node))
                    anchor = steps.anchor(e)
                    if id(anchor) in reported:
                        continue
                    reported.add(id(anchor))
                    fix = None
                    if len(left) == 1 and left[0]:
                        edit = append_to_block(model, model.statement_of(at), f"{left[0]}.train()")
                        fix = (
                            self.fix(edit, message=f"call `{left[0]}.train()` after evaluating")
                            if edit is not None
                            else None
                        )
                    if anchor is e.node and e.via is None:
                        yield self.report(e.node, fix=fix)
                    else:  # in a helper (of another file: `via`, the anchor is its call)
                        what = f"`{left[0]}`" if len(left) == 1 and left[0] else "the model"
                        yield self.report(
                            anchor,
                            _HELPER_MESSAGE.format(what=what),
                            related=((e.node, "`eval()` here, with no `train()` after it"),)
                            if e.via is None
                            else (),
                            fix=fix,
                        )
        for call in hooks_left_in_eval(model):  # the loop that drives them is elsewhere
            if id(call) not in seen and id(call) not in reported:
                yield self.report(call, _HOOK_MESSAGE)


_HOOK_MESSAGE = "`eval()` in a validation begin hook whose end hook never calls `train()`: after a validation in the middle of an epoch, training runs in eval mode until the next epoch; call `.train()` in the end hook"
_HELPER_MESSAGE = "this call leaves {what} in eval mode (its `eval()` has no `train()` after it) before the next training step: dropout and batch norm stay in eval mode; call `.train()` after evaluating"
