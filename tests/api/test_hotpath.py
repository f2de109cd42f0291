"""The direct path of claims and heartbeats on Postgres (hpo.server.api.hotpath): it takes the
common calls, answers them as the routes do, and hands everything else to the routes (a body
that is not valid, another content type, a lost lease, a trial the worker may not run)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from psycopg import sql as psycopg_sql
from sqlalchemy import select

from hpo.policy import ExecutionPolicy
from hpo.server.db import Database
from hpo.server.models import Trial, TrialStatus
from hpo.server.studies import service as studies
from hpo.server.trials import leases, leases_async
from hpo.settings import Settings
from tests.conftest import LiveServer

pytestmark = pytest.mark.postgres
API = "/api/v1"
SPEC = {
    "name": "hot",
    "num_trials": 3,
    "hyperparameters": [{"name": "learning_rate", "role": "nuisance", "type": "float", "min": 1e-4, "max": 1.0}],
}


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How often the direct path ran a claim and a heartbeat (the live server runs in this process)."""
    counted = {"claim": 0, "heartbeat": 0}
    for name in counted:
        original = getattr(leases_async, name)

        async def spy(*args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
            counted[_name] += 1
            return await _original(*args, **kwargs)

        monkeypatch.setattr(leases_async, name, spy)
    return counted


@pytest.fixture
def served(postgres_url: str, tmp_path: Path) -> Iterator[tuple[httpx.Client, Database]]:
    settings = Settings(database_url=postgres_url, artifact_root=tmp_path / "artifacts", lease_seconds=60)
    with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        db = Database(postgres_url)
        yield http, db
        db.dispose()


def _claim(http: httpx.Client, **extra: Any) -> httpx.Response:
    return http.post(f"{API}/workers/claim", json={"worker_id": "w", "resources": {"cpus": 8}, **extra})


def test_claims_and_heartbeats_take_the_direct_path_and_answer_as_the_routes(
    served: tuple[httpx.Client, Database], calls: dict[str, int]
) -> None:
    http, db = served
    studies.create_study(db, SPEC)
    answer = _claim(http)
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/json"
    claim = answer.json()
    # The fields and values the route's Claim carries (a second claim through the service itself).
    direct = leases.claim(db, "w2", 8, 0, 60)
    assert direct is not None and set(claim) == set(direct.model_dump())
    assert claim["attempt"] == 1 and claim["resume_from"] is None and claim["trial_token"] is None
    assert claim["config"]["params"].keys() == direct.config["params"].keys()
    beat = http.post(f"{API}/trials/{claim['trial_id']}/heartbeat", json={"lease_id": claim["lease_id"]})
    assert beat.status_code == 200 and set(beat.json()) == {"lease_expires_at", "should_stop"}
    assert beat.json()["should_stop"] is False and beat.json()["lease_expires_at"] >= claim["lease_expires_at"]
    assert _claim(http).status_code == 200
    empty = _claim(http)
    assert empty.status_code == 204 and empty.content == b""
    assert calls == {"claim": 3, "heartbeat": 1}


def test_what_the_direct_path_does_not_answer_goes_to_the_routes(
    served: tuple[httpx.Client, Database], calls: dict[str, int]
) -> None:
    http, db = served
    studies.create_study(db, SPEC)
    invalid = http.post(f"{API}/workers/claim", json={"worker_id": "w", "resources": {"cpus": "many"}})
    assert invalid.status_code == 422 and invalid.json()["detail"][0]["field"] == "resources.cpus"
    unknown = http.post(f"{API}/workers/claim", json={"worker_id": "w", "cpu": 1})
    assert unknown.status_code == 422 and unknown.json()["detail"][0]["field"] == "cpu"
    as_text = http.post(f"{API}/workers/claim", content=b'{"worker_id": "w"}', headers={"content-type": "text/plain"})
    assert as_text.status_code == 422
    claim = _claim(http).json()
    lost = http.post(f"{API}/trials/{claim['trial_id']}/heartbeat", json={"lease_id": "0" * 36})
    assert lost.status_code == 409
    missing = http.post(f"{API}/trials/999999/heartbeat", json={"lease_id": claim["lease_id"]})
    assert missing.status_code == 404
    assert http.post(f"{API}/trials/0/heartbeat", json={"lease_id": claim["lease_id"]}).status_code == 422
    long = http.post(f"{API}/trials/{claim['trial_id']}/heartbeat", json={"lease_id": "x" * 37})
    assert long.status_code == 422 and long.json()["detail"][0]["field"] == "lease_id"
    assert calls == {"claim": 1, "heartbeat": 2}  # the lost and the missing lease, then the routes


def test_a_trial_the_worker_may_not_run_is_handed_back_and_skipped(
    served: tuple[httpx.Client, Database], calls: dict[str, int]
) -> None:
    http, db = served
    policy = ExecutionPolicy(workload_globs=("mylab.*",))
    spec = {**SPEC, "trainer": {"workload": "mylab.models:Net"}, "hyperparameters": SPEC["hyperparameters"]}
    studies.create_study(db, spec, policy)
    refused = _claim(http, capabilities={"workloads": [], "commands": [], "env": []})
    assert refused.status_code == 204
    with db.transaction() as session:
        rows = session.execute(select(Trial.status, Trial.attempt, Trial.lease_id)).all()
    assert {(status, attempt, lease) for status, attempt, lease in rows} == {(TrialStatus.pending, 0, None)}
    allowed = _claim(http, capabilities={"workloads": ["mylab.*"], "commands": [], "env": []})
    assert allowed.status_code == 200 and allowed.json()["attempt"] == 1
    assert calls["claim"] == 2


def test_whether_a_worker_runs_a_study_is_not_taken_from_another_database_s_study(
    postgres_template: str, served: tuple[httpx.Client, Database], calls: dict[str, int]
) -> None:
    """Study ids start at 1 in every database: what a worker may run was once remembered per study
    id, so a built-in study 1 of another database (a test's, a restored one) made this server hand
    out its own study 1, a workload the worker refuses."""
    from tests.conftest import _clone_postgres, _drop_postgres

    name, other_url = _clone_postgres(postgres_template)
    try:
        settings = Settings(database_url=other_url, artifact_root=Path("/nonexistent"), lease_seconds=60)
        other_db = Database(other_url)
        builtin_study = studies.create_study(other_db, SPEC)
        with LiveServer(settings) as other, httpx.Client(base_url=other.url, timeout=30) as other_http:
            ran = _claim(other_http, capabilities={"workloads": [], "commands": [], "env": []})
            assert ran.status_code == 200 and ran.json()["study_id"] == builtin_study.id
        other_db.dispose()
    finally:
        _drop_postgres(name)
    http, db = served
    spec = {**SPEC, "trainer": {"workload": "mylab.models:Net"}}
    workload_study = studies.create_study(db, spec, ExecutionPolicy(workload_globs=("mylab.*",)))
    assert workload_study.id == builtin_study.id
    assert _claim(http, capabilities={"workloads": [], "commands": [], "env": []}).status_code == 204


def test_a_prepared_claims_generic_plan_reads_the_partial_index_of_pending_trials(postgres_url: str) -> None:
    """Postgres keeps one generic plan for a prepared statement only when it costs no more than a
    fresh one: with the pending status bound as a parameter, the generic plan could not use the
    partial index (its predicate needs the literal) and every claim was planned again."""
    db = Database(postgres_url)
    db.upgrade()
    studies.create_study(db, {**SPEC, "num_trials": 2000})
    names: list[str] = []

    def positional(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    statement = re.sub(r"%\((\w+)\)s", positional, leases_async._CLAIM.sql)
    values = leases_async._CLAIM.params(
        {"lease_id": "l", "worker_id": "w", "cpus": 8.0, "gpus": 0.0, "lease_seconds": 60.0}
    )
    connection = db.engine.raw_connection()
    try:
        cursor = connection.cursor()
        cursor.execute("PREPARE claim AS " + statement)
        cursor.execute("SET plan_cache_mode = force_generic_plan")
        arguments = psycopg_sql.SQL(", ").join(psycopg_sql.Literal(values[name]) for name in names)
        cursor.execute(psycopg_sql.SQL("EXPLAIN EXECUTE claim({})").format(arguments))
        plan = "\n".join(row[0] for row in cursor.fetchall())
        assert "ix_trials_pending_id" in plan, plan
        connection.rollback()
    finally:
        connection.close()
        db.dispose()
