"""`trainer.data_workers` (docs/spec.md, "Training settings the trainer reads"): workloads whose
datasets are ordinary map-style Datasets of single examples (`ExampleDataset`), loaded through a
real DataLoader with `trainer.data_workers` processes. The DataLoader reads the step-based order of
`sampling`, so it feeds exactly the batches the batch-indexed path does: the same run trains to the
same bits, resumes exactly, and shards over DDP ranks the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import TensorDataset

from hpo.server.spec.trainer import TRAINER_KEYS
from hpo.trainer import ConfigError, train
from hpo.trainer.batches import ExampleDataset, TrainBatches, eval_batches
from hpo.trainer.checkpoints import checkpoint_path, load
from hpo.trainer.launch import run_local
from hpo.trainer.sampling import BatchOrder, eval_shard

from .conftest import TIMING_METRICS, read_metrics, series
from .custom_workload import _Examples
from .test_resume import StopAt

TINY = "tests.trainer.custom_workload:Tiny"
TINY_EXAMPLES = "tests.trainer.custom_workload:TinyExamples"
EXAMPLE = "examples.workloads.digits_dataloader:DigitsImages"


def _config(workload: str = TINY_EXAMPLES, steps: int = 20, **trainer: Any) -> dict[str, Any]:
    # 150 validation examples and an eval batch of 64: the last evaluation batch is a short one.
    return {
        "params": {"optimizer": "adam", "learning_rate": 0.02, "batch_size": 32, "width": 16, "dropout": 0.2},
        "trainer": {
            "workload": workload,
            "max_train_steps": steps,
            "eval_every_steps": 10,
            "eval_batch_size": 64,
            "collective_timeout_s": 60,
            **trainer,
        },
        "seed": 5,
    }


def _final_model(out: Path, step: int) -> dict[str, torch.Tensor]:
    return load(checkpoint_path(out / "checkpoints", step))["model"]


def _comparable(out: Path) -> list[tuple[int, str, float]]:
    return [p for p in read_metrics(out) if p[1] not in TIMING_METRICS]


def _tensors(size: int = 50) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(size, 3, generator=g), torch.randint(4, (size,), generator=g)


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_batches_equal_the_indexed_ones_step_by_step(workers: int) -> None:
    inputs, labels = _tensors()
    # Batches of 8 over 2 ranks from 50 examples: steps cross epoch boundaries (a new permutation).
    for rank in (0, 1):
        indexed = TrainBatches(TensorDataset(inputs, labels), BatchOrder(50, 16, 7, rank, 2), 20)
        order = BatchOrder(50, 16, 7, rank, 2)
        loaded = TrainBatches(ExampleDataset(_Examples(inputs, labels)), order, 20, workers=workers, rank=rank)
        assert loaded.loaded and not indexed.loaded
        try:
            for step in [*range(0, 8), 13, 14, 15, 3]:  # in order, then a jump (a resume), then back
                want, got = indexed(step), loaded(step)
                assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (rank, step)
                assert got[1].dtype == torch.int64
        finally:
            loaded.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_eval_batches_equal_the_indexed_ones(workers: int) -> None:
    inputs, labels = _tensors(23)
    for rank in (0, 1):
        indices, weights = eval_shard(23, rank, 2)  # 12 positions a rank, one padding on rank 1
        want = list(eval_batches(TensorDataset(inputs, labels), indices, weights, 5))
        got = list(eval_batches(ExampleDataset(_Examples(inputs, labels)), indices, weights, 5, workers=workers))
        assert len(got) == len(want) == 3
        for a, b in zip(got, want, strict=True):
            assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_a_dataloader_workload_trains_to_the_same_bits_as_the_indexed_one(tmp_path: Path) -> None:
    config = _config(train_eval_examples=40)
    loaded = train(config, tmp_path / "loaded")
    indexed = train(_config(TINY, train_eval_examples=40), tmp_path / "indexed")
    assert loaded.status == "completed", loaded.reason
    assert loaded.final_metrics == indexed.final_metrics
    assert loaded.final_metrics["valid/examples"] == 150
    assert loaded.final_metrics["train_eval/examples"] == 40
    assert loaded.final_metrics["valid/error_rate"] < 0.2  # it learned: chance is 2/3
    a, b = _final_model(tmp_path / "loaded", 20), _final_model(tmp_path / "indexed", 20)
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert _comparable(tmp_path / "loaded") == _comparable(tmp_path / "indexed")


def test_data_workers_train_the_same_run(tmp_path: Path) -> None:
    two = train(_config(data_workers=2), tmp_path / "two")
    none = train(_config(data_workers=0), tmp_path / "none")
    assert two.status == "completed", two.reason
    assert two.final_metrics == none.final_metrics
    assert 0.0 < series(read_metrics(tmp_path / "two"), "train/data_wait_fraction")[20] < 1.0


@pytest.mark.parametrize(("workers", "noise"), [(0, 0.3), (2, 0.0)])
def test_a_stopped_dataloader_run_resumes_exactly(tmp_path: Path, workers: int, noise: float) -> None:
    """With no workers, a per-example transform drawing from torch's global RNG resumes exactly too:
    it runs in the training process, whose RNG states the checkpoint holds."""
    config = _config(steps=30, data_workers=workers)
    config["trainer"]["workload_options"] = {"noise": noise}
    reference = train(config, tmp_path / "reference")
    stopped = train(config, tmp_path / "run", StopAt(13))
    assert (stopped.status, stopped.step) == ("stopped", 14)
    resumed = train(config, tmp_path / "run")
    assert (resumed.status, resumed.step) == ("completed", 30)
    assert resumed.final_metrics == reference.final_metrics
    a, b = _final_model(tmp_path / "run", 30), _final_model(tmp_path / "reference", 30)
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert _comparable(tmp_path / "run") == _comparable(tmp_path / "reference")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_ddp_processes_with_data_workers_train_the_one_process_model(tmp_path: Path) -> None:
    config = _config(data_workers=1)
    config["params"]["dropout"] = 0.0  # dropout draws per rank; without it 2 ranks compute 1 rank's step
    one = train(config, tmp_path / "one")
    two = run_local(config, tmp_path / "two", nproc=2, console=False)
    assert two.status == "completed", two.reason
    assert two.final_metrics["valid/examples"] == 150
    a, b = _final_model(tmp_path / "one", 20), _final_model(tmp_path / "two", 20)
    assert all(torch.allclose(a[name], b[name], rtol=0, atol=1e-4) for name in a)
    for name, value in one.final_metrics.items():
        assert two.final_metrics[name] == pytest.approx(value, rel=1e-4, abs=1e-9), name


def test_the_example_dataloader_workload_learns_the_digits(tmp_path: Path) -> None:
    config = {
        "params": {"optimizer": "adam", "learning_rate": 0.01, "batch_size": 32, "channels": 8},
        "trainer": {"workload": EXAMPLE, "max_train_steps": 60, "eval_every_steps": 60, "data_workers": 2},
        "seed": 0,
    }
    result = train(config, tmp_path)
    assert result.status == "completed", result.reason
    assert result.final_metrics["valid/examples"] == 360
    assert result.final_metrics["valid/error_rate"] < 0.35  # chance is 0.9


def test_data_workers_is_a_checked_trainer_setting(tmp_path: Path) -> None:
    assert "data_workers" in TRAINER_KEYS  # the server's strict list lets a study set it
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ConfigError, match="trainer.data_workers"):
            train(_config(data_workers=bad), tmp_path)


def test_an_unwrapped_single_example_dataset_is_refused_with_the_fix() -> None:
    """A map-style Dataset of single examples handed over as it is: a clear ConfigError that
    names ExampleDataset, not an indexing error from inside the training loop."""
    import pytest
    import torch
    from torch.utils.data import Dataset

    from hpo.trainer.batches import check_dataset
    from hpo.trainer.errors import ConfigError

    class OneAtATime(Dataset):
        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
            return torch.zeros(3), int(i) % 2  # an int index only: a tensor of positions fails

    with pytest.raises(ConfigError, match="train dataset .*ExampleDataset"):
        check_dataset(OneAtATime(), "train")
    check_dataset(torch.utils.data.TensorDataset(torch.zeros(4, 3), torch.zeros(4)), "valid")
