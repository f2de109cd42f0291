"""The timeline chart (docs/dashboard.md, "Charts") draws each attempt of a trial as its own bar on
the row of the worker that ran it, with how it ended (preempted, error, an expired lease, completed,
running), from the attempt history the lease transitions write. Real HTTP through the worker
protocol, on SQLite and Postgres."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from hpo.policy import ExecutionPolicy
from hpo.server.db import Database
from hpo.server.models import Trial, TrialStatus
from hpo.settings import Settings
from tests.api.test_security import small_spec
from tests.conftest import LiveServer
from tests.server.analysis.protocol import API, create
from tests.server.dashboard.test_conditional_charts import chart, conditional_spec

OFFER = {"cpus": 64, "gpus": 8}


@pytest.fixture
def client(settings: Settings) -> Iterator[httpx.Client]:
    """A server whose leases last 2 s (the reaper runs every 0.5 s), so one can expire in a test,
    and that accepts command studies running `python train.py`."""
    policy = ExecutionPolicy(command_prefixes=(("python", "train.py"),))
    server = LiveServer(dataclasses.replace(settings, lease_seconds=2, execution_policy=policy))
    with server as live, httpx.Client(base_url=live.url, timeout=30) as http:
        yield http


def claim(client: httpx.Client, worker: str, **extra: Any) -> httpx.Response:
    return client.post(f"{API}/workers/claim", json={"worker_id": worker, "resources": OFFER, **extra})


def claimed(client: httpx.Client, worker: str) -> dict[str, Any]:
    answer = claim(client, worker)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def post(client: httpx.Client, lease: dict[str, Any], what: str, **body: Any) -> None:
    reply = client.post(f"{API}/trials/{lease['trial_id']}/{what}", json={"lease_id": lease["lease_id"], **body})
    assert reply.status_code == 200, reply.text


def wait_for_status(client: httpx.Client, trial_id: int, status: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while client.get(f"{API}/trials/{trial_id}").json()["status"] != status:
        assert time.monotonic() < deadline, f"trial {trial_id} never became {status}"
        time.sleep(0.1)


def bars_of(timeline: dict[str, Any], trial_id: int) -> list[dict[str, Any]]:
    """The bars of one trial, as records: its attempts in order."""
    bars, names = timeline["bars"], [w["name"] for w in timeline["workers"]]
    rows = [
        {
            "attempt": bars["attempt"][i],
            "of": bars["attempts"][i],
            "worker": names[bars["worker"][i]],
            "start": bars["start"][i],
            "end": bars["end"][i],
            "outcome": timeline["outcomes"][bars["outcome"][i]],
        }
        for i, tid in enumerate(bars["ids"])
        if tid == trial_id
    ]
    return sorted(rows, key=lambda r: r["attempt"])


def test_each_attempt_is_a_bar_on_its_workers_row_with_how_it_ended(client: httpx.Client) -> None:
    study = create(client, conditional_spec(num_trials=2))  # 4 trials
    sid = study["id"]
    first = claimed(client, "gpu-a")
    tid = first["trial_id"]
    post(client, first, "fail", kind="preempted", reason="spot instance reclaimed")
    second = claimed(client, "gpu-b")  # the oldest pending trial again
    assert second["trial_id"] == tid and second["attempt"] == 2
    post(client, second, "fail", kind="error", reason="CUDA error: an illegal memory access")
    third = claimed(client, "gpu-c")
    assert third["trial_id"] == tid and third["attempt"] == 3
    wait_for_status(client, tid, "pending")  # no heartbeat: the lease expires and the reaper requeues it
    fourth = claimed(client, "gpu-a")
    assert fourth["trial_id"] == tid and fourth["attempt"] == 4
    post(client, fourth, "complete")
    other = claimed(client, "gpu-b")
    post(client, other, "complete")
    last = claimed(client, "gpu-a")
    post(client, last, "complete")
    live = claimed(client, "gpu-c")
    post(client, live, "heartbeat")

    timeline = chart(client, sid, "timeline")
    assert timeline["n"] == 7 and timeline["n_trials"] == 4
    retried = bars_of(timeline, tid)
    assert [(b["attempt"], b["of"], b["worker"], b["outcome"]) for b in retried] == [
        (1, 4, "gpu-a", "preempted"),
        (2, 4, "gpu-b", "error"),
        (3, 4, "gpu-c", "expired"),
        (4, 4, "gpu-a", "completed"),
    ]
    for earlier, later in zip(retried, retried[1:], strict=False):  # one after the other, never overlapping
        assert earlier["start"] <= earlier["end"] <= later["start"]
    assert retried[2]["end"] - retried[2]["start"] >= 1.0  # the expired attempt held its lease until it lapsed
    assert [(b["worker"], b["outcome"]) for b in bars_of(timeline, other["trial_id"])] == [("gpu-b", "completed")]
    running = bars_of(timeline, live["trial_id"])
    assert [(b["worker"], b["outcome"], b["end"]) for b in running] == [("gpu-c", "running", timeline["now"])]
    workers = {w["name"]: (w["attempts"], w["trials"]) for w in timeline["workers"]}
    assert workers == {"gpu-a": (3, 2), "gpu-b": (2, 2), "gpu-c": (2, 2)}
    assert timeline["bars"]["start"] == sorted(timeline["bars"]["start"]) and timeline["bars"]["start"][0] == 0.0
    assert timeline["span_seconds"] == max(timeline["bars"]["end"])

    # the live attempt ends: cancelled by a person, its bar closes as such
    assert client.post(f"{API}/trials/{live['trial_id']}/cancel").status_code == 200
    after = chart(client, sid, "timeline")
    assert [b["outcome"] for b in bars_of(after, live["trial_id"])] == ["cancelled"]

    # a worker whose allow-list refuses a study is handed nothing: the claim handed back leaves no bar
    commands = create(client, small_spec("script", command=["python", "train.py"]))
    refused = claim(client, "gpu-d", capabilities={"commands": [["python", "other.py"]]})
    assert refused.status_code == 204, refused.text
    assert chart(client, commands["id"], "timeline")["n"] == 0
    untouched = client.get(f"{API}/studies/{commands['id']}/trials").json()["items"]
    assert {(t["status"], t["attempt"]) for t in untouched} == {("pending", 0)}
    ran = claimed(client, "gpu-e")  # a worker that may run it: the refused trial's first attempt
    assert ran["trial_id"] == min(t["id"] for t in untouched) and ran["attempt"] == 1
    assert bars_of(chart(client, commands["id"], "timeline"), ran["trial_id"])[0]["worker"] == "gpu-e"


def test_stragglers_are_attempts_far_over_the_median_completed_attempt() -> None:
    from hpo.server.dashboard.charts.timeline import OUTCOMES, _stragglers

    done, running, preempted = (OUTCOMES.index(k) for k in ("completed", "running", "preempted"))
    bars = {
        "start": [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        "end": [10.0, 11.0, 9.0, 10.0, 12.0, 45.0, 31.0, 50.0],
        "outcome": [done, done, done, done, done, done, running, preempted],
    }
    median, late = _stragglers(bars)
    assert median == 10.5 and late == [5]  # 45 s completed; 31 s running is under 3x; preempted never counts
    bars["end"][6] = 40.0
    assert _stragglers(bars)[1] == [5, 6]  # a running attempt past 3x the median is one already
    few = {k: v[:4] for k, v in bars.items()}
    assert _stragglers(few) == (10.0, [])  # under 5 completed attempts: no verdict


def test_a_trial_from_before_attempts_were_recorded_is_one_bar(client: httpx.Client, settings: Settings) -> None:
    """Trials that ran before migration 0011 have no attempt rows: one bar from their first start
    to their finish, with their status and attempt count, beside the recorded attempts."""
    study = create(client, conditional_spec(num_trials=1))
    ran = claimed(client, "new-node")
    post(client, ran, "complete")
    trials = client.get(f"{API}/studies/{study['id']}/trials").json()["items"]
    old = next(t for t in trials if t["id"] != ran["trial_id"])
    db = Database(settings.database_url)
    with db.transaction() as session:  # as an older server left it: no trial_attempts rows
        started = datetime.now(timezone.utc) - timedelta(minutes=10)
        session.execute(
            update(Trial)
            .where(Trial.id == old["id"])
            .values(
                status=TrialStatus.failed,
                attempt=3,
                worker_id="old-node",
                started_at=started,
                finished_at=started + timedelta(minutes=4),
            )
        )
    db.dispose()
    timeline = chart(client, study["id"], "timeline")
    (legacy,) = bars_of(timeline, old["id"])
    assert legacy == {"attempt": None, "of": 3, "worker": "old-node", "start": 0.0, "end": 240.0, "outcome": "failed"}
    (recorded,) = bars_of(timeline, ran["trial_id"])
    assert recorded["attempt"] == 1 and recorded["outcome"] == "completed" and recorded["start"] >= 590
