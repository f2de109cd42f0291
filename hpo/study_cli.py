"""`hpo study create|list|show|watch|analyze|pause|resume|archive|grow`: a small HTTP client of
the study service.

The server comes from `--server` or `HPO_SERVER_URL` (default http://127.0.0.1:8000; `host:port`
and URLs with or without `/api/v1` are accepted), the token from `HPO_API_TOKEN`. Only the standard
library is imported, so the command starts instantly."""

from __future__ import annotations

import argparse
import json
from typing import Any

from hpo.cli import CliError
from hpo.client import add_server_option, json_flag, read_spec, request
from hpo.server_url import DEFAULT_SERVER
from hpo.tables import num, progress_line, render_table
from hpo.watch import watch


def register(subparsers: Any) -> None:
    """Adds `hpo study` and its subcommands."""
    study = subparsers.add_parser(
        "study",
        help="create, list, show, watch, analyze, pause, resume, archive and grow studies on an hpo server",
        description="An HTTP client of the study service. Every subcommand takes --server (default "
        f"$HPO_SERVER_URL or {DEFAULT_SERVER}) and reads the token from $HPO_API_TOKEN.",
    )
    commands = study.add_subparsers(dest="study_command", required=True, metavar="COMMAND")

    create = _command(commands, "create", "create a study from a JSON spec file (docs/spec.md)", _create)
    create.add_argument("-f", "--file", required=True, help="the study spec (JSON); - reads standard input")
    create.add_argument("--name", help="override the spec's name, e.g. to rerun a study (default: the spec's)")
    json_flag(create, "print the created study, with its warnings, as JSON")

    listing = _command(commands, "list", "list studies, newest first: status, progress, best value", _list)
    listing.add_argument(
        "--status",
        choices=("active", "paused", "archived", "completed"),
        default=None,
        help="only studies with this status (default: all)",
    )
    listing.add_argument("--limit", type=int, default=100, help="at most this many studies (default 100)")
    json_flag(listing, "print the page of studies as JSON")

    show = _command(commands, "show", "show a study: status, progress, best trial, last failure", _show)
    show.add_argument("study_id", type=int, help="the study's id")
    show.add_argument("--spec", action="store_true", help="print only the study's spec as JSON")
    json_flag(show, "print the study resource as JSON")

    watch = _command(commands, "watch", "follow a study's progress until its trials have finished", _watch)
    watch.add_argument("study_id", type=int, help="the study's id")
    watch.add_argument("--interval", type=float, default=2.0, help="seconds between polls (default 2)")
    watch.add_argument("--timeout", type=float, default=None, help="give up after this many seconds (default: never)")

    analyze = _command(commands, "analyze", "the playbook's checklist: warnings and the best trial per arm", _analyze)
    analyze.add_argument("study_id", type=int, help="the study's id")
    json_flag(analyze, "print the whole analysis as JSON")

    for name, status, what in (
        ("pause", "paused", "pause a study: no new trials are claimed; running ones stop at their next heartbeat"),
        ("resume", "active", "resume a paused study (also clears its run of failed trials)"),
        ("archive", "archived", "archive a study: kept and readable, never run again"),
    ):
        command = _command(commands, name, what, _set_status)
        command.add_argument("study_id", type=int, help="the study's id")
        command.set_defaults(new_status=status)
        json_flag(command, "print the study resource as JSON")

    grow = _command(commands, "grow", "raise num_trials (per arm), continuing the quasi-random sequence", _grow)
    grow.add_argument("study_id", type=int, help="the study's id")
    grow.add_argument(
        "--num-trials", type=int, required=True, help="the new number of trials PER ARM (must be above the current)"
    )
    json_flag(grow, "print the study resource as JSON")

    retry = _command(
        commands,
        "retry",
        "run the study's failed trials again as new trials (same params and seeds) and resume it if it paused "
        "itself over them; e.g. once the operator allowed a command",
        _retry,
    )
    retry.add_argument("study_id", type=int, help="the study's id")
    retry.add_argument(
        "--kind",
        choices=("config", "error"),
        default=None,
        help="only failures of this kind (default: all)",
    )
    json_flag(retry, "print the new trial ids as JSON")


