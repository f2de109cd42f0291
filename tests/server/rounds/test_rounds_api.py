"""Pipelines, rounds and launches over real HTTP (docs/rounds.md), on SQLite and Postgres. Trials
are planted through the worker protocol (tests/server/analysis/protocol.py), so a round's evidence
is decided by known responses and seeds, in seconds."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from hpo.cli import main
from hpo.server.auth import tokens as auth
from hpo.server.db import Database
from hpo.settings import Settings
from tests.conftest import LiveServer
from tests.server.analysis import planted
from tests.server.analysis.protocol import Outcome, run_pending

API = "/api/v1"
BASELINE = {"learning_rate": 0.1, "weight_decay": 1e-4, "batch_size": 64}


def pipeline_body(name: str = "mlp", **extra: Any) -> dict[str, Any]:
    body = {
        "name": name,
        "description": "the MLP being improved",
        "objective": {"metric": "valid/error_rate", "mode": "min"},
        "trainer": {"workload": "synthetic_mlp", "max_train_steps": 2000, "eval_every_steps": 100},
        "baseline": {"params": dict(BASELINE)},
    }
    body.update(extra)
    return body


def make_pipeline(client: httpx.Client, name: str = "mlp") -> dict[str, Any]:
    reply = client.post(f"{API}/pipelines", json=pipeline_body(name))
    assert reply.status_code == 201, reply.text
    return reply.json()


def make_round(client: httpx.Client, pipeline_id: int, goal: str = "tune the learning rate") -> dict[str, Any]:
    reply = client.post(f"{API}/pipelines/{pipeline_id}/rounds", json={"goal": goal, "kind": "improve"})
    assert reply.status_code == 201, reply.text
    return reply.json()


def lr_sweep(round_id: int, name: str = "lr-sweep", num_trials: int = 8) -> dict[str, Any]:
    return {
        "name": name,
        "round_id": round_id,
        "num_trials": num_trials,
        "hyperparameters": [
            {"name": "learning_rate", "role": "nuisance", "type": "float", "min": 1e-3, "max": 1.0, "scale": "log"}
        ],
    }


def valley(config: dict[str, Any], *, flat: bool = False, diverge: set[int] | None = None) -> Outcome:
    """Validation error with a valley at learning rate 0.01 (flat: none), trial variance from the
    training seed (std ~0.003); trials whose id is in `diverge` blow up."""
    if diverge and config["trial_id"] in diverge:
        return Outcome(fail="diverged: loss is NaN", fail_step=300)
    lr = config["params"]["learning_rate"]
    level = 0.1 if flat else planted.response(math.log10(lr), -2.0)
    level += 0.003 * np.random.default_rng(config["seed"]).normal()
    valid, train = planted.clean(config["seed"], level=level, noise=0.0005)
    return Outcome({"valid/error_rate": valid, "train/loss": train})


def test_pipeline_round_and_a_round_study_start_from_the_baseline(client: httpx.Client) -> None:
    pipeline = make_pipeline(client)
    assert pipeline["baseline"] == {"params": BASELINE, "trial_id": None, "round_id": None, "objective": None}
    assert pipeline["launches"] == [] and pipeline["rounds"] == []
    rnd = make_round(client, pipeline["id"])
    assert (rnd["number"], rnd["kind"], rnd["status"], rnd["pipeline_id"]) == (1, "improve", "open", pipeline["id"])

    spec = lr_sweep(rnd["id"])
    spec["trainer"] = {"max_train_steps": 1500}  # the study's own setting wins over the pipeline's
    reply = client.post(f"{API}/studies", json=spec)
    assert reply.status_code == 201, reply.text
    study = reply.json()
    stored = study["spec"]
    assert stored["round_id"] == rnd["id"] and stored["pipeline_id"] == pipeline["id"]
    assert stored["trainer"]["max_train_steps"] == 1500 and stored["trainer"]["eval_every_steps"] == 100
    assert stored["trainer"]["workload"] == "synthetic_mlp"
    fixed = {hp["name"]: hp for hp in stored["hyperparameters"] if hp["role"] == "fixed"}
    assert set(fixed) == {"weight_decay", "batch_size"}  # learning_rate is the study's own
    assert all(hp["source"] == "baseline" for hp in fixed.values())
    assert fixed["weight_decay"]["value"] == 1e-4 and fixed["batch_size"]["value"] == 64
    trials = client.get(f"{API}/studies/{study['id']}/trials").json()["items"]
    assert len(trials) == 8
    assert all(t["params"]["batch_size"] == 64 and t["params"]["weight_decay"] == 1e-4 for t in trials)
    assert len({t["params"]["learning_rate"] for t in trials}) == 8

    again = client.get(f"{API}/pipelines/{pipeline['id']}").json()
    assert [r["study_ids"] for r in again["rounds"]] == [[study["id"]]]
    listed = client.get(f"{API}/pipelines").json()
    assert listed["total"] == 1 and listed["items"][0]["round_count"] == 1


def test_bad_input_is_refused_and_nothing_is_half_written(client: httpx.Client) -> None:
    pipeline = make_pipeline(client)
    other = make_pipeline(client, "other")
    rnd = make_round(client, pipeline["id"])
    assert client.post(f"{API}/pipelines", json=pipeline_body()).status_code == 409
    typo = pipeline_body("typo", baseline={"params": {"learning_rat": 0.1}})
    reply = client.post(f"{API}/pipelines", json=typo)
    assert reply.status_code == 422 and reply.json()["detail"][0]["field"] == "baseline.params.learning_rat"
    assert client.post(f"{API}/pipelines", json={"name": "x"}).status_code == 422
    assert client.get(f"{API}/pipelines/999").status_code == 404
    assert client.get(f"{API}/rounds/999").status_code == 404
    assert client.post(f"{API}/pipelines/999/rounds", json={"goal": "g"}).status_code == 404
    assert client.post(f"{API}/pipelines/{pipeline['id']}/rounds", json={"goal": "g", "kind": "x"}).status_code == 422

    unknown = client.post(f"{API}/studies", json=lr_sweep(999))
    assert unknown.status_code == 422 and "round_id" in unknown.text and "no round 999" in unknown.text
    foreign = client.post(f"{API}/studies", json={**lr_sweep(rnd["id"]), "pipeline_id": other["id"]})
    assert foreign.status_code == 422 and foreign.json()["detail"][0]["field"] == "round_id"
    assert f"pipeline {pipeline['id']}" in foreign.json()["detail"][0]["reason"]
    objective = client.post(f"{API}/studies", json={**lr_sweep(rnd["id"]), "objective": {"metric": "valid/loss"}})
    assert objective.status_code == 422 and objective.json()["detail"][0]["field"] == "objective"
    bad_space = lr_sweep(rnd["id"])
    bad_space["hyperparameters"][0]["min"] = -1
    assert client.post(f"{API}/studies", json=bad_space).status_code == 422
    assert client.get(f"{API}/studies").json()["total"] == 0  # nothing half-written

    empty = client.post(f"{API}/rounds/{rnd['id']}/decision", json={"adopt": True, "override": True, "note": "n"})
    assert empty.status_code == 409 and "no candidate" in empty.json()["detail"]
    assert client.post(f"{API}/rounds/{rnd['id']}/replicas", json={"count": 2}).status_code == 409
    assert client.post(f"{API}/rounds/{rnd['id']}/replicas", json={"count": 0}).status_code == 422
    view = client.get(f"{API}/rounds/{rnd['id']}").json()
    assert view["candidate"] is None and view["evidence"]["missing"] == ["candidate"]
    assert view["status"] == "open" and view["decision"] is None


def test_a_better_candidate_is_adopted_and_becomes_the_baseline(client: httpx.Client) -> None:
    pipeline = make_pipeline(client)
    rnd = make_round(client, pipeline["id"])
    study = client.post(f"{API}/studies", json=lr_sweep(rnd["id"])).json()
    assert run_pending(client, valley) == 8

    view = client.get(f"{API}/rounds/{rnd['id']}").json()
    best = client.get(f"{API}/studies/{study['id']}").json()["best_trial_id"]
    candidate = view["candidate"]
    assert candidate["trial_id"] == best and candidate["study_id"] == study["id"]
    assert candidate["params"]["batch_size"] == 64
    assert view["evidence"]["verdict"] == "unknown"
    assert set(view["evidence"]["missing"]) == {"candidate replicas", "baseline replicas"}
    refused = client.post(f"{API}/rounds/{rnd['id']}/decision", json={"adopt": True})
    assert refused.status_code == 409 and "'unknown'" in refused.json()["detail"]

    replicas = client.post(f"{API}/rounds/{rnd['id']}/replicas", json={"count": 3})
    assert replicas.status_code == 201, replicas.text
    made = replicas.json()
    assert made["candidate_trial_id"] == best and len(made["candidate_replica_ids"]) == 3
    assert len(made["baseline_trial_ids"]) == 3
    baseline_study = client.get(f"{API}/studies/{made['baseline_study_id']}").json()
    assert baseline_study["spec"]["round_id"] == rnd["id"]
    assert all(hp["role"] == "fixed" for hp in baseline_study["spec"]["hyperparameters"])
    baseline_trials = client.get(f"{API}/studies/{made['baseline_study_id']}/trials").json()["items"]
    assert [t["params"] for t in baseline_trials] == [BASELINE] * 3
    assert len({t["seed"] for t in baseline_trials}) == 3
    assert run_pending(client, valley) == 6

    view = client.get(f"{API}/rounds/{rnd['id']}").json()
    evidence = view["evidence"]
    assert view["candidate"]["trial_id"] == best  # replicas never become the candidate
    assert evidence["candidate"]["n"] == 3 and evidence["baseline"]["n"] == 3
    assert evidence["baseline"]["study_ids"] == [made["baseline_study_id"]]
    assert evidence["verdict"] == "better", evidence
    lo, hi = evidence["ci"]
    assert 0 < lo < evidence["difference"] < hi
    assert evidence["baseline"]["mean"] > evidence["candidate"]["mean"] + 0.05

    decided = client.post(f"{API}/rounds/{rnd['id']}/decision", json={"adopt": True, "note": "lower lr wins"})
    assert decided.status_code == 200, decided.text
    assert decided.json()["status"] == "decided" and decided.json()["decision"]["verdict"] == "better"
    again = client.post(f"{API}/rounds/{rnd['id']}/decision", json={"adopt": False})
    assert again.status_code == 409 and "decided already" in again.json()["detail"]

    after = client.get(f"{API}/pipelines/{pipeline['id']}").json()
    new_params = candidate["params"]
    assert after["baseline"]["params"] == new_params and after["baseline"]["trial_id"] == best
    assert after["baseline"]["round_id"] == rnd["id"]
    assert after["baseline"]["objective"]["mean"] == evidence["candidate"]["mean"]
    [launch] = after["launches"]
    assert launch["round_id"] == rnd["id"] and launch["trial_id"] == best and launch["note"] == "lower lr wins"
    assert launch["params_changed"] == {"learning_rate": {"before": 0.1, "after": new_params["learning_rate"]}}
    assert launch["objective_before"]["mean"] == evidence["baseline"]["mean"]
    assert launch["objective_after"]["value"] == candidate["objective"]
    assert launch["evidence"]["verdict"] == "better"

    # The next round's studies start from the new baseline.
    second = make_round(client, pipeline["id"], "regularization")
    spec = {
        "name": "wd",
        "round_id": second["id"],
        "num_trials": 2,
        "hyperparameters": [
            {"name": "weight_decay", "role": "nuisance", "type": "float", "min": 1e-6, "max": 1e-2, "scale": "log"}
        ],
    }
    created = client.post(f"{API}/studies", json=spec).json()
    lrs = {t["params"]["learning_rate"] for t in client.get(f"{API}/studies/{created['id']}/trials").json()["items"]}
    assert lrs == {new_params["learning_rate"]} and second["number"] == 2


def test_diverged_reruns_make_the_verdict_unstable_and_adopting_needs_an_override(client: httpx.Client) -> None:
    pipeline = make_pipeline(client)
    rnd = make_round(client, pipeline["id"])
    client.post(f"{API}/studies", json=lr_sweep(rnd["id"]))
    run_pending(client, valley)
    made = client.post(f"{API}/rounds/{rnd['id']}/replicas", json={"count": 3}).json()
    diverge = {made["candidate_replica_ids"][0]}
    run_pending(client, lambda c: valley(c, diverge=diverge))

    evidence = client.get(f"{API}/rounds/{rnd['id']}").json()["evidence"]
    assert evidence["verdict"] == "unstable"
    assert evidence["candidate"]["diverged"] == 1 and evidence["candidate"]["n"] == 2
    url = f"{API}/rounds/{rnd['id']}/decision"
    plain = client.post(url, json={"adopt": True, "note": "it is faster"})
    assert plain.status_code == 409 and "override" in plain.json()["detail"]
    no_note = client.post(url, json={"adopt": True, "override": True})
    assert no_note.status_code == 409 and "note" in no_note.json()["detail"]
    assert client.get(f"{API}/pipelines/{pipeline['id']}").json()["launches"] == []
    forced = client.post(url, json={"adopt": True, "override": True, "note": "warmup next round fixes it"})
    assert forced.status_code == 200, forced.text
    assert forced.json()["decision"]["override"] is True
    assert forced.json()["launch"]["evidence"]["verdict"] == "unstable"


def test_a_candidate_within_noise_is_recorded_when_rejected(client: httpx.Client) -> None:
    pipeline = make_pipeline(client)
    rnd = make_round(client, pipeline["id"])
    client.post(f"{API}/studies", json=lr_sweep(rnd["id"]))
    run_pending(client, lambda c: valley(c, flat=True))
    client.post(f"{API}/rounds/{rnd['id']}/replicas", json={"count": 4})
    run_pending(client, lambda c: valley(c, flat=True))
    evidence = client.get(f"{API}/rounds/{rnd['id']}").json()["evidence"]
    assert evidence["verdict"] == "within_noise", evidence
    lo, hi = evidence["ci"]
    assert lo < 0 < hi
    rejected = client.post(f"{API}/rounds/{rnd['id']}/decision", json={"adopt": False, "note": "not worth it"})
    assert rejected.status_code == 200 and rejected.json()["launch"] is None
    after = client.get(f"{API}/pipelines/{pipeline['id']}").json()
    assert after["baseline"]["params"] == BASELINE and after["launches"] == []
    assert after["rounds"][0]["decision"]["adopt"] is False


def test_deciding_needs_write_and_reading_needs_read(settings: Settings) -> None:
    db = Database(settings.database_url)
    db.upgrade()
    tokens = {role: auth.create_token(db, role, role)[1] for role in ("read", "write")}
    db.dispose()
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=30) as http:
        write = {"Authorization": f"Bearer {tokens['write']}"}
        read = {"Authorization": f"Bearer {tokens['read']}"}
        assert http.post(f"{API}/pipelines", json=pipeline_body(), headers=read).status_code == 403
        pipeline = http.post(f"{API}/pipelines", json=pipeline_body(), headers=write).json()
        assert http.get(f"{API}/pipelines/{pipeline['id']}", headers=read).status_code == 200
        assert http.get(f"{API}/pipelines/{pipeline['id']}").status_code == 401
        url = f"{API}/pipelines/{pipeline['id']}/rounds"
        assert http.post(url, json={"goal": "g"}, headers=read).status_code == 403
        rnd = http.post(url, json={"goal": "g"}, headers=write).json()
        decision = {"adopt": False}
        assert http.post(f"{API}/rounds/{rnd['id']}/decision", json=decision, headers=read).status_code == 403
        assert http.get(f"{API}/rounds/{rnd['id']}", headers=read).status_code == 200


def test_the_cli_walks_a_round_and_the_tracking_sheet_names_it(
    live_server: LiveServer, client: httpx.Client, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = ("--server", live_server.url)
    path = tmp_path / "pipeline.json"
    path.write_text(json.dumps(pipeline_body()))
    assert main(["pipeline", "create", "-f", str(path), *server, "--json"]) == 0
    pipeline = json.loads(capsys.readouterr().out)
    assert main(["round", "create", str(pipeline["id"]), "--goal", "tune the learning rate", *server, "--json"]) == 0
    rnd = json.loads(capsys.readouterr().out)
    spec_path = tmp_path / "sweep.json"
    spec_path.write_text(json.dumps(lr_sweep(rnd["id"])))
    assert main(["study", "create", "-f", str(spec_path), *server]) == 0
    capsys.readouterr()
    run_pending(client, valley)
    assert main(["round", "replicas", str(rnd["id"]), "--count", "3", *server]) == 0
    assert "3 runs of the candidate" in capsys.readouterr().out
    run_pending(client, valley)
    assert main(["round", "show", str(rnd["id"]), *server]) == 0
    shown = capsys.readouterr().out
    assert "verdict: better" in shown and "differs from the baseline in: learning_rate=" in shown
    assert main(["round", "decide", str(rnd["id"]), "--adopt", "--note", "lower lr", *server]) == 0
    assert "adopted (verdict better)" in capsys.readouterr().out
    assert main(["pipeline", "show", str(pipeline["id"]), *server]) == 0
    shown = capsys.readouterr().out
    assert "learning_rate 0.1 ->" in shown and "better" in shown
    assert main(["pipeline", "list", *server]) == 0
    assert "mlp" in capsys.readouterr().out
    assert main(["round", "decide", str(rnd["id"]), "--reject", *server]) == 2
    assert "decided already" in capsys.readouterr().err

    rows = {r["study"]: r for r in csv.DictReader(io.StringIO(client.get(f"{API}/studies.csv").text))}
    sweep = rows["lr-sweep"]
    assert (sweep["pipeline"], sweep["round"], sweep["goal"]) == ("mlp", "1", "tune the learning rate")
    assert sweep["decision"].startswith("adopted trial ") and "(better)" in sweep["decision"]
    baseline = rows["mlp-round1-baseline1"]
    assert baseline["round"] == "1" and baseline["trials_run"] == "3"
