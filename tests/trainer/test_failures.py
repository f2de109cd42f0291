"""Issue items 8 and 9: how a run ends when training goes wrong (divergence and out of memory are
answers, `infeasible`; a bug is an `error` with its traceback), and the sanity checks of playbook
004 (initial loss near chance, overfitting one batch)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from hpo.trainer import train
from hpo.trainer.checkpoints import list_checkpoints
from hpo.trainer.result import RunResult

from .conftest import SMALL_DATA, make_config, read_metrics, series


def _custom(name: str, **params: Any) -> dict[str, Any]:
    return {
        "params": {"optimizer": "adam", "learning_rate": 0.01, "batch_size": 32, "width": 16, **params},
        "trainer": {"workload": f"tests.trainer.custom_workload:{name}", "max_train_steps": 20, "eval_every_steps": 10},
        "seed": 0,
    }


# -- 8. divergence and failures ---------------------------------------------------------------------


def test_huge_learning_rate_is_infeasible_at_the_diverging_step(tmp_path: Path) -> None:
    result = train(make_config({"optimizer": "sgd", "learning_rate": 1e6}, {"max_train_steps": 50}), tmp_path)
    assert result.status == "infeasible"
    assert f"at step {result.step}" in (result.reason or "")
    assert 1 < result.step < 50
    points = read_metrics(tmp_path)
    assert max(step for step, _, _ in points) == result.step
    last = {name: value for step, name, value in points if step == result.step}
    assert not math.isfinite(last["train/loss"]), last
    # Every earlier step trained with finite numbers; no checkpoint of the diverged state is written.
    losses = series(points, "train/loss")
    assert all(math.isfinite(losses[s]) for s in range(1, result.step))
    assert all(step < result.step for step, _ in list_checkpoints(tmp_path / "checkpoints"))
    assert RunResult.read(tmp_path / "result.json").status == "infeasible"


def test_an_exception_in_the_workload_is_an_error_with_its_traceback(tmp_path: Path) -> None:
    result = train(_custom("BrokenModel"), tmp_path)
    assert result.status == "error"
    assert result.reason is not None
    assert "Traceback" in result.reason
    assert "RuntimeError: boom: this workload cannot build its model" in result.reason
    assert "custom_workload.py" in result.reason  # the user's frame is in it
    assert result.step == 0
    assert RunResult.read(tmp_path / "result.json").reason == result.reason


def test_out_of_memory_is_infeasible(tmp_path: Path) -> None:
    result = train(_custom("OutOfMemory"), tmp_path)
    assert result.status == "infeasible"
    assert result.reason is not None and result.reason.startswith("out of memory")
    assert "Tried to allocate 80.00 GiB" in result.reason


# -- 9. sanity checks -------------------------------------------------------------------------------


def test_initial_loss_far_from_chance_is_warned_about(tmp_path: Path) -> None:
    biased = train(_custom("Tiny", head_bias=30.0), tmp_path / "biased")
    clean = train(_custom("Tiny"), tmp_path / "clean")
    assert biased.status == clean.status == "completed"
    warnings = [w for w in biased.warnings if w.startswith("initial_loss")]
    assert len(warnings) == 1 and "ln(3)" in warnings[0]
    assert series(read_metrics(tmp_path / "biased"), "train/loss")[1] > 10
    assert clean.warnings == ()
    # The warning is kept in the checkpoint: a resumed run still reports it.
    again = train(_custom("Tiny", head_bias=30.0), tmp_path / "biased")
    assert again.warnings == biased.warnings


def test_sanity_checks_can_be_turned_off(tmp_path: Path) -> None:
    config = _custom("Tiny", head_bias=30.0)
    config["trainer"]["sanity_checks"] = False
    assert train(config, tmp_path).warnings == ()


def test_overfit_one_batch_drives_the_loss_down(tmp_path: Path) -> None:
    config = make_config(trainer={"max_train_steps": 60, "eval_every_steps": 60, "overfit_one_batch": True})
    result = train(config, tmp_path)
    assert result.status == "completed"
    losses = series(read_metrics(tmp_path), "train/loss")
    assert losses[1] > 1.0 and losses[60] < 0.05 * math.log(4)
    assert result.warnings == ()


def test_a_model_that_cannot_overfit_one_batch_is_warned_about(tmp_path: Path) -> None:
    """A linear model (no hidden layer) on random labels cannot fit 32 examples."""
    config = make_config(
        {"num_layers": 0},
        {
            "max_train_steps": 60,
            "eval_every_steps": 60,
            "overfit_one_batch": True,
            "workload_options": {**SMALL_DATA, "label_noise": 1.0},
        },
    )
    result = train(config, tmp_path)
    assert result.status == "completed"
    assert any(w.startswith("overfit_one_batch") for w in result.warnings), result.warnings


def test_finite_but_uncharacteristically_high_loss_is_infeasible(tmp_path: Path) -> None:
    """Playbook 002, Figure 7a: "uncharacteristically high values of the loss" are infeasible too.
    Momentum at lr 20 blows the loss up to ~1e11 with finite values before any NaN."""
    config = make_config({"optimizer": "momentum", "learning_rate": 20.0}, {"max_train_steps": 100})
    config["trainer"]["divergence_patience"] = 5
    result = train(config, tmp_path)
    assert result.status == "infeasible" and result.step < 20
    assert (result.reason or "").startswith("training loss diverged") and f"at step {result.step}" in result.reason
    losses = series(read_metrics(tmp_path), "train/loss")
    assert math.isfinite(losses[result.step]) and losses[result.step] > 3 * losses[1]
    # the check can be turned off, and then the same run goes on until the loss is no longer finite
    config["trainer"]["divergence_factor"] = None
    off = train(config, tmp_path / "off")
    assert not (off.reason or "").startswith("training loss diverged")


def test_divergence_monitor_needs_a_sustained_stretch() -> None:
    from hpo.trainer.divergence import DivergenceMonitor

    monitor = DivergenceMonitor(factor=3.0, patience=3)
    assert [monitor.update(s, v) for s, v in enumerate([2.0, 1.0, 50.0, 1.0, 7.0, 7.0], 1)] == [None] * 6
    assert monitor.update(7, 7.0) is not None  # three steps in a row above 3 x 2.0 and 3 x 1.0
    negative = DivergenceMonitor(factor=3.0, patience=1)
    assert [negative.update(s, v) for s, v in enumerate([-1.0, 5.0, 5.0], 1)] == [None] * 3


def test_retention_deletes_are_reported_so_records_follow_the_files(tmp_path: Path) -> None:
    class Recorder:
        def __init__(self) -> None:
            self.saved: list[int] = []
            self.deleted: list[int] = []

        def metrics(self, step: int, values: dict[str, float]) -> None:
            return None

        def checkpoint(self, step: int, path: str, objective_value: float | None) -> None:
            self.saved.append(step)

        def checkpoints_deleted(self, steps: list[int]) -> None:
            self.deleted += steps

        def should_stop(self) -> bool:
            return False

    recorder = Recorder()
    config = make_config(trainer={"max_train_steps": 60, "eval_every_steps": 10, "keep_best_checkpoints": 1})
    assert train(config, tmp_path, reporter=recorder).status == "completed"
    on_disk = {step for step, _ in list_checkpoints(tmp_path / "checkpoints")}
    assert recorder.deleted and set(recorder.saved) - set(recorder.deleted) == on_disk
