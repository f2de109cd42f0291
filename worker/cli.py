"""`hpo worker` and `hpo demo`: registers the subcommands; Ray, torch and the server load only when
one of them runs (this module imports only the standard library)."""

from __future__ import annotations

import argparse
import os
from typing import Any


def register(subparsers: Any) -> None:
    _register_worker(subparsers)
    _register_demo(subparsers)


def _register_worker(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "worker",
        help="run trials from a server on a Ray cluster (a local Ray instance by default)",
        description="Claims trials that fit the Ray cluster's free resources and runs them: one process as a "
        "Ray task, several with Ray Train (DDP). SIGTERM checkpoints and gives the trials back, then exits.",
    )
    parser.add_argument(
        "--server",
        default=os.environ.get("HPO_SERVER_URL"),
        help="server URL, e.g. http://127.0.0.1:8000 (default $HPO_SERVER_URL)",
    )
    parser.add_argument(
        "--ray-address",
        default=None,
        help="join this Ray cluster (host:port, or 'auto' for one on this node); default: start a local Ray instance",
    )
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray instance (default: all)")
    parser.add_argument("--num-gpus", type=int, default=None, help="GPUs of the local Ray instance (default: all)")
    parser.add_argument("--max-trials", type=int, default=None, help="at most this many trials at once")
    parser.add_argument("--worker-id", default=None, help="name in the server's records (default host-pid)")
    parser.add_argument(
        "--artifact-root",
        default=None,
        help="where trials write (default $HPO_ARTIFACT_ROOT or ./artifacts; shared storage for several nodes)",
    )
    parser.add_argument(
        "--exit-when-idle",
        type=float,
        default=None,
        metavar="SECONDS",
        help="exit after this long with nothing to run (default: keep polling)",
    )
    parser.add_argument(
        "--drain-seconds", type=float, default=120.0, help="on SIGTERM, how long runs get to checkpoint and stop"
    )
    parser.add_argument(
        "--trainer",
        default="hpo.trainer:train",
        metavar="MODULE:FUNCTION",
        help="training function with hpo.trainer's contract, importable on every node",
    )
    parser.add_argument("--no-warm-up", action="store_true", help="do not pre-start Ray worker processes")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log everything (HTTP requests, Ray, the trials' own output)"
    )
    parser.add_argument("--log-level", default="info", help="the level of -v's logs (default info)")
    parser.set_defaults(handler=_run_worker)


def _register_demo(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "demo",
        help="run a whole example study end to end: server (SQLite), local Ray worker, real trainer",
    )
    parser.add_argument(
        "--workdir", default=".hpo-demo", help="folder for the SQLite database and artifacts (default ./.hpo-demo)"
    )
    parser.add_argument("--port", type=int, default=0, help="server port (default: a free one)")
    parser.add_argument("--spec", default=None, help="study spec JSON (default examples/demo-study.json)")
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs for the local Ray instance (default: all)")
    parser.set_defaults(handler=_run_demo)


def _run_worker(args: argparse.Namespace) -> int:
    from hpo.cli import CliError

    if not args.server:
        raise CliError("--server URL is required (or set HPO_SERVER_URL)")
    from .console import TrialLines, quiet_logging
    from .loop import Worker  # imports Ray, which sets up its loggers: quiet them after

    quiet_logging(args.verbose, args.log_level)

    return Worker(_worker_options(args), lines=TrialLines()).run()


def _worker_options(args: argparse.Namespace) -> Any:
    from pathlib import Path

    from hpo.cli import CliError
    from hpo.settings import Settings, SettingsError

    from .loop import WorkerOptions, default_worker_id

    try:
        settings = Settings.from_env()
    except SettingsError as exc:
        raise CliError(str(exc)) from None
    for name in ("num_cpus", "num_gpus", "max_trials"):
        value = getattr(args, name)
        if value is not None and value < (1 if name == "max_trials" else 0):
            raise CliError(f"--{name.replace('_', '-')} must be >= {1 if name == 'max_trials' else 0}, got {value}")
    return WorkerOptions(
        server_url=args.server,
        artifact_root=Path(args.artifact_root or settings.artifact_root),
        token=settings.api_token,
        ray_address=args.ray_address,
        num_cpus=args.num_cpus,
        num_gpus=args.num_gpus,
        worker_id=args.worker_id or default_worker_id(),
        max_trials=args.max_trials,
        drain_seconds=args.drain_seconds,
        exit_when_idle_seconds=args.exit_when_idle,
        warm_up=not args.no_warm_up,
        trainer=args.trainer,
        log_to_driver=bool(getattr(args, "verbose", False)),  # the trials' own output only with -v
    )


def _run_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(args)

