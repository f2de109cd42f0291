"""The CLI's HTTP client of the study service: the shared `--server` and `--json` options, one
`request` that turns every failure into a one-line `CliError`, and reading a spec file.

Only the standard library is imported, so every command starts instantly."""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any

from hpo.cli import CliError
from hpo.server_url import DEFAULT_SERVER, ServerUrlError, probe, server_url


def add_server_option(parser: argparse.ArgumentParser) -> None:
    """`--server`, shared by `hpo study` and `hpo trial`."""
    parser.add_argument(
        "--server",
        default=None,
        metavar="URL",
        help="the hpo server: host:port or a URL, with or without /api/v1 "
        f"(default $HPO_SERVER_URL or {DEFAULT_SERVER})",
    )


def json_flag(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument("--json", action="store_true", help=help_text + " (for scripts; default: text)")


def read_spec(path: str) -> dict[str, Any]:
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


def request(args: argparse.Namespace, method: str, path: str, body: Any = None, *, params: str = "") -> Any:
    """Calls the server and answers the decoded JSON. Raises CliError with the server's reason
    for a 4xx/5xx, with the URL when the server cannot be reached, and when what answers there is
    not an hpo server."""
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
