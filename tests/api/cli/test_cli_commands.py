"""The study and trial commands a newcomer reaches for (`hpo study list|pause|resume|archive|grow`,
`hpo trial show|cancel|replicas`), `--server` in the forms people type, and one-line errors when
the server, the database or the Ray cluster is not what the command expects."""

from __future__ import annotations

import http.server
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from hpo.cli import main
from hpo.server_url import ServerUrlError, normalize
from tests.conftest import POSTGRES_URL, LiveServer, _postgres_available, free_port
from tests.server.analysis.protocol import run_one
from tests.server.analysis.test_planted import spec, valley


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") <= 2 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    ("given", "base"),
    [
        ("localhost:8000", "http://localhost:8000"),
        ("http://localhost:8000/", "http://localhost:8000"),
        ("http://localhost:8000/api/v1", "http://localhost:8000"),
        ("https://hpo.example.org/team/api/v1/", "https://hpo.example.org/team"),
        ("10.0.0.5", "http://10.0.0.5"),
    ],
)
def test_server_urls_in_the_forms_people_type(given: str, base: str) -> None:
    assert normalize(given) == base


@pytest.mark.parametrize("given", ["", "ftp://host", "host:port", "http://"])
def test_unusable_server_urls_are_refused(given: str) -> None:
    with pytest.raises(ServerUrlError):
        normalize(given)


