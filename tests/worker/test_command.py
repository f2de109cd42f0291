"""`trainer.command` below the worker: `CommandRun` runs real processes and reads the files they
write (no Ray, no server), with a recording reporter in place of the HTTP one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hpo.worker.command import (
    CommandRun,
    CommandSettings,
    checkpoint_step,
    list_checkpoints,
    resolve_workdir,
    spec_environment,
)
from hpo.worker.confine import Identity, trial_environment

pytestmark = pytest.mark.timeout(60)

SCRIPTS = Path(__file__).parent / "scripts"
COUNTER = str(SCRIPTS / "counter.py")


class Recorder:
    """The trainer's Reporter contract, recording; `stop_after` seconds after the first point (the
    script is past its start-up then) it asks to stop, and notes when (`stopped_at`)."""

    def __init__(self, stop_after: float | None = None) -> None:
        self.points: list[tuple[int, str, float]] = []
        self.checkpoints: list[tuple[int, str, float | None]] = []
        self.stop_after = stop_after
        self.stop_at: float | None = None
        self.stopped_at: float | None = None

    def metrics(self, step: int, values: dict[str, float]) -> None:
        if self.stop_after is not None and self.stop_at is None:
            self.stop_at = time.monotonic() + self.stop_after
        self.points.extend((step, name, value) for name, value in values.items())

    def checkpoint(self, step: int, path: str, objective_value: float | None) -> None:
        self.checkpoints.append((step, path, objective_value))

    def should_stop(self) -> bool:
        if self.stop_at is None or time.monotonic() < self.stop_at:
            return False
        self.stopped_at = self.stopped_at or time.monotonic()
        return True


def config(steps: int = 30, every: int = 10, keep: int = 1, **params: Any) -> dict[str, Any]:
    return {
        "params": params,
        "seed": 7,
        "objective": {"metric": "valid/error_rate", "mode": "min"},
        "trainer": {
            "command": [sys.executable, COUNTER],
            "max_train_steps": steps,
            "eval_every_steps": every,
            "keep_best_checkpoints": keep,
        },
    }


def run(tmp_path: Path, cfg: dict[str, Any], recorder: Recorder | None = None, **settings: Any) -> Any:
    recorder = recorder or Recorder()
    options = {"argv": tuple(cfg["trainer"]["command"]), "cwd": SCRIPTS, "out_dir": tmp_path / "out", **settings}
    result = CommandRun(CommandSettings(**options), cfg, recorder, recorder).run()
    return result, recorder


def test_a_script_that_exits_0_completes_with_every_point_and_the_best_checkpoints(tmp_path: Path) -> None:
    result, rec = run(tmp_path, config(steps=40, every=10, keep=1))
    assert (result.status, result.step) == ("completed", 40)
    assert [s for s, n, _ in rec.points if n == "train/loss"] == list(range(1, 41))
    # keep_best_checkpoints=1: the best by valid/error_rate plus the newest stay on disk
    values = {s: v for s, n, v in rec.points if n == "valid/error_rate"}
    best = min(values, key=values.__getitem__)
    assert set(list_checkpoints(tmp_path / "out" / "checkpoints")) == {best, 40}
    recorded = [s for s, _, _ in rec.checkpoints]
    assert recorded[-1] == 40 and best in recorded and set(recorded) <= {10, 20, 30, 40}
    assert all(objective == values[s] for s, _, objective in rec.checkpoints), "objective read with the record"
    written = json.loads((tmp_path / "out.worker" / "hpo-config.json").read_text())
    assert written["params"] == {} and written["resume_from"] is None and written["seed"] == 7


def test_resume_from_continues_where_the_checkpoint_left_off(tmp_path: Path) -> None:
    first, rec = run(tmp_path / "a", config(steps=40, keep=5))
    resumed = config(steps=40, keep=5)
    resumed["trainer"]["resume_from"] = rec.checkpoints[1][1]  # step 20
    result, again = run(tmp_path / "b", resumed)
    assert result.status == "completed"
    assert [s for s, n, _ in again.points if n == "train/loss"] == list(range(21, 41))
    assert [p for p in again.points] == [p for p in rec.points if p[0] > 20]


def test_a_crash_is_an_error_with_the_last_lines_of_stderr(tmp_path: Path) -> None:
    result, _ = run(tmp_path, config(mode="crash"))
    assert result.status == "error"
    assert result.reason.startswith("the command exited with status 3")
    assert "ValueError: the data folder is empty" in result.reason
    traceback, _ = run(tmp_path / "b", config(fail_at_step=5))
    assert traceback.status == "error" and "RuntimeError: user code failed at step 5" in traceback.reason
    assert traceback.step == 4


def test_result_json_infeasible_ends_the_run_infeasible(tmp_path: Path) -> None:
    result, _ = run(tmp_path, config(infeasible_at_step=12))
    assert (result.status, result.reason, result.step) == ("infeasible", "diverged at step 12", 12)


def test_a_script_that_writes_nothing_ends_with_a_clear_reason(tmp_path: Path) -> None:
    quiet, _ = run(tmp_path / "a", config(mode="quiet_exit"))
    assert quiet.status == "config" and "wrote no metric point" in quiet.reason
    started = time.monotonic()
    silent, _ = run(tmp_path / "b", config(mode="silent"), silence_timeout_seconds=1.5, stop_grace_seconds=1)
    assert silent.status == "error" and "no metric point and no checkpoint for 1.5 s" in silent.reason
    assert time.monotonic() - started < 10


def test_a_stop_sends_sigterm_and_the_script_checkpoints_where_it_stopped(tmp_path: Path) -> None:
    result, rec = run(tmp_path, config(steps=10_000, step_seconds=0.01), Recorder(stop_after=1.0))
    assert result.status == "stopped"
    last = max(s for s, _, _ in rec.points)
    assert rec.checkpoints[-1][0] == last, "the script checkpointed its last step on SIGTERM"


def test_a_script_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    recorder = Recorder(stop_after=0.3)
    result, _ = run(
        tmp_path, config(steps=10_000, step_seconds=0.01, mode="stubborn"), recorder, stop_grace_seconds=1.0
    )
    assert result.status == "stopped" and recorder.stopped_at is not None
    after_stop = time.monotonic() - recorder.stopped_at
    assert 0.95 < after_stop < 8, f"SIGKILL {after_stop:.2f} s after the SIGTERM (grace 1 s)"


def test_processes_that_outlive_the_script_are_killed_with_its_group(tmp_path: Path) -> None:
    result, _ = run(tmp_path, config(steps=5, every=5, mode="orphan"))
    assert result.status == "completed"
    pid = int((tmp_path / "out" / "orphan.pid").read_text())
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), "the script's child outlived the trial"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie waiting for its parent is dead too
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ")[1].startswith("Z"))


def test_the_script_dies_when_the_process_running_it_is_killed(tmp_path: Path) -> None:
    """A SIGKILLed worker takes its trial with it (PR_SET_PDEATHSIG), so it trains on for nobody."""
    code = (
        "import sys, time; from pathlib import Path; from hpo.worker.command import *\n"
        f"cfg = {config(steps=100_000, step_seconds=0.01)!r}\n"
        "class Never:\n    def should_stop(self): return False\n"
        f"s = CommandSettings(argv=tuple(cfg['trainer']['command']), cwd=Path({str(SCRIPTS)!r}), "
        f"out_dir=Path({str(tmp_path / 'out')!r}))\n"
        "CommandRun(s, cfg, Never(), None).run()\n"
    )
    runner = subprocess.Popen([sys.executable, "-c", code])
    metrics = tmp_path / "out" / "metrics.jsonl"
    deadline = time.monotonic() + 20
    while not (metrics.exists() and metrics.stat().st_size > 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    runner.send_signal(signal.SIGKILL)
    runner.wait(5)
    time.sleep(0.5)
    size = metrics.stat().st_size
    time.sleep(1.0)
    assert metrics.stat().st_size == size, "the script went on after the runner died"


def test_the_environment_is_an_allow_list_of_the_workers_and_carries_the_launcher_variables_given() -> None:
    base = {
        "PATH": "/bin",
        "LC_ALL": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "2",
        "HOME": "/home/w",
        "HPO_API_TOKEN": "secret",
        "HPO_DATABASE_URL": "postgresql://u:pw@h/db",
        "RAY_AUTH_TOKEN": "ray-secret",
        "AWS_SECRET_ACCESS_KEY": "cloud-secret",
        "NCCL_SOCKET_IFNAME": "eth0",
        "RANK": "3",
    }
    env = trial_environment(base, {"HPO_OUT_DIR": "/o", "RANK": "1"})
    assert env == {
        "PATH": "/bin",
        "LC_ALL": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "2",
        "HOME": "/home/w",
        "HPO_OUT_DIR": "/o",
        "RANK": "1",
    }
    # The operator may pass more of the node's variables, never hpo's or Ray's own.
    passed = trial_environment(base, {}, ("NCCL_*", "RAY_*", "HPO_*"))
    assert passed["NCCL_SOCKET_IFNAME"] == "eth0"
    assert not {"RAY_AUTH_TOKEN", "HPO_API_TOKEN", "HPO_DATABASE_URL"} & set(passed)
    other = Identity(uid=20001, gid=20001, name="hpo-trial-20001", home="/nonexistent")
    assert trial_environment(base, {}, (), other)["HOME"] == "/nonexistent"


def test_the_specs_env_reaches_the_command_under_the_launchers_variables() -> None:
    trainer = {"command": ["python", "train.py"], "env": {"DATA_DIR": "/data", "RANK": "7"}}
    assert spec_environment(trainer, {"RANK": "1"}) == {"DATA_DIR": "/data", "RANK": "1"}
    assert spec_environment({"command": ["python", "train.py"]}) == {}


def test_checkpoint_names_count_only_once_complete() -> None:
    assert [checkpoint_step(n) for n in ("step-10", "step-10.pt", "step-7.tar.gz", "step-00000300.pt")] == [
        10,
        10,
        7,
        300,
    ]
    # `step-10.pt.tmp4242` is how the built-in trainer writes before its rename (trainer/checkpoints.py):
    # recorded as complete, its record would name a file that is renamed away a moment later.
    partials = ("step-10.pt.tmp", ".step-10.pt.tmp123", "step-10.pt.tmp4242", "step-10.tmp", "tmp-step-10",
                "step-x.pt", "step-5.partial")  # fmt: skip
    for partial in partials:
        assert checkpoint_step(partial) is None, partial


def test_workdir_stays_under_the_root(tmp_path: Path) -> None:
    (tmp_path / "root" / "a").mkdir(parents=True)
    (tmp_path / "root" / "escape").symlink_to(tmp_path)
    assert resolve_workdir(tmp_path / "root", "a") == (tmp_path / "root" / "a").resolve()
    assert resolve_workdir(tmp_path / "root", None) == (tmp_path / "root").resolve()
    with pytest.raises(ValueError, match="outside"):
        resolve_workdir(tmp_path / "root", "escape")
    with pytest.raises(ValueError, match="not a directory"):
        resolve_workdir(tmp_path / "root", "missing")
