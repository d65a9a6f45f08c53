"""TL5: processes, threads, clusters. Models trained where the caller cannot see it,
shared models trained on several threads, and distributed samplers that never reshuffle."""

from __future__ import annotations

from trainlint.rules import family_rule

__all__ = [
    "DatasetRngCopiedToWorkers",
    "LoaderWithoutDistributedSampler",
    "ModuleSentToProcess",
    "ModuleSentToRemote",
    "SamplerWithoutSetEpoch",
    "UnlockedSharedModel",
]


def __getattr__(name: str) -> type:
    # each rule's module is imported when the rule is asked for: a check that runs one
    # rule of the family imports only that one
    return family_rule(__name__, name)
