"""TL3: memory. Graphs kept alive across training steps."""

from __future__ import annotations

from trainlint.rules.memory.allocator_call_in_loop import AllocatorCallInLoop
from trainlint.rules.memory.eval_without_no_grad import EvalWithoutNoGrad
from trainlint.rules.memory.graph_accumulation import GraphAccumulation
from trainlint.rules.memory.retain_graph_in_loop import RetainGraphInLoop
from trainlint.rules.memory.tensor_kept_on_self import TensorKeptOnSelf

__all__ = [
    "AllocatorCallInLoop",
    "EvalWithoutNoGrad",
    "GraphAccumulation",
    "RetainGraphInLoop",
    "TensorKeptOnSelf",
]
