"""Issue items 3, 4 and 10 on one process: gradient clipping and its metrics, evaluation cadence, and
the throughput metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hpo.trainer import ConfigError, train
from hpo.trainer.checkpoints import checkpoint_path, list_checkpoints, load
from hpo.trainer.loop import check_config
from hpo.trainer.sampling import derive_seed

from .conftest import make_config, read_metrics, series

# -- 3. gradient clipping ---------------------------------------------------------------------------


def test_tiny_clip_clips_every_step_and_reports_the_unclipped_norm(tmp_path: Path) -> None:
    params = {"optimizer": "sgd", "learning_rate": 0.1}
    clipped = train(make_config({**params, "grad_clip_norm": 1e-3}, {"max_train_steps": 5}), tmp_path / "clip")
    plain = train(make_config(params, {"max_train_steps": 5}), tmp_path / "plain")
    assert clipped.status == plain.status == "completed"
    points = read_metrics(tmp_path / "clip")
    assert series(points, "train/clipped_fraction") == {s: 1.0 for s in range(1, 6)}
    norms = series(points, "train/grad_norm")
    assert all(norm > 1e-3 for norm in norms.values())
    # The first step starts from the same model and batch: the reported norm is the unclipped one.
    assert norms[1] == series(read_metrics(tmp_path / "plain"), "train/grad_norm")[1]
    assert "train/clipped_fraction" not in {name for _, name, _ in read_metrics(tmp_path / "plain")}


def test_clipping_bounds_the_update(tmp_path: Path) -> None:
    """One plain SGD step moves the parameters by exactly learning_rate * clip (norm over all)."""
    config = make_config({"optimizer": "sgd", "learning_rate": 0.1, "grad_clip_norm": 1e-3}, {"max_train_steps": 1})
    train(config, tmp_path)
    after = load(checkpoint_path(tmp_path / "checkpoints", 1))["model"]
    run_config, workload = check_config(config)
    torch.manual_seed(derive_seed(0, "init"))
    before = workload.build_model(run_config.model_params).state_dict()
    moved = torch.linalg.vector_norm(torch.cat([(after[k] - before[k]).flatten() for k in before]))
    assert moved.item() == pytest.approx(0.1 * 1e-3, rel=1e-4)


def test_clipped_fraction_counts_the_steps_over_the_threshold(tmp_path: Path) -> None:
    clip = 0.45  # between the smallest and largest gradient norms of this run
    train(make_config({"grad_clip_norm": clip}, {"max_train_steps": 20}), tmp_path)
    points = read_metrics(tmp_path)
    norms, fractions = series(points, "train/grad_norm"), series(points, "train/clipped_fraction")
    over = [norms[s] > clip for s in sorted(norms)]
    assert 0 < sum(over) < len(over), f"pick a clip inside the norms' range: {sorted(norms.values())}"
    assert fractions == pytest.approx({s: sum(over[:s]) / s for s in range(1, 21)})


# -- 4. evaluation cadence --------------------------------------------------------------------------


def test_evaluation_at_multiples_of_eval_every_and_at_the_last_step(tmp_path: Path) -> None:
    result = train(make_config(trainer={"max_train_steps": 20, "eval_every_steps": 7}), tmp_path)
    points = read_metrics(tmp_path)
    names = {name for _, name, _ in points if name.startswith("valid/")}
    expected = {"valid/loss", "valid/error_rate", "valid/accuracy", "valid/examples"}
    assert expected | {f"valid/correct/class_{k}" for k in range(4)} == names
    for name in names:
        assert sorted(series(points, name)) == [7, 14, 20], name
    assert sorted(series(points, "train/loss")) == list(range(1, 21))
    # Checkpoints follow the evaluations by default; the kept ones are on disk.
    assert {step for step, _ in list_checkpoints(tmp_path / "checkpoints")} == {7, 14, 20}
    valid = {name: series(points, name)[20] for name in names}
    assert result.final_metrics == valid
    assert valid["valid/examples"] == 256
    assert valid["valid/accuracy"] == pytest.approx(1 - valid["valid/error_rate"])
    assert sum(valid[f"valid/correct/class_{k}"] for k in range(4)) == pytest.approx(256 * valid["valid/accuracy"])


def test_train_eval_subset_is_reported(tmp_path: Path) -> None:
    train(make_config(trainer={"train_eval_examples": 100}), tmp_path)
    examples = series(read_metrics(tmp_path), "train_eval/examples")
    assert examples == {10: 100.0, 20: 100.0}


def test_log_every_steps_thins_the_training_metrics(tmp_path: Path) -> None:
    train(make_config(trainer={"max_train_steps": 20, "log_every_steps": 6}), tmp_path)
    points = read_metrics(tmp_path)
    assert sorted(series(points, "train/loss")) == list(range(1, 21))
    assert sorted(series(points, "train/grad_norm")) == list(range(1, 21))
    assert sorted(series(points, "train/examples_per_second")) == [6, 12, 18, 20]
    assert sorted(series(points, "train/learning_rate")) == [6, 12, 18, 20]


def test_eval_batch_smaller_than_the_training_batch_is_refused(tmp_path: Path) -> None:
    config = make_config({"batch_size": 64}, {"eval_batch_size": 32})
    with pytest.raises(ConfigError, match="trainer.eval_batch_size"):
        train(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()
    # An eval batch that does not divide the validation set still counts every example once.
    result = train(make_config({"batch_size": 32}, {"eval_batch_size": 100, "max_train_steps": 10}), tmp_path / "ok")
    assert result.final_metrics["valid/examples"] == 256


# -- 10. throughput ---------------------------------------------------------------------------------


def test_throughput_metrics_every_logged_step(tmp_path: Path) -> None:
    result = train(make_config(trainer={"max_train_steps": 20, "log_every_steps": 1}), tmp_path)
    points = read_metrics(tmp_path)
    speed, wait = series(points, "train/examples_per_second"), series(points, "train/data_wait_fraction")
    assert sorted(speed) == sorted(wait) == list(range(1, 21))
    assert all(value > 0 for value in speed.values())
    assert all(0 <= value <= 1 for value in wait.values())
    assert result.examples_per_second == speed[20]
