"""TL2: learning-rate schedules. Which unit a schedule counts in, and when it is stepped."""

from __future__ import annotations

from trainlint.rules.schedules.hand_rolled_lr_starts_at_zero import HandRolledLrStartsAtZero
from trainlint.rules.schedules.hand_rolled_lr_unit_mismatch import HandRolledLrUnitMismatch
from trainlint.rules.schedules.scheduler_before_optimizer import SchedulerBeforeOptimizer
from trainlint.rules.schedules.scheduler_never_stepped import SchedulerNeverStepped
from trainlint.rules.schedules.scheduler_step_with_epoch import SchedulerStepWithEpoch
from trainlint.rules.schedules.scheduler_unit_mismatch import SchedulerUnitMismatch
from trainlint.rules.schedules.warmup_starts_at_zero import WarmupStartsAtZero

__all__ = [
    "HandRolledLrStartsAtZero",
    "HandRolledLrUnitMismatch",
    "SchedulerBeforeOptimizer",
    "SchedulerNeverStepped",
    "SchedulerStepWithEpoch",
    "SchedulerUnitMismatch",
    "WarmupStartsAtZero",
]
