"""The security model (docs/security.md) over real HTTP, on SQLite and Postgres: the execution
allow-list and strict trainer keys, tokens with roles, trial tokens, the dashboard sign-in, and
hostile input that must get a 4xx naming the field, never a 5xx and never a stored row that breaks
later reads."""

from __future__ import annotations

import dataclasses
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from hpo.policy import ExecutionPolicy
from hpo.server.auth import tokens as auth
from hpo.server.config import ServerSettings
from hpo.server.db import Database
from hpo.server.studies import service as studies
from hpo.settings import Settings
from tests.conftest import LiveServer
from tests.server.factories import study_spec

API = "/api/v1"


def small_spec(name: str = "s", **trainer: Any) -> dict[str, Any]:
    spec = study_spec(name=name, num_trials=1)
    # A command study names no workload (a spec gives one or the other).
    runs = {} if "command" in trainer else {"workload": "synthetic_mlp"}
    spec["trainer"] = {**runs, "max_train_steps": 10, **trainer}
    return spec


def fields(response: httpx.Response) -> dict[str, str]:
    assert response.status_code == 422, response.text
    return {e["field"]: e["reason"] for e in response.json()["detail"]}


# --- who may run code ------------------------------------------------------------------------------


def test_a_study_naming_code_outside_the_allow_list_is_refused(client: httpx.Client) -> None:
    refused = fields(
        client.post(f"{API}/studies", json=small_spec(workload="os:system", workload_options={"command": "id"}))
    )
    assert "--allow-workload" in refused["trainer.workload"] and "HPO_ALLOWED_WORKLOADS" in refused["trainer.workload"]
    command = fields(client.post(f"{API}/studies", json=small_spec(command=["bash", "-c", "id"])))
    assert "--allow-command" in command["trainer.command"]
    assert client.get(f"{API}/studies").json()["total"] == 0


def test_unknown_trainer_keys_are_refused_listing_the_known_ones(client: httpx.Client) -> None:
    refused = fields(client.post(f"{API}/studies", json=small_spec(max_steps=10, junk="x" * 1000)))
    assert set(refused) == {"trainer.max_steps", "trainer.junk"}
    assert "max_train_steps" in refused["trainer.max_steps"] and "workload_options" in refused["trainer.max_steps"]
    deep: Any = 1
    for _ in range(20):  # deeper than workload_options may be, within the spec's own limit
        deep = {"a": deep}
    assert "trainer.workload_options" in fields(client.post(f"{API}/studies", json=small_spec(workload_options=deep)))
    # Settings the trainer reads pass, hyperparameter defaults included.
    ok = client.post(f"{API}/studies", json=small_spec(log_every_steps=5, warmup_steps=0, workload_options={}))
    assert ok.status_code == 201, ok.text


def test_the_servers_allow_list_admits_what_the_operator_allows(settings: Settings) -> None:
    policy = ExecutionPolicy(workload_globs=("mylab.*",), command_prefixes=(("python", "train.py"),))
    with (
        LiveServer(dataclasses.replace(settings, execution_policy=policy)) as live,
        httpx.Client(base_url=live.url) as http,
    ):
        assert http.post(f"{API}/studies", json=small_spec("a", workload="mylab.models:Net")).status_code == 201
        ok = http.post(f"{API}/studies", json=small_spec("b", command=["python", "train.py", "--fast"]))
        assert ok.status_code == 201, ok.text
        other_script = small_spec("c", command=["python", "x.py"])
        assert "trainer.command" in fields(http.post(f"{API}/studies", json=other_script))
        assert "trainer.workload" in fields(http.post(f"{API}/studies", json=small_spec("d", workload="other:Net")))
        preload = small_spec("e", command=["python", "train.py"], env={"LD_PRELOAD": "/tmp/evil.so"})
        assert (
            "is not allowed on this fleet"
            in fields(http.post(f"{API}/studies", json=preload))["trainer.env.LD_PRELOAD"]
        )


# --- tokens with roles -----------------------------------------------------------------------------


@pytest.fixture
def secured(settings: Settings) -> Iterator[tuple[LiveServer, dict[str, str]]]:
    """A server with one token of each role (and HPO_API_TOKEN as a second admin token)."""
    db = Database(settings.database_url)
    db.upgrade()
    tokens = {role: auth.create_token(db, role, f"{role} test")[1] for role in auth.ROLES}
    tokens["env-admin"] = "env-admin-" + "x" * 40
    db.dispose()
    with LiveServer(dataclasses.replace(settings, api_token=tokens["env-admin"])) as live:
        yield live, tokens


