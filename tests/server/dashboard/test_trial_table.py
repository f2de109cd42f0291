"""The trial table for exploring (docs/dashboard.md, "Pages"): one column per hyperparameter (a
conditional one labelled with its arm), sorting by a hyperparameter or a metric, several filters at
once, replicas and retries marked, the failure reason, one numbering. Planted trials through the
worker protocol over HTTP, on SQLite and Postgres."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.server.analysis.protocol import API, Outcome, analysis, create, run_pending
from tests.server.dashboard.test_conditional_charts import ADAM, SGD, adam_lr_drives, conditional_spec
from tests.server.dashboard.test_pages import page


def explode_fast(config: dict[str, Any]) -> Outcome:
    """Adam above a learning rate of 0.01 diverges (reported infeasible); the rest as planted."""
    outcome = adam_lr_drives(config)
    params = config["params"]
    if params["optimizer"] == "adam" and params["learning_rate"] > 0.01:
        outcome.fail, outcome.fail_step = "loss is NaN at step 120", 120
    return outcome


@pytest.fixture
def study(client: httpx.Client) -> dict[str, Any]:
    """16 trials: the first claimed fails for good (out of memory) and is retried, Adam's fastest
    learning rates are infeasible, and the best Adam trial gets two replicas."""
    created = create(client, conditional_spec(num_trials=8))
    claim = client.post(f"{API}/workers/claim", json={"worker_id": "w", "resources": {"cpus": 64, "gpus": 8}}).json()
    body = {"lease_id": claim["lease_id"], "kind": "config", "reason": "CUDA out of memory\nTraceback (...)"}
    assert client.post(f"{API}/trials/{claim['trial_id']}/fail", json=body).status_code == 200
    assert run_pending(client, explode_fast) == 15
    retried = client.post(f"{API}/trials/{claim['trial_id']}/retry")
    assert retried.status_code == 201, retried.text
    best = {a["label"]: a["best_trial_id"] for a in analysis(client, created["id"])["arms"]}
    made = client.post(f"{API}/trials/{best['optimizer=adam']}/replicas", json={"count": 2})
    assert made.status_code == 201, made.text
    assert run_pending(client, explode_fast) == 3
    return {
        **created,
        "failed": claim["trial_id"],
        "retry": retried.json()["trial_ids"][0],
        "best_adam": best["optimizer=adam"],
        "replicas": made.json()["trial_ids"],
    }


def table(client: httpx.Client, study_id: int, **params: Any) -> dict[str, Any]:
    reply = client.get(f"{API}/studies/{study_id}/table", params={"limit": 100, **params})
    assert reply.status_code == 200, reply.text
    return reply.json()


def refused(client: httpx.Client, study_id: int, params: Any) -> dict[str, Any]:
    reply = client.get(f"{API}/studies/{study_id}/table", params=params)
    assert reply.status_code == 422, reply.text
    return reply.json()["detail"][0]


def test_one_column_per_hyperparameter_and_conditional_ones_per_arm(client: httpx.Client, study: dict) -> None:
    everything = table(client, study["id"])
    assert everything["total"] == 19
    labels = [c["label"] for c in everything["columns"]]
    assert labels == everything["params"] and set(labels) == {"optimizer", SGD, ADAM, "weight_decay"}
    assert labels[0] == "optimizer"  # scientific first
    by_label = {c["label"]: c for c in everything["columns"]}
    assert by_label[ADAM]["name"] == "learning_rate" and by_label[ADAM]["when"] == {"optimizer": ["adam"]}
    for row in everything["rows"]:
        values, adam = row["values"], row["params"]["optimizer"] == "adam"
        assert "number" not in row  # one numbering: the trial id
        assert values["optimizer"] == row["params"]["optimizer"]
        assert values[ADAM if adam else SGD] == row["params"]["learning_rate"]
        assert values[SGD if adam else ADAM] is None  # the other arm's learning rate does not apply


def test_sorts_by_a_hyperparameter_or_a_metric(client: httpx.Client, study: dict) -> None:
    sid = study["id"]
    up = table(client, sid, sort=f"param:{ADAM}")["rows"]
    values = [r["values"][ADAM] for r in up]
    defined = [v for v in values if v is not None]
    adam = [r for r in up if r["params"]["optimizer"] == "adam"]
    assert len(defined) == len(adam) >= 10 and values[: len(defined)] == sorted(defined)  # sgd's (no value) last
    down = [r["values"][ADAM] for r in table(client, sid, sort=f"param:{ADAM}", desc="true")["rows"]]
    assert down[: len(defined)] == sorted(defined, reverse=True) and down[len(defined) :] == [None] * (19 - len(adam))
    by_name = [r["values"]["weight_decay"] for r in table(client, sid, sort="param:weight_decay")["rows"]]
    assert by_name == sorted(by_name)  # an unconditional hyperparameter by its plain name

    objective = table(client, sid, sort="metric:valid/error_rate")
    ranked = [r["metric_value"] for r in objective["rows"] if r["metric_value"] is not None]
    assert ranked == sorted(ranked) and objective["sort_metric"] == {"name": "valid/error_rate", "mode": "min"}
    assert objective["rows"][0]["metric_value"] == objective["rows"][0]["objective"]
    loss = table(client, sid, sort="metric:train/loss", desc="true")
    worst_first = [r["metric_value"] for r in loss["rows"] if r["metric_value"] is not None]
    assert worst_first == sorted(worst_first, reverse=True) and len(worst_first) >= 12

    ambiguous = refused(client, sid, {"sort": "param:learning_rate"})
    assert ambiguous["field"] == "sort" and "declared per arm" in ambiguous["reason"]
    assert refused(client, sid, {"sort": "param:momentum"})["field"] == "sort"
    unknown_metric = refused(client, sid, {"sort": "metric:valid/accuracy"})
    assert unknown_metric["field"] == "sort" and "valid/accuracy" in unknown_metric["reason"]
    assert refused(client, sid, {"sort": "colour"})["field"] == "sort"


def test_several_filters_at_once(client: httpx.Client, study: dict) -> None:
    sid = study["id"]
    rows = table(client, sid)["rows"]
    wd = sorted(r["values"]["weight_decay"] for r in rows)[len(rows) // 2]
    wanted = [
        r["id"]
        for r in rows
        if r["values"][ADAM] is not None and 1e-4 <= r["values"][ADAM] <= 1e-2 and r["values"]["weight_decay"] <= wd
    ]
    both = table(client, sid, param=[f"{ADAM}:1e-4:1e-2", f"weight_decay::{wd}"])
    assert 0 < both["filtered"] < len(rows) and sorted(r["id"] for r in both["rows"]) == sorted(wanted)
    category = table(client, sid, param=["optimizer=sgd", f"{SGD}:0.01:"])
    assert category["rows"] and all(r["arm"] == "optimizer=sgd" and r["values"][SGD] >= 0.01 for r in category["rows"])
    bad = refused(client, sid, [("param", "weight_decay::1"), ("param", "learning_rate:0:1")])
    assert bad["field"] == "param[1]" and ADAM in bad["reason"]
    assert refused(client, sid, {"param": "momentum:0:1"})["field"] == "param[0]"


def test_replicas_retries_and_failure_reasons_are_marked(client: httpx.Client, study: dict) -> None:
    rows = {r["id"]: r for r in table(client, study["id"])["rows"]}
    assert {i for i, r in rows.items() if r["replica_of"] is not None} == set(study["replicas"])
    assert all(rows[i]["replica_of"] == study["best_adam"] for i in study["replicas"])
    assert rows[study["retry"]]["retry_of"] == study["failed"]
    assert [i for i, r in rows.items() if r["retry_of"] is not None] == [study["retry"]]
    assert rows[study["failed"]]["status"] == "failed" and rows[study["failed"]]["reason"] == "CUDA out of memory"
    infeasible = [r for r in rows.values() if r["status"] == "infeasible"]
    assert infeasible and all("loss is NaN" in r["reason"] for r in infeasible)
    assert all(r["reason"] is None for r in rows.values() if r["status"] == "completed" and not r["infeasible"])


def test_study_page_table_has_one_numbering_and_labelled_filters(client: httpx.Client, study: dict) -> None:
    html = page(client, f"/studies/{study['id']}")
    head = html.split('id="trial-table"', 1)[1].split("</thead>", 1)[0]
    assert ">No.<" not in head and 'data-sort="id"' in head
    filters = html.split('id="trial-filters"', 1)[1].split("</form>", 1)[0]
    assert f'<option value="{ADAM}"' in filters and f'<option value="{SGD}"' in filters
    assert "data-add-filter" in filters


def test_sorting_by_a_loss_reads_the_kept_minimum_of_completed_trials(
    client: httpx.Client, study: dict, database_url: str
) -> None:
    """Once the curve statistics are kept, an ended trial's best training loss is their kept
    minimum (the same aggregate as over its points, so the same table); a trial without a kept
    row (running, or run again since) gets its own from the points."""
    from sqlalchemy import text

    from hpo.server.analysis import keeper
    from hpo.server.db import Database

    sid = study["id"]
    from_points = table(client, sid, sort="metric:train/loss")
    db = Database(database_url)
    try:
        assert keeper.keep_all(db) > 0
        with db.engine.begin() as conn:
            kept = conn.execute(text("SELECT count(*) FROM curve_stats WHERE name = 'train/loss' AND n > 0")).scalar()
            assert 0 < kept < from_points["total"]
        kept_table = table(client, sid, sort="metric:train/loss", limit=99)  # another query: not the kept answer
        assert [(r["id"], r["metric_value"]) for r in kept_table["rows"]] == [
            (r["id"], r["metric_value"]) for r in from_points["rows"]
        ]
        # the kept row is what is read: a planted minimum shows it
        first = from_points["rows"][0]["id"]
        with db.engine.begin() as conn:
            planted = conn.execute(
                text("UPDATE curve_stats SET vmin = -1 WHERE trial_id = :t AND name = 'train/loss'"), {"t": first}
            ).rowcount
            assert planted == 1
        # (another page size: a table is kept per query until the study changes)
        again = table(client, sid, sort="metric:train/loss", limit=98)["rows"]
        assert (again[0]["id"], again[0]["metric_value"]) == (first, -1.0)
    finally:
        db.dispose()
