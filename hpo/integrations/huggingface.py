"""The Hugging Face `Trainer` under hpo: `HpoTrainerCallback` (docs/scripts.md, "Framework callbacks").

    import hpo
    from transformers import Trainer, TrainingArguments
    from hpo.integrations.huggingface import HpoTrainerCallback, output_dir, resume_from_checkpoint

    s = hpo.session()
    args = TrainingArguments(output_dir=output_dir(), max_steps=s.max_train_steps,
                             eval_strategy="steps", eval_steps=s.eval_every_steps,
                             save_strategy="steps", save_steps=s.eval_every_steps, report_to="none")
    trainer = Trainer(model, args, train_dataset=train, eval_dataset=valid, callbacks=[HpoTrainerCallback()])
    trainer.train(resume_from_checkpoint=resume_from_checkpoint())

The callback
- reports what the Trainer logs (`on_log`: the training logs every `logging_steps`, the evaluation
  metrics after each evaluation) at `state.global_step`. Names go through the user's map first
  (`{"eval_accuracy": "valid/accuracy"}`; None leaves one out), then the default rule: `loss`,
  `grad_norm`, `learning_rate` -> `train/...`, `eval_x` -> `valid/x`, `test_x` -> `test/x`; the
  timings (`*_runtime`, `*_per_second`), `epoch`, `total_flos` and the run's closing `train_loss`
  mean are left out;
- makes each checkpoint the Trainer saves (`checkpoint-<N>/` under `output_dir`, a complete
  folder once `on_save` runs) visible to hpo as `$HPO_OUT_DIR/checkpoints/step-<N>`: a folder of
  hard links (copies across file systems) built under a temporary name and renamed into place, so
  the worker's retention and the Trainer's (`save_total_limit`, `load_best_model_at_end`) each
  delete their own names; a `checkpoint-<N>` the Trainer deleted takes its `step-<N>` with it (at
  the next save or at the end of training), and the worker notices the file is gone;
- `resume_from_checkpoint()` is the checkpoint of an earlier attempt (or None) for
  `trainer.train(resume_from_checkpoint=...)`: the Trainer restores the model, optimizer,
  scheduler, RNG states and data position, so the steps go on from N + 1;
- on SIGTERM (a stop, a lost lease, a drained worker) sets `control.should_save` and
  `control.should_training_stop` at the end of the step: the Trainer saves `checkpoint-<N>` (which
  becomes `step-<N>`) and `train()` returns; under DDP the ranks agree on stopping first;
- with `infeasible_on_nan=True`, a loss (`train/loss`, `valid/loss`, any name ending in `loss`)
  that is NaN or infinite ends the run as infeasible (`result.json`, exit status 0). The Trainer
  hides a NaN training loss unless `logging_nan_inf_filter=False`; the evaluation loss shows it.

Only the world's process 0 writes. The Trainer's hyperparameter search (`run_dir` per trial) is
not supported: hpo is the search.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpo.integrations import NameMap, hpo_name, not_finite, scalar
from hpo.session import Session
from hpo.session import session as _process_session

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError("hpo.integrations.huggingface needs transformers: pip install 'hpo[huggingface]'") from exc

__all__ = ["HpoTrainerCallback", "default_name", "output_dir", "resume_from_checkpoint"]

_log = logging.getLogger("hpo.integrations.huggingface")

_TRAIN = {"loss": "train/loss", "grad_norm": "train/grad_norm", "learning_rate": "train/learning_rate"}
_LEFT_OUT = {"epoch", "step", "total_flos", "train_loss"}
_LEFT_OUT_ENDINGS = ("_runtime", "_per_second", "_compilation_time")
_PREFIXES = (("eval_", "valid/"), ("test_", "test/"), ("train_", "train/"))


def default_name(name: str) -> str | None:
    """The Trainer's log names as the analysis reads them (`loss` -> `train/loss`, `eval_loss` ->
    `valid/loss`); None for timings and summaries."""
    if name in _TRAIN:
        return _TRAIN[name]
    if name in _LEFT_OUT or name.endswith(_LEFT_OUT_ENDINGS):
        return None
    for prefix, split in _PREFIXES:
        if name.startswith(prefix) and len(name) > len(prefix):
            return split + name[len(prefix) :]
    return name


def resume_from_checkpoint(session: Session | None = None) -> str | None:
    """The checkpoint an earlier attempt of this trial left (`resume_from`), or None: pass it to
    `trainer.train(resume_from_checkpoint=...)`."""
    return (session if session is not None else _process_session()).resume_from


def output_dir(session: Session | None = None) -> str:
    """`$HPO_OUT_DIR/hf`: where the Trainer should write (`TrainingArguments(output_dir=...)`), on the
    file system of hpo's checkpoints, so they are hard links and cost no space."""
    return str((session if session is not None else _process_session()).out_dir / "hf")


