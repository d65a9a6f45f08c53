"""Tiny, seeded models and training steps shared by the runtime-check tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


def mlp(seed: int = 0, device: str = "cpu") -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).to(device)


def batch(seed: int = 0, n: int = 32, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + seed)
    x = torch.randn(n, 8, generator=gen)
    y = x[:, :1] * 0.5 - x[:, 1:2] + 0.1 * torch.randn(n, 1, generator=gen)
    return x.to(device), y.to(device)


@dataclass
class Setup:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    step: Callable[[], Any]
    x: torch.Tensor
    y: torch.Tensor


def clean_setup(seed: int = 0, device: str = "cpu", opt: str = "sgd", lr: float = 0.05) -> Setup:
    """A correct training step over one batch: zero_grad, forward, backward, step."""
    model = mlp(seed, device)
    if opt == "adam":
        optimizer: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    x, y = batch(seed, device=device)

    def step() -> torch.Tensor:
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return Setup(model, optimizer, step, x, y)


_ACCUMULATING_TRAINER = (
    "from torch import nn\n"
    "\n"
    "\n"
    "def train(model, optimizer, batches, history):\n"
    "    for x, y in batches:\n"
    "        optimizer.zero_grad()\n"
    "        loss = nn.functional.mse_loss(model(x), y)\n"
    "        loss.backward()\n"
    "        optimizer.step()\n"
    "        history.append(loss)\n"
)


def accumulating_trainer_module(tmp_path: Any, monkeypatch: Any, package: str) -> tuple[Any, int]:
    """Import ``<package>.trainer``: a project module whose ``train`` keeps every loss
    (graph and all) in ``history``; returns it and the line the linter reports TL302 on."""
    import importlib

    import trainlint

    root = tmp_path / package
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "trainer.py").write_text(_ACCUMULATING_TRAINER)
    found = [f for f in trainlint.lint_paths([root / "trainer.py"]) if f.code == "TL302"]
    assert found, "the linter reports the planted accumulation"
    monkeypatch.syspath_prepend(str(tmp_path))
    return importlib.import_module(f"{package}.trainer"), found[0].line
