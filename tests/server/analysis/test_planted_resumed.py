"""Values from resumed attempts (docs/analysis.md, "Values from resumed attempts"): a trial whose
best value was reached in an attempt resumed from a checkpoint carries `resumed: true` (trial API,
trial table, studies.csv) and the analysis says so for its arm: exact for the built-in trainer, a
caveat suggesting a replica for a command. Through the worker protocol (claim, metrics, checkpoint,
preempted, claim again) on SQLite and Postgres."""

from __future__ import annotations

import csv
import dataclasses
import io
from typing import Any

import httpx
import numpy as np

from hpo.policy import ExecutionPolicy
from hpo.server.analysis.service import resumed_caveats
from hpo.settings import Settings
from tests.conftest import LiveServer
from tests.server.analysis import planted
from tests.server.analysis.protocol import API, Outcome, analysis, create, run_one
from tests.server.analysis.test_planted import spec

RESUME_AT = 1000


def clean(seed: int, level: float = 0.1) -> Any:
    """A planter of `planted.clean` curves, uninterrupted."""
    valid, train = planted.clean(seed, level)
    return lambda cfg: Outcome({"valid/error_rate": valid, "train/loss": train})


def claim(client: httpx.Client) -> dict[str, Any]:
    answer = client.post(f"{API}/workers/claim", json={"worker_id": "w", "resources": {"cpus": 64, "gpus": 8}})
    assert answer.status_code == 200, answer.text
    return answer.json()


def points(curve: Any, name: str, keep: Any) -> list[dict[str, Any]]:
    return [
        {"step": int(s), "name": name, "value": float(v)}
        for s, v in zip(curve.steps, curve.values, strict=True)
        if keep(s)
    ]


def run_resumed(client: httpx.Client, first: dict[str, Any], valid: Any, train: Any) -> dict[str, Any]:
    """The first attempt reports up to RESUME_AT, checkpoints there and is preempted; the next
    attempt resumes from it and reports the rest."""
    tid, lease = first["trial_id"], first["lease_id"]
    body = points(valid, "valid/error_rate", lambda s: s <= RESUME_AT) + points(
        train, "train/loss", lambda s: s <= RESUME_AT
    )
    assert client.post(f"{API}/trials/{tid}/metrics", json={"lease_id": lease, "points": body}).status_code == 200
    checkpoint = {"lease_id": lease, "step": RESUME_AT, "uri": f"file:///ckpt/{tid}"}
    assert client.post(f"{API}/trials/{tid}/checkpoints", json=checkpoint).status_code == 201
    assert client.post(f"{API}/trials/{tid}/fail", json={"lease_id": lease, "kind": "preempted"}).status_code == 200
    second = claim(client)
    assert second["trial_id"] == tid and second["resume_from"]["step"] == RESUME_AT
    rest = points(valid, "valid/error_rate", lambda s: s > RESUME_AT) + points(
        train, "train/loss", lambda s: s > RESUME_AT
    )
    lease = second["lease_id"]
    assert client.post(f"{API}/trials/{tid}/metrics", json={"lease_id": lease, "points": rest}).status_code == 200
    assert client.post(f"{API}/trials/{tid}/complete", json={"lease_id": lease}).status_code == 200
    return second


