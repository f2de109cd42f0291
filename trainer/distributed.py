"""The process group, read from the standard environment so one code path runs alone, under
`torchrun`, under `hpo train --nproc N` and under Ray Train (trainer/README.md).

- A process group that is already initialized (Ray Train's TorchTrainer sets one up before calling
  the training function) is used as it is and left for its owner to destroy.
- Otherwise `WORLD_SIZE > 1` initializes one from `MASTER_ADDR` / `MASTER_PORT` / `RANK` (gloo on
  CPU, NCCL on GPU) with a bounded timeout, and `teardown` destroys it.
- Otherwise the run is alone: rank 0 of 1, and no collective is ever called."""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .config import Resources

_log = logging.getLogger("hpo.trainer")


@dataclass(frozen=True)
class DistContext:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    owns_group: bool

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def setup(resources: Resources, timeout_s: float) -> DistContext:
    """Joins (or creates) the process group, picks the device and sets torch's thread count to
    `resources.cpus_per_worker` (docs/spec.md, "Resources")."""
    torch.set_num_threads(resources.threads)
    use_cuda = resources.gpus_per_worker > 0
    if use_cuda and not torch.cuda.is_available():
        raise RuntimeError("resources.gpus_per_worker > 0 but CUDA is not available in this process")
    owns = False
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    elif int(os.environ.get("WORLD_SIZE", "1")) > 1:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        _init_from_env(rank, world, "nccl" if use_cuda else "gloo", timeout_s)
        owns = True
    else:
        rank, world = 0, 1
    local_rank = int(os.environ.get("LOCAL_RANK", rank if world > 1 else 0))
    device = _device(use_cuda, local_rank)
    if resources.workers != world and rank == 0:
        _log.info("resources.workers=%d but %d process(es) run this trial", resources.workers, world)
    return DistContext(rank, local_rank, world, device, owns)


def _init_from_env(rank: int, world: int, backend: str, timeout_s: float) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        raise RuntimeError("WORLD_SIZE > 1 needs MASTER_PORT (and MASTER_ADDR) in the environment")
    timeout = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world, timeout=timeout)


def _device(use_cuda: bool, local_rank: int) -> torch.device:
    if not use_cuda:
        return torch.device("cpu")
    # Under Ray Train each process may see only its own GPU (CUDA_VISIBLE_DEVICES), so the local
    # rank can exceed the visible device count.
    device = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def teardown(ctx: DistContext) -> None:
    if ctx.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(tensor: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """Sums `tensor` over ranks in place (a no-op alone) and returns it."""
    if ctx.distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def gather_objects(obj: Any, ctx: DistContext) -> list[Any]:
    """Every rank's `obj`, in rank order, on every rank."""
    if not ctx.distributed:
        return [obj]
    gathered: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(gathered, obj)
    return gathered


def broadcast_object(obj: Any, ctx: DistContext) -> Any:
    """Rank 0's `obj` on every rank."""
    if not ctx.distributed:
        return obj
    box = [obj if ctx.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]
