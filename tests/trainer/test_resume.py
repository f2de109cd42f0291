"""Issue item 6: exact resume. A run killed with SIGKILL (twice) and started again on the same folder
ends bitwise equal to an uninterrupted run, with the same metric points, none twice and none
missing. Dropout and input noise make the result depend on every restored RNG stream."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from hpo.trainer import ConfigError, train
from hpo.trainer.checkpoints import checkpoint_path, list_checkpoints, load

from .conftest import TIMING_METRICS, make_config, read_metrics, same_float, start_train, wait_for

STEPS = 400


def _digits_config(**params: Any) -> dict[str, Any]:
    return {
        "params": {
            "optimizer": "momentum",
            "learning_rate": 0.05,
            "batch_size": 32,
            "width": 32,
            "dropout": 0.2,
            "input_noise": 0.1,
            **params,
        },
        "trainer": {
            "workload": "digits",
            "max_train_steps": STEPS,
            "eval_every_steps": 50,
            "checkpoint_every_steps": 10,
            "keep_best_checkpoints": 2,
        },
        "seed": 3,
    }


def _newest_step(out: Path) -> int:
    found = list_checkpoints(out / "checkpoints")
    return found[-1][0] if found else 0


def _kill_after_checkpoint(config: dict[str, Any], out: Path, past: int, started: list[Any]) -> int:
    """Starts `hpo train`, SIGKILLs it once a checkpoint beyond step `past` is on disk, answers the
    newest checkpoint's step after the kill."""
    process = start_train(config, out)
    started.append(process)
    wait_for(lambda: _newest_step(out) > past, 90, f"a checkpoint past step {past}", process)
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=30)
    assert process.returncode == -signal.SIGKILL
    step = _newest_step(out)
    assert past < step < STEPS, "the kill must land in the middle of the run"
    assert not (out / "result.json").exists()
    return step


def _comparable(out: Path) -> list[tuple[int, str, float]]:
    return [p for p in read_metrics(out) if p[1] not in TIMING_METRICS]


def _assert_same_points(resumed: Path, reference: Path) -> None:
    got, want = _comparable(resumed), _comparable(reference)
    keys = [(step, name) for step, name, _ in got]
    assert len(keys) == len(set(keys)), "a point was written twice"
    assert set(keys) == {(step, name) for step, name, _ in want}, "points missing or extra"
    assert sorted({step for step, _ in keys}) == list(range(1, STEPS + 1))
    values = {(step, name): value for step, name, value in want}
    for step, name, value in got:
        assert same_float(value, values[(step, name)]), (step, name, value, values[(step, name)])


def _assert_same_final_state(resumed: Path, reference: Path) -> None:
    a, b = (load(checkpoint_path(out / "checkpoints", STEPS)) for out in (resumed, reference))
    assert a["model"].keys() == b["model"].keys()
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
    for key, state in a["optimizer"]["state"].items():
        for name, tensor in state.items():
            assert torch.equal(tensor, b["optimizer"]["state"][key][name]), (key, name)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sigkilled_run_resumes_bitwise_equal(tmp_path: Path, processes: list[subprocess.Popen[str]]) -> None:
    config = _digits_config()
    reference = train(config, tmp_path / "reference")
    assert reference.status == "completed", reference.reason

    out = tmp_path / "killed"
    first = _kill_after_checkpoint(config, out, 0, processes)
    _kill_after_checkpoint(config, out, first + 20, processes)

    process = start_train(config, out)
    processes.append(process)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    assert f"completed at step {STEPS}" in stdout
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "completed"
    assert (result["best_step"], result["best_value"]) == (reference.best_step, reference.best_value)

    _assert_same_final_state(out, reference=tmp_path / "reference")
    _assert_same_points(out, reference=tmp_path / "reference")


class StopAt:
    """A reporter that asks to stop once `step` is reached, and records the checkpoints it is told of."""

    def __init__(self, step: int) -> None:
        self.stop_step, self.last_step, self.checkpoints = step, 0, []

    def metrics(self, step: int, values: dict[str, float]) -> None:
        self.last_step = step

    def checkpoint(self, step: int, path: str, objective_value: float | None) -> None:
        self.checkpoints.append((step, objective_value))

    def should_stop(self) -> bool:
        return self.last_step >= self.stop_step


