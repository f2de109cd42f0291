"""Answers about a study, kept while the study has not changed.

A study's analysis and charts change only when a trial starts, finishes or is added, or while one
runs (its curves grow). Answers are kept per database, study and question, keyed by a one-row
version query, and reused while the version holds (at most `LIVE_SECONDS` while a trial runs).
The expensive loaders (trial summaries, the divergence check over every curve) are shared this way
by every chart and the analysis: a study page asks half a dozen of them at once on its first load,
and one computation serves them all (single flight: the others wait for it rather than repeating
it on the same two cores)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from sqlalchemy import text
from sqlalchemy.orm import Session

from hpo.server.db import Database

T = TypeVar("T")

LIVE_SECONDS = 5.0
_SIZE = 64
_ENTRIES: dict[tuple[int, int, Any], tuple[tuple[str, ...], float, Any]] = {}  # (db, study, what)
_LOCK = threading.Lock()
# One lock per question being computed right now, with how many threads hold or wait for it; it
# goes when the last leaves, so a stream of distinct questions (failing ones included, which
# leave no entry behind) cannot grow this without bound.
_FLIGHTS: dict[tuple[int, int, Any], tuple[threading.Lock, list[int]]] = {}


def version(session: Session, study_id: int) -> tuple[str, ...]:
    """(trials, running, newest start, newest finish, sum of attempts, pending) of a study: changes
    whenever anything derived from it may have changed, except a running trial's new points."""
    row = session.execute(
        text(
            "SELECT count(*), sum(CASE WHEN status = 'running' THEN 1 ELSE 0 END), max(started_at), "
            "max(finished_at), sum(attempt), sum(CASE WHEN status = 'pending' THEN 1 ELSE 0 END) "
            "FROM trials WHERE study_id = :id"
        ),
        {"id": study_id},
    ).one()
    return tuple(str(v) for v in row)


def still(version: tuple[str, ...]) -> bool:
    """Whether no trial runs at this version: it then holds until something changes."""
    return version[1] in ("0", "None")


def study_version(db: Database, study_id: int) -> tuple[str, ...]:
    with db.transaction() as session:
        return version(session, study_id)


def _valid(entry: tuple[tuple[str, ...], float, Any] | None, current: tuple[str, ...], live: bool) -> bool:
    if entry is None or entry[0] != current:
        return False
    if still(current):  # the answer holds until the version changes
        return True
    return live and time.monotonic() - entry[1] <= LIVE_SECONDS


def peek(db: Database, study_id: int, what: Any) -> Any:
    """The kept answer for `what` while it is still valid, else None (computes nothing)."""
    current = study_version(db, study_id)
    with _LOCK:
        entry = _ENTRIES.get((id(db.engine), study_id, what))
    return entry[2] if entry is not None and _valid(entry, current, live=True) else None


def remember(db: Database, study_id: int, what: Any, compute: Callable[[], T], *, live: bool = True) -> T:
    """`compute()`, or the answer it gave while the study's version was the same. With `live`
    False an answer is never reused while a trial runs (for values that follow every new point)."""
    return _remember(id(db.engine), study_id, what, study_version(db, study_id), compute, live)


def in_session(session: Session, study_id: int, what: Any, compute: Callable[[], T], *, live: bool = True) -> T:
    """`remember` within an open session (the version read in it)."""
    return _remember(id(session.get_bind()), study_id, what, version(session, study_id), compute, live)


def _remember(bind: int, study_id: int, what: Any, current: tuple[str, ...], compute: Callable[[], T], live: bool) -> T:
    if not live and not still(current):
        return compute()  # never kept while a trial runs: nothing to share
    key = (bind, study_id, what)
    with _LOCK:
        entry = _ENTRIES.get(key)
    if entry is not None and _valid(entry, current, live):
        return entry[2]  # type: ignore[no-any-return]
    with _flight(key):
        with _LOCK:
            entry = _ENTRIES.get(key)
        if entry is not None and _valid(entry, current, live):
            return entry[2]  # type: ignore[no-any-return]  # computed by the flight we waited for
        value = compute()
        with _LOCK:
            if len(_ENTRIES) >= _SIZE and key not in _ENTRIES:
                oldest = min(_ENTRIES, key=lambda k: _ENTRIES[k][1])
                del _ENTRIES[oldest]
            _ENTRIES[key] = (current, time.monotonic(), value)
        return value


def one_at_a_time(db: Database, study_id: int, what: Any) -> contextlib.AbstractContextManager[None]:
    """A lock per (database, study, `what`), held while one computation of that kind runs."""
    return _flight((id(db.engine), study_id, ("one at a time", what)))


@contextlib.contextmanager
def _flight(key: tuple[int, int, Any]) -> Iterator[None]:
    """Holds the question's lock (single flight), created on first need, removed by the last user."""
    with _LOCK:
        lock, users = _FLIGHTS.setdefault(key, (threading.Lock(), [0]))
        users[0] += 1
    try:
        with lock:
            yield
    finally:
        with _LOCK:
            users[0] -= 1
            if users[0] == 0:
                del _FLIGHTS[key]


def clear() -> None:
    """Forgets every kept answer (tests, benchmarks of cold calls)."""
    with _LOCK:
        _ENTRIES.clear()
