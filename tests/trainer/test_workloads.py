"""Issue item 1: the built-in workloads, a user workload by import path, and the config checks that
refuse a run before its first step with a `ConfigError` naming the field."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from hpo.trainer import ConfigError, train
from hpo.trainer.loop import check_config
from hpo.trainer.workloads import SyntheticMLP, load_workload, resolve_model_params

from .conftest import SMALL_DATA, make_config, read_metrics, series

TINY = "tests.trainer.custom_workload:Tiny"


def test_synthetic_mlp_chance_loss_and_first_loss_near_it(tmp_path: Path) -> None:
    workload = SyntheticMLP(**SMALL_DATA)
    assert workload.chance_loss == pytest.approx(math.log(4))
    train_set, valid_set = workload.datasets()
    assert (len(train_set), len(valid_set)) == (512, 256)
    x, y = train_set[torch.arange(512)]
    assert x.shape == (512, 8) and y.dtype == torch.int64
    # Every class occurs: a teacher that labels everything alike would make the task trivial.
    assert set(y.tolist()) == {0, 1, 2, 3}

    result = train(make_config(), tmp_path)
    assert result.status == "completed"
    first = series(read_metrics(tmp_path), "train/loss")[1]
    assert abs(first - math.log(4)) < 0.15 * math.log(4)
    assert not any(w.startswith("initial_loss") for w in result.warnings)


def test_synthetic_mlp_data_is_fixed_by_data_seed_not_run_seed() -> None:
    a = SyntheticMLP(**SMALL_DATA).datasets()[0].tensors
    b = SyntheticMLP(**SMALL_DATA).datasets()[0].tensors
    c = SyntheticMLP(**SMALL_DATA, data_seed=1).datasets()[0].tensors
    assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])


def test_digits_trains_to_low_error(tmp_path: Path) -> None:
    config = {
        "params": {"optimizer": "adam", "learning_rate": 0.003, "batch_size": 64, "width": 64},
        "trainer": {"workload": "digits", "max_train_steps": 150, "eval_every_steps": 150},
        "seed": 0,
    }
    result = train(config, tmp_path)
    assert result.status == "completed", result.reason
    assert result.final_metrics["valid/examples"] == 360  # 20% of scikit-learn's 1,797 digits
    assert result.final_metrics["valid/error_rate"] < 0.2


def test_user_workload_by_import_path_trains(tmp_path: Path) -> None:
    config = {
        "params": {"optimizer": "adam", "learning_rate": 0.01, "batch_size": 32, "width": 16},
        "trainer": {"workload": TINY, "workload_options": {"train_examples": 256}, "max_train_steps": 30},
        "seed": 0,
    }
    config["trainer"]["eval_every_steps"] = 30
    result = train(config, tmp_path)
    assert result.status == "completed", result.reason
    assert result.final_metrics["valid/examples"] == 150
    assert result.final_metrics["valid/error_rate"] < 0.2  # chance is 2/3
    losses = series(read_metrics(tmp_path), "train/loss")
    assert losses[30] < 0.5 * losses[1]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"trainer": {"workload": "no_such_workload"}}, "trainer.workload"),
        ({"trainer": {"workload": "tests.trainer.no_such_module:X"}}, "cannot import"),
        ({"trainer": {"workload": "tests.trainer.custom_workload:Missing"}}, "no callable 'Missing'"),
        ({"trainer": {"workload_options": {"num_features": 8, "colour": "red"}}}, "workload_options"),
        ({"trainer": {"max_steps": 10}}, "max_steps"),
        ({"trainer": {"max_train_steps": 0}}, "trainer.max_train_steps"),
        ({"trainer": {"sanity_checks": "yes"}}, "trainer.sanity_checks"),
        ({"params": {"widht": 64}}, "widht"),
        ({"params": {"optimizer": "lamb"}}, "params.optimizer"),
        ({"params": {"learning_rate": -0.1}}, "params.learning_rate"),
        ({"params": {"learning_rate": float("nan")}}, "params.learning_rate"),
        ({"params": {"momentum": 1.0}}, "params.momentum"),
        ({"params": {"batch_size": 0}}, "params.batch_size"),
        ({"params": {"batch_size": 12.5}}, "params.batch_size"),
        ({"params": {"lr_schedule": "step"}}, "params.lr_schedule"),
        ({"params": {"grad_clip_norm": 0}}, "params.grad_clip_norm"),
        ({"params": {"dropout": 1.5}}, "params.dropout"),
        ({"params": {"activation": "swish"}}, "params.activation"),
        ({"params": {"width": 0}}, "params.width"),
        ({"objective": {"metric": "valid/bleu"}}, "objective.metric"),
        ({"objective": {"metric": "valid/loss", "mode": "lowest"}}, "objective.mode"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_config_is_a_config_error_naming_the_field(tmp_path: Path, change: dict[str, Any], field: str) -> None:
    config = make_config()
    for key, value in change.items():
        if isinstance(value, dict):
            config[key] = {**config.get(key, {}), **value}
        else:
            config[key] = value
    with pytest.raises(ConfigError, match=field.replace(".", r"\.").replace("(", r"\(")):
        check_config(config)
    out = tmp_path / "run"
    with pytest.raises(ConfigError):
        train(config, out)
    assert not out.exists(), "a refused config must not start a run"


def test_trainer_block_may_hold_hyperparameter_defaults_that_params_override() -> None:
    config = make_config(params={"learning_rate": 0.5}, trainer={"learning_rate": 0.1, "warmup_steps": 3})
    run_config, _ = check_config(config)
    assert run_config.hparams.learning_rate == 0.5
    assert run_config.hparams.warmup_steps == 3


def test_model_hyperparameters_resolve_with_defaults() -> None:
    workload = load_workload("digits")
    resolved = resolve_model_params(workload, {"width": 8})
    assert resolved["width"] == 8 and resolved["num_layers"] == 2 and resolved["input_noise"] == 0.0
    with pytest.raises(ConfigError, match="params.input_noise"):
        resolve_model_params(workload, {"input_noise": -1.0})


@pytest.mark.parametrize("name", ["synthetic_mlp", "digits"])
def test_fused_mean_loss_is_the_mean_of_the_per_example_loss(name: str) -> None:
    """The loop trains on a built-in's fused `mean_loss`; it must be the contract's `loss(...).mean()`."""
    workload = load_workload(name, {})
    logits = torch.randn(64, workload.num_classes, generator=torch.Generator().manual_seed(0))
    labels = torch.randint(workload.num_classes, (64,), generator=torch.Generator().manual_seed(1))
    for smoothing in (0.0, 0.1):
        fused = workload.mean_loss(logits, labels, smoothing)
        assert fused.shape == ()
        assert fused.item() == pytest.approx(workload.loss(logits, labels, smoothing).mean().item(), rel=1e-6)


def test_a_subclass_with_its_own_loss_trains_on_it() -> None:
    """The fused mean belongs to the base class's cross-entropy; a subclass that overrides `loss`
    (class weights, a different criterion) must not be trained on the base's loss instead."""

    class Doubled(SyntheticMLP):
        def loss(self, logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float) -> torch.Tensor:
            return 2.0 * super().loss(logits, labels, label_smoothing)

    workload, plain = Doubled(), SyntheticMLP()
    logits = torch.randn(16, workload.num_classes, generator=torch.Generator().manual_seed(0))
    labels = torch.randint(workload.num_classes, (16,), generator=torch.Generator().manual_seed(1))
    mean = workload.mean_loss(logits, labels, 0.0)
    assert mean.item() == pytest.approx(workload.loss(logits, labels, 0.0).mean().item(), rel=1e-6)
    assert mean.item() == pytest.approx(2.0 * plain.mean_loss(logits, labels, 0.0).item(), rel=1e-6)
