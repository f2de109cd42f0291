"""Which trials count (docs/analysis.md, "Which trials count") on real runs: a short study of the
built-in `digits` workload with learning rates wide enough to diverge, and a command-trial study of
the example script (examples/scripts/ digits_plain.py, which reports no per-class counts), each run
by the real worker. The test counts the failed runs itself from what each trial logged (its status,
its last validation error against chance 0.9) and asserts the analysis judges exactly those
infeasible: every collapsed trial counted, none that learned."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from hpo.policy import ExecutionPolicy
from hpo.settings import Settings
from hpo.worker.loop import Worker, WorkerOptions
from tests.conftest import ON_POSTGRES_ONLY, LiveServer
from tests.worker.conftest import API, REPO, create_study, metric_steps, study_done, trials

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

# A 10-class error rate within this of chance (0.9) at the end is a collapsed run; below LEARNED it learned.
COLLAPSED, LEARNED = 0.85, 0.5
RESOURCES = {"workers": 1, "cpus_per_worker": 1, "gpus_per_worker": 0}
LEARNING_RATE = {"name": "learning_rate", "role": "nuisance", "type": "float", "min": 0.03, "max": 30.0, "scale": "log"}


@pytest.fixture
def env(ray_address: str, database_url: str, tmp_path: Path) -> Any:
    policy = ExecutionPolicy(command_prefixes=(("python",), (sys.executable,)))
    settings = Settings(
        database_url=database_url, artifact_root=tmp_path / "artifacts", lease_seconds=30, execution_policy=policy
    )
    with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        yield server, http, settings


def run_study(env: Any, spec: dict[str, Any]) -> int:
    server, http, settings = env
    study = create_study(http, spec)
    prefixes = (shlex.join(spec["trainer"]["command"][:2]),) if "command" in spec["trainer"] else ()
    options = WorkerOptions(
        unconfined=True,
        server_url=server.url,
        artifact_root=settings.artifact_root,
        idle_poll_seconds=0.2,
        policy=ExecutionPolicy().merged(command_prefixes=prefixes),
        workdir_root=REPO,
        warm_up=False,
    )
    Worker(options).run(until=study_done(http, study["id"]))
    return int(study["id"])


def failed_runs(http: httpx.Client, study_id: int) -> tuple[set[int], set[int]]:
    """(trials that failed: infeasible, or completed at chance; trials that learned), from what
    each trial logged, independently of the analysis."""
    failed, learned = set(), set()
    for trial in trials(http, study_id):
        if trial["status"] == "infeasible":
            failed.add(trial["id"])
            continue
        assert trial["status"] == "completed", trial
        last = metric_steps(http, trial["id"], "valid/error_rate")[-1][1]
        if last >= COLLAPSED:
            failed.add(trial["id"])
        elif last < LEARNED:
            learned.add(trial["id"])
    return failed, learned


def check(http: httpx.Client, study_id: int) -> dict[str, Any]:
    failed, learned = failed_runs(http, study_id)
    result = http.get(f"{API}/studies/{study_id}/analysis").json()
    judged = set(result["infeasible"]["trial_ids"])
    assert failed <= judged, f"collapsed or failed trials not counted: {failed - judged}"
    assert not judged & learned, f"trials that learned judged infeasible: {judged & learned}"
    collapsed = {d["trial_id"] for d in result["infeasible"]["diverged"]}
    assert collapsed, "the study has a completed trial that collapsed (else it tests nothing)"
    assert learned, "the study has trials that learned (else no false alarm is possible)"
    assert result["arms"][0]["best_trial_id"] in learned
    return result


@ON_POSTGRES_ONLY
def test_a_digits_study_with_learning_rates_that_diverge(env: Any) -> None:
    spec = {
        "name": "real-digits-diverge",
        "objective": {"metric": "valid/error_rate", "mode": "min"},
        "num_trials": 8,
        "hyperparameters": [
            LEARNING_RATE,
            {"name": "optimizer", "role": "fixed", "value": "nesterov"},
            {"name": "momentum", "role": "fixed", "value": 0.9},
            {"name": "batch_size", "role": "fixed", "value": 64},
        ],
        "trainer": {"workload": "digits", "max_train_steps": 100, "eval_every_steps": 25},
        "resources": RESOURCES,
        "max_attempts": 1,
    }
    study_id = run_study(env, spec)
    result = check(env[1], study_id)
    assert "infeasible" in {w["kind"] for w in result["warnings"]}


@ON_POSTGRES_ONLY
def test_a_study_of_the_example_script_counts_every_collapsed_trial(env: Any) -> None:
    spec = {
        "name": "real-script-collapse",
        "objective": {"metric": "valid/error_rate", "mode": "min"},
        "num_trials": 6,
        "hyperparameters": [LEARNING_RATE, {"name": "batch_size", "role": "fixed", "value": 64}],
        "trainer": {
            "command": [sys.executable, "digits_plain.py", "--epochs", "2"],
            "workdir": "examples/scripts",
            "max_train_steps": 46,
            "eval_every_steps": 23,
        },
        "resources": RESOURCES,
        "max_attempts": 1,
    }
    study_id = run_study(env, spec)
    result = check(env[1], study_id)
    reasons = {d["reason"].split(":")[0] for d in result["infeasible"]["diverged"]}
    assert reasons <= {"training loss ends no better than its initial value", "training loss diverged"}


def seed_study(name: str, *, fixed_seed: bool) -> dict[str, Any]:
    """The example argparse script (examples/scripts/digits_argparse.py) through `trainer.command`
    placeholders, two arms by hidden width, one epoch; `fixed_seed` passes its `--fixed-seed`, so
    it seeds itself with a constant and ignores `--seed={seed}`, as the issue's script did. The
    objective is the validation loss: continuous, so runs that use their seeds never tie."""
    command = [sys.executable, "digits_argparse.py", "--lr={learning_rate}", "--hidden={hidden}", "--seed={seed}"]
    return {
        "name": name,
        "objective": {"metric": "valid/loss", "mode": "min"},
        "num_trials": 1,
        "hyperparameters": [
            {"name": "hidden", "role": "scientific", "type": "categorical", "values": [16, 64]},
            {"name": "learning_rate", "role": "fixed", "value": 0.2},
        ],
        "trainer": {
            "command": [*command, "--epochs", "1", *(["--fixed-seed"] if fixed_seed else [])],
            "metrics": "stdout",
            "workdir": "examples/scripts",
            "max_train_steps": 23,
            "eval_every_steps": 23,
        },
        "resources": RESOURCES,
        "max_attempts": 1,
    }


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_replicas_of_a_script_that_ignores_the_seed_give_no_verdict(env: Any) -> None:
    """Replicas that cannot differ (docs/analysis.md, "Noise"): the example script in its mode that
    ignores the seed gets `seed_ignored` and no `different` verdict; with the seed passed through,
    the same study gets a verdict. One real worker runs both studies: each arm's trial with 1
    replica (seed ignored: one identical replica already tells) or 2 (seed used: the Welch
    comparison needs two per arm)."""
    server, http, settings = env
    studies = {}
    for fixed, count in ((True, 1), (False, 2)):
        study = create_study(http, seed_study(f"real-seed-{'fixed' if fixed else 'passed'}", fixed_seed=fixed))
        for trial in trials(http, study["id"]):
            reply = http.post(f"{API}/trials/{trial['id']}/replicas", json={"count": count})
            assert reply.status_code == 201, reply.text
        studies[fixed] = study["id"]
    options = WorkerOptions(
        unconfined=True,
        server_url=server.url,
        artifact_root=settings.artifact_root,
        idle_poll_seconds=0.2,
        policy=ExecutionPolicy().merged(command_prefixes=(shlex.join([sys.executable, "digits_argparse.py"]),)),
        workdir_root=REPO,
        warm_up=False,
    )
    Worker(options).run(until=lambda: all(study_done(http, s)() for s in studies.values()))
    results = {}
    for fixed, study_id in studies.items():
        runs = trials(http, study_id)
        assert [t["status"] for t in runs] == ["completed"] * len(runs), runs
        results[fixed] = http.get(f"{API}/studies/{study_id}/analysis").json()
    ignored, passed = results[True], results[False]
    # the seed ignored: every run of an arm returned the same value at the same step
    for arm in ignored["arms"]:
        assert arm["seed_ignored"] is True and arm["replica_std"] is None, arm
        assert arm["replica_values"] == [arm["best_value"]]
    assert ignored["comparison"]["verdict"] == "unknown" and ignored["comparison"]["p_value"] is None
    assert sorted(ignored["comparison"]["seed_ignored_arms"]) == ["hidden=16", "hidden=64"]
    assert [w["kind"] for w in ignored["warnings"] if w["kind"] == "seed_ignored"] == ["seed_ignored"] * 2
    # the seed passed through: replicas differ, the comparison runs and gives a verdict
    assert all(a["seed_ignored"] is False and a["replica_std"] > 0 for a in passed["arms"]), passed["arms"]
    assert passed["comparison"]["verdict"] in ("different", "within_noise"), passed["comparison"]
    assert passed["comparison"]["method"] == "welch" and passed["comparison"]["p_value"] is not None
    assert "seed_ignored" not in {w["kind"] for w in passed["warnings"]}
