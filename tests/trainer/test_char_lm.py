"""`char_lm`: the built-in workload that is not classification (a character-level language model on
text shipped in the package) trains with the same loop, resumes exactly, and reports token metrics."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from hpo.policy import BUILTIN_WORKLOADS
from hpo.trainer import train
from hpo.trainer.workloads import WORKLOADS, load_workload
from tests.trainer.conftest import read_metrics


def config(steps: int = 60, **trainer: Any) -> dict[str, Any]:
    return {
        "params": {"optimizer": "adam", "learning_rate": 0.01, "batch_size": 32, "hidden": 64},
        "trainer": {"workload": "char_lm", "max_train_steps": steps, "eval_every_steps": 30, **trainer},
        "objective": {"metric": "valid/loss", "mode": "min"},
        "seed": 1,
    }


def test_the_language_model_learns_and_reports_token_metrics(tmp_path: Path) -> None:
    result = train(config(), tmp_path)
    assert result.status == "completed", result.reason
    valid = {name: value for step, name, value in read_metrics(tmp_path) if step == 60 and name.startswith("valid/")}
    chance = math.log(load_workload("char_lm").num_classes)
    assert valid["valid/loss"] < 0.9 * chance, "better than an uninformed model"
    assert math.isclose(valid["valid/perplexity"], math.exp(valid["valid/loss"]))
    assert 0.0 <= valid["valid/error_rate"] < 1.0 and valid["valid/tokens"] > 0


def test_eval_sums_count_every_token_once_with_weights() -> None:
    workload = load_workload("char_lm", {"context": 8})
    logits = torch.zeros(3, 8, workload.num_classes)
    labels = torch.zeros(3, 8, dtype=torch.int64)
    sums = workload.eval_sums(logits, labels, torch.tensor([1.0, 1.0, 0.0]))
    metrics = workload.eval_metrics(sums)
    assert metrics["tokens"] == 16.0
    assert math.isclose(metrics["loss"], math.log(workload.num_classes), rel_tol=1e-6)
    assert workload.loss(logits, labels, 0.0).shape == (3,)


def test_char_lm_is_a_builtin_everywhere() -> None:
    assert "char_lm" in WORKLOADS and "char_lm" in BUILTIN_WORKLOADS
