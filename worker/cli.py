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
        default=None,
        metavar="URL",
        help="the hpo server: host:port or a URL, with or without /api/v1 "
        "(default $HPO_SERVER_URL or http://127.0.0.1:8000)",
    )
    parser.add_argument(
        "--ray-address",
        default=None,
        help="join this running Ray cluster (host:port of its head, or 'auto' for the one `ray start` began on this "
        "node); default: start a local Ray instance (docs/workers.md)",
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
        "--drain-seconds",
        type=float,
        default=120.0,
        help="on SIGTERM or Ctrl-C, how long runs get to checkpoint and stop (default 120)",
    )
    parser.add_argument(
        "--trainer",
        default="hpo.trainer:train",
        metavar="MODULE:FUNCTION",
        help="training function with hpo.trainer's contract, importable on every node (default hpo.trainer:train)",
    )
    parser.add_argument(
        "--no-warm-up", action="store_true", help="do not pre-start Ray worker processes (default: pre-start them)"
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=("critical", "error", "warning", "info", "debug"),
        help="log level (default info)",
    )
    parser.add_argument(
        "--token-file",
        default=None,
        metavar="FILE",
        help="read the worker's token from FILE (default $HPO_API_TOKEN); "
        "a worker token: hpo token create --role worker",
    )
    parser.add_argument(
        "--allow-workload",
        action="append",
        default=[],
        metavar="GLOB",
        help="also run user workloads whose module matches GLOB (e.g. 'mylab.*'; repeatable; adds to "
        "$HPO_ALLOWED_WORKLOADS; default none). Built-in workloads always run; anything else fails as `config`",
    )
    parser.add_argument(
        "--allow-command",
        action="append",
        default=[],
        metavar="PREFIX",
        help="also run trainer commands whose argv starts with PREFIX (shell-quoted, e.g. "
        "'/opt/venv/bin/python /srv/train.py'; repeatable; adds to $HPO_ALLOWED_COMMANDS; default none)",
    )
    parser.add_argument(
        "--workdir-root",
        default=os.environ.get("HPO_WORKDIR_ROOT"),
        help="folder that trainer.workdir is relative to; commands run there (default $HPO_WORKDIR_ROOT or the "
        "current directory)",
    )
    parser.add_argument(
        "--stop-grace-seconds",
        type=float,
        default=30.0,
        help="how long a stopped trainer.command gets to checkpoint and exit before SIGKILL (default 30)",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log everything (HTTP requests, Ray, the trials' own output)"
    )
    parser.set_defaults(handler=_run_worker)


def _register_demo(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "demo",
        help="run a whole example study end to end: server (SQLite), local Ray worker, real trainer",
        description="Starts a server on SQLite in --workdir, a worker on a local Ray instance, creates the "
        "example study (2 optimizers x 8 trials of 500 steps on synthetic_mlp) and runs it to the end with a "
        "progress bar (about a minute on 2 cores), then prints the best trial per arm, the analysis warnings "
        "and where to look next. Ctrl-C stops it; what finished stays in --workdir.",
    )
    parser.add_argument(
        "--workdir", default=".hpo-demo", help="folder for the SQLite database and artifacts (default ./.hpo-demo)"
    )
    parser.add_argument("--port", type=int, default=0, help="server port (default: a free one)")
    parser.add_argument("--spec", default=None, help="study spec JSON (default examples/demo-study.json)")
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs for the local Ray instance (default: all)")
    parser.set_defaults(handler=_run_demo)


def _run_worker(args: argparse.Namespace) -> int:
    import logging
    import signal

    from hpo.cli import CliError, Interrupted
    from hpo.server_url import ServerUrlError, probe, server_url

    try:
        args.server = server_url(args.server)
        reachable = probe(args.server)
    except ServerUrlError as exc:
        raise CliError(str(exc)) from None
    from .console import TrialLines, quiet_logging

    quiet_logging(args.verbose, args.log_level)
    if not reachable:
        logging.getLogger("hpo.worker").warning("no hpo server answers at %s yet; retrying until one does", args.server)
    options = _worker_options(args)
    if args.ray_address:
        from .ray_errors import join_ray

        join_ray(args.ray_address, log_to_driver=options.log_to_driver)
    from .loop import Worker  # imports Ray, which sets up its loggers: quiet them after

    quiet_logging(args.verbose, args.log_level)
    _scrub_secrets()
    worker = Worker(options, lines=TrialLines())
    status = worker.run()
    if worker.stopped_by_signal == signal.SIGINT:
        raise Interrupted(
            "running trials were checkpointed and given back (preempted); the next worker resumes them from "
            "their newest checkpoint"
        )
    return status


# Read into the options above, then removed from this process's environment before Ray starts:
# Ray's worker processes, and so every trial's code, inherit it (docs/security.md).
SECRET_VARIABLES = ("HPO_API_TOKEN", "HPO_SESSION_SECRET", "HPO_DATABASE_URL")


def _scrub_secrets() -> None:
    for name in SECRET_VARIABLES:
        os.environ.pop(name, None)


def _worker_options(args: argparse.Namespace) -> Any:
    from pathlib import Path

    from hpo.cli import CliError
    from hpo.policy import PolicyError
    from hpo.settings import Settings, SettingsError

    from .loop import WorkerOptions, default_worker_id

    try:
        settings = Settings.from_env()
        policy = settings.execution_policy.merged(args.allow_workload, args.allow_command)
    except (SettingsError, PolicyError) as exc:
        raise CliError(str(exc)) from None
    for name in ("num_cpus", "num_gpus", "max_trials"):
        value = getattr(args, name)
        if value is not None and value < (1 if name == "max_trials" else 0):
            raise CliError(f"--{name.replace('_', '-')} must be >= {1 if name == 'max_trials' else 0}, got {value}")
    token = settings.api_token
    if args.token_file:
        try:
            token = Path(args.token_file).read_text().strip() or None
        except OSError as exc:
            raise CliError(f"--token-file: {exc}") from None
    if args.workdir_root and not Path(args.workdir_root).is_dir():
        raise CliError(f"--workdir-root {args.workdir_root} is not a directory")
    return WorkerOptions(
        server_url=args.server,
        artifact_root=Path(args.artifact_root or settings.artifact_root),
        token=token,
        ray_address=args.ray_address,
        num_cpus=args.num_cpus,
        num_gpus=args.num_gpus,
        worker_id=args.worker_id or default_worker_id(),
        max_trials=args.max_trials,
        drain_seconds=args.drain_seconds,
        exit_when_idle_seconds=args.exit_when_idle,
        warm_up=not args.no_warm_up,
        trainer=args.trainer,
        policy=policy,
        workdir_root=Path(args.workdir_root) if args.workdir_root else None,
        stop_grace_seconds=args.stop_grace_seconds,
        log_to_driver=bool(getattr(args, "verbose", False)),  # the trials' own output only with -v
    )


def _run_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(args)
