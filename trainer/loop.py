"""The training loop: `train(config, out_dir, reporter) -> RunResult` (trainer/README.md).

One code path runs alone, under `torchrun`, under `hpo train --nproc N` and under Ray Train: the
process group comes from the standard environment (`distributed.setup`). What the loop does, with
the playbook section each practice comes from:

- Steps, not epochs: `max_train_steps` updates; the data position is the step itself
  (`sampling.BatchOrder`), so resuming needs no iterator state. Batches are gathered by index, or
  for an `ExampleDataset` collated by a DataLoader reading the same indices (`batches`).
- Evaluation every `eval_every_steps` steps, never on a clock, exact over ranks (`evaluation`;
  playbook 000, "Setting up periodic evaluations").
- Gradient clipping by global norm; the unclipped norm is reported every step with the fraction of
  steps clipped so far (playbook 002, "What are the best practices for gradient clipping?").
- A non-finite loss or gradient norm stops the run as `infeasible` at that step (playbook 001,
  "Identifying and addressing training instability": such a point is a property of the
  hyperparameters, not a failure to retry).
- Retrospective checkpoint selection: keep the `keep_best_checkpoints` best checkpoints by the
  objective plus the newest (playbook 000, "Saving checkpoints and retrospectively selecting the
  best checkpoint").
- Exact resume: a checkpoint holds the model on the CPU unwrapped from DDP, the optimizer, the step,
  every rank's RNG states, the evaluation history, the divergence monitor's reference values, the
  newest evaluation and the resolved config; written atomically. A run killed anywhere and started
  again ends bitwise equal to an uninterrupted one on the CPU, judged and answered alike.
- Sanity checks (playbook 004, "Validation before training" and "Load and save one checkpoint
  before training"): the untrained model's loss against ln(classes), a save-and-load round trip of
  a checkpoint before the first step, and an optional `overfit_one_batch` mode.
- Throughput: `train/examples_per_second` and `train/data_wait_fraction` (the share of step time
  spent fetching input: the input-bound signal of playbook 002, "Choosing the batch size")."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import random
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from . import checkpoints, distributed
from .batches import TrainBatches, check_dataset, first_examples, gather
from .batchnorm import average_buffers, prepare_batch_norm
from .config import RunConfig, check_world_size, parse_config
from .divergence import TRAIN_LOSS, DivergenceMonitor
from .errors import ConfigError
from .evaluation import Evaluator
from .optim import build_optimizer, set_learning_rate, unused_hyperparameters
from .reporters import MetricsFile, NullReporter, Reporter, report_deleted
from .result import RunResult
from .sampling import BatchOrder, derive_seed
from .schedules import learning_rate
from .workloads import Workload, load_workload, resolve_model_params

_log = logging.getLogger("hpo.trainer")

METRICS_FILE = "metrics.jsonl"
RESULT_FILE = "result.json"


def train(config: Mapping[str, Any], out_dir: Path | str, reporter: Reporter | None = None) -> RunResult:
    """Runs (or resumes) one training run; see the module doc.

    Raises `ConfigError` before the first step when the config cannot be trained as written. Every
    other failure is an answer: `infeasible` (non-finite loss or gradient, out of memory) or `error`
    (any other exception, with its traceback in `reason`). Only rank 0 uses `reporter`, writes
    `metrics.jsonl`, checkpoints and `result.json`."""
    run_config, workload = check_config(config)
    ctx = distributed.setup(run_config.resources, run_config.trainer.collective_timeout_s)
    try:
        check_world_size(run_config, ctx.world_size)
        given = set(dict(config.get("params") or {}))
        run = Run(
            run_config, workload, Path(out_dir), ctx, reporter if ctx.is_main and reporter else NullReporter(), given
        )
        result = run.execute()
    finally:
        distributed.teardown(ctx)
    return result


def check_config(config: Mapping[str, Any], world_size: int | None = None) -> tuple[RunConfig, Workload]:
    """Parses `config` and resolves its workload, raising `ConfigError` for anything `train` would
    refuse (with `world_size`, the settings that depend on it too). Cheap: builds no model."""
    run_config = parse_config(config)
    workload = load_workload(run_config.trainer.workload, run_config.trainer.workload_options)
    run_config = run_config.with_model_params(resolve_model_params(workload, run_config.model_params))
    _check_objective(run_config, workload)
    if world_size is not None:
        check_world_size(run_config, world_size)
    return run_config, workload


def _check_objective(config: RunConfig, workload: Workload) -> None:
    names = {f"valid/{name}" for name in workload.metric_names()}
    if config.trainer.train_eval_examples:
        names |= {f"train_eval/{name}" for name in workload.metric_names()}
    if config.objective.metric not in names:
        raise ConfigError(
            f"objective.metric {config.objective.metric!r} is not reported; known: {', '.join(sorted(names))}"
        )


@dataclass
class History:
    """What the loop accumulates across steps and resumes: the objective at every evaluation, the
    best one, and the clipping count. Saved in every checkpoint."""

    objectives: dict[int, float | None] = field(default_factory=dict)
    clipped_steps: int = 0
    warnings: list[str] = field(default_factory=list)

    def best(self, better: Any) -> tuple[int | None, float | None]:
        best_step, best_value = None, None
        for step, value in sorted(self.objectives.items()):
            if value is not None and math.isfinite(value) and (best_value is None or better(value, best_value)):
                best_step, best_value = step, value
        return best_step, best_value

    def state(self) -> dict[str, Any]:
        return {
            "objectives": {str(k): v for k, v in self.objectives.items()},
            "clipped_steps": self.clipped_steps,
            "warnings": list(self.warnings),
        }

    @classmethod
    def from_state(cls, raw: Mapping[str, Any]) -> History:
        return cls({int(k): v for k, v in raw["objectives"].items()}, int(raw["clipped_steps"]), list(raw["warnings"]))


class Diverged(Exception):
    """The loss or the gradient norm stopped being finite (an answer, not a bug)."""

    def __init__(self, step: int, what: str) -> None:
        super().__init__(f"{what} at step {step}")
        self.step = step


class Run:
    """One call of `train()` on one rank: built, resumed, trained, answered."""

    def __init__(
        self,
        config: RunConfig,
        workload: Workload,
        out_dir: Path,
        ctx: distributed.DistContext,
        reporter: Reporter,
        given_params: set[str],
    ):
        self.config, self.workload, self.out_dir, self.ctx, self.reporter = config, workload, out_dir, ctx, reporter
        self.h, self.settings = config.hparams, config.trainer
        self.ckpt_dir = checkpoints.checkpoint_dir(out_dir)
        self.history = History()
        self.step = 0
        self.metrics_file: MetricsFile | None = None
        self.last_eval: dict[str, float] = {}
        self.examples_per_second: float | None = None
        self.learning_rate = 0.0  # of the newest step, reported with each log line
        self.given_params = given_params  # names the config set itself (for the unused-optimizer warning)
        self.divergence = DivergenceMonitor(self.settings.divergence_factor, self.settings.divergence_patience)

    # -- building --------------------------------------------------------------------------------

    def build(self) -> None:
        cfg, ctx = self.config, self.ctx
        train_set, valid_set = self.workload.datasets()
        check_dataset(train_set, "train")
        check_dataset(valid_set, "valid")
        self.train_set = train_set
        pin_memory = ctx.device.type == "cuda"
        # Shared seed: every rank builds identical parameters (DDP also broadcasts them, but a
        # 1-process run must start where a 2-process run does).
        torch.manual_seed(derive_seed(cfg.seed, "init"))
        model = self.workload.build_model(cfg.model_params)
        model, self.batch_norm = prepare_batch_norm(model, ctx, self.settings.ghost_batch_size)
        self.model = model.to(ctx.device)
        self.ddp: nn.Module = self.model
        if ctx.distributed:
            # Buffers are averaged before evaluation and checkpoints instead (batchnorm.average_buffers).
            device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
            self.ddp = DistributedDataParallel(self.model, device_ids=device_ids, broadcast_buffers=False)
        self.optimizer = build_optimizer(self.model, self.h)
        self.mean_loss = _mean_loss(self.workload)
        # Optional mixed precision and gradient accumulation; without either, the step is unchanged.
        precision = self.settings.precision
        self.autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        self.scaler = torch.amp.GradScaler(ctx.device.type) if precision == "fp16" else None
        self.plain_step = self.autocast_dtype is None and self.settings.grad_accumulation_steps == 1
        self.params = [p for p in self.model.parameters() if p.requires_grad]  # listed once, not every step
        # Per-rank seeds: dropout (the global generator) and augmentation differ across ranks
        # (playbook 000, "Considerations for multi-host pipelines").
        torch.manual_seed(derive_seed(cfg.seed, "dropout", ctx.rank))
        if ctx.device.type == "cuda":
            torch.cuda.manual_seed(derive_seed(cfg.seed, "dropout", ctx.rank))
        self.augment_rng = torch.Generator().manual_seed(derive_seed(cfg.seed, "augment", ctx.rank))
        self.order = BatchOrder(
            len(train_set), self.h.batch_size, cfg.seed, ctx.rank, ctx.world_size, fixed=self.settings.overfit_one_batch
        )
        workers = self.settings.data_workers
        self.batches = TrainBatches(
            train_set,
            self.order,
            self.settings.max_train_steps,
            workers=workers,
            seed=cfg.seed,
            rank=ctx.rank,
            pin_memory=pin_memory,
        )
        eval_batch = self.settings.eval_batch_size or max(self.h.batch_size, 256)
        self.evaluators = [Evaluator("valid", valid_set, self.workload, ctx, eval_batch, workers, cfg.seed)]
        if self.settings.train_eval_examples:
            subset = first_examples(train_set, min(self.settings.train_eval_examples, len(train_set)))
            self.evaluators.append(Evaluator("train_eval", subset, self.workload, ctx, eval_batch, workers, cfg.seed))
        unused = unused_hyperparameters(self.h, self.given_params)
        if unused and ctx.is_main:
            self.history.warnings.append(f"{', '.join(unused)} not read by optimizer {self.h.optimizer}")

    # -- checkpoints -----------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """This run's checkpoint (collective: every rank must call it; rank 0 gets the RNG states
        of every rank)."""
        average_buffers(self.model, self.ctx)
        rng = distributed.gather_objects(_rng_state(self.augment_rng, self.ctx.device), self.ctx)
        return {
            "format": checkpoints.FORMAT_VERSION,
            "step": self.step,
            "model": checkpoints.to_cpu(self.model.state_dict()),
            "optimizer": checkpoints.to_cpu(self.optimizer.state_dict()),
            "rng": rng,
            "world_size": self.ctx.world_size,
            "history": self.history.state(),
            "divergence": self.divergence.state(),
            # What `answer` reports when the run is resumed at its last step (killed between its
            # final checkpoint and result.json): the newest evaluation and throughput.
            "last_eval": dict(self.last_eval),
            "examples_per_second": self.examples_per_second,
            "config": self.config.resolved(),
            "identity": self.config.identity,
            **({"scaler": self.scaler.state_dict()} if self.scaler is not None else {}),
        }

    def load_state(self, state: Mapping[str, Any], source: Path) -> None:
        if state["identity"] != self.config.identity:
            raise ConfigError(f"checkpoint {source} belongs to another run (different params, seed or workload)")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler is not None and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
        self.step = int(state["step"])
        self.history = History.from_state(state["history"])
        self.last_eval = {str(k): float(v) for k, v in state.get("last_eval", {}).items()}
        eps = state.get("examples_per_second")
        self.examples_per_second = None if eps is None else float(eps)
        if "divergence" in state:
            self.divergence.load_state(state["divergence"])
        else:
            self.rebuild_divergence(source)
        if state["world_size"] == self.ctx.world_size:
            _set_rng_state(state["rng"][self.ctx.rank], self.augment_rng, self.ctx.device)
        elif self.ctx.is_main:
            _log.warning(
                "resuming a %d-process checkpoint with %d processes: RNG streams restart",
                state["world_size"],
                self.ctx.world_size,
            )

    def rebuild_divergence(self, source: Path) -> None:
        """A checkpoint written before the monitor's state was saved: replay the training losses
        the run logged up to its step (the monitor saw exactly these values: metrics.jsonl holds
        them as exact reprs), from this run's metrics.jsonl or the one beside the checkpoint's run
        folder, whichever has more. Without the first step's loss (no file, or an attempt that was
        itself resumed), the initial value is the workload's chance loss (what an untrained model's
        loss is; the sanity check compares the first loss with it), never the first loss after
        the resume, which may come from a lucky low batch; the losses found still give the minimum."""
        losses: list[tuple[int, float]] = []
        if self.ctx.is_main:
            for path in dict.fromkeys([self.out_dir / METRICS_FILE, source.parent.parent / METRICS_FILE]):
                found = logged_losses(path, self.step)
                losses = found if len(found) > len(losses) else losses
        losses = distributed.broadcast_object(losses, self.ctx)
        complete = bool(losses) and losses[0][0] == 1
        chance = self.workload.chance_loss
        if not complete and chance is not None:
            self.divergence.initial = chance
        self.divergence.replay(losses)
        if not self.ctx.is_main or len(losses) == self.step:
            return
        if complete:
            reference = "its first loss"
        elif chance is not None:
            reference = f"the chance loss {chance:.4g} for its first"
        else:
            reference = "the first loss it found (the workload has no chance loss)"
        _log.warning(
            "checkpoint %s has no divergence state: rebuilt from %d of its %d training losses, with %s",
            source,
            len(losses),
            self.step,
            reference,
        )

    def save(self, objective: float | None) -> None:
        state = self.state()
        if not self.ctx.is_main:
            return
        assert self.metrics_file is not None
        self.metrics_file.flush()  # the file always covers the newest checkpoint
        path = checkpoints.checkpoint_path(self.ckpt_dir, self.step)
        checkpoints.save_atomic(state, path)
        removed = checkpoints.prune(
            self.ckpt_dir, self.history.objectives.get, self.settings.keep_best_checkpoints, self.config.objective
        )
        report_deleted(self.reporter, removed)
        self.reporter.checkpoint(self.step, str(path), objective)

    def resume_source(self) -> Path | None:
        """`trainer.resume_from` (a checkpoint file, as the worker passes from an earlier attempt),
        else the newest checkpoint in this run's own folder."""
        if self.settings.resume_from:
            path = Path(self.settings.resume_from)
            if not path.is_file():
                raise ConfigError(f"trainer.resume_from {path} is not a checkpoint file")
            return path
        found = checkpoints.list_checkpoints(self.ckpt_dir)
        return found[-1][1] if found else None

    def sanity_round_trip(self) -> None:
        """Playbook (004), "Load and save one checkpoint before training": a bug here should show
        in seconds, not after hours of training."""
        state = self.state()
        if not self.ctx.is_main:
            return
        probe = self.ckpt_dir / "sanity-check.tmp"
        checkpoints.save_atomic(state, probe)
        try:
            loaded = checkpoints.load(probe)
        finally:
            probe.unlink(missing_ok=True)
        for name, tensor in state["model"].items():
            if not torch.equal(tensor, loaded["model"][name]):
                raise RuntimeError(f"checkpoint round trip changed {name}")

    # -- the run ---------------------------------------------------------------------------------

    def execute(self) -> RunResult:
        main = self.ctx.is_main
        if main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            checkpoints.remove_temporaries(self.ckpt_dir)
        try:
            self.build()
            source = self.resume_source()
            if source is not None:
                self.load_state(checkpoints.load(source), source)
                if main:
                    _log.info("resumed from %s at step %d", source, self.step)
            if main:
                MetricsFile.truncate_after(self.out_dir / METRICS_FILE, self.step)
                self.metrics_file = MetricsFile(self.out_dir / METRICS_FILE)
            if self.settings.sanity_checks and source is None:
                self.sanity_round_trip()
            status, reason = self.loop()
        except ConfigError:
            raise
        except Diverged as exc:
            status, reason = "infeasible", str(exc)
            self.step = exc.step
        except torch.OutOfMemoryError as exc:
            # Playbook (002), "Choosing the batch size": memory is a property of the point.
            status, reason = "infeasible", f"out of memory: {exc}"[:2000]
        except Exception as exc:
            status, reason = "error", "".join(traceback.format_exception(exc))[-8000:]
        finally:
            if self.metrics_file is not None:
                self.metrics_file.close()
            if hasattr(self, "batches"):  # (not when `build` failed before making it)
                self.batches.close()  # ends DataLoader workers
        return self.answer(status, reason)

    def loop(self) -> tuple[str, str | None]:
        total, every = self.settings.max_train_steps, self.settings.eval_every_steps
        checkpoint_every = self.settings.checkpoint_every
        window = _Window()
        while self.step < total:
            values, stop = self.train_step(window)
            stop = stop and self.step < total  # a stop during the last step finds the run complete
            if self.step % self.settings.log_every_steps == 0 or self.step == total:
                # The schedule is a pure function of the step: a point per log line draws it.
                values["train/learning_rate"] = self.learning_rate
                values.update(window.take(self.h.batch_size))
                self.examples_per_second = values["train/examples_per_second"]
            evaluated = self.step % every == 0 or self.step == total
            if evaluated:
                values.update(self.evaluate())
            self.report(values)
            if evaluated:
                self.save(self.history.objectives[self.step])
            elif self.step % checkpoint_every == 0 or stop:
                self.save(None)
            if stop:
                return "stopped", "stop requested"
        if self.settings.overfit_one_batch:
            self.check_overfit()
        return "completed", None

    def train_step(self, window: _Window) -> tuple[dict[str, float], bool]:
        """One update; answers its metrics and whether rank 0 asked every rank to stop."""
        device, started = self.ctx.device, time.perf_counter()
        inputs, labels = self.batches(self.step)
        inputs = self.workload.augment(inputs, labels, self.augment_rng, self.config.model_params)
        inputs, labels = inputs.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        loaded = time.perf_counter()
        lr = learning_rate(
            self.step, self.h.learning_rate, self.h.lr_schedule, self.h.warmup_steps, self.settings.max_train_steps
        )
        set_learning_rate(self.optimizer, lr)
        self.optimizer.zero_grad(set_to_none=True)
        if self.plain_step:
            loss = self.mean_loss(self.ddp(inputs), labels, self.h.label_smoothing)
            loss.backward()
        else:
            loss = self.accumulate(inputs, labels)
        norm = _global_norm([p.grad for p in self.params if p.grad is not None])
        clip = self.h.grad_clip_norm
        clipped = clip is not None and norm > clip
        if clip is not None and clipped:
            params = [p for p in self.params if p.grad is not None]
            torch.nn.utils.clip_grads_with_norm_(params, clip, torch.tensor(norm))
        stop = self.ctx.is_main and self.reporter.should_stop()
        if self.ctx.distributed:
            # One small collective per step: the global mean loss, and rank 0's stop request.
            shared = torch.tensor([loss.detach().item() / self.ctx.world_size, float(stop)], dtype=torch.float64)
            distributed.all_reduce_sum(shared, self.ctx)
            global_loss, stop = float(shared[0]), bool(shared[1] > 0)
        else:
            global_loss = loss.item()
        if self.step == 0 and self.settings.sanity_checks:
            self.check_initial_loss(global_loss)
        if not math.isfinite(global_loss):
            self.report({"train/loss": global_loss, "train/grad_norm": norm}, step=self.step + 1)
            raise Diverged(self.step + 1, f"training loss is {global_loss}")
        if not math.isfinite(norm) and self.scaler is None:
            # (Under fp16 an overflowing gradient is the loss scaler's business: it skips the step.)
            self.report({"train/loss": global_loss, "train/grad_norm": norm}, step=self.step + 1)
            raise Diverged(self.step + 1, f"gradient norm is {norm}")
        if (diverged := self.divergence.update(self.step + 1, global_loss)) is not None:
            self.report({"train/loss": global_loss, "train/grad_norm": norm}, step=self.step + 1)
            raise Diverged(self.step + 1, diverged)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.step += 1
        self.history.clipped_steps += int(clipped)
        window.add(loaded - started, time.perf_counter() - started)
        self.learning_rate = lr
        values = {"train/loss": global_loss, "train/grad_norm": norm}
        if clip is not None:
            values["train/clipped_fraction"] = self.history.clipped_steps / self.step
        return values, stop

    def accumulate(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The batch's mean loss with its gradients summed over `grad_accumulation_steps` equal
        micro-batches (DDP all-reduces only at the last one), under `precision`'s autocast; the
        gradients come out unscaled under fp16."""
        chunks = self.settings.grad_accumulation_steps
        total = torch.zeros((), dtype=torch.float32, device=inputs.device)
        device, dtype = self.ctx.device.type, self.autocast_dtype
        for index, (x, y) in enumerate(zip(inputs.chunk(chunks), labels.chunk(chunks), strict=True)):
            last = index == chunks - 1
            ddp = cast(DistributedDataParallel, self.ddp)
            sync = contextlib.nullcontext() if last or not self.ctx.distributed else ddp.no_sync()
            autocast = torch.autocast(device, dtype, enabled=dtype is not None)
            with sync:
                with autocast:
                    loss = self.mean_loss(self.ddp(x), y, self.h.label_smoothing) / chunks
                (loss if self.scaler is None else self.scaler.scale(loss)).backward()
            total += loss.detach().float()
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        return total

    def evaluate(self) -> dict[str, float]:
        average_buffers(self.model, self.ctx)
        values: dict[str, float] = {}
        for evaluator in self.evaluators:
            values.update(evaluator(self.model))
        objective = values[self.config.objective.metric]
        self.history.objectives[self.step] = objective if math.isfinite(objective) else None
        self.last_eval = values
        return values

    def report(self, values: dict[str, float], step: int | None = None) -> None:
        if not self.ctx.is_main or self.metrics_file is None:
            return
        at = self.step if step is None else step
        self.metrics_file.write(at, values)
        self.reporter.metrics(at, values)

    def check_initial_loss(self, loss: float) -> None:
        chance = self.workload.chance_loss
        if chance is None or not math.isfinite(loss) or not self.ctx.is_main:
            return
        tolerance = self.settings.chance_loss_tolerance
        if abs(loss - chance) > tolerance * chance:
            self.history.warnings.append(
                f"initial_loss: the untrained model's loss {loss:.4g} is far from chance "
                f"ln({self.workload.num_classes})={chance:.4g}; check the initialization, the labels and the loss "
                "(playbook 004)"
            )

    def check_overfit(self) -> None:
        """Playbook (004): a model that cannot drive one batch's loss near zero has a bug."""
        if not self.ctx.is_main:
            return
        inputs, labels = gather(self.train_set, self.order.indices(0))
        with torch.no_grad():
            self.model.eval()
            loss = float(self.mean_loss(self.model(inputs.to(self.ctx.device)), labels.to(self.ctx.device), 0.0))
            self.model.train()
        if loss > 0.05 * (self.workload.chance_loss or 1.0):
            self.history.warnings.append(
                f"overfit_one_batch: loss on the batch is still {loss:.4g} after {self.step} steps"
            )

    def answer(self, status: str, reason: str | None) -> RunResult:
        best_step, best_value = self.history.best(self.config.objective.better)
        best_path = checkpoints.checkpoint_path(self.ckpt_dir, best_step) if best_step is not None else None
        result = RunResult(
            status=status,
            reason=reason,
            step=self.step,
            best_step=best_step,
            best_value=best_value,
            checkpoint_dir=str(self.ckpt_dir),
            best_checkpoint=str(best_path) if best_path is not None and best_path.exists() else None,
            examples_per_second=self.examples_per_second,
            warnings=tuple(self.history.warnings),
            final_metrics=dict(self.last_eval),
        )
        if self.ctx.is_main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            result.write(self.out_dir / RESULT_FILE)
        return result


def logged_losses(path: Path, up_to: int) -> list[tuple[int, float]]:
    """`(step, train/loss)` of every step up to `up_to` that `path` (a metrics.jsonl) logged, in
    step order; none when the file is missing."""
    try:
        handle = path.open("rb")
    except OSError:
        return []
    found: dict[int, float] = {}
    with handle:
        for line in handle:
            if TRAIN_LOSS.encode() not in line or not line.endswith(b"\n"):
                continue
            try:
                raw = json.loads(line)
                step, value = int(raw["step"]), float(raw["value"])
            except (ValueError, KeyError, TypeError):
                continue
            if raw.get("name") == TRAIN_LOSS and 1 <= step <= up_to:
                found[step] = value
    return sorted(found.items())


def _global_norm(grads: list[torch.Tensor]) -> float:
    """The L2 norm of all gradients together: one `torch._foreach_norm` (a norm per tensor), then
    the norm of those norms. On the CPU in Python (`math.hypot`, double precision): stacking and
    norming them as tensors cost 10 us more a step, a tenth of hpo's whole overhead on a 1 ms step
    (bench/trainer_overhead.py); on a GPU as tensors, so the step waits on one copy, not one per
    parameter. (`torch.nn.utils.get_total_norm` groups by device and dtype first, which costs more
    than a small model's step on the CPU.)"""
    if not grads:
        return 0.0
    norms = torch._foreach_norm(grads)
    if grads[0].device.type == "cpu":
        return math.hypot(*[float(n) for n in norms])
    return float(torch.linalg.vector_norm(torch.stack(norms)))


def _mean_loss(workload: Workload) -> Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]:
    """The batch mean of the workload's per-example loss; its own fused `mean_loss` where it has
    one (for cross-entropy, 20 us a step less than averaging the per-example losses)."""
    fused = getattr(workload, "mean_loss", None)
    if fused is not None:
        return cast(Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor], fused)

    def mean(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float) -> torch.Tensor:
        return workload.loss(logits, labels, label_smoothing).mean()

    return mean


