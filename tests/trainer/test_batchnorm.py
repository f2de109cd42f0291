"""Ghost batch norm and the synchronization of running averages (issue item 7's batch-norm part),
on one process: the virtual batches are normalized on their own, and the running averages move as
if each process's share of the batch had been split differently."""

from __future__ import annotations

import torch
from torch import nn

from hpo.trainer.batchnorm import GhostBatchNormMixin, has_batch_norm, use_ghost_batch_norm


def _ghost(virtual: int) -> nn.BatchNorm1d:
    torch.manual_seed(0)
    bn = nn.BatchNorm1d(5)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-1, 1)
    assert use_ghost_batch_norm(nn.Sequential(bn), virtual) == 1
    return bn


def test_virtual_batches_are_normalized_on_their_own() -> None:
    bn = _ghost(8)
    assert isinstance(bn, GhostBatchNormMixin) and isinstance(bn, nn.BatchNorm1d)
    x = torch.randn(32, 5) * 3 + 2
    out = bn(x)
    plain = nn.BatchNorm1d(5)
    plain.load_state_dict(bn.state_dict())  # same keys: checkpoints load into the plain model
    expected = torch.cat([plain(chunk) for chunk in x.split(8)])
    torch.testing.assert_close(out, expected)
    # One running-average update per forward pass, with the mean of the chunks' statistics.
    means = torch.stack([c.mean(0) for c in x.split(8)]).mean(0)
    variances = torch.stack([c.var(0, unbiased=True) for c in x.split(8)]).mean(0)
    torch.testing.assert_close(bn.running_mean, 0.1 * means)
    torch.testing.assert_close(bn.running_var, 0.9 + 0.1 * variances)
    assert int(bn.num_batches_tracked) == 1


def test_running_averages_do_not_depend_on_how_the_batch_is_split() -> None:
    """One process with 4 virtual batches equals two processes with 2 each, averaged."""
    x = torch.randn(3, 32, 5) * 2 + 1
    whole, left, right = _ghost(8), _ghost(8), _ghost(8)
    for batch in x:
        whole(batch)
        left(batch[:16])
        right(batch[16:])
    torch.testing.assert_close(whole.running_mean, (left.running_mean + right.running_mean) / 2)
    torch.testing.assert_close(whole.running_var, (left.running_var + right.running_var) / 2)


def test_a_batch_no_larger_than_the_virtual_one_is_plain_batch_norm() -> None:
    bn, plain = _ghost(16), nn.BatchNorm1d(5)
    plain.load_state_dict(bn.state_dict())
    x = torch.randn(16, 5)
    torch.testing.assert_close(bn(x), plain(x))
    torch.testing.assert_close(bn.running_var, plain.running_var)
    bn.eval()
    plain.eval()
    y = torch.randn(64, 5)
    torch.testing.assert_close(bn(y), plain(y))  # evaluation uses the running averages


def test_has_batch_norm() -> None:
    assert has_batch_norm(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)))
    assert not has_batch_norm(nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2)))
