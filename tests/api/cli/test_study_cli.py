"""`hpo study create|show|watch|analyze` against a live server (SQLite and Postgres)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from hpo.cli import main
from tests.conftest import LiveServer
from tests.server.analysis.protocol import run_pending
from tests.server.analysis.test_planted import spec, valley


def hpo(*args: str) -> int:
    return main(["study", *args])


def write_spec(tmp_path: Path, name: str, **overrides: object) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({**spec(name, num_trials=6), **overrides}))
    return path


def test_create_show_analyze(
    live_server: LiveServer, client: httpx.Client, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = ("--server", live_server.url)
    assert hpo("create", "-f", str(write_spec(tmp_path, "cli")), *server) == 0
    out = capsys.readouterr().out
    assert "created study 1 'cli': 6 trials laid out" in out
    run_pending(client, valley(1.4))
    assert hpo("show", "1", *server) == 0
    out = capsys.readouterr().out
    assert "study 1 'cli' [completed]" in out and "6/6 finished" in out and "best: trial" in out
    assert hpo("show", "1", "--spec", *server) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "cli"
    assert hpo("analyze", "1", "--json", *server) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["study_id"] == 1 and result["warnings"]
    assert hpo("analyze", "1", *server) == 0
    out = capsys.readouterr().out
    assert "arm" in out and "best trial" in out and "all trials" in out
    assert f"{len(result['warnings'])} warning(s):" in out
    assert all(f"- [{w['kind']}] {w['message']}" in out for w in result["warnings"])
    assert "caveat: batch_size is fixed at 128" in out


def test_rerun_from_the_tracking_sheet_command(
    live_server: LiveServer, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reproduction command of the tracking sheet works as written (with HPO_SERVER_URL)."""
    monkeypatch.setenv("HPO_SERVER_URL", live_server.url)
    assert hpo("create", "-f", str(write_spec(tmp_path, "original"))) == 0
    capsys.readouterr()
    assert hpo("show", "1", "--spec") == 0
    saved = tmp_path / "saved.json"
    saved.write_text(capsys.readouterr().out)
    assert hpo("create", "-f", str(saved), "--name", "original-rerun") == 0
    assert "created study 2 'original-rerun'" in capsys.readouterr().out


def test_watch_follows_progress_until_done(
    live_server: LiveServer, client: httpx.Client, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = ("--server", live_server.url)
    hpo("create", "-f", str(write_spec(tmp_path, "watched")), *server)
    assert hpo("watch", "1", "--interval", "0.05", "--timeout", "0.2", *server) == 1  # nothing runs yet
    capsys.readouterr()
    worker = threading.Thread(target=run_pending, args=(client, valley(0.5)))
    worker.start()
    try:
        assert hpo("watch", "1", "--interval", "0.05", "--timeout", "60", *server) == 0
    finally:
        worker.join(timeout=60)
    lines = [line for line in capsys.readouterr().out.splitlines() if line]
    assert lines[-1].startswith("watched [completed] [########################] 6/6 finished")


def test_user_errors_are_one_line_and_exit_2(
    live_server: LiveServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = ("--server", live_server.url)
    assert hpo("show", "42", *server) == 2
    assert "HTTP 404: study 42 not found" in capsys.readouterr().err
    bad = write_spec(tmp_path, "bad", num_trials=0)
    assert hpo("create", "-f", str(bad), *server) == 2
    assert "HTTP 422: num_trials" in capsys.readouterr().err
    assert hpo("create", "-f", str(tmp_path / "missing.json"), *server) == 2
    assert "cannot read" in capsys.readouterr().err
    (tmp_path / "junk.json").write_text("{not json")
    assert hpo("create", "-f", str(tmp_path / "junk.json"), *server) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert hpo("show", "1", "--server", "http://127.0.0.1:9") == 2
    assert "cannot reach the hpo server at http://127.0.0.1:9" in capsys.readouterr().err


def test_module_imports_only_the_standard_library() -> None:
    code = (
        "import sys, hpo.study_cli; heavy = [m for m in sys.modules if m.split('.')[0] in "
        "('httpx', 'numpy', 'fastapi', 'sqlalchemy', 'matplotlib', 'torch', 'ray')]; print(heavy)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"
