"""Every list and show command under `| head -1`: the reader closes the pipe after one line, the
command exits 0 without a word on stderr (docs/cli.md, "Pipes"). Each command's output is made
larger than a pipe's buffer (64 KiB on Linux) plus what `head` reads, so the command is still
writing when the pipe closes: without the handling in hpo/cli.py each one exits 1 with a
BrokenPipeError traceback."""

from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from hpo.policy import ExecutionPolicy
from hpo.server.auth import tokens as auth
from hpo.server.db import Database
from hpo.settings import Settings
from tests.conftest import LiveServer
from tests.server.analysis.protocol import run_one
from tests.server.analysis.test_planted import spec, valley

API = "/api/v1"
HPO = str(Path(sys.executable).parent / "hpo")
# 95,000 characters over 1,900 lines: under the 100,000 a description or goal may hold.
LONG_TEXT = ("d" * 49 + "\n") * 1900
PIPE_BUFFER = 64 * 1024
# `head -1` reads one block (GNU head: 8 KiB) before it finds the first newline and exits.
HEAD_READ = 16 * 1024


def _big_study(client: httpx.Client) -> dict[str, Any]:
    """A study whose show, analyze and trial outputs each pass a pipe's buffer: a long description,
    600 arms (a row each in the analysis) and 900 long-named fixed hyperparameters (in every trial's
    params)."""
    body = spec("pipes", num_trials=1)
    body["description"] = LONG_TEXT
    # A command trainer (docs/scripts.md) takes hyperparameters of any name.
    body["trainer"] = {
        **{k: v for k, v in body["trainer"].items() if k != "workload"},
        "command": ["python3", "train.py"],
    }
    body["hyperparameters"] = [
        {"name": "arm", "role": "scientific", "type": "categorical", "values": [f"a{i:04d}" for i in range(600)]},
        *body["hyperparameters"],
        *({"name": f"fixed_{i:03d}_" + "p" * 80, "role": "fixed", "value": i} for i in range(900)),
    ]
    reply = client.post(f"{API}/studies", json=body)
    assert reply.status_code == 201, reply.text
    return reply.json()


def _command_spec(name: str) -> dict[str, Any]:
    """A command trainer's study (docs/scripts.md): it takes hyperparameters and metrics of any name."""
    body = spec(name, num_trials=1)
    trainer = {k: v for k, v in body["trainer"].items() if k != "workload"}
    body["trainer"] = {**trainer, "command": ["python3", "train.py"]}
    return body


def _piped(command: list[str], env: dict[str, str] | None = None) -> tuple[int, str, int]:
    """Runs `command | head -1` in a shell; answers the command's exit status, its stderr, and how
    many bytes it writes when nothing closes the pipe."""
    line = f"{shlex.join(command)} | head -1 >/dev/null; exit ${{PIPESTATUS[0]}}"
    proc = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=120, env=env)
    code = proc.returncode
    whole = subprocess.run(command, capture_output=True, timeout=120, env=env)
    assert whole.returncode == 0, whole.stderr
    return code, proc.stderr, len(whole.stdout)


def test_list_show_and_analyze_exit_quietly_when_the_reader_closes_the_pipe(
    settings: Settings, database_url: str
) -> None:
    policy = ExecutionPolicy.from_env({"HPO_ALLOWED_COMMANDS": "python3 train.py"})
    with (
        LiveServer(dataclasses.replace(settings, execution_policy=policy)) as live_server,
        httpx.Client(base_url=live_server.url, timeout=60) as client,
    ):
        _check_every_command(live_server, client, database_url)


def _check_every_command(live_server: LiveServer, client: httpx.Client, database_url: str) -> None:
    study = _big_study(client)
    # Enough studies with long names and metrics that the default-width list passes the buffer.
    for i in range(320):
        small = _command_spec(f"s{i:03d}-" + "n" * 190)
        small["objective"]["metric"] = "valid/" + "m" * 190
        assert client.post(f"{API}/studies", json=small).status_code == 201
    claim = client.post(f"{API}/workers/claim", json={"worker_id": "w", "resources": {"cpus": 8, "gpus": 0}}).json()
    assert claim["study_id"] == study["id"], claim
    run_one(client, claim, valley(0.5))
    pipeline = {
        "name": "pipes",
        "description": LONG_TEXT,
        "baseline": {"params": {"learning_rate": 0.1}},
    }
    made = client.post(f"{API}/pipelines", json=pipeline)
    assert made.status_code == 201, made.text
    pipeline_id = made.json()["id"]
    opened = client.post(f"{API}/pipelines/{pipeline_id}/rounds", json={"goal": LONG_TEXT})
    assert opened.status_code == 201, opened.text
    round_id = opened.json()["id"]

    server = ["--server", live_server.url]
    sid, tid = str(study["id"]), str(claim["trial_id"])
    commands = [
        ["study", "list", "--limit", "1000"],
        ["study", "list", "--limit", "1000", "--json"],
        ["study", "show", sid],
        ["study", "show", sid, "--json"],
        ["study", "show", sid, "--spec"],
        ["study", "analyze", sid],
        ["study", "analyze", sid, "--json"],
        ["trial", "show", tid],
        ["trial", "show", tid, "--json"],
        ["pipeline", "list", "--json"],
        ["pipeline", "show", str(pipeline_id)],
        ["pipeline", "show", str(pipeline_id), "--json"],
        ["round", "show", str(round_id)],
        ["round", "show", str(round_id), "--json"],
    ]
    for args in commands:
        code, err, size = _piped([HPO, *args, *server])
        assert size > PIPE_BUFFER + HEAD_READ, (args, size)
        assert code == 0 and "Traceback" not in err and "BrokenPipe" not in err and not err, (args, code, err)

    # `hpo token list` reads the database itself; tokens come last, as the server demands one once any exists.
    db = Database(database_url)
    try:
        for i in range(700):
            auth.create_token(db, "read", f"t{i:03d} " + "n" * 190)
    finally:
        db.dispose()
    env = {**os.environ, "HPO_DATABASE_URL": database_url}
    code, err, size = _piped([HPO, "token", "list"], env=env)
    assert size > PIPE_BUFFER + HEAD_READ, size
    assert code == 0 and not err, (code, err)