def test_a_best_value_from_a_resumed_attempt_is_marked(client: httpx.Client) -> None:
    study = create(client, spec("resumed", num_trials=4))
    # Trial 1 is the best (level 0.05) and resumes at step 1000; the last evaluation is its best.
    first = claim(client)
    valid, train = planted.clean(1, 0.05, noise=0.0005)
    valid = type(valid)(valid.steps, np.where(valid.steps == planted.HORIZON, 0.04, valid.values))
    run_resumed(client, first, valid, train)
    best_id = first["trial_id"]
    # Trial 2 resumes too, but its best value comes before the resume point: not marked.
    early = claim(client)
    v2, t2 = planted.overfitting(2, 0.2)  # best near step 800, then rising by 0.15
    run_resumed(client, early, v2, t2)
    for _ in range(2):  # uninterrupted and worse
        c = claim(client)
        run_one(client, c, clean(3, 0.3))

    trial = client.get(f"{API}/trials/{best_id}").json()
    assert trial["resumed"] is True and trial["best_step"] == planted.HORIZON and trial["attempt"] == 2
    other = client.get(f"{API}/trials/{early['trial_id']}").json()
    assert other["resumed"] is False and other["best_step"] <= RESUME_AT and other["attempt"] == 2
    table = client.get(f"{API}/studies/{study['id']}/table").json()
    rows = {r["id"]: r for r in table["rows"]}
    assert rows[best_id]["resumed"] is True and rows[early["trial_id"]]["resumed"] is False
    assert sum(r["resumed"] for r in rows.values()) == 1
    sheet = list(csv.DictReader(io.StringIO(client.get(f"{API}/studies.csv").text)))
    row = next(r for r in sheet if r["id"] == str(study["id"]))
    assert row["best_trial_id"] == str(best_id) and row["best_trial_resumed"] == "true"
    result = analysis(client, study["id"])
    (caveat,) = [c for c in result["caveats"] if c.get("trial_id") == best_id]
    assert "resumed from the checkpoint at step 1000" in caveat["message"] and "resumes exactly" in caveat["message"]
    # the trial page marks it, in the words: exact, for the built-in trainer
    page = client.get(f"/trials/{best_id}").text
    mark = page.split('id="resumed">', 1)[1].split("</p>", 1)[0]
    assert "resumed from the checkpoint at step 1000" in mark and "The built-in trainer resumes exactly" in mark
    assert "replicate" not in mark
    assert 'id="resumed"' not in client.get(f"/trials/{early['trial_id']}").text  # its best came before the resume


def test_an_uninterrupted_best_is_not_marked(client: httpx.Client) -> None:
    study = create(client, spec("straight", num_trials=2))
    for _ in range(2):
        run_one(client, claim(client), clean(1))
    trials = client.get(f"{API}/studies/{study['id']}/trials").json()["items"]
    assert [t["resumed"] for t in trials] == [False, False]
    assert not [c for c in analysis(client, study["id"])["caveats"] if "resumed" in c["message"]]


def test_a_commands_resumed_trial_page_suggests_a_replica(settings: Settings) -> None:
    policy = ExecutionPolicy(command_prefixes=(("{python}", "train.py"),))
    with (
        LiveServer(dataclasses.replace(settings, execution_policy=policy)) as live,
        httpx.Client(base_url=live.url, timeout=30) as client,
    ):
        body = spec("resumed-command", num_trials=1)
        body["trainer"] = {"command": ["{python}", "train.py", "{args}"], "max_train_steps": planted.HORIZON}
        create(client, body)
        first = claim(client)
        valid, train = planted.clean(1, 0.05, noise=0.0005)
        valid = type(valid)(valid.steps, np.where(valid.steps == planted.HORIZON, 0.04, valid.values))
        run_resumed(client, first, valid, train)
        page = client.get(f"/trials/{first['trial_id']}").text
    mark = page.split('id="resumed">', 1)[1].split("</p>", 1)[0]
    assert "resumed from the checkpoint at step 1000" in mark and "may not be exact" in mark
    assert f"/api/v1/trials/{first['trial_id']}/replicas" in mark and "resumes exactly" not in mark


def test_a_commands_resumed_best_gets_a_replica_suggestion() -> None:
    arms = [{"label": "all trials", "best_trial_id": 7, "best_value": 2.5675, "best_step": 3000}]
    (caveat,) = resumed_caveats(arms, {7: 1400}, {"command": ["{python}", "train.py"]})
    assert "may not be exact" in caveat["message"] and "/api/v1/trials/7/replicas" in caveat["message"]
    assert caveat["trial_id"] == 7
    assert resumed_caveats(arms, {}, {"command": ["x"]}) == []
