"""`load.beside`: a read on a second Postgres connection, in a thread, beside the caller's own
(the trial summaries are built while the curve statistics wait on Postgres); on SQLite, now."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from hpo.server.analysis import load
from hpo.server.analysis.model import TrialSummary
from hpo.server.db import Database


def test_on_postgres_the_read_runs_on_another_connection_and_its_error_reaches_the_caller(db: Database) -> None:
    with db.transaction() as session:
        if session.get_bind().dialect.name == "sqlite":
            seen = load.beside(session, lambda other: other is session).result()
            assert seen is True, "on SQLite the read runs on the caller's own session"
        else:
            mine = session.execute(text("SELECT pg_backend_pid()")).scalar_one()
            other = load.beside(session, lambda o: o.execute(text("SELECT pg_backend_pid()")).scalar_one())
            assert other.result(timeout=30) != mine
        failing = load.beside(session, lambda o: o.execute(text("SELECT * FROM no_such_table")).all())
        with pytest.raises(Exception, match="no_such_table"):
            failing.result(timeout=30)
        # the caller's own transaction is untouched by the other's failure on Postgres
        if session.get_bind().dialect.name != "sqlite":
            assert session.execute(text("SELECT 1")).scalar_one() == 1


def test_with_last_steps_sets_each_trials_step_and_none_where_unknown() -> None:
    trials = [TrialSummary(id=i, number=i, arm={}, params={}, status="completed", objective=0.5) for i in (1, 2)]
    out = load.with_last_steps(trials, {1: 40})
    assert [t.last_step for t in out] == [40, None]
    assert out[0].feasible and not out[0].infeasible
