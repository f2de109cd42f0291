"""`hpo train` and `hpo batch-size-sweep`: registers the subcommands; torch loads only when one of
them runs (this module imports only the standard library)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    train = subparsers.add_parser(
        "train",
        help="run one training run without a server (resumes from DIR's newest checkpoint)",
        description="Trains the config's workload; DIR receives metrics.jsonl, checkpoints/ and result.json. "
        "Run again on the same DIR to resume. SIGINT / SIGTERM checkpoint and stop.",
    )
    train.add_argument(
        "--config", required=True, metavar="FILE", help='JSON: {"params": {...}, "trainer": {...}, "seed": 0}'
    )
    train.add_argument(
        "--out", required=True, metavar="DIR", help="folder for metrics.jsonl, checkpoints/ and result.json"
    )
    train.add_argument("--nproc", type=int, default=1, help="DDP processes on this machine, gloo on CPU (default 1)")
    train.set_defaults(handler=_train)

    sweep = subparsers.add_parser(
        "batch-size-sweep",
        help="short runs at powers of two: the largest batch size that still buys throughput",
        description="Runs the config for a few steps at batch sizes 8, 16, 32, ... and reports examples per "
        "second, stopping when doubling the batch no longer buys enough throughput (playbook: choose the batch "
        "size for training speed, then retune the optimizer).",
    )
    sweep.add_argument("--config", required=True, metavar="FILE", help="a run config, as `hpo train` reads it")
    sweep.add_argument("--start", type=int, default=8, help="first batch size (default 8)")
    sweep.add_argument("--max-batch-size", type=int, default=65536, help="largest batch size tried (default 65536)")
    sweep.add_argument("--steps", type=int, default=20, help="steps per short run (default 20)")
    sweep.add_argument(
        "--min-gain",
        type=float,
        default=1.1,
        help="stop when doubling the batch grows throughput by less than this factor (default 1.1)",
    )
    sweep.add_argument("--nproc", type=int, default=1, help="DDP processes on this machine (default 1)")
    sweep.set_defaults(handler=_sweep)


def _read_config(path: str) -> dict[str, Any]:
    from hpo.cli import CliError

    try:
        raw = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise CliError(f"--config: no such file {path}") from None
    except json.JSONDecodeError as exc:
        raise CliError(f"--config: {path} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise CliError(f"--config: {path} must hold a JSON object")
    return raw


def _checked(config: dict[str, Any], nproc: int) -> None:
    from hpo.cli import CliError

    from .errors import ConfigError
    from .loop import check_config

    if nproc < 1:
        raise CliError(f"--nproc must be >= 1, got {nproc}")
    try:
        check_config(config, nproc)
    except ConfigError as exc:
        raise CliError(str(exc)) from None


def _train(args: argparse.Namespace) -> int:
    import signal

    from hpo.cli import CliError

    from . import reporters
    from .errors import ConfigError
    from .launch import run_local

    config = _read_config(args.config)
    _checked(config, args.nproc)
    try:
        result = run_local(config, Path(args.out), args.nproc)
    except ConfigError as exc:  # found only once the run starts (a checkpoint of another run)
        raise CliError(str(exc)) from None
    best = "" if result.best_step is None else f"; best {result.best_value:.6g} at step {result.best_step}"
    print(f"{result.status} at step {result.step}{best}")
    for warning in result.warnings:
        print(f"warning: {warning}")
    if result.reason and result.status != "completed":
        print(result.reason)
    print(f"metrics: {Path(args.out) / 'metrics.jsonl'}  checkpoints: {result.checkpoint_dir}")
    if result.status == "stopped" and reporters.last_stop_signal == signal.SIGINT:
        from hpo.cli import Interrupted

        raise Interrupted(f"checkpoint at step {result.step} kept in {args.out}; run the same command to resume")
    return 0 if result.status in ("completed", "stopped") else 1


def _sweep(args: argparse.Namespace) -> int:
    from hpo.cli import CliError

    from .launch import run_local
    from .sweep import SweepPoint, batch_size_sweep

    config = _read_config(args.config)
    if args.start < 1 or args.max_batch_size < args.start or args.steps < 2:
        raise CliError("need 1 <= --start <= --max-batch-size and --steps >= 2")
    _checked({**config, "params": {**config.get("params", {}), "batch_size": args.start * args.nproc}}, args.nproc)

    def show(point: SweepPoint) -> None:
        speed = "-" if point.examples_per_second is None else f"{point.examples_per_second:,.0f}"
        print(f"batch_size {point.batch_size:>7}  examples/s {speed:>12}  {point.status}", flush=True)

    result = batch_size_sweep(
        config,
        lambda run_config, out: run_local(run_config, out, args.nproc, console=False),
        start=args.start,
        max_batch_size=args.max_batch_size,
        steps=args.steps,
        min_gain=args.min_gain,
        on_point=show,
    )
    print(f"stopped: {result.stopped_because}")
    if result.best_batch_size is None:
        print("no batch size completed a run")
        return 1
    print(f"largest useful batch size: {result.best_batch_size}")
    return 0
