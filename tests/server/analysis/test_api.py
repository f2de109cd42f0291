"""The analysis routes over HTTP on SQLite and Postgres: the JSON's shape, every plot in both
formats, bad input and unknown ids, and the tracking sheet."""

from __future__ import annotations

import csv
import io
import xml.etree.ElementTree as ET

import httpx
import pytest

from hpo.server.cache import memo
from tests.server.analysis.protocol import API, analysis, create, run_pending
from tests.server.analysis.test_planted import spec, valley

KINDS = ("axis", "isolation", "curves", "grad_norm", "best_steps", "budget")


@pytest.fixture
def study(client: httpx.Client) -> dict:
    arms = [{"name": "optimizer", "role": "scientific", "type": "categorical", "values": ["sgd", "adam"]}]
    created = create(client, spec("api", num_trials=8, scientific=arms))
    run_pending(client, valley(0.5))
    return created


def test_analysis_has_the_designed_shape(client: httpx.Client, study: dict) -> None:
    result = analysis(client, study["id"])
    assert {
        "study_id",
        "objective",
        "infeasible_fraction",
        "arms",
        "warnings",
        "caveats",
        "max_train_steps",
        "grad_clip",
        "boundary",
        "infeasible",
        "curves",
        "budget",
        "isolation",
    } <= set(result)
    assert result["study_id"] == study["id"] and result["objective"] == {"metric": "valid/error_rate", "mode": "min"}
    assert {"arm", "best_trial_id", "best_value", "n_trials", "n_infeasible", "n_replicas", "replica_std"} <= set(
        result["arms"][0]
    )
    assert {a["arm"]["optimizer"] for a in result["arms"]} == {"sgd", "adam"}
    assert {"best_step_fractions", "advice"} <= set(result["max_train_steps"])
    assert {"p90", "clipped_fraction"} <= set(result["grad_clip"])
    assert len(result["curves"]) == 6  # the best three of each arm
    for w in result["warnings"]:
        assert set(w) == {"kind", "message", "param", "side", "trial_id"} and len(w["message"]) > 40
    assert result["isolation"][0]["kind"] == "arms" and len(result["isolation"][0]["points"]) == 2


def test_every_plot_renders_as_svg_and_png(client: httpx.Client, study: dict) -> None:
    for kind in KINDS:
        svg = client.get(f"{API}/studies/{study['id']}/plots/{kind}")
        assert svg.status_code == 200 and svg.headers["content-type"] == "image/svg+xml", kind
        root = ET.fromstring(svg.content)
        assert root.tag.endswith("svg") and float(root.attrib["width"].removesuffix("pt")) > 100
        png = client.get(f"{API}/studies/{study['id']}/plots/{kind}", params={"format": "png"})
        assert png.status_code == 200 and png.headers["content-type"] == "image/png"
        assert png.content.startswith(b"\x89PNG\r\n\x1a\n") and len(png.content) > 5_000, kind


def test_plots_of_one_trial_and_of_an_empty_study(client: httpx.Client, study: dict) -> None:
    trial_id = analysis(client, study["id"])["arms"][0]["best_trial_id"]
    for kind in ("curves", "grad_norm"):
        one = client.get(f"{API}/studies/{study['id']}/plots/{kind}", params={"trial_id": trial_id})
        assert one.status_code == 200 and f"trial {trial_id}" in one.text
    empty = create(client, spec("empty"))
    for kind in KINDS:
        assert client.get(f"{API}/studies/{empty['id']}/plots/{kind}").status_code == 200
    result = analysis(client, empty["id"])
    assert result["arms"][0]["best_trial_id"] is None and result["arms"][0]["n_trials"] == 24
    assert result["infeasible_fraction"] == 0.0


def test_bad_input_and_unknown_ids(client: httpx.Client, study: dict) -> None:
    assert client.get(f"{API}/studies/999999/analysis").status_code == 404
    assert client.get(f"{API}/studies/999999/plots/axis").status_code == 404
    assert client.get(f"{API}/studies/0/analysis").status_code == 422
    unknown = client.get(f"{API}/studies/{study['id']}/plots/violin")
    assert unknown.status_code == 422 and unknown.json()["detail"][0]["field"] == "kind"
    assert client.get(f"{API}/studies/{study['id']}/plots/axis", params={"format": "gif"}).status_code == 422
    other = create(client, spec("other", num_trials=2))
    foreign = client.get(f"{API}/studies/{other['id']}/trials").json()["items"][0]["id"]
    assert client.get(f"{API}/studies/{study['id']}/plots/curves", params={"trial_id": foreign}).status_code == 404


def test_tracking_sheet_csv(client: httpx.Client, study: dict) -> None:
    create(client, spec("not-run-yet", num_trials=2))
    reply = client.get(f"{API}/studies.csv")
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(reply.text)))
    assert list(rows[0])[:7] == [
        "study",
        "config",
        "description",
        "trials_run",
        "best_validation",
        "metric",
        "reproduce",
    ]
    by_name = {r["study"]: r for r in rows}
    run = by_name["api"]
    assert run["trials_run"] == "16" and run["description"] == "planted: api" and run["metric"] == "valid/error_rate"
    assert run["config"].endswith(f"/api/v1/studies/{study['id']}")
    assert float(run["best_validation"]) == pytest.approx(
        min(a["best_value"] for a in analysis(client, study["id"])["arms"])
    )
    assert (
        run["reproduce"].startswith(f"hpo study show {study['id']} --spec")
        and "hpo study create -f api.json" in run["reproduce"]
    )
    assert by_name["not-run-yet"]["trials_run"] == "0" and by_name["not-run-yet"]["best_validation"] == ""


def test_the_analysis_is_kept_while_the_study_holds_and_follows_a_change(client: httpx.Client, study: dict) -> None:
    """`GET …/analysis` is computed once per study version while no trial runs (at 50,000 trials it
    took 4 s on every call), and computed again once the study changes."""
    memo.clear()  # kept answers are per process: another test's database may have a study of this id
    first = analysis(client, study["id"])
    kept = [k for k in memo._ENTRIES if k[1] == study["id"] and k[2] == "analysis-checklist"]
    assert len(kept) == 1, "the checklist is kept after the first call"
    assert analysis(client, study["id"]) == first
    replicas = client.post(f"{API}/studies/{study['id']}/replicas", json={"per_arm": 1, "count": 1})
    assert replicas.status_code == 201, replicas.text
    assert run_pending(client, valley(0.5)) == 2
    after = analysis(client, study["id"])
    assert [a["n_replicas"] for a in first["arms"]] == [0, 0]
    assert [a["n_replicas"] for a in after["arms"]] == [1, 1], "the replicas are in the new analysis"