class HpoTrainerCallback(TrainerCallback):
    """Metrics, checkpoints, resume and SIGTERM for a Hugging Face `Trainer` under hpo (module
    docstring). `names` maps log names to hpo's (None leaves one out); `session` defaults to
    `hpo.session()`."""

    def __init__(
        self,
        names: NameMap | None = None,
        *,
        infeasible_on_nan: bool = False,
        session: Session | None = None,
    ) -> None:
        self.names: dict[str, str | None] = dict(names or {})
        self.infeasible_on_nan = infeasible_on_nan
        # Created now, so its SIGTERM handler is in place before training starts.
        self.session = session if session is not None else _process_session()
        self._mirrored: dict[int, Path] = {}  # step -> the Trainer's folder its step-<N> mirrors

    # -- hooks -----------------------------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.session.set_rank(args.process_index, args.world_size)
        if self.infeasible_on_nan and getattr(args, "logging_nan_inf_filter", False):
            _log.warning("infeasible_on_nan: the Trainer hides a NaN training loss unless logging_nan_inf_filter=False")

    def on_log(self, args: Any, state: Any, control: Any, logs: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        values: dict[str, float] = {}
        for name, value in (logs or {}).items():
            number = scalar(value)
            target = hpo_name(name, self.names, default_name)
            if number is not None and target:
                values[target] = number
        if not values:
            return
        step = int(state.global_step)
        self.session.report(step, values)
        if self.infeasible_on_nan:
            bad = not_finite(values, tuple(name for name in values if name.endswith("loss")))
            if bad is not None:
                self.session.infeasible(f"{bad} is {values[bad]} at step {step}")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._stop_requested(args):
            control.should_save = True
            control.should_training_stop = True

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        _wait_for_everyone(args)  # every rank's files (its RNG state) are in the folder
        if state.is_world_process_zero:
            self._mirror(Path(args.output_dir) / f"checkpoint-{state.global_step}", int(state.global_step))
            self._forget_deleted()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            self._forget_deleted()  # the Trainer's last rotation (save_total_limit=1 and the best model)

    # -- the parts -------------------------------------------------------------------------------

    def _stop_requested(self, args: Any) -> bool:
        stop = self.session.should_stop()
        if args.world_size > 1:  # every rank must take the same branch: saving is collective
            import torch
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                flag = torch.tensor([1.0 if stop else 0.0], device=args.device)
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)
                stop = bool(flag.item() > 0)
        return stop

    def _mirror(self, source: Path, step: int) -> None:
        if step in self._mirrored:
            return
        if not source.is_dir():
            _log.warning("hpo: no %s after the Trainer's save; hpo records no checkpoint at step %d", source, step)
            return
        with self.session.checkpoint(step, "") as target:
            _link_tree(source, target)
        self._mirrored[step] = source

    def _forget_deleted(self) -> None:
        for step, source in list(self._mirrored.items()):
            if not source.exists():
                shutil.rmtree(self.session.checkpoint_dir / f"step-{step}", ignore_errors=True)
                del self._mirrored[step]


def _link_tree(source: Path, target: Path) -> None:
    """`target`: the tree of `source`, its files hard links (copies where linking fails)."""
    for folder, _, files in os.walk(source):
        here = target / Path(folder).relative_to(source)
        here.mkdir(parents=True, exist_ok=True)
        for name in files:
            try:
                os.link(os.path.join(folder, name), here / name)
            except OSError:
                shutil.copy2(os.path.join(folder, name), here / name)


def _wait_for_everyone(args: Any) -> None:
    if args.world_size > 1:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()