def _command(commands: Any, name: str, help_text: str, handler: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(name, help=help_text, description=help_text)
    add_server_option(parser)
    parser.set_defaults(handler=handler)
    return parser


# --- commands ----------------------------------------------------------------------------------


def _create(args: argparse.Namespace) -> int:
    spec = read_spec(args.file)
    if args.name:
        spec["name"] = args.name
    study = request(args, "POST", "/api/v1/studies", spec)
    if args.json:
        print(json.dumps(study, indent=2))
        return 0
    total = sum(study["trial_counts"].values())
    print(f"created study {study['id']} {study['name']!r}: {total} trials laid out")
    for w in study.get("warnings") or []:
        print(f"  warning [{w['kind']}] {w['message']}")
    return 0


def _show(args: argparse.Namespace) -> int:
    study = request(args, "GET", f"/api/v1/studies/{args.study_id}")
    if args.spec or args.json:
        print(json.dumps(study["spec"] if args.spec else study, indent=2))
        return 0
    counts = study["trial_counts"]
    print(f"study {study['id']} {study['name']!r} [{study['status']}]")
    if study.get("status_reason"):
        print(f"  {study['status_reason']}")
    if study.get("description"):
        print(f"  {study['description']}")
    objective = study["objective"]
    print(
        f"  objective: {objective['mode']} {objective['metric']}; algorithm {study['algorithm']}, seed {study['seed']}"
    )
    print("  " + progress_line(counts, width=30))
    print("  trials: " + ", ".join(f"{k} {v}" for k, v in counts.items() if v))
    if study.get("best_trial_id") is not None:
        print(f"  best: trial {study['best_trial_id']} with {objective['metric']} = {num(study.get('best_value'))}")
    if counts.get("failed"):
        _print_last_failure(args, study)
    return 0


def _print_last_failure(args: argparse.Namespace, study: dict[str, Any]) -> None:
    """A study that paused itself after failed trials says why (the newest failure's reason)."""
    page = request(args, "GET", f"/api/v1/studies/{study['id']}/trials", params="?status=failed&limit=1000")
    failed = [t for t in page["items"] if t["status"] == "failed"]
    if not failed:
        return
    last = max(failed, key=lambda t: t["id"])
    print(f"  last failure: trial {last['id']} [{last.get('fail_kind') or 'error'}] {last.get('error') or ''}".rstrip())
    if study["status"] == "paused":
        print(f"  fix the cause, then `hpo study retry {study['id']}` (or `hpo study resume {study['id']}`)")


def _retry(args: argparse.Namespace) -> int:
    body = {"kind": args.kind} if args.kind else {}
    answer = request(args, "POST", f"/api/v1/studies/{args.study_id}/retry", body)
    if args.json:
        print(json.dumps(answer, indent=2))
        return 0
    ids = answer["trial_ids"]
    print(
        f"{len(ids)} failed trial(s) of study {args.study_id} queued again"
        + (f": {', '.join(map(str, ids))}" if ids else "")
    )
    return 0


def _list(args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise CliError(f"--limit must be >= 1, got {args.limit}")
    query = f"?limit={min(args.limit, 1000)}" + (f"&status={args.status}" if args.status else "")
    page = request(args, "GET", "/api/v1/studies", params=query)
    if args.json:
        print(json.dumps(page, indent=2))
        return 0
    if not page["items"]:
        which = f" with status {args.status}" if args.status else ""
        print(f"no studies{which}; create one with `hpo study create -f spec.json`")
        return 0
    rows = [
        [
            str(s["id"]),
            s["name"],
            s["status"],
            progress_line(s["trial_counts"], width=10),
            f"{s['objective']['mode']} {s['objective']['metric']}",
            num(s.get("best_value")),
        ]
        for s in page["items"]
    ]
    print(render_table(rows, ("id", "name", "status", "progress", "objective", "best")))
    if page["total"] > len(page["items"]):
        print(f"({len(page['items'])} of {page['total']}; raise --limit for more)")
    return 0


def _set_status(args: argparse.Namespace) -> int:
    study = request(args, "PATCH", f"/api/v1/studies/{args.study_id}", {"status": args.new_status})
    if args.json:
        print(json.dumps(study, indent=2))
        return 0
    print(f"study {study['id']} {study['name']!r} is now {study['status']}: {progress_line(study['trial_counts'])}")
    return 0


def _grow(args: argparse.Namespace) -> int:
    before = request(args, "GET", f"/api/v1/studies/{args.study_id}")
    study = request(args, "PATCH", f"/api/v1/studies/{args.study_id}", {"num_trials": args.num_trials})
    if args.json:
        print(json.dumps(study, indent=2))
        return 0
    added = sum(study["trial_counts"].values()) - sum(before["trial_counts"].values())
    print(
        f"study {study['id']} {study['name']!r}: num_trials {before['num_trials']} -> {study['num_trials']} per arm, "
        f"{added} trials added"
    )
    return 0


def _watch(args: argparse.Namespace) -> int:
    """See hpo/watch.py (rich, imported only when watching)."""
    return watch(args)


def _analyze(args: argparse.Namespace) -> int:
    analysis = request(args, "GET", f"/api/v1/studies/{args.study_id}/analysis")
    if args.json:
        print(json.dumps(analysis, indent=2))
        return 0
    objective = analysis["objective"]
    print(f"analysis of study {analysis['study_id']} {analysis['name']!r} ({objective['mode']} {objective['metric']})")
    study = request(args, "GET", f"/api/v1/studies/{args.study_id}")
    if study.get("status_reason"):
        # A study that stopped itself is the first thing to fix, before any curve is read.
        print(f"[{study['status']}] {study['status_reason']}")
    print()
    print(
        render_table(
            _arm_rows(analysis), ("arm", "best trial", "best", "step", "trials", "infeasible", "replicas", "std")
        )
    )
    print()
    print(
        f"infeasible: {analysis['infeasible_fraction']:.0%}   gradient clip (p90): {num(analysis['grad_clip']['p90'])}"
        f"   max_train_steps advice: {analysis['max_train_steps']['advice'] or 'none'}"
    )
    warnings = analysis["warnings"]
    print()
    print(f"{len(warnings)} warning(s)" + (":" if warnings else ": the checklist found nothing to fix."))
    for w in warnings:
        print(f"- [{w['kind']}] {w['message']}")
    for c in analysis.get("caveats") or []:
        print(f"  caveat: {c['message']}")
    _print_left_out(args)
    return 0


def _print_left_out(args: argparse.Namespace) -> None:
    """The checklist reads finished curves: say so when failures or nothing finished lie behind
    an empty warning list."""
    counts = request(args, "GET", f"/api/v1/studies/{args.study_id}")["trial_counts"]
    if counts.get("failed"):
        print(
            f"note: {counts['failed']} failed trial(s) are left out of this analysis; "
            f"`hpo study show {args.study_id}` shows the newest failure's reason"
        )
    if not counts.get("completed") and not counts.get("infeasible"):
        print("note: no trial has finished training yet, so there is nothing to analyze")


# --- formatting --------------------------------------------------------------------------------


def _arm_rows(analysis: dict[str, Any]) -> list[list[str]]:
    return [
        [
            a["label"],
            str(a["best_trial_id"] or "-"),
            num(a["best_value"]),
            num(a["best_step"]),
            str(a["n_trials"]),
            str(a["n_infeasible"]),
            str(a["n_replicas"]),
            num(a["replica_std"]),
        ]
        for a in analysis["arms"]
    ]
