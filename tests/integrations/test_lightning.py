"""`hpo.integrations.lightning.HpoCallback` against the real PyTorch Lightning: the example script
(examples/integrations/lightning_digits.py) run as the worker runs a command (metrics, `step-<N>`
checkpoints, an exact resume, SIGTERM), and small modules in process for the naming rules and a
loss that turns NaN."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hpo.session import Session
from tests.integrations.conftest import checkpoints, points, result, run, start, steps, stop_after, trial_env, values

SCRIPT = "lightning_digits.py"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_metrics_checkpoints_and_an_exact_resume(tmp_path: Path) -> None:
    first = run(SCRIPT, ["--lr=0.1", "--seed=3"], trial_env(tmp_path, "attempt-1"))
    assert steps(first, "train/loss") == list(range(1, 91))
    assert steps(first, "valid/loss") == steps(first, "valid/error_rate") == [30, 60, 90]
    assert points(first, "valid/error_rate")[-1][1] < 0.5, "it learned"
    saved = checkpoints(first)
    assert sorted(saved) == [30, 60, 90] and all(p.name == f"step-{s}.ckpt" for s, p in saved.items())

    # The next attempt resumes from the checkpoint at step 60: the steps go on from 61, no gap, no
    # duplicate, and the run is the uninterrupted one (the data order is a function of the epoch).
    again = run(SCRIPT, ["--lr=0.1", "--seed=3"], trial_env(tmp_path, "attempt-2", resume_from=saved[60]))
    assert steps(again, "train/loss") == list(range(61, 91))
    assert values(again, "train/loss") == pytest.approx(values(first, "train/loss")[60:], rel=1e-6)
    # Lightning before 2.5 runs the resumed step's validation again: the same points, replaced.
    assert points(again, "valid/error_rate")[-1] == pytest.approx(points(first, "valid/error_rate")[-1], rel=1e-6)
    assert set(steps(again, "valid/error_rate")) <= {60, 90}
    assert sorted(checkpoints(again)) == [90]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigterm_saves_a_checkpoint_and_stops_and_the_next_attempt_goes_on(tmp_path: Path) -> None:
    env = trial_env(tmp_path, "attempt-1")
    proc = start(SCRIPT, ["--lr=0.1", "--seed=3", "--max-steps=100000"], env)
    out = Path(env["HPO_OUT_DIR"])
    assert stop_after(proc, out, "train/loss", 40) == 0
    last = steps(out, "train/loss")[-1]
    saved = checkpoints(out)
    assert last in saved and last < 100_000, (last, sorted(saved))
    assert max(saved) == last, "the stop's checkpoint is the newest, at the last reported step"

    again = run(SCRIPT, ["--lr=0.1", "--seed=3", f"--max-steps={last + 5}"],
                trial_env(tmp_path, "attempt-2", resume_from=saved[last]))  # fmt: skip
    assert steps(again, "train/loss") == list(range(last + 1, last + 6))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_names_stages_and_the_per_step_and_per_epoch_twins(tmp_path: Path) -> None:
    """In process: training values at their step, per-epoch ones at the epoch's last step under
    `x_epoch`, validation values at the validation's step, never the sanity check's, and
    `trainer.test`'s at the last step; the user's
    map first (None drops a name), then `val_` -> `valid/`, `train_` -> `train/`."""
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from hpo.integrations.lightning import HpoCallback, default_name

    assert (default_name("val_loss"), default_name("train_acc"), default_name("lr"), default_name("val_")) == (
        "valid/loss", "train/acc", "lr", "val_")  # fmt: skip

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            loss = self.layer(batch[0]).pow(2).mean()
            self.log("train_mse", loss, on_step=True, on_epoch=True)
            self.log("noise", torch.tensor(1.0))
            return loss

        def validation_step(self, batch: Any, index: int) -> None:
            self.log("val_mse", self.layer(batch[0]).pow(2).mean())

        def test_step(self, batch: Any, index: int) -> None:
            self.log("test_mse", self.layer(batch[0]).pow(2).mean())

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    s = Session(config={"trainer": {}}, out_dir=tmp_path / "out", handle_signals=False)
    data = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2)
    callback = HpoCallback({"val_mse": "valid/error_rate", "noise": None}, session=s)
    trainer = pl.Trainer(max_steps=8, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=1, callbacks=[callback])  # fmt: skip
    module = Module()
    trainer.fit(module, data, data)
    trainer.test(module, data, verbose=False)
    s.close()
    out = tmp_path / "out"
    assert steps(out, "train/mse") == list(range(1, 9))
    assert steps(out, "train/loss") == list(range(1, 9)), "what training_step returned"
    assert steps(out, "train/mse_epoch") == [4, 8]
    assert steps(out, "valid/error_rate") == [4, 8], "no point from the sanity check"
    assert steps(out, "noise") == steps(out, "val_mse") == steps(out, "train/mse_step") == []
    assert steps(out, "test/mse") == [8]
    assert sorted(checkpoints(out)) == [4, 8], "none for trainer.test"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_loss_that_is_no_longer_finite_ends_the_run_infeasible(tmp_path: Path) -> None:
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from hpo.integrations.lightning import HpoCallback

    class Diverging(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            loss = self.layer(batch[0]).pow(2).mean()
            return loss * float("nan") if self.global_step >= 2 else loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    s = Session(config={"trainer": {}}, out_dir=tmp_path / "out", handle_signals=False)
    callback = HpoCallback(infeasible_on_nan=True, session=s)
    trainer = pl.Trainer(max_steps=20, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[callback])  # fmt: skip
    with pytest.raises(SystemExit) as exit_:
        trainer.fit(Diverging(), DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2))
    assert exit_.value.code == 0
    assert result(tmp_path / "out") == ("infeasible", "train/loss is nan at step 3")
    assert steps(tmp_path / "out", "train/loss") == [1, 2, 3]


def test_importing_the_integrations_package_loads_no_framework() -> None:
    import subprocess
    import sys

    code = (
        "import sys, hpo.integrations, hpo.session\n"
        "print(sorted(m for m in ('torch', 'lightning', 'pytorch_lightning', 'transformers') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr
