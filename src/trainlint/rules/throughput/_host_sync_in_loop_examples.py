"""TL401's examples: near-misses that stay silent and findings that must fire (kept
apart from the rule so that its module reads as the rule)."""

from __future__ import annotations

from trainlint.rules.base import Invalid, Valid

VALID: list[str | Valid] = [
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
    # CPU-only: nothing names a device, so reading the loss waits for nothing
    Valid(
        """
import torch
net = torch.nn.Linear(2, 1)
for epoch in range(10):
    for x, y in loader:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        print("loss", loss)
""",
        options={"allow-loss-item": False},
    ),
    # a number format of the 0-dim loss is one read of it, like `loss.item()`
    """
import torch
for epoch in range(epochs):
    for x, y in loader:
        loss = crit(model(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"epoch {epoch} loss {loss:.3f}")
""",
    # the value backpropagated is one number, whatever its name
    """
import torch
def train_step(self, batch):
    out = self.network(batch["data"].to(self.device))
    l = self.loss(out, batch["target"].to(self.device))
    l.backward()
    self.optimizer.step()
    return {"loss": l.detach().cpu().numpy()}
""",
    # one loop for both phases: the reads under `phase == "val"` never run on a
    # training step, so the train branch's read is the step's only one
    Valid(
        """
import torch
for phase in ("train", "val"):
    for x, y in loaders[phase]:
        out = model(x.cuda())
        loss = crit(out, y.cuda())
        if phase == "train":
            opt.zero_grad()
            loss.backward()
            opt.step()
            train_losses.append(loss.item())
        elif phase == "val":
            val_losses.append(loss.item())
            preds.extend(out.argmax(1).cpu().tolist())
""",
    ),
]

INVALID: list[Invalid] = [
    Invalid(
        """
import torch
for x, y in loader:
    opt.zero_grad()
    loss = crit(model(x.cuda()), y.cuda())
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
net = nn.Linear(4, 2).cuda()
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
    loss = crit(model(x.cuda()), y.cuda())
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
    loss = model(batch.cuda()).mean()
    loss.backward()
    opt.step()
    losses.append(loss.detach().cpu().item())
""",
        line=9,
        options={"allow-loss-item": False},
    ),
]

# a step method that other files call: its tensors come from them, device or not
INVALID.append(
    Invalid(
        """
import torch
class Task:
    def train_step(self, sample, model, criterion, optimizer):
        loss = criterion(model(sample["input"]), sample["target"])
        loss.backward()
        optimizer.step()
        self.total += loss.item()
""",
        line=7,
        options={"allow-loss-item": False},
    )
)

# N syncs per step: a per-sample loop over the model's outputs
INVALID.append(
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
