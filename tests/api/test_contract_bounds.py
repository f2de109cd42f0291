"""Bounds and contract gaps, over real HTTP on SQLite and Postgres: each refusal is a 422 naming the
field (a taken name: a 409 naming it) answered before anything is laid out, so in under a second
whatever the spec's size; and the API description says what the server accepts."""

from __future__ import annotations

import re
import time
from typing import Any

import httpx
import pytest

from tests.server.rounds.test_rounds_api import make_pipeline, make_round

API = "/api/v1"
BIG = 99_999


def _halton(name: str, num_trials: int) -> dict[str, Any]:
    return {
        "name": name,
        "num_trials": num_trials,
        "hyperparameters": [
            {"name": "learning_rate", "role": "nuisance", "type": "float", "min": 1e-4, "max": 1.0, "scale": "log"},
            {"name": "weight_decay", "role": "nuisance", "type": "float", "min": 1e-6, "max": 1e-2, "scale": "log"},
        ],
    }


def _manual(name: str, count: int) -> dict[str, Any]:
    return {
        "name": name,
        "algorithm": "manual",
        "hyperparameters": [
            {"name": "learning_rate", "role": "nuisance", "type": "float", "min": 1e-4, "max": 1.0, "scale": "log"}
        ],
        "trials": [{"params": {"learning_rate": 1e-4 + i * 1e-9}} for i in range(count)],
    }


def _timed(call: Any) -> tuple[httpx.Response, float]:
    start = time.perf_counter()
    reply = call()
    return reply, time.perf_counter() - start


def _fields(reply: httpx.Response) -> list[str]:
    return [d["field"] for d in reply.json()["detail"]]


def test_a_taken_name_is_refused_before_any_trial_is_laid_out(client: httpx.Client) -> None:
    assert client.post(f"{API}/studies", json=_halton("taken", 2)).status_code == 201
    for body in (_halton("taken", BIG), _manual("taken", BIG)):
        reply, seconds = _timed(lambda body=body: client.post(f"{API}/studies", json=body))
        assert reply.status_code == 409, reply.text
        assert "'taken'" in reply.json()["detail"]
        assert seconds < 1.0, f"{body.get('algorithm', 'halton')}: the 409 took {seconds:.2f} s"
    assert client.get(f"{API}/studies").json()["total"] == 1


def test_growth_to_the_cap_and_its_refusals(client: httpx.Client) -> None:
    study = client.post(f"{API}/studies", json=_halton("grows", 1)).json()
    # Over the cap, and a manual study that cannot grow: refused at once, nothing added.
    reply, seconds = _timed(lambda: client.patch(f"{API}/studies/{study['id']}", json={"num_trials": 100_001}))
    assert reply.status_code == 422 and _fields(reply) == ["num_trials"] and seconds < 1.0, (reply.text, seconds)
    manual = client.post(f"{API}/studies", json=_manual("manual", 2)).json()
    reply, seconds = _timed(lambda: client.patch(f"{API}/studies/{manual['id']}", json={"num_trials": BIG}))
    assert reply.status_code == 422 and _fields(reply) == ["num_trials"] and seconds < 1.0, (reply.text, seconds)

    reply, seconds = _timed(lambda: client.patch(f"{API}/studies/{study['id']}", json={"num_trials": BIG}))
    assert reply.status_code == 200, reply.text
    assert reply.json()["num_trials"] == BIG and sum(reply.json()["trial_counts"].values()) == BIG
    # Laid out a chunk at a time (docs/security.md, "Hostile input"): seconds, not tens of seconds.
    assert seconds < 20.0, f"growing to {BIG} trials took {seconds:.1f} s"
    page = client.get(f"{API}/studies/{study['id']}/trials", params={"limit": 2, "offset": BIG - 2}).json()
    assert [t["number"] for t in page["items"]] == [BIG - 2, BIG - 1]


