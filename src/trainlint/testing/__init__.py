"""Runtime checks that run real training steps and confirm silent training bugs.

Each check is a plain function (usable without pytest, like :mod:`torch.testing`) and, through
trainlint's pytest plugin, a fixture of the same name that returns it. A check raises
:class:`CheckFailed` (an :class:`AssertionError`) with a readable table on failure, naming the
static rules that explain the symptom and the linter's findings on the step's lines, and
returns a result object with its measurements on success.

Most checks take ``step``, a callable that performs one training step. It takes no
arguments (close over your batch), or one batch when ``batches=`` is given; the batches are
cycled if there are fewer than ``steps``. Every check takes ``timeout=`` (seconds, default
120): a step still running then fails the check with every thread's stack, and the processes
it started are terminated. A check also fails when a thread the step started raised, or a
process it started exited non-zero. Steps are numbered from 0. Tensors stay where the
model put them: the checks run on CPU and CUDA alike.

Importing this module does not import torch; each check does, when called.

Each check lives in its own module, split into measuring (running the steps), diagnosing
(which symptom the measurements show) and reporting (the message, built by
:mod:`trainlint._runtime.report`); the module's ``SYMPTOMS`` table names the rules behind each
symptom, and ``Rule.confirm_with`` decides which of them a failure confirms.
"""

from __future__ import annotations

from trainlint.testing._common import CheckFailed
from trainlint.testing.clip import ClipResult, GradRead, assert_clip_effective
from trainlint.testing.ddp import DDPSyncResult, assert_ddp_in_sync
from trainlint.testing.eval_graph import EvalGraphResult, assert_no_graph_in_eval
from trainlint.testing.finite import FiniteGradsResult, assert_finite_grads
from trainlint.testing.grads import GradsResult, assert_grads_nonzero
from trainlint.testing.loss import LossResult, assert_loss_decreases
from trainlint.testing.lr_schedule import LRTrace, assert_lr_schedule
from trainlint.testing.memory import MemoryResult, assert_memory_stable
from trainlint.testing.step_time import StepTimeResult, assert_step_time_stable
from trainlint.testing.threads import ThreadSafetyResult, assert_thread_safe
from trainlint.testing.weights import WeightsResult, assert_weights_updated

__all__ = [
    "CheckFailed",
    "ClipResult",
    "DDPSyncResult",
    "EvalGraphResult",
    "FiniteGradsResult",
    "GradRead",
    "GradsResult",
    "LRTrace",
    "LossResult",
    "MemoryResult",
    "StepTimeResult",
    "ThreadSafetyResult",
    "WeightsResult",
    "assert_clip_effective",
    "assert_ddp_in_sync",
    "assert_finite_grads",
    "assert_grads_nonzero",
    "assert_loss_decreases",
    "assert_lr_schedule",
    "assert_memory_stable",
    "assert_no_graph_in_eval",
    "assert_step_time_stable",
    "assert_thread_safe",
    "assert_weights_updated",
]
