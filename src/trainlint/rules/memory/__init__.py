"""TL3: memory. Graphs kept alive across training steps."""

from __future__ import annotations

from trainlint.rules import family_rule

__all__ = [
    "AllocatorCallInLoop",
    "EvalWithoutNoGrad",
    "GraphAccumulation",
    "RetainGraphInLoop",
    "TensorKeptOnSelf",
]


def __getattr__(name: str) -> type:
    # each rule's module is imported when the rule is asked for: a check that runs one
    # rule of the family imports only that one
    return family_rule(__name__, name)
