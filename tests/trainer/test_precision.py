"""Trainer settings `precision` (bf16/fp16 autocast) and `grad_accumulation_steps`: accumulating
k micro-batches trains like the whole batch at once; bf16 trains on the CPU; fp16 scales the loss
and resumes its scaler; bad values are refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpo.trainer import ConfigError, train
from tests.trainer.conftest import make_config, read_metrics

COMPARED = ("train/loss", "valid/loss", "valid/error_rate")


def curves(out: Path) -> dict[tuple[int, str], float]:
    return {(step, name): value for step, name, value in read_metrics(out) if name in COMPARED}


def test_accumulated_micro_batches_train_like_the_whole_batch(tmp_path: Path) -> None:
    whole = train(make_config(), tmp_path / "whole")
    split = train(make_config(trainer={"grad_accumulation_steps": 4}), tmp_path / "split")
    assert (whole.status, split.status) == ("completed", "completed")
    a, b = curves(tmp_path / "whole"), curves(tmp_path / "split")
    assert a.keys() == b.keys()
    for key in a:
        assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains(tmp_path: Path, precision: str) -> None:
    result = train(make_config(trainer={"precision": precision, "max_train_steps": 40}), tmp_path)
    assert result.status == "completed", result.reason
    losses = [value for _, name, value in read_metrics(tmp_path) if name == "train/loss"]
    assert sum(losses[-5:]) < sum(losses[:5]), "the loss fell"


def test_bad_settings_are_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="trainer.precision"):
        train(make_config(trainer={"precision": "fp8"}), tmp_path / "a")
    with pytest.raises(ConfigError, match="grad_accumulation_steps=5 must divide"):
        train(make_config(trainer={"grad_accumulation_steps": 5}), tmp_path / "b")
