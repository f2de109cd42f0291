"""Keeps the curve statistics of ended trials (`load.curve_stats`), and the downsampled curves
of completed ones as the curves chart draws them (`sketches`), in the database as trials end, from
a thread of each server process, so that a study page's first visit, and the analysis' first call,
read them instead of aggregating every metric point of the study on the request path (3,000,000
points took 1.1-2 s of Postgres, and up to 7 s on a loaded machine, of a first visit;
docs/decisions.md).

Each pass finds the studies with an ended trial that has no kept row for its attempt, and keeps the
missing rows with the very function the analysis reads them through (`load.keep_curve_stats`,
with the names, horizon and training-loss name `divergence.load_trials` asks for; `sketches.keep`
with the chart's default width), so a kept row is always one the reader would have computed; one
whose key no longer holds (a changed spec) is recomputed at read as before. On Postgres an advisory
lock per study makes one process of several do the work. The first pass looks at every trial; later
passes at the trials finished since the previous pass (with a minute's margin)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select, text

from hpo.server.analysis import load
from hpo.server.analysis.rules.divergence import curve_names, train_loss_name
from hpo.server.db import Database
from hpo.server.errors import StorageError, one_line
from hpo.server.metrics import sketches
from hpo.server.models import Trial

_log = logging.getLogger("hpo.server.analysis")

INTERVAL = 10.0  # seconds between passes
_MARGIN = timedelta(minutes=1)
_LOCK_CLASS = 0x68706F  # advisory lock namespace (`hpo`), the study id being the second key

_UNKEPT = f"""
SELECT DISTINCT t.study_id FROM trials t
WHERE t.status IN {load.ENDED} {{since}}
  AND (NOT EXISTS (SELECT 1 FROM curve_stats c WHERE c.trial_id = t.id AND c.attempt = t.attempt)
       OR (t.status = 'completed'
           AND NOT EXISTS (SELECT 1 FROM curve_sketches s WHERE s.trial_id = t.id AND s.attempt = t.attempt)))
"""


def keep_study(db: Database, study_id: int) -> int:
    """Keeps the missing curve statistics of one study's completed trials (see the module doc);
    answers how many trials it aggregated (0 when another process holds the study's lock)."""
    with db.transaction() as session:
        if not db.is_sqlite:
            mine = session.execute(text("SELECT pg_try_advisory_xact_lock(:c, :s)"), {"c": _LOCK_CLASS, "s": study_id})
            if not mine.scalar():
                return 0
        study = load.study_info(session, study_id)
        train = train_loss_name(study)
        names = curve_names(study.metric, train)
        horizon = load.horizon(session, study)
        aggregated = load.keep_curve_stats(session, study.id, names, horizon, train)
        sketched = sketches.keep(session, study.id, names, sketches.bucket_width(horizon))
        return max(aggregated, sketched)


def studies_to_keep(db: Database, since: datetime | None = None) -> list[int]:
    """The studies with a completed trial (finished at or after `since`, when given) whose curve
    statistics were never kept for its attempt."""
    clause = "AND t.finished_at >= :since" if since is not None else ""
    params: dict[str, Any] = {"since": since} if since is not None else {}
    with db.transaction() as session:
        return sorted(session.execute(text(_UNKEPT.format(since=clause)), params).scalars())


def keep_all(db: Database, since: datetime | None = None) -> int:
    """One pass over every study that needs it; answers how many trials were aggregated."""
    return sum(keep_study(db, study_id) for study_id in studies_to_keep(db, since))


class Keeper:
    """The background thread: a pass every `interval` seconds (the first after one interval) until
    `stop()`."""

    def __init__(
        self, db: Database, *, interval: float = INTERVAL, after_pass: Callable[[], Any] | None = None
    ) -> None:
        self.db = db
        self.interval = interval
        self.after_pass = after_pass  # more keeping that reads what a pass kept (kept_charts)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hpo-curve-stats-keeper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        since: datetime | None = None
        # The first pass waits an interval: a first visit right after the start must not race it.
        while not self._stop.wait(self.interval):
            try:
                with self.db.transaction() as session:
                    newest = session.execute(select(func.max(Trial.finished_at))).scalar()
                keep_all(self.db, since)
                if self.after_pass is not None:
                    self.after_pass()
                since = None if newest is None else newest - _MARGIN
            except StorageError as exc:  # the database is away: one line, not a traceback a tick
                _log.warning("curve statistics keeper: %s; retrying", one_line(exc))
            except Exception:  # the loop must outlive a failed pass
                _log.exception("curve statistics keeper failed; retrying")
