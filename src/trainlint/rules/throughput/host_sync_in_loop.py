"""TL401 host-sync-in-loop."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.model import FileModel, call_name
from trainlint.analysis.steps import STEP_LOOP_TRIGGERS
from trainlint.analysis.syncs import HostSync, into_tensor, per_item, per_step_syncs
from trainlint.rules.base import Invalid, Report, Rule, Valid

_COST = "the CPU waits for the GPU queue to drain each batch"


class HostSyncInLoop(Rule):
    """## What it does
    Flags host-device synchronisations on every step of a training loop that cost
    throughput for nothing: a number read to the host only to be added back into a
    device tensor (`counts += x.sum().item()`), the same value read twice in a step,
    copies of whole tensors (`.cpu()`, `.cpu().numpy()`, `.tolist()` of a batch of
    predictions), and tensors formatted by `print(t)` or an f-string. Calls under a
    rate-limiting `if` (`step % N == 0`, a logging/main-process guard), after an early
    `return`/`continue` on such a guard, after the loop, and in validation loops are
    fine; so is an action copied to NumPy for `env.step(...)`, which needs host data.

    By default one read per step of each scalar that is only logged (`loss.item()`,
    `float(loss)`, `ent_coef.item()`, `loss.detach().cpu()`, `kl.mean().cpu()`) is
    accepted: it costs one sync per step, and reviewed training code does it on purpose
    almost everywhere. Set `allow-loss-item = false` to flag those too.

    ## Why is this bad?
    CUDA runs asynchronously: the Python loop normally queues the next batch's kernels
    while the GPU works. Reading a value on the host forces the CPU to wait until the
    queue drains, every step. When the host and the GPU take about as long per step,
    throughput drops by up to half, and nothing reports it. A read whose number goes
    straight back into a tensor, or formats a whole tensor, buys nothing for that wait.

    ## Example
    ```python
    tokens = torch.zeros((), device="cuda", dtype=torch.long)
    for batch in loader:
        ...
        loss.backward()
        optimizer.step()
        tokens += batch["mask"].sum().item()
        print("loss", loss)
    ```

    ## Use instead
    ```python
    tokens = torch.zeros((), device="cuda", dtype=torch.long)
    for step, batch in enumerate(loader):
        ...
        loss.backward()
        optimizer.step()
        tokens += batch["mask"].sum()
        if step % args.log_interval == 0:
            print(f"loss {loss.item():.4f}")
    ```

    ## Options
    - `allow-loss-item` (default `true`): accept one read per step of each scalar that
      is only logged: the loss, its parts, a metric. Set it to `false` to flag every
      per-step read, for a throughput-critical loop where even one sync per step
      matters (then also accumulate the loss with `.detach()` and read it every N
      steps).

    ## References
    - [CUDA semantics: asynchronous execution](https://pytorch.org/docs/stable/notes/cuda.html#asynchronous-execution)
    - [torch.cuda.set_sync_debug_mode](https://pytorch.org/docs/stable/generated/torch.cuda.set_sync_debug_mode.html)
    """

    code = "TL401"
    name = "host-sync-in-loop"
    message = f"host-device sync on every training step: {_COST}"
    triggers = STEP_LOOP_TRIGGERS
    options = {"allow-loss-item": True}
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
        # the number is read by float(); printing that Python float reads nothing more
        """
import torch
for step, (x, y) in enumerate(loader):
    loss = criterion(model(x.cuda()), y.cuda())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step}: loss {float(loss):.3f}")
""",
        # by default: one read per step of each logged scalar (a progress bar, an RL
        # algorithm's loss parts and a metric, a detached loss handed to the caller)
        """
import torch
for x, y in loader:
    opt.zero_grad()
    loss = crit(model(x), y)
    loss.backward()
    opt.step()
    pbar.set_postfix(loss=loss.item())
""",
        """
import torch
for batch in minibatches:
    pg_loss, v_loss = policy_loss(batch), value_loss(batch)
    loss = pg_loss + 0.5 * v_loss
    opt.zero_grad()
    loss.backward()
    opt.step()
    pg_losses.append(pg_loss.item())
    v_losses.append(float(v_loss))
    with torch.no_grad():
        kl = (batch.old_logp - policy.log_prob(batch)).mean().cpu().numpy()
    if kl > target_kl:
        break
""",
        """
import torch
def fit_batch(self, batch):
    loss = self.compute_loss(batch)
    loss.backward()
    self.optimizer.step()
    return loss.detach().cpu()
""",
        # an environment takes NumPy actions: the copy is the price of stepping it
        """
import torch
for global_step in range(total_steps):
    actions = actor(torch.as_tensor(obs, device=device))
    actions = actions.detach().cpu().numpy()
    obs, rewards, dones, infos = envs.step(actions)
    loss = critic_loss(replay.sample())
    opt.zero_grad()
    loss.backward()
    opt.step()
""",
        # an early exit on a logging guard rate-limits what follows it
        Valid(
            """
import torch
def train_step(self, batch):
    loss = self.model(batch).mean()
    loss.backward()
    self.optimizer.step()
    if not self.metrics.should_log(self.step):
        return
    self.logger.log(float(loss.item()), grad_norm.item())
""",
            options={"allow-loss-item": False},
        ),
        # on the way out of the loop: runs once, on the last step
        Valid(
            """
import torch
for step, batch in enumerate(loader):
    opt.zero_grad()
    model(batch.cuda()).sum().backward()
    opt.step()
    if step + 1 >= max_steps:
        done = torch.tensor([True], device="cuda")
        stop_all = gather(done).any().item()
        break
""",
            options={"allow-loss-item": False},
        ),
        # a tensor built on the CPU and converted to another dtype: no device to wait for
        Valid(
            """
import torch
for step, batch in enumerate(loader):
    opt.zero_grad()
    model(batch.cuda()).sum().backward()
    opt.step()
    pad = torch.as_tensor(pad_value).to(dtype=torch.float16).item()
""",
            options={"allow-loss-item": False},
        ),
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
            options={"allow-loss-item": False},
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
        # the number goes straight back into a device tensor: a round trip for nothing
        Invalid(
            """
import torch
counts = {"tokens": torch.zeros((), device="cuda", dtype=torch.long)}
for step in range(max_steps):
    batch = next(train_iter)
    opt.zero_grad()
    model(batch["ids"]).mean().backward()
    opt.step()
    counts["tokens"] += batch["mask"].sum().item()
""",
            line=8,
        ),
        # a copy that no environment needs is still a per-step copy
        Invalid(
            """
import torch
for global_step in range(total_steps):
    actions = actor(torch.as_tensor(obs, device=device))
    history.append(actions.detach().cpu().numpy())
    obs, rewards, dones, infos = envs.step(sample_actions())
    loss = critic_loss(replay.sample())
    opt.zero_grad()
    loss.backward()
    opt.step()
""",
            line=4,
        ),
        # the read is the sync; printing the number it returned waits for nothing
        Invalid(
            """
import torch
model = torch.nn.Linear(8, 2)
for x, y in loader:
    opt.zero_grad()
    loss = crit(model(x.cuda()), y.cuda())
    loss.backward()
    opt.step()
    value = loss.item()
    print(f"loss {value:.4f}", float(value))
""",
            line=8,
            options={"allow-loss-item": False},
        ),
        # one finding per statement, even for `.cpu().item()`; an early exit on a
        # condition that is not a rate limit still runs every step
        Invalid(
            """
import torch
for batch in loader:
    if batch is None:
        continue
    opt.zero_grad()
    loss = model(batch).mean()
    loss.backward()
    opt.step()
    losses.append(loss.detach().cpu().item())
""",
            line=9,
            options={"allow-loss-item": False},
        ),
    ]

    # (N syncs per step: a per-sample loop over the model's outputs)
    invalid.append(
        Invalid(
            """
import torch
net = torch.nn.Conv2d(3, 4, 1).cuda()
for images, masks in loader:
    images, masks = images.cuda(), masks.cuda()
    opt.zero_grad()
    outputs = net(images)
    loss = crit(outputs, masks)
    loss.backward()
    opt.step()
    for mask, out in zip(masks, outputs):
        scores.append(out.argmax(0).eq(mask).float().mean().item())
""",
            line=11,
        )
    )

    def check(self, model: FileModel) -> Iterator[Report]:
        if not model.steps.step_loops:
            return
        allow_scalars = bool(self.opts.get("allow-loss-item"))
        read: set[tuple[int, tuple[str, int]]] = set()
        reported: set[int] = set()
        for sync, loop, anchor in per_step_syncs(model):
            message = None
            if sync.kind == "scalar":
                again = sync.value is not None and (id(loop.node), sync.value) in read
                if sync.value is not None:
                    read.add((id(loop.node), sync.value))
                if into_tensor(model, sync.node):
                    message = (
                        f"{sync.what} on every training step only to add the number back "
                        f"into a device tensor: {_COST} for nothing; drop the read and "
                        "keep the sum on the device"
                    )
                elif again:
                    message = (
                        f"{sync.what} of `{sync.key}` a second time in the step: each read "
                        "waits for the GPU queue; read it once and reuse the number"
                    )
                elif allow_scalars and not per_item(model, sync.node, loop.node):
                    continue
            stmt = model.statement_of(anchor)
            if id(stmt) in reported:
                continue
            reported.add(id(stmt))
            if message is None and per_item(model, sync.node, loop.node):
                message = (
                    f"{sync.what} for each item of a step's tensor: one wait for the GPU "
                    "queue per sample, many per step; compute on the device over the "
                    "whole batch and read once"
                )
            yield self.report(anchor, message or self._message(model, sync, anchor))

    @staticmethod
    def _message(model: FileModel, sync: HostSync, anchor: ast.AST) -> str:
        where = ""
        if anchor is not sync.node and isinstance(anchor, ast.Call):
            helper = call_name(anchor)
            where = f" (in `{helper}()`)" if helper else ""
        if sync.kind == "format":
            return (
                f"{sync.what}{where} on every training step: formatting reads the tensor "
                f"from the GPU, so {_COST}; log a number read every N steps"
            )
        return (
            f"{sync.what}{where} on every training step: {_COST}; keep the value on "
            "the device or read it every N steps"
        )
