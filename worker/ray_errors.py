"""Joining a running Ray cluster for `hpo worker --ray-address`, with Ray's long failures turned
into one or two lines that say what to do in this project's terms (docs/workers.md).

Ray's own messages name its own flags (`--address`, `RAY_ADDRESS`) and, for a wrong token, run to
dozens of lines; a missing head at `host:port` makes `ray.init` retry for minutes."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import tempfile
from collections.abc import Iterator

from hpo.cli import CliError

_TOKEN_HELP = (
    "the cluster uses Ray's token authentication: give this process the head's token "
    "(RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token; see docs/workers.md)"
)


def join_ray(address: str, *, log_to_driver: bool = True) -> None:
    """`ray.init(address=...)`, or a `CliError` in one or two lines. The worker then finds Ray
    initialized and uses this connection."""
    if address != "auto":
        _check_listening(address)
    import ray

    with _captured_stderr() as captured:
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=log_to_driver)
            failure: BaseException | None = None
        except Exception as exc:
            failure = exc
    if failure is None:
        sys.stderr.write(captured.text())
        return
    if _is_auth_error(failure) or "InvalidAuthToken" in captured.text():
        raise CliError(f"--ray-address {address}: Ray refused this process's token;\n  {_TOKEN_HELP}") from None
    if isinstance(failure, ConnectionError):
        if address == "auto":
            raise CliError(
                "--ray-address auto: no Ray cluster runs on this node; start one with "
                "`ray start --head --port=PORT`, or leave out --ray-address to start a local Ray instance"
            ) from None
        raise CliError(f"--ray-address {address}: cannot join the Ray cluster ({_first_line(failure)})") from None
    sys.stderr.write(captured.text())
    raise failure


class _Captured:
    def __init__(self) -> None:
        self._text = ""

    def text(self) -> str:
        return self._text


@contextlib.contextmanager
def _captured_stderr() -> Iterator[_Captured]:
    """Ray's C++ core logs its connection retries straight to file descriptor 2 (dozens of lines
    for a wrong token): hold them while joining, show them only when joining worked or failed in a
    way this module does not explain."""
    sys.stderr.flush()
    saved = os.dup(2)
    captured = _Captured()
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as file:
        os.dup2(file.fileno(), 2)
        try:
            yield captured
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            file.seek(0)
            captured._text = file.read()


def _check_listening(address: str) -> None:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise CliError(f"--ray-address {address!r}: give host:port of the Ray head (e.g. 10.0.0.5:6379) or 'auto'")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=3):
            pass
    except OSError as exc:
        raise CliError(
            f"--ray-address {address}: nothing answers there ({exc.strerror or exc}); start the head with "
            f"`ray start --head --port={port}` on {host}, or check the address"
        ) from None


def _is_auth_error(exc: BaseException) -> bool:
    try:
        from ray.exceptions import AuthenticationError
    except ImportError:  # a Ray without token authentication
        AuthenticationError = ()  # type: ignore[assignment,misc]  # noqa: N806
    text = str(exc)
    return isinstance(exc, AuthenticationError) or "auth" in text.lower() and "token" in text.lower()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
