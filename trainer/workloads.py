"""Workloads: what to train, independent of how (trainer/README.md, "Your own workload"), after
MLCommons algoperf's `Workload`, which keeps the training loop independent of any one model.

Built-ins need no download: `synthetic_mlp` (labels from a fixed random teacher network) and
`digits` (scikit-learn's bundled 8x8 digits). A user's own workload is named by import path,
`package.module:Name`, where `Name` is a class (or any callable) returning an object with the
`Workload` protocol; `trainer.workload_options` are passed to it as keyword arguments.

The easy way is to subclass `ClassificationWorkload`, which implements everything but
`build_model` and `datasets`:

    class MyTask(ClassificationWorkload):
        num_classes = 5
        hyperparameters = {"width": 64}            # model hyperparameters and their defaults

        def build_model(self, params):
            return torch.nn.Sequential(torch.nn.Linear(20, params["width"]), torch.nn.ReLU(),
                                       torch.nn.Linear(params["width"], self.num_classes))

        def datasets(self):
            return TensorDataset(x_train, y_train), TensorDataset(x_valid, y_valid)

Datasets come in two kinds. A batch-indexable dataset (`IndexableDataset`: a `TensorDataset`, or
anything answering `dataset[index_tensor]` with the whole batch) is gathered with one index per
step, the fast path. An ordinary map-style `torch.utils.data.Dataset` whose `dataset[i]` answers ONE
example `(input, label)` (often with a per-example transform) is returned wrapped in
`ExampleDataset`, and is then loaded by a `torch.utils.data.DataLoader` with `trainer.data_workers`
worker processes and the default collate (or the wrapper's `collate_fn`):

        def datasets(self):
            return ExampleDataset(MyImages("train", transform=flip)), ExampleDataset(MyImages("valid"))

The wrapper is the opt-in: nothing is guessed from a dataset's type, so a dataset that is not
wrapped keeps the batch-indexed path. Both kinds see the same batches step by step (the loader's
`batch_sampler` is the step-based order of `sampling`), so exact resume and DDP sharding hold
alike; only randomness inside DataLoader workers escapes checkpoints (see `hpo.trainer.batches`).
`examples/workloads/digits_dataloader.py` is a complete example.
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from .batches import ExampleDataset as ExampleDataset  # re-exported: workloads wrap their datasets in it
from .char_lm import CharLM
from .errors import ConfigError


@runtime_checkable
class IndexableDataset(Protocol):
    """A map-style dataset indexed by a 1-D int64 tensor of positions, answering the whole batch
    `(inputs, labels)` at once (`torch.utils.data.TensorDataset` is one). Batches are gathered by
    index, not example by example, so the input pipeline costs one gather per step."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: Any) -> Any: ...


@runtime_checkable
class Workload(Protocol):
    """What the training loop needs from a task. Implementations hold no training state; every
    method may be called on every rank.

    Attributes:
        num_classes: number of classes (the chance loss is ln(num_classes)).
        hyperparameters: the model hyperparameters this workload accepts, with their defaults.
            Any other name in `params` (besides the trainer's own) is a `ConfigError`.

    Methods:
        check_params(params): raise `ConfigError` for a bad model hyperparameter value; `params`
            holds every name of `hyperparameters`, defaults filled in.
        build_model(params): a fresh `nn.Module` mapping a batch of inputs to logits
            `[batch, num_classes]`. Called under a seeded RNG shared by every rank.
        datasets(): `(train, valid)`, each an `IndexableDataset` (gathered a batch at a time by
            an index tensor) or an `ExampleDataset` (a map-style dataset of single examples,
            loaded by a DataLoader with `trainer.data_workers` workers; see the module doc);
            labels are int64 class indices. The same on every rank and every call (no randomness
            beyond a fixed seed, apart from per-example transforms).
        loss(logits, labels, label_smoothing): per-example training loss, shape `[batch]`.
        mean_loss(logits, labels, label_smoothing), optional: `loss(...).mean()` in one fused
            call where the workload has one (the built-ins use cross-entropy's own mean, which
            saves 20 us a step on a 1 ms step); the loop trains on it when present.
        augment(inputs, labels, generator, params): the training inputs after augmentation; draws
            only from `generator` (per rank, saved in checkpoints). Runs on the whole batch in the
            training process, after a DataLoader's collate too.
        eval_sums(logits, labels, weights): per-batch sums as float64 tensors (same keys and shapes
            every batch); examples of weight 0 must not count. Summed over batches and ranks.
        eval_metrics(sums): metric values (names without the `valid/` prefix) from the totals.
        metric_names(): the names `eval_metrics` answers (checked against the objective up front).
        chance_loss: the loss of an uninformed model, or None to skip that sanity check."""

    num_classes: int
    hyperparameters: Mapping[str, Any]
    chance_loss: float | None

    def check_params(self, params: Mapping[str, Any]) -> None: ...

    def build_model(self, params: Mapping[str, Any]) -> nn.Module: ...

    def datasets(self) -> tuple[Any, Any]: ...

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float) -> torch.Tensor: ...

    def augment(
        self, inputs: torch.Tensor, labels: torch.Tensor, generator: torch.Generator, params: Mapping[str, Any]
    ) -> torch.Tensor: ...

    def eval_sums(
        self, logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor
    ) -> dict[str, torch.Tensor]: ...

    def eval_metrics(self, sums: Mapping[str, torch.Tensor]) -> dict[str, float]: ...

    def metric_names(self) -> tuple[str, ...]: ...


