"""`hpo.integrations.huggingface.HpoTrainerCallback` against the real `transformers.Trainer`: the
example script (examples/integrations/hf_digits.py) run as the worker runs a command (metrics,
`step-<N>` checkpoints and the Trainer's deletions, an exact mid-epoch resume, SIGTERM), and in
process the naming rules and a loss that turns NaN."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from hpo.session import Session
from tests.integrations.conftest import checkpoints, points, result, run, start, steps, stop_after, trial_env, values

SCRIPT = "hf_digits.py"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_metrics_checkpoints_the_trainers_deletions_and_an_exact_resume(tmp_path: Path) -> None:
    first = run(SCRIPT, ["--seed=3"], trial_env(tmp_path, "attempt-1"))
    assert steps(first, "train/loss") == steps(first, "train/learning_rate") == list(range(1, 91))
    assert steps(first, "valid/loss") == steps(first, "valid/error_rate") == [30, 60, 90]
    assert values(first, "valid/error_rate")[-1] < 0.5, "it learned"
    names = {line.split('"name": ')[1].split(",")[0] for line in (first / "metrics.jsonl").read_text().splitlines()}
    assert not any("runtime" in n or "per_second" in n or "epoch" in n for n in names), names
    # save_total_limit=2: the Trainer deleted checkpoint-30, and step-30 went with it.
    saved = checkpoints(first)
    assert sorted(saved) == [60, 90] and sorted(p.name for p in (first / "hf").iterdir()) == [
        "checkpoint-60", "checkpoint-90"]  # fmt: skip
    model = saved[90] / "model.safetensors"
    assert model.is_file() and os.stat(model).st_nlink == 2, "a hard link to the Trainer's file"

    # The next attempt resumes from step 60, in the middle of an epoch: the Trainer restores the RNG
    # states and skips the batches already seen, so the run is the uninterrupted one.
    again = run(SCRIPT, ["--seed=3"], trial_env(tmp_path, "attempt-2", resume_from=saved[60]))
    assert steps(again, "train/loss") == list(range(61, 91))
    assert values(again, "train/loss") == pytest.approx(values(first, "train/loss")[60:], rel=1e-6)
    assert values(again, "valid/error_rate") == pytest.approx(values(first, "valid/error_rate")[2:], rel=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigterm_saves_a_checkpoint_and_stops_and_the_next_attempt_goes_on(tmp_path: Path) -> None:
    env = trial_env(tmp_path, "attempt-1")
    proc = start(SCRIPT, ["--seed=3", "--max-steps=1000000"], env)
    out = Path(env["HPO_OUT_DIR"])
    assert stop_after(proc, out, "train/loss", 40) == 0
    last = steps(out, "train/loss")[-1]
    saved = checkpoints(out)
    assert last in saved and max(saved) == last < 1_000_000, (last, sorted(saved))
    assert (out / "hf" / f"checkpoint-{last}").is_dir()

    resumed = trial_env(tmp_path, "attempt-2", resume_from=saved[last])
    again = run(SCRIPT, ["--seed=3", f"--max-steps={last + 5}"], resumed)
    assert steps(again, "train/loss") == list(range(last + 1, last + 6))


def test_log_names_the_users_map_and_what_is_left_out(tmp_path: Path) -> None:
    from hpo.integrations.huggingface import HpoTrainerCallback, default_name

    assert [default_name(n) for n in ("loss", "eval_loss", "eval_accuracy", "test_f1", "eval_runtime", "epoch",
                                      "train_loss", "train_samples_per_second", "custom")] == [
        "train/loss", "valid/loss", "valid/accuracy", "test/f1", None, None, None, None, "custom"]  # fmt: skip
    s = Session(config={}, out_dir=tmp_path / "out", handle_signals=False)
    callback = HpoTrainerCallback({"eval_accuracy": "valid/acc", "grad_norm": None}, session=s)
    state = SimpleNamespace(global_step=7, is_world_process_zero=True)
    callback.on_log(None, state, None, logs={"loss": 0.5, "grad_norm": 2.0, "learning_rate": 0.1, "epoch": 0.2})
    callback.on_log(None, state, None, logs={"eval_loss": 0.25, "eval_accuracy": 0.9, "eval_runtime": 1.0})
    s.close()
    found = points(tmp_path / "out", "train/loss") + points(tmp_path / "out", "valid/acc")
    assert found == [(7, 0.5), (7, 0.9)]
    assert steps(tmp_path / "out", "train/grad_norm") == [] and steps(tmp_path / "out", "valid/loss") == [7]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_loss_that_is_no_longer_finite_ends_the_run_infeasible(tmp_path: Path) -> None:
    """In process, a real Trainer whose loss turns NaN at step 3 (logging_nan_inf_filter=False, so
    the Trainer shows it): result.json says infeasible and the run ends with status 0."""
    import torch
    from transformers import Trainer, TrainingArguments

    from hpo.integrations.huggingface import HpoTrainerCallback

    class Diverging(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)
            self.calls = 0

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            self.calls += 1
            loss = (self.layer(x).squeeze(-1) - labels).pow(2).mean()
            return {"loss": loss * float("nan") if self.calls >= 3 else loss}

    class Data(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 16

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"x": torch.ones(2) * i, "labels": torch.tensor(float(i))}

    s = Session(config={}, out_dir=tmp_path / "out", handle_signals=False)
    args = TrainingArguments(output_dir=str(tmp_path / "out" / "hf"), max_steps=20, logging_steps=1,
                             logging_nan_inf_filter=False, save_strategy="no", report_to="none", use_cpu=True,
                             disable_tqdm=True, per_device_train_batch_size=2)  # fmt: skip
    trainer = Trainer(Diverging(), args, train_dataset=Data(),
                      callbacks=[HpoTrainerCallback(infeasible_on_nan=True, session=s)])  # fmt: skip
    with pytest.raises(SystemExit) as exit_:
        trainer.train()
    assert exit_.value.code == 0
    assert result(tmp_path / "out") == ("infeasible", "train/loss is nan at step 3")
    assert steps(tmp_path / "out", "train/loss") == [1, 2, 3]
