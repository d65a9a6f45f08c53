"""TL7: state and safety."""

from __future__ import annotations

from trainlint.rules.state.eval_mode_not_restored import EvalModeNotRestored
from trainlint.rules.state.unsafe_torch_load import UnsafeTorchLoad

__all__ = ["EvalModeNotRestored", "UnsafeTorchLoad"]
