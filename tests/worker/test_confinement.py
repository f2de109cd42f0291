"""Red team: a hostile *allowed* workload and a hostile *allowed* command, on a real Ray worker
against a real server, try each escape docs/security.md says is closed. Each test fails if the
escape works: a process that ran one trial's code running another's, a `setsid` daemon outliving
its attempt, a secret found in any readable /proc/*/environ or the token file, `RAY_*` or hpo's
variables in a trial's environment, a write into another trial's folder, a study's `trainer.env`
overriding what the worker sets or naming a variable that loads code."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hpo.policy import ExecutionPolicy
from hpo.server.auth import tokens as auth
from hpo.server.db import Database
from hpo.settings import Settings
from hpo.worker.loop import Worker, WorkerOptions
from tests.conftest import LiveServer
from tests.worker.conftest import API, REPO, metric_steps, study_done, trials, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

HOSTILE = Path(__file__).parent / "hostile"
ESCAPE = HOSTILE / "escape.py"


def _options(url: str, artifacts: Path, policy: ExecutionPolicy, **more: Any) -> WorkerOptions:
    return WorkerOptions(
        unconfined=True,
        server_url=url,
        artifact_root=artifacts,
        idle_poll_seconds=0.2,
        exit_when_idle_seconds=60,
        warm_up=False,
        max_trials=1,
        policy=policy,
        **more,
    )


def _study(name: str, trainer: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {
        "name": name,
        "num_trials": 2,
        "hyperparameters": [
            {"name": "learning_rate", "role": "nuisance", "type": "float", "min": 0.01, "max": 0.1, "scale": "log"}
        ],
        "trainer": trainer,
        "resources": {"workers": 1, "cpus_per_worker": 1, "gpus_per_worker": 0},
        **more,
    }


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_workload_that_patches_its_process_cannot_touch_the_next_studys_trials(
    ray_address: str, settings: Settings
) -> None:
    """Study A's allowed workload patches hpo's trainer and the worker's reporter at import; study
    B's built-in trials, run next by the same worker on the same Ray processes, must train for real."""
    policy = ExecutionPolicy(workload_globs=("tests.*",))
    with (
        LiveServer(dataclasses.replace(settings, execution_policy=policy)) as live,
        httpx.Client(base_url=live.url, timeout=30) as http,
    ):
        hostile = http.post(
            f"{API}/studies", json=_study("a", {"workload": "tests.worker.hostile.patcher:Workload"})
        ).json()
        honest = http.post(
            f"{API}/studies",
            json=_study("b", {"workload": "synthetic_mlp", "max_train_steps": 20, "eval_every_steps": 10}),
        ).json()
        options = _options(live.url, settings.artifact_root, policy)
        Worker(options).run(until=lambda: study_done(http, hostile["id"])() and study_done(http, honest["id"])())
        for trial in trials(http, hostile["id"]):
            assert trial["status"] == "failed", trial
        for trial in trials(http, honest["id"]):
            assert trial["status"] == "completed", trial
            losses = metric_steps(http, trial["id"], "train/loss")
            assert [step for step, _ in losses] == list(range(1, 21)), "the trial did not train every step"
            errors = [value for _, value in metric_steps(http, trial["id"], "valid/error_rate")]
            assert errors and 0.0 not in errors, errors
    log = [json.loads(line) for line in (settings.artifact_root / "hostile-patcher.log").read_text().splitlines()]
    events = {entry["event"] for entry in log}
    assert "patched" in events, "the hostile import never ran, so this test proves nothing"
    assert not events & {"fake_train", "token"}, log
    assert not [entry for entry in log if entry["event"] == "ray" and entry["connected"]], "trial code sat in Ray"


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_daemon_left_by_a_command_dies_with_its_attempt_and_its_files_are_sealed(
    ray_address: str, settings: Settings, tmp_path: Path
) -> None:
    victim = tmp_path / "victim.jsonl"
    prefix = (sys.executable, str(ESCAPE))
    policy = ExecutionPolicy(command_prefixes=(prefix,))
    with (
        LiveServer(dataclasses.replace(settings, execution_policy=policy)) as live,
        httpx.Client(base_url=live.url, timeout=30) as http,
    ):
        study = http.post(
            f"{API}/studies",
            json={**_study("daemon", {"command": [*prefix, "--daemon", str(victim)]}), "num_trials": 1},
        ).json()
        Worker(_options(live.url, settings.artifact_root, policy)).run(until=study_done(http, study["id"]))
        (trial,) = trials(http, study["id"])
        assert trial["status"] == "completed", trial
    attempt = settings.artifact_root / "trials" / str(trial["id"]) / "attempt-1"
    daemon = int((attempt / "daemon.pid").read_text())
    assert victim.exists(), "the daemon never ran, so this test proves nothing"
    assert not _alive(daemon), f"the trial's daemon {daemon} outlived its attempt"
    size = victim.stat().st_size
    time.sleep(0.5)
    assert victim.stat().st_size == size, "something of the trial still writes"
    for path in [attempt, *attempt.rglob("*")]:
        assert not path.lstat().st_mode & 0o222, f"{path} is still writable after the attempt"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return state[state.rfind(b")") + 2 : state.rfind(b")") + 3] != b"Z"


