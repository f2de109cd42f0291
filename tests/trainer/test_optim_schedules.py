"""Issue item 2: every optimizer by its playbook name trains, and the learning-rate schedules are pure
functions of the step with a linear warmup."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from hpo.trainer import train
from hpo.trainer.config import Hyperparameters
from hpo.trainer.optim import build_optimizer, unused_hyperparameters
from hpo.trainer.schedules import learning_rate

from .conftest import make_config, read_metrics, series

LEARNING_RATES = {
    "sgd": 0.3,
    "momentum": 0.05,
    "nesterov": 0.05,
    "adam": 3e-3,
    "adamw": 3e-3,
    "nadam": 3e-3,
    "rmsprop": 1e-3,
}


@pytest.mark.parametrize("optimizer", sorted(LEARNING_RATES))
def test_each_optimizer_lowers_the_training_loss(tmp_path: Path, optimizer: str) -> None:
    params = {"optimizer": optimizer, "learning_rate": LEARNING_RATES[optimizer], "weight_decay": 1e-4}
    result = train(make_config(params, {"max_train_steps": 30, "eval_every_steps": 30}), tmp_path)
    assert result.status == "completed", result.reason
    losses = series(read_metrics(tmp_path), "train/loss")
    assert sorted(losses) == list(range(1, 31))
    first, last = sum(losses[s] for s in range(1, 6)) / 5, sum(losses[s] for s in range(26, 31)) / 5
    assert last < 0.9 * first, f"{optimizer}: mean loss {first:.4f} -> {last:.4f}"
    assert result.final_metrics["valid/loss"] < math.log(4)


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2))


@pytest.mark.parametrize(
    ("name", "cls", "checks"),
    [
        ("sgd", torch.optim.SGD, {"momentum": 0.0, "nesterov": False}),
        ("momentum", torch.optim.SGD, {"momentum": 0.8, "nesterov": False, "dampening": 0}),
        ("nesterov", torch.optim.SGD, {"momentum": 0.8, "nesterov": True}),
        ("adam", torch.optim.Adam, {"betas": (0.7, 0.95), "eps": 1e-6}),
        ("adamw", torch.optim.AdamW, {"betas": (0.7, 0.95), "eps": 1e-6}),
        ("nadam", torch.optim.NAdam, {"betas": (0.7, 0.95), "eps": 1e-6}),
        ("rmsprop", torch.optim.RMSprop, {"alpha": 0.95, "momentum": 0.8, "eps": 1e-6}),
    ],
)
def test_optimizer_reads_the_playbook_hyperparameters(name: str, cls: type, checks: dict[str, object]) -> None:
    h = Hyperparameters(optimizer=name, learning_rate=0.1, momentum=0.8, beta1=0.7, beta2=0.95, epsilon=1e-6)
    optimizer = build_optimizer(_model(), Hyperparameters(**{**h.__dict__, "weight_decay": 0.01}))
    assert type(optimizer) is cls
    for group in optimizer.param_groups:
        for key, value in checks.items():
            assert group[key] == value, (name, key)
    # Weight decay on matrices only: biases and the LayerNorm's scale are not decayed.
    decayed = [g for g in optimizer.param_groups if g["weight_decay"] > 0]
    assert len(decayed) == 1 and all(p.ndim >= 2 for p in decayed[0]["params"])
    assert sum(len(g["params"]) for g in optimizer.param_groups) == 6


def test_without_weight_decay_every_parameter_is_in_one_group() -> None:
    model = _model()
    optimizer = build_optimizer(model, Hyperparameters(optimizer="adam", weight_decay=0.0))
    assert len(optimizer.param_groups) == 1
    assert optimizer.param_groups[0]["params"] == list(model.parameters())


def test_hyperparameters_the_optimizer_does_not_read_are_warned_about(tmp_path: Path) -> None:
    assert unused_hyperparameters(Hyperparameters(optimizer="adam"), {"momentum", "learning_rate"}) == ["momentum"]
    assert unused_hyperparameters(Hyperparameters(optimizer="nesterov"), {"momentum", "beta2"}) == ["beta2"]
    result = train(make_config({"optimizer": "adam", "momentum": 0.5}, {"max_train_steps": 2}), tmp_path)
    assert any("momentum" in w and "adam" in w for w in result.warnings), result.warnings


def test_constant_schedule_with_warmup_ramps_linearly() -> None:
    rates = [learning_rate(s, 0.4, "constant", 4, 20) for s in range(20)]
    assert rates[:4] == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert rates[4:] == [0.4] * 16
    assert [learning_rate(s, 0.4, "constant", 0, 20) for s in range(20)] == [0.4] * 20


def test_linear_schedule_falls_to_base_over_remaining() -> None:
    base, warmup, total = 1.0, 2, 12
    rates = [learning_rate(s, base, "linear", warmup, total) for s in range(total)]
    assert rates[:2] == pytest.approx([0.5, 1.0])
    assert rates[2] == pytest.approx(1.0)  # the decay starts at the base rate
    assert rates[2:] == pytest.approx([1.0 - k / 10 for k in range(10)])
    assert rates[-1] == pytest.approx(base / 10)  # no update is spent at rate 0
    assert all(a > b for a, b in zip(rates[2:], rates[3:], strict=False))


def test_cosine_schedule_ends_near_zero() -> None:
    base, warmup, total = 2.0, 10, 110
    rates = [learning_rate(s, base, "cosine", warmup, total) for s in range(total)]
    assert rates[0] == pytest.approx(0.2) and rates[9] == pytest.approx(2.0)
    assert rates[10] == pytest.approx(2.0)
    assert rates[60] == pytest.approx(1.0)  # half way through the decay: half the base
    assert 0 < rates[-1] < 1e-3 * base
    assert all(a >= b for a, b in zip(rates[10:], rates[11:], strict=False))
    # Past the end (a caller asking beyond max_train_steps) stays at the end value, never negative.
    assert learning_rate(500, base, "cosine", warmup, total) == pytest.approx(0.0, abs=1e-12)


def test_unknown_schedule_raises() -> None:
    with pytest.raises(ValueError, match="lr_schedule"):
        learning_rate(0, 1.0, "exponential", 0, 10)


def test_run_reports_the_schedule_every_logged_step(tmp_path: Path) -> None:
    params = {"lr_schedule": "cosine", "warmup_steps": 5, "learning_rate": 0.02}
    train(make_config(params, {"max_train_steps": 20, "log_every_steps": 1}), tmp_path)
    reported = series(read_metrics(tmp_path), "train/learning_rate")
    assert reported == {s + 1: learning_rate(s, 0.02, "cosine", 5, 20) for s in range(20)}
