"""A real two-node Ray cluster on this machine (`ray start --head` plus `ray start --address`, each
with its own temp folder and one CPU, token authentication on), and a study run through
`hpo worker --ray-address`: a 2-process DDP trial whose ranks land on both nodes. docs/workers.md
describes the same steps for people.

Bounded: every start and wait has a timeout, and the cluster's processes are killed by id, found by
their temp folders, whatever happens (never `ray stop`, which would stop every Ray on the machine)."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from hpo.settings import Settings
from tests.conftest import LiveServer, free_port
from tests.worker.conftest import REPO, create_study, study_done, trials

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

RAY = str(Path(sys.executable).parent / "ray")
HPO = str(Path(sys.executable).parent / "hpo")


@dataclass
class Cluster:
    address: str
    env: dict[str, str]


def _env(token: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=token,
        RAY_USAGE_STATS_ENABLED="0",
        # Ray's worker processes import the test's trainer module from the repository.
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )
    return env


def _ray_start(args: list[str], env: dict[str, str]) -> None:
    done = subprocess.run([RAY, "start", *args], env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def _kill_tree(markers: list[str]) -> None:
    """SIGKILL every process whose command line names one of `markers` (our temp folders), and
    their descendants (Ray's workers and agents)."""
    procs: dict[int, tuple[int, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        procs[int(entry)] = (ppid, cmd)
    tree = {pid for pid, (_, cmd) in procs.items() if any(m in cmd for m in markers)}
    grown = True
    while grown:
        children = {pid for pid, (ppid, _) in procs.items() if ppid in tree} - tree
        tree |= children
        grown = bool(children)
    for pid in tree:
        with contextlib.suppress(OSError):  # already gone
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[Cluster]:
    if not Path(RAY).exists():
        pytest.skip("the ray command is not installed")
    # Short temp folders: Ray's socket paths must stay under the 107-byte limit of AF_UNIX.
    head_dir = Path(f"/tmp/hpo-ray-{secrets.token_hex(4)}")
    node_dir = Path(f"/tmp/hpo-ray-{secrets.token_hex(4)}")
    env = _env(secrets.token_hex(16))
    port = free_port()
    common = ["--num-gpus=0", "--disable-usage-stats", "--num-cpus=1"]
    try:
        _ray_start(["--head", f"--port={port}", f"--temp-dir={head_dir}", "--include-dashboard=false", *common], env)
        _ray_start([f"--address=127.0.0.1:{port}", f"--temp-dir={node_dir}", *common], env)
        yield Cluster(f"127.0.0.1:{port}", env)
    finally:
        _kill_tree([str(head_dir), str(node_dir)])
        for folder in (head_dir, node_dir):
            subprocess.run(["rm", "-rf", str(folder)], timeout=30, check=False)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    """SQLite is enough here: the storage suite covers both databases."""
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'hpo.db'}", artifact_root=tmp_path / "artifacts")
    with LiveServer(settings) as live:
        yield live


def _ddp_spec() -> dict[str, Any]:
    return {
        "name": "two-nodes",
        "algorithm": "manual",
        "hyperparameters": [
            {"name": "learning_rate", "role": "nuisance", "type": "float", "min": 1e-4, "max": 1.0, "scale": "log"},
            {"name": "batch_size", "role": "fixed", "value": 32},
            {"name": "width", "role": "fixed", "value": 16},
        ],
        "trials": [{"params": {"learning_rate": 0.01}, "seed": 3}],
        "trainer": {"workload": "synthetic_mlp", "max_train_steps": 40, "eval_every_steps": 20},
        "resources": {"workers": 2, "cpus_per_worker": 1, "gpus_per_worker": 0},
    }


def test_a_ddp_trial_spans_both_nodes(two_nodes: Cluster, server: LiveServer, tmp_path: Path) -> None:
    http = httpx.Client(base_url=server.url, timeout=30)
    study = create_study(http, _ddp_spec())
    artifacts = tmp_path / "artifacts"
    worker = subprocess.Popen(
        [HPO, "worker", "--unconfined", "--server", f"127.0.0.1:{server.port}", "--ray-address", two_nodes.address]
        + ["--artifact-root", str(artifacts), "--trainer", "tests.worker.node_trainer:train"]
        + ["--no-warm-up", "--exit-when-idle", "3", "--log-level", "warning"],
        env=two_nodes.env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 150
        while not study_done(http, study["id"])() and time.monotonic() < deadline and worker.poll() is None:
            time.sleep(0.5)
        (trial,) = trials(http, study["id"])
        assert trial["status"] == "completed", (trial, _output(worker))
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
        output = _output(worker)
    nodes = {p.name: p.read_text() for p in artifacts.rglob("node-rank*.txt")}
    assert set(nodes) == {"node-rank0.txt", "node-rank1.txt"}, output
    assert nodes["node-rank0.txt"] != nodes["node-rank1.txt"], "both ranks ran on one node"


def test_a_wrong_ray_token_is_one_line(two_nodes: Cluster, server: LiveServer) -> None:
    env = {**two_nodes.env, "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    started = time.monotonic()
    done = subprocess.run(
        [HPO, "worker", "--unconfined", "--server", server.url, "--ray-address", two_nodes.address, "--no-warm-up"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines[0] == f"hpo worker: --ray-address {two_nodes.address}: Ray refused this process's token;"
    assert "RAY_AUTH_TOKEN" in lines[1] and len(lines) == 2
    assert time.monotonic() - started < 90


def _output(process: subprocess.Popen[str]) -> str:
    try:
        out, _ = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
    return out[-4000:]


def test_ctrl_c_stops_the_worker_with_130(two_nodes: Cluster, server: LiveServer) -> None:
    worker = subprocess.Popen(
        [HPO, "worker", "--unconfined", "--server", server.url, "--ray-address", two_nodes.address, "--no-warm-up"],
        env=two_nodes.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(8)  # joined and polling by now; a Ctrl-C while joining must end the same way
        worker.send_signal(signal.SIGINT)
        _, stderr = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 130, stderr[-3000:]
    assert "hpo worker: interrupted" in stderr and "Traceback" not in stderr