class ClassificationWorkload:
    """Cross-entropy classification: subclasses set `num_classes` and `hyperparameters` and
    implement `build_model` and `datasets`.

    Evaluation reports `loss`, `error_rate`, `accuracy`, `examples`, and per class the number of
    examples predicted correctly, `correct/class_{k}` (playbook 000, "Imbalanced datasets": for
    rare classes, log the number of examples predicted correctly)."""

    num_classes: int = 2
    hyperparameters: Mapping[str, Any] = {}

    @property
    def chance_loss(self) -> float | None:
        # Playbook (004), "Validation before training": an untrained model should score about ln(classes).
        return math.log(self.num_classes)

    def check_params(self, params: Mapping[str, Any]) -> None:
        return None

    def build_model(self, params: Mapping[str, Any]) -> nn.Module:
        raise NotImplementedError

    def datasets(self) -> tuple[Any, Any]:
        raise NotImplementedError

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float) -> torch.Tensor:
        return F.cross_entropy(logits, labels, reduction="none", label_smoothing=label_smoothing)

    def mean_loss(self, logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float) -> torch.Tensor:
        if type(self).loss is not ClassificationWorkload.loss:
            # A subclass with its own loss trains on that loss, not on this class's cross-entropy.
            return self.loss(logits, labels, label_smoothing).mean()
        return F.cross_entropy(logits, labels, label_smoothing=label_smoothing)

    def augment(
        self, inputs: torch.Tensor, labels: torch.Tensor, generator: torch.Generator, params: Mapping[str, Any]
    ) -> torch.Tensor:
        return inputs

    def eval_sums(self, logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> dict[str, torch.Tensor]:
        w = weights.to(torch.float64)
        losses = F.cross_entropy(logits.float(), labels, reduction="none").to(torch.float64)
        hits = (logits.argmax(dim=-1) == labels).to(torch.float64) * w
        return {
            "loss": (losses * w).sum(),
            "examples": w.sum(),
            "correct": hits.sum(),
            "correct_per_class": torch.bincount(labels, weights=hits, minlength=self.num_classes)[: self.num_classes],
        }

    def eval_metrics(self, sums: Mapping[str, torch.Tensor]) -> dict[str, float]:
        count = max(float(sums["examples"]), 1.0)
        correct = float(sums["correct"])
        metrics = {
            "loss": float(sums["loss"]) / count,
            "error_rate": 1.0 - correct / count,
            "accuracy": correct / count,
            "examples": float(sums["examples"]),
        }
        for k, value in enumerate(sums["correct_per_class"].tolist()):
            metrics[f"correct/class_{k}"] = float(value)
        return metrics

    def metric_names(self) -> tuple[str, ...]:
        return ("loss", "error_rate", "accuracy", "examples", *(f"correct/class_{k}" for k in range(self.num_classes)))


# -- the MLP of the built-ins ---------------------------------------------------------------------

ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
    "tanh": nn.Tanh,
    "elu": nn.ELU,
    "leaky_relu": nn.LeakyReLU,
}
NORMS = ("none", "batchnorm", "layernorm")
MLP_HYPERPARAMETERS: dict[str, Any] = {
    "num_layers": 2,
    "width": 256,
    "activation": "relu",
    "dropout": 0.0,
    "norm": "none",
}


