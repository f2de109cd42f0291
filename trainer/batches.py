"""How the loop gets a batch: gathered by index from a batch-indexable dataset (the fast path), or
collated from single examples by a `torch.utils.data.DataLoader` (a dataset wrapped in `ExampleDataset`).

Both kinds read the same indices: `sampling.BatchOrder` for each training step, `sampling.eval_shard`
for evaluation. A DataLoader gets them as its `batch_sampler` (`StepBatches`), so the batch of step N
is the same whichever kind the workload returns, each rank reads its own slice (DDP), and a resumed
run reads exactly the batches an uninterrupted one does, with no loader state in the checkpoint.

Telling the kinds apart is explicit, so no existing workload changes path: only a dataset wrapped in
`ExampleDataset` goes through a DataLoader; anything else (a `TensorDataset`, a user's own
batch-indexable dataset) is indexed with the whole batch's index tensor as before. Guessing from the
type (say, "a `torch.utils.data.Dataset` that is not a `TensorDataset`") would move a user's own
batch-indexing Dataset subclass onto the per-example path, which calls `dataset[i]` with an int.

Randomness. The loop's `augment` hook runs on the collated batch in the training process, seeded per
rank and saved in checkpoints, as on the fast path. A per-example transform inside the user's dataset
is the user's: with `trainer.data_workers = 0` it runs in the training process and draws from its
global RNGs (torch, numpy, random), which checkpoints save, so resume stays exact; in worker processes
it draws from the workers' RNGs, which the DataLoader seeds when its iterator starts (from the run
seed, the rank and the first step) and which no checkpoint can hold, so such a run resumes exactly
only when its transforms are seeded by the example's index (and the step, for a new draw each epoch).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Subset, default_collate

from .errors import ConfigError
from .sampling import BatchOrder, derive_seed

Batch = tuple[torch.Tensor, torch.Tensor]


class ExampleDataset(Dataset[Any]):
    """Marks a map-style dataset of single examples for loading through a DataLoader.

    `dataset[i]` (an int) answers one example, `(input, label)`, and `len(dataset)` the count: any
    ordinary `torch.utils.data.Dataset`. `collate_fn` turns a list of examples into `(inputs,
    labels)`; the DataLoader's default (`default_collate`, which stacks tensors, numbers and numpy
    arrays) when None. Picklable datasets only with `trainer.data_workers > 0` on platforms that
    spawn workers (Linux forks them)."""

    def __init__(self, dataset: Any, collate_fn: Callable[[list[Any]], Any] | None = None) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def collate(self, examples: list[Any]) -> Any:
        return (self.collate_fn or default_collate)(examples)


def gather(dataset: Any, index: torch.Tensor) -> Batch:
    """The batch of examples at `index` (1-D int64), in this process, whichever kind `dataset` is."""
    if isinstance(dataset, ExampleDataset):
        inputs, labels = dataset.collate([dataset[i] for i in index.tolist()])
        return inputs, labels
    inputs, labels = dataset[index]
    return inputs, labels


def check_dataset(dataset: Any, which: str) -> None:
    """Raises `ConfigError` naming the fix when a dataset that is not an `ExampleDataset` cannot
    answer a batch for a tensor of positions: most often a map-style Dataset of single examples
    that its workload forgot to wrap."""
    if isinstance(dataset, ExampleDataset):
        return
    try:
        size = len(dataset)
        batch = dataset[torch.arange(min(2, size))]
        ok = isinstance(batch, (tuple, list)) and len(batch) == 2 and len(batch[1]) == min(2, size)
    except Exception as exc:  # the user's dataset may raise anything on a tensor index
        ok, batch = False, exc
    if not ok:
        raise ConfigError(
            f"workload datasets(): the {which} dataset does not answer a whole batch "
            f"(inputs, labels) for a tensor of positions (got {type(batch).__name__}); a Dataset whose "
            "dataset[i] is one example must be wrapped: ExampleDataset(dataset) (from hpo.trainer.workloads), "
            "which loads it through a DataLoader"
        )


def first_examples(dataset: Any, size: int) -> Any:
    """The first `size` examples of `dataset`, of the same kind (for `train_eval/*` metrics)."""
    if isinstance(dataset, ExampleDataset):
        return ExampleDataset(Subset(dataset.dataset, range(size)), dataset.collate_fn)
    return _FirstExamples(dataset, size)


class _FirstExamples:
    """A batch-indexable dataset cut to its first `size` examples (indices below `size` only)."""

    def __init__(self, dataset: Any, size: int) -> None:
        self.dataset, self.size = dataset, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: Any) -> Any:
        return self.dataset[index]


class StepBatches:
    """A DataLoader `batch_sampler`: this rank's indices (`BatchOrder`) for steps `start` to `stop - 1`."""

    def __init__(self, order: BatchOrder, start: int, stop: int) -> None:
        self.order, self.start, self.stop = order, start, stop

    def __iter__(self) -> Iterator[list[int]]:
        for step in range(self.start, self.stop):
            yield self.order.indices(step).tolist()

    def __len__(self) -> int:
        return max(0, self.stop - self.start)


