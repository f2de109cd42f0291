"""The one `hpo` command. Each part registers its own subcommands and imports its heavy modules
lazily inside the handlers, so `hpo server` loads neither torch nor Ray."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

# What `hpo --help` says first; the module docstring above is for the project's developers.
DESCRIPTION = """\
hpo runs hyperparameter studies the way the Deep Learning Tuning Playbook describes them: you write
down one round of tuning (scientific, nuisance and fixed hyperparameters, an objective), the server
lays out quasi-random trials, Ray workers train them with PyTorch (DDP across processes and nodes),
and the server analyzes the results (best trial per arm, boundary and curve checks).

Start with `hpo demo` (a whole study on this machine in about a minute), then `hpo server`,
`hpo worker` and `hpo study create -f spec.json`. Docs: docs/ in the repository (cli.md, spec.md)."""

# Each part's cli module exposes `register(subparsers)`; the modules themselves import only argparse.
_PARTS = (
    "hpo.server.cli",
    "hpo.server.token_cli",
    "hpo.trainer.cli",
    "hpo.worker.cli",
    "hpo.study_cli",
    "hpo.trial_cli",
    "hpo.round_cli",
)


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 2, no traceback."""


class Interrupted(Exception):
    """Ctrl-C (SIGINT) ended a command that already said what it kept: exit status 130."""


def command_name() -> str:
    """How a person on this machine runs this installation of hpo: `hpo` when that is on PATH and is
    this installation, else the path of its script (`.venv/bin/hpo` from the repository)."""
    import shutil
    from pathlib import Path

    script = Path(sys.executable).parent / "hpo"
    found = shutil.which("hpo")
    if not script.exists() or (found and Path(found).resolve() == script.resolve()):
        return "hpo"
    try:
        return str(script.relative_to(Path.cwd()))
    except ValueError:
        return str(script)


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(
        prog="hpo", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in _PARTS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        module.register(subparsers)
    return parser


def _stdout_reader_gone() -> bool:
    """Whether stdout's reader closed it, as opposed to a broken pipe or socket elsewhere (the
    server's connection), which must not pass for success. A pipe or socket whose reader went away
    polls as POLLERR (POLLHUP for sockets)."""
    import select

    if not hasattr(select, "poll"):
        return True
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), 0)
        events = poller.poll(0)
    except (OSError, ValueError):
        return False
    return any(mask & (select.POLLERR | select.POLLHUP) for _, mask in events)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result = args.handler(args)
        # Output to a pipe is block-buffered: flush here, where a closed pipe can still be caught.
        sys.stdout.flush()
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise
        # The reader (`| head`) has what it wanted; as the Python docs' "Note on SIGPIPE" advises,
        # point stdout at devnull so the interpreter's own flush at exit cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except CliError as exc:
        print(f"hpo {args.command}: {exc}", file=sys.stderr)
        return 2
    except Interrupted as exc:
        print(f"hpo {args.command}: interrupted; {exc}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        # 128 + SIGINT, as shells report it; nothing was half-written (the service's writes are transactions).
        print(f"hpo {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":
    # Run as `python -m hpo.cli`, this file is `__main__`, a second copy of the module: the
    # subcommands raise `hpo.cli.CliError`, so dispatch through the imported module.
    from hpo.cli import main as _package_main

    raise SystemExit(_package_main())