def test_stop_checkpoints_and_a_later_call_completes_exactly(tmp_path: Path) -> None:
    config = make_config({"dropout": 0.3}, {"max_train_steps": 30, "eval_every_steps": 10})
    reference = train(config, tmp_path / "reference")

    reporter = StopAt(13)
    stopped = train(config, tmp_path / "run", reporter)
    # Polled before step 14's update is applied: the run stops after that step.
    assert (stopped.status, stopped.step, stopped.reason) == ("stopped", 14, "stop requested")
    assert reporter.checkpoints[-1] == (14, None)
    assert _newest_step(tmp_path / "run") == 14
    assert max(step for step, _, _ in read_metrics(tmp_path / "run")) == 14

    resumed = train(config, tmp_path / "run")
    assert resumed.status == "completed" and resumed.step == 30
    assert (resumed.best_step, resumed.best_value) == (reference.best_step, reference.best_value)
    assert resumed.final_metrics == reference.final_metrics
    a, b = (load(checkpoint_path(tmp_path / d / "checkpoints", 30))["model"] for d in ("run", "reference"))
    assert all(torch.equal(a[name], b[name]) for name in a)
    got = [p for p in read_metrics(tmp_path / "run") if p[1] not in TIMING_METRICS]
    want = [p for p in read_metrics(tmp_path / "reference") if p[1] not in TIMING_METRICS]
    assert got == want


def test_resuming_with_another_config_is_refused(tmp_path: Path) -> None:
    config = make_config(trainer={"max_train_steps": 10})
    train(config, tmp_path)
    before = (tmp_path / "metrics.jsonl").read_bytes()
    changed = make_config({"learning_rate": 0.02}, {"max_train_steps": 20})
    with pytest.raises(ConfigError, match="belongs to another run"):
        train(changed, tmp_path)
    with pytest.raises(ConfigError, match="belongs to another run"):
        train({**make_config(trainer={"max_train_steps": 20}), "seed": 1}, tmp_path)
    assert (tmp_path / "metrics.jsonl").read_bytes() == before
    # A longer budget is a trainer setting, not part of the run's identity: it continues.
    longer = train(make_config(trainer={"max_train_steps": 20}), tmp_path)
    assert longer.status == "completed" and longer.step == 20


def test_resume_from_a_checkpoint_in_another_folder(tmp_path: Path) -> None:
    config = make_config({"dropout": 0.2}, {"max_train_steps": 30, "eval_every_steps": 10, "keep_best_checkpoints": 5})
    train(config, tmp_path / "first")
    source = checkpoint_path(tmp_path / "first" / "checkpoints", 20)
    assert source.is_file()

    config["trainer"]["resume_from"] = str(source)
    result = train(config, tmp_path / "second")
    assert result.status == "completed" and result.step == 30
    steps = {step for step, _, _ in read_metrics(tmp_path / "second")}
    assert steps == set(range(21, 31))
    a, b = (load(checkpoint_path(tmp_path / d / "checkpoints", 30))["model"] for d in ("first", "second"))
    assert all(torch.equal(a[name], b[name]) for name in a)

    config["trainer"]["resume_from"] = str(tmp_path / "missing.pt")
    with pytest.raises(ConfigError, match="trainer.resume_from"):
        train(config, tmp_path / "third")


def test_running_a_completed_run_again_changes_nothing(tmp_path: Path) -> None:
    config = make_config(trainer={"max_train_steps": 10})
    first = train(config, tmp_path)
    before = (tmp_path / "metrics.jsonl").read_bytes()
    again = train(config, tmp_path)
    assert again.status == "completed" and again.step == 10
    assert (again.best_step, again.best_value) == (first.best_step, first.best_value)
    assert (tmp_path / "metrics.jsonl").read_bytes() == before


def test_torn_metrics_past_the_checkpoint_are_dropped_on_resume(tmp_path: Path) -> None:
    config = make_config(trainer={"max_train_steps": 20, "eval_every_steps": 10})
    reference = tmp_path / "reference"
    train(config, reference)
    out = tmp_path / "run"
    train(make_config(trainer={"max_train_steps": 10, "eval_every_steps": 10}), out)
    # What a kill between checkpoints leaves: points past step 10 and a half-written line.
    with (out / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 11, "name": "train/loss", "value": 9.0}\n{"step": 12, "name": "train/lo')
    train(config, out)
    assert _comparable(out) == _comparable(reference)


def test_a_stop_on_the_last_step_still_completes(tmp_path: Path) -> None:
    """The run reached max_train_steps: it is complete, not a stopped run to resume later."""
    result = train(make_config(trainer={"max_train_steps": 10}), tmp_path, StopAt(9))
    assert (result.status, result.step) == ("completed", 10)
    assert result.final_metrics["valid/examples"] == 256
