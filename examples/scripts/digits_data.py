"""The data and model the example scripts share: scikit-learn's 8x8 digits (shipped with the
package, no download), 1,500 training and 297 validation images, and a small MLP."""

from __future__ import annotations

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def datasets() -> tuple[TensorDataset, TensorDataset]:
    images, labels = load_digits(return_X_y=True)
    x = torch.tensor(images / 16.0, dtype=torch.float32)
    y = torch.tensor(labels, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))  # a fixed split
    train, valid = order[:1500], order[1500:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[valid], y[valid])


def model(hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))


@torch.no_grad()
def evaluate(net: nn.Module, valid: TensorDataset) -> dict[str, float]:
    """`valid/loss` and `valid/error_rate`, the names the analysis reads."""
    net.eval()
    loss_sum, errors, count = 0.0, 0, 0
    for x, y in DataLoader(valid, batch_size=512):
        logits = net(x)
        loss_sum += float(nn.functional.cross_entropy(logits, y, reduction="sum"))
        errors += int((logits.argmax(1) != y).sum())
        count += len(y)
    net.train()
    return {"valid/loss": loss_sum / count, "valid/error_rate": errors / count}
