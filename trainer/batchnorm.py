"""Batch-norm details across batch sizes and processes (playbook 000, "Batch normalization
implementation details"; 002, "Batch normalization implementation details").

- Ghost batch norm (`trainer.ghost_batch_size`): in training, statistics come from virtual batches
  of that many examples, decoupling them from the batch size (useful when comparing batch sizes).
  A per-process batch larger than the virtual one is split into virtual batches, as the playbook
  asks. With every virtual batch inside one process, a run normalizes the same groups of examples
  whatever its world size. The running averages take one update per training step, with the mean
  of the virtual batches' statistics: so, once averaged over processes, they too do not depend on
  how the batch is split over processes.
- Several GPUs without ghost batch norm: `SyncBatchNorm`, statistics over the global batch. On CPU
  torch has no SyncBatchNorm (it needs a GPU), so each process normalizes over its own part.
- The running averages used at evaluation are linear in the training statistics, so averaging them
  over processes before every evaluation and checkpoint is enough (`average_buffers`); DDP's buffer
  broadcast is off, since it would keep rank 0's averages only."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from .distributed import DistContext, all_reduce_sum


class GhostBatchNormMixin:
    """Normalizes training batches in virtual batches of `virtual_batch_size` examples. The running
    statistics take one update per forward pass with the mean of the virtual batches' statistics
    (an update is linear in them), so 1 process with k virtual batches and 2 processes with k / 2
    each end with the same averages once `average_buffers` has run. Evaluation is unchanged."""

    virtual_batch_size: int

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 (torch's argument name)
        parent: Any = super()
        bn: Any = self
        if not bn.training or input.shape[0] <= self.virtual_batch_size:
            return parent.forward(input)  # type: ignore[no-any-return]
        chunks = input.split(self.virtual_batch_size)
        if not bn.track_running_stats or bn.running_mean is None or bn.num_batches_tracked is None:
            return torch.cat([parent.forward(chunk) for chunk in chunks])
        bn._check_input_dim(input)
        bn.num_batches_tracked.add_(1)
        factor = 1.0 / float(bn.num_batches_tracked) if bn.momentum is None else bn.momentum
        outputs, means, variances = [], [], []
        for chunk in chunks:
            # Each virtual batch updates a copy of the old averages; the copies are then averaged.
            mean, var = bn.running_mean.clone(), bn.running_var.clone()
            outputs.append(F.batch_norm(chunk, mean, var, bn.weight, bn.bias, True, factor, bn.eps))
            means.append(mean)
            variances.append(var)
        with torch.no_grad():
            bn.running_mean.copy_(torch.stack(means).mean(dim=0))
            bn.running_var.copy_(torch.stack(variances).mean(dim=0))
        return torch.cat(outputs)


_GHOST_CLASSES: dict[type, type] = {}


def use_ghost_batch_norm(model: nn.Module, virtual_batch_size: int) -> int:
    """Turns every batch-norm layer of `model` into its ghost variant in place (same parameters,
    buffers and state-dict keys, so checkpoints load into the plain model). Answers how many."""
    count = 0
    for module in model.modules():
        if isinstance(module, _BatchNorm) and not isinstance(module, GhostBatchNormMixin):
            cls = type(module)
            ghost = _GHOST_CLASSES.setdefault(cls, type(f"Ghost{cls.__name__}", (GhostBatchNormMixin, cls), {}))
            module.__class__ = ghost
            module.virtual_batch_size = virtual_batch_size  # type: ignore[assignment]
            count += 1
    return count


def has_batch_norm(model: nn.Module) -> bool:
    return any(isinstance(m, _BatchNorm) for m in model.modules())


def prepare_batch_norm(model: nn.Module, ctx: DistContext, ghost_batch_size: int | None) -> tuple[nn.Module, str]:
    """Applies the batch-norm policy above; answers the model and what was done, for the log."""
    if not has_batch_norm(model):
        return model, "none"
    if ghost_batch_size is not None:
        use_ghost_batch_norm(model, ghost_batch_size)
        return model, f"ghost batch norm, virtual batch {ghost_batch_size}"
    if ctx.distributed and ctx.device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(model), "SyncBatchNorm"
    if ctx.distributed:
        return model, "per-process batch statistics (no SyncBatchNorm on CPU); running averages synchronized"
    return model, "batch norm"


def average_buffers(model: nn.Module, ctx: DistContext) -> None:
    """Averages the running means and variances of every batch-norm layer over the processes, so
    evaluation and checkpoints see statistics of all the data (playbook 000, "Considerations for
    multi-host pipelines": synchronize batch norm statistics before evaluating or checkpointing)."""
    if not ctx.distributed:
        return
    buffers = [
        b
        for m in model.modules()
        if isinstance(m, _BatchNorm) and m.track_running_stats
        for b in (m.running_mean, m.running_var)
        if b is not None
    ]
    if not buffers:
        return
    flat = torch.cat([b.detach().reshape(-1).to(torch.float64) for b in buffers])
    all_reduce_sum(flat, ctx).div_(ctx.world_size)
    offset = 0
    for b in buffers:
        b.copy_(flat[offset : offset + b.numel()].view_as(b))
        offset += b.numel()
