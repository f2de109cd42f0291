"""`hpo trial show|cancel|replicas|retry`: one trial on an hpo server (an HTTP client, standard library
only; the server and token come as for `hpo study`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from hpo.cli import CliError
from hpo.client import add_server_option, json_flag, request
from hpo.tables import num


def register(subparsers: Any) -> None:
    """Adds `hpo trial` and its subcommands."""
    trial = subparsers.add_parser(
        "trial",
        help="show, cancel, replicate or retry one trial on an hpo server",
        description="One trial: its params, status, objective and failure; cancel it; rerun it with new seeds; "
        "run it again after a failure.",
    )
    commands = trial.add_subparsers(dest="trial_command", required=True, metavar="COMMAND")

    show = _command(commands, "show", "show a trial: arm, params, status, objective, failure", _show)
    json_flag(show, "print the trial resource as JSON")

    cancel = _command(
        commands, "cancel", "cancel a pending or running trial (a running one stops at its next heartbeat)", _cancel
    )
    json_flag(cancel, "print the trial resource as JSON")

    replicas = _command(
        commands,
        "replicas",
        "rerun a trial with the same params and new training seeds, to measure trial variance",
        _replicas,
    )
    replicas.add_argument("--count", type=int, default=1, help="how many replicas to add, 1 to 100 (default 1)")
    json_flag(replicas, "print the new trial ids as JSON")

    retry = _command(
        commands,
        "retry",
        "run a failed trial again as a new trial (same params and seed), e.g. once the operator allowed its command",
        _retry,
    )
    json_flag(retry, "print the new trial's id as JSON")


def _command(commands: Any, name: str, help_text: str, handler: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(name, help=help_text, description=help_text)
    parser.add_argument("trial_id", type=int, help="the trial's id")
    add_server_option(parser)
    parser.set_defaults(handler=handler)
    return parser


def _show(args: argparse.Namespace) -> int:
    trial = request(args, "GET", f"/api/v1/trials/{args.trial_id}")
    if args.json:
        print(json.dumps(trial, indent=2))
        return 0
    print(_summary(trial))
    return 0


def _summary(trial: dict[str, Any]) -> str:
    arm = ", ".join(f"{k}={v}" for k, v in trial["arm"].items()) or "-"
    lines = [
        f"trial {trial['id']} (study {trial['study_id']}, number {trial['number']}) [{trial['status']}]",
        f"  arm: {arm}; seed {trial['seed']}; attempt {trial['attempt']}"
        + (f"; replica of trial {trial['replica_of']}" if trial.get("replica_of") is not None else ""),
        "  params: " + ", ".join(f"{k}={num(v)}" for k, v in trial["params"].items()),
    ]
    if trial.get("objective_value") is not None:
        lines.append(f"  objective: {num(trial['objective_value'])} at step {trial['best_step']}")
    if trial.get("error"):
        step = f" at step {trial['error_step']}" if trial.get("error_step") is not None else ""
        lines.append(f"  {trial.get('fail_kind') or 'error'}{step}: {trial['error']}")
    if trial.get("worker_id"):
        lines.append(f"  worker: {trial['worker_id']}")
    lines.extend(f"  warning ({w['kind']}): {w['message']}" for w in trial.get("warnings") or [])
    return "\n".join(lines)


def _cancel(args: argparse.Namespace) -> int:
    trial = request(args, "POST", f"/api/v1/trials/{args.trial_id}/cancel")
    if args.json:
        print(json.dumps(trial, indent=2))
        return 0
    print(f"trial {trial['id']} is now {trial['status']}")
    return 0


def _retry(args: argparse.Namespace) -> int:
    answer = request(args, "POST", f"/api/v1/trials/{args.trial_id}/retry")
    if args.json:
        print(json.dumps(answer, indent=2))
        return 0
    print(f"trial {args.trial_id} queued again as trial {', '.join(map(str, answer['trial_ids']))}")
    return 0


def _replicas(args: argparse.Namespace) -> int:

    if not 1 <= args.count <= 100:
        raise CliError(f"--count must be between 1 and 100, got {args.count}")
    answer = request(args, "POST", f"/api/v1/trials/{args.trial_id}/replicas", {"count": args.count})
    if args.json:
        print(json.dumps(answer, indent=2))
        return 0
    ids = answer["trial_ids"]
    print(f"{len(ids)} replica(s) of trial {args.trial_id} queued: trial(s) {', '.join(map(str, ids))}")
    return 0
