"""The dashboard's pages over HTTP on SQLite and Postgres (the browser tests are in
tests/server/dashboard/test_browser.py)."""

from __future__ import annotations

import httpx

from tests.server.analysis.protocol import analysis, create, run_pending
from tests.server.analysis.test_planted import spec, valley


def planted_study(client: httpx.Client) -> dict:
    """A two-arm study whose learning rate optimum lies beyond the range (one boundary warning)."""
    arms = [{"name": "optimizer", "role": "scientific", "type": "categorical", "values": ["sgd", "adam"]}]
    study = create(client, spec("dashboard-demo", num_trials=12, scientific=arms))
    run_pending(client, valley(1.4))
    return study


def test_pages_render_the_tracking_sheet_study_and_trial(client: httpx.Client) -> None:
    study = planted_study(client)
    index = client.get("/")
    assert index.status_code == 200 and index.headers["content-type"].startswith("text/html")
    assert f'href="/studies/{study["id"]}"' in index.text and "dashboard-demo" in index.text
    assert "/api/v1/studies.csv" in index.text and "hpo study show" in index.text
    page = client.get(f"/studies/{study['id']}")
    assert page.status_code == 200
    for text in ("Scientific", "Nuisance", "Fixed", "learning_rate", "batch_size", "Arm comparison"):
        assert text in page.text
    # the checklist's sections come separately while not yet computed, then with the page
    assert "Running the playbook" in page.text and "boundary" not in page.text
    sections = client.get(f"/studies/{study['id']}/analysis-sections").text
    assert "boundary" in sections and "12 of 12" in sections
    page = client.get(f"/studies/{study['id']}")
    assert "boundary" in page.text and "Running the playbook" not in page.text
    assert page.text.count('data-chart="') == 11 and "12 of 12" in page.text
    # the study page starts with Plotly's cartesian bundle (the full one loads for WebGL charts)
    assert "/static/vendor/plotly-cartesian.min.js" in page.text and "cdn" not in page.text.lower()
    best = analysis(client, study["id"])["arms"][0]["best_trial_id"]
    trial = client.get(f"/trials/{best}")
    assert trial.status_code == 200 and "learning_rate" in trial.text and "Checkpoints" in trial.text
    assert "/static/vendor/plotly.min.js" in trial.text
    assert client.get("/static/dashboard.css").headers["content-type"].startswith("text/css")
    for kind in ("axis", "isolation", "curves", "grad_norm", "best_steps", "budget"):
        assert f"/plots/{kind}?format=png" in page.text


def test_unknown_pages_and_static_files(client: httpx.Client) -> None:
    assert client.get("/studies/999999").status_code == 404
    assert client.get("/trials/999999").status_code == 404
    assert client.get("/static/missing.css").status_code == 404
    assert client.get("/static/..%2Fapp.py").status_code == 404
    assert "No studies yet" in client.get("/").text