# -- as another user: credentials and other trials' files ---------------------------------------

RUN_AS = "20000-20003"
SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.fixture
def shared_folder() -> Iterator[Path]:
    """A folder the trial users may enter (pytest's own tmp_path is private to root), holding the
    hostile script, the artifact root and the token file."""
    folder = Path(tempfile.mkdtemp(prefix="hpo-confine-", dir="/tmp"))
    folder.chmod(0o755)
    shutil.copy(ESCAPE, folder / "escape.py")
    (folder / "escape.py").chmod(0o644)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="--run-as needs root (CI runs as root)")
@pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason=f"the trial users' Python {SYSTEM_PYTHON}")
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_trial_run_as_another_user_reads_no_credential_and_writes_no_other_trial(
    settings: Settings, shared_folder: Path
) -> None:
    writer, worker_token, token_file = _tokens(settings, shared_folder)
    canaries = {
        "HPO_API_TOKEN": worker_token,
        "HPO_SESSION_SECRET": "session-secret-canary-0123456789abcdef",
        "RAY_AUTH_TOKEN": "ray-auth-token-canary",
        "AWS_SECRET_ACCESS_KEY": "aws-secret-canary",
    }
    prefix = [SYSTEM_PYTHON, str(shared_folder / "escape.py")]
    policy = ExecutionPolicy(command_prefixes=(tuple(prefix),))
    spec = _study("creds", {"command": prefix})
    spec["hyperparameters"].append({"name": "token_file", "role": "fixed", "value": str(token_file)})
    with (
        LiveServer(dataclasses.replace(settings, execution_policy=policy)) as live,
        httpx.Client(base_url=live.url, timeout=30, headers={"Authorization": f"Bearer {writer}"}) as http,
    ):
        study = http.post(f"{API}/studies", json=spec)
        assert study.status_code == 201, study.text
        worker = _start_cli_worker(live.url, shared_folder, token_file, prefix, canaries)
        try:
            time.sleep(3)  # re-executed by now, if it was going to be
            environ = Path(f"/proc/{worker.pid}/environ").read_bytes().decode("utf-8", "replace")
            assert worker_token not in environ, "the worker's token is in its /proc/<pid>/environ"
            wait_until(study_done(http, study.json()["id"]), 150, "the study to finish")
        finally:
            worker.send_signal(signal.SIGTERM)
            output = worker.communicate(timeout=60)[0]
        done = trials(http, study.json()["id"])
    assert [t["status"] for t in done] == ["completed", "completed"], (done, output)
    for trial in done:
        findings_path = shared_folder / "artifacts" / "trials" / str(trial["id"]) / "attempt-1" / "findings.json"
        text = findings_path.read_text()
        findings = json.loads(text)
        assert 20000 <= findings["uid"] <= 20003, findings["uid"]
        assert findings["proc"], "the scan read nothing at all, so it proves nothing"
        for name, secret in canaries.items():
            assert secret not in text, f"trial {trial['id']} found {name}"
        assert findings["token_file"] is None, "the trial read the worker's token file"
        environment = findings["environment"]
        leaked = [n for n in environment if n.startswith(("RAY_", "HPO_")) and n not in ("HPO_CONFIG", "HPO_OUT_DIR")]
        assert not leaked, leaked
        assert findings["written"] == [], f"trial {trial['id']} wrote into other trials' folders"
    # The second trial ran after the first (max one at a time) and so had its folder to attack.
    first = shared_folder / "artifacts" / "trials" / str(done[0]["id"]) / "attempt-1"
    assert not (first / "planted.txt").exists()


