"""Runs a study's trials through the real worker protocol over HTTP (claim, metrics, checkpoints,
complete or fail), with curves chosen by a planting function instead of a trainer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from hpo.server.analysis.model import Curve
from hpo.trainer.result import json_float

API = "/api/v1"


@dataclass
class Outcome:
    """What one planted trial reports: its curves by metric name, and optionally a failure."""

    curves: dict[str, Curve] = field(default_factory=dict)
    fail: str | None = None  # a fail reason; the trial then fails as `infeasible`
    fail_step: int | None = None
    unread_params: list[str] | None = None  # what the worker says never reached the script


Planter = Callable[[dict[str, Any]], Outcome]


def create(client: httpx.Client, spec: dict[str, Any]) -> dict[str, Any]:
    response = client.post(f"{API}/studies", json=spec)
    assert response.status_code == 201, response.text
    return response.json()


def run_pending(client: httpx.Client, plant: Planter, worker: str = "planted") -> int:
    """Claims and runs trials until none is pending; answers how many ran."""
    ran = 0
    while True:
        answer = client.post(f"{API}/workers/claim", json={"worker_id": worker, "resources": {"cpus": 64, "gpus": 8}})
        if answer.status_code == 204:
            return ran
        assert answer.status_code == 200, answer.text
        run_one(client, answer.json(), plant)
        ran += 1


def run_one(client: httpx.Client, claim: dict[str, Any], plant: Planter) -> None:
    outcome = plant({**claim["config"], "trial_id": claim["trial_id"], "number": claim["number"]})
    tid, lease = claim["trial_id"], claim["lease_id"]
    points = [
        {"step": int(step), "name": name, "value": json_float(float(value))}
        for name, curve in outcome.curves.items()
        for step, value in zip(curve.steps, curve.values, strict=True)
    ]
    if points:
        reply = client.post(f"{API}/trials/{tid}/metrics", json={"lease_id": lease, "points": points})
        assert reply.status_code == 200, reply.text
        best = reply.json()
        if best["best_step"] is not None:
            checkpoint = {
                "lease_id": lease,
                "step": best["best_step"],
                "uri": f"file:///ckpt/{tid}",
                "objective": best["objective_value"],
            }
            assert client.post(f"{API}/trials/{tid}/checkpoints", json=checkpoint).status_code == 201
    unread = {} if outcome.unread_params is None else {"unread_params": outcome.unread_params}
    if outcome.fail is not None:
        body = {"lease_id": lease, "kind": "infeasible", "reason": outcome.fail, "step": outcome.fail_step, **unread}
        reply = client.post(f"{API}/trials/{tid}/fail", json=body)
    else:
        reply = client.post(f"{API}/trials/{tid}/complete", json={"lease_id": lease, **unread})
    assert reply.status_code == 200, reply.text


def analysis(client: httpx.Client, study_id: int) -> dict[str, Any]:
    reply = client.get(f"{API}/studies/{study_id}/analysis")
    assert reply.status_code == 200, reply.text
    return reply.json()


def kinds(result: dict[str, Any]) -> list[str]:
    return sorted(w["kind"] for w in result["warnings"])


def grad_norms(seed: int, steps: np.ndarray) -> Curve:
    rng = np.random.default_rng(seed)
    return Curve(steps, 1.0 + 0.5 * rng.random(steps.size))
