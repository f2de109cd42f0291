"""Issue item 10: the batch-size sweep stops where throughput stops growing (its logic, with a plain
`run` callable standing in for training runs), and `hpo batch-size-sweep` runs real short runs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hpo.trainer.result import RunResult
from hpo.trainer.sweep import batch_size_sweep, sweep_config

from .conftest import HPO, cli_env, make_config


class Throughputs:
    """Answers a fixed throughput per batch size (or a given failure) and records what it ran."""

    def __init__(self, table: dict[int, float | RunResult]) -> None:
        self.table, self.ran = table, []

    def __call__(self, config: dict[str, Any], out: Path) -> RunResult:
        batch = config["params"]["batch_size"]
        self.ran.append((batch, config["trainer"]["max_train_steps"], out.is_dir()))
        answer = self.table[batch]
        return answer if isinstance(answer, RunResult) else RunResult("completed", examples_per_second=answer)


def test_stops_where_throughput_stops_growing() -> None:
    run = Throughputs({8: 100.0, 16: 195.0, 32: 380.0, 64: 400.0, 128: 900.0})
    seen = []
    result = batch_size_sweep(make_config(), run, start=8, steps=7, min_gain=1.1, on_point=seen.append)
    assert [p.batch_size for p in result.points] == [8, 16, 32, 64]  # 128 is never tried
    assert result.best_batch_size == 32
    assert "grew less than 10% from 32 to 64" in result.stopped_because
    assert run.ran == [(8, 7, True), (16, 7, True), (32, 7, True), (64, 7, True)]
    assert seen == list(result.points)


def test_out_of_memory_ends_the_sweep_at_the_last_batch_that_fit() -> None:
    oom = RunResult("infeasible", reason="out of memory: CUDA out of memory")
    result = batch_size_sweep(make_config(), Throughputs({4: 10.0, 8: 30.0, 16: oom}), start=4)
    assert result.best_batch_size == 8
    assert result.stopped_because == "out of memory"
    assert result.points[-1].status == "infeasible"


def test_a_failed_first_run_names_no_batch_size() -> None:
    failed = RunResult("error", reason="Traceback ...")
    result = batch_size_sweep(make_config(), Throughputs({8: failed}))
    assert result.best_batch_size is None
    assert result.stopped_because == "the run at batch size 8 ended error"


def test_reaching_the_maximum_ends_the_sweep() -> None:
    result = batch_size_sweep(make_config(), Throughputs({8: 1.0, 16: 2.0, 32: 4.0}), max_batch_size=32)
    assert result.best_batch_size == 32
    assert result.stopped_because == "reached --max-batch-size 32"


def test_sweep_config_is_a_short_run_at_the_batch_size() -> None:
    config = make_config(trainer={"resume_from": "/x.pt", "eval_batch_size": 512, "overfit_one_batch": True})
    short = sweep_config(config, 256, 10)
    assert short["params"]["batch_size"] == 256
    trainer = short["trainer"]
    assert (trainer["max_train_steps"], trainer["eval_every_steps"], trainer["log_every_steps"]) == (10, 10, 5)
    assert "resume_from" not in trainer and trainer["eval_batch_size"] is None
    assert trainer["sanity_checks"] is False and trainer["overfit_one_batch"] is False
    assert trainer["workload_options"] == config["trainer"]["workload_options"]
    assert config["params"]["batch_size"] == 32, "the caller's config is not changed"


@pytest.mark.timeout(120)
def test_batch_size_sweep_command(tmp_path: Path) -> None:
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(make_config()))
    done = subprocess.run(
        [HPO, "batch-size-sweep", "--config", str(config_file)] + ["--steps", "6", "--max-batch-size", "64"],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=tmp_path,
        timeout=100,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    rows = [line for line in lines if line.startswith("batch_size")]
    assert rows and rows[0].split()[1] == "8" and all(line.endswith("completed") for line in rows)
    assert any(line.startswith("stopped: ") for line in lines)
    best = [line for line in lines if line.startswith("largest useful batch size: ")]
    assert len(best) == 1 and int(best[0].rsplit(" ", 1)[1]) in (8, 16, 32, 64)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]  # short runs leave nothing
