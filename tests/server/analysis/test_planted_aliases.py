"""Aliases (docs/analysis.md, "Aliases: the script's own names"): a spec's `analysis.aliases` maps a
script's own names onto hpo's; the aliased names drive the checks as hpo's own do, a check that
lacks a name it needs is listed under `skipped`, and a bad alias is a 422 naming it. Planted through
the worker protocol on SQLite and Postgres."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from hpo.policy import ExecutionPolicy
from hpo.server.analysis.aliases import missing_metric
from hpo.server.dashboard.plotdata import plot_data
from hpo.server.db import Database
from hpo.settings import Settings
from hpo.trainer.divergence import Series, judge
from tests.conftest import LiveServer
from tests.server.analysis import planted
from tests.server.analysis.protocol import API, Outcome, analysis, create, grad_norms, kinds, run_pending
from tests.server.analysis.test_planted import LR_MAX, LR_MIN, spec, unit_lr


def script_spec(name: str, aliases: dict[str, str] | None) -> dict[str, Any]:
    """The playbook study under the script's names: `lr`, a fixed `warmup_iters` at 10 % of
    training; it reports `loss` and `gnorm`."""
    body = spec(name, num_trials=12)
    body["trainer"] = {
        "command": ["{python}", "train.py", "{args}", "--seed={seed}"],
        "max_train_steps": 2000,
        "eval_every_steps": 100,
    }
    body["hyperparameters"] = [
        {"name": "lr", "role": "nuisance", "type": "float", "min": LR_MIN, "max": LR_MAX, "scale": "log"},
        {"name": "warmup_iters", "role": "fixed", "value": 200},
    ]
    if aliases is not None:
        body["analysis"] = {"aliases": aliases}
    return body


def plant(config: dict[str, Any]) -> Outcome:
    config = {**config, "params": {**config["params"], "learning_rate": config["params"]["lr"]}}
    valid, train = planted.clean(config["number"], 0.1 + 0.3 * (unit_lr(config) - 0.5) ** 2)
    gnorm, lr = grad_norms(config["number"], train.steps), planted.Curve(train.steps, np.full(train.steps.size, 0.01))
    return Outcome({"valid/error_rate": valid, "loss": train, "gnorm": gnorm, "sched": lr})


@pytest.fixture
def client(settings: Settings) -> Iterator[httpx.Client]:
    """The real server, with an operator's allow-list admitting the script's command."""
    policy = ExecutionPolicy(command_prefixes=(("{python}", "train.py"),))
    with (
        LiveServer(dataclasses.replace(settings, execution_policy=policy)) as live,
        httpx.Client(base_url=live.url, timeout=30) as http,
    ):
        yield http


ALIASES = {"warmup_iters": "warmup_steps", "lr": "learning_rate", "loss": "train/loss", "gnorm": "train/grad_norm"}
CLIP = 5.0  # the script's `clip`, aliased to grad_clip_norm: above every planted norm (1.0 to 1.5)
NO_GRAD_NORM = "no metric named train/grad_norm: alias your script's name in analysis.aliases (docs/analysis.md)"
NO_TRAIN_LOSS = "no metric named train/loss: alias your script's name in analysis.aliases (docs/analysis.md)"


def charts_read_aliased_names(client: httpx.Client, db: Database, study_id: int, best_id: int) -> None:
    """Every chart that looks for hpo's names finds the script's aliased ones (docs/analysis.md,
    "Aliases")."""
    charts = f"{API}/studies/{study_id}/charts"
    grad = client.get(f"{charts}/grad_norm").json()
    assert grad["missing"] is None and grad["reported_as"] == "gnorm"
    (entry,) = grad["entries"]
    assert entry["id"] == best_id and len(entry["steps"]) == planted.TRAIN_STEPS.size and entry["clip"] == CLIP
    assert 1.0 <= entry["p90"] <= 1.5
    curves = client.get(f"{charts}/curves", params={"metric": "train/loss"}).json()
    assert curves["missing"] is None and curves["reported_as"] == "loss" and curves["log_y"] is True
    assert len(curves["curves"]) == 12 and all(c["values"][0] > 1.0 for c in curves["curves"])
    trial = client.get(f"{API}/trials/{best_id}/curves").json()
    aliased = {m["name"]: m["alias"] for m in trial["metrics"]}
    assert aliased == {
        "valid/error_rate": None,
        "loss": "train/loss",
        "gnorm": "train/grad_norm",
        "sched": "train/learning_rate",
    }
    assert trial["grad_norm_metric"] == "gnorm" and trial["grad_clip_norm"] == CLIP and trial["missing"] == []
    assert next(m for m in trial["metrics"] if m["name"] == "loss")["log_y"] is True
    png = plot_data(db, study_id, "curves")  # the report plots read them too
    assert all("train/loss" in png["curves"][e["trial_id"]] for e in png["entries"])
    assert plot_data(db, study_id, "grad_norm")["entries"][0]["curve"] is not None
    svg = client.get(f"{API}/studies/{study_id}/plots/grad_norm", params={"format": "svg"})
    assert svg.status_code == 200 and "reported as gnorm" in svg.text


def charts_say_what_they_need(client: httpx.Client, study_id: int) -> None:
    """Without aliases the charts that need hpo's names say so in words, instead of empty plots."""
    charts = f"{API}/studies/{study_id}/charts"
    grad = client.get(f"{charts}/grad_norm").json()
    assert grad["missing"]["message"] == NO_GRAD_NORM and all(not e["steps"] for e in grad["entries"])
    curves = client.get(f"{charts}/curves", params={"metric": "train/loss"}).json()
    assert curves["curves"] == [] and curves["missing"]["message"] == NO_TRAIN_LOSS
    objective = client.get(f"{charts}/curves").json()
    assert objective["missing"] is None and len(objective["curves"]) == 12
    tid = client.get(f"{API}/studies/{study_id}/trials").json()["items"][0]["id"]
    trial = client.get(f"{API}/trials/{tid}/curves").json()
    assert [m["message"] for m in trial["missing"]] == [NO_TRAIN_LOSS, NO_GRAD_NORM]
    assert {m["name"] for m in trial["metrics"]} == {"valid/error_rate", "loss", "gnorm", "sched"}
    assert all(m["alias"] is None for m in trial["metrics"]) and trial["grad_clip_norm"] is None
    svg = client.get(f"{API}/studies/{study_id}/plots/grad_norm", params={"format": "svg"})
    assert svg.status_code == 200 and "alias your script" in svg.text