def mlp(in_features: int, num_classes: int, params: Mapping[str, Any]) -> nn.Sequential:
    """`num_layers` hidden blocks of Linear -> norm -> activation -> dropout, then a Linear head."""
    layers: list[nn.Module] = []
    width, size = int(params["width"]), in_features
    for _ in range(int(params["num_layers"])):
        layers.append(nn.Linear(size, width))
        if params["norm"] == "batchnorm":
            layers.append(nn.BatchNorm1d(width))
        elif params["norm"] == "layernorm":
            layers.append(nn.LayerNorm(width))
        layers.append(ACTIVATIONS[params["activation"]]())
        if params["dropout"] > 0:
            layers.append(nn.Dropout(float(params["dropout"])))
        size = width
    layers.append(nn.Linear(size, num_classes))
    return nn.Sequential(*layers)


def check_mlp_params(params: Mapping[str, Any]) -> None:
    for name, minimum in (("num_layers", 0), ("width", 1)):
        value = params[name]
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not float(value).is_integer()
            or value < minimum
        ):
            raise ConfigError(f"params.{name} must be an integer >= {minimum}, got {value!r}")
    if params["activation"] not in ACTIVATIONS:
        raise ConfigError(f"unknown params.activation {params['activation']!r}; known: {', '.join(ACTIVATIONS)}")
    if params["norm"] not in NORMS:
        raise ConfigError(f"unknown params.norm {params['norm']!r}; known: {', '.join(NORMS)}")
    dropout = params["dropout"]
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise ConfigError(f"params.dropout must be in [0, 1), got {dropout!r}")


class MLPWorkload(ClassificationWorkload):
    """A classification task on flat feature vectors, trained with the MLP above."""

    num_features: int = 1
    hyperparameters: Mapping[str, Any] = MLP_HYPERPARAMETERS

    def check_params(self, params: Mapping[str, Any]) -> None:
        check_mlp_params(params)

    def build_model(self, params: Mapping[str, Any]) -> nn.Module:
        return mlp(self.num_features, self.num_classes, params)


class SyntheticMLP(MLPWorkload):
    """Gaussian inputs labelled by a fixed random teacher (`tanh` MLP, argmax of its logits): fast,
    any size, and learnable to a known ceiling. The teacher and the data come from `data_seed`, not
    the run seed, so every trial of a study trains on the same task. `label_noise` replaces that
    fraction of the labels with uniform random classes (a floor on the error rate)."""

    def __init__(
        self,
        num_features: int = 32,
        num_classes: int = 10,
        train_examples: int = 8192,
        valid_examples: int = 2048,
        teacher_width: int = 64,
        label_noise: float = 0.0,
        data_seed: int = 0,
    ) -> None:
        self.num_features, self.num_classes = num_features, num_classes
        self._spec = (num_features, num_classes, train_examples, valid_examples, teacher_width, label_noise, data_seed)

    def datasets(self) -> tuple[TensorDataset, TensorDataset]:
        x_train, y_train, x_valid, y_valid = _teacher_data(*self._spec)
        return TensorDataset(x_train, y_train), TensorDataset(x_valid, y_valid)


