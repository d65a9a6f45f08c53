"""TL4: throughput. Work that makes every training step slower than it needs to be."""

from __future__ import annotations

from trainlint.rules import family_rule

__all__ = ["AnomalyDetectionEnabled", "HostSyncInLoop", "SynchronizeInLoop"]


def __getattr__(name: str) -> type:
    # each rule's module is imported when the rule is asked for: a check that runs one
    # rule of the family imports only that one
    return family_rule(__name__, name)