def test_aliased_names_drive_the_checks(client: httpx.Client, db: Database) -> None:
    body = script_spec("aliased", {**ALIASES, "clip": "grad_clip_norm", "sched": "train/learning_rate"})
    body["hyperparameters"].append({"name": "clip", "role": "fixed", "value": CLIP})
    study = create(client, body)
    run_pending(client, plant)
    result = analysis(client, study["id"])
    charts_read_aliased_names(client, db, study["id"], result["arms"][0]["best_trial_id"])
    assert "long_warmup" in kinds(result)  # warmup_iters = 200 of 2000 steps
    warmup = next(w for w in result["warnings"] if w["kind"] == "long_warmup")
    assert "200 steps is 10%" in warmup["message"]
    assert result["grad_clip"]["p90"] is not None  # gnorm read as train/grad_norm
    assert result["skipped"] == []  # train/loss, learning_rate, warmup and grad norms all found
    (curve,) = result["curves"][:1]
    assert curve["findings"] == []
    assert result["boundary"] and {c["param"] for c in result["boundary"]} == {"learning_rate"}


def test_without_aliases_the_checks_say_what_they_need(client: httpx.Client) -> None:
    study = create(client, script_spec("unaliased", None))
    run_pending(client, plant)
    result = analysis(client, study["id"])
    charts_say_what_they_need(client, study["id"])
    assert "long_warmup" not in kinds(result)
    skipped = {(s["check"], s["reason"]) for s in result["skipped"]}
    assert ("long_warmup", "needs warmup_steps or warmup_fraction") in skipped
    assert ("overfitting", "needs train/loss") in skipped
    assert ("aggressive_clipping", "needs train/grad_norm") in skipped
    assert result["grad_clip"]["p90"] is None
    # `lr` is learning-rate-like by name already: the learning-rate rules run without an alias
    assert ("instability", "needs learning_rate") not in skipped


