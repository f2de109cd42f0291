"""The API against its own OpenAPI document, fuzzed by schemathesis over real HTTP on SQLite and
Postgres: generated (seeded, bounded) requests to every operation, then stateful runs that follow
the document's links (create a study, list its trials, claim one, post its results). No answer may
be a server error, and every answer must match the document: status, content type, body schema.

Not checked: that every schema-valid request is accepted (schemathesis' positive_data_acceptance).
A study can be schema-valid and still refused for reasons a JSON schema cannot say (a `min` above
its `max`, a trial cap reached); those answer 422 naming the field, which is the contract."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis.stateful import run_state_machine_as_test  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from sqlalchemy import create_engine, text  # noqa: E402

from hpo.server.models import Base  # noqa: E402
from hpo.settings import Settings  # noqa: E402
from tests.conftest import LiveServer, _clone_postgres, _drop_postgres  # noqa: E402
from tests.server.factories import study_spec  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]
SETTINGS = settings(
    max_examples=20,
    derandomize=True,  # seeded: the same cases every run
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.generate],
)


DATABASES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@contextlib.contextmanager
def seeded_server(request: pytest.FixtureRequest, root: Path) -> Iterator[LiveServer]:
    """A server on the requested database with a study to find (ids 1 and 1..4)."""
    dropped: str | None = None
    if request.param == "sqlite":
        url = f"sqlite:///{root / 'hpo.db'}"
    else:
        dropped, url = _clone_postgres(request.getfixturevalue("postgres_template"))
    with LiveServer(Settings(database_url=url, artifact_root=root / "artifacts")) as live:
        created = httpx.post(f"{live.url}/api/v1/studies", json=study_spec(name="seeded", num_trials=2), timeout=30)
        assert created.status_code == 201, created.text
        yield live
    if dropped is not None:
        _drop_postgres(dropped)


@pytest.fixture(scope="module", params=DATABASES)
def fuzzed_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One server per database for the fuzzing of every operation."""
    with seeded_server(request, tmp_path_factory.mktemp("fuzz")) as live:
        yield live


@pytest.fixture(params=DATABASES)
def stateful_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LiveServer]:
    """A fresh server for the stateful runs: hypothesis replays a derandomized run step by step, and
    the links it follows must find the same state each time, not what the fuzzing left behind."""
    with seeded_server(request, tmp_path) as live:
        yield live


@pytest.fixture
def api_schema(fuzzed_server: LiveServer) -> Any:
    return schemathesis.openapi.from_url(f"{fuzzed_server.url}/openapi.json")


def studies_total(server: LiveServer) -> int:
    return int(httpx.get(f"{server.url}/api/v1/studies", timeout=30).json()["total"])


def test_every_operation_answers_per_its_contract(api_schema: Any, fuzzed_server: LiveServer) -> None:
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 20
    for operation in operations:

        @given(case=operation.as_strategy())
        @SETTINGS
        def fuzz(case: Any) -> None:
            case.call_and_validate(checks=CHECKS)

        fuzz()
    # The document describes the real study body: the fuzzer built studies the server accepted.
    assert studies_total(fuzzed_server) > 1


def reset(server: LiveServer) -> None:
    """Empties every table (ids restart at 1) and seeds the one study again, so that each of
    hypothesis' runs meets the same server: a run that replays a prefix must see the answers it saw
    (a second study of one name is a 409, not a 201), or hypothesis calls the test flaky."""
    engine = create_engine(server.settings.database_url)
    tables = [t.name for t in Base.metadata.sorted_tables]
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            # There `metric_points` is a view over `metric_chunks` (migration 0014).
            tables = [name for name in tables if name != "metric_points"] + ["metric_chunks"]
            conn.execute(text(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE"))
        else:
            for name in reversed(tables):
                conn.execute(text(f"DELETE FROM {name}"))
    engine.dispose()
    created = httpx.post(f"{server.url}/api/v1/studies", json=study_spec(name="seeded", num_trials=2), timeout=30)
    assert created.status_code == 201 and created.json()["id"] == 1, created.text


def test_stateful_runs_follow_the_links_without_a_server_error(stateful_server: LiveServer) -> None:
    base = schemathesis.openapi.from_url(f"{stateful_server.url}/openapi.json").as_state_machine()
    created: list[int] = []

    class Workflow(base):  # type: ignore[misc, valid-type]
        def setup(self) -> None:
            reset(stateful_server)

        def teardown(self) -> None:
            created.append(studies_total(stateful_server) - 1)

        def validate_response(self, response: Any, case: Any, **kwargs: Any) -> None:
            case.validate_response(response, checks=CHECKS)

    run_state_machine_as_test(
        Workflow,
        settings=settings(
            max_examples=15,
            stateful_step_count=8,
            derandomize=True,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
    assert max(created) > 0, "some run created a study through the links"