class TrainBatches:
    """`batches(step) -> (inputs, labels)`: this rank's training batch of each step. Steps are asked
    for in order; on a DataLoader, asking for any other step (a resume) starts a new iterator there.
    `close()` ends the worker processes."""

    def __init__(
        self,
        dataset: Any,
        order: BatchOrder,
        stop: int,
        *,
        workers: int = 0,
        seed: int = 0,
        rank: int = 0,
        pin_memory: bool = False,
    ) -> None:
        self.dataset, self.order, self.stop = dataset, order, stop
        self.workers, self.seed, self.rank, self.pin_memory = workers, seed, rank, pin_memory
        self.loaded = isinstance(dataset, ExampleDataset)
        self._batches: Iterator[Any] | None = None
        self._next_step = -1

    def __call__(self, step: int) -> Batch:
        if not self.loaded:
            inputs, labels = self.dataset[self.order.indices(step)]
            return inputs, labels
        if self._batches is None or step != self._next_step:
            self._start(step)
        assert self._batches is not None
        self._next_step = step + 1
        inputs, labels = next(self._batches)
        return inputs, labels

    def _start(self, step: int) -> None:
        self.close()
        # The loader's own generator: creating an iterator draws its workers' base seed, which
        # from the global RNG would shift dropout's stream between a resumed and an uninterrupted run.
        generator = torch.Generator().manual_seed(derive_seed(self.seed, f"data_workers@{step}", self.rank))
        loader = DataLoader(
            self.dataset.dataset,
            batch_sampler=StepBatches(self.order, step, self.stop),
            num_workers=self.workers,
            collate_fn=self.dataset.collate,
            pin_memory=self.pin_memory,
            generator=generator,
        )
        self._batches = iter(loader)

    def close(self) -> None:
        # Dropping the only reference to a multi-process iterator shuts its workers down.
        self._batches = None
        self._next_step = -1


def eval_batches(
    dataset: Any,
    indices: torch.Tensor,
    weights: torch.Tensor,
    batch_size: int,
    *,
    workers: int = 0,
    seed: int = 0,
    rank: int = 0,
    pin_memory: bool = False,
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """`(inputs, labels, weights)` of `indices` in batches of `batch_size`, in order."""
    starts = range(0, len(indices), batch_size)
    if not isinstance(dataset, ExampleDataset):
        for start in starts:
            inputs, labels = dataset[indices[start : start + batch_size]]
            yield inputs, labels, weights[start : start + batch_size]
        return
    # A fresh generator of the same seed every evaluation: workers draw alike at every step and after a resume.
    generator = torch.Generator().manual_seed(derive_seed(seed, "eval_workers", rank))
    loader = DataLoader(
        dataset.dataset,
        batch_sampler=[indices[start : start + batch_size].tolist() for start in starts],
        num_workers=workers,
        collate_fn=dataset.collate,
        pin_memory=pin_memory,
        generator=generator,
    )
    for start, (inputs, labels) in zip(starts, loader, strict=True):
        yield inputs, labels, weights[start : start + batch_size]