def _as(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def test_roles_decide_what_each_token_may_call(secured: tuple[LiveServer, dict[str, str]]) -> None:
    live, tokens = secured
    with httpx.Client(base_url=live.url, timeout=30) as http:
        assert http.get("/healthz").status_code == 200 and http.get("/readyz").status_code == 200
        assert http.get(f"{API}/studies").status_code == 401
        assert http.get(f"{API}/studies", headers=_as("hpo_wrong")).status_code == 401
        assert http.get("/openapi.json").status_code == 401
        created = http.post(f"{API}/studies", json=small_spec("w"), headers=_as(tokens["write"]))
        assert created.status_code == 201, created.text
        study_id = created.json()["id"]
        assert http.post(f"{API}/studies", json=small_spec("r"), headers=_as(tokens["read"])).status_code == 403
        assert http.post(f"{API}/studies", json=small_spec("k"), headers=_as(tokens["worker"])).status_code == 403
        for role in ("read", "write", "admin", "env-admin"):
            assert http.get(f"{API}/studies/{study_id}", headers=_as(tokens[role])).status_code == 200, role
        assert http.get(f"{API}/studies/{study_id}", headers=_as(tokens["worker"])).status_code == 403
        claim = {"worker_id": "w", "resources": {"cpus": 64, "gpus": 0}}
        for role in ("read", "write"):
            assert http.post(f"{API}/workers/claim", json=claim, headers=_as(tokens[role])).status_code == 403
        answer = http.post(f"{API}/workers/claim", json=claim, headers=_as(tokens["worker"]))
        assert answer.status_code == 200, answer.text
        patch = http.patch(f"{API}/studies/{study_id}", json={"status": "paused"}, headers=_as(tokens["admin"]))
        assert patch.status_code == 200


def test_a_trial_token_posts_only_its_own_trials_results(secured: tuple[LiveServer, dict[str, str]]) -> None:
    live, tokens = secured
    with httpx.Client(base_url=live.url, timeout=30, headers=_as(tokens["write"])) as http:
        assert http.post(f"{API}/studies", json=study_spec(name="t", num_trials=2)).status_code == 201
        worker = _as(tokens["worker"])
        body = {"worker_id": "w", "resources": {"cpus": 64, "gpus": 0}}
        first = http.post(f"{API}/workers/claim", json=body, headers=worker).json()
        second = http.post(f"{API}/workers/claim", json=body, headers=worker).json()
        trial_token = first["trial_token"]
        assert trial_token.startswith("hpot.") and tokens["worker"] not in trial_token
        as_trial = _as(trial_token)
        points = {"lease_id": first["lease_id"], "points": [{"step": 1, "name": "train/loss", "value": 1.0}]}
        assert http.post(f"{API}/trials/{first['trial_id']}/metrics", json=points, headers=as_trial).status_code == 200
        other = {**points, "lease_id": second["lease_id"]}
        assert http.post(f"{API}/trials/{second['trial_id']}/metrics", json=other, headers=as_trial).status_code == 403
        lease = {"lease_id": first["lease_id"]}
        assert http.post(f"{API}/trials/{first['trial_id']}/complete", json=lease, headers=as_trial).status_code == 403
        assert http.post(f"{API}/workers/claim", json=body, headers=as_trial).status_code == 403
        assert http.get(f"{API}/studies", headers=as_trial).status_code == 403
        forged = trial_token.replace(f"hpot.{first['trial_id']}.", f"hpot.{second['trial_id']}.")
        forged_post = http.post(f"{API}/trials/{second['trial_id']}/metrics", json=other, headers=_as(forged))
        assert forged_post.status_code == 401


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_malformed_trial_token_is_a_401_never_a_server_error(secured: tuple[LiveServer, dict[str, str]]) -> None:
    live, _ = secured
    # Raw header bytes, as a hostile client sends them: latin-1 decodes each to one character, and
    # some of those (b"\xb2", superscript two) pass str.isdigit() but not int().
    malformed = [
        b"hpot.\xb2.a.b",
        b"hpot.\xb9\xb2.lease.mac",
        b"hpot.1.\xff\xfe.mac",
        b"hpot.1.lease.\xe9\xe9",
        b"hpot.x.lease.mac",
        b"hpot.-1.lease.mac",
        b"hpot.1..mac",
        b"hpot...",
        b"hpot.",
        b"hpot.1.a.b.c.d",
        b"hpot.12345678901.lease.mac",
        b"hpot.1 .lease.mac",
        b"hpot.\xd9\xa1.lease.mac",  # U+0661 ARABIC-INDIC DIGIT ONE in UTF-8
    ]
    with httpx.Client(base_url=live.url, timeout=30) as http:
        for token in malformed:
            for method, path in (("GET", f"{API}/studies"), ("POST", f"{API}/trials/1/metrics")):
                answer = http.request(method, path, headers=[(b"Authorization", b"Bearer " + token)], json={})
                assert answer.status_code == 401, (token, method, answer.status_code, answer.text[:300])
                assert "Traceback" not in answer.text and len(answer.text) < 500
            # The sign-in form takes the token from a body: a 401 there too, no session.
            signin = http.post("/signin", content=b"token=" + token.replace(b" ", b"+"), headers=_FORM)
            assert signin.status_code in (401, 422), (token, signin.status_code)
            assert "hpo_session" not in signin.headers.get("set-cookie", "")


_FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def test_a_revoked_token_stops_working(settings: Settings) -> None:
    db = Database(settings.database_url)
    db.upgrade()
    info, token = auth.create_token(db, "read")
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, headers=_as(token)) as http:
        assert http.get(f"{API}/studies").status_code == 200
        auth.revoke_token(db, info.id)
        time.sleep(auth.CACHE_SECONDS + 0.2)
        assert http.get(f"{API}/studies").status_code == 401
        assert [t.active for t in auth.list_tokens(db)] == [False]
    db.dispose()


