"""What this worker may offer in a claim: the Ray cluster's free CPUs and GPUs
(docs/worker-protocol.md, "1. Claim": `resources` is what the worker can give one trial now)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray


@dataclass(frozen=True)
class Footprint:
    """One trial's resources: `processes` DDP processes of `cpus` and `gpus` each."""

    processes: int
    cpus: float
    gpus: float

    @classmethod
    def of(cls, resources: dict[str, Any]) -> Footprint:
        """From a study's `resources` (`workers`, `cpus_per_worker`, `gpus_per_worker`)."""
        return cls(
            processes=max(1, int(resources.get("workers", 1))),
            cpus=float(resources.get("cpus_per_worker", 1)),
            gpus=float(resources.get("gpus_per_worker", 0)),
        )

    @property
    def total_cpus(self) -> float:
        return self.processes * self.cpus

    @property
    def total_gpus(self) -> float:
        return self.processes * self.gpus


class Capacity:
    """Free resources, as the smaller of two upper bounds: the cluster's total minus what this
    worker's own trials hold (right the moment a trial is claimed, before Ray has placed it), and
    what Ray reports available (which counts other drivers on a shared cluster, but lags a few
    milliseconds behind our own placements and releases). When this worker started the Ray instance
    itself, nobody else uses it and the first bound alone is exact."""

    def __init__(self, exclusive: bool) -> None:
        self.exclusive = exclusive
        self.cpus = 0.0
        self.gpus = 0.0

    def commit(self, footprint: Footprint) -> None:
        self.cpus += footprint.total_cpus
        self.gpus += footprint.total_gpus

    def release(self, footprint: Footprint) -> None:
        self.cpus = max(0.0, self.cpus - footprint.total_cpus)
        self.gpus = max(0.0, self.gpus - footprint.total_gpus)

    def offer(self) -> tuple[float, float]:
        """`(cpus, gpus)` one more trial may use now."""
        total = ray.cluster_resources()
        cpus = total.get("CPU", 0.0) - self.cpus
        gpus = total.get("GPU", 0.0) - self.gpus
        if not self.exclusive:
            free = ray.available_resources()
            cpus, gpus = min(cpus, free.get("CPU", 0.0)), min(gpus, free.get("GPU", 0.0))
        return max(0.0, round(cpus, 4)), max(0.0, round(gpus, 4))
