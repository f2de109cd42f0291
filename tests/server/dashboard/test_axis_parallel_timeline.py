"""The axis, parallel coordinates and timeline charts (docs/dashboard.md, "Charts"): the axis chart
draws replicas marked and never among the originals, the parallel coordinates give each arm's
learning rate its own axis, and the timeline shows each trial's attempts per worker. Planted trials
through the worker protocol over HTTP, on SQLite and Postgres."""

from __future__ import annotations

import math
from typing import Any

import httpx
import pytest

from tests.server.analysis import planted
from tests.server.analysis.protocol import API, Outcome, analysis, create, run_pending
from tests.server.dashboard.test_conditional_charts import ADAM, ADAM_LR, SGD, adam_lr_drives, chart, conditional_spec


@pytest.fixture
def study(client: httpx.Client) -> dict[str, Any]:
    """16 originals over two arms (two workers), then two replicas of the best Adam trial."""
    created = create(client, conditional_spec(num_trials=8))
    assert run_pending(client, adam_lr_drives, worker="gpu-a") == 16
    best = {a["label"]: a["best_trial_id"] for a in analysis(client, created["id"])["arms"]}
    made = client.post(f"{API}/trials/{best['optimizer=adam']}/replicas", json={"count": 2})
    assert made.status_code == 201, made.text

    def lucky(config: dict[str, Any]) -> Outcome:
        valid, train = planted.clean(config["number"], 0.01, noise=0.001)
        return Outcome({"valid/error_rate": valid, "train/loss": train})

    assert run_pending(client, lucky, worker="gpu-b") == 2
    return {**created, "best_adam": best["optimizer=adam"], "replicas": made.json()["trial_ids"]}


def test_axis_chart_marks_replicas_apart_from_the_originals(client: httpx.Client, study: dict) -> None:
    axis = chart(client, study["id"], "axis")
    panels = {p["param"]: p for p in axis["panels"]}
    assert set(panels) == {ADAM, SGD, "weight_decay"}
    adam, sgd = panels[ADAM], panels[SGD]
    assert set(adam["replicas"]["ids"]) == set(study["replicas"]) and sgd["replicas"]["ids"] == []
    originals = {i for s in adam["series"] for i in s["ids"]}
    assert not originals & set(study["replicas"]) and len(originals) == 8  # replicas never among the ranked points
    assert study["best_adam"] in originals
    assert min(adam["replicas"]["y"]) < min(y for s in adam["series"] for y in s["y"])  # the lucky copies, drawn
    assert "replica of trial" in axis["text"][str(study["replicas"][0])] and axis["n_replicas"] == 2


def test_parallel_coordinates_give_each_arm_its_own_learning_rate_axis(client: httpx.Client, study: dict) -> None:
    parallel = chart(client, study["id"], "parallel")
    axes = {a["param"]: a for a in parallel["axes"] if "param" in a}
    assert set(axes) == {"optimizer", ADAM, SGD, "weight_decay"}
    assert parallel["n"] == 16 and not set(parallel["ids"]) & set(study["replicas"])
    adam = axes[ADAM]
    assert adam["label"] == f"{ADAM} (log)" and adam["log"] is True and adam["ticktext"][0] == "n/a"
    at = adam["not_applicable_at"]
    assert at < math.log10(ADAM_LR[0]) and adam["range"][0] == at
    trials = {
        t["id"]: t for t in client.get(f"{API}/studies/{study['id']}/trials", params={"limit": 100}).json()["items"]
    }
    for tid, value in zip(parallel["ids"], adam["values"], strict=True):
        params = trials[tid]["params"]
        if params["optimizer"] == "adam":
            assert value == pytest.approx(math.log10(params["learning_rate"]))
        else:
            assert value == at  # another arm's trial crosses at n/a, never inside Adam's range
    assert axes["optimizer"]["categorical"] is True and axes["optimizer"]["ticktext"] == ["sgd", "adam"]


