"""Recipes: a call on a round that writes the study the playbook prescribes next, from the baseline
and the round's earlier studies, and, once that study has finished, its readout into the round
(docs/rounds.md, "Recipes"). Recipes create ordinary round studies; nothing else treats them apart.

- `exploit` (002, "After exploration concludes"): a bayesian study over a refined space around a
  finished exploration study's best trials, warm-started from it.
- `steps` (002, "Deciding how long to train when training is not compute-bound"): a constant
  learning-rate grid without regularization; the readout is the step at which the fastest trial
  reaches the training-fit threshold, refused when that rate is at the edge of the grid.
- `instability` (002, "Identifying unstable workloads"): ~500 steps at 2x the best learning rate
  evaluated every step, and 5x and 10x for the training-loss check.
- `warmup` (002, "How to apply learning rate warmup"): warmup_steps at orders of magnitude up to
  10 % of max_train_steps at 10x the unstable learning rate.
- `longer` (002, "Round 2"): the best few points of a finished study trained longer.

`plan_*` functions are pure over a `Context` (what the round holds) and the options: each answers
the spec to create and notes. `run_recipe` previews (`dry_run`) or creates, in one transaction."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from hpo.policy import ExecutionPolicy
from hpo.server.analysis import load
from hpo.server.analysis.importance import study_importance
from hpo.server.analysis.judged import load_trials
from hpo.server.analysis.model import TrialSummary, fmt
from hpo.server.analysis.service import analyze_study
from hpo.server.db import Database
from hpo.server.errors import Conflict, FieldError, InvalidInput, NotFound
from hpo.server.models import Pipeline, Round, RoundRecipe, Study
from hpo.server.rounds.pipelines import round_studies
from hpo.server.space import ranges
from hpo.server.spec.model import CROSSED_TYPES, Hyperparameter
from hpo.server.spec.parse import parse_spec
from hpo.server.studies import service as studies
from hpo.server.studies.from_baseline import expand_spec, pipeline_or_404, round_or_404
from hpo.trainer.divergence import TRAIN_LOSS

KINDS = ("exploit", "steps", "instability", "warmup", "longer")
REGULARIZERS = {"weight_decay": 0.0, "dropout": 0.0, "label_smoothing": 0.0}


@dataclass
class Source:
    """A finished study the recipe starts from, with its trial summaries (analysis' view)."""

    id: int
    name: str
    spec: dict[str, Any]
    trials: list[TrialSummary]
    sign: float

    def best(self, k: int = 1) -> list[TrialSummary]:
        """The best `k` feasible original trials, best first (the analysis' own ranking key)."""
        usable = [t for t in self.trials if t.replica_of is None and t.feasible]
        return sorted(usable, key=lambda t: (self.sign * float(t.objective or 0.0), t.id))[:k]


@dataclass
class Context:
    round: Round
    pipeline: Pipeline
    source: Source | None
    readouts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    kind: str = ""

    @property
    def trainer(self) -> dict[str, Any]:
        """The source study's settings for the recipes that continue it (exploit, longer), else the
        pipeline's: a steps, instability or warmup study is about the pipeline's training."""
        if self.source is not None and self.kind in _NEEDS_SOURCE:
            return dict(self.source.spec.get("trainer") or {})
        return dict(self.pipeline.trainer)

    @property
    def max_train_steps(self) -> int:
        return int(self.trainer.get("max_train_steps", 1000))

    def best_learning_rate(self, options: Mapping[str, Any]) -> float:
        given = options.get("learning_rate")
        if isinstance(given, (int, float)) and not isinstance(given, bool) and given > 0:
            return float(given)
        if self.source is not None and self.source.best():
            value = self.source.best()[0].params.get("learning_rate")
            if isinstance(value, (int, float)):
                return float(value)
        value = self.pipeline.baseline_params.get("learning_rate")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise Conflict("no learning rate to start from: give options.learning_rate or a baseline learning_rate")


@dataclass
class Plan:
    spec: dict[str, Any]
    notes: list[str]
    options: dict[str, Any]


# --- running a recipe ------------------------------------------------------------------------------


def run_recipe(
    db: Database,
    round_id: int,
    kind: str,
    *,
    study_id: int | None = None,
    options: Mapping[str, Any] | None = None,
    edited: dict[str, Any] | None = None,
    dry_run: bool = False,
    policy: ExecutionPolicy | None = None,
) -> dict[str, Any]:
    """Plans the recipe's study; with `dry_run` answers it (expanded from the pipeline and checked
    as it would be created) and writes nothing, else creates it with the recipe's record in one
    transaction. `edited` replaces the planned spec (a previewed spec a person changed)."""
    if kind not in KINDS:
        raise NotFound(f"recipe {kind!r} not found (recipes: {', '.join(KINDS)})")
    options = dict(options or {})
    _check_options(kind, options)
    plan = PLANS[kind](db, _context(db, round_id, study_id, kind), options)
    if edited is not None:
        plan = Plan(
            {**edited, "round_id": round_id},
            [*plan.notes, "the planned spec was replaced by an edited one"],
            plan.options,
        )
    with db.transaction() as session:
        round_or_404(session, round_id, lock=True)
        if dry_run:
            expanded, _ = expand_spec(session, plan.spec)
            parse_spec(expanded)  # refused now as it would be at creation
            return {
                "kind": kind,
                "round_id": round_id,
                "dry_run": True,
                "spec": expanded,
                "notes": plan.notes,
                "options": plan.options,
            }
        spec, new_id = studies.create_in_round(session, plan.spec, policy)
        record = RoundRecipe(round_id=round_id, kind=kind, study_id=new_id, options=plan.options)
        session.add(record)
        session.flush()
        recipe_id = record.id
    study = studies.get_study(db, new_id)
    return {
        "kind": kind,
        "round_id": round_id,
        "dry_run": False,
        "recipe_id": recipe_id,
        "study": study.model_dump(),
        "spec": study.spec,
        "notes": plan.notes,
        "options": plan.options,
    }


def _context(db: Database, round_id: int, study_id: int | None, kind: str) -> Context:
    with db.transaction() as session:
        row = round_or_404(session, round_id)
        pipeline = pipeline_or_404(session, row.pipeline_id)
        source = _source(session, row, pipeline, study_id, kind)
        readouts: dict[str, list[dict[str, Any]]] = {}
        counts: dict[str, int] = {}
        for view in recipe_views(session, row.id):
            counts[view["kind"]] = counts.get(view["kind"], 0) + 1
            if view["readout"] is not None:
                readouts.setdefault(view["kind"], []).append(view["readout"])
        session.expunge_all()
        return Context(row, pipeline, source, readouts, counts, kind)


_NEEDS_SOURCE = {"exploit": "a finished exploration study", "longer": "a finished study with good points"}


def _source(session: Session, row: Round, pipeline: Pipeline, study_id: int | None, kind: str) -> Source | None:
    """The finished study of this round the recipe starts from: `study_id`, else the newest."""
    sign = 1.0 if pipeline.objective_mode == "min" else -1.0
    own = round_studies(session, row.id)
    if study_id is not None:
        study = session.get(Study, study_id)
        if study is None:
            raise NotFound(f"study {study_id} not found")
        if study.round_id != row.id or study.round_role is not None:
            where = f"round {study.round_id}" if study.round_id else "no round"
            raise InvalidInput.one("study_id", f"study {study_id} belongs to {where}, not to round {row.id}")
        if not _finished(session, study):
            raise Conflict(f"study {study_id} has unfinished trials: the {kind} recipe reads a finished study")
        candidates = [study]
    else:
        candidates = [s for s in reversed(own) if _finished(session, s)]
    if not candidates:
        if kind in _NEEDS_SOURCE:
            raise Conflict(
                f"round {row.id} has no finished study for the {kind} recipe: it needs {_NEEDS_SOURCE[kind]} "
                "in the round (or name one with study_id)"
            )
        return None
    study = candidates[0]
    summaries, _ = load_trials(session, load.study_info(session, study.id))
    return Source(study.id, study.name, dict(study.spec), summaries, sign)


def _finished(session: Session, study: Study) -> bool:
    return studies.get_study_in(session, study.id).status == "completed"


def _name(ctx: Context, kind: str) -> str:
    return f"{ctx.pipeline.name}-round{ctx.round.number}-{kind}{ctx.counts.get(kind, 0) + 1}"


def _base_spec(ctx: Context, kind: str, goal: str, **extra: Any) -> dict[str, Any]:
    return {"name": _name(ctx, kind), "round_id": ctx.round.id, "goal": goal, "description": f"recipe {kind}", **extra}


def _positive(options: Mapping[str, Any], key: str, default: float) -> float:
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise InvalidInput.one(f"options.{key}", f"must be a positive number, not {value!r}")
    return float(value)


def _count(options: Mapping[str, Any], key: str, default: int, high: int = 1000) -> int:
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise InvalidInput.one(f"options.{key}", f"must be a whole number from 1 to {high}, not {value!r}")
    return value


# --- exploit ---------------------------------------------------------------------------------------


def plan_exploit(db: Database, ctx: Context, options: dict[str, Any]) -> Plan:
    """A bayesian study over the refined space (`refine_space`), warm-started from the exploration
    study when the refined space lies inside its space."""
    assert ctx.source is not None
    analysis = analyze_study(db, ctx.source.id)
    with db.transaction() as session:
        importance = study_importance(session, load.study_info(session, ctx.source.id))
    space, notes, widened = refine_space(ctx.source, analysis, importance, options)
    num_trials = _count(options, "num_trials", 20)
    bayesian: dict[str, Any] = {}
    if widened:
        notes.append(f"no warm start: the space reaches past study {ctx.source.id}'s on {', '.join(widened)}")
    else:
        bayesian["warm_start"] = {"study_ids": [ctx.source.id]}
    goal = f"exploit: refine around the best trials of study {ctx.source.id} ({ctx.source.name})"
    spec = _base_spec(
        ctx,
        "exploit",
        goal,
        algorithm="bayesian",
        num_trials=num_trials,
        bayesian=bayesian,
        hyperparameters=space,
        trainer=ctx.trainer,
        seed=int(ctx.source.spec.get("seed", 0)),
    )
    resolved = {"study_id": ctx.source.id, "num_trials": num_trials, "top_fraction": options.get("top_fraction", 0.2)}
    return Plan(spec, notes, resolved)


def refine_space(
    source: Source, analysis: Mapping[str, Any], importance: Mapping[str, Any], options: Mapping[str, Any]
) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """The exploration study's space refined (playbook 002, "After exploration concludes"): the
    best arm's scientific values fixed; each searched hyperparameter narrowed to a range that
    comfortably contains its best trials' values (padded by a quarter of their spread, in its
    scale) but widened past the edge where the analysis warned of a boundary; hyperparameters the
    importance chart finds the objective insensitive to fixed at the best trial's value. Answers
    the declarations, notes, and the names widened past the old range."""
    spec = parse_spec(source.spec)
    best = source.best(1)
    if not best:
        raise Conflict(f"study {source.id} has no feasible trial to refine around")
    arm = dict(best[0].arm)
    top_fraction = _positive(options, "top_fraction", 0.2)
    pool = [t for t in source.best(len(source.trials)) if dict(t.arm) == arm]
    top = pool[: max(3, math.ceil(top_fraction * len(pool)))]
    boundary = {(w.get("param"), w.get("side")) for w in analysis.get("warnings", []) if w.get("kind") == "boundary"}
    insensitive = _insensitive(importance)
    out, notes, widened = [], [], []
    for hp in spec.hyperparameters:
        if (hp.crossed and hp.name in arm) or not hp.holds(arm):
            if hp.crossed:
                out.append({"name": hp.name, "role": "fixed", "value": arm[hp.name]})
                notes.append(f"{hp.name} fixed at the best arm's {arm[hp.name]!r}")
            continue
        declaration = hp.model_dump(mode="json", exclude_none=True)
        declaration.pop("when", None)
        if not hp.sampled:
            out.append(declaration)
        elif hp.name in insensitive:
            out.append({"name": hp.name, "role": "fixed", "value": best[0].params[hp.name], "source": "insensitive"})
            notes.append(
                f"{hp.name} fixed at the best trial's {fmt(best[0].params[hp.name])}: the objective is "
                "insensitive to it (importance)"
            )
        else:
            refined, moved = _refined(hp, [t.params[hp.name] for t in top if hp.name in t.params], boundary)
            out.append({**declaration, **refined})
            if moved:
                widened.append(hp.name)
                notes.append(
                    f"{hp.name}: the best trials sit at the {' and '.join(moved)} edge (boundary warning): "
                    "the range reaches past it"
                )
    return out, notes, widened


def _insensitive(importance: Mapping[str, Any]) -> set[str]:
    """Names whose permutation importance is under a tenth of the largest (and under 0.02 of R²)."""
    params = importance.get("params") or []
    if not params:
        return set()
    top = max(p["importance"] for p in params)
    return {p["name"] for p in params if p["importance"] < max(0.02, 0.1 * top) and top > 0}


def _refined(hp: Hyperparameter, values: list[Any], boundary: set[tuple[Any, Any]]) -> tuple[dict[str, Any], list[str]]:
    if hp.type in CROSSED_TYPES:
        kept = [v for v in hp.values or [] if v in values]
        return {"values": kept or list(hp.values or [])}, []
    extend = ((hp.name, "min") in boundary, (hp.name, "max") in boundary)
    moved = [side for side, at_edge in zip(("min", "max"), extend, strict=True) if at_edge]
    a, b = ranges.refined(hp.scale, float(hp.min or 0.0), float(hp.max or 0.0), [float(v) for v in values], extend)
    if hp.scale != "log" and (hp.min or 0) >= 0:
        a = max(a, 0.0)
    if hp.scale == "reverse_log":
        b = min(b, 1 - 1e-12)
    if hp.type == "int":
        a, b = math.floor(a), math.ceil(b)
        if a == b:
            b = a + 1
    return {"min": a, "max": b}, moved


# --- steps -----------------------------------------------------------------------------------------


def plan_steps(db: Database, ctx: Context, options: dict[str, Any]) -> Plan:
    """A constant learning-rate grid (half-decades around the best rate), no regularization, each
    trial trained for N steps (options.max_train_steps, default the pipeline's)."""
    lr = ctx.best_learning_rate(options)
    count = _count(options, "rates", 5, 15)
    factors = [10 ** ((i - (count - 1) / 2) / 2) for i in range(count)]
    steps = _count(options, "max_train_steps", ctx.max_train_steps, 10**9)
    threshold = _positive(options, "threshold", 0.05)
    metric = str(options.get("metric", "train/loss"))
    rates = [float(f"{lr * f:.6g}") for f in factors]
    fixed = [
        {"name": "lr_schedule", "role": "fixed", "value": "constant"},
        {"name": "warmup_steps", "role": "fixed", "value": 0},
    ]
    fixed += [
        {"name": n, "role": "fixed", "value": v}
        for n, v in REGULARIZERS.items()
        if n != "dropout" or n in ctx.pipeline.baseline_params  # dropout only where the model has it
    ]
    hyperparameters = [{"name": "learning_rate", "role": "scientific", "type": "discrete", "values": rates}, *fixed]
    goal = f"steps: how many steps a constant learning rate needs to reach {metric} <= {fmt(threshold)}"
    trainer = {**ctx.trainer, "max_train_steps": steps, "log_every_steps": min(10, steps)}
    spec = _base_spec(ctx, "steps", goal, num_trials=1, hyperparameters=hyperparameters, trainer=trainer)
    notes = [
        f"learning rates {', '.join(fmt(r) for r in rates)} at a constant schedule, regularizers off, {steps} steps"
    ]
    return Plan(spec, notes, {"metric": metric, "threshold": threshold, "rates": rates, "max_train_steps": steps})


def read_steps(session: Session, recipe: RoundRecipe, trials: list[TrialSummary]) -> dict[str, Any]:
    """The step at which the fastest rate reaches the threshold: the initial max_train_steps,
    refused when that rate is the grid's smallest or largest."""
    metric, threshold = recipe.options["metric"], float(recipe.options["threshold"])
    rates = [float(r) for r in recipe.options["rates"]]
    curves = load.curves_of(session, [t.id for t in trials], [metric])
    reached: list[dict[str, Any]] = []
    for t in trials:
        curve = curves.get(t.id, {}).get(metric)
        hits = (
            [] if curve is None else [int(s) for s, v in zip(curve.steps, curve.values, strict=True) if v <= threshold]
        )
        reached.append(
            {"trial_id": t.id, "learning_rate": t.params.get("learning_rate"), "step": min(hits) if hits else None}
        )
    done = [r for r in reached if r["step"] is not None]
    if not done:
        message = (
            f"No rate reached {metric} <= {fmt(threshold)} within {recipe.options['max_train_steps']} steps: "
            "train longer or raise the threshold."
        )
        return {"rates": reached, "max_train_steps": None, "edge": False, "message": message}
    fastest = min(done, key=lambda r: (r["step"], r["trial_id"]))
    edge = float(fastest["learning_rate"]) in (min(rates), max(rates))
    if edge:
        message = (
            f"The fastest rate, {fmt(fastest['learning_rate'])}, is at the edge of the grid: no conclusion "
            "(playbook: check the best learning rate is not at the boundary); extend the grid."
        )
        return {"rates": reached, "max_train_steps": None, "edge": True, "fastest": fastest, "message": message}
    message = (
        f"Learning rate {fmt(fastest['learning_rate'])} reaches {metric} <= {fmt(threshold)} first, at step "
        f"{fastest['step']}: an initial max_train_steps of {fastest['step']}."
    )
    return {"rates": reached, "max_train_steps": fastest["step"], "edge": False, "fastest": fastest, "message": message}


# --- instability -----------------------------------------------------------------------------------


def plan_instability(db: Database, ctx: Context, options: dict[str, Any]) -> Plan:
    """~500 steps at 2x, 5x and 10x the best learning rate, evaluated (and logged) every step."""
    lr = ctx.best_learning_rate(options)
    steps = _count(options, "max_train_steps", 500, 10**6)
    multiples = [2, 5, 10]
    rates = [float(f"{lr * m:.6g}") for m in multiples]
    trainer = {
        **ctx.trainer,
        "max_train_steps": steps,
        "eval_every_steps": 1,
        "log_every_steps": 1,
        "divergence_factor": None,
    }
    hyperparameters = [{"name": "learning_rate", "role": "scientific", "type": "discrete", "values": rates}]
    goal = f"instability: is training unstable just above the best learning rate {fmt(lr)}?"
    spec = _base_spec(ctx, "instability", goal, num_trials=1, hyperparameters=hyperparameters, trainer=trainer)
    notes = [f"{steps} steps evaluated every step at {', '.join(f'{m}x' for m in multiples)} the best rate {fmt(lr)}"]
    return Plan(spec, notes, {"learning_rate": lr, "multiples": multiples, "rates": rates, "max_train_steps": steps})


def read_instability(session: Session, recipe: RoundRecipe, trials: list[TrialSummary]) -> dict[str, Any]:
    """Per rate: diverged (the one definition) or the training loss rising after a decline."""

    curves = load.curves_of(session, [t.id for t in trials], [TRAIN_LOSS])
    rows = []
    for t in sorted(trials, key=lambda t: float(t.params.get("learning_rate", 0))):
        curve = curves.get(t.id, {}).get(TRAIN_LOSS)
        rising = False
        if curve is not None and len(curve) >= 3:
            values = curve.values
            low = int(values.argmin()) if all(v == v for v in values) else 0
            rising = bool(low < len(values) - 1 and values[-1] > 1.5 * values[low])
        unstable = t.infeasible or t.status == "failed" or rising
        rows.append(
            {
                "trial_id": t.id,
                "learning_rate": t.params.get("learning_rate"),
                "diverged": t.infeasible,
                "loss_rises": rising,
                "unstable": bool(unstable),
            }
        )
    first = next((r for r in rows if r["unstable"]), None)
    if first is None:
        message = "No instability up to 10x the best learning rate: warmup is unlikely to help."
    else:
        message = (
            f"Training is unstable from learning rate {fmt(first['learning_rate'])}: try warmup "
            '(the warmup recipe) to reach higher rates (playbook, "How to apply learning rate warmup").'
        )
    unstable_lr = first["learning_rate"] if first else None
    return {"rates": rows, "unstable_learning_rate": unstable_lr, "message": message}


# --- warmup ----------------------------------------------------------------------------------------


def plan_warmup(db: Database, ctx: Context, options: dict[str, Any]) -> Plan:
    """warmup_steps at orders of magnitude up to 10 % of max_train_steps, at a base learning rate
    10x the unstable one (options.unstable_learning_rate, else the instability readout's)."""
    unstable = options.get("unstable_learning_rate")
    if unstable is None:
        found = [
            r["unstable_learning_rate"] for r in ctx.readouts.get("instability", []) if r.get("unstable_learning_rate")
        ]
        if not found:
            raise Conflict(
                f"round {ctx.round.id} has no unstable learning rate for the warmup recipe: run the instability recipe "
                "in it first (and let it finish), or give options.unstable_learning_rate"
            )
        unstable = found[-1]
    base = float(f"{_positive({'u': unstable}, 'u', 1.0) * _positive(options, 'factor', 10.0):.6g}")
    cap = max(1, ctx.max_train_steps // 10)
    values = [10**k for k in range(1, 10) if 10**k <= cap] or [cap]
    if values[-1] < cap:
        values.append(cap)
    hyperparameters = [
        {"name": "warmup_steps", "role": "scientific", "type": "discrete", "values": values},
        {"name": "learning_rate", "role": "fixed", "value": base},
    ]
    goal = f"warmup: the shortest warmup that trains stably at {fmt(base)} (10x the unstable {fmt(unstable)})"
    spec = _base_spec(ctx, "warmup", goal, num_trials=1, hyperparameters=hyperparameters, trainer=ctx.trainer)
    notes = [f"warmup_steps {values} (up to 10% of max_train_steps {ctx.max_train_steps}) at learning rate {fmt(base)}"]
    resolved = {"unstable_learning_rate": unstable, "learning_rate": base, "warmup_steps": values}
    return Plan(spec, notes, {**resolved, "max_train_steps": ctx.max_train_steps})


def read_warmup(session: Session, recipe: RoundRecipe, trials: list[TrialSummary]) -> dict[str, Any]:
    rows = sorted(
        (
            {
                "trial_id": t.id,
                "warmup_steps": t.params.get("warmup_steps"),
                "feasible": t.feasible,
                "objective": t.objective,
            }
            for t in trials
        ),
        key=lambda r: r["warmup_steps"] or 0,
    )
    stable = [r for r in rows if r["feasible"]]
    if not stable:
        return {
            "warmup_steps": rows,
            "shortest_stable": None,
            "message": "No warmup length trained stably at this rate: try 100x fewer, or gradient clipping.",
        }
    shortest = int(stable[0]["warmup_steps"] or 0)
    rate = fmt(recipe.options["learning_rate"])
    message = f"warmup_steps {shortest} is the shortest that trains stably at learning rate {rate}."
    if shortest > 0.05 * int(recipe.options["max_train_steps"]):
        message += " It is over 5% of max_train_steps: max_train_steps may need to grow (playbook)."
    return {"warmup_steps": rows, "shortest_stable": shortest, "message": message}


# --- longer ----------------------------------------------------------------------------------------


def plan_longer(db: Database, ctx: Context, options: dict[str, Any]) -> Plan:
    """The best few points of a finished study (options.top, default 3) as manual trials trained
    options.factor (default 2) times longer; warmup keeps its length, so the rest of the schedule
    (the constant phase of a constant or warmup-then-constant schedule) grows."""
    assert ctx.source is not None
    top = _count(options, "top", 3, 20)
    factor = _positive(options, "factor", 2.0)
    best = ctx.source.best(top)
    if not best:
        raise Conflict(f"study {ctx.source.id} has no feasible trial to train longer")
    old = int((ctx.source.spec.get("trainer") or {}).get("max_train_steps", ctx.max_train_steps))
    steps = int(round(old * factor))
    spec_src = parse_spec(ctx.source.spec)
    varied = sorted({hp.name for hp in spec_src.hyperparameters if hp.varied})
    hyperparameters = [hp.model_dump(mode="json", exclude_none=True) for hp in spec_src.hyperparameters]
    trials = [{"params": {n: t.params[n] for n in varied if n in t.params}} for t in best]
    goal = f"longer: the best {len(best)} points of study {ctx.source.id} trained {steps} steps instead of {old}"
    spec = _base_spec(
        ctx,
        "longer",
        goal,
        algorithm="manual",
        trials=trials,
        hyperparameters=hyperparameters,
        trainer={**ctx.trainer, "max_train_steps": steps},
    )
    notes = [f"trials {[t.id for t in best]} rerun for {steps} steps"]
    if any(t.params.get("lr_schedule") in ("linear", "cosine") for t in best):
        notes.append(
            "a decaying schedule decays over the whole longer run (the playbook's Round 2 keeps a linear "
            "decay's length and extends the constant phase; hpo's schedules stretch instead)"
        )
    options_out = {
        "study_id": ctx.source.id,
        "trial_ids": [t.id for t in best],
        "objectives": [t.objective for t in best],
        "max_train_steps": steps,
        "factor": factor,
    }
    return Plan(spec, notes, options_out)


def read_longer(session: Session, recipe: RoundRecipe, trials: list[TrialSummary]) -> dict[str, Any]:
    rows = [
        {"trial_id": t.id, "objective": t.objective, "short_trial_id": short, "short_objective": value}
        for t, short, value in zip(
            sorted(trials, key=lambda t: t.number),
            recipe.options["trial_ids"],
            recipe.options["objectives"],
            strict=False,
        )
    ]
    gains = [
        r["short_objective"] - r["objective"]
        for r in rows
        if r["objective"] is not None and r["short_objective"] is not None
    ]
    mean = sum(gains) / len(gains) if gains else None
    message = (
        "No long run finished feasibly."
        if mean is None
        else (
            f"Training {recipe.options['max_train_steps']} steps changed the objective by {fmt(-mean)} on average "
            "(negative is lower)."
        )
    )
    return {"runs": rows, "mean_change": None if mean is None else -mean, "message": message}


# The options each recipe reads (docs/rounds.md, "Recipes"): any other name is refused, so a
# misspelled option cannot pass silently for its default.
OPTIONS: dict[str, tuple[str, ...]] = {
    "exploit": ("num_trials", "top_fraction"),
    "steps": ("learning_rate", "rates", "max_train_steps", "threshold", "metric"),
    "instability": ("learning_rate", "max_train_steps"),
    "warmup": ("unstable_learning_rate", "factor"),
    "longer": ("top", "factor"),
}


def _check_options(kind: str, options: Mapping[str, Any]) -> None:
    known = OPTIONS[kind]
    errors = [
        FieldError(f"options.{key}", f"is not an option of the {kind} recipe; its options: {', '.join(known)}")
        for key in options
        if key not in known
    ]
    if errors:
        raise InvalidInput(errors)


PLANS: dict[str, Callable[[Database, Context, dict[str, Any]], Plan]] = {
    "exploit": plan_exploit,
    "steps": plan_steps,
    "instability": plan_instability,
    "warmup": plan_warmup,
    "longer": plan_longer,
}
READOUTS: dict[str, Callable[[Session, RoundRecipe, list[TrialSummary]], dict[str, Any]]] = {
    "steps": read_steps,
    "instability": read_instability,
    "warmup": read_warmup,
    "longer": read_longer,
}


# --- readouts --------------------------------------------------------------------------------------


def recipe_views(session: Session, round_id: int) -> list[dict[str, Any]]:
    """The round's recipes with their study's status and, once it finished, the readout (written
    into the recipe's row the first time it is read; a finished study no longer changes)."""
    rows = session.scalars(select(RoundRecipe).where(RoundRecipe.round_id == round_id).order_by(RoundRecipe.id))
    out = []
    for row in rows:
        study = session.get_one(Study, row.study_id)
        status = studies.get_study_in(session, study.id).status
        if row.readout is None and status == "completed":
            row.readout = _readout(session, row, study)
        out.append(
            {
                "id": row.id,
                "kind": row.kind,
                "study_id": row.study_id,
                "status": status,
                "options": row.options,
                "readout": row.readout,
            }
        )
    return out


def _readout(session: Session, row: RoundRecipe, study: Study) -> dict[str, Any]:
    trials, _ = load_trials(session, load.study_info(session, study.id))
    originals = [t for t in trials if t.replica_of is None]
    reader = READOUTS.get(row.kind)
    if reader is not None:
        return reader(session, row, originals)
    sign = 1.0 if study.objective_mode == "min" else -1.0
    best = min(
        (t for t in originals if t.feasible), key=lambda t: (sign * float(t.objective or 0.0), t.id), default=None
    )
    if best is None:
        return {"best_trial_id": None, "message": "No trial finished feasibly."}
    return {
        "best_trial_id": best.id,
        "best_value": best.objective,
        "params": dict(best.params),
        "message": f"Best trial {best.id}: {fmt(best.objective)}.",
    }
