"""Slow clients (docs/security.md, "Slow clients") over real HTTP against a real `hpo server`
process: a crowd of clients trickling uploads to POST /signin cannot deny service. The health checks
and authenticated calls answer meanwhile, every slow body is cut off at the whole-body deadline
although a byte arrives every half second, and each timed-out or abandoned request logs one line,
never a traceback."""

from __future__ import annotations

import asyncio
import os
import random
import socket
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

from hpo.server.auth import tokens as auth
from hpo.server.db import Database
from tests.conftest import free_port
from tests.server.factories import study_spec

BODY_SECONDS = 3.0
MAX_UNAUTHENTICATED = 16
# Fewer than the crowd's 300 connections: uvicorn's own check, which counts connections, would
# answer every call 503 during the attack.
LIMIT_CONCURRENCY = 100
TRICKLE_SECONDS = 0.5


# Uploads in flight per token: small, so a crowd of one token's uploads passes it many times over.
MAX_UPLOADS_PER_TOKEN = 8


@dataclass
class Server:
    url: str
    port: int
    token: str
    log: Path
    process: subprocess.Popen[bytes]
    other_token: str = ""


@pytest.fixture
def server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Server]:
    """A real `hpo server`; a test may pass more environment with indirect parametrisation."""
    database_url = f"sqlite:///{tmp_path / 'hpo.db'}"
    db = Database(database_url)
    db.upgrade()
    _, token = auth.create_token(db, "write", "prober")
    _, other_token = auth.create_token(db, "write", "other")
    db.dispose()
    port = free_port()
    env = {
        **os.environ,
        "HPO_DATABASE_URL": database_url,
        "HPO_SESSION_SECRET_FILE": str(tmp_path / "session-secret"),
        "HPO_BODY_SECONDS": str(BODY_SECONDS),
        "HPO_HEADER_SECONDS": "2",
        "HPO_MAX_UNAUTHENTICATED": str(MAX_UNAUTHENTICATED),
        "HPO_MAX_UPLOADS_PER_TOKEN": str(MAX_UPLOADS_PER_TOKEN),
        **getattr(request, "param", {}),
    }
    env.pop("HPO_API_TOKEN", None)
    log = tmp_path / "server.log"
    command = [sys.executable, "-m", "hpo.cli", "server", "--port", str(port), "--log-level", "warning"]
    command += ["--limit-concurrency", str(LIMIT_CONCURRENCY)]
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_until_up(f"http://127.0.0.1:{port}", process)
        yield Server(f"http://127.0.0.1:{port}", port, token, log, process, other_token)
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


