"""The one `hpo` command. Each part registers its own subcommands and imports its heavy modules
lazily inside the handlers, so `hpo server` loads neither torch nor Ray."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

# Each part's cli module exposes `register(subparsers)`; the modules themselves import only argparse.
_PARTS = ("hpo.server.cli", "hpo.server.token_cli", "hpo.trainer.cli", "hpo.worker.cli", "hpo.study_cli")


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 2, no traceback."""


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(prog="hpo", description=__doc__)
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result = args.handler(args)
    except CliError as exc:
        print(f"hpo {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return int(result or 0)


if __name__ == "__main__":
    # Run as `python -m hpo.cli`, this file is `__main__`, a second copy of the module: the
    # subcommands raise `hpo.cli.CliError`, so dispatch through the imported module.
    from hpo.cli import main as _package_main

    raise SystemExit(_package_main())
