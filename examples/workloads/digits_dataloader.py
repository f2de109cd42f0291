"""A workload whose datasets are ordinary map-style `torch.utils.data.Dataset`s of single examples,
loaded by a DataLoader: copy this shape for your own images, files or records.

scikit-learn's bundled 8x8 digits (no download), as 1x8x8 images; training examples go through a
per-example transform (a random shift of up to `max_shift` pixels). Name it in a run's config:

    {"trainer": {"workload": "examples.workloads.digits_dataloader:DigitsImages",
                 "workload_options": {"max_shift": 1}, "data_workers": 2}, ...}

(with the repository root on PYTHONPATH, or put the module in your own package).

The transform draws from a generator seeded by the example's index, not from a global RNG: with
`trainer.data_workers > 0` the DataLoader's worker processes hold RNG state no checkpoint saves, so
a transform seeded by its example is what keeps a resumed run's augmentation reproducible
(hpo.trainer.batches). With `data_workers = 0`, a transform may use torch's global RNG and still
resume exactly.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from hpo.trainer.workloads import ClassificationWorkload, ExampleDataset


class DigitImages(Dataset[tuple[torch.Tensor, int]]):
    """`dataset[i] -> (image [1, 8, 8] float32 in [0, 1], label int)`, one example at a time."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, max_shift: int = 0, seed: int = 0) -> None:
        self.images, self.labels = images, labels
        self.max_shift, self.seed = max_shift, seed

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = self.images[index]
        if self.max_shift:
            image = self.shift(image, index)
        return image, int(self.labels[index])

    def shift(self, image: torch.Tensor, index: int) -> torch.Tensor:
        # Seeded by the example alone: the same example is shifted alike wherever and whenever it is
        # read. (Mix in an epoch number from your own bookkeeping for a new shift each epoch.)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        dy, dx = torch.randint(-self.max_shift, self.max_shift + 1, (2,), generator=g).tolist()
        return torch.roll(image, shifts=(dy, dx), dims=(1, 2))


class DigitsImages(ClassificationWorkload):
    """A small convolutional network on the digits, fed by a DataLoader (`ExampleDataset`)."""

    num_classes = 10
    hyperparameters: Mapping[str, Any] = {"channels": 16}

    def __init__(self, max_shift: int = 1, valid_fraction: float = 0.2, split_seed: int = 0) -> None:
        self.max_shift = max_shift
        self.split = (valid_fraction, split_seed)

    def build_model(self, params: Mapping[str, Any]) -> nn.Module:
        channels = int(params["channels"])
        return nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(channels * 4 * 4, self.num_classes),
        )

    def datasets(self) -> tuple[ExampleDataset, ExampleDataset]:
        x_train, y_train, x_valid, y_valid = _digit_images(*self.split)
        train = DigitImages(x_train, y_train, max_shift=self.max_shift, seed=self.split[1])
        return ExampleDataset(train), ExampleDataset(DigitImages(x_valid, y_valid))


@functools.lru_cache(maxsize=2)
def _digit_images(valid_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x_train, x_valid, y_train, y_valid = train_test_split(
        data.images / 16.0, data.target, test_size=valid_fraction, random_state=seed, stratify=data.target
    )

    def images(x: Any) -> torch.Tensor:
        return torch.as_tensor(x, dtype=torch.float32).unsqueeze(1)

    def labels(y: Any) -> torch.Tensor:
        return torch.as_tensor(y, dtype=torch.int64)

    return images(x_train), labels(y_train), images(x_valid), labels(y_valid)
