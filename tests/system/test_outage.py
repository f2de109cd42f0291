"""While Postgres is unreachable, a real `hpo server` answers 503 (never 500) with one log line per
request and no traceback from its background loops, and serves again once the database is back.
The database sits behind a TCP relay in this test, so the outage is the relay going away."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from hpo.server.auth import tokens as auth
from hpo.server.db import Database
from tests.conftest import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


class Relay:
    """A TCP relay to Postgres that can be cut (every connection closed, new ones refused) and restored."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target, self.port = target, free_port()
        self._listener: socket.socket | None = None
        self._sockets: list[socket.socket] = []

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen()
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        assert self._listener is not None
        # shutdown wakes the thread blocked in accept(); close alone would leave it listening.
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self._sockets.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self._sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass


@pytest.fixture
def relayed(postgres_url: str) -> Iterator[tuple[Relay, str]]:
    parts = urlsplit(postgres_url)
    relay = Relay((parts.hostname or "127.0.0.1", parts.port or 5432))
    relay.start()
    netloc = f"{parts.username}@127.0.0.1:{relay.port}" if parts.username else f"127.0.0.1:{relay.port}"
    yield relay, urlunsplit(parts._replace(netloc=netloc))


def _server(url: str, tmp_path: Path) -> tuple[subprocess.Popen[bytes], str, Path]:
    """A real `hpo server` on `url`, its output in a log file: (process, base URL, log)."""
    port = free_port()
    log = tmp_path / "server.log"
    env = {**os.environ, "HPO_DATABASE_URL": url, "HPO_SESSION_SECRET_FILE": str(tmp_path / "key")}
    env.pop("HPO_API_TOKEN", None)
    with log.open("w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "hpo.cli", "server", "--port", str(port)], env=env, stdout=out, stderr=out
        )
    return server, f"http://127.0.0.1:{port}", log


def test_a_database_outage_is_503_one_line_a_request_and_no_traceback(
    relayed: tuple[Relay, str], tmp_path: Path
) -> None:
    relay, url = relayed
    server, base, log = _server(url, tmp_path)
    try:
        _wait_for(lambda: server.poll() is None and httpx.get(f"{base}/healthz", timeout=2).status_code == 200, "start")
        _wait_for(lambda: httpx.get(f"{base}/readyz", timeout=2).status_code == 200, "the server")
        assert httpx.get(f"{base}/api/v1/studies", timeout=5).status_code == 200
        relay.cut()
        before = len(log.read_text().splitlines())
        answers = [httpx.get(f"{base}/api/v1/studies/{i}", timeout=10) for i in range(1, 6)]
        assert [a.status_code for a in answers] == [503] * 5, [a.text for a in answers]
        assert all("database" in a.json()["detail"] for a in answers)
        assert httpx.get(f"{base}/readyz", timeout=10).status_code == 503
        time.sleep(3)  # the reaper and the bayesian queue tick meanwhile
        during = log.read_text().splitlines()[before:]
        assert not [line for line in during if "Traceback" in line], "\n".join(during)
        expected = (
            "storage error: OperationalError",
            '"GET /',
            "bayesian refill: ",
            "lease reaper: ",
            "curve statistics keeper: ",
        )
        assert all(any(mark in line for mark in expected) for line in during), "\n".join(during)
        storage_lines = [line for line in during if "storage error" in line]
        assert len(storage_lines) == 5, during  # one line a request (plus uvicorn's access line)
        relay.start()
        _wait_for(lambda: httpx.get(f"{base}/api/v1/studies", timeout=5).status_code == 200, "recovery")
    finally:
        server.terminate()
        server.wait(30)


def test_an_outage_is_503_at_the_credentials_check_too(relayed: tuple[Relay, str], tmp_path: Path) -> None:
    """With tokens, every request's credentials are looked up in the database once its 2 s cache
    lapses: during an outage that lookup answers 503 like the routes, never a 500 and a traceback
    (the fleet simulation found it when Postgres refused connections)."""
    relay, url = relayed
    db = Database(url)
    db.upgrade()
    token = auth.create_token(db, "read")[1]
    db.dispose()
    server, base, log = _server(url, tmp_path)
    headers = {"Authorization": f"Bearer {token}"}
    try:
        _wait_for(lambda: httpx.get(f"{base}/readyz", timeout=2).status_code == 200, "the server")
        assert httpx.get(f"{base}/api/v1/studies", headers=headers, timeout=5).status_code == 200
        relay.cut()
        before = len(log.read_text().splitlines())
        unknown = httpx.get(f"{base}/api/v1/studies", headers={"Authorization": "Bearer hpo_unseen"}, timeout=10)
        time.sleep(2.5)  # the token and "tokens exist" caches lapse
        known = httpx.get(f"{base}/api/v1/studies", headers=headers, timeout=10)
        for answer in (unknown, known):
            assert answer.status_code == 503, answer.text
            assert "database" in answer.json()["detail"]
        during = log.read_text().splitlines()[before:]
        assert not [line for line in during if "Traceback" in line], "\n".join(during)
        relay.start()
        back = lambda: httpx.get(f"{base}/api/v1/studies", headers=headers, timeout=5).status_code == 200  # noqa: E731
        _wait_for(back, "recovery")
    finally:
        server.terminate()
        server.wait(30)


def _wait_for(condition: object, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if condition():  # type: ignore[operator]
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
