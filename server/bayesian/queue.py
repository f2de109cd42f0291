"""The proposal queue of bayesian studies: proposals are ordinary pending trials, inserted in the
background, so a claim is unchanged and never waits for a model fit (it answers 204 when the
queue is empty).

`refill_once` is one pass: for each active bayesian study whose queue has room and budget left, it
takes the study's proposal lease (one conditional UPDATE on `bayesian_state`, judged by the
database, so several server processes never fit the same model at once), reads the observations,
runs the designer outside any transaction, and inserts the new trials with their records only if
the lease is still its own. `Refiller` runs passes in a thread of each server process; the fits run
in a child process (designer.py) so they never hold the server's GIL.

Reproducible: proposal k of a study is seeded from (study seed, k), and the designer is a pure
function of its observations, so the same seed and the same order of results give the same trials."""

from __future__ import annotations

import concurrent.futures
import json
import logging
import multiprocessing
import signal
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy import func, insert, or_, select, update
from sqlalchemy.orm import Session

from hpo.lifetime import die_with_parent
from hpo.server.bayesian import settings as bayes
from hpo.server.bayesian.designer import Problem, Proposal, propose
from hpo.server.db import Database
from hpo.server.errors import StorageError, one_line
from hpo.server.layout import quasi_random as layout
from hpo.server.models import BayesianProposal, BayesianState, Study, StudyStatus, Trial, TrialStatus
from hpo.server.space.dimension import map_unit, to_unit
from hpo.server.space.search_space import ArmSpace
from hpo.server.spec.model import StudySpec
from hpo.server.spec.parse import parse_spec

_log = logging.getLogger("hpo.server.bayesian")

# Longer than any fit: a server that dies while fitting holds the study's queue this long at most.
LEASE_SECONDS = 120.0
FIT_TIMEOUT = LEASE_SECONDS - 20.0
# Proposals per pass and study: a large queue is filled a few at a time, so the first ones reach
# the workers without waiting for a long sequential batch (the next pass starts at once).
MAX_BATCH = 4

Runner = Callable[[Problem], Proposal]


def arm_key(arm: dict[str, Any]) -> str:
    return json.dumps(arm, sort_keys=True)


def start(session: Session, study_id: int, spec: StudySpec, warm: dict[str, list[Any]] | None = None) -> list:
    """In the creating transaction: the study's queue state and its initial quasi-random trials
    (`layout.TrialDraft`s to insert). `warm` holds warm-start observations by arm key."""
    warm = warm or {}
    fewest = min((len(warm.get(arm_key(arm), [])) for arm in layout.arms(spec)), default=0)
    initial = bayes.initial_trials(spec, fewest)
    session.add(BayesianState(study_id=study_id, next_proposal=0, initial_trials=initial, warm=warm))
    return layout.layout_trials(spec, 0, initial)


@dataclass
class Job:
    """One designer call: `q` proposals for one arm of one study."""

    study_id: int
    space: ArmSpace
    problem: Problem
    first_index: int
    observed_ids: list[int]
    pending_ids: list[int]
    warm_count: int
    proposal: Proposal | None = field(default=None)


def refill_once(db: Database, owner: str, run: Runner = propose) -> int:
    """One pass over the active bayesian studies; answers how many trials it proposed."""
    with db.transaction() as session:
        candidates = list(
            session.scalars(
                select(Study.id)
                .join(BayesianState, BayesianState.study_id == Study.id)
                .where(Study.status == StudyStatus.active, Study.algorithm == "bayesian")
                .where(or_(BayesianState.lease_until.is_(None), BayesianState.lease_until < db.now_seconds()))
                .order_by(Study.id)
            )
        )
    made = 0
    for study_id in candidates:
        made += refill_study(db, study_id, owner, run)
    return made


def refill_study(db: Database, study_id: int, owner: str, run: Runner = propose) -> int:
    """Proposes the trials one study's queue lacks, if this process gets its lease."""
    if not _needs_proposals(db, study_id) or not acquire(db, study_id, owner):
        return 0
    try:
        jobs = _plan(db, study_id)
        for job in jobs:
            job.proposal = run(job.problem)
        return _insert(db, study_id, owner, jobs)
    finally:
        release(db, study_id, owner)


def acquire(db: Database, study_id: int, owner: str, seconds: float = LEASE_SECONDS) -> bool:
    """Takes the study's proposal lease when it is free or lapsed; one winner however many
    processes try at once (a conditional UPDATE: Postgres re-checks the condition after the row
    lock, SQLite runs one writer at a time)."""
    with db.transaction() as session:
        result = session.execute(
            update(BayesianState)
            .where(BayesianState.study_id == study_id)
            .where(or_(BayesianState.lease_until.is_(None), BayesianState.lease_until < db.now_seconds()))
            .values(lease_owner=owner, lease_until=db.now_seconds() + seconds)
            .execution_options(synchronize_session=False)
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]


