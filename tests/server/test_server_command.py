"""`hpo server` safe defaults: no non-loopback bind without a token, and the processes of
`--workers N` end with their master even when it is killed outright."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from hpo.cli import main
from hpo.server.auth import tokens as auth
from hpo.server.cli import connections_warning, is_loopback
from hpo.server.db import Database
from tests.conftest import free_port


def test_loopback_hosts() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "localhost", "::1", "[::1]", "127.8.0.1"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.5", "example.org"))


def test_a_public_bind_without_a_token_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    monkeypatch.setenv("HPO_DATABASE_URL", url)
    monkeypatch.delenv("HPO_API_TOKEN", raising=False)
    assert main(["server", "--host", "0.0.0.0", "--port", "1"]) == 2
    error = capsys.readouterr().err
    assert "--insecure" in error and "hpo token create" in error and len(error.strip().splitlines()) == 1


def test_more_server_processes_than_postgres_connections_are_warned_about(db: Database) -> None:
    """`hpo server --workers N` warns before starting when N processes' full pools would not fit in
    the connections Postgres has free (past them, requests answer 503 under load)."""
    many = connections_warning(db, 10_000)
    if db.is_sqlite:
        assert many is None
        return
    with db.engine.connect() as conn:
        limit = int(conn.execute(text("SHOW max_connections")).scalar_one())
    assert many is not None
    assert "10000 server process(es) may open up to 480000 Postgres connections (48 each)" in many
    assert f"max_connections {limit}," in many and "PgBouncer" in many
    assert connections_warning(db, 0) is None


@pytest.mark.slow
def test_server_processes_end_with_a_killed_master(tmp_path: Path) -> None:
    port = free_port()
    db = Database(f"sqlite:///{tmp_path / 'hpo.db'}")
    db.upgrade()
    auth.create_token(db, "admin")  # and so a non-loopback bind would be allowed too
    db.dispose()
    env = {**os.environ, "HPO_DATABASE_URL": f"sqlite:///{tmp_path / 'hpo.db'}"}
    command = [sys.executable, "-m", "hpo.cli", "server", "--workers", "2", "--port", str(port)]
    master = subprocess.Popen(command, env=env)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.2)
        children = _children(master.pid)
        assert len(children) >= 2
        master.send_signal(signal.SIGKILL)
        master.wait(10)
        deadline = time.monotonic() + 20
        while any(_alive(pid) for pid in children):
            assert time.monotonic() < deadline, "orphaned server processes kept running"
            time.sleep(0.2)
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
    finally:
        if master.poll() is None:
            master.kill()


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_token_commands_create_list_and_revoke(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HPO_DATABASE_URL", f"sqlite:///{tmp_path / 'hpo.db'}")
    assert main(["token", "create", "--role", "write", "--name", "alice"]) == 0
    token = capsys.readouterr().out.strip()
    assert token.startswith("hpo_") and len(token) > 40
    path = tmp_path / "worker.token"
    assert main(["token", "create", "--role", "worker", "--output", str(path)]) == 0
    written = path.read_text().strip()
    assert written.startswith("hpo_") and path.stat().st_mode & 0o077 == 0
    assert main(["token", "create", "--role", "worker", "--output", str(path)]) == 0  # kept, not replaced
    assert path.read_text().strip() == written
    assert main(["token", "revoke", "1"]) == 0
    capsys.readouterr()
    assert main(["token", "list"]) == 0
    listing = capsys.readouterr().out
    assert "alice" in listing and "revoked" in listing and "active" in listing
    assert token not in listing and written not in listing
    assert main(["token", "revoke", "99"]) == 2 and "not found" in capsys.readouterr().err


def test_a_client_trickling_headers_is_cut_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket
    import threading

    import uvicorn

    from hpo.server.api.guards import protocol as http_protocol
    from hpo.server.app import create_app
    from hpo.settings import Settings

    monkeypatch.setattr(http_protocol, "HEADER_SECONDS", 1.0)
    port = free_port()
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'hpo.db'}"))
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, http=http_protocol.HeaderDeadlineProtocol, log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.05)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as http:
            for _ in range(3):  # whole requests on a kept-alive connection are unaffected
                assert http.get("/healthz").status_code == 200
                time.sleep(0.5)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
            started = time.monotonic()
            assert sock.recv(100) == b""  # closed by the server
            assert 0.5 < time.monotonic() - started < 5
    finally:
        server.should_exit = True
        thread.join(10)


def _start(port: int, tmp_path: Path, *extra: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "HPO_DATABASE_URL": f"sqlite:///{tmp_path / 'hpo.db'}",
        "HPO_SESSION_SECRET_FILE": str(tmp_path / "key"),
    }
    for name in ("HPO_ALLOWED_COMMANDS", "HPO_ALLOWED_WORKLOADS", "HPO_ALLOWED_ENV", "HPO_API_TOKEN"):
        env.pop(name, None)
    command = [sys.executable, "-m", "hpo.cli", "server", "--port", str(port), *extra]
    process = subprocess.Popen(command, env=env)
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        assert process.poll() is None, f"hpo server exited with {process.returncode}"
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.2)


@pytest.mark.slow
def test_the_servers_allow_list_options_and_a_restart_on_the_same_port(tmp_path: Path) -> None:
    """`hpo server --allow-command` exists and matches the worker's option; a server restarted at
    once on the port the last one held starts (SO_REUSEADDR, as uvicorn binds), not "in use"."""
    port = free_port()
    spec = {
        "name": "s",
        "hyperparameters": [{"name": "learning_rate", "role": "fixed", "value": 0.1}],
        "trainer": {"command": ["{python}", "train.py", "--lr={learning_rate}"]},
    }
    server = _start(port, tmp_path, "--allow-command", "{python} train.py")
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            assert http.post("/api/v1/studies", json=spec).status_code == 201
            other = {**spec, "name": "t", "trainer": {"command": ["{python}", "evil.py"]}}
            refused = http.post("/api/v1/studies", json=other)
            assert refused.status_code == 422 and "hpo server" in refused.text, refused.text
            # The server closes this kept-alive connection when it stops: its port is in TIME_WAIT.
            server.send_signal(signal.SIGTERM)
            server.wait(30)
        server = _start(port, tmp_path)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)


def test_a_running_server_keeps_its_startup_objects_out_of_the_collectors_sight(tmp_path: Path) -> None:
    """What the imports left is frozen once the app has started (a full collection over it cost
    a 5,000-trial study's timeline chart 150 ms), and handed back to the collector at shutdown, so
    a process that starts apps again can still collect the cycles of one that stopped."""
    import gc

    from starlette.testclient import TestClient

    from hpo.server.app import create_app
    from hpo.settings import Settings

    gc.unfreeze()
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'hpo.db'}"))
    with TestClient(app) as client:
        assert client.get("/healthz").status_code == 200
        assert gc.get_freeze_count() > 10_000
    assert gc.get_freeze_count() == 0
