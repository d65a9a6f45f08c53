"""TL7: state and safety."""

from __future__ import annotations

from trainlint.rules import family_rule

__all__ = ["CheckpointNeedsPickle", "EvalModeNotRestored", "UnsafeTorchLoad"]


def __getattr__(name: str) -> type:
    # each rule's module is imported when the rule is asked for: a check that runs one
    # rule of the family imports only that one
    return family_rule(__name__, name)