def _upload(path: str, headers: str = "", length: int = 100_000) -> bytes:
    """A request's headers and the first bytes of a body that never comes whole (larger than
    `http_protocol.SMALL_BODY` by default: an upload the app counts while it arrives)."""
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n"
        f"{headers}Content-Length: {length}\r\n\r\ntoken="
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
@pytest.mark.parametrize("server", [{"HPO_MAX_UPLOADS_PER_TOKEN": str(LIMIT_CONCURRENCY // 2 + 10)}], indirect=True)
def test_health_checks_pass_a_full_concurrency_limit(server: Server) -> None:
    # Authenticated uploads are capped per token, not in all: two tokens' slow uploads fill every
    # slot of --limit-concurrency, and then only the health checks still get in.
    crowds = [
        Crowd(server.port, clients=LIMIT_CONCURRENCY // 2 + 10, request=_upload("/api/v1/studies", f"{_bearer(t)}\r\n"))
        for t in (server.token, server.other_token)
    ]
    threads = [threading.Thread(target=crowd.run, daemon=True) for crowd in crowds]
    for thread in threads:
        thread.start()
    try:
        time.sleep(1.0)
        busy = _probe(f"{server.url}/api/v1/studies", {"Authorization": f"Bearer {server.token}"})
        health = [_probe(f"{server.url}/healthz"), _probe(f"{server.url}/readyz")]
    finally:
        for crowd, thread in zip(crowds, threads, strict=True):
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
    monkeypatch.setenv("HPO_MAX_UPLOADS_PER_TOKEN", "64")
    assert main(["server", "--limit-concurrency", "64", "--port", str(free_port())]) == 2
    assert "HPO_MAX_UPLOADS_PER_TOKEN (64) must be below --limit-concurrency (64)" in capsys.readouterr().err
    monkeypatch.setenv("HPO_MAX_UPLOADS_PER_TOKEN", "0")
    assert main(["server", "--port", str(free_port())]) == 2
    assert "HPO_MAX_UPLOADS_PER_TOKEN must be between 1 and 100000, got 0" in capsys.readouterr().err
    monkeypatch.setenv("HPO_MAX_UPLOADS_PER_TOKEN", "64")
    monkeypatch.setenv("HPO_BODY_SECONDS", "soon")
    assert main(["server", "--port", str(free_port())]) == 2
    assert "HPO_BODY_SECONDS must be a number, got 'soon'" in capsys.readouterr().err


def _bearer(token: str) -> str:
    return f"Authorization: Bearer {token}"


def _sign_in(server: Server) -> tuple[int, int, bool]:
    """A fresh person signing in: (GET /signin status, POST /signin status, whether a session came)."""
    with httpx.Client(base_url=server.url, timeout=10) as browser:
        page = browser.get("/signin")
        form = browser.post("/signin", data={"token": server.token, "next": "/"})
        return page.status_code, form.status_code, "hpo_session" in browser.cookies


def _held(sockets: list[socket.socket]) -> tuple[int, Counter[str]]:
    """How many of the raw uploads are still held open unanswered, and the answers of the others."""
    held, answers = 0, Counter[str]()
    for sock in sockets:
        sock.settimeout(0.05)
        try:
            head = sock.recv(64)
        except TimeoutError:
            held += 1
            continue
        answers[head.split(b" ")[1].decode() if head.startswith(b"HTTP/1.1 ") else "closed"] += 1
    return held, answers


def test_sign_in_stays_available_under_anonymous_slow_uploads(server: Server) -> None:
    # HPO_MAX_UNAUTHENTICATED uploads whose bodies never finish: they may hold all but a quarter
    # of the anonymous cap, and the rest stays for requests that came whole (a sign-in).
    sockets = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(MAX_UNAUTHENTICATED)]
    try:
        for sock in sockets:
            sock.sendall(_upload("/signin"))
        time.sleep(0.6)  # the ones past the uploads' share are refused within a quarter second
        assert _sign_in(server) == (200, 303, True)
        held, answers = _held(sockets)
        assert held == MAX_UNAUTHENTICATED - MAX_UNAUTHENTICATED // 4, answers
        assert answers == {"503": MAX_UNAUTHENTICATED // 4}, answers
        # And under a crowd that keeps coming back, every sign-in is served at once.
        crowd = Crowd(server.port, clients=40, request=_upload("/signin"))
        thread = threading.Thread(target=crowd.run, daemon=True)
        thread.start()
        signed, seconds = [], []
        try:
            time.sleep(0.5)
            for _ in range(8):
                started = time.monotonic()
                signed.append(_sign_in(server))
                seconds.append(time.monotonic() - started)
                time.sleep(0.1)
        finally:
            crowd.stop.set()
            thread.join(30)
        assert signed == [(200, 303, True)] * 8, signed
        assert max(seconds) < 2.0, seconds
        assert crowd.answers["503"] > 0, crowd.answers  # the crowd was there, and refused
    finally:
        for sock in sockets:
            sock.close()


def test_slow_small_bodies_hold_no_request_slot(server: Server) -> None:
    # Twice the anonymous cap, and a token's uploads past its own cap, each declaring a small body
    # that never comes whole: they start no request (so count in no cap) until the body deadline,
    # where the protocol answers them 408 itself.
    small = [_upload("/signin", length=100)] * (2 * MAX_UNAUTHENTICATED)
    small += [_upload("/api/v1/studies", f"{_bearer(server.token)}\r\n", length=100)] * (2 * MAX_UPLOADS_PER_TOKEN)
    sockets = [socket.create_connection(("127.0.0.1", server.port)) for _ in small]
    try:
        started = time.monotonic()
        for sock, request in zip(sockets, small, strict=True):
            sock.sendall(request)
        time.sleep(0.5)
        assert _sign_in(server) == (200, 303, True)
        writer = {"Authorization": f"Bearer {server.token}"}
        created = httpx.post(f"{server.url}/api/v1/studies", json=study_spec(name="whole"), headers=writer, timeout=10)
        assert created.status_code == 201, created.text
        assert _held(sockets)[0] == len(sockets)  # none refused, none answered
        answers = Counter[str]()
        for sock in sockets:
            sock.settimeout(BODY_SECONDS + 3)
            head = sock.recv(64)
            answers[head.split(b" ")[1].decode() if head.startswith(b"HTTP/1.1 ") else "closed"] += 1
        waited = time.monotonic() - started
    finally:
        for sock in sockets:
            sock.close()
    assert answers == {"408": len(sockets)}, answers
    assert BODY_SECONDS - 0.5 < waited < BODY_SECONDS + 2.5, waited
    _stop(server)
    log = server.log.read_text()
    assert "Traceback" not in log, log[-3000:]
    assert log.count("request body not received within 3 s; 408") == len(sockets), log[-3000:]


def test_one_tokens_slow_uploads_do_not_deny_other_tokens(server: Server) -> None:
    # One token's uploads far past --limit-concurrency: past HPO_MAX_UPLOADS_PER_TOKEN they answer
    # 503 with Retry-After at once, so they never hold the slots other tokens' calls need, and that
    # token's own requests that come whole are served too.
    crowd = Crowd(
        server.port, clients=LIMIT_CONCURRENCY + 20, request=_upload("/api/v1/studies", f"{_bearer(server.token)}\r\n")
    )
    thread = threading.Thread(target=crowd.run, daemon=True)
    thread.start()
    other = {"Authorization": f"Bearer {server.other_token}"}
    probes, created = [], []
    try:
        time.sleep(0.5)
        started = time.monotonic()
        with httpx.Client(base_url=server.url, timeout=10) as http:
            while time.monotonic() - started < 2.0:
                probes.append(_probe(f"{server.url}/api/v1/studies", other))
                spec = study_spec(name=f"whole-{len(created)}", num_trials=1)
                created.append(
                    http.post(
                        "/api/v1/studies", json=spec, headers={"Authorization": f"Bearer {server.token}"}
                    ).status_code
                )
                time.sleep(0.1)
        # A slow upload of the other token is admitted (not refused at once) while the first is full.
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(_upload("/api/v1/studies", f"{_bearer(server.other_token)}\r\n"))
            held, answers = _held([sock])
            time.sleep(0.5)
            held_later, _ = _held([sock])
        in_flight = crowd.open_uploads
    finally:
        crowd.stop.set()
        thread.join(30)
    assert in_flight >= LIMIT_CONCURRENCY, "the crowd was not there"
    assert {status for status, _, _ in probes} == {200}, probes
    assert max(seconds for _, seconds, _ in probes) < 2.0, probes
    assert set(created) == {201}, created
    assert (held, held_later) == (1, 1), answers
    # Past the token's share the crowd's uploads were refused at once; the admitted ones held
    # their slots to the deadline.
    assert crowd.answers["503"] > LIMIT_CONCURRENCY, crowd.answers
    _stop(server)
    log = server.log.read_text()
    assert "Traceback" not in log, log[-3000:]
    assert "HPO_MAX_UPLOADS_PER_TOKEN" in log


@pytest.mark.parametrize("server", [{"HPO_MAX_UPLOADS_PER_TOKEN": "1"}], indirect=True)
def test_a_token_past_its_uploads_gets_503_with_retry_after(server: Server) -> None:
    sockets = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(2)]
    try:
        for sock in sockets:
            sock.sendall(_upload("/api/v1/studies", f"{_bearer(server.token)}\r\n"))
            time.sleep(0.1)
        sockets[1].settimeout(2)
        answer = sockets[1].recv(4096)
        assert answer.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1" in answer.lower(), answer
        assert b"HPO_MAX_UPLOADS_PER_TOKEN" in answer
        assert _held(sockets[:1])[0] == 1  # the first is held until its body's deadline
    finally:
        for sock in sockets:
            sock.close()
