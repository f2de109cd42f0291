"""Issue items 4 and 7 across real processes: `run_local(nproc=2)` spawns two ranks joined by a gloo
process group. At the same global batch they train the model one process trains (up to the order of
gloo's sums), and their evaluation counts every validation example exactly once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hpo.trainer import ConfigError, train
from hpo.trainer.checkpoints import checkpoint_path, load
from hpo.trainer.launch import run_local
from hpo.trainer.loop import check_config

from .conftest import SMALL_DATA, make_config, read_metrics, series

STEPS = 30
# 255 validation examples: an odd count, so two ranks need a zero-weighted padding example.
DATA = {**SMALL_DATA, "valid_examples": 255}


def _config(**params: Any) -> dict[str, Any]:
    return make_config(
        {"optimizer": "momentum", "learning_rate": 0.05, "batch_size": 32, **params},
        {"workload_options": DATA, "max_train_steps": STEPS, "eval_every_steps": 10, "collective_timeout_s": 60},
    )


@pytest.fixture(scope="module")
def one_and_two(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("ddp")
    one = train(_config(), root / "one")
    two = run_local(_config(), root / "two", nproc=2, console=False)
    assert one.status == "completed", one.reason
    assert two.status == "completed", two.reason
    return root / "one", root / "two"


def _final_model(out: Path) -> dict[str, torch.Tensor]:
    return load(checkpoint_path(out / "checkpoints", STEPS))["model"]


@pytest.mark.timeout(120)
def test_two_processes_train_the_model_one_process_trains(one_and_two: tuple[Path, Path]) -> None:
    one, two = (_final_model(out) for out in one_and_two)
    run_config, workload = check_config(_config())
    untrained = workload.build_model(run_config.model_params).state_dict()
    assert one.keys() == two.keys()
    for name in one:
        assert torch.allclose(one[name], two[name], rtol=0, atol=1e-4), name
        # The tolerance means something: training moved every tensor much further than it.
        assert (one[name] - untrained[name]).abs().max() > 1e-2, name
    losses = [series(read_metrics(out), "train/loss") for out in one_and_two]
    assert sorted(losses[0]) == sorted(losses[1]) == list(range(1, STEPS + 1))
    for step in losses[0]:
        assert losses[1][step] == pytest.approx(losses[0][step], rel=1e-4)


@pytest.mark.timeout(120)
def test_two_process_evaluation_counts_every_example_once(one_and_two: tuple[Path, Path]) -> None:
    one, two = (read_metrics(out) for out in one_and_two)
    names = {name for _, name, _ in one if name.startswith("valid/")}
    assert names == {name for _, name, _ in two if name.startswith("valid/")}
    for name in names:
        a, b = series(one, name), series(two, name)  # series() fails on a point written twice
        assert sorted(a) == sorted(b) == [10, 20, 30]
        for step in a:
            assert b[step] == pytest.approx(a[step], rel=1e-4, abs=1e-9), (name, step)
    assert series(two, "valid/examples") == {10: 255.0, 20: 255.0, 30: 255.0}
    correct = sum(series(two, f"valid/correct/class_{k}")[30] for k in range(4))
    assert correct == pytest.approx(255 * series(two, "valid/accuracy")[30])


@pytest.mark.timeout(120)
def test_only_rank_zero_writes(one_and_two: tuple[Path, Path]) -> None:
    _, two = one_and_two
    points = read_metrics(two)
    assert len(points) == len(set((step, name) for step, name, _ in points))
    assert sorted(p.name for p in two.iterdir()) == ["checkpoints", "metrics.jsonl", "result.json"]


def test_batch_not_divisible_by_the_world_size_is_refused() -> None:
    config = _config(batch_size=30)
    check_config(config, world_size=2)
    with pytest.raises(ConfigError, match="not divisible by the world size 4"):
        check_config(config, world_size=4)
    ghost = {**config, "trainer": {**config["trainer"], "ghost_batch_size": 5}}
    check_config(ghost, world_size=2)  # 15 examples per process, 3 virtual batches
    with pytest.raises(ConfigError, match="ghost_batch_size"):
        check_config({**config, "trainer": {**config["trainer"], "ghost_batch_size": 4}}, world_size=2)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ghost_batch_norm_normalizes_the_same_groups_on_two_processes(tmp_path: Path) -> None:
    """Virtual batches of 8 lie inside each rank's 16 examples, so 2 ranks normalize the groups 1
    process does, and the running averages (averaged over ranks) agree too."""
    config = _config(norm="batchnorm")
    config["trainer"].update(ghost_batch_size=8, max_train_steps=10, eval_every_steps=10)
    one = train(config, tmp_path / "one")
    two = run_local(config, tmp_path / "two", nproc=2, console=False)
    assert one.status == two.status == "completed", (one.reason, two.reason)
    a, b = (load(checkpoint_path(tmp_path / out / "checkpoints", 10))["model"] for out in ("one", "two"))
    assert any(n.endswith("running_var") for n in a)
    for name in a:
        assert torch.allclose(a[name].double(), b[name].double(), rtol=0, atol=1e-4), name
    assert two.final_metrics["valid/examples"] == 255
    for name, value in one.final_metrics.items():
        assert two.final_metrics[name] == pytest.approx(value, rel=1e-4, abs=1e-9), name
