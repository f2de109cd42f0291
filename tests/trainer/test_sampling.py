"""Which examples each rank sees (issue items 4 and 7, the pure half): evaluation shards count every
example exactly once whatever the world size, and the training order keeps the global batch fixed."""

from __future__ import annotations

import pytest
import torch

from hpo.trainer.sampling import BatchOrder, derive_seed, eval_shard


@pytest.mark.parametrize("num_examples", [1, 2, 3, 7, 10, 255, 256])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
def test_eval_shards_cover_every_example_exactly_once_by_weight(num_examples: int, world_size: int) -> None:
    counts = torch.zeros(num_examples, dtype=torch.float64)
    lengths = set()
    for rank in range(world_size):
        indices, weights = eval_shard(num_examples, rank, world_size)
        assert indices.dtype == torch.int64 and weights.dtype == torch.float64
        assert len(indices) == len(weights)
        assert int(indices.min()) >= 0 and int(indices.max()) < num_examples
        assert set(weights.tolist()) <= {0.0, 1.0}
        counts.index_add_(0, indices, weights)
        lengths.add(len(indices))
    assert torch.equal(counts, torch.ones(num_examples, dtype=torch.float64))
    assert len(lengths) == 1, "every rank runs the same number of evaluation batches"
    assert lengths.pop() * world_size - num_examples < world_size  # padding is less than one round


def test_ranks_split_the_global_batch_as_one_process_sees_it() -> None:
    n, batch = 100, 24  # epochs end mid-batch: step 4 spans epochs 0 and 1
    alone = BatchOrder(n, batch, seed=7, rank=0, world_size=1)
    for world_size in (2, 3, 4):
        ranks = [BatchOrder(n, batch, seed=7, rank=r, world_size=world_size) for r in range(world_size)]
        for step in range(12):
            parts = [order.indices(step) for order in ranks]
            assert all(len(p) == batch // world_size for p in parts)
            assert torch.equal(torch.cat(parts), alone.indices(step)), (world_size, step)


def test_each_epoch_is_a_permutation_and_the_order_is_seeded() -> None:
    order = BatchOrder(96, 32, seed=1, rank=0, world_size=1)
    epoch = torch.cat([order.indices(s) for s in range(3)])
    assert sorted(epoch.tolist()) == list(range(96))
    assert not torch.equal(epoch, torch.cat([order.indices(s) for s in range(3, 6)]))
    again = BatchOrder(96, 32, seed=1, rank=0, world_size=1)
    assert torch.equal(again.indices(4), order.indices(4))  # a pure function of the step
    other = BatchOrder(96, 32, seed=2, rank=0, world_size=1)
    assert not torch.equal(other.indices(0), order.indices(0))


def test_fixed_order_repeats_the_first_batch() -> None:
    order = BatchOrder(96, 32, seed=1, rank=0, world_size=1, fixed=True)
    assert all(torch.equal(order.indices(s), order.indices(0)) for s in range(1, 10))


def test_derived_seeds_are_shared_or_per_rank() -> None:
    assert derive_seed(5, "init") == derive_seed(5, "init")
    assert derive_seed(5, "init") != derive_seed(6, "init") != derive_seed(5, "data")
    assert derive_seed(5, "dropout", 0) != derive_seed(5, "dropout", 1)
    assert 0 <= derive_seed(2**31 - 1, "augment", 3) < 2**63
