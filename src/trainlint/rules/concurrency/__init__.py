"""TL5: processes, threads, clusters. Models trained where the caller cannot see it,
shared models trained on several threads, and distributed samplers that never reshuffle."""

from __future__ import annotations

from trainlint.rules.concurrency.dataset_rng_copied_to_workers import DatasetRngCopiedToWorkers
from trainlint.rules.concurrency.loader_without_distributed_sampler import (
    LoaderWithoutDistributedSampler,
)
from trainlint.rules.concurrency.module_sent_to_process import ModuleSentToProcess
from trainlint.rules.concurrency.module_sent_to_remote import ModuleSentToRemote
from trainlint.rules.concurrency.sampler_without_set_epoch import SamplerWithoutSetEpoch
from trainlint.rules.concurrency.unlocked_shared_model import UnlockedSharedModel

__all__ = [
    "DatasetRngCopiedToWorkers",
    "LoaderWithoutDistributedSampler",
    "ModuleSentToProcess",
    "ModuleSentToRemote",
    "SamplerWithoutSetEpoch",
    "UnlockedSharedModel",
]
