"""TL601-TL604 beyond their embedded examples: realistic AMP trainers (seed 001), correlated
mode flags, and the near-misses that must stay silent."""

from __future__ import annotations

import pytest

from trainlint.rule_testing import example_params, lint_example, run_example
from trainlint.rules import builtin_rules
from trainlint.rules.numerics import (
    RULES,
    BackwardInsideAutocast,
    ClipBeforeUnscale,
    ScalerStepBypassed,
    SoftmaxIntoCrossEntropy,
)

_REGISTERED = {r.code for r in builtin_rules()} >= {r.code for r in RULES}


@pytest.mark.skipif(_REGISTERED, reason="covered by test_rule_examples once registered")
@pytest.mark.parametrize(("rule", "example"), example_params(RULES))
def test_embedded_example(rule, example):
    run_example(rule, example)


def lines(rule, source: str) -> list[int]:
    return sorted(f.line for f in lint_example(rule, source))


# Seed 001 as first written: the clip sits in a helper called after the scaled backward.
SEED_BUGGY = """
import torch

class EnergyTrainer:
    def __init__(self, model, cfg):
        self.model = model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        self.scaler = torch.cuda.amp.GradScaler()

    def _apply_gradient_control(self):
        torch.nn.utils.clip_grad_norm_(self.optimizer.param_groups[0]["params"], max_norm=0.1)

    def train_step(self, batch):
        self.optimizer.zero_grad()
        with torch.cuda.amp.autocast():
            loss = self.model(batch).mean()
            self.scaler.scale(loss).backward()
        self._apply_gradient_control()
        self.scaler.step(self.optimizer)
        self.scaler.update()
"""

# The seed's fix: unscale when a scaler exists, then clip; a finiteness check after.
SEED_FIXED = """
import torch

class EnergyTrainer:
    def __init__(self, model, cfg):
        self.model = model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        self.scaler = torch.cuda.amp.GradScaler() if cfg.amp else None

    def _apply_gradient_control(self):
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self.optimizer.param_groups[0]["params"], max_norm=0.1)
        for param in self.optimizer.param_groups[0]["params"]:
            if param.grad is not None:
                if not torch.isfinite(param.grad).all():
                    param.grad = None
                    return False
        return True

    def train_step(self, batch):
        self.optimizer.zero_grad()
        with torch.cuda.amp.autocast(enabled=self.scaler is not None):
            loss = self.model(batch).mean()
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()
        if not self._apply_gradient_control():
            return None
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        return loss.item()
"""


def test_seed_001_buggy_trainer():
    assert lines(ClipBeforeUnscale, SEED_BUGGY) == [17]  # the helper's call site
    assert lines(BackwardInsideAutocast, SEED_BUGGY) == [16]
    assert lines(ScalerStepBypassed, SEED_BUGGY) == []


def test_seed_001_fixed_trainer_is_silent():
    for rule in RULES:
        assert lines(rule, SEED_FIXED) == [], rule.code


NANOGPT = """
import torch
from contextlib import nullcontext

ctx = nullcontext() if device_type == "cpu" else torch.amp.autocast(device_type=device_type)
scaler = torch.cuda.amp.GradScaler(enabled=(dtype == "float16"))
while True:
    for micro_step in range(gradient_accumulation_steps):
        with ctx:
            logits, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps
        X, Y = get_batch("train")
        scaler.scale(loss).backward()
    if grad_clip != 0.0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
"""


def test_nanogpt_loop_is_silent():
    for rule in RULES:
        assert lines(rule, NANOGPT) == [], rule.code


