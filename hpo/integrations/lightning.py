"""PyTorch Lightning under hpo: `HpoCallback` (docs/scripts.md, "Framework callbacks").

    import hpo
    import lightning.pytorch as pl
    from hpo.integrations.lightning import HpoCallback, ckpt_path

    s = hpo.session()
    model = Digits(lr=s.params["learning_rate"])
    trainer = pl.Trainer(max_steps=s.max_train_steps, callbacks=[HpoCallback({"val_err": "valid/error_rate"})],
                         default_root_dir=s.out_dir, logger=False, enable_checkpointing=False)
    trainer.fit(model, datamodule=data, ckpt_path=ckpt_path())

The callback
- reports what the module logs (`self.log(...)`, the values behind `trainer.callback_metrics`)
  at `trainer.global_step`: per-step training values at each batch end (a value logged only every
  k steps repeats until it is logged again, within an epoch), per-epoch ones at the epoch's end,
  validation values at the validation's end (never the sanity check's), `trainer.test`'s at its
  end. Names go through the
  user's map first (`{"val_err": "valid/error_rate"}`; None leaves one out), then the default rule
  `val_x` -> `valid/x`, `train_x` -> `train/x`; the loss `training_step` returns is `train/loss`
  unless a logged name maps there;
- at each validation's end during `fit` (at each training epoch's end when there is no
  validation) writes `trainer.save_checkpoint` to a temporary name and renames it to
  `$HPO_OUT_DIR/checkpoints/step-<global_step>.ckpt`, where the worker records it;
- `ckpt_path()` is the checkpoint of an earlier attempt (or None) for `trainer.fit(ckpt_path=...)`:
  Lightning restores the model, optimizer, schedulers and loop counters, so the steps go on from
  N + 1. A checkpoint taken mid-epoch resumes exactly only with a resumable data loader (Lightning's
  own warning says so); the validation checkpoints at epoch ends always do;
- on SIGTERM (a stop, a lost lease, a drained worker) saves a checkpoint at the end of the batch
  and sets `trainer.should_stop` (Lightning also ends `fit` with its `SIGTERMException`, after
  which the callback saves one if none was yet); under DDP the ranks agree on stopping first;
- with `infeasible_on_nan=True`, a loss (`train/loss`, `valid/loss`, any name ending in `loss`)
  that is NaN or infinite ends the run as infeasible (`result.json`, exit status 0).

Only rank 0 (`trainer.global_rank`) writes. Strategies whose checkpoints every rank writes a part
of (FSDP or DeepSpeed sharded checkpoints) are not supported: use DDP.

The framework is `lightning.pytorch`, or the standalone `pytorch_lightning` when a script imported
that one first (or `lightning` is not installed): the callback must be the Trainer's own kind.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from typing import Any

from hpo.integrations import NameMap, hpo_name, not_finite, scalar
from hpo.session import Session
from hpo.session import session as _process_session

__all__ = ["HpoCallback", "ckpt_path", "default_name"]


def _framework() -> Any:
    if "pytorch_lightning" in sys.modules and "lightning.pytorch" not in sys.modules:
        return importlib.import_module("pytorch_lightning")
    try:
        return importlib.import_module("lightning.pytorch")
    except ImportError:
        try:
            return importlib.import_module("pytorch_lightning")
        except ImportError as exc:
            raise ImportError(
                "hpo.integrations.lightning needs PyTorch Lightning: pip install 'hpo[lightning]'"
            ) from exc


pl = _framework()
# Lightning 2.5 on ends `fit` on SIGTERM with this exception; before, only `should_stop` did.
_SIGTERM = getattr(importlib.import_module(f"{pl.__name__}.utilities.exceptions"), "SIGTERMException", None)

_Callback: Any = pl.Callback  # the Trainer's own kind (module docstring)

_PREFIXES = (("val_", "valid/"), ("val/", "valid/"), ("valid_", "valid/"), ("train_", "train/"), ("test_", "test/"))


def default_name(name: str) -> str:
    """Lightning's usual names as the analysis reads them: `val_loss` -> `valid/loss`,
    `train_loss` -> `train/loss`; any other name as it is."""
    for prefix, split in _PREFIXES:
        if name.startswith(prefix) and len(name) > len(prefix):
            return split + name[len(prefix) :]
    return name


def ckpt_path(session: Session | None = None) -> str | None:
    """The checkpoint an earlier attempt of this trial left (`resume_from`), or None: pass it to
    `trainer.fit(..., ckpt_path=ckpt_path())`."""
    return (session if session is not None else _process_session()).resume_from


class HpoCallback(_Callback):
    """Metrics, checkpoints, resume and SIGTERM for a Lightning `Trainer` under hpo (module
    docstring). `names` maps logged names to hpo's (None leaves one out); `loss_name` is where the
    loss `training_step` returns goes (None: not reported); `session` defaults to `hpo.session()`."""

    def __init__(
        self,
        names: NameMap | None = None,
        *,
        loss_name: str | None = "train/loss",
        infeasible_on_nan: bool = False,
        suffix: str = ".ckpt",
        session: Session | None = None,
    ) -> None:
        super().__init__()
        self.names: dict[str, str | None] = dict(names or {})
        self.loss_name = loss_name
        self.infeasible_on_nan = infeasible_on_nan
        self.suffix = suffix
        # Created now, before `fit`, so its SIGTERM handler is the one Lightning's own calls on.
        self.session = session if session is not None else _process_session()
        self._saved_step: int | None = None

    @property
    def ckpt_path(self) -> str | None:
        """`resume_from`: the checkpoint for `trainer.fit(ckpt_path=...)`, or None."""
        return self.session.resume_from

    # -- hooks -----------------------------------------------------------------------------------

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.session.set_rank(trainer.global_rank, trainer.world_size)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        values = self._values(trainer, on_step=True)
        loss = _loss(outputs)
        if self.loss_name and loss is not None and self.loss_name not in values:
            values[self.loss_name] = loss
        self._report(trainer.global_step, values)
        if self._stop_requested(trainer):
            self._save(trainer)
            trainer.should_stop = True

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._report(trainer.global_step, self._values(trainer, on_step=False, epoch_end=True))
        if not trainer.enable_validation:
            self._save(trainer)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.sanity_checking:
            return  # the sanity check is no evaluation of the model
        self._report(trainer.global_step, self._values(trainer, on_step=False))
        if trainer.state.fn == "fit":
            self._save(trainer)

    def on_test_end(self, trainer: Any, pl_module: Any) -> None:
        self._report(trainer.global_step, self._values(trainer, on_step=False))

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        # Lightning ends `fit` on SIGTERM with its own exception, on every rank at the same point
        # under DDP (before this callback's batch end saw the signal on every rank).
        if _SIGTERM is not None and isinstance(exception, _SIGTERM) and trainer.state.fn == "fit":
            self._save(trainer)

    # -- the parts -------------------------------------------------------------------------------

    def _values(self, trainer: Any, on_step: bool, epoch_end: bool = False) -> dict[str, float]:
        """What the module logged in the stage that is ending, by hpo name. Lightning keeps every
        value it was given in `trainer.callback_metrics` until it is logged again (the last
        validation's while training goes on), so the values come from the running loop's own
        results: this batch's per-step values, this epoch's per-epoch ones, this validation's. A
        value logged both per step and per epoch is there twice (`x` and `x_step`, or `x` and
        `x_epoch`): one name is kept, `x_epoch` at an epoch's end, `x` otherwise."""
        metrics = _stage_metrics(trainer, on_step)
        skip: set[str] = set()
        for name, value in metrics.items():
            for suffix in ("_step", "_epoch"):
                base = name[: -len(suffix)]
                if name.endswith(suffix) and base and metrics.get(base) is value:
                    skip.add(base if epoch_end and suffix == "_epoch" else name)
        values: dict[str, float] = {}
        for name, value in metrics.items():
            number = scalar(value)
            target = hpo_name(name, self.names, default_name)
            if name not in skip and number is not None and target:
                values[target] = number
        return values

    def _report(self, step: int, values: dict[str, float]) -> None:
        if not values:
            return
        self.session.report(step, values)
        if self.infeasible_on_nan:
            losses = tuple(name for name in values if name == self.loss_name or name.endswith("loss"))
            bad = not_finite(values, losses)
            if bad is not None:
                self.session.infeasible(f"{bad} is {values[bad]} at step {step}")

    def _stop_requested(self, trainer: Any) -> bool:
        stop = self.session.should_stop()
        if trainer.world_size > 1:  # every rank must take the same branch: saving is collective
            stop = bool(trainer.strategy.reduce_boolean_decision(stop, all=False))
        return stop

    def _save(self, trainer: Any) -> None:
        """`trainer.save_checkpoint` (called on every rank; rank 0 writes) into a temporary name,
        renamed to `checkpoints/step-<N>.ckpt`. Once per step; never at step 0 nor at the step
        the run resumed from (Lightning before 2.5 runs that step's validation again)."""
        step = int(trainer.global_step)
        if step in (0, self._saved_step, self.session.resume_step):
            return
        with self.session.checkpoint(step, self.suffix) as path:
            trainer.save_checkpoint(path)
        self._saved_step = step


def _stage_metrics(trainer: Any, on_step: bool) -> Mapping[str, Any]:
    """The running loop's logged values (`trainer._results`, what `callback_metrics` is made of:
    Lightning 2.0 to 2.6); everything Lightning keeps where that is missing."""
    results = getattr(trainer, "_results", None)
    if results is None or not callable(getattr(results, "metrics", None)):
        return dict(trainer.callback_metrics)
    return dict(results.metrics(on_step)["callback"])


def _loss(outputs: Any) -> float | None:
    """The loss `training_step` returned (a tensor, or a dict holding `loss`)."""
    if isinstance(outputs, Mapping):
        outputs = outputs.get("loss")
    return None if outputs is None else scalar(outputs)
