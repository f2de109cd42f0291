"""`hpo study create|show|watch|analyze`: a small HTTP client of the study service.

The server comes from `--server` or `HPO_SERVER_URL` (default http://127.0.0.1:8000), the token
from `HPO_API_TOKEN`. Only the standard library is imported, so the command starts instantly."""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

DEFAULT_SERVER = "http://127.0.0.1:8000"
_FINISHED = ("completed", "infeasible", "failed", "cancelled")


def register(subparsers: Any) -> None:
    """Adds `hpo study` and its four subcommands."""
    study = subparsers.add_parser("study", help="create, show, watch and analyze studies on an hpo server")
    commands = study.add_subparsers(dest="study_command", required=True, metavar="COMMAND")

    create = _command(commands, "create", "create a study from a JSON spec file", _create)
    create.add_argument("-f", "--file", required=True, help="the study spec (JSON); - reads standard input")
    create.add_argument("--name", help="override the spec's name (e.g. to rerun a study)")

    show = _command(commands, "show", "show a study: status, progress, best trial", _show)
    show.add_argument("study_id", type=int)
    show.add_argument("--spec", action="store_true", help="print only the study's spec as JSON")
    show.add_argument("--json", action="store_true", help="print the study resource as JSON")

    watch = _command(commands, "watch", "follow a study's progress until its trials have finished", _watch)
    watch.add_argument("study_id", type=int)
    watch.add_argument("--interval", type=float, default=2.0, help="seconds between polls (default 2)")
    watch.add_argument("--timeout", type=float, default=None, help="give up after this many seconds")

    analyze = _command(commands, "analyze", "the playbook's checklist: warnings and the best trial per arm", _analyze)
    analyze.add_argument("study_id", type=int)
    analyze.add_argument("--json", action="store_true", help="print the whole analysis as JSON")


def _command(commands: Any, name: str, help_text: str, handler: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(name, help=help_text, description=help_text)
    parser.add_argument("--server", default=None, help=f"server URL (HPO_SERVER_URL, default {DEFAULT_SERVER})")
    parser.set_defaults(handler=handler)
    return parser


# --- HTTP --------------------------------------------------------------------------------------


def request(args: argparse.Namespace, method: str, path: str, body: Any = None) -> Any:
    """Calls the server and answers the decoded JSON. Raises CliError with the server's reason
    for a 4xx/5xx and with the URL when the server cannot be reached."""
    from hpo.cli import CliError

    base = (args.server or os.environ.get("HPO_SERVER_URL") or DEFAULT_SERVER).rstrip("/")
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method)
    req.add_header("Accept", "application/json")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if os.environ.get("HPO_API_TOKEN"):
        req.add_header("Authorization", f"Bearer {os.environ['HPO_API_TOKEN']}")
    try:
        with urllib.request.urlopen(req, timeout=60) as response:
            raw = response.read()
    except urllib.error.HTTPError as exc:
        raise CliError(f"{method} {path}: HTTP {exc.code}: {_reason(exc.read())}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise CliError(f"cannot reach the hpo server at {base} ({reason}); start one with `hpo server`") from None
    return json.loads(raw) if raw else None


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
    return 0


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
