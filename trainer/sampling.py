"""Which examples each rank sees: training batches as a pure function of the step, evaluation shards
with zero-weighted padding, and the seeds that make both reproducible.

Training order. Every epoch is one permutation of the training set drawn from the run seed; the
stream of epochs is cut into global batches of `batch_size`, and rank `r` of `W` takes the `r`-th
slice of `batch_size / W` examples of each one. So:
- the global batch stays fixed as the world size changes, and 2 ranks of B/2 see exactly the examples
  1 rank of B sees (`batch_size` is the global batch: trainer/README.md, "Hyperparameters
  (`params`)");
- ranks read disjoint data: the playbook's "different seeds across hosts for data shuffling"
  (000, "Considerations for multi-host pipelines") is met by disjoint slices of one global order
  rather than independent streams, which would make a run depend on its world size;
- the data position is the step itself: a checkpoint at step N resumes at global example
  N * batch_size with nothing else to save (004, "Load and save one checkpoint before training").

Seeds that must agree across ranks (model init, data order) derive from the run seed alone; seeds
that must differ (augmentation, dropout) also mix in the rank (000, "Considerations for multi-host
pipelines": mark which seeds are shared and which are per host)."""

from __future__ import annotations

import math
import zlib

import numpy as np
import torch


def derive_seed(seed: int, purpose: str, rank: int | None = None) -> int:
    """A 63-bit seed for one purpose ("init", "data", "augment", ...); `rank=None` means shared by
    every rank."""
    words = [seed, zlib.crc32(purpose.encode())] + ([] if rank is None else [1, rank])
    state = np.random.SeedSequence(words).generate_state(1, dtype=np.uint64)[0]
    return int(state) & (2**63 - 1)


class BatchOrder:
    """This rank's training indices for every step (see the module doc). In `fixed` mode every step
    uses the first batch (the overfit-one-batch check)."""

    def __init__(
        self, num_examples: int, global_batch: int, seed: int, rank: int, world_size: int, fixed: bool = False
    ):
        if num_examples < 1:
            raise ValueError("the training set is empty")
        self.num_examples = num_examples
        self.global_batch = global_batch
        self.local_batch = global_batch // world_size
        self.rank = rank
        self.fixed = fixed
        self._seed = derive_seed(seed, "data")
        self._cache: dict[int, torch.Tensor] = {}

    def indices(self, step: int) -> torch.Tensor:
        """Indices (int64, CPU) of this rank's part of the batch for the update after `step` updates."""
        start = (0 if self.fixed else step * self.global_batch) + self.rank * self.local_batch
        stop = start + self.local_batch
        n = self.num_examples
        first, last = start // n, (stop - 1) // n
        if first == last:
            return self._permutation(first)[start - first * n : stop - first * n]
        pieces = []
        for epoch in range(first, last + 1):
            lo, hi = max(start, epoch * n) - epoch * n, min(stop, (epoch + 1) * n) - epoch * n
            pieces.append(self._permutation(epoch)[lo:hi])
        return torch.cat(pieces)

    def epoch(self, step: int) -> int:
        return 0 if self.fixed else step * self.global_batch // self.num_examples

    def _permutation(self, epoch: int) -> torch.Tensor:
        perm = self._cache.get(epoch)
        if perm is None:
            generator = torch.Generator().manual_seed((self._seed + epoch) % (2**63))
            perm = torch.randperm(self.num_examples, generator=generator)
            if len(self._cache) >= 2:
                self._cache.pop(min(self._cache))
            self._cache[epoch] = perm
        return perm


def eval_shard(num_examples: int, rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's evaluation indices and weights: ranks take examples `rank, rank + W, ...`, every
    rank the same count; the few positions past the end repeat real examples with weight 0.
    Playbook (000), "Setting up periodic evaluations": padded examples weigh zero, so summing the
    weighted sums over ranks counts every example exactly once."""
    per_rank = math.ceil(num_examples / world_size)
    positions = torch.arange(per_rank, dtype=torch.int64) * world_size + rank
    weights = (positions < num_examples).to(torch.float64)
    return positions % num_examples, weights
