"""Any training script, unchanged (docs/scripts.md): hyperparameters into argv through placeholders
in `trainer.command`, metrics from what the script prints or logs to TensorBoard, and a trial that
never writes its objective failing with a reason that names it. Units first, then the real server,
a Ray worker and real script processes."""

from __future__ import annotations

import json
import math
import os
import shlex
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from hpo.collector_spec import CollectorSpec
from hpo.command_template import TemplateError, expand, template_errors
from hpo.policy import ExecutionPolicy
from hpo.settings import Settings
from hpo.worker.collectors import StdoutCollector, TensorBoardCollector
from hpo.worker.command import worker_dir
from hpo.worker.loop import Worker, WorkerOptions
from tests.conftest import LiveServer
from tests.worker.conftest import REPO, create_study, metric_steps, study_done, trials

BUILTINS = {"seed": "7", "out_dir": "/o", "resume_from": "", "config": "/o/hpo-config.json", "python": "/py"}


def test_placeholders_put_values_argparse_reads_back_exactly() -> None:
    params = {"learning_rate": 0.1 + 0.2, "batch_size": 64, "optimizer": "adam", "nesterov": True}
    argv = ["{python}", "train.py", "--lr={learning_rate}", "--bs", "{batch_size}", "{{literal}}", "--seed={seed}"]
    expanded = expand(argv, params, BUILTINS)
    assert expanded == ["/py", "train.py", "--lr=0.30000000000000004", "--bs", "64", "{literal}", "--seed=7"]
    assert float(expanded[2].removeprefix("--lr=")) == params["learning_rate"]
    assert expand(["{args}"], params, BUILTINS) == [
        "--batch_size=64",
        "--learning_rate=0.30000000000000004",
        "--nesterov=True",
        "--optimizer=adam",
    ]
    # A conditional hyperparameter that does not apply to this trial: empty, never a stale value.
    assert expand(["--momentum={momentum}"], {}, BUILTINS) == ["--momentum="]


def test_a_placeholder_naming_no_hyperparameter_is_refused() -> None:
    errors = template_errors(["python", "t.py", "--lr={lr}", "{out_dir}", "--x={args}", "{"], ["learning_rate"])
    assert [(e.index, str(e).split(" ")[0]) for e in errors] == [(2, "{lr}"), (4, "{args}"), (5, "a")]
    assert isinstance(errors[0], TemplateError) and "learning_rate" in str(errors[0])
    assert template_errors(["{python}", "t.py", "{args}", "--lr={learning_rate}"], ["learning_rate"]) == []


def test_the_stdout_collector_reads_key_value_lines_and_patterns(tmp_path: Path) -> None:
    out = tmp_path / "stdout.log"
    out.write_text(
        "loading data...\n"
        "step=5 train/loss=2.25 lr=0.1\n"
        "epoch 1: step=23 valid/loss=0.5 valid/error_rate=nan\n"
        "step=24 train/loss=1.5e-1"  # no newline yet: being written
    )
    collector = StdoutCollector(out)
    points = collector.collect()
    assert len(points) == 4
    assert points[:2] == [(5, "train/loss", 2.25), (5, "lr", 0.1)]
    assert points[3][:2] == (23, "valid/error_rate") and math.isnan(points[3][2])
    with out.open("a") as handle:
        handle.write("\n")
    assert collector.collect() == [(24, "train/loss", 0.15)]
    katib = StdoutCollector(out, r"(?P<name>[a-z/_]+)\s*=\s*(?P<value>[-+.\deE]+)")
    names = [name for _, name, _ in katib.collect()]
    assert "train/loss" in names and "step" not in names


def test_the_collector_setting_is_checked() -> None:
    assert CollectorSpec.parse("stdout").collector == "stdout"
    for bad in ("csv", {"collector": "stdout", "pattern": "(?P<name>x)"}, {"collector": "file", "dir": "tb"},
                {"collector": "tensorboard", "dir": "../up"}, {"collector": "stdout", "extra": 1}):  # fmt: skip
        with pytest.raises(ValueError):
            CollectorSpec.parse(bad)