# --- the dashboard's sign-in ---------------------------------------------------------------------


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_dashboard_sign_in_session_csrf_and_sign_out(secured: tuple[LiveServer, dict[str, str]]) -> None:
    live, tokens = secured
    html = {"Accept": "text/html"}
    with httpx.Client(base_url=live.url, timeout=30) as browser:
        away = browser.get("/studies/1?x=1", headers=html)
        assert away.status_code == 303 and away.headers["location"] == "/signin?next=%2Fstudies%2F1%3Fx%3D1"
        assert "Token" in browser.get("/signin").text
        wrong = browser.post("/signin", data={"token": "hpo_nope", "next": "/"})
        assert wrong.status_code == 401 and "hpo_session" not in browser.cookies
        signed = browser.post("/signin", data={"token": tokens["write"], "next": "//evil.example/"})
        assert signed.status_code == 303 and signed.headers["location"] == "/"
        cookie = next(c for c in signed.headers.get_list("set-cookie") if c.startswith("hpo_session="))
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and tokens["write"] not in cookie
        page = browser.get("/", headers=html)
        assert page.status_code == 200 and "/static/csrf.js" in page.text
        assert "X-HPO-CSRF" in browser.get("/static/csrf.js").text
        # A write riding on the cookie alone (what a cross-site form would do) is refused.
        assert browser.post(f"{API}/studies", json=small_spec("c")).status_code == 403
        csrf = browser.cookies["hpo_csrf"]
        ok = browser.post(f"{API}/studies", json=small_spec("c"), headers={"X-HPO-CSRF": csrf})
        assert ok.status_code == 201, ok.text
        assert browser.post("/signout", data={"csrf": "wrong"}).status_code == 403
        out = browser.post("/signout", data={"csrf": csrf})
        assert out.status_code == 303 and "hpo_session" not in browser.cookies
        assert browser.get(f"{API}/studies").status_code == 401


# --- hostile input ---------------------------------------------------------------------------------


def test_nul_and_lone_surrogates_are_refused_before_the_database(client: httpx.Client) -> None:
    for text in ('"na\\u0000me"', '"\\ud800"', '"\\udc00x"', '"\\ud800\\ud800\\udc00"'):
        body = f'{{"name": "s", "description": {text}}}'.encode()
        response = client.post(f"{API}/studies", content=body, headers={"content-type": "application/json"})
        assert fields(response).keys() == {"body"}, text
    sci = '{"name": "c", "role": "scientific", "type": "categorical", "values": ["a", "\\ud800"]}'
    body = f'{{"name": "sur", "hyperparameters": [{sci}]}}'.encode()
    assert client.post(f"{API}/studies", content=body, headers={"content-type": "application/json"}).status_code == 422
    assert fields(client.get(f"{API}/trials/1/metrics", params={"name": "a\x00b"})).keys() == {"query"}
    raw = b'{"name": "s", "description": "\xed\xa0\x80"}'  # a surrogate encoded as UTF-8: not UTF-8
    assert client.post(f"{API}/studies", content=raw, headers={"content-type": "application/json"}).status_code == 422
    # A real pair and an escaped backslash followed by the letters u0000 are ordinary text.
    spec = small_spec("ok \U0001f600 \\u0000")
    assert client.post(f"{API}/studies", json=spec).status_code == 201
    assert client.get(f"{API}/studies").json()["items"][0]["name"] == spec["name"]