@functools.lru_cache(maxsize=4)
def _teacher_data(
    features: int, classes: int, n_train: int, n_valid: int, width: int, noise: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w1 = torch.randn(features, width, generator=g) / math.sqrt(features)
    w2 = torch.randn(width, classes, generator=g) * (3.0 / math.sqrt(width))
    x = torch.randn(n_train + n_valid, features, generator=g)
    y = (torch.tanh(x @ w1 * 2.0) @ w2).argmax(dim=1)
    flip = torch.rand(len(y), generator=g) < noise
    y = torch.where(flip, torch.randint(classes, y.shape, generator=g), y)
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


class Digits(MLPWorkload):
    """scikit-learn's bundled 8x8 handwritten digits (1,797 images, 10 classes; no download), split
    80/20 stratified with a fixed seed; pixels scaled to [0, 1]. `input_noise` adds Gaussian noise of
    that standard deviation to training inputs (an augmentation, seeded per rank)."""

    num_features = 64
    num_classes = 10
    hyperparameters: Mapping[str, Any] = {**MLP_HYPERPARAMETERS, "input_noise": 0.0}

    def __init__(self, valid_fraction: float = 0.2, split_seed: int = 0) -> None:
        self._split = (valid_fraction, split_seed)

    def check_params(self, params: Mapping[str, Any]) -> None:
        check_mlp_params(params)
        noise = params["input_noise"]
        if isinstance(noise, bool) or not isinstance(noise, (int, float)) or not 0 <= noise < math.inf:
            raise ConfigError(f"params.input_noise must be a number >= 0, got {noise!r}")

    def datasets(self) -> tuple[TensorDataset, TensorDataset]:
        x_train, y_train, x_valid, y_valid = _digits(*self._split)
        return TensorDataset(x_train, y_train), TensorDataset(x_valid, y_valid)

    def augment(
        self, inputs: torch.Tensor, labels: torch.Tensor, generator: torch.Generator, params: Mapping[str, Any]
    ) -> torch.Tensor:
        noise = float(params["input_noise"])
        if noise == 0:
            return inputs
        return inputs + noise * torch.randn(inputs.shape, generator=generator, device=inputs.device, dtype=inputs.dtype)


@functools.lru_cache(maxsize=2)
def _digits(valid_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x_train, x_valid, y_train, y_valid = train_test_split(
        data.data / 16.0, data.target, test_size=valid_fraction, random_state=seed, stratify=data.target
    )
    as_x = functools.partial(torch.as_tensor, dtype=torch.float32)
    as_y = functools.partial(torch.as_tensor, dtype=torch.int64)
    return as_x(x_train), as_y(y_train), as_x(x_valid), as_y(y_valid)


# -- registry ----------------------------------------------------------------------------------------

WORKLOADS: dict[str, Callable[..., Workload]] = {
    "synthetic_mlp": SyntheticMLP,  # type: ignore[dict-item]
    "digits": Digits,  # type: ignore[dict-item]
    "char_lm": CharLM,  # type: ignore[dict-item]
}


def register_workload(name: str, factory: Callable[..., Workload]) -> None:
    """Makes `name` usable as `trainer.workload` in this process."""
    WORKLOADS[name] = factory


def load_workload(name: str, options: Mapping[str, Any] | None = None) -> Workload:
    """A registered name or an import path `package.module:Name`; raises `ConfigError`."""
    factory = _import_factory(name) if ":" in name else WORKLOADS.get(name)
    if factory is None:
        raise ConfigError(f"unknown trainer.workload {name!r}; known: {', '.join(WORKLOADS)} or package.module:Class")
    try:
        workload = factory(**dict(options or {}))
    except TypeError as exc:
        raise ConfigError(f"trainer.workload_options do not fit {name!r}: {exc}") from exc
    missing = [
        a for a in ("num_classes", "hyperparameters", "build_model", "datasets", "loss") if not hasattr(workload, a)
    ]
    if missing:
        raise ConfigError(f"workload {name!r} lacks {', '.join(missing)} (see hpo.trainer.workloads.Workload)")
    return workload


def _import_factory(path: str) -> Callable[..., Workload]:
    module_name, _, attribute = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"trainer.workload {path!r}: cannot import {module_name!r}: {exc}") from exc
    factory = getattr(module, attribute, None)
    if factory is None or not callable(factory):
        raise ConfigError(f"trainer.workload {path!r}: {module_name!r} has no callable {attribute!r}")
    return factory  # type: ignore[no-any-return]


def resolve_model_params(workload: Workload, given: Mapping[str, Any]) -> dict[str, Any]:
    """The workload's hyperparameters with defaults filled in; unknown names are a `ConfigError`."""
    from .config import TRAINING_HYPERPARAMETERS

    known = dict(workload.hyperparameters)
    unknown = sorted(set(given) - set(known))
    if unknown:
        names = ", ".join([*TRAINING_HYPERPARAMETERS, *known])
        raise ConfigError(f"unknown hyperparameter(s) {', '.join(unknown)}; this workload knows: {names}")
    resolved = {**known, **given}
    workload.check_params(resolved)
    return resolved