def test_study_and_trial_commands(
    live_server: LiveServer, client: httpx.Client, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # host:port without a scheme, and a URL ending in /api/v1, both reach the same server.
    bare = ("--server", f"127.0.0.1:{live_server.port}")
    api = ("--server", live_server.url + "/api/v1")
    path = tmp_path / "s.json"
    path.write_text(json.dumps(spec("cli-commands", num_trials=2)))
    assert main(["study", "create", "-f", str(path), *bare, "--json"]) == 0
    created = json.loads(capsys.readouterr().out)
    study_id = created["id"]
    assert sum(created["trial_counts"].values()) == 2

    assert main(["study", "list", *api]) == 0
    out = capsys.readouterr().out
    assert "cli-commands" in out and "0/2 finished" in out and "min valid/error_rate" in out
    assert main(["study", "pause", str(study_id), *bare]) == 0
    assert f"study {study_id} 'cli-commands' is now paused" in capsys.readouterr().out
    assert main(["study", "list", "--status", "active", "--json", *bare]) == 0
    assert json.loads(capsys.readouterr().out)["total"] == 0
    assert main(["study", "resume", str(study_id), *bare]) == 0
    assert "is now active" in capsys.readouterr().out
    assert main(["study", "grow", str(study_id), "--num-trials", "5", *bare]) == 0
    assert "num_trials 2 -> 5 per arm, 3 trials added" in capsys.readouterr().out

    claim = client.post("/api/v1/workers/claim", json={"worker_id": "w", "resources": {"cpus": 8, "gpus": 0}}).json()
    run_one(client, claim, valley(0.5))
    trial_id = claim["trial_id"]
    assert main(["trial", "show", str(trial_id), *bare]) == 0
    out = capsys.readouterr().out
    assert f"trial {trial_id} (study {study_id}" in out and "[completed]" in out and "learning_rate=" in out
    assert main(["trial", "replicas", str(trial_id), "--count", "2", "--json", *bare]) == 0
    replica_ids = json.loads(capsys.readouterr().out)["trial_ids"]
    assert len(replica_ids) == 2
    assert main(["trial", "cancel", str(replica_ids[0]), *bare]) == 0
    assert f"trial {replica_ids[0]} is now cancelled" in capsys.readouterr().out
    assert main(["trial", "show", str(replica_ids[0]), "--json", *bare]) == 0
    assert json.loads(capsys.readouterr().out)["replica_of"] == trial_id

    assert main(["study", "archive", str(study_id), *bare]) == 0
    assert "is now archived" in capsys.readouterr().out
    assert main(["study", "grow", str(study_id), "--num-trials", "1", *bare]) == 2
    assert "num_trials: can only grow" in _one_line(capsys)


@pytest.fixture
def not_hpo() -> Iterator[str]:
    """Another program on a port: answers 200 with JSON to everything, as an unrelated API might."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            body = json.dumps({"status": "ok", "items": []}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_another_program_on_the_port_is_named_not_shown(not_hpo: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["study", "show", "1", "--server", not_hpo]) == 2
    err = _one_line(capsys)
    assert f"something answers at http://{not_hpo}, but it is not an hpo server" in err
    assert main(["worker", "--server", not_hpo]) == 2
    assert "not an hpo server" in _one_line(capsys)


def test_nothing_listening_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    assert main(["trial", "show", "1", "--server", f"127.0.0.1:{port}"]) == 2
    assert f"cannot reach the hpo server at http://127.0.0.1:{port}" in _one_line(capsys)


def test_worker_joining_a_ray_address_where_nothing_listens(
    live_server: LiveServer, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    assert main(["worker", "--unconfined", "--server", live_server.url, "--ray-address", f"127.0.0.1:{port}"]) == 2
    err = _one_line(capsys)
    assert f"--ray-address 127.0.0.1:{port}: nothing answers there" in err
    assert f"ray start --head --port={port}" in err


def test_server_database_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    port = str(free_port())
    monkeypatch.setenv("HPO_DATABASE_URL", f"sqlite:///{tmp_path}/missing/hpo.db")
    assert main(["server", "--port", port]) == 2
    assert f"the folder {tmp_path}/missing does not exist; create it (mkdir -p {tmp_path}/missing)" in _one_line(capsys)
    if _postgres_available() is not None:
        pytest.skip("no Postgres for the missing-database case")
    monkeypatch.setenv("HPO_DATABASE_URL", f"{POSTGRES_URL}/hpo_no_such_db_{port}")
    assert main(["server", "--port", port]) == 2
    err = _one_line(capsys)
    assert f"the Postgres database 'hpo_no_such_db_{port}' does not exist" in err and "createdb" in err


def test_server_refuses_a_taken_port(live_server: LiveServer, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["server", "--port", str(live_server.port)]) == 2
    assert f"cannot listen on 127.0.0.1:{live_server.port}" in _one_line(capsys)


def test_ctrl_c_exits_130(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import hpo.study_cli

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(hpo.study_cli, "request", interrupted)
    assert main(["study", "list"]) == 130
    assert capsys.readouterr().err == "hpo study: interrupted\n"


def test_every_option_has_help_with_its_default() -> None:
    """Every subcommand has a description line and every option says what it does; options with a
    non-trivial default name it."""
    import argparse

    from hpo.cli import build_parser

    def walk(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.Action]]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    assert sub.description or any(c.dest == name and c.help for c in action._choices_actions), name
                    yield from walk(sub, f"{path} {name}")
            else:
                yield path, action

    for path, action in walk(build_parser(), "hpo"):
        if isinstance(action, argparse._HelpAction):
            continue
        where = f"{path} {'/'.join(action.option_strings) or action.dest}"
        assert action.help, f"{where} has no help"
        if action.option_strings and action.default not in (None, False) and not action.required:
            assert "default" in action.help, f"{where}: help does not name the default {action.default!r}"


def test_patch_with_an_unknown_field_lists_the_fields_it_takes(client: httpx.Client) -> None:
    created = client.post("/api/v1/studies", json=spec("patched", num_trials=1))
    assert created.status_code == 201
    answer = client.patch(f"/api/v1/studies/{created.json()['id']}", json={"action": "pause"})
    assert answer.status_code == 422
    assert answer.json()["detail"] == [
        {"field": "action", "reason": "is not a known field (known: status, num_trials)"}
    ]


def test_a_study_of_failed_trials_says_why(client: httpx.Client, capsys: pytest.CaptureFixture[str]) -> None:
    """A study that paused itself after failures: `show` gives the reason and the way out, `analyze`
    does not pretend there was nothing to fix."""
    created = client.post("/api/v1/studies", json=spec("failing", num_trials=4)).json()
    server = ("--server", str(client.base_url))
    for _ in range(3):
        claim = client.post("/api/v1/workers/claim", json={"worker_id": "w", "resources": {"cpus": 8}}).json()
        body = {"lease_id": claim["lease_id"], "kind": "config", "reason": "unknown params.widht"}
        assert client.post(f"/api/v1/trials/{claim['trial_id']}/fail", json=body).status_code == 200
    assert main(["study", "show", str(created["id"]), *server]) == 0
    out = capsys.readouterr().out
    assert "[paused]" in out and "[config] unknown params.widht" in out
    assert f"hpo study resume {created['id']}" in out
    assert main(["study", "analyze", str(created["id"]), *server]) == 0
    out = capsys.readouterr().out
    assert "note: 3 failed trial(s) are left out of this analysis" in out
    assert "note: no trial has finished training yet" in out


@pytest.fixture
def not_http() -> Iterator[str]:
    """A port that answers, but not in HTTP (an SSH server's greeting)."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                continue
            with connection:
                connection.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")
                connection.recv(1024)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join(2)
    listener.close()


def test_a_port_that_does_not_speak_http_is_one_line_not_a_traceback(
    not_http: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["study", "list", "--server", not_http]) == 2
    assert "not an hpo server" in _one_line(capsys)
    assert main(["worker", "--server", not_http]) == 2
    assert "not an hpo server" in _one_line(capsys)


@pytest.mark.skipif(os.geteuid() != 0, reason="the refusals are a root worker's (CI runs as root)")
def test_a_root_worker_refuses_to_run_trials_as_root_or_to_share_one_user(
    live_server: LiveServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["worker", "--server", live_server.url]) == 2
    err = _one_line(capsys)
    assert "--run-as FIRST-LAST" in err and "--unconfined" in err, err
    assert main(["worker", "--server", live_server.url, "--run-as", "nobody", "--max-trials", "2"]) == 2
    err = _one_line(capsys)
    assert "--run-as nobody is one user" in err and "--max-trials 1" in err, err
