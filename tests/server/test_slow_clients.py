"""Issue 18, item 1 over real HTTP against a real `hpo server` process: a crowd of clients trickling
uploads to POST /signin cannot deny service. The health checks and authenticated calls answer
meanwhile, every slow body is cut off at the whole-body deadline although a byte arrives every
half second, and each timed-out or abandoned request logs one line, never a traceback."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from hpo.server import auth
from hpo.server.db import Database
from tests.conftest import free_port

BODY_SECONDS = 3.0
MAX_UNAUTHENTICATED = 16
# Fewer than the crowd's 300 connections: uvicorn's own check, which counts connections, would
# answer every call 503 during the attack.
LIMIT_CONCURRENCY = 100
TRICKLE_SECONDS = 0.5


@dataclass
class Server:
    url: str
    port: int
    token: str
    log: Path
    process: subprocess.Popen[bytes]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    database_url = f"sqlite:///{tmp_path / 'hpo.db'}"
    db = Database(database_url)
    db.upgrade()
    _, token = auth.create_token(db, "write", "prober")
    db.dispose()
    port = free_port()
    env = {
        **os.environ,
        "HPO_DATABASE_URL": database_url,
        "HPO_SESSION_SECRET_FILE": str(tmp_path / "session-secret"),
        "HPO_BODY_SECONDS": str(BODY_SECONDS),
        "HPO_HEADER_SECONDS": "2",
        "HPO_MAX_UNAUTHENTICATED": str(MAX_UNAUTHENTICATED),
    }
    env.pop("HPO_API_TOKEN", None)
    log = tmp_path / "server.log"
    command = [sys.executable, "-m", "hpo.cli", "server", "--port", str(port), "--log-level", "warning"]
    command += ["--limit-concurrency", str(LIMIT_CONCURRENCY)]
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_until_up(f"http://127.0.0.1:{port}", process)
        yield Server(f"http://127.0.0.1:{port}", port, token, log, process)
    finally:
        process.terminate()
        process.wait(30)


def _wait_until_up(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert process.poll() is None and time.monotonic() < deadline, "hpo server did not start"
        time.sleep(0.2)


@dataclass
class Crowd:
    """Clients that each keep one upload going: headers, then a byte every `TRICKLE_SECONDS`, and a
    new upload when the server answers or closes (about a second later when refused). Runs in its
    own thread and event loop."""

    port: int
    clients: int
    request: bytes
    stop: threading.Event = field(default_factory=threading.Event)
    answers: Counter[str] = field(default_factory=Counter)
    # Seconds from sending the headers to a 408, for every upload that got one.
    timed_out_after: list[float] = field(default_factory=list)
    open_uploads: int = 0

    def run(self) -> None:
        asyncio.run(self._all())

    async def _all(self) -> None:
        await asyncio.gather(*(self._client(i / self.clients) for i in range(self.clients)))

    async def _client(self, delay: float) -> None:
        await asyncio.sleep(delay)  # arriving over a second, as a crowd does, not in one instant
        while not self.stop.is_set():
            try:
                await self._upload()
            except OSError:
                self.answers["reset"] += 1
                await asyncio.sleep(0.05)

    async def _upload(self) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        started = time.monotonic()
        self.open_uploads += 1
        try:
            writer.write(self.request)
            while not self.stop.is_set():
                try:
                    head = await asyncio.wait_for(reader.read(64), TRICKLE_SECONDS)
                except asyncio.TimeoutError:
                    writer.write(b"x")  # one more byte of the body, never the whole of it
                    await writer.drain()
                    continue
                status = head.split(b" ")[1].decode() if head.startswith(b"HTTP/1.1 ") else "closed"
                self.answers[status] += 1
                if status == "408":
                    self.timed_out_after.append(time.monotonic() - started)
                else:
                    await asyncio.sleep(random.uniform(0.5, 1.5))  # many slow clients, not a flood
                return
        finally:
            self.open_uploads -= 1
            writer.close()  # at stop: an upload abandoned mid-body


def _upload(path: str, headers: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n"
        f"{headers}Content-Length: 100000\r\n\r\ntoken="
    ).encode()


def _probe(url: str, headers: dict[str, str] | None = None) -> tuple[int, float, str]:
    """One call on a new connection: (status, seconds, Retry-After)."""
    started = time.monotonic()
    response = httpx.get(url, headers=headers, timeout=10)
    return response.status_code, time.monotonic() - started, response.headers.get("retry-after", "")


@pytest.mark.slow
def test_a_crowd_of_slow_uploads_to_signin_denies_no_service(server: Server) -> None:
    crowd = Crowd(server.port, clients=300, request=_upload("/signin"))
    thread = threading.Thread(target=crowd.run, daemon=True)
    thread.start()
    reader = {"Authorization": f"Bearer {server.token}"}
    health, studies = [], []
    try:
        started = time.monotonic()
        while time.monotonic() - started < 2.5 * BODY_SECONDS:
            health.append(_probe(f"{server.url}/healthz"))
            studies.append(_probe(f"{server.url}/api/v1/studies", reader))
            time.sleep(0.1)
        in_progress = crowd.open_uploads
    finally:
        crowd.stop.set()
        thread.join(30)
    assert in_progress >= 100, "the crowd was not there"
    assert {status for status, _, _ in health} == {200}, health
    assert {status for status, _, _ in studies} == {200}, studies
    slowest = max(seconds for _, seconds, _ in health + studies)
    assert slowest < 2.0, f"a call took {slowest:.2f} s under the crowd"
    # Uploads past the cap were refused at once; the admitted ones were cut off at the deadline
    # although a byte came every half second (a per-read deadline would never have fired).
    assert crowd.answers["503"] > 100 and crowd.answers["408"] >= MAX_UNAUTHENTICATED, crowd.answers
    assert all(BODY_SECONDS - 0.5 < s < BODY_SECONDS + 1.5 for s in crowd.timed_out_after), crowd.timed_out_after
    _stop(server)
    log = server.log.read_text()
    assert "Traceback" not in log and "unexpected error" not in log, log[-3000:]
    lines = log.splitlines()
    timed_out = [line for line in lines if "POST /signin" in line and "not received within 3 s" in line]
    assert len(timed_out) == crowd.answers["408"]
    abandoned = [line for line in lines if "POST /signin" in line and "went away" in line]
    assert 1 <= len(abandoned) <= MAX_UNAUTHENTICATED  # the uploads in progress when the crowd left
    refusals = [line for line in lines if line.startswith("refused ") and "unauthenticated" in line]
    assert 1 <= len(refusals) <= 2.5 * BODY_SECONDS + 2  # counted, one line a second at most


@pytest.mark.slow
def test_health_checks_pass_a_full_concurrency_limit(server: Server) -> None:
    # Authenticated uploads are not capped as anonymous ones are: enough of them fill every slot
    # of --limit-concurrency, and then only the health checks still get in.
    slow_writer = _upload("/api/v1/studies", f"Authorization: Bearer {server.token}\r\n")
    crowd = Crowd(server.port, clients=LIMIT_CONCURRENCY + 10, request=slow_writer)
    thread = threading.Thread(target=crowd.run, daemon=True)
    thread.start()
    try:
        time.sleep(1.0)
        busy = _probe(f"{server.url}/api/v1/studies", {"Authorization": f"Bearer {server.token}"})
        health = [_probe(f"{server.url}/healthz"), _probe(f"{server.url}/readyz")]
    finally:
        crowd.stop.set()
        thread.join(30)
    assert busy[0] == 503 and busy[2] == "1", busy
    assert [status for status, _, _ in health] == [200, 200] and max(s for _, s, _ in health) < 2.0, health


def _stop(server: Server) -> None:
    server.process.terminate()
    server.process.wait(30)


def test_settings_that_would_defeat_the_cap_are_refused_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hpo.cli import main

    monkeypatch.setenv("HPO_DATABASE_URL", f"sqlite:///{tmp_path / 'hpo.db'}")
    monkeypatch.setenv("HPO_MAX_UNAUTHENTICATED", "64")
    assert main(["server", "--limit-concurrency", "64", "--port", str(free_port())]) == 2
    error = capsys.readouterr().err
    assert "HPO_MAX_UNAUTHENTICATED (64) must be below --limit-concurrency (64)" in error
    monkeypatch.setenv("HPO_MAX_UNAUTHENTICATED", "8")
    monkeypatch.setenv("HPO_BODY_SECONDS", "soon")
    assert main(["server", "--port", str(free_port())]) == 2
    assert "HPO_BODY_SECONDS must be a number, got 'soon'" in capsys.readouterr().err
