"""The one call `studies.create_study` makes for a bayesian study, in its transaction."""

from __future__ import annotations

from sqlalchemy.orm import Session

from hpo.server.bayesian import queue
from hpo.server.bayesian.warm import warm_observations
from hpo.server.layout.quasi_random import TrialDraft
from hpo.server.spec.model import StudySpec


def bayesian_start(session: Session, study_id: int, spec: StudySpec) -> list[TrialDraft]:
    """Checks and loads the warm start (422 naming what does not match), stores the study's queue
    state and answers its initial quasi-random trials."""
    return queue.start(session, study_id, spec, warm_observations(session, spec))
