"""Issue item 5: checkpoints are written atomically, hold what a resume needs, and the folder keeps
the `keep_best_checkpoints` best by the objective plus the newest."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from hpo.trainer import train
from hpo.trainer.checkpoints import (
    checkpoint_path,
    kept_steps,
    list_checkpoints,
    load,
    prune,
    save_atomic,
)
from hpo.trainer.config import Objective
from hpo.trainer.result import RunResult

from .conftest import make_config, read_metrics, series


def _expected_kept(values: dict[int, float], keep: int, mode: str) -> set[int]:
    sign = 1 if mode == "min" else -1
    ranked = sorted(values, key=lambda step: (sign * values[step], step))
    return set(ranked[:keep]) | {max(values)}


@pytest.mark.parametrize(("metric", "mode"), [("valid/error_rate", "min"), ("valid/accuracy", "max")])
def test_keeps_the_best_checkpoints_plus_the_newest(tmp_path: Path, metric: str, mode: str) -> None:
    config = make_config(
        {"optimizer": "momentum", "learning_rate": 0.2},
        {"max_train_steps": 25, "eval_every_steps": 5, "keep_best_checkpoints": 2},
        objective={"metric": metric, "mode": mode},
    )
    result = train(config, tmp_path)
    values = series(read_metrics(tmp_path), metric)
    assert sorted(values) == [5, 10, 15, 20, 25]
    kept = {step for step, _ in list_checkpoints(tmp_path / "checkpoints")}
    assert kept == _expected_kept(values, 2, mode)
    assert len(kept) == 3, f"this run's best two are not its newest, so three files remain: {values}"
    best = min(values.values()) if mode == "min" else max(values.values())
    assert result.best_value == best
    assert result.best_step == min(step for step, value in values.items() if value == best)
    assert result.best_checkpoint == str(checkpoint_path(tmp_path / "checkpoints", result.best_step))
    assert RunResult.read(tmp_path / "result.json") == result


def test_periodic_checkpoints_are_pruned_once_a_newer_one_exists(tmp_path: Path) -> None:
    config = make_config(
        trainer={"max_train_steps": 23, "eval_every_steps": 10, "checkpoint_every_steps": 3, "keep_best_checkpoints": 1}
    )
    seen: list[int] = []

    class Recorder:
        def metrics(self, step: int, values: dict[str, float]) -> None:
            pass

        def checkpoint(self, step: int, path: str, objective_value: float | None) -> None:
            seen.append(step)
            assert Path(path).is_file()
            assert (objective_value is None) == (step % 10 != 0 and step != 23)

        def should_stop(self) -> bool:
            return False

    result = train(config, tmp_path, Recorder())
    assert result.status == "completed", result.reason
    assert seen == [3, 6, 9, 10, 12, 15, 18, 20, 21, 23]
    kept = {step for step, _ in list_checkpoints(tmp_path / "checkpoints")}
    assert kept == {result.best_step, 23}


def test_a_checkpoint_holds_what_resume_needs(tmp_path: Path) -> None:
    train(make_config({"dropout": 0.1}, {"max_train_steps": 10}), tmp_path)
    state = load(checkpoint_path(tmp_path / "checkpoints", 10))
    assert state["step"] == 10 and state["world_size"] == 1
    assert all(t.device.type == "cpu" for t in state["model"].values())
    assert not any(k.startswith("module.") for k in state["model"])  # unwrapped from DDP
    assert state["optimizer"]["state"], "Adam's moments are saved"
    assert len(state["rng"]) == 1 and set(state["rng"][0]) >= {"torch", "augment", "numpy", "python"}
    assert state["config"]["params"]["dropout"] == 0.1
    assert state["config"]["params"]["num_layers"] == 2  # resolved: defaults filled in
    assert state["history"]["objectives"] == {"10": series(read_metrics(tmp_path), "valid/error_rate")[10]}
    # No probe file of the pre-training round trip and no temporary is left behind.
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000010.pt"]


def test_save_is_atomic_and_load_refuses_foreign_files(tmp_path: Path) -> None:
    path = tmp_path / "c" / "step-00000001.pt"
    save_atomic({"format": 1, "step": 1, "x": torch.arange(3)}, path)
    assert [p.name for p in path.parent.iterdir()] == [path.name]
    assert torch.equal(load(path)["x"], torch.arange(3))
    torch.save({"step": 1}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not an hpo trainer checkpoint"):
        load(tmp_path / "other.pt")


def test_leftover_temporaries_are_removed_and_not_listed(tmp_path: Path) -> None:
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    (directory / "step-00000005.pt.tmp123").write_bytes(b"torn")
    (directory / "sanity-check.tmp").write_bytes(b"torn")
    assert list_checkpoints(directory) == []
    result = train(make_config(trainer={"max_train_steps": 10}), tmp_path)
    assert result.status == "completed"
    assert sorted(p.name for p in directory.iterdir()) == ["step-00000010.pt"]


def test_kept_steps_ranks_by_objective_and_keeps_the_newest() -> None:
    objectives: dict[int, float | None] = {1: 0.5, 2: 0.2, 3: None, 4: 0.2, 5: math.nan, 6: 0.9}
    assert kept_steps(objectives, 2, Objective(mode="min")) == {2, 4, 6}
    assert kept_steps(objectives, 1, Objective(mode="min")) == {2, 6}  # ties: the earlier step
    assert kept_steps(objectives, 2, Objective(mode="max")) == {6, 1}
    assert kept_steps({3: None}, 2, Objective()) == {3}
    assert kept_steps({}, 2, Objective()) == set()


def test_prune_deletes_what_is_not_kept(tmp_path: Path) -> None:
    objectives = {1: 0.3, 2: 0.1, 3: 0.2, 4: None}
    for step in objectives:
        save_atomic({"format": 1, "step": step}, checkpoint_path(tmp_path, step))
    removed = prune(tmp_path, objectives.get, 1, Objective())
    assert removed == [1, 3]
    assert [step for step, _ in list_checkpoints(tmp_path)] == [2, 4]
