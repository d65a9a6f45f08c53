"""What several gradients rules share."""

from __future__ import annotations

from trainlint.analysis.steps import Kind, StepLoop


def single_optimizer(loop: StepLoop) -> bool:
    return len(loop.targets(Kind.STEP)) <= 1
