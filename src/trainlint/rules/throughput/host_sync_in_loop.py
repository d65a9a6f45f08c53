"""TL401 host-sync-in-loop."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.flow import Taint
from trainlint.analysis.model import FileModel, call_name, dotted
from trainlint.analysis.paths import Reported
from trainlint.analysis.steps import STEP_LOOP_TRIGGERS, backward_calls, backward_value
from trainlint.rules.base import Invalid, Report, Rule, Valid

_SYNC_METHODS = {"item", "cpu", "numpy", "tolist"}


def _from_batch(model: FileModel, expr: ast.AST) -> bool:
    for sub in ast.walk(expr):
        if isinstance(sub, ast.Name):
            found = model.flow.definition(sub.id, sub)
            if found is not None and isinstance(found[0], (ast.For, ast.AsyncFor)):
                it = found[0].iter
                if isinstance(it, ast.Call) and call_name(it) == "range":
                    return False
                return True
    return False


def _outer_call_name(model: FileModel, call: ast.Call) -> str | None:
    """``x.cpu().numpy()``: for the inner call, "numpy"."""
    attr = model.parent_of(call)
    outer = model.parent_of(attr) if isinstance(attr, ast.Attribute) else None
    return call_name(outer) if isinstance(outer, ast.Call) and outer.func is attr else None


def _param_gets_tensor(model: FileModel, expr: ast.AST) -> bool:
    """A helper's parameter that some same-file call site fills with a model-derived
    tensor: `update_meters(meters, loss)` then `float(loss)` inside the helper."""
    if not isinstance(expr, ast.Name):
        return False
    fn = model.function_of(expr)
    found = model.flow.definition(expr.id, expr) if fn is not None else None
    if found is None or found[0] is not fn:
        return False  # reassigned inside the helper
    params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
    if expr.id not in params:
        return False
    index = params.index(expr.id)
    for site in model.call_sites.get(id(fn), ()):
        offset = 1 if params and params[0] in ("self", "cls") and isinstance(
            site.func, ast.Attribute) else 0
        args = {kw.arg: kw.value for kw in site.keywords}
        arg = args.get(expr.id)
        if arg is None and 0 <= index - offset < len(site.args):
            arg = site.args[index - offset]
        if arg is not None and model.flow.value(arg).taint in (Taint.GRAD, Taint.CUT):
            return True
    return False


def _device_tensor(model: FileModel, expr: ast.AST, *, lenient: bool) -> bool:
    """Is ``expr`` (probably) a tensor on an accelerator? Model-derived values are; batch
    data only once moved with `.to(...)`/`.cuda()`; unknown values only for `.item()`."""
    if isinstance(expr, ast.Constant):
        return False
    v = model.flow.value(expr)
    if v.taint in (Taint.GRAD, Taint.CUT):
        return True
    if v.taint is Taint.DATA:
        return _moved_to_device(model, expr)
    return lenient and not _moved_to_cpu_data(model, expr)


def _moved_to_device(model: FileModel, expr: ast.AST) -> bool:
    for sub in ast.walk(expr):
        if isinstance(sub, ast.Call) and call_name(sub) in ("to", "cuda"):
            return True
        if isinstance(sub, ast.Name):
            found = model.flow.definition(sub.id, sub)
            if found is not None and isinstance(found[1], ast.AST) and any(
                isinstance(c, ast.Call) and call_name(c) in ("to", "cuda")
                for c in ast.walk(found[1])
            ):
                return True
    return False


def _moved_to_cpu_data(model: FileModel, expr: ast.AST) -> bool:
    return _from_batch(model, expr) and not _moved_to_device(model, expr)


class HostSyncInLoop(Rule):
    """## What it does
    Flags host-device synchronisations on every step of a training loop: `.item()`,
    `.cpu()`, `.numpy()`, `.tolist()`, `float(t)`/`int(t)` of a tensor, and `print(t)`
    or an f-string of a tensor. Calls under a rate-limiting `if` (`step % N == 0`, a
    logging/main-process guard), after the loop, and in validation loops are fine.

    ## Why is this bad?
    CUDA runs asynchronously: the Python loop normally queues the next batch's kernels
    while the GPU works. Reading a value on the host forces the CPU to wait until the
    queue drains, every step. Throughput drops by 10-30% on a GPU-bound model and far
    more with small kernels, and nothing reports it; a progress bar updated with
    `loss.item()` each batch is the classic case.

    ## Example
    ```python
    for x, y in loader:
        ...
        loss.backward()
        optimizer.step()
        pbar.set_postfix(loss=loss.item())
    ```

    ## Use instead
    ```python
    for step, (x, y) in enumerate(loader):
        ...
        loss.backward()
        optimizer.step()
        if step % args.log_interval == 0:
            pbar.set_postfix(loss=loss.item())
    ```

    ## Options
    - `allow-loss-item` (default `false`): accept one `.item()` of the loss per step, for
      teams that want exact per-step loss logging and accept its cost.

    ## References
    - [CUDA semantics: asynchronous execution](https://pytorch.org/docs/stable/notes/cuda.html#asynchronous-execution)
    - [torch.cuda.set_sync_debug_mode](https://pytorch.org/docs/stable/generated/torch.cuda.set_sync_debug_mode.html)
    """

    code = "TL401"
    name = "host-sync-in-loop"
    message = "host-device sync on every training step: the GPU queue drains each batch"
    triggers = STEP_LOOP_TRIGGERS
    options = {"allow-loss-item": False}
    confirm_with = "assert_step_time_stable"
    valid = [
        """
import torch
for step, (x, y) in enumerate(loader):
    opt.zero_grad()
    loss = crit(model(x), y)
    loss.backward()
    opt.step()
    if step % 100 == 0:
        print(f"loss {loss.item():.4f}")
""",
        # after the loop, and in validation
        """
import torch
for x, y in loader:
    opt.zero_grad()
    loss = crit(model(x), y)
    loss.backward()
    opt.step()
print(loss.item())
with torch.no_grad():
    for x, y in val_loader:
        acc = (model(x).argmax(1) == y).float().mean().item()
""",
        Valid(
            """
import torch
for x, y in loader:
    opt.zero_grad()
    loss = crit(model(x), y)
    loss.backward()
    opt.step()
    losses.append(loss.item())
""",
            options={"allow-loss-item": True},
        ),
        # python numbers, not tensors
        """
import torch
for i in range(100):
    opt.zero_grad()
    model(batch).sum().backward()
    opt.step()
    lr = float(sched.get_last_lr()[0])
    print(i)
""",
        # no torch
        """
for x in items:
    total += x.item()
    x.backward()
    opt.step()
""",
    ]
    invalid = [
        Invalid(
            """
import torch
for x, y in loader:
    opt.zero_grad()
    loss = crit(model(x), y)
    loss.backward()
    opt.step()
    pbar.set_postfix(loss=loss.item())
""",
            line=7,
        ),
        Invalid(
            """
import torch.nn.functional as F
from torch import nn
net = nn.Linear(4, 2)
for epoch in range(5):
    for x, y in train_loader:
        opt.zero_grad()
        logits = net(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()
        opt.step()
        print(f"loss={loss}")
        preds = logits.argmax(1).cpu().numpy()
""",
            lines=(11, 12),
        ),
        Invalid(
            """
import torch
for x, y in loader:
    opt.zero_grad()
    loss = crit(model(x), y)
    loss.backward()
    opt.step()
    history.append(loss.item())
    running += loss.item()
""",
            line=8,
            options={"allow-loss-item": True},
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        if not model.steps.step_loops:
            return
        allow_loss = bool(self.opts.get("allow-loss-item"))
        allowed_once: set[int] = set()
        seen = Reported()
        for call, loss_item in self._syncs(model):
            found = model.steps.per_step(call)
            if found is None:
                continue
            loop, anchor = found
            if allow_loss and loss_item and id(loop) not in allowed_once:
                allowed_once.add(id(loop))
                continue
            if seen.first(anchor):
                yield self.report(anchor)

    def _syncs(self, model: FileModel) -> Iterator[tuple[ast.AST, bool]]:
        """(sync node, whether it is an .item() of a backpropagated loss), in source order."""
        losses = {
            dotted(v) for c in backward_calls(model)
            if (v := backward_value(model, c)) is not None and dotted(v)
        }
        found: list[tuple[ast.AST, bool]] = []
        for name in _SYNC_METHODS:
            for call in model.calls.get(name, ()):
                func = call.func
                if not isinstance(func, ast.Attribute) or call.args or call.keywords:
                    continue
                recv = func.value
                if name == "numpy":
                    # .numpy() needs a CPU tensor: only a .cpu() right before it syncs
                    if not (isinstance(recv, ast.Call) and call_name(recv) == "cpu"):
                        continue
                    recv = recv.func.value  # type: ignore[attr-defined]
                elif name == "cpu" and _outer_call_name(model, call) in ("numpy", "tolist"):
                    continue  # `.cpu().numpy()`: one sync, reported at the outer call
                if _device_tensor(model, recv, lenient=name in ("item", "cpu", "numpy")):
                    found.append((call, name == "item" and dotted(recv) in losses))
        for call in model.calls_to("builtins.float", "builtins.int", "builtins.print"):
            args = call.args
            if any(self._tensor_arg(model, a) for a in args):
                found.append((call, False))
        for node in ast.walk(model.tree):
            if isinstance(node, ast.JoinedStr):
                parent = model.parent_of(node)
                if isinstance(parent, ast.Call) and call_name(parent) == "print":
                    continue  # reported as print(...) if it formats a tensor
                if any(
                    isinstance(v, ast.FormattedValue) and self._tensor_arg(model, v.value)
                    for v in node.values
                ):
                    found.append((node, False))
        found.sort(key=lambda f: (getattr(f[0], "lineno", 0), getattr(f[0], "col_offset", 0)))
        return iter(found)

    @staticmethod
    def _tensor_arg(model: FileModel, expr: ast.AST) -> bool:
        if isinstance(expr, ast.JoinedStr):
            return any(
                isinstance(v, ast.FormattedValue) and HostSyncInLoop._tensor_arg(model, v.value)
                for v in expr.values
            )
        if isinstance(expr, ast.Call) and call_name(expr) in _SYNC_METHODS:
            return False  # the inner .item() is the sync, reported on its own
        v = model.flow.value(expr)
        if v.taint in (Taint.GRAD, Taint.CUT):
            return True
        return v.taint is Taint.UNKNOWN and _param_gets_tensor(model, expr)
