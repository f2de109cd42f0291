"""Every piece of state a resumed run depends on survives a checkpoint: the divergence judge's
reference values (initial loss, running minimum, current stretch), the learning-rate schedule with
warmup, gradient-clipping counts, dropout's RNG, best-N checkpoint retention and the run's answer.
The tests resume at the worst moment for the divergence judge: right after the checkpoint whose next
minibatch is so low that a judge restarted there would call the run diverged (what the trainer did
before the judge's state was checkpointed), and checks the resumed run against its uninterrupted
twin: metrics, final weights and optimizer state, kept checkpoints and the answer."""

from __future__ import annotations

import json
import logging
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from hpo.trainer import RunResult, train
from hpo.trainer.checkpoints import checkpoint_path, list_checkpoints, load, save_atomic
from hpo.trainer.divergence import DivergenceMonitor
from hpo.trainer.launch import run_local

from .conftest import REPO_ROOT, SMALL_DATA, TIMING_METRICS, cli_env, make_config, read_metrics, series

STEPS = 400
# Batches of 8 make the training loss noisy enough for a low batch to sit far below its neighbours.
CONFIG = make_config(
    {"batch_size": 8, "dropout": 0.1, "grad_clip_norm": 1.0, "lr_schedule": "cosine", "warmup_steps": 20},
    {"max_train_steps": STEPS, "eval_every_steps": 50, "checkpoint_every_steps": 25, "keep_best_checkpoints": 2},
)


def _fresh_judge_diverges(losses: dict[int, float], after: int) -> bool:
    """Whether a judge started afresh after step `after` (the first loss after it as its initial
    value) would end the run."""
    monitor = DivergenceMonitor()
    return any(monitor.update(step, losses[step]) is not None for step in range(after + 1, STEPS + 1))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, RunResult, int]:
    """The uninterrupted twin, and the worst step to resume at."""
    out = tmp_path_factory.mktemp("reference")
    result = train(CONFIG, out)
    assert result.status == "completed", result.reason
    losses = series(read_metrics(out), "train/loss")
    worst = next((step for step in range(1, STEPS) if _fresh_judge_diverges(losses, step)), None)
    assert worst is not None, "the workload no longer has a low batch that fools a restarted judge"
    return out, result, worst


class StopAt:
    """Asks to stop once step `step` is reached: the loop then checkpoints at `step + 1`."""

    def __init__(self, step: int) -> None:
        self.stop_step, self.last_step = step, 0

    def metrics(self, step: int, values: dict[str, float]) -> None:
        self.last_step = step

    def checkpoint(self, step: int, path: str, objective_value: float | None) -> None:
        return None

    def should_stop(self) -> bool:
        return self.last_step >= self.stop_step


def _stop_at(out: Path, step: int) -> None:
    stopped = train(CONFIG, out, StopAt(step - 1))
    assert (stopped.status, stopped.step) == ("stopped", step)


def _drop_judge_state(checkpoint: Path) -> None:
    """Rewrites `checkpoint` as the previous trainer wrote it: without the judge's state."""
    state = load(checkpoint)
    for key in ("divergence", "last_eval", "examples_per_second"):
        del state[key]
    save_atomic(state, checkpoint)


def _assert_twins(out: Path, result: RunResult, reference: tuple[Path, RunResult, int]) -> None:
    ref_out, ref, _ = reference
    assert result.status == "completed", result.reason
    assert (result.step, result.best_step, result.best_value) == (ref.step, ref.best_step, ref.best_value)
    assert result.final_metrics == ref.final_metrics
    assert result.warnings == ref.warnings
    assert Path(result.best_checkpoint or "").name == Path(ref.best_checkpoint or "-").name
    # Best-N retention kept the same files (the stop's own checkpoint is pruned like any other).
    assert [s for s, _ in list_checkpoints(out / "checkpoints")] == [
        s for s, _ in list_checkpoints(ref_out / "checkpoints")
    ]
    got = [p for p in read_metrics(out) if p[1] not in TIMING_METRICS]
    want = [p for p in read_metrics(ref_out) if p[1] not in TIMING_METRICS]
    assert got == want  # the schedule's rates, clipped fractions and every loss, bit for bit
    a, b = (load(checkpoint_path(d / "checkpoints", STEPS)) for d in (out, ref_out))
    assert all(torch.equal(a["model"][name], b["model"][name]) for name in b["model"])
    for key, state in b["optimizer"]["state"].items():
        assert all(torch.equal(a["optimizer"]["state"][key][n], t) for n, t in state.items()), key
    assert a["divergence"] == b["divergence"]
    assert a["history"] == b["history"]