def test_the_tensorboard_collector_reads_scalars_as_they_are_written(tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    from hpo.worker.trial_tree import TrialTree

    writer = SummaryWriter(str(tmp_path / "tb"))
    writer.add_scalar("train/loss", 0.75, 1)
    writer.flush()
    with TrialTree.open(tmp_path) as tree:
        collector = TensorBoardCollector(tree)
        assert collector.collect() == [(1, "train/loss", 0.75)]
        writer.add_scalar("train/loss", 0.5, 2)
        writer.add_scalar("valid/error_rate", 0.25, 2)
        writer.close()
        assert collector.collect() == [(2, "train/loss", 0.5), (2, "valid/error_rate", 0.25)]
        collector.close()


def test_the_tensorboard_collector_follows_no_link_the_trial_planted(tmp_path: Path) -> None:
    """An event file that is a link to a file elsewhere (the worker's token, another trial's events)
    is never read, nor a FIFO (which would block the supervisor)."""
    from torch.utils.tensorboard import SummaryWriter

    from hpo.worker.trial_tree import TrialTree

    elsewhere = tmp_path / "elsewhere"
    writer = SummaryWriter(str(elsewhere))
    writer.add_scalar("valid/error_rate", 0.01, 1)
    writer.close()
    (event,) = elsewhere.glob("events.out.tfevents.*")
    attempt = tmp_path / "attempt-1"
    (attempt / "tb").mkdir(parents=True)
    (attempt / "tb" / "events.out.tfevents.1.host.1.1").symlink_to(event)
    (attempt / "tb-link").symlink_to(elsewhere, target_is_directory=True)
    os.mkfifo(attempt / "tb" / "events.out.tfevents.2.host.2.2")
    with TrialTree.open(attempt) as tree:
        assert TensorBoardCollector(tree).collect() == []
        assert TensorBoardCollector(tree, "tb-link").collect() == []


# -- through the server and a real worker -------------------------------------------------------

EXAMPLES = REPO / "examples" / "scripts"
SCRIPTS = Path(__file__).parent / "scripts"


@pytest.fixture
def env(ray_address: str, tmp_path: Path) -> Any:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'hpo.db'}",
        artifact_root=tmp_path / "artifacts",
        lease_seconds=30,
        execution_policy=ExecutionPolicy(command_prefixes=(("{python}",),)),
    )
    with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        yield server, http, settings


