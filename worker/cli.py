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
        action="append",
        default=None,
        metavar="URL",
        help="the hpo server: host:port or a URL, with or without /api/v1 "
        "(default $HPO_SERVER_URL or http://127.0.0.1:8000). Several servers sharing one database: repeat it or "
        "separate URLs with commas; the worker spreads over them and fails over (docs/workers.md)",
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
        "--allow-env",
        action="append",
        default=[],
        metavar="GLOB",
        help="studies may also set these trainer.env names (e.g. 'WANDB_*'; repeatable; adds to $HPO_ALLOWED_ENV). "
        "default: only the short list in docs/security.md; names the worker sets (devices, threads, ranks) never",
    )
    parser.add_argument(
        "--run-as",
        default=None,
        metavar="USER|FIRST-LAST",
        help="run trial processes as one uid of this range per running trial (e.g. 20000-20063), or as this user "
        "with one trial at a time, so a trial cannot read the worker's token or touch other trials (the worker "
        "must run as root; docs/security.md; default: the worker's own user, which root refuses without --unconfined)",
    )
    parser.add_argument(
        "--unconfined",
        action="store_true",
        help="let a root worker run trials as root, without --run-as: their code can then read this node's files, "
        "the worker's token and Ray's credentials (only for a machine and code you trust; docs/security.md)",
    )
    parser.add_argument(
        "--max-trial-processes",
        type=int,
        default=4096,
        help="processes and threads one trial process may run at once, its children included (default 4096; a "
        "study's resources.max_processes asks for less)",
    )
    parser.add_argument(
        "--min-free-gb",
        type=float,
        default=1.0,
        help="claim nothing while the artifact root has less free space than this, or cannot be written "
        "(default 1; docs/workers.md, 'Worker health')",
    )
    parser.add_argument(
        "--max-trial-memory-gb",
        type=float,
        default=None,
        help="memory one trial process may use, its children included (default: not limited by hpo; a study's "
        "resources.memory_gb asks for less; needs a cgroup on the node, docs/security.md)",
    )
    parser.add_argument(
        "--pass-env",
        action="append",
        default=[],
        metavar="GLOB",
        help="also give trial processes these variables of the worker's environment (e.g. NCCL_SOCKET_IFNAME, "
        "'HF_*'; repeatable; default: none beyond the locale, PATH, library paths, devices and thread counts)",
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

    _reexec_without_secrets()
    import os

    entries = args.server or [os.environ.get("HPO_SERVER_URL", "")]
    given: list[str | None] = [url for entry in entries for url in entry.split(",") if url.strip()] or [None]
    try:
        servers = list(dict.fromkeys(server_url(url) for url in given))
        silent = [url for url in servers if not probe(url)]
    except ServerUrlError as exc:
        raise CliError(str(exc)) from None
    args.server = ",".join(servers)
    from .console import TrialLines, quiet_logging

    quiet_logging(args.verbose, args.log_level)
    for url in silent:
        logging.getLogger("hpo.worker").warning("no hpo server answers at %s yet; retrying until one does", url)
    options = _worker_options(args)
    if args.ray_address:
        from .ray_errors import join_ray

        join_ray(args.ray_address, log_to_driver=options.log_to_driver)
    from .loop import Worker  # imports Ray, which sets up its loggers: quiet them after

    quiet_logging(args.verbose, args.log_level)
    _scrub_secrets()
    _warn_about_exposure(options)
    worker = Worker(options, lines=TrialLines())
    status = worker.run()
    if worker.stopped_by_signal == signal.SIGINT:
        raise Interrupted(
            "running trials were checkpointed and given back (preempted); the next worker resumes them from "
            "their newest checkpoint"
        )
    return status


# Never in the worker's environment once it runs: /proc/<pid>/environ shows a process's environment
# as it was started, whatever it removes later, so `hpo worker` re-executes itself without them,
# handing the token over through a pipe (docs/security.md).
SECRET_VARIABLES = ("HPO_API_TOKEN", "HPO_SESSION_SECRET", "HPO_DATABASE_URL")
TOKEN_FD_VARIABLE = "HPO_WORKER_TOKEN_FD"


def _reexec_without_secrets() -> None:
    """Starts this command again, same pid, without SECRET_VARIABLES in its environment; the token
    travels through an inherited pipe that `_token_from_pipe` reads and closes. Linux only (the
    /proc exposure is Linux's); elsewhere the variables are only removed from os.environ."""
    import sys

    present = [name for name in SECRET_VARIABLES if name in os.environ]
    if not present or not sys.platform.startswith("linux") or not getattr(sys, "orig_argv", None):
        _scrub_secrets()
        return
    token = os.environ.get("HPO_API_TOKEN", "").encode()
    read_end, write_end = os.pipe()
    os.write(write_end, token)  # a token is far below a pipe's buffer: this never blocks
    os.close(write_end)
    os.set_inheritable(read_end, True)
    env = {k: v for k, v in os.environ.items() if k not in SECRET_VARIABLES}
    env[TOKEN_FD_VARIABLE] = str(read_end)
    os.execve(sys.executable, sys.orig_argv, env)


def _token_from_pipe() -> str | None:
    """The token `_reexec_without_secrets` handed over, read once; the pipe is closed after."""
    fd = os.environ.pop(TOKEN_FD_VARIABLE, None)
    if fd is None or not fd.isdigit():
        return None
    chunks = []
    try:
        while chunk := os.read(int(fd), 65536):
            chunks.append(chunk)
        os.close(int(fd))
    except OSError:
        return None
    return b"".join(chunks).decode().strip() or None


def _scrub_secrets() -> None:
    for name in SECRET_VARIABLES:
        os.environ.pop(name, None)


def _worker_options(args: argparse.Namespace) -> Any:
    import logging
    from pathlib import Path

    from hpo.cli import CliError
    from hpo.lifetime import make_undumpable
    from hpo.policy import PolicyError
    from hpo.settings import Settings, SettingsError

    from .confine import RunAs
    from .containment import Limits
    from .loop import WorkerOptions, confinement_refusal, default_worker_id

    try:
        settings = Settings.from_env()
        policy = settings.execution_policy.merged(args.allow_workload, args.allow_command, args.allow_env)
    except (SettingsError, PolicyError) as exc:
        raise CliError(str(exc)) from None
    run_as = None
    if args.run_as:
        try:
            run_as = RunAs.parse(args.run_as)
        except ValueError as exc:
            raise CliError(str(exc)) from None
        if os.geteuid() != 0:
            raise CliError("--run-as needs the worker to run as root (it starts trial processes as another user)")
        if run_as.first == run_as.last and args.max_trials is None:
            args.max_trials = 1  # one user: one running trial at a time (docs/security.md)
    if not args.min_free_gb >= 0:
        raise CliError(f"--min-free-gb must be >= 0, got {args.min_free_gb}")
    if args.max_trial_processes < 1:
        raise CliError(f"--max-trial-processes must be >= 1, got {args.max_trial_processes}")
    if args.max_trial_memory_gb is not None and not args.max_trial_memory_gb > 0:
        raise CliError(f"--max-trial-memory-gb must be > 0, got {args.max_trial_memory_gb}")
    for name in ("num_cpus", "num_gpus", "max_trials"):
        value = getattr(args, name)
        if value is not None and value < (1 if name == "max_trials" else 0):
            raise CliError(f"--{name.replace('_', '-')} must be >= {1 if name == 'max_trials' else 0}, got {value}")
    token = _token_from_pipe() or settings.api_token
    # From here on this process holds the token: keep its memory and environment from other
    # processes of its user (a trial's, without --run-as).
    make_undumpable()
    if args.token_file:
        try:
            token = Path(args.token_file).read_text().strip() or None
            if Path(args.token_file).stat().st_mode & 0o077:
                logging.getLogger("hpo.worker").warning(
                    "--token-file %s is readable by other users: chmod 600 it", args.token_file
                )
        except OSError as exc:
            raise CliError(f"--token-file: {exc}") from None
    if args.workdir_root and not Path(args.workdir_root).is_dir():
        raise CliError(f"--workdir-root {args.workdir_root} is not a directory")
    memory = int(args.max_trial_memory_gb * 2**30) if args.max_trial_memory_gb else None
    options = WorkerOptions(
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
        run_as=run_as,
        pass_env=tuple(args.pass_env),
        log_to_driver=bool(getattr(args, "verbose", False)),  # the trials' own output only with -v
        unconfined=args.unconfined,
        limits=Limits(args.max_trial_processes, memory),
        min_free_bytes=int(args.min_free_gb * 2**30),
    )
    refusal = confinement_refusal(options)
    if refusal is not None:
        raise CliError(refusal)
    return options


def _warn_about_exposure(options: Any) -> None:
    """Says at start what a trial's code could read on this node, where that is more than its own
    trial (docs/security.md, "What a trial's code can reach")."""
    import logging

    log = logging.getLogger("hpo.worker")
    if options.run_as is None and os.geteuid() == 0:
        log.warning(
            "--unconfined: trials run as root: their code can read this node's files and processes, the worker's "
            "token included; give them users of their own with --run-as FIRST-LAST (docs/security.md)"
        )


def _run_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(args)
