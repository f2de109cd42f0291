"""A worker on a read-only or full artifact root (docs/workers.md, "Worker health"), on a real
small tmpfs: it claims nothing while it cannot write, says so to the server, and an attempt that
failed because the disk filled up is returned as if never claimed, its files removed."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from hpo.policy import ExecutionPolicy
from hpo.settings import Settings
from hpo.worker.loop import Worker, WorkerOptions
from tests.conftest import LiveServer
from tests.worker.conftest import create_study, study_done, trials, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

FILLER = """
import json, os, pathlib, sys
out, marker = pathlib.Path(os.environ["HPO_OUT_DIR"]), pathlib.Path(sys.argv[1])
if not marker.exists():
    marker.write_text("filled")
    with open(out / "ballast.bin", "wb") as handle:
        handle.write(b"\\0" * (32 * 2**20))  # more than the disk holds: ENOSPC
with open(out / "metrics.jsonl", "a") as handle:
    handle.write(json.dumps({"step": 1, "name": "valid/error_rate", "value": 0.5}) + "\\n")
"""


@pytest.fixture
def small_disk() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="hpo-small-disk-"))
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)
        folder.rmdir()


def _remount(folder: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(folder)], check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root (CI runs as root)")
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_worker_on_a_read_only_or_full_disk_costs_no_attempt(
    ray_address: str, settings: Settings, small_disk: Path, tmp_path: Path
) -> None:
    script, marker = tmp_path / "filler.py", tmp_path / "filled"
    script.write_text(FILLER)
    prefix = (sys.executable, str(script))
    policy = ExecutionPolicy(command_prefixes=(prefix,))
    artifacts = small_disk / "artifacts"
    artifacts.mkdir()
    _remount(small_disk, "ro")
    with (
        LiveServer(
            Settings(database_url=settings.database_url, artifact_root=artifacts, execution_policy=policy)
        ) as live,
        httpx.Client(base_url=live.url, timeout=30) as http,
    ):
        spec = {
            "name": "disk",
            "num_trials": 1,
            "max_attempts": 3,
            "hyperparameters": [{"name": "lr", "role": "nuisance", "type": "float", "min": 0.01, "max": 0.1}],
            "trainer": {"command": [*prefix, str(marker)]},
        }
        study = create_study(http, spec)
        options = WorkerOptions(
            unconfined=True,
            server_url=live.url,
            artifact_root=artifacts,
            idle_poll_seconds=0.2,
            warm_up=False,
            policy=policy,
            worker_id="small-disk-worker",
            min_free_bytes=1 << 20,
            disk_check_seconds=0.3,
        )
        worker = Worker(options)
        thread = threading.Thread(target=worker.run, kwargs={"until": study_done(http, study["id"])}, daemon=True)
        thread.start()
        unhealthy = 'hpo_worker_healthy{worker="small-disk-worker"} 0'
        wait_until(lambda: unhealthy in http.get("/metrics").text, 60, "the worker to report its read-only disk")
        time.sleep(1.0)
        (trial,) = trials(http, study["id"])
        assert (trial["status"], trial["attempt"]) == ("pending", 0), "a worker on a read-only disk claimed"
        assert "Read-only file system" in http.get("/").text
        _remount(small_disk, "rw")
        thread.join(timeout=120)
        assert not thread.is_alive(), "the study never finished"
        (trial,) = trials(http, study["id"])
        metrics = http.get("/metrics").text
    assert marker.exists(), "the trial never filled the disk, so this test proves nothing"
    # The attempt the full disk ended was returned: the trial completed on its first counted attempt.
    assert (trial["status"], trial["attempt"], trial["error"]) == ("completed", 1, None), trial
    attempt = artifacts / "trials" / str(trial["id"]) / "attempt-1"
    assert not (attempt / "ballast.bin").exists(), "the returned attempt's files were left on the disk"
    assert 'hpo_worker_healthy{worker="small-disk-worker"} 1' in metrics