def _run(server: LiveServer, http: httpx.Client, settings: Settings, spec: dict[str, Any], root: Path) -> int:
    study = create_study(http, spec)["id"]
    options = WorkerOptions(
        unconfined=True,
        server_url=server.url,
        artifact_root=settings.artifact_root,
        idle_poll_seconds=0.2,
        policy=ExecutionPolicy().merged(command_prefixes=(shlex.join(spec["trainer"]["command"][:2]),)),
        workdir_root=root,
        warm_up=False,
    )
    Worker(options).run(until=study_done(http, study))
    return int(study)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_argparse_example_runs_unchanged_with_placeholders_and_stdout(env: Any) -> None:
    server, http, settings = env
    spec = json.loads((EXAMPLES / "digits-argparse.json").read_text())
    spec["num_trials"] = 1
    study = _run(server, http, settings, spec, REPO)
    (trial,) = trials(http, study)
    assert trial["status"] == "completed", trial
    assert [s for s, _ in metric_steps(http, trial["id"], "valid/error_rate")] == [23, 46]
    assert [s for s, _ in metric_steps(http, trial["id"], "train/loss")] == list(range(5, 47, 5))
    assert trial["objective_value"] < 0.85, "better than chance (0.9)"
    attempt = settings.artifact_root / "trials" / str(trial["id"]) / "attempt-1"
    argv = (worker_dir(attempt) / "stdout.log").read_text()
    assert "step=46" in argv
    config = json.loads((worker_dir(attempt) / "hpo-config.json").read_text())
    assert config["params"]["learning_rate"] == trial["params"]["learning_rate"]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_tensorboard_script_reports_through_the_collector(env: Any) -> None:
    server, http, settings = env
    spec = {
        "name": "tb",
        "objective": {"metric": "valid/error_rate", "mode": "min"},
        "num_trials": 1,
        "hyperparameters": [{"name": "lr", "role": "nuisance", "type": "float", "min": 0.01, "max": 0.1}],
        "trainer": {
            "command": ["{python}", "tb_counter.py", "--lr={lr}", "--logdir={out_dir}/tb"],
            "metrics": {"collector": "tensorboard", "dir": "tb"},
            "workdir": "scripts",
            "max_train_steps": 30,
            "eval_every_steps": 10,
        },
        "resources": {"workers": 1, "cpus_per_worker": 1, "gpus_per_worker": 0},
    }
    study = _run(server, http, settings, spec, SCRIPTS.parent)
    (trial,) = trials(http, study)
    assert trial["status"] == "completed", trial["error"]
    assert [s for s, _ in metric_steps(http, trial["id"], "train/loss")] == list(range(1, 31))
    errors = metric_steps(http, trial["id"], "valid/error_rate")
    import math

    lr = trial["params"]["lr"]
    assert errors == [(s, pytest.approx(0.5 * math.exp(-lr * s), rel=1e-6)) for s in (10, 20, 30)]
    assert trial["unread_params"] == [] and trial["warnings"] == [], "lr is passed as a flag"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_script_that_never_writes_the_objective_fails_naming_it(env: Any) -> None:
    server, http, settings = env
    spec = {
        "name": "no-objective",
        "objective": {"metric": "valid/accuracy", "mode": "max"},
        "num_trials": 1,
        "max_failed_trials": 100,
        "hyperparameters": [{"name": "lr", "role": "nuisance", "type": "float", "min": 0.01, "max": 0.1}],
        "trainer": {
            "command": ["{python}", "tb_counter.py", "--lr={lr}", "--logdir={out_dir}", "--steps=10"],
            "metrics": "tensorboard",
            "workdir": "scripts",
            "max_train_steps": 10,
        },
        "resources": {"workers": 1, "cpus_per_worker": 1, "gpus_per_worker": 0},
    }
    study = _run(server, http, settings, spec, SCRIPTS.parent)
    (trial,) = trials(http, study)
    assert (trial["status"], trial["fail_kind"]) == ("failed", "config"), trial
    assert "'valid/accuracy'" in trial["error"] and "train/loss, valid/error_rate" in trial["error"]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_over_http_bad_placeholders_and_collectors_are_422s_naming_the_field(settings: Settings) -> None:
    allows = ExecutionPolicy(command_prefixes=(("{python}", "train.py"),))
    base = {
        "name": "t",
        "hyperparameters": [{"name": "learning_rate", "role": "nuisance", "type": "float", "min": 0.01, "max": 0.1}],
        "resources": {"workers": 1, "cpus_per_worker": 1, "gpus_per_worker": 0},
    }
    with LiveServer(_with(settings, allows)) as live, httpx.Client(base_url=live.url, timeout=30) as http:
        bad = http.post("/api/v1/studies", json={**base, "trainer": {"command": ["{python}", "train.py", "--lr={lr}"]}})
        assert bad.status_code == 422 and "trainer.command[2]" in bad.text and "learning_rate" in bad.text
        wrong = {"command": ["{python}", "train.py"], "metrics": {"collector": "stdout", "pattern": "("}}
        assert "trainer.metrics" in http.post("/api/v1/studies", json={**base, "trainer": wrong}).text
        good = {"command": ["{python}", "train.py", "--lr={learning_rate}", "{args}"], "metrics": "stdout"}
        created = http.post("/api/v1/studies", json={**base, "trainer": good})
        assert created.status_code == 201
        assert "unpassed_hyperparameter" not in {w["kind"] for w in created.json()["warnings"]}
        gamma = {"name": "gamma", "role": "nuisance", "type": "float", "min": 0.5, "max": 1.0}
        only_lr = {"command": ["{python}", "train.py", "--lr={learning_rate}"], "metrics": "stdout"}
        spec = {**base, "name": "u", "hyperparameters": [*base["hyperparameters"], gamma], "trainer": only_lr}
        warned = http.post("/api/v1/studies", json=spec).json()["warnings"]
        (unpassed,) = [w for w in warned if w["kind"] == "unpassed_hyperparameter"]
        assert "gamma" in unpassed["message"] and "learning_rate" not in unpassed["message"]


