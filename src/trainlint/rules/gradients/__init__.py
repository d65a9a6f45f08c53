"""TL1: gradient flow. The order of backward, step, zero_grad and gradient reads in a step."""

from __future__ import annotations

from trainlint.rules.gradients.backward_under_no_grad import BackwardUnderNoGrad
from trainlint.rules.gradients.clip_after_step import ClipAfterStep
from trainlint.rules.gradients.grad_norm_after_zero_grad import GradNormAfterZeroGrad
from trainlint.rules.gradients.graph_broken_loss import GraphBrokenLoss
from trainlint.rules.gradients.missing_zero_grad import MissingZeroGrad
from trainlint.rules.gradients.optimizer_on_stale_params import OptimizerOnStaleParams
from trainlint.rules.gradients.step_before_backward import StepBeforeBackward
from trainlint.rules.gradients.unregistered_submodules import UnregisteredSubmodules
from trainlint.rules.gradients.unscaled_accumulated_loss import UnscaledAccumulatedLoss
from trainlint.rules.gradients.zero_grad_before_step import ZeroGradBeforeStep

__all__ = [
    "BackwardUnderNoGrad",
    "ClipAfterStep",
    "GradNormAfterZeroGrad",
    "GraphBrokenLoss",
    "MissingZeroGrad",
    "OptimizerOnStaleParams",
    "StepBeforeBackward",
    "UnregisteredSubmodules",
    "UnscaledAccumulatedLoss",
    "ZeroGradBeforeStep",
]
