"""The analysis cache keeps no state per distinct question once it is answered
or has failed (a lock per failing chart query used to stay for ever), and still computes a
question once when several ask it at the same time."""

from __future__ import annotations

import threading
import time

import pytest

from hpo.server.cache import memo
from hpo.server.db import Database


def test_failing_and_answered_questions_leave_no_lock_behind(db: Database) -> None:
    memo.clear()

    def fail() -> None:
        raise ValueError("a query that fails")

    for n in range(500):
        with pytest.raises(ValueError):
            memo.remember(db, 1, ("chart", n), fail)
        assert memo.remember(db, 2, ("chart", n), lambda n=n: n) == n
    assert memo._FLIGHTS == {}
    assert len(memo._ENTRIES) <= memo._SIZE


def test_a_question_asked_at_once_is_computed_once(db: Database) -> None:
    memo.clear()
    calls: list[int] = []
    answers: list[str] = []

    def slow() -> str:
        calls.append(1)
        time.sleep(0.3)
        return "answer"

    threads = [threading.Thread(target=lambda: answers.append(memo.remember(db, 3, "slow", slow))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert answers == ["answer"] * 4 and len(calls) == 1
    assert memo._FLIGHTS == {}