def _with(settings: Settings, policy: ExecutionPolicy) -> Settings:
    import dataclasses

    return dataclasses.replace(settings, execution_policy=policy)


def test_the_reproduce_command_of_a_command_trial_runs_it_by_hand(tmp_path: Path) -> None:
    """The dashboard's Reproduce for a command trial: its own argv with the values put in, in its
    workdir, with its HPO_CONFIG and HPO_OUT_DIR (hpo train refuses commands)."""
    import os
    import subprocess

    from hpo.server.api.routes.dashboard import reproduce_command

    spec = {
        "objective": {"metric": "valid/error_rate", "mode": "min"},
        "trainer": {
            "command": ["{python}", "counter.py", "--out={out_dir}", "--lr={learning_rate}", "{args}"],
            "workdir": "scripts",
            "max_train_steps": 20,
            "eval_every_steps": 10,
        },
    }
    command = reproduce_command(spec, {"learning_rate": 0.1, "step_seconds": 0.0}, 7, 42)
    env = {**os.environ, "HPO_WORKDIR_ROOT": str(Path(__file__).parent)}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # `python` is this venv's
    done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (command, done.stderr)
    assert "--lr=0.1" in done.stdout and f"--out={tmp_path}/trial-42-rerun" in done.stdout, done.stdout
    points = [json.loads(line) for line in (tmp_path / "trial-42-rerun" / "metrics.jsonl").read_text().splitlines()]
    assert [p["step"] for p in points if p["name"] == "train/loss"] == list(range(1, 21))
    assert json.loads((tmp_path / "trial-42.json").read_text())["seed"] == 7


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_hyperparameter_the_script_never_reads_is_a_warning_on_the_trial_and_the_study(env: Any) -> None:
    server, http, settings = env
    spec = {
        "name": "unread",
        "objective": {"metric": "valid/error_rate", "mode": "min"},
        "num_trials": 2,
        "hyperparameters": [
            {"name": "learning_rate", "role": "nuisance", "type": "float", "min": 0.01, "max": 0.1},
            {"name": "momentum", "role": "nuisance", "type": "float", "min": 0.5, "max": 0.99},
            {"name": "width", "role": "fixed", "value": 32},
        ],
        "trainer": {
            "command": ["{python}", "session_counter.py", "--width={width}"],
            "workdir": "scripts",
            "max_train_steps": 20,
            "eval_every_steps": 10,
        },
        "resources": {"workers": 1, "cpus_per_worker": 1, "gpus_per_worker": 0},
    }
    study = _run(server, http, settings, spec, SCRIPTS.parent)
    for trial in trials(http, study):
        assert trial["status"] == "completed", trial
        assert trial["unread_params"] == ["momentum"], (
            "learning_rate read through hpo.session(), width passed as a flag"
        )
        (warning,) = trial["warnings"]
        assert warning["kind"] == "unread_hyperparameter" and warning["message"].startswith("momentum never reached")
    analysis = http.get(f"/api/v1/studies/{study}/analysis").json()
    (unread,) = [w for w in analysis["warnings"] if w["kind"] == "unread_hyperparameter"]
    assert unread["params"] == {"momentum": 2} and "the study varies momentum" in unread["message"]
    page = http.get(f"/trials/{trials(http, study)[0]['id']}")
    assert page.status_code == 200 and 'id="trial-warnings"' in page.text and "momentum never reached" in page.text
