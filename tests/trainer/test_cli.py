"""`hpo train`: user mistakes are one line on stderr and exit status 2, never a traceback; SIGTERM
checkpoints and stops a run (on one process and, broadcast by rank 0, on two), which the same
command later resumes to completion."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hpo.cli import main
from hpo.trainer import train
from hpo.trainer.checkpoints import checkpoint_path, list_checkpoints, load
from hpo.trainer.result import RunResult

from .conftest import HPO, TIMING_METRICS, cli_env, make_config, read_metrics, start_train, wait_for


def _write(tmp_path: Path, config: Any) -> str:
    path = tmp_path / "config.json"
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    return str(path)


def _one_line_error(capsys: pytest.CaptureFixture[str], code: int, needle: str) -> None:
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("hpo train: "), err
    assert needle in err
    assert "Traceback" not in err


def test_missing_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["train", "--config", str(tmp_path / "nope.json"), "--out", str(tmp_path / "out")])
    _one_line_error(capsys, code, "no such file")


def test_bad_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["train", "--config", _write(tmp_path, '{"params": {'), "--out", str(tmp_path / "out")])
    _one_line_error(capsys, code, "is not valid JSON")
    code = main(["train", "--config", _write(tmp_path, "[1, 2]"), "--out", str(tmp_path / "out")])
    _one_line_error(capsys, code, "must hold a JSON object")


def test_config_error_names_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _write(tmp_path, make_config({"learning_rate": -1}))
    code = main(["train", "--config", config, "--out", str(tmp_path / "out")])
    _one_line_error(capsys, code, "params.learning_rate must be > 0")
    code = main(["train", "--config", _write(tmp_path, make_config()), "--out", str(tmp_path / "o"), "--nproc", "3"])
    _one_line_error(capsys, code, "not divisible by the world size 3")
    assert not (tmp_path / "out").exists() and not (tmp_path / "o").exists()


def test_resuming_another_runs_folder_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], restore_signals: None
) -> None:
    out = tmp_path / "out"
    assert main(["train", "--config", _write(tmp_path, make_config()), "--out", str(out)]) == 0
    assert "completed at step 20" in capsys.readouterr().out
    code = main(["train", "--config", _write(tmp_path, make_config({"learning_rate": 0.02})), "--out", str(out)])
    _one_line_error(capsys, code, "belongs to another run")


@pytest.mark.timeout(120)
def test_config_error_in_a_real_process_exits_2_without_traceback(tmp_path: Path) -> None:
    done = subprocess.run(
        [HPO, "train", "--config", _write(tmp_path, make_config({"optimizer": "lamb"}))]
        + ["--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=100,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("hpo train: unknown params.optimizer 'lamb'")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stdout == ""


def _stop_with_sigterm(config: dict[str, Any], out: Path, started: list[Any], *extra: str) -> tuple[int, str]:
    process = start_train(config, out, *extra)
    started.append(process)
    wait_for(lambda: bool(list_checkpoints(out / "checkpoints")), 90, "the first checkpoint", process)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert "stopping after this step" in stdout
    result = RunResult.read(out / "result.json")
    assert result.status == "stopped" and result.reason == "stop requested"
    assert f"stopped at step {result.step}" in stdout
    assert 0 < result.step < config["trainer"]["max_train_steps"]
    assert list_checkpoints(out / "checkpoints")[-1][0] == result.step
    assert max(step for step, _, _ in read_metrics(out)) == result.step
    return result.step, stdout


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_sigterm_stops_with_a_checkpoint_and_the_run_resumes(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    config = make_config(
        {"dropout": 0.1}, {"max_train_steps": 300, "eval_every_steps": 100, "checkpoint_every_steps": 10}
    )
    out = tmp_path / "run"
    _stop_with_sigterm(config, out, processes)

    resumed = train(config, out)
    assert resumed.status == "completed" and resumed.step == 300
    reference = train(config, tmp_path / "reference")
    got = [p for p in read_metrics(out) if p[1] not in TIMING_METRICS]
    want = [p for p in read_metrics(tmp_path / "reference") if p[1] not in TIMING_METRICS]
    assert got == want
    assert resumed.final_metrics == reference.final_metrics


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_sigterm_reaches_every_rank_of_a_two_process_run(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    config = make_config(trainer={"max_train_steps": 3000, "eval_every_steps": 1000, "checkpoint_every_steps": 25})
    out = tmp_path / "run"
    step, _ = _stop_with_sigterm(config, out, processes, "--nproc", "2")
    state = load(checkpoint_path(out / "checkpoints", step))
    assert state["world_size"] == 2 and len(state["rng"]) == 2
    # Both ranks stopped at the same step: a rank still training would have hung the other's collective,
    # and the parent returns only once every rank has exited.


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ctrl_c_exits_130_saying_what_was_kept(tmp_path: Path, processes: list[subprocess.Popen[str]]) -> None:
    """Shell convention: a command ended by Ctrl-C (SIGINT) exits 128 + 2, and says so."""
    config = make_config({}, {"max_train_steps": 100_000, "eval_every_steps": 100, "checkpoint_every_steps": 10})
    out = tmp_path / "run"
    process = start_train(config, out)
    processes.append(process)
    wait_for(lambda: bool(list_checkpoints(out / "checkpoints")), 90, "the first checkpoint", process)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130
    step = RunResult.read(out / "result.json").step
    assert stderr.strip() == (
        f"hpo train: interrupted; checkpoint at step {step} kept in {out}; run the same command to resume"
    )
