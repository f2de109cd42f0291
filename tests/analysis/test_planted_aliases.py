"""Issue 24, item 3: a spec's `analysis.aliases` maps a script's own names onto hpo's; the aliased
names drive the checks as hpo's own do, a check that lacks a name it needs is listed under
`skipped`, and a bad alias is a 422 naming it. Planted through the worker protocol on SQLite and
Postgres."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from hpo.policy import ExecutionPolicy
from hpo.settings import Settings
from tests.analysis import planted
from tests.analysis.protocol import API, Outcome, analysis, create, grad_norms, kinds, run_pending
from tests.analysis.test_planted import LR_MAX, LR_MIN, spec, unit_lr
from tests.conftest import LiveServer


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
    return Outcome({"valid/error_rate": valid, "loss": train, "gnorm": grad_norms(config["number"], train.steps)})


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


def test_aliased_names_drive_the_checks(client: httpx.Client) -> None:
    study = create(client, script_spec("aliased", ALIASES))
    run_pending(client, plant)
    result = analysis(client, study["id"])
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