def test_bad_aliases_are_refused_naming_the_field(client: httpx.Client) -> None:
    cases = {
        "lr": ("lr", "learning_rat"),  # not a name the analysis reads
        "momentum": ("momentum", "learning_rate"),  # not defined by the study
    }
    for key, (script, hpo) in cases.items():
        reply = client.post(f"{API}/studies", json=script_spec(f"bad-{key}", {script: hpo}))
        assert reply.status_code == 422, reply.text
        fields = [e["field"] for e in reply.json()["detail"]]
        assert fields == [f"analysis.aliases.{key}"], reply.json()
    both = script_spec("both", {"lr": "learning_rate"})
    both["hyperparameters"].append({"name": "learning_rate", "role": "fixed", "value": 0.1})
    reply = client.post(f"{API}/studies", json=both)
    assert reply.status_code == 422 and "already defines" in reply.text
    good = client.post(f"{API}/studies", json=script_spec("good", ALIASES))
    assert good.status_code == 201 and good.json()["spec"]["analysis"]["aliases"] == ALIASES
    plain = client.post(f"{API}/studies", json=spec("plain", num_trials=1)).json()
    assert "analysis" not in plain["spec"]


# Trial number -> (planted curves, the reason's kind): judged from the script's training loss `tr_loss`,
# a name that says nothing of a loss, only once it is aliased to train/loss.
DIVERGED = {
    1: (lambda seed: planted.slow_climb(seed, to=6.0), "training loss diverged"),
    3: (planted.collapse, "training loss ends no better than its initial value"),
}


def plant_diverged(config: dict[str, Any]) -> Outcome:
    curves, _ = DIVERGED.get(config["number"], (None, None))
    config = {**config, "params": {**config["params"], "learning_rate": config["params"]["lr"]}}
    level = 0.1 + 0.3 * (unit_lr(config) - 0.5) ** 2
    valid, train = curves(config["number"]) if curves else planted.clean(config["number"], level)
    return Outcome({"valid/error_rate": valid, "tr_loss": train})


def test_an_aliased_training_loss_is_judged_diverged_like_hpos_own(client: httpx.Client) -> None:
    judged = {}
    for name, aliases in (("tr-aliased", {"tr_loss": "train/loss"}), ("tr-unaliased", None)):
        study = create(client, script_spec(name, aliases))
        assert run_pending(client, plant_diverged) == 12
        ids = {t["number"]: t["id"] for t in client.get(f"{API}/studies/{study['id']}/trials").json()["items"]}
        result = analysis(client, study["id"])
        judged[name] = {d["trial_id"]: d["reason"].split(":")[0] for d in result["infeasible"]["diverged"]}
        history = client.get(f"{API}/studies/{study['id']}/charts/history").json()
        assert set(history["infeasible"]["ids"]) == set(judged[name])  # every chart reads the same judgement
        if aliases:
            assert judged[name] == {ids[n]: reason for n, (_, reason) in DIVERGED.items()}
            assert result["arms"][0]["n_infeasible"] == 2 and result["infeasible_fraction"] == 2 / 12
    assert judged["tr-unaliased"] == {}  # `tr_loss` unaliased is not a training loss to hpo


def test_judge_reads_a_script_training_loss_by_its_own_name() -> None:
    valid, train = planted.slow_climb(1, to=6.0)
    curves = {"valid/error_rate": Series(valid.steps, valid.values), "tr_loss": Series(train.steps, train.values)}
    assert judge(curves, "valid/error_rate", "min") is None
    reason = judge(curves, "valid/error_rate", "min", train_loss="tr_loss")
    assert reason is not None and reason.startswith("training loss diverged")
    both = {**curves, "train/loss": Series(train.steps, 0.5 * np.ones(train.steps.size))}
    assert judge(both, "valid/error_rate", "min", train_loss="tr_loss") == reason  # the alias is the one read


def test_missing_metric_words() -> None:
    assert missing_metric({}, "train/grad_norm")["message"] == NO_GRAD_NORM
    aliased = missing_metric({"gn": "train/grad_norm"}, "train/grad_norm")
    assert aliased["reported_as"] == "gn" and aliased["message"].startswith("no metric named gn (the script's name")
    assert missing_metric({}, "valid/loss")["message"] == "no metric named valid/loss in this study"