def test_timeline_shows_each_trial_on_its_worker_row(client: httpx.Client, study: dict) -> None:
    sid = study["id"]
    timeline = chart(client, sid, "timeline")
    bars = timeline["bars"]
    assert timeline["n"] == 18 and timeline["n_trials"] == 18 and len(set(bars["ids"])) == 18  # one attempt each
    workers = {w["name"]: w for w in timeline["workers"]}
    assert set(workers) == {"gpu-a", "gpu-b"} and workers["gpu-a"]["trials"] == 16 and workers["gpu-b"]["trials"] == 2
    names = [w["name"] for w in timeline["workers"]]
    on_b = {tid for tid, w in zip(bars["ids"], bars["worker"], strict=True) if names[w] == "gpu-b"}
    assert on_b == set(study["replicas"])  # the replicas ran on the second worker
    assert [tid for tid, rep in zip(bars["ids"], bars["replica"], strict=True) if rep] == sorted(study["replicas"])
    assert all(a <= b for a, b in zip(bars["start"], bars["end"], strict=True))
    assert bars["start"] == sorted(bars["start"]) and bars["start"][0] == 0.0 and timeline["t0"] > 1.7e12
    assert timeline["span_seconds"] == max(bars["end"])
    assert {timeline["outcomes"][o] for o in bars["outcome"]} == {"completed"}
    assert all(n == 1 for n in bars["attempts"]) and all(a == 1 for a in bars["attempt"])
    busy = workers["gpu-a"]["busy_fraction"]  # SQLite's now() has whole seconds: planted trials may take 0 s
    assert (busy is None) == (timeline["span_seconds"] == 0) and (busy is None or 0.0 <= busy <= 1.0)

    # a trial claimed and never finished stays running, its bar reaching the server's now
    client.post(f"{API}/trials/{study['best_adam']}/replicas", json={"count": 1})
    claim = client.post(f"{API}/workers/claim", json={"worker_id": "gpu-c", "resources": {"cpus": 8, "gpus": 1}})
    assert claim.status_code == 200, claim.text
    live = chart(client, sid, "timeline")
    i = live["bars"]["ids"].index(claim.json()["trial_id"])
    assert live["outcomes"][live["bars"]["outcome"][i]] == "running" and live["bars"]["end"][i] == live["now"]
    assert live["workers"][live["bars"]["worker"][i]]["name"] == "gpu-c"


def test_timeline_of_a_study_that_never_started_is_empty(client: httpx.Client) -> None:
    created = create(client, conditional_spec(num_trials=2))
    empty = chart(client, created["id"], "timeline")
    assert empty["n"] == 0 and empty["workers"] == [] and empty["t0"] is None and empty["stragglers"] == []
    assert client.get(f"{API}/studies/{created['id']}/charts/timelines").status_code == 422


def test_a_workers_busy_time_counts_overlapping_trials_once() -> None:
    from hpo.server.dashboard.charts.timeline import _union_seconds

    assert _union_seconds([(0.0, 10.0), (5.0, 12.0), (20.0, 25.0)]) == 17.0
    assert _union_seconds([(3.0, 4.0), (0.0, 10.0)]) == 10.0 and _union_seconds([]) == 0.0


def test_thinning_keeps_the_best_and_an_even_sample() -> None:
    from hpo.server.analysis.model import TrialSummary
    from hpo.server.dashboard.charts.progress import THIN_BEST, thin

    trials = [
        TrialSummary(id=i + 1, number=i, arm={}, params={}, status="completed", objective=float((i * 7919) % 10007))
        for i in range(10_000)
    ]
    kept = thin(trials, 1.0, budget=3000)
    assert len(kept) == 3000 and len({t.id for t in kept}) == 3000
    assert [t.number for t in kept] == sorted(t.number for t in kept)
    best = sorted(trials, key=lambda t: t.objective or 0.0)[:THIN_BEST]
    assert {t.id for t in best} <= {t.id for t in kept}  # the best are never thinned away
    rest = [t.number for t in kept if t.id not in {b.id for b in best}]
    assert rest[0] < 50 and rest[-1] > 9900  # the sample spans the whole study
    assert thin(trials[:10], 1.0) == trials[:10]
    maximised = thin(trials, -1.0, budget=2000)
    assert max(trials, key=lambda t: t.objective or 0.0) in maximised
    # An axis panel's budget (1,000): the best half of it, and still a sample of the whole study.
    panel = thin(trials, 1.0, budget=1000)
    assert len(panel) == 1000
    assert {t.id for t in best[:500]} <= {t.id for t in panel} and best[500].id not in {t.id for t in panel}
    assert min(t.number for t in panel if t.id not in {b.id for b in best}) < 50