@pytest.mark.parametrize("offset", [2**31, 2**63, 2**64])
def test_every_list_offset_is_bounded_alike(client: httpx.Client, offset: int) -> None:
    study = client.post(f"{API}/studies", json=_halton("offsets", 2)).json()
    for path in (
        f"{API}/studies",
        f"{API}/studies/{study['id']}/trials",
        f"{API}/studies/{study['id']}/table",
        f"{API}/pipelines",
    ):
        reply = client.get(path, params={"offset": offset})
        assert reply.status_code == 422, (path, reply.status_code, reply.text)
        assert _fields(reply) == ["offset"], (path, reply.text)
    assert client.get(f"{API}/studies/{study['id']}/table", params={"offset": 2**31 - 1}).json()["rows"] == []


def test_an_unknown_recipe_option_is_named_not_ignored(client: httpx.Client) -> None:
    pipeline = make_pipeline(client)
    round_ = make_round(client, pipeline["id"])
    url = f"{API}/rounds/{round_['id']}/recipes/steps"
    reply = client.post(url, params={"dry_run": "true"}, json={"options": {"ratez": 3}})
    assert reply.status_code == 422, reply.text
    assert _fields(reply) == ["options.ratez"]
    assert "rates" in reply.json()["detail"][0]["reason"] and "threshold" in reply.json()["detail"][0]["reason"]
    # Each recipe knows its own options: `top` belongs to longer, not to instability.
    reply = client.post(f"{API}/rounds/{round_['id']}/recipes/instability", json={"options": {"top": 2}})
    assert reply.status_code == 422 and _fields(reply) == ["options.top"], reply.text
    assert client.get(f"{API}/rounds/{round_['id']}").json()["studies"] == []
    # The spelled option is read: 3 rates, not the default 5.
    reply = client.post(url, params={"dry_run": "true"}, json={"options": {"rates": 3}})
    assert reply.status_code == 200, reply.text
    assert len(reply.json()["options"]["rates"]) == 3


def test_the_dry_run_answers_what_the_api_description_documents(client: httpx.Client) -> None:
    operation = client.get("/openapi.json").json()["paths"][f"{API}/rounds/{{round_id}}/recipes/{{kind}}"]["post"]
    pipeline = make_pipeline(client)
    round_ = make_round(client, pipeline["id"])
    url = f"{API}/rounds/{round_['id']}/recipes/instability"
    dry = client.post(url, params={"dry_run": "true"}, json={})
    assert dry.status_code == 200 and str(dry.status_code) in operation["responses"], (dry.text, operation)
    made = client.post(url, json={})
    assert made.status_code == 201 and str(made.status_code) in operation["responses"], made.text


def _string_schemas(node: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        kind = node.get("type")
        if kind == "string" or (isinstance(kind, list) and "string" in kind):
            found.append(node)
        for value in node.values():
            found.extend(_string_schemas(value))
    elif isinstance(node, list):
        for value in node:
            found.extend(_string_schemas(value))
    return found


def test_the_api_description_refuses_the_strings_the_server_refuses(client: httpx.Client) -> None:
    document = client.get("/openapi.json").json()
    parameters = [
        p["schema"] for ops in document["paths"].values() for op in ops.values() for p in op.get("parameters", [])
    ]
    strings = [
        s
        for s in _string_schemas(document["components"]["schemas"]) + _string_schemas(parameters)
        if "enum" not in s and "const" not in s
    ]
    assert len(strings) > 50
    for schema in strings:
        patterns = [schema.get("pattern"), *(part.get("pattern") for part in schema.get("allOf", []))]
        assert all(re.search(p, "ok é 😀") for p in patterns if p), schema
        for refused in ("x\ud800", "\udc00", "a\x00b"):
            assert any(p and not re.search(p, refused) for p in patterns), (schema, refused)
    # A dictionary's keys too: the server refuses them alike.
    trainer = document["components"]["schemas"]["PipelineCreate"]["properties"]["trainer"]
    assert not re.search(trainer["propertyNames"]["pattern"], "k\ud800"), trainer
    body = b'{"name": "x\\ud800", "baseline": {"params": {}}}'
    reply = client.post(f"{API}/pipelines", content=body, headers={"content-type": "application/json"})
    assert reply.status_code == 422, reply.text
