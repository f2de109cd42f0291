"""User workloads loaded by import path (`tests.trainer.custom_workload:Name`), as a study would name
its own task. Small and fast: a few hundred examples in a handful of features."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from hpo.trainer.workloads import ClassificationWorkload, ExampleDataset


class Tiny(ClassificationWorkload):
    """Gaussian blobs, one per class, in `num_features` dimensions: learnable to a low error.

    `head_bias` sets the first logit's bias of the freshly built model: a large value makes the
    untrained loss far from ln(num_classes) (the initial-loss sanity check's positive case); `dropout`
    after the hidden layer makes a run draw from torch's global RNG every step."""

    num_classes = 3
    hyperparameters: Mapping[str, Any] = {"width": 16, "head_bias": 0.0, "dropout": 0.0}

    def __init__(self, num_features: int = 6, train_examples: int = 300, valid_examples: int = 150) -> None:
        self.num_features = num_features
        self.sizes = (train_examples, valid_examples)

    def build_model(self, params: Mapping[str, Any]) -> nn.Module:
        width = int(params["width"])
        dropout: list[nn.Module] = [nn.Dropout(float(params["dropout"]))] if params["dropout"] else []
        model = nn.Sequential(
            nn.Linear(self.num_features, width), nn.ReLU(), *dropout, nn.Linear(width, self.num_classes)
        )
        if params["head_bias"]:
            with torch.no_grad():
                model[-1].bias[0] = float(params["head_bias"])
        return model

    def datasets(self) -> tuple[TensorDataset, TensorDataset]:
        g = torch.Generator().manual_seed(1234)
        centers = 2.0 * torch.randn(self.num_classes, self.num_features, generator=g)
        total = sum(self.sizes)
        labels = torch.randint(self.num_classes, (total,), generator=g)
        inputs = centers[labels] + torch.randn(total, self.num_features, generator=g)
        n = self.sizes[0]
        return TensorDataset(inputs[:n], labels[:n]), TensorDataset(inputs[n:], labels[n:])


class BrokenModel(Tiny):
    """A workload with a bug: building the model raises."""

    def build_model(self, params: Mapping[str, Any]) -> nn.Module:
        raise RuntimeError("boom: this workload cannot build its model")


class _OutOfMemory(nn.Module):
    def __init__(self, features: int, classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(features, classes)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")


class OutOfMemory(Tiny):
    """A model too large for the device: its forward pass raises torch's out-of-memory error."""

    def build_model(self, params: Mapping[str, Any]) -> nn.Module:
        return _OutOfMemory(self.num_features, self.num_classes)


class _Examples(Dataset[tuple[torch.Tensor, int]]):
    """Single examples of two tensors, `dataset[i] -> (input, label)`, as a user's Dataset answers
    them; `noise` adds per-example Gaussian noise drawn from torch's global RNG (a transform)."""

    def __init__(self, inputs: torch.Tensor, labels: torch.Tensor, noise: float = 0.0) -> None:
        self.inputs, self.labels, self.noise = inputs, labels, noise

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if not isinstance(index, int):
            raise TypeError(f"a single-example dataset takes an int, got {type(index).__name__}")
        x = self.inputs[index]
        if self.noise:
            x = x + self.noise * torch.randn(x.shape)
        return x, int(self.labels[index])


class TinyExamples(Tiny):
    """`Tiny`'s data as map-style datasets of single examples, loaded through a DataLoader."""

    def __init__(self, noise: float = 0.0, **options: Any) -> None:
        super().__init__(**options)
        self.noise = noise

    def datasets(self) -> tuple[ExampleDataset, ExampleDataset]:  # type: ignore[override]
        train, valid = super().datasets()
        return ExampleDataset(_Examples(*train.tensors, noise=self.noise)), ExampleDataset(_Examples(*valid.tensors))
