"""Pipeline and round routes (docs/rounds.md): thin, each validates, calls one service function
and returns its answer. Reads need `read`, every POST `write` (docs/security.md)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Response, status

from hpo.server.api.deps import DatabaseDep, SettingsDep
from hpo.server.rounds import evidence, pipelines, recipes
from hpo.server.rounds.schemas import PipelineCreate, RecipeRequest, RoundCreate, RoundDecision, RoundReplicas

router = APIRouter(prefix="/api/v1", tags=["pipelines"])

PipelineId = Annotated[int, Path(ge=1, le=2**31 - 1, description="pipeline id")]
RoundId = Annotated[int, Path(ge=1, le=2**31 - 1, description="round id")]


@router.post("/pipelines", status_code=status.HTTP_201_CREATED)
def create_pipeline(db: DatabaseDep, settings: SettingsDep, body: PipelineCreate) -> dict[str, Any]:
    return pipelines.create_pipeline(db, body.model_dump(), settings.execution_policy)


@router.get("/pipelines")
def list_pipelines(
    db: DatabaseDep,
    limit: int = Query(100, ge=1, le=1000),
    offset: int = Query(0, ge=0, le=2**31 - 1),
) -> dict[str, Any]:
    return pipelines.list_pipelines(db, limit=limit, offset=offset)


@router.get("/pipelines/{pipeline_id}")
def get_pipeline(db: DatabaseDep, pipeline_id: PipelineId) -> dict[str, Any]:
    return pipelines.get_pipeline(db, pipeline_id)


@router.post("/pipelines/{pipeline_id}/rounds", status_code=status.HTTP_201_CREATED)
def create_round(db: DatabaseDep, pipeline_id: PipelineId, body: RoundCreate) -> dict[str, Any]:
    return pipelines.create_round(db, pipeline_id, body.goal, body.kind)


@router.get("/rounds/{round_id}")
def get_round(db: DatabaseDep, round_id: RoundId) -> dict[str, Any]:
    return evidence.get_round(db, round_id)


@router.post("/rounds/{round_id}/replicas", status_code=status.HTTP_201_CREATED)
def post_replicas(db: DatabaseDep, settings: SettingsDep, round_id: RoundId, body: RoundReplicas) -> dict[str, Any]:
    return evidence.replicate(db, round_id, body.count, settings.execution_policy)


@router.post("/rounds/{round_id}/decision")
def post_decision(db: DatabaseDep, round_id: RoundId, body: RoundDecision) -> dict[str, Any]:
    return evidence.decide(db, round_id, body.adopt, body.note, body.override)


@router.post(
    "/rounds/{round_id}/recipes/{kind}",
    status_code=status.HTTP_201_CREATED,
    # A dry run creates nothing, so it answers 200, not 201 (docs/rounds.md, "Recipes").
    responses={200: {"description": "`?dry_run=true`: the spec the recipe would create; nothing was written"}},
)
def post_recipe(
    db: DatabaseDep,
    settings: SettingsDep,
    round_id: RoundId,
    kind: Literal["exploit", "steps", "instability", "warmup", "longer"],
    response: Response,
    body: RecipeRequest | None = None,
    dry_run: bool = False,
) -> dict[str, Any]:
    """Creates the recipe's study in the round; `?dry_run=true` answers the spec it would create
    (200) and writes nothing. `spec` in the body runs an edited spec instead of the planned one."""
    request = body or RecipeRequest()
    answer = recipes.run_recipe(
        db,
        round_id,
        kind,
        study_id=request.study_id,
        options=request.options,
        edited=request.spec,
        dry_run=dry_run,
        policy=settings.execution_policy,
    )
    if dry_run:
        response.status_code = status.HTTP_200_OK
    return answer