def release(db: Database, study_id: int, owner: str) -> None:
    with db.transaction() as session:
        session.execute(
            update(BayesianState)
            .where(BayesianState.study_id == study_id, BayesianState.lease_owner == owner)
            .values(lease_owner=None, lease_until=None)
            .execution_options(synchronize_session=False)
        )


@dataclass(frozen=True)
class _ArmState:
    arm: dict[str, Any]
    created: int  # trials of the arm the budget counts (originals, any status)
    observed: list[tuple[int, list[float], float | None]]  # (trial id, full unit point, value or None)
    pending: list[tuple[int, list[float]]]


def _needs_proposals(db: Database, study_id: int) -> bool:
    with db.transaction() as session:
        study = session.get(Study, study_id)
        if study is None or study.status is not StudyStatus.active:
            return False
        spec = parse_spec(study.spec)
        pending = session.scalar(
            select(func.count()).where(Trial.study_id == study_id, Trial.status == TrialStatus.pending)
        )
        created = session.scalar(select(func.count()).where(Trial.study_id == study_id, Trial.replica_of.is_(None)))
        budget = study.num_trials * len(layout.arms(spec))
        return (pending or 0) < bayes.queue_size(spec) and (created or 0) < budget


def _plan(db: Database, study_id: int) -> list[Job]:
    """The designer calls this pass makes: the queue's free places go to the arms with budget
    left, fewest trials first, so every arm gets its share."""
    with db.transaction() as session:
        study = session.get_one(Study, study_id)
        spec = parse_spec(study.spec)
        state = session.get_one(BayesianState, study_id)
        arms = _arm_states(session, spec, study)
        pending = session.scalar(
            select(func.count()).where(Trial.study_id == study_id, Trial.status == TrialStatus.pending)
        )
        room = min(bayes.queue_size(spec) - int(pending or 0), MAX_BATCH)
        counts = [a.created for a in arms]
        wanted = [0] * len(arms)
        for _ in range(max(room, 0)):
            open_arms = [i for i in range(len(arms)) if counts[i] < study.num_trials]
            if not open_arms:
                break
            i = min(open_arms, key=lambda j: (counts[j], j))
            counts[i] += 1
            wanted[i] += 1
        jobs, index, point = [], state.next_proposal, study.next_point_index
        for arm, q in zip(arms, wanted, strict=True):
            if q:
                jobs.append(_job(spec, study, state, arm, q, index, point))
                index, point = index + q, point + q
        return jobs


def _job(spec: StudySpec, study: Study, state: BayesianState, arm: _ArmState, q: int, index: int, point: int) -> Job:
    space = bayes.arm_space(spec, arm.arm)
    # The Halton points these trials' point indexes would have had: what the designer falls back
    # on while too few results are feasible to model (the initial design, continued).
    halton = [d.unit_point or [] for d in layout.layout_trials(spec, point, q) if d.arm == arm.arm]
    warm = [(u, v) for u, v in state.warm.get(arm_key(arm.arm), [])]
    observed = [(space.project(u), v) for _, u, v in arm.observed] + [(space.project(u), v) for u, v in warm]
    problem = Problem(
        dims=len(space.columns),
        observed=[u for u, _ in observed],
        values=[v for _, v in observed],
        pending=[space.project(u) for _, u in arm.pending],
        q=q,
        seed=proposal_seed(study.seed, index),
        minimize=study.objective_mode == "min",
        snap=space.snap,
        fallback=[space.project(u) for u in halton],
    )
    return Job(
        study_id=study.id,
        space=space,
        problem=problem,
        first_index=index,
        observed_ids=[i for i, _, _ in arm.observed],
        pending_ids=[i for i, _ in arm.pending],
        warm_count=len(warm),
    )


def proposal_seed(study_seed: int, index: int) -> int:
    state = np.random.SeedSequence([study_seed, index, 0xBA7E5]).generate_state(1, dtype=np.uint64)
    return int(state[0]) & (2**31 - 1)


def _arm_states(session: Session, spec: StudySpec, study: Study) -> list[_ArmState]:
    rows = session.execute(
        select(
            Trial.id, Trial.arm, Trial.params, Trial.unit_point, Trial.status, Trial.objective_value, Trial.replica_of
        )
        .where(Trial.study_id == study.id)
        .order_by(Trial.id)
    ).all()
    states = []
    for arm in layout.arms(spec):
        key = arm_key(arm)
        space = bayes.arm_space(spec, arm)
        mine = [r for r in rows if arm_key(r.arm) == key]
        observed, pending = [], []
        for r in mine:
            unit = r.unit_point if r.unit_point is not None else _unit_of(space, r.params)
            if unit is None:
                continue
            if r.status in (TrialStatus.pending, TrialStatus.running):
                pending.append((r.id, unit))
            elif r.status is TrialStatus.completed:
                observed.append((r.id, unit, r.objective_value))  # no objective: counted infeasible
            elif r.status is TrialStatus.infeasible:
                observed.append((r.id, unit, None))
        created = sum(1 for r in mine if r.replica_of is None)
        states.append(_ArmState(arm=arm, created=created, observed=observed, pending=pending))
    return states


