"""TL4: throughput. Work that makes every training step slower than it needs to be."""

from __future__ import annotations

from trainlint.rules.throughput.anomaly_detection_enabled import AnomalyDetectionEnabled
from trainlint.rules.throughput.host_sync_in_loop import HostSyncInLoop
from trainlint.rules.throughput.synchronize_in_loop import SynchronizeInLoop

__all__ = ["AnomalyDetectionEnabled", "HostSyncInLoop", "SynchronizeInLoop"]
