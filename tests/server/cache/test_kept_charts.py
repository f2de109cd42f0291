"""First-screen charts and the analysis kept in the database per study version
(hpo.server.cache.kept): read back by a server that never computed them, never for another
version, other code or other options, never written while a trial runs, and computed by the
keeper's chore once a study is still."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import delete, select, update

from hpo.server.cache import memo
from hpo.server.cache.kept import ANALYSIS, FIRST_SCREEN, KEPT, StillStudies, code_digest
from hpo.server.dashboard.charts import service
from hpo.server.db import Database
from hpo.server.models import KeptChart
from tests.server.analysis.protocol import create, run_pending
from tests.server.analysis.test_planted import spec, valley

MARKER = b'{"kind":"history","kept":"planted by the test"}'


@pytest.fixture
def study(client: httpx.Client) -> dict[str, Any]:
    created = create(client, spec("kept", num_trials=6))
    assert run_pending(client, valley(1.4)) == 6
    return created


@pytest.fixture
def database(database_url: str) -> Iterator[Database]:
    db = Database(database_url)
    yield db
    db.dispose()


def rows(db: Database, study_id: int) -> dict[str, KeptChart]:
    with db.transaction() as session:
        found = session.execute(select(KeptChart).where(KeptChart.study_id == study_id)).scalars().all()
        session.expunge_all()
    return {row.kind: row for row in found}


def set_row(db: Database, study_id: int, kind: str, **values: Any) -> None:
    with db.transaction() as session:
        which = (KeptChart.study_id == study_id, KeptChart.kind == kind)
        session.execute(update(KeptChart).where(*which).values(**values))


def chart(client: httpx.Client, study_id: int, kind: str, **params: Any) -> Any:
    reply = client.get(f"/api/v1/studies/{study_id}/charts/{kind}", params=params)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_a_still_studys_first_screen_is_kept_and_read_back_for_its_version_only(
    client: httpx.Client, database: Database, study: dict[str, Any]
) -> None:
    sid = study["id"]
    answers = {kind: chart(client, sid, kind) for kind in FIRST_SCREEN}
    kept = rows(database, sid)
    assert set(kept) == set(FIRST_SCREEN)
    assert {kind: json.loads(row.body) for kind, row in kept.items()} == answers
    assert {row.code for row in kept.values()} == {code_digest()}
    version = kept["history"].version
    assert version.split("\x1f")[:2] == ["6", "0"]  # six trials, none running

    # A server that never computed it (the in-process answers forgotten) reads the row.
    set_row(database, sid, "history", body=MARKER)
    memo.clear()
    assert chart(client, sid, "history") == json.loads(MARKER)
    # A request with options that shape the chart is computed, not read.
    memo.clear()
    assert chart(client, sid, "history", metric="valid/error_rate") == answers["history"]
    # A row kept by other code is recomputed and replaced.
    set_row(database, sid, "history", code="0" * 64)
    memo.clear()
    assert chart(client, sid, "history") == answers["history"]
    assert rows(database, sid)["history"].code == code_digest()

    # The study changes (one more trial laid out): the row's version no longer holds.
    set_row(database, sid, "history", body=MARKER)
    assert client.patch(f"/api/v1/studies/{sid}", json={"num_trials": 7}).status_code == 200
    fresh = chart(client, sid, "history")
    assert fresh != json.loads(MARKER) and fresh["series"] == answers["history"]["series"]
    assert rows(database, sid)["history"].version.split("\x1f")[:2] == ["7", "0"]

    # While a trial runs nothing is written: the row keeps the still version it had.
    claim = client.post("/api/v1/workers/claim", json={"worker_id": "w", "resources": {"cpus": 64, "gpus": 8}})
    assert claim.status_code == 200
    set_row(database, sid, "axis", body=b'{"kind":"axis","kept":"old"}')
    memo.clear()
    axis = chart(client, sid, "axis")  # a running study's version is never read
    assert "kept" not in axis and axis["panels"] == answers["axis"]["panels"]
    assert json.loads(rows(database, sid)["axis"].body) == {"kind": "axis", "kept": "old"}


def test_the_keepers_chore_keeps_each_still_study_once_per_version(
    client: httpx.Client, database: Database, study: dict[str, Any]
) -> None:
    sid = study["id"]
    chore = StillStudies(database, service.first_visit_answer, keep_from=1)
    with database.transaction() as session:
        session.execute(delete(KeptChart).where(KeptChart.study_id == sid))
    assert chore() == 1
    assert set(rows(database, sid)) == set(KEPT)
    assert chore() == 0  # kept for this version: nothing to do
    # A row missing (a restarted server's chore, at the same version): the study is kept again.
    with database.transaction() as session:
        session.execute(delete(KeptChart).where(KeptChart.study_id == sid, KeptChart.kind == ANALYSIS))
    memo.clear()
    assert StillStudies(database, service.first_visit_answer, keep_from=1)() == 1
    assert set(rows(database, sid)) == set(KEPT)
    # Too small for the server's own keeper (KEEP_FROM_TRIALS): it leaves such a study alone.
    with database.transaction() as session:
        session.execute(delete(KeptChart).where(KeptChart.study_id == sid))
    assert StillStudies(database, service.first_visit_answer)() == 0 and rows(database, sid) == {}
    # A running trial: not still, nothing kept.
    assert client.patch(f"/api/v1/studies/{sid}", json={"num_trials": 7}).status_code == 200
    claim = client.post("/api/v1/workers/claim", json={"worker_id": "w", "resources": {"cpus": 64, "gpus": 8}})
    assert claim.status_code == 200
    assert chore() == 0 and rows(database, sid) == {}


def test_a_still_studys_analysis_is_kept_and_read_back_by_the_api_and_the_page(
    client: httpx.Client, database: Database, study: dict[str, Any]
) -> None:
    sid = study["id"]
    answer = client.get(f"/api/v1/studies/{sid}/analysis").json()
    kept = rows(database, sid)[ANALYSIS]
    assert json.loads(kept.body) == {k: v for k, v in answer.items() if k != "bayesian"}
    assert kept.code == code_digest() and kept.version.split("\x1f")[:2] == ["6", "0"]

    # A server that never computed it reads the row: the API and the study page's sections.
    warning = {"kind": "planted", "message": "kept row", "param": None, "side": None, "trial_id": None}
    planted = {**json.loads(kept.body), "warnings": [warning]}
    set_row(database, sid, ANALYSIS, body=json.dumps(planted).encode())
    memo.clear()
    assert client.get(f"/api/v1/studies/{sid}/analysis").json()["warnings"] == planted["warnings"]
    memo.clear()
    assert "kept row" in client.get(f"/studies/{sid}/analysis-sections").text

    # The study changes: the row's version no longer holds, the analysis is computed and kept again.
    assert client.patch(f"/api/v1/studies/{sid}", json={"num_trials": 7}).status_code == 200
    fresh = client.get(f"/api/v1/studies/{sid}/analysis").json()
    assert fresh["warnings"] != planted["warnings"] and fresh["arms"][0]["n_trials"] == 7
    assert rows(database, sid)[ANALYSIS].version.split("\x1f")[:2] == ["7", "0"]

    # While a trial runs it is computed every time and nothing is written.
    claim = client.post("/api/v1/workers/claim", json={"worker_id": "w", "resources": {"cpus": 64, "gpus": 8}})
    assert claim.status_code == 200
    set_row(database, sid, ANALYSIS, body=json.dumps(planted).encode())
    memo.clear()
    running = client.get(f"/api/v1/studies/{sid}/analysis").json()
    assert running["warnings"] != planted["warnings"]
    assert json.loads(rows(database, sid)[ANALYSIS].body) == planted