class _Window:
    """Step times since the last log line: throughput and the share spent waiting for data."""

    def __init__(self) -> None:
        self.steps, self.data_seconds, self.total_seconds = 0, 0.0, 0.0

    def add(self, data_seconds: float, total_seconds: float) -> None:
        self.steps += 1
        self.data_seconds += data_seconds
        self.total_seconds += total_seconds

    def take(self, global_batch: int) -> dict[str, float]:
        total = max(self.total_seconds, 1e-9)
        values = {
            "train/examples_per_second": self.steps * global_batch / total,
            "train/data_wait_fraction": self.data_seconds / total,
        }
        self.steps, self.data_seconds, self.total_seconds = 0, 0.0, 0.0
        return values


def _rng_state(augment: torch.Generator, device: torch.device) -> dict[str, Any]:
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "augment": augment.get_state(),
        "numpy": _numpy_state(),
        "python": random.getstate(),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _numpy_state() -> list[Any]:
    # As tensors and numbers: checkpoints load with `weights_only=True`, which refuses numpy arrays.
    name, keys, position, has_gauss, cached = np.random.get_state(legacy=True)
    return [
        str(name),
        torch.from_numpy(np.asarray(keys).astype(np.int64)),
        int(position),
        int(has_gauss),
        float(cached),
    ]


def _set_rng_state(state: Mapping[str, Any], augment: torch.Generator, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    augment.set_state(state["augment"])
    name, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), position, has_gauss, cached))
    random.setstate(state["python"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
