"""A study's first-screen charts kept in the database, per study version, for a fresh server.

The study page's first screen (`FIRST_SCREEN`) starts from the judgement of every trial (trial
summaries, the divergence check over every curve): 1.0-1.5 s of a fresh server's interpreter at
50,000 trials before the first of them answers, then 0.2-0.5 s per chart. The in-process `memo`
keeps the answers, but only in the process that computed them: a restarted server, or another of
several behind one address, judged the study again. So an answer computed while no trial of the
study runs (the version then holds until something changes) is written here too, keyed by the
study's version (`memo.version`) and a digest of the server's code, and any server reads it back
for that version; the keeper's chore (`StillStudies`) computes the rows of large studies that have
gone still, so even the first visit after a study ends reads them. A row whose version or code
differs is never read: the chart is recomputed and the row replaced. The analysis' checklist
(`ANALYSIS`, 3.3-4.5 s of a fresh server at 50,000 trials) is kept the same way.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

import hpo.server
from hpo.server.cache import memo
from hpo.server.db import Database
from hpo.server.errors import HpoError
from hpo.server.models import KeptChart, Trial, TrialStatus
from hpo.trainer import divergence as divergence_rules

_log = logging.getLogger("hpo.server.charts")

# The charts the study page draws first (its template preloads them).
FIRST_SCREEN: tuple[str, ...] = ("history", "axis", "isolation", "importance")
# The analysis' checklist (`GET …/analysis` less its Bayesian view, and the page's warnings and arm
# comparison): 3.3-4.5 s of a fresh server at 50,000 trials, kept like the charts.
ANALYSIS = "analysis"
# Everything a first visit reads kept.
KEPT: tuple[str, ...] = (*FIRST_SCREEN, ANALYSIS)
# Studies smaller than this are judged on request in a fraction of a second: not kept.
KEEP_FROM_TRIALS = 1000
# The options that change these charts' answers; a request naming any is computed, not kept.
_SHAPING_OPTIONS = ("metric", "arm", "x", "y")

Version = tuple[str, ...]


@functools.cache
def code_digest() -> str:
    """A digest of the server's Python sources and of the trainer's divergence rules, which judge
    every trial the charts and the analysis start from: an answer kept by other code is never read."""
    root = Path(hpo.server.__file__).resolve().parent
    digest = hashlib.sha256()
    for path in [*sorted(root.rglob("*.py")), Path(divergence_rules.__file__).resolve()]:
        digest.update(str(path.relative_to(root.parent)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def keepable(kind: str, options: Mapping[str, Any]) -> bool:
    """Whether the answer to this request is one that is kept (a first-screen chart as the page
    asks for it)."""
    return kind in FIRST_SCREEN and all(options.get(name) is None for name in _SHAPING_OPTIONS)


def _key(version: Version) -> str:
    return "\x1f".join(version)


def read_or_compute(db: Database, study_id: int, kind: str, compute: Callable[[], bytes]) -> bytes:
    """The kept answer for the study's current version, else `compute()`, kept when the study is
    still. The version is read before computing, so a row never claims a version older than the
    data it holds. Keeping is best effort: a failed write is logged, the answer still returned."""
    version = memo.study_version(db, study_id)
    if memo.still(version):
        kept = _read(db, study_id, kind, version)
        if kept is not None:
            return kept
    body = compute()
    if memo.still(version):
        _store(db, study_id, kind, version, body)
    return body


def all_kept(db: Database, study_id: int) -> bool:
    """Whether every first-screen chart of the study, and its analysis, is kept for its current
    version."""
    version = memo.study_version(db, study_id)
    if not memo.still(version):
        return False
    with db.transaction() as session:
        kept = session.execute(
            select(func.count()).where(
                KeptChart.study_id == study_id,
                KeptChart.kind.in_(KEPT),
                KeptChart.version == _key(version),
                KeptChart.code == code_digest(),
            )
        ).scalar_one()
    return int(kept) == len(KEPT)


def _read(db: Database, study_id: int, kind: str, version: Version) -> bytes | None:
    with db.transaction() as session:
        return session.execute(
            select(KeptChart.body).where(
                KeptChart.study_id == study_id,
                KeptChart.kind == kind,
                KeptChart.version == _key(version),
                KeptChart.code == code_digest(),
            )
        ).scalar_one_or_none()


def _store(db: Database, study_id: int, kind: str, version: Version, body: bytes) -> None:
    insert = sqlite_insert if db.is_sqlite else pg_insert
    row = {"study_id": study_id, "kind": kind, "version": _key(version), "code": code_digest(), "body": body}
    statement = insert(KeptChart).values(**row)
    statement = statement.on_conflict_do_update(
        index_elements=["study_id", "kind"],
        set_={"version": statement.excluded.version, "code": statement.excluded.code, "body": statement.excluded.body},
    )
    try:
        with db.transaction() as session:
            session.execute(statement)
    except HpoError as exc:
        _log.warning("keeping the %s chart of study %s: %s", kind, study_id, exc)


class StillStudies:
    """The keeper's chore: computes, once per study version, the first-screen charts and the
    analysis of every large study that no trial runs in and whose rows are missing or stale.
    `answer(db, study, kind)` for each kind of `KEPT` is the endpoints' own path
    (`charts.first_visit_answer`), which keeps them."""

    def __init__(
        self, db: Database, answer: Callable[[Database, int, str], object], *, keep_from: int = KEEP_FROM_TRIALS
    ) -> None:
        self.db = db
        self.answer = answer
        self.keep_from = keep_from
        self._tried: dict[int, Version] = {}  # a chart that fails is tried again at the next version

    def __call__(self) -> int:
        """One pass; answers how many studies' charts it computed."""
        done = 0
        for study_id in self._candidates():
            version = memo.study_version(self.db, study_id)
            if self._tried.get(study_id) == version or not memo.still(version) or all_kept(self.db, study_id):
                continue
            self._tried[study_id] = version
            for kind in KEPT:
                try:
                    self.answer(self.db, study_id, kind)
                except HpoError as exc:  # a chart the study cannot draw: its request says why
                    _log.debug("keeping the %s chart of study %s: %s", kind, study_id, exc)
            done += 1
        return done

    def _candidates(self) -> list[int]:
        running = func.sum(case((Trial.status == TrialStatus.running, 1), else_=0))
        query = (
            select(Trial.study_id)
            .group_by(Trial.study_id)
            .having(func.count() >= self.keep_from, running == 0)
            .order_by(Trial.study_id)
        )
        with self.db.transaction() as session:
            return list(session.execute(query).scalars())
