"""TL6: numerics and mixed precision. Loss scaling, autocast regions and softmax numerics."""

from __future__ import annotations

from trainlint.rules.numerics.backward_inside_autocast import BackwardInsideAutocast
from trainlint.rules.numerics.clip_before_unscale import ClipBeforeUnscale
from trainlint.rules.numerics.scaler_step_bypassed import ScalerStepBypassed
from trainlint.rules.numerics.softmax_into_cross_entropy import SoftmaxIntoCrossEntropy

__all__ = [
    "BackwardInsideAutocast",
    "ClipBeforeUnscale",
    "ScalerStepBypassed",
    "SoftmaxIntoCrossEntropy",
]
