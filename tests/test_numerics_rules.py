"""TL601-TL604 beyond their embedded examples: realistic AMP trainers (seed 001), correlated
mode flags, and the near-misses that must stay silent."""

from __future__ import annotations

import pytest

from trainlint.rule_testing import lint_example
from trainlint.rules import builtin_rules
from trainlint.rules.numerics import (
    BackwardInsideAutocast,
    ClipBeforeUnscale,
    ScalerStepBypassed,
    SoftmaxIntoCrossEntropy,
)

RULES = [r for r in builtin_rules() if r.__module__.startswith("trainlint.rules.numerics.")]


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
    ).replace(
        '        X, Y = get_batch("train")\n        scaler.scale(loss).backward()\n',
        '        X, Y = get_batch("train")\n',
    )
    assert lines(BackwardInsideAutocast, src) == [11]


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