def test_a_stop_at_the_worst_moment_resumes_equal_to_its_twin(
    tmp_path: Path, reference: tuple[Path, RunResult, int]
) -> None:
    worst = reference[2]
    _stop_at(tmp_path, worst)
    assert load(checkpoint_path(tmp_path / "checkpoints", worst))["divergence"]["initial"] == pytest.approx(
        series(read_metrics(reference[0]), "train/loss")[1]
    )
    _assert_twins(tmp_path, train(CONFIG, tmp_path), reference)


KILLER = """
import json, os, signal, sys
from hpo.trainer import train

class KillAfter:
    def metrics(self, step, values):
        pass

    def checkpoint(self, step, path, objective_value):
        if step == {step}:
            os.kill(os.getpid(), signal.SIGKILL)

    def should_stop(self):
        return False

train(json.loads(sys.argv[1]), sys.argv[2], KillAfter())
"""


def test_a_sigkill_right_after_the_worst_checkpoint_resumes_equal_to_its_twin(
    tmp_path: Path, reference: tuple[Path, RunResult, int]
) -> None:
    worst = reference[2]
    # A checkpoint lands at the worst step (the cadence is no part of what the run computes).
    config = {**CONFIG, "trainer": {**CONFIG["trainer"], "checkpoint_every_steps": worst}}
    script = textwrap.dedent(KILLER).replace("{step}", str(worst))
    killed = subprocess.run(
        [sys.executable, "-c", script, json.dumps(config), str(tmp_path)],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=REPO_ROOT,
        timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert [s for s, _ in list_checkpoints(tmp_path / "checkpoints")][-1] == worst
    assert not (tmp_path / "result.json").exists()
    _assert_twins(tmp_path, train(config, tmp_path), reference)


def test_a_checkpoint_without_judge_state_rebuilds_it_from_the_logged_losses(
    tmp_path: Path, reference: tuple[Path, RunResult, int]
) -> None:
    worst = reference[2]
    _stop_at(tmp_path / "first", worst)
    source = checkpoint_path(tmp_path / "first" / "checkpoints", worst)
    _drop_judge_state(source)
    # In place: from the run's own metrics.jsonl.
    in_place = tmp_path / "in-place"
    shutil.copytree(tmp_path / "first", in_place)
    result = train(CONFIG, in_place)
    assert result.status == "completed", result.reason
    assert (
        load(checkpoint_path(in_place / "checkpoints", STEPS))["divergence"]
        == load(checkpoint_path(reference[0] / "checkpoints", STEPS))["divergence"]
    )
    # From another folder (the worker's `resume_from` of an earlier attempt): the metrics beside it.
    elsewhere = {**CONFIG, "trainer": {**CONFIG["trainer"], "resume_from": str(source)}}
    result = train(elsewhere, tmp_path / "second")
    assert result.status == "completed", result.reason
    a, b = (load(checkpoint_path(d / "checkpoints", STEPS)) for d in (tmp_path / "second", reference[0]))
    assert a["divergence"] == b["divergence"]
    assert all(torch.equal(a["model"][name], b["model"][name]) for name in b["model"])


@pytest.mark.parametrize("metrics", ["missing", "without its first steps"])
def test_without_the_first_logged_loss_the_judge_starts_from_chance_with_a_note(
    tmp_path: Path, reference: tuple[Path, RunResult, int], caplog: pytest.LogCaptureFixture, metrics: str
) -> None:
    """No metrics.jsonl, or one that starts later (an attempt that was itself resumed)."""
    worst = reference[2]
    _stop_at(tmp_path, worst)
    _drop_judge_state(checkpoint_path(tmp_path / "checkpoints", worst))
    path = tmp_path / "metrics.jsonl"
    if metrics == "missing":
        path.unlink()
    else:
        path.write_text("".join(line for line in path.read_text().splitlines(True) if json.loads(line)["step"] > 100))
    with caplog.at_level(logging.WARNING, logger="hpo.trainer"):
        result = train(CONFIG, tmp_path)
    assert result.status == "completed", result.reason
    notes = [r.getMessage() for r in caplog.records if "no divergence state" in r.getMessage()]
    assert len(notes) == 1 and "the chance loss 1.386 for its first" in notes[0], notes
    # The judge's reference is ln(4), not the low first loss after the resume; its minimum is that of
    # every loss it saw, logged before the resume or trained after it.
    judge = load(checkpoint_path(tmp_path / "checkpoints", STEPS))["divergence"]
    assert judge["initial"] == pytest.approx(1.3862944)
    assert judge["minimum"] == min(series(read_metrics(tmp_path), "train/loss").values())


def test_a_run_resumed_at_its_last_step_answers_as_it_did(tmp_path: Path) -> None:
    """Killed between its last checkpoint and result.json: started again, it answers the same
    final metrics and throughput instead of none."""
    config = make_config(trainer={"max_train_steps": 20, "eval_every_steps": 10})
    first = train(config, tmp_path)
    (tmp_path / "result.json").unlink()
    again = train(config, tmp_path)
    assert again.final_metrics == first.final_metrics and "valid/loss" in again.final_metrics
    assert again.examples_per_second == first.examples_per_second is not None
    assert json.loads((tmp_path / "result.json").read_text())["final_metrics"]["valid/loss"] == pytest.approx(
        first.final_metrics["valid/loss"]
    )


def test_the_judge_state_round_trips_through_a_checkpoint(tmp_path: Path) -> None:
    losses = [(step, 2.0 if step != 3 else 0.1) for step in range(1, 6)] + [(6, 9.0), (7, 9.5)]
    whole, first = DivergenceMonitor(patience=3), DivergenceMonitor(patience=3)
    first.replay(losses[:5])
    save_atomic({"format": 1, "divergence": first.state()}, tmp_path / "c.pt")
    second = DivergenceMonitor(patience=3)
    second.load_state(load(tmp_path / "c.pt")["divergence"])
    assert second.state() == first.state() and second.initial == 2.0 and second.minimum == 0.1
    whole.replay(losses[:5])
    assert [second.update(s, v) for s, v in losses[5:]] == [whole.update(s, v) for s, v in losses[5:]]
    assert second.run == 2 and second.since == 6
    # A fresh judge's state (no loss yet: an infinite minimum) survives the weights-only load too.
    save_atomic({"format": 1, "divergence": DivergenceMonitor().state()}, tmp_path / "d.pt")
    assert load(tmp_path / "d.pt")["divergence"] == {"initial": None, "minimum": float("inf"), "run": 0, "since": None}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_processes_rebuild_the_judge_from_rank_zeros_metrics(tmp_path: Path) -> None:
    """Under DDP every rank judges the same global loss; only rank 0 reads metrics.jsonl to rebuild
    an older checkpoint's judge, and hands the losses to the others (a rank that judged alone could
    end the run by itself and leave the others waiting in a collective)."""
    data = {**SMALL_DATA, "valid_examples": 255}
    config = make_config(
        {"batch_size": 32},
        {"workload_options": data, "max_train_steps": 30, "eval_every_steps": 10, "collective_timeout_s": 60},
    )
    first = train(config, tmp_path / "first")
    assert first.status == "completed", first.reason
    # An older trainer's checkpoint at step 20, resumed by two processes in another folder (the
    # worker's `resume_from`): the losses come from the metrics.jsonl beside it.
    source = checkpoint_path(tmp_path / "first" / "checkpoints", 20)
    _drop_judge_state(source)
    resumed = run_local(
        {**config, "trainer": {**config["trainer"], "resume_from": str(source)}},
        tmp_path / "run",
        nproc=2,
        console=False,
    )
    assert resumed.status == "completed", resumed.reason
    assert sorted(series(read_metrics(tmp_path / "run"), "train/loss")) == list(range(21, 31))
    judge = load(checkpoint_path(tmp_path / "run" / "checkpoints", 30))["divergence"]
    losses = series(read_metrics(tmp_path / "first"), "train/loss")
    # The first run's initial loss and minimum (not the chance loss of the fallback, nor step 21's).
    assert judge["initial"] == losses[1]
    assert judge["minimum"] <= min(losses[step] for step in range(1, 21))