def test_numbers_are_strict_and_bounded(client: httpx.Client) -> None:
    assert client.post(f"{API}/studies", json=study_spec(name="n", num_trials=2)).status_code == 201
    assert "offset" in fields(client.get(f"{API}/studies", params={"offset": 9223372036854775808}))
    assert "offset" in fields(client.get(f"{API}/studies/1/trials", params={"offset": 2**40}))
    claim = client.post(f"{API}/workers/claim", json={"worker_id": "w", "resources": {"cpus": 64, "gpus": 0}}).json()
    trial, lease = claim["trial_id"], claim["lease_id"]
    checkpoint = {"lease_id": lease, "step": 1, "uri": "x", "objective": {"a": 1}}
    assert "objective" in fields(client.post(f"{API}/trials/{trial}/checkpoints", json=checkpoint))
    huge = {**checkpoint, "objective": 10**400}
    assert "objective" in fields(client.post(f"{API}/trials/{trial}/checkpoints", json=huge))
    assert "step" in fields(client.post(f"{API}/trials/{trial}/checkpoints", json={**checkpoint, "step": "7"}))
    point = {"lease_id": lease, "points": [{"step": True, "name": "a", "value": 1}]}
    assert "points[0].step" in fields(client.post(f"{API}/trials/{trial}/metrics", json=point))
    assert "count" in fields(client.post(f"{API}/trials/{trial}/replicas", json={"count": True}))
    assert "num_trials" in fields(client.patch(f"{API}/studies/1", json={"num_trials": "3"}))
    deep: Any = 1
    for _ in range(900):
        deep = [deep]
    assert client.post(f"{API}/studies", json=small_spec("deep", workload_options={"x": deep})).status_code == 422
    nested = "[" * 100_000 + "]" * 100_000
    body = f'{{"name": "x", "trainer": {{"a": {nested}}}}}'.encode()
    assert client.post(f"{API}/studies", content=body, headers={"content-type": "application/json"}).status_code == 422
    params = {"trials": [{"params": {"optimizer": {"nested": [1]}}}]}
    assert client.post(f"{API}/studies/1/trials", json=params).status_code == 422


def test_the_trial_cap_holds_on_every_path(client: httpx.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    # The server runs in this process: a cap of 100 instead of 100,000 keeps the test fast.
    monkeypatch.setattr(studies, "MAX_TRIALS_PER_STUDY", 100)
    spec = study_spec(name="cap", num_trials=49)  # 2 arms: 98 trials
    created = client.post(f"{API}/studies", json=spec)
    assert created.status_code == 201, created.text
    study_id = created.json()["id"]
    first = client.get(f"{API}/studies/{study_id}/trials", params={"limit": 1}).json()["items"][0]["id"]
    assert "count" in fields(client.post(f"{API}/trials/{first}/replicas", json={"count": 3}))
    assert client.post(f"{API}/trials/{first}/replicas", json={"count": 1}).status_code == 201
    manual = {"trials": [{"params": {"optimizer": "adam", "learning_rate": 0.01, "beta1": 0.9, "weight_decay": 1e-4}}]}
    assert client.post(f"{API}/studies/{study_id}/trials", json=manual).status_code == 201
    assert "trials" in fields(client.post(f"{API}/studies/{study_id}/trials", json=manual))
    assert "num_trials" in fields(client.patch(f"{API}/studies/{study_id}", json={"num_trials": 50}))
    assert client.get(f"{API}/studies/{study_id}").json()["num_trials"] == 49


def test_tracking_csv_cells_never_run_as_formulas(client: httpx.Client) -> None:
    spec = study_spec(name="=HYPERLINK(1)", description="@SUM(A1) +1 -1", num_trials=1)
    assert client.post(f"{API}/studies", json=spec).status_code == 201
    text = client.get(f"{API}/studies.csv").text
    assert "'=HYPERLINK(1)" in text and "'@SUM(A1) +1 -1" in text
    assert ",=" not in text and ",@" not in text


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_oversized_chunked_and_stalled_bodies_are_cut_off(settings: Settings) -> None:
    with LiveServer(dataclasses.replace(settings, max_body_bytes=2048), ServerSettings(body_seconds=1.0)) as live:

        def chunks() -> Iterator[bytes]:
            for _ in range(10):
                yield b'{"name": "' + b"x" * 1000

        for path in ("/studies", "/trials/1/metrics"):
            headers = {"content-type": "application/json"}
            response = httpx.post(f"{live.url}{API}{path}", content=chunks(), headers=headers)
            assert response.status_code == 413, response.text
        with socket.create_connection(("127.0.0.1", live.port), timeout=10) as sock:
            sock.sendall(
                b"POST /api/v1/studies HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 100\r\n\r\n{"name"'
            )
            started = time.monotonic()
            answer = sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408") and time.monotonic() - started < 5
