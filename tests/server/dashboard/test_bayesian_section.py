"""The study page's bayesian section: the analysis's `bayesian` key (best so far, the model's view)
inlined as JSON in the analysis sections, with an honest empty state before the first fit; absent
for other studies. The model view is written into the study's state directly (a real fit is covered
by tests/server/bayesian/test_api.py): every trial here is quasi-random, so the refiller in the live
server never fits and never overwrites it."""

from __future__ import annotations

import json
import re
import time

import httpx

from hpo.server.db import Database
from hpo.server.models import BayesianState
from tests.conftest import LiveServer
from tests.server.bayesian.helpers import bayesian_spec, run_one

DATA = re.compile(r'<script type="application/json" id="bayesian-data">(.*?)</script>', re.S)
MODEL_VIEW = {
    "arm": {},
    "observations": 2,
    "best_params": {"learning_rate": 0.01, "weight_decay": 1e-4},
    "slices": [
        {
            "name": "learning_rate",
            "scale": "log",
            "x": [1e-4, 1e-2, 1.0],
            "mean": [4.0, 0.1, 4.0],
            "std": [1.0, 0.2, 1.0],
        },
        {
            "name": "weight_decay",
            "scale": "log",
            "x": [1e-6, 1e-4, 1e-1],
            "mean": [2.0, 0.1, 4.5],
            "std": [0.5, 0.1, 0.9],
            "feasible": [0.9, 1.0, 0.4],
        },
    ],
}


def finish_one(db: Database) -> dict:
    deadline = time.monotonic() + 30  # the refiller creates the quasi-random trials in the background
    while time.monotonic() < deadline:
        done = run_one(db)
        if done is not None:
            return done
        time.sleep(0.05)
    raise AssertionError("no trial to claim")


def _section(http: httpx.Client, study_id: int) -> tuple[str, dict | None]:
    response = http.get(f"/studies/{study_id}/analysis-sections")
    assert response.status_code == 200, response.text
    found = DATA.search(response.text)
    return response.text, json.loads(found.group(1)) if found else None


def test_bayesian_section_shows_best_so_far_and_the_model_view(live_server: LiveServer, database_url: str) -> None:
    db = Database(database_url)
    with httpx.Client(base_url=live_server.url, timeout=30) as http:
        study_id = http.post("/api/v1/studies", json=bayesian_spec(num_trials=3, initial_trials=3)).json()["id"]
        first = finish_one(db)

        html, data = _section(http, study_id)
        assert 'id="bayesian"' in html and data is not None
        assert [(p["trial_id"], p["value"], p["best"], p["source"]) for p in data["best_so_far"]] == [
            (first["trial_id"], first["value"], first["value"], "initial")
        ]
        assert 'data-bayes="best"' in html
        assert "The model has not been fitted yet" in html and 'data-bayes="model"' not in html

        with db.transaction() as session:
            session.get(BayesianState, study_id).model_view = MODEL_VIEW
        second = finish_one(db)  # a new study version, so the cached analysis is recomputed
        html, data = _section(http, study_id)
        assert [p["trial_id"] for p in data["best_so_far"]] == [first["trial_id"], second["trial_id"]]
        assert data["best_so_far"][1]["best"] == min(first["value"], second["value"])
        assert data["model"] == MODEL_VIEW
        assert 'data-bayes="model"' in html and "not been fitted" not in html

        page = http.get(f"/studies/{study_id}").text  # the page includes the sections or fetches them
        assert 'id="analysis-sections"' in page and "/static/study.js" in page

        other = {**bayesian_spec(name="grid"), "algorithm": "random"}
        other_id = http.post("/api/v1/studies", json=other).json()["id"]
        html, data = _section(http, other_id)
        assert data is None and 'id="bayesian"' not in html
    db.dispose()