def test_backward_inside_a_named_autocast_context():
    src = NANOGPT.replace(
        "            loss = loss / gradient_accumulation_steps\n",
        "            loss = loss / gradient_accumulation_steps\n"
        "            scaler.scale(loss).backward()\n",
    ).replace("        X, Y = get_batch(\"train\")\n        scaler.scale(loss).backward()\n",
              "        X, Y = get_batch(\"train\")\n")
    assert lines(BackwardInsideAutocast, src) == [11]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        pytest.param(
            """
import torch
scaler = torch.cuda.amp.GradScaler(enabled=use_amp)
for x, y in loader:
    opt.zero_grad()
    scaler.scale(crit(model(x), y)).backward()
    if not use_amp:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
""",
            [],
            id="clip-only-without-amp",
        ),
        pytest.param(
            """
import torch
scaler = torch.cuda.amp.GradScaler(enabled=use_amp)
for x, y in loader:
    opt.zero_grad()
    scaler.scale(crit(model(x), y)).backward()
    if use_amp:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
""",
            [7],
            id="clip-only-with-amp",
        ),
        pytest.param(
            """
import torch
scaler = torch.amp.GradScaler()
for real in loader:
    opt_d.zero_grad()
    scaler.scale(d_loss(real)).backward()
    scaler.unscale_(opt_d)
    torch.nn.utils.clip_grad_norm_(D.parameters(), 1.0)
    scaler.step(opt_d)
    opt_g.zero_grad()
    scaler.scale(g_loss(real)).backward()
    torch.nn.utils.clip_grad_norm_(G.parameters(), 1.0)
    scaler.step(opt_g)
    scaler.update()
""",
            [11],
            id="gan-second-backward-not-unscaled",
        ),
        pytest.param(
            """
import torch
def train_one_epoch(model, loader, optimizer, scaler, max_norm):
    for x, y in loader:
        optimizer.zero_grad()
        with torch.autocast("cuda"):
            loss = model(x, y)
        scaler.scale(loss).backward()
        if max_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(optimizer)
        scaler.update()
""",
            [9],
            id="scaler-parameter",
        ),
        pytest.param(
            """
import torch
from sklearn.preprocessing import StandardScaler
scaler = StandardScaler()
for x, y in loader:
    opt.zero_grad()
    scaler.scale(crit(model(x), y)).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
""",
            [],
            id="not-a-grad-scaler",
        ),
        pytest.param(
            """
import torch
from apex import amp
for x, y in loader:
    optimizer.zero_grad()
    with amp.scale_loss(crit(model(x), y), optimizer) as scaled_loss:
        scaled_loss.backward()
    torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)
    optimizer.step()
""",
            [],
            id="apex-unscales-on-exit",
        ),
    ],
)
def test_clip_before_unscale(source, expected):
    assert lines(ClipBeforeUnscale, source) == expected


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        pytest.param(
            """
import torch
import torch.nn as nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.softmax = nn.Softmax(dim=1)

    def forward(self, x):
        x = self.fc(x)
        x = self.softmax(x)
        return x

model = Net().to("cuda")
criterion = nn.CrossEntropyLoss()
for x, y in loader:
    loss = criterion(model(x), y)
""",
            [12],
            id="softmax-module-in-forward",
        ),
        pytest.param(
            """
import torch.nn.functional as F
import pytorch_lightning as pl

class Lit(pl.LightningModule):
    def forward(self, x):
        return F.softmax(self.net(x), dim=-1)

    def training_step(self, batch, i):
        x, y = batch
        return F.cross_entropy(self(x), y)
""",
            [6],
            id="lightning-self-call",
        ),
        pytest.param(
            """
import torch
import torch.nn.functional as F
probs = F.softmax(logits, dim=-1)
a = torch.log(probs.clamp(min=1e-8))
b = torch.log(probs.mean(0))
c = math.log(probs)
logger.log(probs)
""",
            [],
            id="guarded-or-reduced-logs",
        ),
        pytest.param(
            """
import torch
p = torch.softmax(z, 1)
nll = -torch.log(p[torch.arange(n), y]).mean()
""",
            [2],
            id="manual-nll-of-probs",
        ),
        pytest.param(
            """
import torch
for x, y in loader:
    probs = torch.softmax(model(x), -1)
    for k in range(3):
        probs = probs * 2
    loss = torch.nn.functional.cross_entropy(probs, y)
""",
            [],
            id="redefined-in-a-loop",
        ),
    ],
)
def test_softmax_into_cross_entropy(source, expected):
    assert lines(SoftmaxIntoCrossEntropy, source) == expected


