"""docs/rounds.md's two-round example on the built-in `digits` workload, walked with a real worker
(in-process, on the session's Ray instance) against a live server on SQLite. The doc's own files in
examples/rounds/ are loaded and cut down only in trial counts, steps and replica counts, so the
walk-through runs in about a minute and a half on 2 cores; every step the doc shows as `hpo ...` runs
through the CLI, the rest over HTTP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from hpo.cli import main
from hpo.settings import Settings
from hpo.worker.loop import Worker, WorkerOptions
from tests.conftest import LiveServer
from tests.worker.conftest import API, REPO, study_done, trials

EXAMPLES = REPO / "examples" / "rounds"
# The doc runs 300 steps, 8 trials in round 1 and 4 replicas of each side; these are the cut-down values.
STEPS, EVERY, ROUND1_TRIALS, REPLICAS = 100, 50, 4, 2


def example(name: str) -> dict[str, Any]:
    return dict(json.loads((EXAMPLES / name).read_text()))


@pytest.fixture
def env(ray_address: str, tmp_path: Path) -> Any:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'hpo.db'}", artifact_root=tmp_path / "artifacts")
    with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        yield server, http, settings


def run_worker(server: LiveServer, settings: Settings, until: Any) -> None:
    options = WorkerOptions(
        unconfined=True, server_url=server.url, artifact_root=settings.artifact_root, idle_poll_seconds=0.2
    )
    Worker(options).run(until=until)


def hpo(capsys: pytest.CaptureFixture[str], server: LiveServer, *argv: str) -> str:
    """`hpo ARGV --server URL`, which must succeed; answers what it printed."""
    capsys.readouterr()
    code = main([*argv, "--server", server.url])
    out = capsys.readouterr().out
    assert code == 0, (argv, out)
    return out


def write(tmp_path: Path, name: str, body: dict[str, Any]) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(body))
    return str(path)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_two_round_digits_walkthrough_of_docs_rounds_md(
    env: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server, http, settings = env

    # The pipeline: the doc's file, trained for fewer steps.
    pipeline_body = example("pipeline.json")
    original_lr = pipeline_body["baseline"]["params"]["learning_rate"]
    assert original_lr == 3e-4 and pipeline_body["trainer"]["workload"] == "digits"
    pipeline_body["trainer"].update(max_train_steps=STEPS, eval_every_steps=EVERY)
    out = hpo(capsys, server, "pipeline", "create", "-f", write(tmp_path, "pipeline.json", pipeline_body))
    assert out.startswith("created pipeline 1 'digits-mlp'"), out
    pipeline_id = 1

    # Round 1: the doc's learning-rate study names "round_id": 1, which the first round of a fresh server gets.
    out = hpo(capsys, server, "round", "create", str(pipeline_id), "--goal", "tune Adam's learning rate for 300 steps")
    assert out.startswith("opened round 1 (number 1 of pipeline 1)"), out
    round1_spec = example("round1-learning-rate.json")
    assert round1_spec["round_id"] == 1
    round1_spec["num_trials"] = ROUND1_TRIALS
    out = hpo(capsys, server, "study", "create", "-f", write(tmp_path, "round1.json", round1_spec))
    assert out.startswith(f"created study 1 'digits-r1-learning-rate': {ROUND1_TRIALS} trials laid out"), out
    study1 = http.get(f"{API}/studies/1").json()
    assert study1["spec"]["trainer"]["max_train_steps"] == STEPS, "the trainer settings come from the pipeline"
    fixed = {hp["name"]: hp for hp in study1["spec"]["hyperparameters"] if hp["role"] == "fixed"}
    assert set(fixed) == {"optimizer", "batch_size", "num_layers", "width", "weight_decay"}
    assert all(hp["source"] == "baseline" for hp in fixed.values())

    run_worker(server, settings, study_done(http, 1))
    statuses = [t["status"] for t in trials(http, 1)]
    assert statuses == ["completed"] * ROUND1_TRIALS, statuses

    # The round's candidate (its best trial) and evidence: no replicas yet, so the verdict is unknown.
    out = hpo(capsys, server, "round", "show", "1")
    assert "candidate: trial " in out and "differs from the baseline in: learning_rate=" in out, out
    assert "verdict: unknown: " in out, out
    rnd = http.get(f"{API}/rounds/1").json()
    best = min(trials(http, 1), key=lambda t: (t["objective_value"], t["id"]))
    candidate = rnd["candidate"]
    assert (candidate["trial_id"], candidate["study_id"]) == (best["id"], 1)
    assert candidate["objective"] == pytest.approx(best["objective_value"])
    assert candidate["params"]["learning_rate"] != original_lr
    assert rnd["evidence"]["verdict"] == "unknown"
    assert set(rnd["evidence"]["missing"]) == {"candidate replicas", "baseline replicas"}, rnd["evidence"]

    # Replicas of the candidate and of the baseline (POST /api/v1/rounds/1/replicas), run by the worker.
    made = json.loads(hpo(capsys, server, "round", "replicas", "1", "--count", str(REPLICAS), "--json"))
    assert made["candidate_trial_id"] == candidate["trial_id"]
    assert len(made["candidate_replica_ids"]) == len(made["baseline_trial_ids"]) == REPLICAS
    baseline_study = made["baseline_study_id"]
    assert baseline_study == 2

    def replicas_done() -> bool:
        return study_done(http, 1)() and study_done(http, baseline_study)()

    run_worker(server, settings, replicas_done)
    baseline_trials = trials(http, baseline_study)
    assert [t["status"] for t in baseline_trials] == ["completed"] * REPLICAS, baseline_trials
    assert all(t["params"]["learning_rate"] == original_lr for t in baseline_trials)

    out = hpo(capsys, server, "round", "show", "1")
    rnd = http.get(f"{API}/rounds/1").json()
    evidence = rnd["evidence"]
    for side in ("candidate", "baseline"):
        assert (evidence[side]["n"], evidence[side]["diverged"], evidence[side]["pending"]) == (REPLICAS, 0, 0)
        assert f"{side}: mean " in out and f"over {REPLICAS} runs, 0 diverged, 0 pending" in out, out
    assert evidence["verdict"] in {"better", "within_noise", "worse"}, evidence
    assert f"verdict: {evidence['verdict']}: " in out, out
    # Minimised error: positive when the candidate is better, as the doc's interval is.
    assert evidence["difference"] == pytest.approx(evidence["baseline"]["mean"] - evidence["candidate"]["mean"])

    # Decide: adopt on a `better` verdict; on any other, adopting needs --override and a note (409 without).
    note = "a 40x higher learning rate fits 300 steps"
    if evidence["verdict"] == "better":
        out = hpo(capsys, server, "round", "decide", "1", "--adopt", "--note", note)
        assert out.startswith("round 1: adopted (verdict better)"), out
    else:
        assert main(["round", "decide", "1", "--adopt", "--note", note, "--server", server.url]) == 2
        assert http.get(f"{API}/rounds/1").json()["decision"] is None, "a refused decision writes nothing"
        out = hpo(capsys, server, "round", "decide", "1", "--adopt", "--override", "--note", note)
        assert out.startswith(f"round 1: adopted (verdict {evidence['verdict']}, override)"), out
    new_lr = candidate["params"]["learning_rate"]
    assert f"launched trial {candidate['trial_id']}: learning_rate 0.0003 -> " in out, out

    # The baseline moved to the candidate's params and the launch is recorded.
    pipeline = http.get(f"{API}/pipelines/{pipeline_id}").json()
    assert pipeline["baseline"]["params"] == {**pipeline_body["baseline"]["params"], "learning_rate": new_lr}
    assert (pipeline["baseline"]["trial_id"], pipeline["baseline"]["round_id"]) == (candidate["trial_id"], 1)
    assert pipeline["baseline"]["objective"]["n"] == REPLICAS
    assert pipeline["baseline"]["objective"]["mean"] == pytest.approx(evidence["candidate"]["mean"])
    (launch,) = pipeline["launches"]
    assert (launch["round_id"], launch["trial_id"], launch["note"]) == (1, candidate["trial_id"], note)
    assert launch["params_changed"] == {"learning_rate": {"before": original_lr, "after": new_lr}}
    assert launch["evidence"]["verdict"] == evidence["verdict"]
    out = hpo(capsys, server, "pipeline", "show", str(pipeline_id))
    assert "learning_rate 0.0003 -> " in out and f"n={REPLICAS}" in out, out

    # Round 2: the doc's width study (round_id 2) starts from the new baseline.
    out = hpo(capsys, server, "round", "create", str(pipeline_id), "--goal", "does a wider hidden layer help?")
    assert out.startswith("opened round 2 (number 2 of pipeline 1)"), out
    round2_spec = example("round2-width.json")
    assert round2_spec["round_id"] == 2
    hpo(capsys, server, "study", "create", "-f", write(tmp_path, "round2.json", round2_spec))
    study3 = http.get(f"{API}/studies/3").json()
    assert study3["spec"]["round_id"] == 2
    fixed = {hp["name"]: hp for hp in study3["spec"]["hyperparameters"] if hp["role"] == "fixed"}
    assert set(fixed) == {"optimizer", "batch_size", "num_layers", "weight_decay"}
    assert all(hp["source"] == "baseline" for hp in fixed.values())
    # The doc's round-2 study re-tunes the learning rate; one that keeps it inherits the launched value.
    kept = {**round2_spec, "name": "digits-r2-width-only"}
    kept["hyperparameters"] = [hp for hp in round2_spec["hyperparameters"] if hp["name"] != "learning_rate"]
    hpo(capsys, server, "study", "create", "-f", write(tmp_path, "round2-kept.json", kept))
    study4 = http.get(f"{API}/studies/4").json()
    (lr,) = [hp for hp in study4["spec"]["hyperparameters"] if hp["name"] == "learning_rate"]
    assert (lr["role"], lr["value"], lr["source"]) == ("fixed", new_lr, "baseline"), lr
    assert {t["params"]["learning_rate"] for t in trials(http, 4)} == {new_lr}
    assert {t["params"]["width"] for t in trials(http, 4)} == {64, 256}
