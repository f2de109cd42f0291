"""Exact distributed evaluation (playbook 000, "Evaluating model performance").

Each rank evaluates its own shard (`sampling.eval_shard`: disjoint, padding weighted 0) in batches
of `eval_batch_size / world_size` (gathered by index, or through a DataLoader for an `ExampleDataset`:
`batches.eval_batches`), accumulates the workload's weighted sums in float64, and one
all-reduce adds them up: every example counts exactly once, whatever the world size. Evaluation
runs at step intervals, never on a clock (playbook 000, "Setting up periodic evaluations")."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .batches import eval_batches
from .distributed import DistContext, all_reduce_sum
from .sampling import eval_shard
from .workloads import Workload


class Evaluator:
    """Evaluates one dataset (validation, or a fixed subset of training data) under one prefix."""

    def __init__(
        self,
        prefix: str,
        dataset: Any,
        workload: Workload,
        ctx: DistContext,
        eval_batch_size: int,
        data_workers: int = 0,
        seed: int = 0,
    ) -> None:
        self.prefix = prefix
        self.dataset = dataset
        self.workload = workload
        self.ctx = ctx
        self.indices, self.weights = eval_shard(len(dataset), ctx.rank, ctx.world_size)
        self.local_batch = max(1, math.ceil(eval_batch_size / ctx.world_size))
        self.data_workers, self.seed = data_workers, seed

    @torch.no_grad()
    def __call__(self, model: nn.Module) -> dict[str, float]:
        was_training = model.training
        model.eval()
        try:
            totals = self._local_sums(model)
        finally:
            model.train(was_training)
        sums = _all_reduce_dict(totals, self.ctx)
        return {f"{self.prefix}/{name}": value for name, value in self.workload.eval_metrics(sums).items()}

    def _local_sums(self, model: nn.Module) -> dict[str, torch.Tensor]:
        device = self.ctx.device
        totals: dict[str, torch.Tensor] = {}
        batches = eval_batches(
            self.dataset,
            self.indices,
            self.weights,
            self.local_batch,
            workers=self.data_workers,
            seed=self.seed,
            rank=self.ctx.rank,
            pin_memory=device.type == "cuda",
        )
        for inputs, labels, weights in batches:
            inputs, labels = inputs.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            weights = weights.to(device, non_blocking=True)
            sums = self.workload.eval_sums(model(inputs), labels, weights)
            for name, value in sums.items():
                value = value.detach().to(torch.float64)
                totals[name] = totals[name] + value if name in totals else value
        return totals


def _all_reduce_dict(totals: Mapping[str, torch.Tensor], ctx: DistContext) -> dict[str, torch.Tensor]:
    """Sums every tensor of `totals` over ranks with one collective (keys in a fixed order)."""
    names = sorted(totals)
    if not names:
        return {}
    flat = torch.cat([totals[n].reshape(-1) for n in names])
    flat = all_reduce_sum(flat, ctx).cpu()
    out, offset = {}, 0
    for name in names:
        size = totals[name].numel()
        out[name] = flat[offset : offset + size].reshape(totals[name].shape)
        offset += size
    return out