def _tokens(settings: Settings, folder: Path) -> tuple[str, str, Path]:
    """A write token for the test, and a worker token in a 0600 file (the worker's --token-file)."""
    db = Database(settings.database_url)
    db.upgrade()
    _, writer = auth.create_token(db, "write")
    _, worker_token = auth.create_token(db, "worker")
    db.dispose()
    token_file = folder / "worker.token"
    token_file.write_text(worker_token)
    token_file.chmod(0o600)
    return writer, worker_token, token_file


def _start_cli_worker(
    url: str, folder: Path, token_file: Path, prefix: list[str], canaries: dict[str, str]
) -> subprocess.Popen[str]:
    env = {**os.environ, **canaries, "PYTHONPATH": str(REPO)}
    command = [
        str(Path(sys.executable).parent / "hpo"),
        "worker",
        "--server",
        url,
        "--num-cpus",
        "1",
        "--max-trials",
        "1",
        "--run-as",
        RUN_AS,
        "--token-file",
        str(token_file),
        "--allow-command",
        " ".join(prefix),
        "--artifact-root",
        str(folder / "artifacts"),
        "--workdir-root",
        str(folder),
        "--no-warm-up",
    ]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


# -- trainer.env ------------------------------------------------------------------------------

ALWAYS_REFUSED = ["OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "MASTER_PORT", "RANK", "RAY_ADDRESS", "HPO_OUT_DIR"]
CODE_LOADING = [
    "GIT_CONFIG_KEY_0",
    "GIT_SSH_COMMAND",
    "TAR_OPTIONS",
    "PAGER",
    "OPENSSL_CONF",
    "NCCL_NET_PLUGIN",
    "http_proxy",
    "LD_PRELOAD",
]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_specs_env_may_neither_override_the_worker_nor_load_code(settings: Settings) -> None:
    prefix = ("python", "train.py")
    allows_git = ExecutionPolicy(command_prefixes=(prefix,), env_globs=("GIT_*", "*"))
    for policy, refused in (
        (ExecutionPolicy(command_prefixes=(prefix,)), ALWAYS_REFUSED + CODE_LOADING),
        (allows_git, ALWAYS_REFUSED),
    ):
        with (
            LiveServer(dataclasses.replace(settings, execution_policy=policy)) as live,
            httpx.Client(base_url=live.url, timeout=30) as http,
        ):
            for name in refused:
                spec = _study("env", {"command": list(prefix), "env": {name: "1"}})
                response = http.post(f"{API}/studies", json=spec)
                assert response.status_code == 422, (name, response.text)
                assert f"trainer.env.{name}" in response.text, response.text
            harmless = _study(f"env-{len(refused)}", {"command": list(prefix), "env": {"WANDB_MODE": "offline"}})
            assert http.post(f"{API}/studies", json=harmless).status_code == 201
            if policy is allows_git:
                opted_in = _study("env-opted-in", {"command": list(prefix), "env": {"GIT_CONFIG_KEY_0": "core.pager"}})
                assert http.post(f"{API}/studies", json=opted_in).status_code == 201


# -- the supervisor against its own trial (run as root under --run-as, as in CI) -------------------

ATTACKS = HOSTILE / "attacks.py"
RANGE = range(20000, 20004)


@pytest.mark.skipif(os.geteuid() != 0, reason="--run-as needs root (CI runs as root)")
@pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason=f"the trial users' Python {SYSTEM_PYTHON}")
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_trial_cannot_turn_its_root_supervisor_against_the_node(settings: Settings, shared_folder: Path) -> None:
    """Each escape of a root supervisor that follows the trial's paths, or outlives nothing but a
    /proc scan, or sets no limit: every one fails under `--run-as FIRST-LAST`."""
    from hpo.worker.containment import alive_of_uid

    shutil.copy(ATTACKS, shared_folder / "attacks.py")
    shutil.copy(HOSTILE / "hopper.py", shared_folder / "hopper.py")
    writer, worker_token, token_file = _tokens(settings, shared_folder)
    # Root's own: a file in a folder only root may enter, and another trial's sealed checkpoints.
    private = shared_folder / "root-only"
    private.mkdir(mode=0o700)
    victim = private / "victim.jsonl"
    victim.write_text("root's line\n")
    victim.chmod(0o600)
    sealed = shared_folder / "sealed-checkpoints"
    sealed.mkdir()
    for step in range(1, 6):
        (sealed / f"step-{step}.pt").write_text(f"checkpoint {step}")
        (sealed / f"step-{step}.pt").chmod(0o444)
    sealed.chmod(0o555)
    hops = shared_folder / "hops"
    hops.mkdir(mode=0o777)
    hops.chmod(0o777)
    prefix = [SYSTEM_PYTHON, str(shared_folder / "attacks.py")]
    policy = ExecutionPolicy(command_prefixes=(tuple(prefix),))
    fixed = {
        "token_file": str(token_file),
        "victim": str(victim),
        "victim_checkpoints": str(sealed),
        "beat": str(hops / "beat"),
        "ray_parent": str(Path(tempfile.gettempdir()) / "hpo-ray"),
    }
    attacks = _study("attacks", {"command": prefix, "metrics": "stdout", "keep_best_checkpoints": 1})
    attacks.update(num_trials=1, max_attempts=1)
    kinds = ["links", "collector", "checkpoints", "hopper"]
    attacks["hyperparameters"] += [
        {"name": "attack", "role": "scientific", "type": "categorical", "values": kinds},
        *({"name": name, "role": "fixed", "value": value} for name, value in fixed.items()),
    ]
    limits = _study("limits", {"command": prefix}, num_trials=1, max_attempts=1)
    limits["resources"].update(max_processes=40, memory_gb=0.25)
    limits["hyperparameters"].append({"name": "attack", "role": "fixed", "value": "limits"})
    with (
        LiveServer(dataclasses.replace(settings, execution_policy=policy)) as live,
        httpx.Client(base_url=live.url, timeout=30, headers={"Authorization": f"Bearer {writer}"}) as http,
    ):
        ids = []
        for spec in (attacks, limits):
            response = http.post(f"{API}/studies", json=spec)
            assert response.status_code == 201, response.text
            ids.append(response.json()["id"])
        worker = _start_cli_worker(live.url, shared_folder, token_file, prefix, {})
        try:
            for study_id in ids:
                wait_until(study_done(http, study_id), 180, "the hostile studies to finish")
        finally:
            worker.send_signal(signal.SIGTERM)
            output = worker.communicate(timeout=60)[0]
            (hops / "stop").write_text("")
        done = {t["params"]["attack"]: t for study_id in ids for t in trials(http, study_id)}
        details = {attack: http.get(f"{API}/trials/{t['id']}").text for attack, t in done.items()}
        collected = metric_steps(http, done["collector"]["id"], "valid/error_rate")
    assert worker_token not in output, "the worker logged its token"
    for attack, text in details.items():
        assert worker_token not in text, f"the {attack} trial's record quotes the worker's token"

    def findings(attack: str) -> dict[str, Any]:
        folder = shared_folder / "artifacts" / "trials" / str(done[attack]["id"]) / "attempt-1"
        return dict(json.loads((folder / "findings.json").read_text()))

    # 1. Failure reasons quote the worker's own capture of stderr, never a file the trial replaced.
    assert done["links"]["status"] == "failed", done["links"]
    assert "an honest line of stderr" in details["links"], details["links"]
    links = findings("links")
    assert links["uid"] in RANGE
    assert not links["worker_dir_writable"] and not links["worker_stderr_writable"]
    assert not links["worker_stderr_replaced"], "the trial replaced the worker's record of its stderr"
    assert not links["ray_session_listed"], "the trial entered the folder of the worker's Ray session"
    # 2. No root write through a link; the collected point still counts.
    assert done["collector"]["status"] == "completed", done["collector"]
    assert victim.read_text() == "root's line\n", "root appended the trial's points to a root-only file"
    assert sorted(p.name for p in private.iterdir()) == ["victim.jsonl"]
    assert collected == [(1, 0.25)]
    # 4. Retention deletes nothing outside the trial's own checkpoints.
    assert done["checkpoints"]["status"] == "completed", done["checkpoints"]
    assert sorted(p.name for p in sealed.iterdir()) == [f"step-{s}.pt" for s in range(1, 6)]
    # 3. Nothing of an attempt outlives it, hopper included.
    assert done["hopper"]["status"] == "completed", done["hopper"]
    assert (hops / "beat").exists(), "the hopper never ran, so this test proves nothing"
    size = (hops / "beat").stat().st_size
    time.sleep(1.0)
    assert (hops / "beat").stat().st_size == size, "the hopper outlived its attempt"
    assert [pid for uid in RANGE for pid in alive_of_uid(uid)] == [], "a trial's process outlived its attempt"
    # 5. Bounded: processes by the study's max_processes, memory by its memory_gb.
    bounded = findings("limits")
    assert 0 < bounded["forked"] < 40, bounded
    assert bounded.get("allocated_mb", 0) < 512, bounded
    assert done["limits"]["status"] == "failed", done["limits"]