def test_softmax_messages_name_the_sink():
    src = """
import torch
import torch.nn.functional as F
a = F.cross_entropy(F.softmax(x, 1), y)
b = F.nll_loss(F.softmax(x2, 1), y)
c = torch.log(F.softmax(x3, 1))
"""
    messages = [f.message for f in lint_example(SoftmaxIntoCrossEntropy, src)]
    assert "`cross_entropy`" in messages[0] and "double softmax" in messages[0]
    assert "`nll_loss`" in messages[1] and "log-probabilities" in messages[1]
    assert "log_softmax" in messages[2]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        pytest.param(
            """
import torch
def inner(l):
    l.backward()
def outer(l):
    inner(l)
with torch.autocast("cuda"):
    outer(l)
""",
            [3],
            id="helper-of-helper",
        ),
        pytest.param(
            """
import torch
with torch.no_grad(), torch.autocast("cuda"):
    l = m(x)
    l.backward()
async def f():
    async with torch.autocast("cuda"):
        l.backward()
with torch.autocast("cuda", torch.float16, False):
    l.backward()
""",
            [4, 7],
            id="multi-item-async-and-positional-disable",
        ),
    ],
)
def test_backward_inside_autocast(source, expected):
    assert lines(BackwardInsideAutocast, source) == expected


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        pytest.param(
            """
import torch
def train_one_epoch(model, loader, optimizer, scaler):
    for x, y in loader:
        optimizer.zero_grad()
        scaler.scale(model(x, y)).backward()
        scaler.step(optimizer)
    return model
""",
            [],
            id="scaler-from-caller-may-be-updated-there",
        ),
        pytest.param(
            """
import torch
scaler = torch.cuda.amp.GradScaler()
ckpt = {"scaler": scaler.state_dict()}
for x in loader:
    opt.zero_grad()
    scaler.scale(model(x).sum()).backward()
    scaler.step(opt)
""",
            [7],
            id="never-updated",
        ),
        pytest.param(
            """
import torch
scaler = torch.cuda.amp.GradScaler()
for x in loader:
    opt.zero_grad()
    scaler.scale(model(x).sum()).backward()
    scaler.step(opt)
    scaler.update()
    ema_optimizer.step()
""",
            [],
            id="a-second-step-after-scaler-step",
        ),
        pytest.param(
            """
import torch
scaler = torch.cuda.amp.GradScaler()
for x in loader:
    opt.zero_grad()
    loss = scaler.scale(model(x).sum())
    loss.backward()
    opt.step()
""",
            [7],
            id="scaled-loss-through-a-name",
        ),
        pytest.param(
            """
import torch
class T:
    def train_step(self, batch):
        loss = self.model(batch)
        if self.use_amp:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()
        if self.scaler is None:
            self.optimizer.step()
        else:
            self.scaler.step(self.optimizer)
            self.scaler.update()
""",
            [],
            id="uncorrelated-mode-flags",
        ),
    ],
)
def test_scaler_step_bypassed(source, expected):
    assert lines(ScalerStepBypassed, source) == expected


NEVER_UPDATED = """
import torch
scaler = torch.cuda.amp.GradScaler()
use_amp = scaler is not None
for x in loader:
    opt.zero_grad()
    scaler.scale(model(x).sum()).backward()
    if scaler and use_amp:
        scaler.step(opt)
    EXTRA
"""


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("pass", [8]),
        ("x = 1 if not scaler else 2", [8]),
        ("s2 = scaler or None", []),
        ("s3 = scaler if use_amp else None", []),
        ("log(scaler)", []),
    ],
)
def test_never_updated_unless_the_scaler_escapes(extra, expected):
    assert lines(ScalerStepBypassed, NEVER_UPDATED.replace("EXTRA", extra)) == expected