def _unit_of(space: ArmSpace, params: dict[str, Any]) -> list[float] | None:
    """A manual trial's place in the unit cube (its params mapped back), None if outside."""
    point = [to_unit(hp, params.get(hp.name)) for hp in space.declarations]
    if any(u != u for u in point):  # NaN: a value outside the space
        return None
    return space.embed(point)


def _insert(db: Database, study_id: int, owner: str, jobs: list[Job]) -> int:
    """Inserts the proposals if this process still holds the lease and the study is still active."""
    with db.transaction() as session:
        state = session.get(BayesianState, study_id, with_for_update=True)
        study = session.get(Study, study_id, with_for_update=True)
        if state is None or study is None or state.lease_owner != owner or study.status is not StudyStatus.active:
            return 0
        spec = parse_spec(study.spec)
        last = session.scalar(select(func.max(Trial.number)).where(Trial.study_id == study_id))
        number = 0 if last is None else last + 1
        point_index, made = study.next_point_index, 0
        for job in jobs:
            assert job.proposal is not None
            for offset, point in enumerate(job.proposal.points):
                unit = job.space.embed(point)
                trial_id = session.scalar(
                    insert(Trial)
                    .values(
                        study_id=study_id,
                        number=number,
                        arm=job.space.arm,
                        params=layout.resolve_params(spec, job.space.arm, unit),
                        point_index=point_index,
                        unit_point=unit,
                        seed=layout.trial_seed(study.seed, point_index),
                        replica_index=0,
                        status=TrialStatus.pending,
                        attempt=0,
                        failures=0,
                        restart_after_attempt=0,
                    )
                    .returning(Trial.id)
                )
                session.add(_record(job, int(trial_id or 0), offset))
                number, point_index, made = number + 1, point_index + 1, made + 1
            if job.proposal.view is not None:
                state.model_view = _view(job)
        study.next_point_index = point_index
        state.next_proposal = max(j.first_index + j.problem.q for j in jobs) if jobs else state.next_proposal
        return made


def _record(job: Job, trial_id: int, offset: int) -> BayesianProposal:
    assert job.proposal is not None
    return BayesianProposal(
        trial_id=trial_id,
        study_id=job.study_id,
        proposal_index=job.first_index + offset,
        seed=job.problem.seed,
        model=job.proposal.model,
        observed_trial_ids=job.observed_ids,
        pending_trial_ids=job.pending_ids,
        warm_observations=job.warm_count,
        fit_seconds=round(job.proposal.fit_seconds, 4),
    )


def _view(job: Job) -> dict[str, Any]:
    """The designer's view in the values of each hyperparameter (the analysis shows it as is)."""
    assert job.proposal is not None and job.proposal.view is not None
    view = job.proposal.view
    slices = []
    for hp, slice_ in zip(job.space.declarations, view["slices"], strict=True):
        slices.append({"name": hp.name, "scale": hp.scale, "x": [map_unit(hp, u) for u in slice_["unit"]], **slice_})
    best = {hp.name: map_unit(hp, u) for hp, u in zip(job.space.declarations, view["best_unit"], strict=True)}
    return {"arm": job.space.arm, "observations": len(job.problem.observed), "best_params": best, "slices": slices}


# --- running in the background -------------------------------------------------------------------


def _init_child(threads: int) -> None:
    # A fitting process ends with the server thread that started it, even when that is SIGKILLed.
    die_with_parent(signal.SIGKILL)
    import torch  # lazy: this runs in the fitting child process; the server process need not load torch

    torch.set_num_threads(threads)


class Refiller:
    """Refills the queues of active bayesian studies from a thread of a server process. With
    `processes` >= 1 the fits run in a child process (spawned on first use, kept warm); with 0 in
    this thread (for tests and single-user setups)."""

    def __init__(self, db: Database, *, processes: int = 1, interval: float = 0.5, threads: int = 1) -> None:
        self.db = db
        self.owner = f"{uuid.uuid4().hex[:16]}"
        self.interval = interval
        self._processes = processes
        self._threads = threads
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hpo-bayesian-refiller", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def run(self, problem: Problem) -> Proposal:
        if self._processes <= 0:
            return propose(problem)
        if self._pool is None:
            self._pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=self._processes,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_child,
                initargs=(self._threads,),
            )
        try:
            return self._pool.submit(propose, problem).result(timeout=FIT_TIMEOUT)
        except concurrent.futures.process.BrokenProcessPool:
            self._pool = None  # the child died (out of memory?): a new one next time
            raise

    def _loop(self) -> None:
        while not self._stop.is_set():
            made = 0
            try:
                made = refill_once(self.db, self.owner, self.run)
            except StorageError as exc:  # the database is away: one line, not a traceback a tick
                _log.warning("bayesian refill: %s; retrying", one_line(exc))
                self._stop.wait(5 * self.interval)
            except Exception:  # the loop must outlive a failed fit
                _log.exception("bayesian refill failed; retrying")
                self._stop.wait(5 * self.interval)
            if not made:
                self._stop.wait(self.interval)
