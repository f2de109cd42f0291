"""Where the hpo server is: `--server` / `HPO_SERVER_URL` as a user types it, and whether what
answers there is an hpo server. Shared by `hpo study`, `hpo trial` and `hpo worker`; standard
library only, so the commands start instantly.

Accepted forms (as Optuna's `--storage` and Ray's `--address` users expect): `host:port`,
`http://host:port`, `https://host/prefix`, each with or without a trailing `/api/v1` or `/`."""

from __future__ import annotations

import http.client
import json
import os
import urllib.error
import urllib.parse
import urllib.request

DEFAULT_SERVER = "http://127.0.0.1:8000"
API_SUFFIX = "/api/v1"


class ServerUrlError(ValueError):
    """The URL cannot be used, or what answers there is not an hpo server; the message is one line."""


def server_url(given: str | None) -> str:
    """The server's base URL (scheme, host, port, any prefix; without `/api/v1`) from `--server`,
    else `$HPO_SERVER_URL`, else http://127.0.0.1:8000."""
    return normalize(given or os.environ.get("HPO_SERVER_URL") or DEFAULT_SERVER)


def normalize(raw: str) -> str:
    text = raw.strip()
    if not text:
        raise ServerUrlError("the server URL is empty; give --server host:port or http://host:port")
    if "://" not in text:
        text = "http://" + text  # `localhost:8000`, `hpo.internal:8000`, `10.0.0.5`
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ServerUrlError(f"{raw!r} is not a server address; give host:port or http://host:port")
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        raise ServerUrlError(f"{raw!r} has a port that is not a number; give host:port or http://host:port") from None
    path = parts.path.rstrip("/")
    if path.endswith(API_SUFFIX):
        path = path[: -len(API_SUFFIX)]
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def probe(base: str, timeout: float = 5.0) -> bool:
    """True when an hpo server answers at `base`; False when nothing answers (connection refused,
    timeout). Raises `ServerUrlError` when something answers that is not an hpo server, so a
    command never shows another program's reply as if it were hpo's."""
    body = _get_json(base + "/healthz", timeout)
    if body is None:
        return False
    if isinstance(body, dict) and body.get("service") == "hpo":
        return True
    # A server from before /healthz named its service: its OpenAPI title is "hpo".
    openapi = _get_json(base + "/openapi.json", timeout)
    if isinstance(openapi, dict) and (openapi.get("info") or {}).get("title") == "hpo":
        return True
    raise ServerUrlError(
        f"something answers at {base}, but it is not an hpo server (GET /healthz did not answer as hpo does); "
        "check the port, or start one with `hpo server --port PORT` and pass --server host:PORT"
    )


def _get_json(url: str, timeout: float) -> object | None:
    """The decoded JSON body; an HTTP error or a body that is not JSON gives a marker string that no
    check accepts; None when nothing answers."""
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read(65536)
    except urllib.error.HTTPError:
        return "http-error"
    except http.client.HTTPException:  # it answers, but not in HTTP (an SSH or database port)
        return "not-http"
    except (urllib.error.URLError, OSError, ValueError):
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return "not-json"
