"""The dashboard's JSON endpoints, notes, pages and error pages over real HTTP, on SQLite and
Postgres, with a study run through the worker protocol (planted curves, one divergent trial)."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re

import httpx
import numpy as np
import pytest

from hpo.policy import ExecutionPolicy
from hpo.server.analysis.model import Curve
from hpo.server.dashboard.charts.common import robust_range
from hpo.server.dashboard.charts.progress import eta_seconds
from hpo.server.dashboard.charts.service import CHART_KINDS
from hpo.server.dashboard.table import parse_param_filters
from hpo.settings import Settings
from tests.conftest import LiveServer
from tests.server.analysis.protocol import Outcome, analysis, create, run_pending
from tests.server.analysis.test_planted import spec, valley

ARMS = [{"name": "optimizer", "role": "scientific", "type": "categorical", "values": ["sgd", "adam"]}]


def divergent_valley(config: dict) -> Outcome:
    """The planted valley, except trial number 3, whose train loss runs away to 400 and which ends
    infeasible (the playbook's divergent trial)."""
    outcome = valley(1.4)(config)
    if config["number"] == 3:
        steps = np.arange(50, 1001, 50, dtype=float)
        outcome.curves["train/loss"] = Curve(steps, np.geomspace(2.0, 400.0, len(steps)))
        outcome.curves["valid/error_rate"] = Curve(steps[:5], np.full(5, 0.9))
        outcome.fail, outcome.fail_step = "loss diverged", 1000
    return outcome


@pytest.fixture
def study(client: httpx.Client) -> dict:
    created = create(client, spec("charts", num_trials=8, scientific=ARMS))
    run_pending(client, divergent_valley)
    return created


def chart(client: httpx.Client, study_id: int, kind: str, **params: object) -> dict:
    reply = client.get(f"/api/v1/studies/{study_id}/charts/{kind}", params=params)
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("application/json")
    return reply.json()


def test_charts_answer_what_they_draw(client: httpx.Client, study: dict) -> None:
    sid = study["id"]
    history = chart(client, sid, "history")
    assert sum(len(s["x"]) for s in history["series"]) == 15 and history["infeasible"]["x"] == [3]
    bad = history["infeasible"]["ids"][0]
    assert history["text"][str(bad)].startswith(f"trial {bad}<br>") and "infeasible" in history["text"][str(bad)]
    assert all(b >= a for a, b in zip(history["best"]["y"][1:], history["best"]["y"], strict=False))  # min: falls

    axis = chart(client, sid, "axis")
    lr = next(p for p in axis["panels"] if p["name"] == "learning_rate")
    assert lr["axis_type"] == "log" and lr["bounds"] == [1e-4, 1e-1] and lr["infeasible"]["ids"] == [bad]
    assert max(lr["infeasible"]["y"]) > max(y for s in lr["series"] for y in s["y"])  # crosses beyond the worst

    curves = chart(client, sid, "curves", metric="train/loss")
    assert curves["log_y"] and len(curves["curves"]) == 16
    lo, hi = curves["y_range"]
    assert hi < math.log10(400) - 0.5, "the divergent trial must not set the y limits"
    assert all(len(c["steps"]) <= 61 for c in curves["curves"])  # downsampled on the server
    assert chart(client, sid, "curves", limit=2)["curves"][0]["rank"] == 1

    importance = chart(client, sid, "importance")
    assert "RandomForestRegressor" in importance["method"] and importance["params"][0]["name"] == "learning_rate"
    contour = chart(client, sid, "contour", x="learning_rate", y="weight_decay")
    assert contour["grid"] is not None and len(contour["grid"]["z"]) == 40 and len(contour["points"]["ids"]) == 15
    parallel = chart(client, sid, "parallel")
    assert parallel["n"] == 15 and parallel["axes"][-1]["label"] == "valid/error_rate"
    progress = chart(client, sid, "progress")
    assert progress["finished"] == 16 and progress["eta_seconds"] == 0.0 and not progress["stalled"]
    for kind in ("grad_norm", "isolation", "best_steps", "budget"):
        assert chart(client, sid, kind)["kind"] == kind

    refused = client.get(f"/api/v1/studies/{sid}/charts/contour", params={"x": "momentum"})
    assert refused.status_code == 422 and refused.json()["detail"][0]["field"] == "x"
    assert client.get(f"/api/v1/studies/{sid}/charts/nope").status_code == 422
    assert client.get("/api/v1/studies/999999/charts/history").status_code == 404


def test_an_empty_study_says_so(client: httpx.Client) -> None:
    sid = create(client, spec("empty", num_trials=2))["id"]
    assert chart(client, sid, "history")["n_feasible"] == 0
    assert chart(client, sid, "curves")["curves"] == []
    assert chart(client, sid, "importance")["message"].startswith("needs at least 8")
    progress = chart(client, sid, "progress")
    assert progress["eta_seconds"] is None and progress["stalled"], "pending trials and no worker: stalled"
    page = client.get(f"/studies/{sid}/analysis-sections").text
    assert "No finished trials yet" in page and "nothing to fix" not in page


def test_trial_table_sorts_filters_and_pages(client: httpx.Client, study: dict) -> None:
    url = f"/api/v1/studies/{study['id']}/table"
    everything = client.get(url).json()
    assert everything["total"] == everything["filtered"] == 16 and len(everything["rows"]) == 16
    best = client.get(url, params={"sort": "objective", "limit": 3}).json()["rows"]
    values = [r["objective"] for r in best]
    assert values == sorted(values) and len(values) == 3
    worst_first = client.get(url, params={"sort": "objective", "desc": "true"}).json()["rows"]
    ranked = [r["objective"] for r in worst_first if r["objective"] is not None]
    assert ranked == sorted(ranked, reverse=True) and worst_first[0]["objective"] == max(ranked)
    adam = client.get(url, params={"arm": "optimizer=adam"}).json()
    assert adam["filtered"] == 8 and {r["arm"] for r in adam["rows"]} == {"optimizer=adam"}
    done = client.get(url, params=[("status", "completed"), ("status", "failed")]).json()
    assert done["filtered"] == 15 and {r["status"] for r in done["rows"]} == {"completed"}
    narrow = client.get(url, params={"param": "learning_rate:0.001:0.05"}).json()
    assert 0 < narrow["filtered"] < 16
    assert all(0.001 <= r["params"]["learning_rate"] <= 0.05 for r in narrow["rows"])
    page2 = client.get(url, params={"offset": 10, "limit": 5}).json()
    assert [r["id"] for r in page2["rows"]] == [r["id"] for r in everything["rows"][10:15]]
    bad = client.get(url, params={"param": "learning_rate:x:1"})
    assert bad.status_code == 422 and bad.json()["detail"][0]["field"] == "param[0]"
    assert client.get(url, params={"sort": "nope"}).status_code == 422


def test_the_contour_thins_its_markers_but_interpolates_over_every_trial(
    client: httpx.Client, study: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpo.server.cache import memo
    from hpo.server.dashboard.charts import contour

    sid = study["id"]
    whole = chart(client, sid, "contour", x="learning_rate", y="weight_decay")
    assert whole["shown"] == whole["n_points"] == len(whole["points"]["ids"]) == 15
    monkeypatch.setattr(contour, "CONTOUR_POINTS", 6)  # the server runs in this process (a thread)
    memo.clear()  # the answer above is kept while the study is unchanged
    thinned = chart(client, sid, "contour", x="learning_rate", y="weight_decay")
    ids = thinned["points"]["ids"]
    assert (thinned["shown"], thinned["n_points"], len(ids)) == (6, 15, 6)
    assert set(thinned["text"]) == {str(i) for i in ids} and set(ids) <= set(whole["points"]["ids"])
    table = client.get(f"/api/v1/studies/{sid}/table", params={"sort": "objective", "limit": 3}).json()
    assert {row["id"] for row in table["rows"]} <= set(ids), "the best trials are never thinned away"
    assert thinned["grid"] == whole["grid"], "the surface is interpolated over every trial, not the markers"


def test_notes_are_stored_and_shown(client: httpx.Client, study: dict) -> None:
    sid = study["id"]
    empty = {"body": "", "updated_at": None, "author": None, "html": ""}
    assert client.get(f"/api/v1/studies/{sid}/note").json() == empty
    saved = client.put(f"/api/v1/studies/{sid}/note", json={"body": "lr range too narrow"})
    assert saved.status_code == 200 and saved.json()["updated_at"]
    trial = analysis(client, sid)["arms"][0]["best_trial_id"]
    assert client.put(f"/api/v1/trials/{trial}/note", json={"body": "best so far"}).status_code == 200
    assert "lr range too narrow" in client.get(f"/studies/{sid}").text
    assert "best so far" in client.get(f"/trials/{trial}").text
    assert client.get(f"/api/v1/studies/{sid}/table").json()["notes"] == {str(trial): "best so far"}
    refused = client.put(f"/api/v1/studies/{sid}/note", json={"body": "x" * 20_001})
    assert refused.status_code == 422 and refused.json()["detail"][0]["field"] == "body"
    assert client.put("/api/v1/trials/999999/note", json={"body": "x"}).status_code == 404


def test_note_images_load_only_from_the_dashboard(client: httpx.Client, study: dict) -> None:
    sid = study["id"]
    body = (
        "![tracker](https://tracker.example/pixel.png?who=me) ![ours](/static/logo.png) ![x](//evil.example/a.png)\n\n"
        "[![nested](http://tracker.example/b.png)](https://example.org/) ![dot](data:image/png;base64,AAAA)"
    )
    saved = client.put(f"/api/v1/studies/{sid}/note", json={"body": body})
    assert saved.status_code == 200, saved.text
    preview = client.post("/api/v1/notes/preview", json={"body": body})
    page = client.get(f"/studies/{sid}", headers={"Accept": "text/html"})
    for html in (saved.json()["html"], preview.json()["html"], page.text):
        images = re.findall(r"<img [^>]*>", html)
        sources = [src for i in images for src in re.findall(r'src="([^"]*)"', i)]
        assert sources == ["/static/logo.png", "data:image/png;base64,AAAA"], images
        # A remote image is a link named by its alt text, never loaded; inside a link, its alt text.
        assert (
            '<a href="https://tracker.example/pixel.png?who=me" rel="nofollow noopener noreferrer">tracker</a>' in html
        )
        assert '<a href="//evil.example/a.png" rel="nofollow noopener noreferrer">x</a>' in html
        assert '<a href="https://example.org/">nested</a>' in html
    # And the browser holds the same line: every page says images come from the dashboard only.
    for response in (page, client.get("/signin"), client.get("/studies/999999", headers={"Accept": "text/html"})):
        assert response.headers["content-type"].startswith("text/html")
        assert response.headers["content-security-policy"] == "img-src 'self' data: blob:", response.url
    assert "content-security-policy" not in client.get(f"/api/v1/studies/{sid}/note").headers


def test_trial_page_compare_page_and_trial_curves(client: httpx.Client, study: dict) -> None:
    sid = study["id"]
    best = analysis(client, sid)["arms"][0]["best_trial_id"]
    page = client.get(f"/trials/{best}").text
    assert "Scientific" in page and "Nuisance" in page and "hpo train --config" in page
    assert "/static/vendor/plotly.min.js" in page
    curves = client.get(f"/api/v1/trials/{best}/curves").json()
    names = {m["name"]: m for m in curves["metrics"]}
    assert set(names) == {"train/loss", "train/grad_norm", "valid/error_rate"} and names["train/loss"]["log_y"]
    failed = client.get(f"/api/v1/studies/{sid}/table", params={"status": "infeasible"}).json()["rows"][0]["id"]
    assert "loss diverged" in client.get(f"/trials/{failed}").text
    other = create(client, spec("charts-b", num_trials=2))["id"]
    compare = client.get("/compare", params={"studies": f"{sid},{other}"})
    assert compare.status_code == 200 and "charts-b" in compare.text and f"trial {best}" in compare.text


def test_error_pages_for_browsers_and_json_for_the_api(client: httpx.Client) -> None:
    html = {"accept": "text/html,application/xhtml+xml"}
    missing = client.get("/studies/999999", headers=html)
    assert missing.status_code == 404 and missing.headers["content-type"].startswith("text/html")
    assert "study 999999 not found" in missing.text and 'href="/"' in missing.text
    invalid = client.get("/compare", params={"studies": "1,x"}, headers=html)
    assert invalid.status_code == 422 and "comma-separated" in invalid.text
    api = client.get("/api/v1/studies/999999", headers=html)
    assert api.status_code == 404 and api.json() == {"detail": "study 999999 not found"}
    assert client.get("/studies/999999").headers["content-type"].startswith("application/json")


def test_api_docs_and_plotly_are_served_locally(client: httpx.Client) -> None:
    docs = client.get("/docs").text
    assert "/static/vendor/swagger-ui-bundle.js" in docs and "cdn" not in docs.lower()
    assert "/static/vendor/redoc.standalone.js" in client.get("/redoc").text
    for asset in (
        "swagger-ui-bundle.js",
        "swagger-ui.css",
        "redoc.standalone.js",
        "plotly.min.js",
        "plotly-cartesian.min.js",
    ):
        reply = client.get(f"/static/vendor/{asset}")
        assert reply.status_code == 200 and len(reply.content) > 100_000, asset
    # the study page starts with the cartesian bundle, a plotly.js build a third of the full one's size
    cartesian = client.get("/static/vendor/plotly-cartesian.min.js").content
    assert (
        b"plotly.js (cartesian" in cartesian[:200]
        and len(cartesian) < len(client.get("/static/vendor/plotly.min.js").content) / 2
    )
    assert client.get("/static/vendor/../app.py").status_code == 404


def test_plain_helpers() -> None:
    values = np.concatenate([np.full(50, 2.0), np.linspace(1, 3, 50), [4e22]])
    lo, hi = robust_range(values, log=True)
    assert hi < 1.0 and lo > -0.5
    assert robust_range(np.array([np.nan]), log=False) is None
    assert eta_seconds([100.0, 200.0, 300.0], 6, 400.0) == pytest.approx(600.0)
    assert eta_seconds([], 6, 400.0) is None and eta_seconds([1.0], 0, 2.0) == 0.0
    (r,) = parse_param_filters(["dropout::0.3"])
    assert r.lo is None and r.hi == 0.3 and r.admits(0.1) and not r.admits(0.5) and not r.admits(None)


def test_study_page_shows_the_analysis_comparison_contract(
    client: httpx.Client, study: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The analysis' arm comparison (`comparison`, `trial_variance`, per arm `replica_ci`, `rank`)
    renders when present; until the analysis sends them the page shows dashes (tested above)."""
    from hpo.server.api.routes import dashboard

    real = dashboard.kept_analysis

    def with_comparison(db: object, study_id: int) -> dict:
        answer = copy.deepcopy(real(db, study_id))  # type: ignore[arg-type]  # the kept one is shared
        answer["arms"][0].update(rank=1, replica_mean=0.15, replica_std=0.004, replica_ci=[0.141, 0.159], n_replicas=3)
        answer["comparison"] = {
            "best_arm": answer["arms"][0]["arm"],
            "runner_up": answer["arms"][1]["label"],
            "difference": 0.0049,
            "ci": [-0.002, 0.011],
            "verdict": "within_noise",
            "method": "Welch t interval over replicas",
        }
        answer["trial_variance"] = {"measured": True, "eval_noise_std": 0.001, "message": "Trial variance: std 0.004."}
        return answer

    monkeypatch.setattr(dashboard, "kept_analysis", with_comparison)
    page = client.get(f"/studies/{study['id']}/analysis-sections").text
    assert "are within noise" in page and "95% CI [-0.002, 0.011]" in page and "Welch t interval" in page
    assert "0.15 ± 0.004" in page and "[0.141, 0.159]" in page and "Trial variance: std 0.004." in page
    assert "{&#39;" not in page and "{'" not in page, "an arm given as its values is shown as its label"


def test_cached_answers_follow_every_change(client: httpx.Client) -> None:
    """Charts and the table are cached per study version: a cancel, a finished trial and new
    trials each show at once."""
    sid = create(client, spec("cache", num_trials=3))["id"]
    table = f"/api/v1/studies/{sid}/table"
    first = client.get(table).json()["rows"]
    assert {r["status"] for r in first} == {"pending"} and chart(client, sid, "history")["n_trials"] == 3
    assert client.post(f"/api/v1/trials/{first[0]['id']}/cancel").status_code == 200
    assert client.get(table).json()["rows"][0]["status"] == "cancelled"
    run_pending(client, valley(0.5))
    assert chart(client, sid, "history")["n_feasible"] == 2
    assert client.patch(f"/api/v1/studies/{sid}", json={"num_trials": 5}).status_code == 200
    assert client.get(table).json()["total"] == 5 and chart(client, sid, "history")["n_trials"] == 5


EVIL = '<a href="https://evil.example">x</a>'
EVIL_METRIC = '<A HREF="https://evil.example/m">m</A>'


def test_chart_text_from_specs_and_trials_is_never_markup(settings: Settings) -> None:
    # A categorical value (so an arm's label, a tick, a legend entry and hover text) and a metric
    # name a trial posts (curves, the trial page) that Plotly would draw as a link. A command
    # study: its hyperparameters' names and values are the script's, not a workload's.
    policy = ExecutionPolicy(command_prefixes=(("python", "train.py"),))
    with (
        LiveServer(dataclasses.replace(settings, execution_policy=policy)) as live,
        httpx.Client(base_url=live.url, timeout=30) as client,
    ):
        _never_markup(client)


def _never_markup(client: httpx.Client) -> None:
    arms = [{"name": "variant", "role": "scientific", "type": "categorical", "values": ["plain", EVIL]}]
    study = spec("markup", num_trials=6, scientific=arms)
    study["trainer"] = {"command": ["python", "train.py"], "max_train_steps": 2000}
    created = create(client, study)

    def plant(config: dict) -> Outcome:
        outcome = valley(1.4)(config)
        outcome.curves[EVIL_METRIC] = outcome.curves["train/loss"]
        return outcome

    run_pending(client, plant)
    sid = created["id"]
    options: dict[str, dict[str, str]] = {"curves": {"metric": EVIL_METRIC}}
    answers = []
    for kind in CHART_KINDS:
        reply = client.get(f"/api/v1/studies/{sid}/charts/{kind}", params=options.get(kind, {}))
        assert reply.status_code == 200, (kind, reply.text[:300])
        answers.append((kind, reply.text))
    trial = client.get(f"/api/v1/studies/{sid}/table").json()["rows"][0]["id"]
    curves = client.get(f"/api/v1/trials/{trial}/curves")
    assert curves.status_code == 200
    answers.append(("trial curves", curves.text))
    for kind, text in answers:
        assert not re.search(r"<\s*/?\s*a[\s>]", text, re.IGNORECASE), (kind, text[:500])
        assert "<span" not in text.lower(), kind
    # The text is still there, drawn as text (U+2039 for each `<`); the hover's own breaks are kept.
    history = json.loads(dict(answers)["history"])
    assert any("\u2039a href=" in s["name"] for s in history["series"]), history["series"]
    assert all("<br>" in text for text in history["text"].values())
    names = [m["name"] for m in curves.json()["metrics"]]
    assert '\u2039A HREF="https://evil.example/m">m\u2039/A>' in names, names
    # What the spec and the trial stored is not changed: only what charts draw.
    stored = client.get(f"/api/v1/studies/{sid}").json()["spec"]["hyperparameters"][0]["values"]
    assert stored == ["plain", EVIL]
