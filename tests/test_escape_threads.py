"""TL503 through a thread target's helper methods, and the lock-free fix that PyTorch's
autograd notes recommend (gradients as values, applied under the lock) stays silent."""

from __future__ import annotations

from trainlint import lint_source

TRAINER = """
import threading
import torch
from torch import nn

class Workers:
    def __init__(self, model: nn.Module, opt: torch.optim.Optimizer):
        self.model, self.opt = model, opt
        self.lock = threading.Lock()

    def run(self, shards):
        for t in [threading.Thread(target=self._loop, args=(s,)) for s in shards]:
            t.start()

    def _loop(self, shard):
        for x in shard:
            self._apply(self._grads(x))

    def _grads(self, x):
        loss = self.model(x).sum()
        loss.backward()
        return [p.grad for p in self.model.parameters()]

    def _apply(self, grads):
        with self.lock:
            for p, g in zip(self.model.parameters(), grads):
                p.grad = g
            self.opt.step()
"""


def _lines(src: str) -> list[int]:
    return sorted(f.line for f in lint_source(src, select=["TL503"]))


def test_the_forward_and_backward_in_a_helper_method_are_reported():
    assert _lines(TRAINER) == [20, 21]


def test_gradients_as_values_applied_under_the_lock_are_silent():
    fixed = TRAINER.replace(
        "        loss.backward()\n        return [p.grad for p in self.model.parameters()]",
        "        return torch.autograd.grad(loss, list(self.model.parameters()))",
    )
    assert _lines(fixed) == []


def test_a_helper_called_under_the_lock_is_not_reported():
    locked = TRAINER.replace(
        "            self._apply(self._grads(x))",
        "            with self.lock:\n                self._apply(self._grads(x))",
    )
    assert _lines(locked) == []
