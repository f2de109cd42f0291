"""`hpo study create|list|show|watch|analyze|pause|resume|archive|grow`: a small HTTP client of
the study service.

The server comes from `--server` or `HPO_SERVER_URL` (default http://127.0.0.1:8000; `host:port`
and URLs with or without `/api/v1` are accepted), the token from `HPO_API_TOKEN`. Only the standard
library is imported, so the command starts instantly."""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from hpo.server_url import DEFAULT_SERVER, ServerUrlError, probe, server_url

_FINISHED = ("completed", "infeasible", "failed", "cancelled")


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
    _json_flag(create, "print the created study, with its warnings, as JSON")

    listing = _command(commands, "list", "list studies, newest first: status, progress, best value", _list)
    listing.add_argument(
        "--status",
        choices=("active", "paused", "archived", "completed"),
        default=None,
        help="only studies with this status (default: all)",
    )
    listing.add_argument("--limit", type=int, default=100, help="at most this many studies (default 100)")
    _json_flag(listing, "print the page of studies as JSON")

    show = _command(commands, "show", "show a study: status, progress, best trial, last failure", _show)
    show.add_argument("study_id", type=int, help="the study's id")
    show.add_argument("--spec", action="store_true", help="print only the study's spec as JSON")
    _json_flag(show, "print the study resource as JSON")

    watch = _command(commands, "watch", "follow a study's progress until its trials have finished", _watch)
    watch.add_argument("study_id", type=int, help="the study's id")
    watch.add_argument("--interval", type=float, default=2.0, help="seconds between polls (default 2)")
    watch.add_argument("--timeout", type=float, default=None, help="give up after this many seconds (default: never)")

    analyze = _command(commands, "analyze", "the playbook's checklist: warnings and the best trial per arm", _analyze)
    analyze.add_argument("study_id", type=int, help="the study's id")
    _json_flag(analyze, "print the whole analysis as JSON")

    for name, status, what in (
        ("pause", "paused", "pause a study: no new trials are claimed; running ones stop at their next heartbeat"),
        ("resume", "active", "resume a paused study (also clears its run of failed trials)"),
        ("archive", "archived", "archive a study: kept and readable, never run again"),
    ):
        command = _command(commands, name, what, _set_status)
        command.add_argument("study_id", type=int, help="the study's id")
        command.set_defaults(new_status=status)
        _json_flag(command, "print the study resource as JSON")

    grow = _command(commands, "grow", "raise num_trials (per arm), continuing the quasi-random sequence", _grow)
    grow.add_argument("study_id", type=int, help="the study's id")
    grow.add_argument(
        "--num-trials", type=int, required=True, help="the new number of trials PER ARM (must be above the current)"
    )
    _json_flag(grow, "print the study resource as JSON")

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
    _json_flag(retry, "print the new trial ids as JSON")


def _json_flag(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument("--json", action="store_true", help=help_text + " (for scripts; default: text)")


def _command(commands: Any, name: str, help_text: str, handler: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(name, help=help_text, description=help_text)
    add_server_option(parser)
    parser.set_defaults(handler=handler)
    return parser


def add_server_option(parser: argparse.ArgumentParser) -> None:
    """`--server`, shared by `hpo study` and `hpo trial`."""
    parser.add_argument(
        "--server",
        default=None,
        metavar="URL",
        help="the hpo server: host:port or a URL, with or without /api/v1 "
        f"(default $HPO_SERVER_URL or {DEFAULT_SERVER})",
    )


# --- HTTP --------------------------------------------------------------------------------------


def request(args: argparse.Namespace, method: str, path: str, body: Any = None, *, params: str = "") -> Any:
    """Calls the server and answers the decoded JSON. Raises CliError with the server's reason
    for a 4xx/5xx, with the URL when the server cannot be reached, and when what answers there is
    not an hpo server."""
    from hpo.cli import CliError

    base = _checked_base(args)
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path + params, data=data, method=method)
    req.add_header("Accept", "application/json")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if os.environ.get("HPO_API_TOKEN"):
        req.add_header("Authorization", f"Bearer {os.environ['HPO_API_TOKEN']}")
    try:
        with urllib.request.urlopen(req, timeout=60) as response:
            raw = response.read()
    except urllib.error.HTTPError as exc:
        raise CliError(f"{method} {path}: HTTP {exc.code}: {_reason(exc.read())}{_hint(exc.code)}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise CliError(f"cannot reach the hpo server at {base} ({reason}); start one with `hpo server`") from None
    return json.loads(raw) if raw else None


def _checked_base(args: argparse.Namespace) -> str:
    """The server's base URL, checked once per command: an hpo server answers there."""
    from hpo.cli import CliError

    cached = getattr(args, "_server_base", None)
    if cached:
        return str(cached)
    try:
        base = server_url(args.server)
        reachable = probe(base)
    except ServerUrlError as exc:
        raise CliError(str(exc)) from None
    if not reachable:
        raise CliError(f"cannot reach the hpo server at {base}; start one with `hpo server` or pass --server host:port")
    args._server_base = base
    return base


def _hint(code: int) -> str:
    if code == 401:
        return " (set HPO_API_TOKEN to a token of this server)"
    if code == 403:
        return " (this token's role may not do that)"
    return ""


def _reason(raw: bytes) -> str:
    try:
        body = json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")[:500]
    detail = body.get("message") or body.get("detail") if isinstance(body, dict) else body
    if isinstance(detail, list):
        return "; ".join(f"{d.get('field')}: {d.get('reason')}" for d in detail if isinstance(d, dict))
    return str(detail)


# --- commands ----------------------------------------------------------------------------------


def _create(args: argparse.Namespace) -> int:
    spec = _read_spec(args.file)
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


def _read_spec(path: str) -> dict[str, Any]:
    from hpo.cli import CliError

    try:
        text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()  # noqa: SIM115
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from None
    try:
        spec = json.loads(text)
    except ValueError as exc:
        raise CliError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(spec, dict):
        raise CliError(f"{path} must hold a JSON object (the study spec)")
    return spec


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
        print(f"  best: trial {study['best_trial_id']} with {objective['metric']} = {_num(study.get('best_value'))}")
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
        from hpo.cli import CliError

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
            _num(s.get("best_value")),
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
    from hpo.watch import watch

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
        f"infeasible: {analysis['infeasible_fraction']:.0%}   gradient clip (p90): {_num(analysis['grad_clip']['p90'])}"
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


def progress_line(counts: dict[str, int], width: int = 24) -> str:
    """`[########........] 12/48 finished (3 running, 1 infeasible)`."""
    total = sum(counts.values())
    finished = sum(counts.get(s, 0) for s in _FINISHED)
    filled = int(round(width * finished / total)) if total else 0
    extra = [f"{counts[s]} {s}" for s in ("running", "infeasible", "failed", "cancelled") if counts.get(s)]
    tail = f" ({', '.join(extra)})" if extra else ""
    return f"[{'#' * filled}{'.' * (width - filled)}] {finished}/{total} finished{tail}"


def render_table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    """A plain text table with columns padded to their widest cell."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=False)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)) for row in (header, *rows)]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def _arm_rows(analysis: dict[str, Any]) -> list[list[str]]:
    return [
        [
            a["label"],
            str(a["best_trial_id"] or "-"),
            _num(a["best_value"]),
            _num(a["best_step"]),
            str(a["n_trials"]),
            str(a["n_infeasible"]),
            str(a["n_replicas"]),
            _num(a["replica_std"]),
        ]
        for a in analysis["arms"]
    ]


def _num(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
